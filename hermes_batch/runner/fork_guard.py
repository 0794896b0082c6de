"""Imported by the fork server alone, among its preloads (executor.warm_up names it; the run never
imports it): the kernel kills the server when the run's process goes (PR_SET_PDEATHSIG), whatever
else may hold its pipe from the run open. Workers forked from it do not inherit this."""

from __future__ import annotations

import ctypes
import os
import signal

RUN_PID = "HERMES_BATCH_RUN_PID"  # set by executor.warm_up for the server it starts (executor.RUN_PID)


def _die_with_the_run() -> None:
    run = os.environ.pop(RUN_PID, None)
    if run is None or not run.isdigit():
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pipe's end still ends it
        return
    if os.getppid() != int(run):  # the run died before prctl took effect
        os._exit(1)


_die_with_the_run()
