"""The run's own keys, masked in every export whatever `--scrub` says: the keys the runner held, by
the prints each run kept of them (store/key_prints.py), and the keys in this shell's environment
under the names the runner and export read them from (for runs made before prints were kept)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from ...store.key_prints import SHORTEST, KeyPrints, read_key_prints
from ...tools.providers import KEY_VARIABLES as WEB_KEYS

KIND = "run_api_key"
VARIABLES = ("OPENROUTER_API_KEY", "OPENAI_API_KEY", "JUDGE_API_KEY", "VISION_API_KEY", "IMAGE_API_KEY", "FAL_KEY",
             "TTS_API_KEY", "SUMMARY_API_KEY", "HF_TOKEN", "HERMES_BATCH_SERVE_TOKEN", *WEB_KEYS.values())
RUN = re.compile(r"\S+")  # a key is never split by white space; the windows of a longer run are looked at


class RunKeys:
    def __init__(self, run_dirs: list[Path]):
        self.prints: list[KeyPrints] = [p for p in (read_key_prints(d) for d in run_dirs) if p is not None]
        self.known = sorted({v for v in (os.environ.get(n) for n in VARIABLES) if v and len(v) >= SHORTEST},
                            key=len, reverse=True)
        self.lengths = sorted({k.length for p in self.prints for k in p.prints})
        self.too_short = sorted({s for p in self.prints for s in p.too_short})

    def find(self, text: str) -> Iterator[tuple[str, str]]:
        """(value, KIND) of each of the run's keys in `text`."""
        for key in self.known:
            if key in text:
                yield key, KIND
        if not self.lengths:
            return
        shortest = self.lengths[0]
        for m in RUN.finditer(text):
            word = m.group()
            if len(word) < shortest:
                continue
            for n in self.lengths:
                for at in range(len(word) - n + 1):
                    window = word[at:at + n]
                    if any(k.matches(p.salt, window) for p in self.prints for k in p.prints if k.length == n):
                        yield window, KIND
