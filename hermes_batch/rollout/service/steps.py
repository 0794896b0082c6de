"""A trainer's step of rollouts asked of a rollout service (`RolloutService` in this process, or
`ServiceClient` to `python batch_runner.py serve`), as `Rollouts` runs one as a run of its own: each
rollout a request, its token sequence made from the calls the service returns, its reward the
check's. The sandboxes and the model's server stay warm between steps, and the service's run keeps
every rollout (`data/<its run>/`), so a killed trainer loses none.

A rollout's id names the step (tag, version, the n-th call of it in this process), the weights'
fingerprint, its prompt's id and which rollout of that prompt in the step it is, never its place
in the batch: a trainer restarted from its checkpoint asks the same ids (TRL hands the prompts in
another order then) and gets the settled rollouts back; other weights are other ids, run afresh. Every request names the
step's policy version, stamped on its record. Weights: a service on the embedded model is told
which file of its policy directory serves each rollout (the trainer writes it there, trl.py), and
swaps its model's weights once the rollouts on the last ones have settled; any other server's are
the trainer's to sync (TRL syncs a vLLM server itself before each step's rollouts)."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...tokens import TokenTrace
from ..engine import Errored, Rollout, Step, groups_of, make_step, with_sequence
from .rollouts import wait_for
from .wire import RequestRefused, RolloutRequest, RolloutResult

BACKOFF = 0.5  # seconds before asking again when the service's queue is full (HTTP 429)


class ServiceRollouts:
    """Steps of rollouts on `service` (anything with `submit`, `result`, `info` and `tasks`).

    `errored`, `drop_zero_variance`: as `Rollouts` takes them. `timeout`: seconds a step may take
    before it is an error (None: no limit)."""

    def __init__(self, service: Any, *, errored: Errored = "sample", drop_zero_variance: bool = False,
                 timeout: float | None = None) -> None:
        if errored not in ("sample", "group"):
            raise ValueError(f"errored={errored!r}: give 'sample' (leave the sample out) or 'group' (mask its group)")
        self.service, self.errored, self.drop_zero_variance, self.timeout = service, errored, drop_zero_variance, timeout
        self.info = service.info()
        if self.info.tokens != "exact":
            raise ValueError(f"the rollout service runs with tokens={self.info.tokens}: a trainer needs its token "
                             "data exact (serve with --tokens=exact, its default)")
        tasks = service.tasks().tasks
        listed = Counter(t.prompt for t in tasks)
        self.prompt_ids = {t.prompt: t.prompt_id for t in tasks if listed[t.prompt] == 1}  # addressable by prompt
        self.train_prompts = list(self.prompt_ids)
        self.calls: dict[tuple[int, str], int] = {}

    @property
    def prompts(self) -> list[str]:
        """The service's prompts that name one task each, in its dataset's order (a trainer's dataset)."""
        return list(self.train_prompts)

    def run(self, prompts: Sequence[str], version: int, *, policy: str | None = None, tag: str = "train",
            weights: str | Path | None = None, temperature: float | None = None) -> Step:
        """Rollouts of `prompts` (a run of equal prompts is one group), each asked as policy `version`;
        `weights`: the file of the service's policy directory its embedded model serves them from."""
        served = self.info.temperature
        if temperature is not None and served is not None and not math.isclose(temperature, served):
            raise ValueError(f"the trainer samples at temperature {temperature:g} and the rollout service at {served:g}: "
                             "their log-probabilities would not agree (serve with --temperature to match)")
        groups = groups_of(prompts)
        if unknown := [text for text, _ in groups if text not in self.prompt_ids]:
            raise ValueError(f"{len(unknown)} prompt(s) name no one task of the rollout service's dataset, e.g. "
                             f"{unknown[0][:80]!r}")
        key = (version, tag)
        self.calls[key] = self.calls.get(key, -1) + 1
        stem = f"{tag}-v{version:06d}-{self.calls[key]}-{(policy or 'any')[:16]}"
        named = Path(weights).name if weights is not None else None
        asked, before = [], Counter[str]()  # rollouts of each prompt asked so far in this step
        for text, n in groups:
            pid = self.prompt_ids[text]
            asked.append([RolloutRequest(rollout_id=f"{stem}-{pid}-s{before[pid] + s}", task=pid, policy_version=version,
                                         weights=named) for s in range(n)])
            before[pid] += n
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        for group in asked:
            for req in group:
                self._submit(req, deadline)
        made = [[self._rollout(req, s, self._wait(req.rollout_id, deadline)) for s, req in enumerate(group)]
                for group in asked]
        return make_step(version, made, self.errored, self.drop_zero_variance, None, self.info.run_name)

    def _submit(self, req: RolloutRequest, deadline: float | None) -> None:
        while True:
            try:
                self.service.submit(req)
                return
            except RequestRefused as exc:
                if exc.status != 429 or (deadline is not None and time.monotonic() > deadline):
                    raise RuntimeError(f"the rollout service refused rollout {req.rollout_id}: {exc}") from None
                time.sleep(BACKOFF)  # its queue is full: it drains as rollouts start

    def _wait(self, rollout_id: str, deadline: float | None) -> RolloutResult:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return wait_for(self.service, rollout_id, left)
        except RequestRefused as exc:
            raise RuntimeError(f"rollout {rollout_id}: {exc}") from None

    @staticmethod
    def _rollout(req: RolloutRequest, sample: int, result: RolloutResult) -> Rollout:
        out = Rollout(req.rollout_id, result.prompt_id or req.task, sample, result.policy_version)
        if result.state != "done":
            out.error = f"no trajectory ({result.state}: {result.error})"
            return out
        out.verdict, out.reward = result.verdict, result.reward
        if not result.turns:  # none, or refused by the service (its error says why)
            out.error, out.reward = result.error or "the rollout has no token data", None
            return out
        trace = TokenTrace()
        for turn in result.turns:  # as the calls were made: a prompt that does not extend the last is a new segment
            trace.record(turn.prompt_ids, turn.completion_ids,
                         [math.nan if lp is None else lp for lp in turn.logprobs], turn.finish_reason)
        return with_sequence(out, trace)
