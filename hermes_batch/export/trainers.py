"""Token rows in the record shapes of trainers that run in-process elsewhere, one JSON line each,
from the same segments `--format=tokens` writes (so --max_tokens applies as it does there):

    atropos   a ScoredData per prompt (its samples a group): tokens, masks (-100 where not trained,
              else the token's id), scores, inference_logprobs, overrides (id, sample, segment)
    skyrl     a GeneratorOutput per prompt: prompt_token_ids, response_ids, rewards, loss_masks,
              stop_reasons, rollout_logprobs, trajectory_ids ({instance_id, repetition_id})
    verl      an AgentLoopOutput per segment: prompt_ids, response_ids, response_mask,
              response_logprobs, reward_score, num_turns, extra_fields

A segment's prompt is its ids up to the model's first token; its response all that follows (the
model's tokens, and the tool results between them, masked 0). Log-probabilities are given for a
group only when every one of its tokens has one (the trainers take no gaps), 0 where masked.
Atropos and SkyRL take a score per rollout: an unscored one is left out, named; verl's
reward_score is null for it. A group is written once all of its prompt's samples are read. Each says
whether a rollout is still token-exact (false where masked values were re-tokenised): Atropos in
its overrides, verl in extra_fields, SkyRL in rollout_metrics (null when all are)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .files import write_lines
from .options import ExportError
from .rows import Rows
from .tokens import segments

UNSCORED = "its verdict has no score, and {trainer} takes one per rollout"


def write_atropos(rows: Rows, output: Path) -> None:
    _lines(output, "atropos", (_scored_data(group) for group in _groups(rows, "Atropos")))


def write_skyrl(rows: Rows, output: Path) -> None:
    _lines(output, "skyrl", (_generator_output(group) for group in _groups(rows, "SkyRL")))


def write_verl(rows: Rows, output: Path) -> None:
    _lines(output, "verl", (_agent_loop_output(seg) for seg in segments(rows)))


def _lines(output: Path, fmt: str, items: Iterator[dict[str, Any]]) -> None:
    if output.suffix.lower() != ".jsonl":
        raise ExportError(f"--format={fmt} writes JSON lines, one record of that trainer's shape each: "
                          "give --output a .jsonl file")
    output.parent.mkdir(parents=True, exist_ok=True)
    write_lines(output, items)


def _groups(rows: Rows, trainer: str) -> Iterator[list[dict[str, Any]]]:
    """The scored segments of each prompt, together, in the order prompts are first met."""
    groups: dict[str, list[dict[str, Any]]] = {}
    unscored: set[str] = set()
    for seg in segments(rows):
        if seg["reward"] is None:  # a rollout's score is its record's: said once, whatever its segments
            if seg["id"] not in unscored:
                unscored.add(seg["id"])
                rows.left_out(seg["id"], UNSCORED.format(trainer=trainer))
            continue
        groups.setdefault(seg["prompt_id"], []).append(seg)
    yield from groups.values()


def _split(seg: dict[str, Any]) -> int:
    """Where a segment's response starts: the model's first token."""
    return seg["loss_mask"].index(1) if 1 in seg["loss_mask"] else len(seg["input_ids"])


def _logprobs(group: list[dict[str, Any]], part: Callable[[dict[str, Any]], list[Any]]) -> list[list[float]] | None:
    out = [[0.0 if lp is None else float(lp) for lp in part(s)] for s in group]
    whole = all(lp is not None for s in group for lp, m in zip(s["logprobs"], s["loss_mask"], strict=True) if m)
    return out if whole else None


def _scored_data(group: list[dict[str, Any]]) -> dict[str, Any]:
    return {"tokens": [s["input_ids"] for s in group],
            "masks": [[t if m else -100 for t, m in zip(s["input_ids"], s["loss_mask"], strict=True)] for s in group],
            "scores": [float(s["reward"]) for s in group],
            "inference_logprobs": _logprobs(group, lambda s: s["logprobs"]),
            "overrides": [{"id": s["id"], "sample": s["sample"], "segment": s["segment"],
                           "token_exact": s["token_exact"]} for s in group],
            "group_overrides": {"prompt_id": group[0]["prompt_id"]}, "messages": None}


def _generator_output(group: list[dict[str, Any]]) -> dict[str, Any]:
    starts = [_split(s) for s in group]
    return {"prompt_token_ids": [s["input_ids"][:k] for s, k in zip(group, starts, strict=True)],
            "response_ids": [s["input_ids"][k:] for s, k in zip(group, starts, strict=True)],
            "rewards": [float(s["reward"]) for s in group],
            "loss_masks": [s["loss_mask"][k:] for s, k in zip(group, starts, strict=True)],
            "stop_reasons": [s["finish_reason"] for s in group],
            "rollout_logprobs": _logprobs(group, lambda s: s["logprobs"][_split(s):]),
            "trajectory_ids": [{"instance_id": s["prompt_id"], "repetition_id": s["sample"]} for s in group],
            "rollout_metrics": None if all(s["token_exact"] for s in group)
            else {"token_exact": [s["token_exact"] for s in group]}}


def _agent_loop_output(seg: dict[str, Any]) -> dict[str, Any]:
    k = _split(seg)
    logprobs = _logprobs([seg], lambda s: s["logprobs"][k:])
    return {"prompt_ids": seg["input_ids"][:k], "response_ids": seg["input_ids"][k:],
            "response_mask": seg["loss_mask"][k:], "response_logprobs": logprobs[0] if logprobs else None,
            "reward_score": seg["reward"], "num_turns": 2 * seg["calls"],  # the prompt, each reply, the results between
            "extra_fields": {"id": seg["id"], "prompt_id": seg["prompt_id"], "sample": seg["sample"],
                             "segment": seg["segment"], "compressed": seg["compressed"],
                             "token_exact": seg["token_exact"]}}
