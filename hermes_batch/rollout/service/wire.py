"""What a trainer and the rollout service say to each other, in-process or over HTTP (rollouts.py,
http_api.py): typed, and validated where it comes in."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SETTLED = ("done", "failed", "discarded")
WEIGHTS_FILE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\.gguf$"  # a file name, never a path: the service's policy directory holds it
State = Literal["queued", "running", "done", "failed", "discarded"]


class RolloutRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rollout_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")  # the caller's, unique per rollout
    task: str = Field(min_length=1)  # a prompt id of the service's dataset, or one of its prompts
    seed: int | None = None  # the caller's (OpenEnv: its group's), kept in the record
    # the served model to ask (a policy version's adapter) and that version; None: the service's
    # current policy (POST /v1/policy), else its --model and version 0
    model: str | None = None
    policy_version: int | None = Field(default=None, ge=0)
    # the embedded model's weights that serve it: a file of the service's policy directory; None:
    # the policy's (else the service's starting weights)
    weights: str | None = Field(default=None, pattern=WEIGHTS_FILE)


class Policy(BaseModel):
    """The policy a trainer is at: what rollouts that name none are served by and stamped with, and
    what staleness is measured from."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None  # the served model to ask; None: the service's --model
    version: int = Field(default=0, ge=0)
    # the embedded model's weights for it: a GGUF file the trainer wrote into the service's
    # `policy_dir` (ServiceInfo); None: the service's starting weights
    weights: str | None = Field(default=None, pattern=WEIGHTS_FILE)


class RolloutTurn(BaseModel):
    """One model call: the ids it was sent, the ids it returned and their log-probabilities (None
    where the server gave none)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float | None]
    finish_reason: str | None = None


class RolloutResult(BaseModel):
    rollout_id: str
    state: State
    prompt_id: str | None = None
    model: str | None = None  # the served model it asked
    policy_version: int = 0
    reward: float | None = None  # the check's score; None: no check, it could not judge, or no trajectory
    verdict: str | None = None  # pass, fail, error, skipped
    error: str | None = None  # failed or discarded, or its token sequence refused (done, no turns): why
    turns: list[RolloutTurn] = Field(default_factory=list)

    @property
    def settled(self) -> bool:
        return self.state in SETTLED


class ServiceInfo(BaseModel):
    run_name: str
    model: str
    temperature: float | None  # what the model samples at (None: the endpoint's default, for chat endpoints)
    tokens: str
    policy: Policy
    policy_dir: str | None  # where a trainer writes the embedded model's weights (None: the model is not embedded)
    queued: int
    running: int
    settled: int
    tasks: int


class TaskEntry(BaseModel):
    prompt_id: str
    prompt: str  # a request may name the task by it when no other row has the same prompt


class TaskList(BaseModel):
    """The service's dataset, in its order: what a trainer's dataset of prompts is made from."""

    tasks: list[TaskEntry]


class RequestRefused(Exception):
    """A request the service cannot take; `status`: the HTTP status that says why."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status
