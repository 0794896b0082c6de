"""`python -m hermes_batch.harness prepare [hermes [VERSION]]`: install a harness's release once into
the user's cache (a run does it at its start when it is missing)."""

from __future__ import annotations

import sys

from ..errors import UserError
from . import HARNESSES, HarnessSettings, harness_dir


def _main(argv: list[str]) -> None:
    if not argv or argv[0] != "prepare" or len(argv) > 3 or (len(argv) > 1 and argv[1] not in HARNESSES):
        raise SystemExit(f"usage: python -m hermes_batch.harness prepare [{'|'.join(HARNESSES)} [VERSION]]")
    name = argv[1] if len(argv) > 1 else "hermes"
    try:
        print(harness_dir(HarnessSettings(agent=name, agent_version=argv[2] if len(argv) > 2 else None)))
    except UserError as exc:
        raise SystemExit(f"error: {exc}") from None


_main(sys.argv[1:])
