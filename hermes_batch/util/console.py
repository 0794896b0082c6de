"""The console's voice: one line to stderr that keeps clear of the progress bar."""

from __future__ import annotations

import sys

from tqdm import tqdm


def say(msg: str) -> None:
    tqdm.write(msg, file=sys.stderr)
