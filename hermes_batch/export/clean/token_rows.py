"""Token rows of a masked trajectory: its ids spell the values masked in its text, so each segment is
re-tokenised where, and only where, a masked value lies. The ids are read back to text with the
run's model's vocabulary (--tokenizer); around each value the fewest whole tokens whose text holds
it are cut out, and the same text with the value's placeholder put in its place is tokenised as
text. The new ids are not the model's: their loss mask is 0 and they have no log-probability (null),
so nothing misaligned is ever trained on; every id outside them is as the rollout made it. The row
says `token_exact: false`.

A segment whose ids do not read back to its trajectory's text (a --tokenizer other than the run's
model's) is no row: it is left out, with that reason, and so is one that would still spell a value."""

from __future__ import annotations

import math
import re
from typing import Any

from ..compress import Tokenizer


def retokenised(segment: dict[str, Any], table: dict[str, str], tokenizer: Tokenizer,
                prompt: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the segment with its masked values re-tokenised, None) or (None, why it cannot be)."""
    ids = list(segment["input_ids"])
    text = tokenizer.text(ids)
    if prompt.strip() and prompt.strip()[:200] not in text:
        return None, (f"its text was masked, and its ids do not read back to its prompt with --tokenizer="
                      f"{tokenizer.name}: give the run's model's tokenizer.json")
    pattern = re.compile("|".join(re.escape(v) for v in sorted(table, key=len, reverse=True)))
    spans = [(m.start(), m.end()) for m in pattern.finditer(text)]
    if not spans:
        return segment, None
    decoded: dict[tuple[int, int], str] = {}

    def spelled(a: int, b: int) -> str:
        if (a, b) not in decoded:
            decoded[a, b] = tokenizer.text(ids[a:b]) if a < b else ""
        return decoded[a, b]

    cuts: list[list[int]] = []
    for s, e in spans:
        a, b = _before(s, ids, text, spelled), _after(e, ids, text, spelled)
        if cuts and a <= cuts[-1][1]:
            cuts[-1][1] = max(cuts[-1][1], b)
        else:
            cuts.append([a, b])
    mask, logprobs = list(segment["loss_mask"]), list(segment["logprobs"])
    for a, b in reversed(cuts):  # from the end: the positions before a cut stay valid
        head, tail = len(spelled(0, a)), len(spelled(b, len(segment["input_ids"])))
        middle = pattern.sub(lambda m: table[m.group()], text[head:len(text) - tail])
        new = tokenizer.plain_ids(middle)
        ids[a:b], mask[a:b], logprobs[a:b] = new, [0] * len(new), [math.nan] * len(new)
    if pattern.search(tokenizer.text(ids)):
        return None, "its ids would still spell a masked value after re-tokenising"
    return {**segment, "input_ids": ids, "loss_mask": mask, "logprobs": logprobs, "token_exact": False}, None


def _before(s: int, ids: list[int], text: str, spelled: Any) -> int:
    """The most tokens from the start whose text ends at or before character `s`."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(spelled(0, mid)) <= s:
            lo = mid
        else:
            hi = mid - 1
    while lo > 0 and not text.startswith(spelled(0, lo)):  # a token cut inside a character
        lo -= 1
    return lo


def _after(e: int, ids: list[int], text: str, spelled: Any) -> int:
    """The first token from which the rest's text starts at or after character `e`."""
    n = len(ids)
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if len(text) - len(spelled(mid, n)) >= e:
            hi = mid
        else:
            lo = mid + 1
    while lo < n and not text.endswith(spelled(lo, n)):
        lo += 1
    return lo
