"""Prints of the keys a run had (`key_prints.json`): for each API key the runner held (the model's,
the judge's, the media tools' and the web provider's), where it came from, its length and a salted
SHA-256, never the key. An export finds the run's own keys in any text by these prints, so a key
the agent saw (an environment dump, a config file) never reaches a training row, whatever shell the
export runs in. Each invocation adds the prints of its keys (a resume may run with another key)."""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..util import atomic_write

KEY_PRINTS = "key_prints.json"
SHORTEST = 8  # a key shorter than this cannot be told from ordinary text: never printed, never masked


@dataclass(frozen=True)
class KeyPrint:
    source: str  # where the runner read it: --api_key, OPENROUTER_API_KEY, JUDGE_API_KEY, ...
    length: int
    digest: str  # sha256(salt + key), hex

    def matches(self, salt: bytes, text: str) -> bool:
        return len(text) == self.length and hashlib.sha256(salt + text.encode()).hexdigest() == self.digest


@dataclass
class KeyPrints:
    salt: bytes
    prints: list[KeyPrint]
    too_short: list[str]  # sources whose keys were too short to print


def record_keys(run_dir: Path, keys: dict[str, str | None]) -> None:
    """Adds the prints of `keys` (source → key) to the run's file; a key seen before is kept once."""
    known = read_key_prints(run_dir)
    salt = known.salt if known is not None else secrets.token_bytes(16)
    prints = {p.digest: p for p in (known.prints if known else [])}
    short = set(known.too_short if known else [])
    for source, key in keys.items():
        if not key:
            continue
        if len(key) < SHORTEST:
            short.add(source)
            continue
        digest = hashlib.sha256(salt + key.encode()).hexdigest()
        prints.setdefault(digest, KeyPrint(source, len(key), digest))
    data = {"salt": salt.hex(), "keys": [{"source": p.source, "length": p.length, "sha256": p.digest}
                                         for p in prints.values()], "too_short": sorted(short)}
    atomic_write(run_dir / KEY_PRINTS, (json.dumps(data, indent=1) + "\n").encode())


def read_key_prints(run_dir: Path) -> KeyPrints | None:
    """The run's prints; None for a run made before they were kept (or a file that does not read)."""
    try:
        data: Any = json.loads((run_dir / KEY_PRINTS).read_text(encoding="utf-8"))
        return KeyPrints(bytes.fromhex(data["salt"]),
                         [KeyPrint(str(k["source"]), int(k["length"]), str(k["sha256"])) for k in data["keys"]],
                         [str(s) for s in data.get("too_short") or []])
    except (OSError, ValueError, KeyError, TypeError):
        return None
