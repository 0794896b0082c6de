"""A model that grades a trajectory against a row's `rubric` (docs/verification.md).

The judge is sent the task, the rubric, the agent's final answer and what it did (its tool calls
and their results, clipped), and answers with a JSON object `{"score": 0..1, "explanation": ...}`.
A judge that cannot be reached or answers without a score is an `error`, never a `fail`.
"""

from __future__ import annotations

import json
import re
import time

from .agent import AgentRun
from .backends.base import clip
from .limits import AdaptiveLimit
from .llm import FatalRunError, ModelClient, ModelSettings, PromptFailed, open_client
from .verify import CheckResult, scored

JUDGE_SYSTEM_PROMPT = (
    "You grade the work of an AI agent against a rubric. Read the task, the rubric, what the agent "
    "did and its final answer. Reply with one JSON object and nothing else: "
    '{"score": <a number from 0 to 1: how well the work meets the rubric>, '
    '"explanation": "<one or two sentences>"}'
)
WORK_SHOWN = 12_000  # characters of the agent's tool calls and results shown to the judge
_OBJECT = re.compile(r"\{.*\}", re.S)


class Judge:
    """One model client for the worker's rubric checks, opened at the first."""

    def __init__(self, settings: ModelSettings, api_key: str | None):
        self.settings, self.api_key = settings, api_key
        self._client: ModelClient | None = None

    @property
    def client(self) -> ModelClient:
        if self._client is None:
            self._client = open_client(self.settings, self.api_key, AdaptiveLimit(64))
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def grade(self, prompt: str, rubric: str, run: AgentRun, pass_score: float) -> CheckResult:
        t0 = time.monotonic()
        result = CheckResult("judge", "error", model=self.settings.model)
        messages = [{"role": "system", "content": JUDGE_SYSTEM_PROMPT},
                    {"role": "user", "content": judge_request(prompt, rubric, run)}]
        try:
            reply = await self.client.complete(messages, [])
        except PromptFailed as exc:
            result.error = f"the judge could not be asked: {exc.kind}: {exc}"
        except FatalRunError as exc:
            result.error = f"the judge refused the request: {exc}"
        else:
            result.usage = {k: reply.usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens", "cost")}
            try:
                score, explanation = read_grade(reply.content)
            except ValueError as exc:
                result.error, result.explanation = str(exc), clip(reply.content, 2000)
            else:
                result.score, result.explanation = score, explanation
                result.status = scored(score, pass_score)
        result.seconds = round(time.monotonic() - t0, 3)
        return result


def judge_request(prompt: str, rubric: str, run: AgentRun) -> str:
    work = []
    for m in run.transcript:
        if m["role"] == "assistant":
            for call in m.get("tool_calls") or []:
                work.append(f"CALL {call['name']}({call['arguments']})")
        elif m["role"] == "tool":
            work.append(f"RESULT {m.get('content') or ''}")
    answer = run.final_answer
    return (f"# Task\n{prompt}\n\n# What the agent did\n{clip(chr(10).join(work), WORK_SHOWN) or '(no tool calls)'}"
            f"\n\n# The agent's final answer\n{answer if answer is not None else f'(none: it stopped at {run.stop_reason})'}"
            f"\n\n# Rubric\n{rubric}\n")


def read_grade(text: str) -> tuple[float, str | None]:
    """The score and explanation in a judge's reply (a JSON object, possibly in a code fence)."""
    found = _OBJECT.search(text or "")
    try:
        data = json.loads(found.group(0)) if found else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or isinstance(data.get("score"), bool) or not isinstance(data.get("score"), (int, float)):
        raise ValueError("the judge's reply holds no JSON object with a numeric score")
    score = float(data["score"])
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"the judge's score {score} is outside [0, 1]")
    explanation = data.get("explanation")
    return score, str(explanation)[:2000] if explanation is not None else None

