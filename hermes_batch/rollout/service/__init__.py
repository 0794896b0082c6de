"""The rollout service: one long-lived run fed by requests, in the trainer's process
(`RolloutService`, rollouts.py) or over HTTP (`python batch_runner.py serve`: `ServiceServer` and
its `ServiceClient`, http_api.py), speaking the typed messages of wire.py; its rollouts go through
the batch run's own dispatch loop (runner/spine.py: `Spine.drive`, fed by the requests). A trainer's
step through a service is `ServiceRollouts` (steps.py)."""

from .http_api import ServiceClient, ServiceServer, serve
from .rollouts import RolloutService, wait_for
from .steps import ServiceRollouts
from .wire import Policy, RequestRefused, RolloutRequest, RolloutResult

__all__ = [
    "Policy",
    "RequestRefused",
    "RolloutRequest",
    "RolloutResult",
    "RolloutService",
    "ServiceClient",
    "ServiceRollouts",
    "ServiceServer",
    "serve",
    "wait_for",
]
