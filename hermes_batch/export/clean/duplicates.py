"""Duplicate trajectories (`--dedup=exact|near`), across every run exported together, found in a
first read of the rows the filters keep and resolved before anything is written:

    exact   the same normalised conversation: every message's role and text (white space folded,
            case kept), each call's name and arguments (JSON read, keys sorted), the tools offered;
            call ids, timings and verdicts are not part of it
    near    MinHash (datasketch) over the agent's own actions and answers (each reply's text and
            calls), as word 3-grams; pairs whose estimated Jaccard similarity reaches
            --dedup_threshold are duplicates, found through datasketch's LSH index and checked on
            their signatures. A trajectory with fewer than NEAR_MIN shingles is compared exactly only
            (a short answer alike across prompts is not a copy)

Duplicates form groups (transitively); one of each group is kept by --dedup_keep: `passing` (the
passing one: the highest score, then the shortest, then the first), `shortest` (the fewest assistant
turns, then tokens), `first` (in the order of --run_name, then of each run's file). With
--dedup_scope=prompt only samples of one prompt are compared; `all` compares across prompts too.
Memory holds a few numbers and one 512-byte signature per trajectory, never a trajectory."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ...record import offered_tools, prompt_id_of

WORD = re.compile(r"\w+")
SHINGLE = 3  # words per shingle: agent actions are short, a file name changes one word
NEAR_MIN = 10  # shingles below which a trajectory is compared exactly only
NUM_PERM = 128


@dataclass
class _Entry:
    id: str
    prompt: str
    exact: str
    rank: tuple[Any, ...]
    signature: Any = None  # numpy uint32 array, or None (too short for near)


@dataclass
class Duplicates:
    mode: str  # exact | near
    threshold: float = 0.8
    scope: str = "all"  # all | prompt
    keep: str = "passing"  # passing | shortest | first
    entries: list[_Entry] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)  # id → why (a duplicate of which)
    counts: dict[str, int] = field(default_factory=dict)  # exact, near, within a prompt, across prompts

    def __post_init__(self) -> None:
        self._parent: list[int] = []
        self._by_exact: dict[str, int] = {}
        self._lsh: Any = None
        if self.mode == "near":
            try:
                from datasketch import MinHash, MinHashLSH
            except ImportError as exc:
                from ...errors import ExportError

                raise ExportError("--dedup=near uses datasketch: pip install -e '.[export]'") from exc
            self._minhash = MinHash
            # band hashes as Python ints, not the bands' bytes: a tenth of the memory
            self._lsh = MinHashLSH(threshold=self.threshold, num_perm=NUM_PERM, hashfunc=hash)

    def add(self, rec: dict[str, Any], said: list[dict[str, Any]]) -> None:
        """One trajectory the filters keep, in export order; `said`: its messages."""
        order = len(self.entries)
        meta = rec.get("metadata") or {}
        verdict = rec.get("verification") or {}
        short = (int(meta.get("assistant_turns") or 0), int((meta.get("usage") or {}).get("total_tokens") or 0))
        score = verdict.get("score")
        rank: tuple[Any, ...] = {"passing": (verdict.get("status") != "pass", -(score if score is not None else -1.0),
                                             *short, order),
                                 "shortest": (*short, order), "first": (order,)}[self.keep]
        entry = _Entry(str(rec["id"]), prompt_id_of(rec), exact_key(rec, said), rank)
        self.entries.append(entry)
        self._parent.append(order)
        if (other := self._by_exact.get(self._scoped(entry.exact, entry))) is not None:
            self._union(other, order)
        else:
            self._by_exact[self._scoped(entry.exact, entry)] = order
        if self._lsh is not None:
            self._add_near(entry, order, said)

    def _scoped(self, key: str, entry: _Entry) -> str:
        return key if self.scope == "all" else f"{entry.prompt}\0{key}"

    def _add_near(self, entry: _Entry, order: int, said: list[dict[str, Any]]) -> None:
        import numpy as np

        shingles = action_shingles(said)
        if len(shingles) < NEAR_MIN:
            return
        mh = self._minhash(num_perm=NUM_PERM, seed=1)
        mh.update_batch([s.encode() for s in shingles])
        entry.signature = mh.hashvalues.astype(np.uint32)  # datasketch's values are 32-bit
        for other in self._lsh.query(mh):
            if self.scope == "prompt" and self.entries[other].prompt != entry.prompt:
                continue
            if self.similarity(other, order) >= self.threshold:
                self._union(other, order)
        self._lsh.insert(order, mh, check_duplication=False)

    def similarity(self, a: int, b: int) -> float:
        x, y = self.entries[a].signature, self.entries[b].signature
        if x is None or y is None:
            return 1.0 if self.entries[a].exact == self.entries[b].exact else 0.0
        return float((x == y).mean())

    def _find(self, i: int) -> int:
        while self._parent[i] != i:
            self._parent[i] = self._parent[self._parent[i]]
            i = self._parent[i]
        return i

    def _union(self, a: int, b: int) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            self._parent[max(ra, rb)] = min(ra, rb)

    def resolve(self) -> None:
        """Decides, group by group, which one is kept; the others' reasons in `dropped`."""
        groups: dict[int, list[int]] = {}
        for i in range(len(self.entries)):
            groups.setdefault(self._find(i), []).append(i)
        for members in groups.values():
            if len(members) < 2:
                continue
            keeper = min(members, key=lambda i: self.entries[i].rank)
            kept = self.entries[keeper]
            for i in members:
                if i == keeper:
                    continue
                e = self.entries[i]
                kind = "exact" if e.exact == kept.exact else "near"
                where = "within a prompt" if e.prompt == kept.prompt else "across prompts"
                why = f"{kind} duplicate of {kept.id}" + (
                    f" (similarity {self.similarity(i, keeper):.2f})" if kind == "near" else "")
                self.dropped[e.id] = why
                for key in (kind, where):
                    self.counts[key] = self.counts.get(key, 0) + 1
        self.entries = []  # the decisions are made: the numbers are no longer needed
        self._lsh = None


def exact_key(rec: dict[str, Any], said: list[dict[str, Any]]) -> str:
    """A hash of the normalised conversation (module docstring); `said`: the record's messages."""
    out = []
    for m in said:
        calls = [[c["function"]["name"], _arguments(c["function"]["arguments"])] for c in m.get("tool_calls") or []]
        out.append([m["role"], _folded(m.get("content")), _folded(m.get("reasoning_content")), calls])
    tools = sorted(t.get("function", {}).get("name", "") for t in offered_tools(rec) or [])
    return hashlib.sha256(json.dumps([out, tools], ensure_ascii=False).encode()).hexdigest()


def _folded(text: Any) -> str:
    return " ".join(str(text or "").split())


def _arguments(text: Any) -> Any:
    try:
        return json.dumps(json.loads(text or "{}"), sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return _folded(text)


def action_shingles(said: list[dict[str, Any]]) -> set[str]:
    """The word 3-grams of the agent's own replies (in the messages `said`): their text and their calls."""
    parts = []
    for m in said:
        if m["role"] != "assistant":
            continue
        parts.append(m.get("content") or "")
        parts += [f"{c['function']['name']} {c['function']['arguments'] or ''}" for c in m.get("tool_calls") or []]
    words = WORD.findall(" ".join(parts).lower())
    return {" ".join(words[i:i + SHINGLE]) for i in range(max(0, len(words) - SHINGLE + 1))}
