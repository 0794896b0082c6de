"""A rollout's tokens: per model call, the ids it added to the sequence (its whole prompt at the start
of a segment, then what the runner rendered after the previous reply: tool results and the next
turn's opening), the completion ids the endpoint returned, their log-probabilities, and its finish
reason. A segment's token sequence is the concatenation of its calls' `added` and `completion`; the
model's own tokens are exactly the completions. A new segment starts where the history stopped
being an extension of the sequence (a template that re-renders earlier turns, a cut reply).

Two modes fill it: `exact` (the runner sends ids it built itself: every call is known and extends
its segment by construction) and `record` (a chat endpoint's own ids, where it returns them: a
prompt that does not extend the last call's sequence is a prefix break, marked on the call and
counted; ids the endpoint did not return are None, and their segment is not a token row)."""

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
    added: list[int] | None  # ids put before the completion (never trained on); None: the endpoint gave none
    completion: list[int] | None  # the model's own ids, as the endpoint returned them; None: it gave none
    logprobs: list[float]  # one per completion token; NaN where the endpoint gave none
    finish_reason: str | None = None
    prefix_break: bool = False  # record: this prompt was not the last call's sequence extended

    @property
    def known(self) -> bool:
        return self.added is not None and self.completion is not None

    def to_json(self) -> dict[str, Any]:
        out = {"segment": self.segment, "added": None if self.added is None else pack_ids(self.added),
               "completion": None if self.completion is None else pack_ids(self.completion),
               "logprobs": pack_logprobs(self.logprobs), "finish_reason": self.finish_reason}
        if self.prefix_break:
            out["prefix_break"] = True
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TokenCall:
        added, completion = data["added"], data["completion"]
        return cls(int(data["segment"]), None if added is None else unpack_ids(added),
                   None if completion is None else unpack_ids(completion), unpack_logprobs(data["logprobs"]),
                   data.get("finish_reason"), bool(data.get("prefix_break")))


@dataclass
class TokenTrace:
    mode: str = "exact"
    tokenizer: str | None = None  # what turned text into ids (a hash of its identity)
    template: str | None = None  # what turned messages into text (a hash of the chat template)
    calls: list[TokenCall] = field(default_factory=list)
    render_seconds: float = 0.0  # spent rendering and tokenising requests (the price of exactness)
    # every message's text was tokenised as text, each call's control ids checked against its template's
    # (tokens/controls.py): no control token where text belongs
    plain_text: bool = False
    # the runner's own state between calls (not stored): the last prompt as the server rendered it
    rendered: str = ""
    rendered_ids: list[int] = field(default_factory=list)

    @property
    def segments(self) -> int:
        return self.calls[-1].segment + 1 if self.calls else 0

    def sequence(self, segment: int | None = None) -> list[int] | None:
        """The ids of a segment (the last one by default), in order; None when the endpoint left
        some of them out (record)."""
        segment = self.segments - 1 if segment is None else segment
        return self._ids([c for c in self.calls if c.segment == segment])

    def prompt_of(self, index: int) -> list[int] | None:
        """The ids call `index` was sent: its segment's sequence before its completion (None: not all known)."""
        call = self.calls[index]
        before = self._ids([c for c in self.calls[:index] if c.segment == call.segment])
        return None if before is None or call.added is None else before + call.added

    @staticmethod
    def _ids(calls: list[TokenCall]) -> list[int] | None:
        out: list[int] = []
        for c in calls:
            if c.added is None or c.completion is None:
                return None
            out += c.added + c.completion
        return out

    def record(self, prompt: list[int] | None, completion: list[int] | None, logprobs: list[float],
               finish_reason: str | None) -> TokenCall:
        """Adds a call as a chat endpoint reported it (record): in the last call's segment when its
        prompt extends that segment's sequence, else a new segment, marked a break when that
        sequence was known. Ids the endpoint did not give cannot be checked and are no break: calls
        without prompt ids share a segment, which is no token row."""
        last = self.calls[-1] if self.calls else None
        before = self.sequence() if last is not None else None
        if prompt is not None and before is not None and prompt[:len(before)] == before:
            call = TokenCall(self.segments - 1, prompt[len(before):], completion, logprobs, finish_reason)
        elif prompt is None and last is not None and before is None:  # nothing known to extend: one segment
            call = TokenCall(self.segments - 1, None, completion, logprobs, finish_reason)
        else:
            call = TokenCall(self.segments, prompt, completion, logprobs, finish_reason,
                             prefix_break=prompt is not None and before is not None)
        self.calls.append(call)
        return call

    @property
    def prefix_breaks(self) -> int:
        return sum(c.prefix_break for c in self.calls)

    def rows(self) -> list[dict[str, Any]]:
        """Per segment whose ids are all known: input_ids, loss_mask (1 exactly on the model's own
        tokens), logprobs (aligned, 0 where the mask is 0, NaN where the endpoint gave none)."""
        out = []
        for segment in range(self.segments):
            ids: list[int] = []
            mask: list[int] = []
            logprobs: list[float] = []
            calls = [c for c in self.calls if c.segment == segment]
            if not all(c.known for c in calls):
                continue
            for c in calls:
                assert c.added is not None and c.completion is not None
                ids += c.added + c.completion
                mask += [0] * len(c.added) + [1] * len(c.completion)
                logprobs += [0.0] * len(c.added) + list(c.logprobs)
            out.append({"segment": segment, "input_ids": ids, "loss_mask": mask, "logprobs": logprobs})
        return out

    def to_json(self) -> dict[str, Any]:
        out = {"mode": self.mode, "tokenizer": self.tokenizer, "template": self.template,
               "segments": self.segments, "missing_logprobs": self.missing_logprobs(),
               "render_seconds": round(self.render_seconds, 4), "calls": [c.to_json() for c in self.calls]}
        if self.plain_text:
            out["plain_text"] = True
        if self.mode == "record":  # what the endpoint gave, and where its prompts stopped extending
            out["prefix_breaks"] = self.prefix_breaks
            out["calls_without_ids"] = sum(not c.known for c in self.calls)
            out["calls_without_reply_ids"] = sum(c.completion is None for c in self.calls)
        return out

    @classmethod
    def read(cls, data: Any) -> TokenTrace:
        """A record's `tokens`, or ValueError naming what is wrong with it (an edited record)."""
        try:
            trace = cls.from_json(data)
        except (AttributeError, KeyError, TypeError, ValueError, zlib.error, binascii.Error) as exc:
            raise ValueError(f"its token data cannot be read ({type(exc).__name__}: {exc})") from None
        for c in trace.calls:
            if c.completion is not None and len(c.logprobs) != len(c.completion):
                raise ValueError("its token data gives a log-probability count other than its completion's")
        return trace

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TokenTrace:
        return cls(data.get("mode", "exact"), data.get("tokenizer"), data.get("template"),
                   [TokenCall.from_json(c) for c in data.get("calls") or []], float(data.get("render_seconds") or 0),
                   data.get("plain_text") is True)

    def missing_logprobs(self) -> int:
        return sum(1 for c in self.calls for lp in c.logprobs if math.isnan(lp))
