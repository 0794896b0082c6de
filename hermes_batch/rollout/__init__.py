"""Rollouts for trainers: groups of samples of a dataset's prompts, each through the same sandbox →
agent → check → record as a batch run, token-exact, and handed back as token sequences with their
rewards. Two ways in: a trainer's step as a run of its own (`Rollouts`, `Rollout`, `Step`), or asked
of the long-lived rollout service (`ServiceRollouts`); TRL's face on either is `trl.TRLRollouts`
(the `[rl]` extra, imported only when used). The service is `RolloutService` in this process and
`ServiceClient` over HTTP to `python batch_runner.py serve` (service/: a run fed by requests, through
the batch run's own dispatch loop); OpenEnv sessions on it are in openenv.py. A killed trainer or service loses no finished
rollout. `write_gguf` turns a policy's weights into the file the embedded llama.cpp serves."""

from .engine import Rollout, Rollouts, Step
from .gguf import write_gguf
from .service import (
    Policy,
    RequestRefused,
    RolloutRequest,
    RolloutResult,
    RolloutService,
    ServiceClient,
    ServiceRollouts,
    ServiceServer,
    wait_for,
)

__all__ = [
    "Policy",
    "RequestRefused",
    "Rollout",
    "RolloutRequest",
    "RolloutResult",
    "RolloutService",
    "Rollouts",
    "ServiceClient",
    "ServiceRollouts",
    "ServiceServer",
    "Step",
    "wait_for",
    "write_gguf",
]
