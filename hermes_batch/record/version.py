"""Reading a record whatever version of hermes-batch wrote it: the one place that knows how the
format changed. Every record names its format (`"format"`); records before the field are format 0.

    0   no "format" field; a record written before --samples has no prompt_id, sample or samples
    1   "format": 1 (the fields are those of format 0)
    2   every turn has `images`: null, or on a tool turn the images its call saw or made (record/images.py)
    3   `tokens`: with --tokens=exact only, the rollout's token ids per model call (tokens/trace.py)
    4   as the Hermes Agent 0.19.0 writes them: the results of one reply's calls are one tool turn
        (`tool_results`, record/conversation.py), the tools' results in its shapes (the terminal's
        `{output, exit_code, error}`, the file tools' JSON), the system turn's tools with `"required":
        null`, `metadata.timestamp` to the microsecond, `tool_stats` padded to its tools too
        (record/reference.py); `metadata.fabricated_tool_results`: replies that wrote a tool's result
        no tool returned (record/fabrication.py)
"""

from __future__ import annotations

from typing import Any

FORMAT = 4  # of the records this version writes


class NewerFormat(ValueError):
    """A record written by a later version than this one: read as this version, it could mislead."""


def format_of(record: dict[str, Any]) -> int:
    """The record's format version, refusing one this version cannot read."""
    version = record.get("format", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise NewerFormat(f"record {record.get('id')!r} has a format version that is not one: {version!r}")
    if version > FORMAT:
        raise NewerFormat(f"record {record.get('id')!r} is of format {version}, written by a later hermes-batch "
                          f"than this one (which reads formats 0 to {FORMAT}): upgrade to read it")
    return version


def prompt_id_of(record: dict[str, Any]) -> str:
    """The prompt a record is a sample of: its `prompt_id`, or its `id` (records written before
    samples had none, and a single sample's id is its prompt's)."""
    return str(record.get("prompt_id") or record["id"])


def sample_number(record: dict[str, Any]) -> int:
    """Which sample of its prompt a record is (0 in records written before samples)."""
    return int(record.get("sample") or 0)


def samples_of(record: dict[str, Any]) -> int:
    """How many samples of its prompt the run asked for (1 in records written before samples)."""
    return int(record.get("samples") or 1)
