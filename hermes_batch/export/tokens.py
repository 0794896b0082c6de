"""`--format=tokens`: token-exact rows for trainers, one per trajectory segment (runs made with
--tokens=exact, or --tokens=record where the endpoint returns ids): `input_ids` (the segment's ids, as sent and as generated), `loss_mask` (1 exactly on
the model's own completion tokens), `logprobs` (aligned with `input_ids`: the sampled token's
log-probability where the mask is 1, null where the endpoint gave none, 0 where the mask is 0),
`reward` (the verdict's score; null when unscored), `id`, `prompt_id`, `sample`, `segment`, and
`tokenizer` / `template` (what made the ids). A trajectory without token data is left out and said, as
is a segment whose ids the endpoint did not all return (--tokens=record)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..record import prompt_id_of, sample_number
from ..tokens import TokenTrace
from .files import write_rows
from .options import verdict_of
from .rows import Rows


def write(rows: Rows, output: Path) -> None:
    write_rows(output, _rows(rows), schema)


def _rows(rows: Rows) -> Iterator[dict[str, Any]]:
    for rec, _ in rows:
        if not rec.get("tokens"):
            rows.left_out(rec["id"], "it has no token data (run with --tokens=exact, or --tokens=record)")
            continue
        try:
            trace = TokenTrace.read(rec["tokens"])
        except ValueError as exc:
            rows.left_out(rec["id"], str(exc))
            continue
        if not trace.calls:
            rows.left_out(rec["id"], "it made no model call")
            continue
        reward = verdict_of(rec)["score"]
        segments = trace.rows()
        if not segments:
            rows.left_out(rec["id"], "its endpoint returned no prompt token ids (--tokens=record: vLLM returns them, "
                                     "llama.cpp's and hosted chat endpoints do not; --tokens=exact builds them)")
            continue
        for row in segments:
            row["logprobs"] = [None if math.isnan(lp) else lp for lp in row["logprobs"]]  # JSON has no NaN
            yield {"id": rec["id"], "prompt_id": prompt_id_of(rec), "sample": sample_number(rec), **row,
                   "reward": reward, "tokenizer": trace.tokenizer, "template": trace.template}


def schema() -> Any:
    import pyarrow as pa

    return pa.schema([("id", pa.string()), ("prompt_id", pa.string()), ("sample", pa.int32()),
                      ("segment", pa.int32()), ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
                      ("logprobs", pa.list_(pa.float32())), ("reward", pa.float64()), ("tokenizer", pa.string()),
                      ("template", pa.string())])
