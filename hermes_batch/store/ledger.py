"""The ledger: one line per settled prompt, saying where its record is and what it spent, so that
`--resume` reads it instead of every record. Its format, and what a run's state is made of.

    d|x|f <TAB> id <TAB> prompt_index <TAB> batch (d only, else -) <TAB> offset <TAB> length
          <TAB> tokens <TAB> cost ('' = unknown) <TAB> reason (x) or error kind (f)
    p <fingerprint>      the settings the records that follow were written with

d is a trajectory kept (in batch_<batch>.jsonl; its note is its verdict's status, then the version of
the checks that gave it when there were checks, checks/verdicts.py), x
one a filter discarded (discarded.jsonl), f a failure (failed.jsonl). The store (store/run_store.py) appends it and says when.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..record import verdict_note

BATCH_FILE = re.compile(r"batch_(\d+)\.jsonl$")
DISCARDED = "discarded.jsonl"
FAILED = "failed.jsonl"
KIND_LETTER = {"done": "d", "discarded": "x", "failed": "f"}
RECORD_FILE = {"x": DISCARDED, "f": FAILED}


@dataclass
class LedgerEntry:
    kind: str  # d, x or f
    id: str
    index: int | None
    file: str  # the record file's name
    offset: int
    length: int
    tokens: int = 0
    cost: float | None = None
    note: str = ""  # discarded: the reason; failed: the error kind

    def line(self) -> bytes:
        batch = self.file[6:-6] if self.kind == "d" else "-"  # batch_<k>.jsonl → k
        # ASCII only, so a character's place in the text is its byte offset (see `read_ledger`)
        note = self.note.replace("\t", " ").replace("\n", " ").replace("\r", " ").encode("ascii", "backslashreplace").decode()
        index = "" if self.index is None else str(self.index)
        cost = "" if self.cost is None else repr(float(self.cost))
        return f"{self.kind}\t{self.id}\t{index}\t{batch}\t{self.offset}\t{self.length}\t{self.tokens}\t{cost}\t{note}\n".encode()


@dataclass
class RunState:
    """What the files say has happened to each prompt id."""

    done: dict[str, int] = field(default_factory=dict)  # id → prompt_index
    discarded: dict[str, str] = field(default_factory=dict)  # id → reason
    failed: dict[str, str] = field(default_factory=dict)  # id → error kind of its last failure (not yet done)
    attempts: dict[str, int] = field(default_factory=dict)  # id → failures so far
    fingerprints: set[str] = field(default_factory=set)
    tokens: int = 0  # spent by every prompt so far (kept, discarded and failed)
    cost: float = 0.0  # USD, as the provider reported it
    done_at: dict[str, int] = field(default_factory=dict)  # id → ledger offset of its first done line
    unsure: set[str] = field(default_factory=set)  # done ids whose checks could not say (verdict error)
    check_versions: dict[str, str] = field(default_factory=dict)  # done id → the version of the checks that scored it
    repaired: list[str] = field(default_factory=list)  # torn tails cut at the start, for the user

    def apply(self, e: LedgerEntry, at: int) -> None:
        self.tokens += e.tokens
        self.cost += e.cost or 0.0
        if e.kind == "d":
            if e.id not in self.done:
                self.done[e.id] = -1 if e.index is None else e.index
                self.done_at[e.id] = at
                status, _, version = e.note.partition(" ")
                if status == "error":
                    self.unsure.add(e.id)
                if version:
                    self.check_versions[e.id] = version
        elif e.kind == "x":
            self.discarded.setdefault(e.id, e.note or "discarded")
        else:
            self.attempts[e.id] = self.attempts.get(e.id, 0) + 1
            self.failed[e.id] = e.note

    def settled(self, prompt_id: str) -> bool:
        return prompt_id in self.done or prompt_id in self.discarded


def entry_of(kind: str, name: str, offset: int, length: int, rec: dict[str, Any]) -> LedgerEntry:
    """The ledger entry of a record read back from its file (a tail past the ledger, or an old run)."""
    meta = rec.get("metadata") or {}
    usage = (rec.get("usage") if kind == "f" else meta.get("usage")) or {}
    index = rec.get("prompt_index")
    note = (rec.get("discarded", "discarded") if kind == "x" else rec.get("error_kind", "") if kind == "f"
            else verdict_note(rec.get("verification") or {}))
    return LedgerEntry(kind, rec["id"], index if isinstance(index, int) else None, name, offset, length,
                       int(usage.get("total_tokens") or 0), usage.get("cost"), str(note or ""))


def parse_ledger(data: bytes, base: int = 0) -> Iterator[tuple[int, LedgerEntry | str]]:
    """(offset, entry) for each whole line of `data`, the ledger from offset `base`; `p` lines give
    the fingerprint."""
    pos = base
    for raw in data.split(b"\n")[:-1]:
        at, pos = pos, pos + len(raw) + 1
        if not raw:
            continue
        f = raw.decode().split("\t")
        if f[0] == "p":
            yield at, f[1]
            continue
        kind = f[0]
        name = f"batch_{f[3]}.jsonl" if kind == "d" else RECORD_FILE[kind]
        yield at, LedgerEntry(kind, f[1], int(f[2]) if f[2] else None, name, int(f[4]), int(f[5]), int(f[6]),
                              float(f[7]) if f[7] else None, f[8])


def read_ledger(data: bytes, state: RunState) -> dict[str, int]:
    """`state.apply` for every line of the ledger, inlined (a million lines at start-up); returns
    where the ledger's knowledge of each record file ends. A line that is not a ledger line raises
    ValueError (the store then rebuilds the ledger from the records)."""
    done, done_at, discarded, failed, attempts = state.done, state.done_at, state.discarded, state.failed, state.attempts
    ends: dict[str, tuple[str, str]] = {}  # batch number (or x, f) → its last record's offset and length
    tokens, costs, pos = [], [], 0
    for line in data.decode("latin-1").split("\n")[:-1]:
        at, pos = pos, pos + len(line) + 1
        if not line:  # a blank line (an editor's): nothing to read
            continue
        if line[0] == "p":
            state.fingerprints.add(line[2:])
            continue
        kind, pid, index, batch, offset, length, spent, cost, note = line.split("\t")
        tokens.append(spent)
        if cost:
            costs.append(cost)
        if kind == "d":
            if pid not in done:
                done[pid] = int(index) if index else -1
                done_at[pid] = at
                status, _, version = note.partition(" ")
                if status == "error":
                    state.unsure.add(pid)
                if version:
                    state.check_versions[pid] = version
            ends[batch] = (offset, length)
        elif kind == "x":
            discarded.setdefault(pid, note or "discarded")
            ends["x"] = (offset, length)
        else:
            attempts[pid] = attempts.get(pid, 0) + 1
            failed[pid] = note
            ends["f"] = (offset, length)
    state.tokens += sum(map(int, tokens))
    state.cost += sum(map(float, costs))
    return {(RECORD_FILE[k] if k in RECORD_FILE else f"batch_{k}.jsonl"): int(o) + int(n) for k, (o, n) in ends.items()}
