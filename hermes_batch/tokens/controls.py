"""Control tokens are the chat template's alone: the text a message carries (a user's words, a tool's
result, a file or page the agent read, the model's own earlier words sent again) is tokenised as
text on every token path, so `<|im_start|>` written in a file is the ids of its characters, never a
turn of its own.

A chat is rendered twice: as it is, and as its `Skeleton` (every string a message carries replaced by
a random marker). Where the template copied each string as it is, the rendering is the skeleton's
own pieces with the strings between them (`Skeleton.layout`); a control token's text counts only
inside the template's pieces (`Layout.parts`), and every stretch between two of them is tokenised as
plain text, as a tokenizer that parses special tokens would have split it. `marker()` is a random
text no message can hold (where a turn rendered after a reply begins). `refusal` is the check a
rollout's sequence passes before a trainer gets it."""

from __future__ import annotations

import json
import re
import secrets
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .trace import TokenTrace

# the turn tokens of the chat templates whose text is recognised in records (ChatML: Qwen, Hermes; Llama 3)
CONTROL_TEXT = re.compile(r"<\|(?:im_start|im_end|endoftext|eot_id|start_header_id|end_header_id)\|>")
KIND = "control_token_in_text"  # a PromptFailed's kind: a call that would have sent text as a control token


def marker() -> str:
    """A text no message holds: random, drawn after everything the call renders was written."""
    return f"hbx{secrets.token_hex(16)}x"


@dataclass
class Layout:
    """Where a rendering is the template's own text: `template` spans (start, end), in order, laid
    out from `covered` on (0: all of it); the rest between them is the messages' strings."""

    rendered: str
    template: list[tuple[int, int]]
    covered: int

    def pieces(self, start: int = 0) -> list[str]:
        """The template's text from `start` on."""
        return [self.rendered[max(a, start):b] for a, b in self.template if b > start]

    def parts(self, controls: dict[str, int], start: int = 0) -> list[str | int] | None:
        """rendered[start:] as stretches of text and the ids of the control tokens written inside the
        template's pieces (`controls`: a control token's text → its id); None where the layout does
        not reach back to `start`."""
        if start < self.covered:
            return None
        found = _pattern(controls)
        out: list[str | int] = []
        at = start
        for a, b in self.template:
            if b <= start or found is None:
                continue
            for m in found.finditer(self.rendered, max(a, start), b):
                if m.start() > at:
                    out.append(self.rendered[at:m.start()])
                out.append(controls[m.group()])
                at = m.end()
        if at < len(self.rendered):
            out.append(self.rendered[at:])
        return out


@dataclass
class Skeleton:
    """`messages` with every string they carry (contents, reasoning, the keys and values of a call's
    arguments) replaced by a marker; `forms`: each marker's string as a template may write it (a
    call's arguments JSON-escaped)."""

    messages: list[dict[str, Any]]
    forms: dict[str, tuple[str, ...]]
    pattern: re.Pattern[str]

    @classmethod
    def of(cls, messages: list[dict[str, Any]]) -> Skeleton:
        salt = secrets.token_hex(8)
        forms: dict[str, tuple[str, ...]] = {}

        def mark(*texts: str) -> str:
            m = f"hbx{salt}n{len(forms)}x"
            forms[m] = tuple(sorted(set(texts), key=len, reverse=True))  # the longest first: another may end it
            return m

        def text(s: Any) -> Any:
            return mark(s) if isinstance(s, str) and s else s

        def value(v: Any) -> Any:  # inside a call's arguments, as JSON
            if isinstance(v, str):
                return mark(*_escaped(v)) if v else v
            if isinstance(v, list):
                return [value(x) for x in v]
            if isinstance(v, dict):
                return {(mark(*_escaped(k)) if k else k): value(x) for k, x in v.items()}
            return v

        def call(c: dict[str, Any]) -> dict[str, Any]:
            fn = dict(c.get("function") or {})
            args = fn.get("arguments")
            if isinstance(args, str) and args:
                try:
                    parsed = json.loads(args)
                except ValueError:
                    parsed = None
                fn["arguments"] = (json.dumps(value(parsed), ensure_ascii=False) if isinstance(parsed, (dict, list))
                                   else mark(args, *_escaped(args)))
            return {**c, "function": fn}

        out = []
        for m in messages:
            m = dict(m)
            content = m.get("content")
            if isinstance(content, list):  # parts: their text
                m["content"] = [{**p, "text": text(p["text"])} if isinstance(p, dict) and "text" in p else p
                                for p in content]
            else:
                m["content"] = text(content)
            if "reasoning_content" in m:
                m["reasoning_content"] = text(m["reasoning_content"])
            if m.get("tool_calls"):
                m["tool_calls"] = [call(c) for c in m["tool_calls"]]
            out.append(m)
        return cls(out, forms, re.compile(f"(hbx{salt}n\\d+x)"))

    def layout(self, shape: str, rendered: str) -> Layout:
        """`rendered` (the messages' rendering) laid out by `shape` (this skeleton's, with the same
        tools and options): matched from its end back, template piece by string, as far as the
        template copied each string as it is."""
        seq = self.pattern.split(shape)  # template, marker, template, …, template
        pos, template = len(rendered), []
        for i in range(len(seq) - 1, -1, -1):
            if i % 2 == 0:
                if not rendered.endswith(seq[i], 0, pos):
                    break
                template.append((pos - len(seq[i]), pos))
                pos -= len(seq[i])
            else:
                form = next((f for f in self.forms.get(seq[i], ()) if rendered.endswith(f, 0, pos)), None)
                if form is None:
                    break
                pos -= len(form)
        return Layout(rendered, template[::-1], pos)


def excess(real: Iterable[int], skeleton: Iterable[int], names: dict[int, str]) -> str | None:
    """Where a rendering tokenised as a whole holds more of a control token than its skeleton's (the
    template's own count): what a message's text turned into, else None. `names`: control ids → text."""
    more = Counter(t for t in real if t in names) - Counter(t for t in skeleton if t in names)
    if not more:
        return None
    said = ", ".join(f"{names[t]} ×{n}" for t, n in more.items())
    return (f"a message's text holds the control token(s) {said}, which this template does not insert verbatim so "
            "its text cannot be tokenised apart: sending it would forge turns")


def held_control(messages: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(role, the control token's text) of the first message whose text (content, reasoning, a call's
    arguments) holds one of a chat template's turn tokens, else None."""
    for m in messages:
        said = f"{m.get('content') or ''}{m.get('reasoning_content') or ''}" + "".join(
            (c.get("function") or {}).get("arguments") or "" for c in m.get("tool_calls") or [])
        if found := CONTROL_TEXT.search(said):
            return m.get("role") or "?", found.group(0)
    return None


def refusal(trace: TokenTrace, messages: list[dict[str, Any]]) -> str | None:
    """Why a rollout's token sequence must not reach a trainer (it may hold a control token where a
    message's text belongs), else None. Ids made with every message's text as text (the token
    clients that do, checking each call's control ids against its template's: `plain_text`) pass;
    any others are held to the export's check: no message's text holds a turn token."""
    if trace.plain_text:
        return None
    found = held_control(messages)
    if found is None:
        return None
    return (f"a {found[0]} message holds the control token {found[1]} and its token ids were not made with message "
            "text as text: the sequence may hold it as a control token (a forged turn)")


def _escaped(s: str) -> tuple[str, str]:
    """A string as JSON writes it inside quotes, with and without non-ASCII escaped."""
    return json.dumps(s, ensure_ascii=False)[1:-1], json.dumps(s)[1:-1]


def _pattern(controls: dict[str, int]) -> re.Pattern[str] | None:
    if not controls:
        return None
    return re.compile("|".join(re.escape(s) for s in sorted(controls, key=len, reverse=True)))
