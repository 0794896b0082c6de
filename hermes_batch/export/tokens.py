"""`--format=tokens`: token-exact rows for trainers, one per trajectory segment (runs made with
--tokens=exact, or --tokens=record where the endpoint returns ids): `input_ids` (the segment's ids, as
sent and as generated), `loss_mask` (1 exactly on the model's own completion tokens), `logprobs`
(aligned with `input_ids`: the sampled token's log-probability where the mask is 1, null where the
endpoint gave none, 0 where the mask is 0), `reward` (the verdict's score; null when unscored), `id`,
`prompt_id`, `sample`, `segment`, `tokenizer` / `template` (what made the ids), and `compressed`.

With --max_tokens, a segment over the budget is compressed as an openai row is (compress.py): its
middle replies become one summary, and the row is a new segment, numbered after the trajectory's
own: the conversation up to the first reply kept after the summary, rendered by the export's chat
template and tokenised by --tokenizer (context: mask 0), then every kept call's ids exactly as the
segment holds them. `compressed` says what was done (null for a row as it was). A trajectory
without token data is left out and said; a segment whose ids the endpoint did not all return is no row
(and a trajectory with no segment left is named)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..record import prompt_id_of, sample_number
from ..tokens import TokenTrace
from .compress import Compression
from .files import write_rows
from .options import verdict_of
from .rows import Rows

OVER = "over --max_tokens even with its middle summarised"
COLUMNS = ("id", "prompt_id", "sample", "compressed", "segment", "input_ids", "loss_mask", "logprobs", "reward",
           "tokenizer", "template", "token_exact")


def write(rows: Rows, output: Path) -> None:
    as_lines = output.suffix.lower() == ".jsonl"
    picked = ({k: r[k] for k in COLUMNS} for r in segments(rows))
    write_rows(output, (r if as_lines else {**r, "compressed": r["compressed"] and json.dumps(r["compressed"])}
                        for r in picked), schema)


def segments(rows: Rows) -> Iterator[dict[str, Any]]:
    """Each trajectory's token rows (COLUMNS), with `calls` (its model calls) and `finish_reason`
    (its last call's) beside them for the trainers' shapes (trainers.py)."""
    budget = rows.token_budget
    for rec, row in rows:
        data = rows.cleaner.token_data(rec)  # as the run wrote it: a masked record's ids leave the record
        if not data:
            rows.left_out(rec["id"], "it has no token data (run with --tokens=exact, or --tokens=record)")
            continue
        try:
            trace = TokenTrace.read(data)
        except ValueError as exc:
            rows.left_out(rec["id"], str(exc))
            continue
        if not trace.calls:
            rows.left_out(rec["id"], "it made no model call")
            continue
        found = trace.rows()
        if not found:
            rows.left_out(rec["id"], "its endpoint returned no prompt token ids (--tokens=record: vLLM returns them, "
                                     "llama.cpp's and hosted chat endpoints do not; --tokens=exact builds them)")
            continue
        found, why = rows.cleaner.token_rows(rec, found)
        if why is not None:
            rows.left_out(rec["id"], why)
            continue
        if budget is not None:
            found = _fitted(found, trace, row, budget, rows)
            if not found:
                rows.report.written -= 1
                rows.report.sources.remove(rec["id"])
                rows.report.filtered[OVER] += 1
                continue
        reward = verdict_of(rec)["score"]
        for seg in found:
            if "calls" not in seg:  # a segment as the rollout holds it (a compressed one says its own)
                mine = [c for c in trace.calls if c.segment == seg["segment"]]
                seg["calls"], seg["finish_reason"] = len(mine), mine[-1].finish_reason
            seg["logprobs"] = [None if math.isnan(lp) else lp for lp in seg["logprobs"]]  # JSON has no NaN
            yield {"id": rec["id"], "prompt_id": prompt_id_of(rec), "sample": sample_number(rec), "compressed": None,
                   **seg, "reward": reward, "tokenizer": trace.tokenizer, "template": trace.template}


def _fitted(found: list[dict[str, Any]], trace: TokenTrace, row: dict[str, Any], budget: Compression,
            rows: Rows) -> list[dict[str, Any]]:
    """The segments within the budget as they are; those over it compressed, or left out and counted."""
    out, extra = [], trace.segments
    for seg in found:
        if len(seg["input_ids"]) <= budget.max_tokens or not seg["token_exact"]:  # a masked one: as it is
            if len(seg["input_ids"]) > budget.max_tokens:
                rows.report.filtered[f"segment(s) {OVER}"] += 1
                continue
            out.append(seg)
            continue
            out.append(seg)
            continue
        fitted = _compressed(seg, trace, row, budget, rows)
        if fitted is None:
            rows.report.filtered[f"segment(s) {OVER}"] += 1
            continue
        rows.report.compressed += 1
        out.append({**fitted, "segment": extra, "token_exact": True})
        extra += 1
    return out


def _compressed(seg: dict[str, Any], trace: TokenTrace, row: dict[str, Any], budget: Compression,
                rows: Rows) -> dict[str, Any] | None:
    """A segment over the budget as a new one: a summary in place of its middle replies, the calls
    after it kept exactly; None when it cannot get under the budget."""
    calls = trace.calls
    mine = [k for k, c in enumerate(calls) if c.segment == seg["segment"]]
    first, last = mine[0], mine[-1]
    messages = row["messages"]
    replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if len(replies) != len(calls):  # each model call is one reply of the record: else nothing lines up
        return None
    part = {**row, "messages": messages[:replies[last] + 1]}  # what the segment holds, up to its last reply
    # the budget the rendered conversation must meet for the ids to meet theirs (ids the template drops count)
    excess = max(0, len(seg["input_ids"]) - budget.count(part))
    fitted, info = dataclasses.replace(budget, max_tokens=budget.max_tokens - excess).fit(part)
    if fitted is None or info is None:
        return None
    head, end = info["replaced"]
    kept = max(first, next(k for k, at in enumerate(replies) if at >= end))  # the first call kept after the summary
    before = fitted["messages"][:head + 1 + replies[kept] - end]  # the conversation up to that call's reply
    ids = budget.tokenizer.ids(rows.checker.render({**row, "messages": before}, generation=True))
    mask, logprobs = [0] * len(ids), [0.0] * len(ids)
    for k in range(kept, last + 1):
        c = calls[k]
        assert c.added is not None and c.completion is not None  # a row's segment has every id
        added = c.added if k > kept else []
        ids, mask = ids + added + c.completion, mask + [0] * len(added) + [1] * len(c.completion)
        logprobs += [0.0] * len(added) + list(c.logprobs)
    if len(ids) > budget.max_tokens:
        return None
    return {"input_ids": ids, "loss_mask": mask, "logprobs": logprobs, "calls": last - kept + 1,
            "finish_reason": calls[last].finish_reason,
            "compressed": {**info, "from_segment": seg["segment"], "calls_kept": last - kept + 1,
                           "tokens_before": len(seg["input_ids"]), "tokens_after": len(ids)}}


def schema() -> Any:
    import pyarrow as pa

    return pa.schema([("id", pa.string()), ("prompt_id", pa.string()), ("sample", pa.int32()),
                      ("compressed", pa.string()), ("segment", pa.int32()), ("input_ids", pa.list_(pa.int32())),
                      ("loss_mask", pa.list_(pa.int8())), ("logprobs", pa.list_(pa.float32())),
                      ("reward", pa.float64()), ("tokenizer", pa.string()), ("template", pa.string()),
                      ("token_exact", pa.bool_())])
