"""How an invocation ends: exit codes, and the errors that end it early.

The CLI catches `HermesError` alone: a `UserError` (a flag, a file or a service the user named is
wrong; the message says which and where) or a `RunAborted` (the run stopped on purpose or on an
outage; what is done is kept and `--resume` goes on).
"""

from __future__ import annotations

EXIT_OK = 0  # every prompt settled
EXIT_FATAL = 1  # bad configuration, rejected key, dead endpoint
EXIT_SOME_FAILED = 3  # some prompts failed or were not run: rerun with --resume
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM


class HermesError(Exception):
    code = EXIT_FATAL
    label = "error"  # how the CLI introduces the message


class UserError(HermesError):
    """Something the user gave or points at is wrong; nothing was spent on it."""


class ExportError(UserError):
    """An export cannot be made as asked; the message says which flag or file and why."""


class RunAborted(HermesError):
    label = "stopped"

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code
