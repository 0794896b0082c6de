"""OpenEnv harness sessions on the rollout service, for TRL's AsyncGRPOTrainer (`pip install -e '.[rl]'`,
openenv pinned): the agent owns its loop (it runs in the service's sandbox), so a session is
created, waited for, asked for its training trace and its reward, and closed.

    factory = functools.partial(HermesSessionFactory, "http://127.0.0.1:8177", max_staleness=2)
    worker = HarnessRolloutWorker(harness_session_factory=factory, ...)
    ...after each weight sync, in the trainer:  client.set_policy(Policy(model=f"policy-v{n}", version=n))

TRL runs its rollout loop in a spawned process and pickles the factory to get it there, so the
factory names the service by its URL, and the policy a rollout is served by (the adapter to sample,
as AsyncGRPO publishes one per version, and that version's number, which the record carries) is the
one the trainer last set on the service when the rollout was asked for. A rollout more than
`max_staleness` versions behind the service's policy when it is verified has no reward (None:
unscored), so the trainer never learns from it.

A turn is one model call: the ids it was sent (masked) and the ids it returned (trained on), with
the server's log-probabilities. A token the server gave no log-probability for (llama.cpp leaves
out a token that ends inside a split character) is kept as context: masked, its log-probability 0,
since OpenEnv takes no NaN."""

from __future__ import annotations

import time
import uuid
from typing import Any

from openenv.core.harness import ResourceSession, ResourceSessionFactory, TrainingTrace, VerifyResult
from openenv.core.harness.training import TrainingTurn

from .service import RequestRefused, RolloutRequest, RolloutResult, RolloutService, ServiceClient, wait_for


class HermesSession(ResourceSession):
    """One rollout in the service; OpenEnv's `TrainableSession` (wait_for_completion, fetch_training_trace)."""

    def __init__(self, service: RolloutService | ServiceClient, request: RolloutRequest, prompt: str,
                 max_staleness: int | None):
        self.service, self.request, self.prompt, self.max_staleness = service, request, prompt, max_staleness
        self.result: RolloutResult | None = None

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        """0 when the rollout has a trajectory, 1 when it failed or was discarded; TimeoutError past `timeout_s`."""
        self.result = wait_for(self.service, self.request.rollout_id, timeout_s)
        return 0 if self.result.state == "done" else 1

    def fetch_training_trace(self) -> TrainingTrace:
        result = self._settled()
        turns = []
        for i, turn in enumerate(result.turns):
            turns.append(TrainingTurn(
                node_id=f"{result.rollout_id}:{i}", prompt_token_ids=turn.prompt_ids,
                completion_token_ids=turn.completion_ids,
                per_token_logps=[lp if lp is not None else 0.0 for lp in turn.logprobs],
                loss_mask=[0] * len(turn.prompt_ids) + [int(lp is not None) for lp in turn.logprobs],
                metadata={"policy_version": result.policy_version, "model": result.model,
                          "finish_reason": turn.finish_reason}))
        return TrainingTrace(turns=turns)

    def verify(self, transcript: list[Any], final_state: Any | None = None) -> VerifyResult:
        """The check's score as the service recorded it; None when it could not decide, the rollout
        has no trajectory, or its policy version is more than `max_staleness` behind."""
        result = self._settled()
        staleness = self.service.info().policy.version - result.policy_version
        stale = self.max_staleness is not None and staleness > self.max_staleness
        metrics = {"verdict": result.verdict, "policy_version": result.policy_version, "staleness": staleness,
                   "stale": stale, "error": result.error}
        return VerifyResult(env_reward=None if stale else result.reward, done=True, metrics=metrics,
                            artifacts={"rollout_id": result.rollout_id, "prompt_id": result.prompt_id})

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.prompt}]

    def list_tools(self) -> list[Any]:
        return []  # the agent's tools run in the service's sandbox, not through the trainer

    def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        raise NotImplementedError("the agent's loop runs in the rollout service: its tools are not called from here")

    def close(self) -> None:
        """A rollout that has not started is dropped; one that has runs to its end and is recorded."""
        if self.result is None or not self.result.settled:
            try:
                self.service.cancel(self.request.rollout_id)
            except Exception:  # noqa: BLE001 - the service gone or unreachable: nothing of it runs on here
                pass

    def _settled(self) -> RolloutResult:
        if self.result is None or not self.result.settled:
            self.wait_for_completion()
        assert self.result is not None
        return self.result


class HermesSessionFactory(ResourceSessionFactory[HermesSession]):
    """Sessions on a rollout service: its URL (`token`: its bearer token, else
    $HERMES_BATCH_SERVE_TOKEN), or the service itself in this process. `sampling`: what the
    trainer's policy samples with (TRL passes it); the service must sample the same, or its
    rollouts are not the policy's, so another temperature is refused here. `queue_timeout`: how
    long `create` waits for room in a full service before it gives up (seconds)."""

    def __init__(self, service: RolloutService | ServiceClient | str, *, max_staleness: int | None = None,
                 sampling: dict[str, Any] | None = None, token: str | None = None, queue_timeout: float = 3600.0):
        self.service = ServiceClient(service, token) if isinstance(service, str) else service
        self.max_staleness, self.queue_timeout = max_staleness, queue_timeout
        wanted = (sampling or {}).get("temperature")
        served = self.service.info().temperature
        if wanted is not None and (served is None or abs(float(wanted) - served) > 1e-9):
            raise ValueError(f"the trainer samples at temperature {wanted} and the rollout service at "
                             f"{'its endpoint default' if served is None else served}: start the service with "
                             f"--temperature={wanted}")

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> HermesSession:
        """`task`: a prompt id or prompt of the service's dataset, a row with one of them, or chat
        messages whose last user message is the prompt."""
        prompt = _prompt_of(task)
        request = RolloutRequest(rollout_id=episode_id or uuid.uuid4().hex, task=prompt, seed=seed)
        accepted = self._submit(request)  # served by the service's policy of now, which it stamps
        request = request.model_copy(update={"model": accepted.model, "policy_version": accepted.policy_version})
        return HermesSession(self.service, request, prompt, self.max_staleness)


    def _submit(self, request: RolloutRequest) -> RolloutResult:
        """Asked until the service has room: a trainer keeps more rollouts in flight than a
        service queues, and a refusal would cost the rollout (TRL scores it as unscorable)."""
        delay, deadline = 0.2, time.monotonic() + self.queue_timeout
        while True:
            try:
                return self.service.submit(request)
            except RequestRefused as exc:
                if exc.status != 429 or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(5.0, delay * 2)


def _prompt_of(task: Any) -> str:
    if isinstance(task, str):
        return task
    if isinstance(task, dict):
        for key in ("prompt_id", "prompt", "task"):
            if key in task:
                return _prompt_of(task[key])
    if isinstance(task, list):
        users = [m for m in task if isinstance(m, dict) and m.get("role") == "user"]
        if users:
            content = users[-1].get("content")
            if isinstance(content, list):  # parts: the text ones
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            if isinstance(content, str):
                return content
    raise ValueError(f"cannot tell which task {str(task)[:80]!r} is: give a prompt id, a prompt, a row with one, "
                     "or chat messages")


__all__ = ["HermesSession", "HermesSessionFactory", "RequestRefused"]
