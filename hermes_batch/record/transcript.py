"""What an agent loop leaves: its transcript (the messages to save), each tool call's outcome by
call id, its model calls and why it stopped (`AgentRun`). The loop (agent.py) writes one; a record
(build.py) is made from it, and a judge reads it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_INLINE_REASONING = re.compile(r"<think>|<REASONING_SCRATCHPAD>")


@dataclass
class ToolOutcome:
    call_id: str
    name: str
    ok: bool
    known: bool  # False for a tool name that was not offered
    content: str
    duration: float
    structured: bool = False  # `content` is the tool's own JSON (the record keeps it as a value)
    images: tuple[Any, ...] = ()  # the images the call saw or made (tools/media.py Image)
    shown: bool = False  # ... and the model is shown them with the result


@dataclass
class AgentRun:
    transcript: list[dict[str, Any]] = field(default_factory=list)  # user/assistant/tool messages to save
    outcomes: dict[str, ToolOutcome] = field(default_factory=dict)  # by tool call id
    calls: list[dict[str, Any]] = field(default_factory=list)  # one per model request
    stop_reason: str = "max_turns"
    tokens: Any = None  # --tokens=exact: the rollout's tokens.TokenTrace, filled by the model client
    llm_seconds: float = 0.0
    tool_seconds: float = 0.0
    harness: dict[str, Any] | None = None  # --agent: who drove it, its calls and threads, how it ended
    # --agent: the threads of calls beside the one saved as the conversation (harness/transcript.py)
    side_threads: list[dict[str, Any]] = field(default_factory=list)

    @property
    def api_calls(self) -> int:
        return len(self.calls)

    @property
    def completed(self) -> bool:
        return self.stop_reason == "final_answer"

    @property
    def final_answer(self) -> str | None:
        """The text of the reply that ended the loop (reasoning left out); None when no reply did."""
        if not self.completed:
            return None
        last = self.assistant_turns()[-1]
        return visible_text(last.get("content") or "")

    def assistant_turns(self) -> list[dict[str, Any]]:
        return [m for m in self.transcript if m["role"] == "assistant"]

    def drop_unanswered_turn(self) -> None:
        """Cut short mid-turn (a deadline): drop a last assistant turn whose calls did not all get
        results, so no call without its result reaches the data. Its spend stays in `calls`."""
        for i in range(len(self.transcript) - 1, -1, -1):
            msg = self.transcript[i]
            if msg["role"] == "assistant":
                if any(c["id"] not in self.outcomes for c in msg["tool_calls"] or []):
                    del self.transcript[i:]
                    if self.tokens is not None and len(self.tokens.calls) == len(self.assistant_turns()) + 1:
                        self.tokens.calls.pop()  # its tokens go with it: the record and its ids tell one story
                return


def has_reasoning(message: dict[str, Any]) -> bool:
    return bool(message.get("reasoning")) or bool(_INLINE_REASONING.search(message.get("content") or ""))


def visible_text(content: str) -> str:
    """A reply's text without its reasoning."""
    return re.sub(r"<(think|REASONING_SCRATCHPAD)>.*?(</\1>|$)", "", content, flags=re.S).strip()
