"""Several samples per prompt (`--samples=N`): each sample's key, and what the samples of a prompt
say together (pass@k, pass^k, majority vote, the spread of per-prompt pass rates).

A sample is the unit of work wherever a prompt was: the plan, the ledger, the executors, merge,
export and resume all key on `sample_id`. The first sample keeps the prompt's own id, so a run of
one sample per prompt is what it always was, and raising `--samples` on `--resume` runs only the
new ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

SEPARATOR = "#"


def sample_id(prompt_id: str, sample: int) -> str:
    return prompt_id if sample == 0 else f"{prompt_id}{SEPARATOR}{sample}"


def sample_of(sample_id: str) -> int:
    """Which sample an id is (0: the prompt's own id)."""
    _, sep, n = sample_id.rpartition(SEPARATOR)
    return int(n) if sep and n.isdigit() else 0


def each_sample(ids: list[str], samples: int) -> Iterator[tuple[int, int, str]]:
    """(dataset index, sample, its id) of every sample a run of `samples` per prompt owes, in order."""
    for index, pid in enumerate(ids):
        for sample in range(samples):
            yield index, sample, sample_id(pid, sample)


def index_of_samples(ids: list[str], samples: int, settled: Iterable[str] = ()) -> dict[str, int]:
    """Sample id → its row's position, for the samples owed and for any settled one beyond them
    (a run resumed with fewer `--samples` keeps what its earlier samples wrote)."""
    index = {sid: i for i, _, sid in each_sample(ids, samples)}
    rows = {pid: i for i, pid in enumerate(ids)}
    for sid in settled:
        if sid not in index and SEPARATOR in sid:
            row = rows.get(sid.rsplit(SEPARATOR, 1)[0])
            if row is not None:
                index[sid] = row
    return index


def sample_seed(prompt_id: str, sample: int) -> int:
    """A seed of the sample's own, the same on every retry (sent where samples differ only by it)."""
    return int.from_bytes(hashlib.sha256(f"{prompt_id}/{sample}".encode()).digest()[:4], "big") & 0x7FFFFFFF


