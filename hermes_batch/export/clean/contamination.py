"""Benchmark contamination (`--decontaminate`): word n-gram overlap (13 by default, as GPT-3's and
the field's decontaminators count) between a row's texts (the prompt, each tool result, each reply's
text and call arguments, where a solution the agent fetched or wrote shows) and a benchmark's items
(their prompts and solutions: benchmarks.py). One shared n-gram is a match; the longest run of
matching words is reported with the item it came from.

Words are `\\w+` runs, lowercased. The index of a benchmark is the sorted 64-bit hashes of its
n-grams with the item each came from, built once and kept in the cache directory
(HERMES_BATCH_CACHE, else ~/.cache/hermes-batch) under the benchmark's content key; a row is looked
up with numpy (a rolling hash of its words, a sorted search), so no Python loop runs per n-gram."""

from __future__ import annotations

import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .benchmarks import Benchmark, benchmark

WORD = re.compile(r"\w+")
INDEX_VERSION = 1  # bumped when the hashing changes: older cached indexes are not read
MIX = 0x9E3779B97F4A7C15  # spreads a word's 32-bit CRC over 64 bits
BASE = 0x100000001B3  # the rolling hash's multiplier (odd: no information lost mod 2^64)
SPAN_SHOWN = 300  # characters of a matched span a report shows
_words: dict[str, int] = {}  # a word's hash, remembered (vocabularies repeat); cleared when large


def cache_dir() -> Path:
    root = os.environ.get("HERMES_BATCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hermes-batch")
    return Path(root) / "benchmarks"


def word_hashes(words: list[str]) -> Any:
    import numpy as np

    if len(_words) > 2_000_000:
        _words.clear()
    out = list(map(_words.get, words))  # at C speed; the words not seen yet are hashed below
    if None in out:
        for k, w in enumerate(words):
            if out[k] is None:
                out[k] = _words[w] = zlib.crc32(w.encode())
    return np.array(out, dtype=np.uint64) * np.uint64(MIX)


def ngram_hashes(hashes: Any, n: int) -> Any:
    """The rolling hash of every n consecutive words (an empty array for fewer words)."""
    import numpy as np

    count = len(hashes) - n + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    acc = hashes[:count].copy()
    base = np.uint64(BASE)
    with np.errstate(over="ignore"):
        for j in range(1, n):
            acc = acc * base + hashes[j:j + count]
    return acc


@dataclass
class BenchmarkIndex:
    bench: Benchmark
    n: int
    hashes: Any  # sorted uint64
    owners: Any  # uint32: the item each hash came from
    items: list[str]
    cached: bool  # read from the cache, not built now

    @classmethod
    def of(cls, source: str, n: int) -> BenchmarkIndex:
        import numpy as np

        bench = benchmark(source)
        path = cache_dir() / f"{bench.key.replace(':', '-')}-n{n}-v{INDEX_VERSION}"
        try:
            with np.load(path.with_suffix(".npz")) as data:
                items = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
                return cls(bench, n, data["hashes"], data["owners"], items, True)
        except (OSError, ValueError, KeyError):
            pass
        items, parts, owners = [], [], []
        for k, (ident, text) in enumerate(bench.items()):
            items.append(ident)
            grams = np.unique(ngram_hashes(word_hashes(WORD.findall(text.lower())), n))
            parts.append(grams)
            owners.append(np.full(len(grams), k, dtype=np.uint32))
        hashes = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
        who = np.concatenate(owners) if owners else np.zeros(0, dtype=np.uint32)
        order = np.argsort(hashes, kind="stable")
        hashes, who = hashes[order], who[order]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp.npz")
        np.savez(tmp, hashes=hashes, owners=who)
        path.with_suffix(".json").write_text(json.dumps(items), encoding="utf-8")
        tmp.replace(path.with_suffix(".npz"))  # the index last: a cut build is never read
        return cls(bench, n, hashes, who, items, False)

    def matches(self, grams: Any) -> Any:
        """For each n-gram hash, the index of its match in `hashes`, or -1."""
        import numpy as np

        if not len(self.hashes) or not len(grams):
            return np.full(len(grams), -1)
        at = np.searchsorted(self.hashes, grams)
        at[at >= len(self.hashes)] = 0
        return np.where(self.hashes[at] == grams, at, -1)


@dataclass
class Finding:
    benchmark: str
    item: str
    where: str  # prompt, tool result (terminal), reply, call (write_file)
    span: str
    words: int

    def as_dict(self) -> dict[str, Any]:
        return {"benchmark": self.benchmark, "item": self.item, "where": self.where, "span": self.span,
                "words": self.words}


class Decontaminator:
    def __init__(self, sources: list[str], n: int):
        self.n = n
        self.indexes = [BenchmarkIndex.of(s, n) for s in sources]

    def describe(self) -> list[dict[str, Any]]:
        return [{"source": i.bench.source, "kind": i.bench.kind, "content_sha256": i.bench.key.split(":")[-1],
                 "items": len(i.items), "ngrams": int(len(i.hashes)), "ngram": self.n, "cached": i.cached}
                for i in self.indexes]

    def check(self, said: list[dict[str, Any]]) -> Finding | None:
        """The longest span of a row's messages (`said`) shared with a benchmark, or None."""
        best: Finding | None = None
        for where, text in row_texts(said):
            lowered = text.lower()
            grams = ngram_hashes(word_hashes(WORD.findall(lowered)), self.n)
            if not len(grams):
                continue
            for index in self.indexes:
                hit = index.matches(grams)
                if (hit >= 0).any():
                    found = self._span(index, hit, text, lowered, where)
                    if best is None or found.words > best.words:
                        best = found
        return best

    def _span(self, index: BenchmarkIndex, hit: Any, text: str, lowered: str, where: str) -> Finding:
        """The longest run of matched n-grams, as the words it covers in `text`."""
        import numpy as np

        matched = np.flatnonzero(hit >= 0)
        runs = np.split(matched, np.flatnonzero(np.diff(matched) != 1) + 1)
        run = max(runs, key=len)
        first, last = int(run[0]), int(run[-1]) + self.n - 1
        spans = [m.span() for m in WORD.finditer(lowered)]
        start, end = spans[first][0], spans[last][1]
        shown = (text if len(lowered) == len(text) else lowered)[start:end]
        if len(shown) > SPAN_SHOWN:
            shown = shown[:SPAN_SHOWN // 2] + " … " + shown[-SPAN_SHOWN // 2:]
        item = index.items[int(index.owners[int(hit[run[0]])])]
        return Finding(index.bench.source, item, where, shown, last - first + 1)


def row_texts(said: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(where, text) of what a row's messages say that a benchmark could have leaked into."""
    out = []
    for m in said:
        if m["role"] == "user":
            out.append(("prompt", m.get("content") or ""))
        elif m["role"] == "tool":
            out.append((f"tool result ({m.get('name')})", m.get("content") or ""))
        elif m["role"] == "assistant":
            out.append(("reply", m.get("content") or ""))
            out += [(f"call ({c['function']['name']})", _argument_text(c["function"]["arguments"]))
                    for c in m.get("tool_calls") or []]
    return [(w, t) for w, t in out if t]


def _argument_text(arguments: Any) -> str:
    """A call's argument values as text (a file's content written by the agent, a command)."""
    try:
        value = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return str(arguments or "")
    if isinstance(value, dict):
        return "\n".join(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in value.values())
    return str(value)
