"""Reading an agent's final answer against a row's `expected` (docs/verification.md): exact and
contains compare normalised text, regex searches, number reads the last \\boxed{} or the last number."""

from __future__ import annotations

import math
import re

import regex

REGEX_SECONDS = 2.0  # a row's pattern on a model's text: past this it is catastrophic backtracking

_BOXED = re.compile(r"\\boxed\s*\{")
_NUMBER = re.compile(r"(?<![\w.])[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?|[-+−]?\.\d+")


def normalised(text: str) -> str:
    """For exact and contains: case and runs of whitespace do not count, nor a closing period."""
    return " ".join(text.casefold().split()).rstrip(".").strip()


def boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (braces balanced), as math answers are written."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, i = 1, starts[-1]
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


_ASIDE = re.compile(r"\([^()]*\)|\[[^\[\]]*\]")
_HEDGE = re.compile(r"\s*,?\s*(?:or|and/or)\s*", re.I)


def read_number(text: str) -> float | None:
    """The answer's number: inside its last \\boxed{} if it has one, else its last number outside
    asides in brackets ("395 (17 × 23 + 4)" is 395); none when it hedges between two ("394 or
    395"). `1,234` and `3/4` and `−2` are read as written."""
    inside = boxed(text)
    if inside is None:
        outside = text
        while (cut := _ASIDE.sub(" ", outside)) != outside:
            outside = cut
        text = outside if _NUMBER.search(outside) else text
    found = list(_NUMBER.finditer(inside if inside is not None else text))
    if not found:
        return None
    if len(found) > 1 and _HEDGE.fullmatch((inside or text)[found[-2].end():found[-1].start()]):
        return None
    token = found[-1].group(0).replace(",", "").replace("−", "-").replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/")
            return float(num) / float(den) if float(den) else None
        return float(token)
    except ValueError:
        return None


def pick_answer(final: str, answer_regex: str | None) -> str | None:
    """The part of the final answer to compare: the last match of `answer_regex` (its first group
    if it has one), or the whole answer."""
    if answer_regex is None:
        return final
    matches = list(regex.finditer(answer_regex, final, timeout=REGEX_SECONDS))
    if not matches:
        return None
    m = matches[-1]
    return m.group(1) if m.re.groups else m.group(0)


def matches(answer: str, expected: str | int | float, how: str, tolerance: float | None) -> bool:
    """Whether the answer matches; TimeoutError when a regular expression takes too long."""
    if how == "exact":
        return normalised(answer) == normalised(str(expected))
    if how == "contains":
        return normalised(str(expected)) in normalised(answer)
    if how == "regex":
        return regex.search(str(expected), answer, timeout=REGEX_SECONDS) is not None
    got, want = read_number(answer), read_number(str(expected))
    if got is None or want is None:
        return False
    if tolerance is not None:
        return abs(got - want) <= tolerance
    return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
