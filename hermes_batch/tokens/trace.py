"""A rollout's tokens: per model call, the ids it added to the sequence (its whole prompt at the start
of a segment, then what the runner rendered after the previous reply: tool results and the next
turn's opening), the completion ids the endpoint returned, their log-probabilities, and its finish
reason. A segment's token sequence is the concatenation of its calls' `added` and `completion`; the
model's own tokens are exactly the completions. A new segment starts where the history stopped
being an extension of the sequence (a template that re-renders earlier turns, a cut reply)."""

from __future__ import annotations

import binascii
import math
import zlib
from dataclasses import dataclass, field
from typing import Any

from .codec import pack_ids, pack_logprobs, unpack_ids, unpack_logprobs


@dataclass
class TokenCall:
    segment: int
    added: list[int]  # ids put before the completion by the runner (never trained on)
    completion: list[int]  # the model's own ids, as the endpoint returned them
    logprobs: list[float]  # one per completion id; NaN where the endpoint gave none
    finish_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"segment": self.segment, "added": pack_ids(self.added), "completion": pack_ids(self.completion),
                "logprobs": pack_logprobs(self.logprobs), "finish_reason": self.finish_reason}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TokenCall:
        return cls(int(data["segment"]), unpack_ids(data["added"]), unpack_ids(data["completion"]),
                   unpack_logprobs(data["logprobs"]), data.get("finish_reason"))


@dataclass
class TokenTrace:
    mode: str = "exact"
    tokenizer: str | None = None  # what turned text into ids (a hash of its identity)
    template: str | None = None  # what turned messages into text (a hash of the chat template)
    calls: list[TokenCall] = field(default_factory=list)
    render_seconds: float = 0.0  # spent rendering and tokenising requests (the price of exactness)
    # the runner's own state between calls (not stored): the last prompt as the server rendered it
    rendered: str = ""
    rendered_ids: list[int] = field(default_factory=list)

    @property
    def segments(self) -> int:
        return self.calls[-1].segment + 1 if self.calls else 0

    def sequence(self, segment: int | None = None) -> list[int]:
        """The ids of a segment (the last one by default), in order."""
        segment = self.segments - 1 if segment is None else segment
        out: list[int] = []
        for c in self.calls:
            if c.segment == segment:
                out += c.added + c.completion
        return out

    def prompt_of(self, index: int) -> list[int]:
        """The ids call `index` was sent: its segment's sequence before its completion."""
        call = self.calls[index]
        out: list[int] = []
        for c in self.calls[:index]:
            if c.segment == call.segment:
                out += c.added + c.completion
        return out + call.added

    def rows(self) -> list[dict[str, Any]]:
        """Per segment: input_ids, loss_mask (1 exactly on the model's own tokens), logprobs (aligned,
        0 where the mask is 0, NaN where the endpoint gave none)."""
        out = []
        for segment in range(self.segments):
            ids: list[int] = []
            mask: list[int] = []
            logprobs: list[float] = []
            for c in (c for c in self.calls if c.segment == segment):
                ids += c.added + c.completion
                mask += [0] * len(c.added) + [1] * len(c.completion)
                logprobs += [0.0] * len(c.added) + list(c.logprobs)
            out.append({"segment": segment, "input_ids": ids, "loss_mask": mask, "logprobs": logprobs})
        return out

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "tokenizer": self.tokenizer, "template": self.template,
                "segments": self.segments, "missing_logprobs": self.missing_logprobs(),
                "render_seconds": round(self.render_seconds, 4), "calls": [c.to_json() for c in self.calls]}

    @classmethod
    def read(cls, data: Any) -> TokenTrace:
        """A record's `tokens`, or ValueError naming what is wrong with it (an edited record)."""
        try:
            trace = cls.from_json(data)
        except (AttributeError, KeyError, TypeError, ValueError, zlib.error, binascii.Error) as exc:
            raise ValueError(f"its token data cannot be read ({type(exc).__name__}: {exc})") from None
        for c in trace.calls:
            if len(c.logprobs) != len(c.completion):
                raise ValueError("its token data gives a log-probability count other than its completion's")
        return trace

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TokenTrace:
        return cls(data.get("mode", "exact"), data.get("tokenizer"), data.get("template"),
                   [TokenCall.from_json(c) for c in data.get("calls") or []], float(data.get("render_seconds") or 0))

    def missing_logprobs(self) -> int:
        return sum(1 for c in self.calls for lp in c.logprobs if math.isnan(lp))
