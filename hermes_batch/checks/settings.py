"""What a run tells its checks (docs/verification.md): their flags, a slice of the run's configuration."""

from __future__ import annotations

from pydantic import BaseModel

from ..flags import flag


class CheckSettings(BaseModel):
    """Time limits, retries and what a pass is, of the checks a row carries; its judge."""

    check_timeout: float = flag(600.0, "seconds a row's setup, and its check, may take (a row's check_timeout wins)",
                                gt=0)
    check_retries: int = flag(0, "runs again of a check that could not say (its sandbox lost, its judge unreachable)",
                              ge=0, le=10)
    timeout_multiplier: float = flag(1.0, "scales a task's own time limits (a row's check_timeout, a Harbor task's "
                                          "[agent] and [verifier] timeout_sec), as Harbor's: for slow models", gt=0)
    pass_score: float = flag(1.0, "a check's score at or above which it passes (exit 0 scores 1, a reward "
                                  "file its number)", ge=0, le=1)
    check_baseline: bool = flag(False, "run a row's check once on its untouched starting state, in a sandbox of its "
                                       "own, before the agent: a check that passes there is flagged (a broken task)")
    judge_model: str | None = flag(None, "the model that grades a row's rubric (default: --model); its key in "
                                         "JUDGE_API_KEY, else the run's")
    judge_base_url: str | None = flag(None, "the judge's OpenAI-compatible endpoint (default: --base_url)")
