"""Groups of rollouts for a trainer, run as batch runs are: each step's groups are one run of their
own, `<run>/steps/<version>-<tag>-<n>/` (its rows in a `.jsonl` of that name beside it), through the
same sandboxes, agent loop, checks and store, token-exact. A trainer killed mid-step that asks for
the same step with the same weights again gets the finished rollouts back from the step's run and
runs only the rest, so no paid rollout is lost; every step can be viewed and exported like any run
(`--output_dir=data/<run>/steps --run_name=<version>-<tag>-<n>`).

A rollout is one token sequence: the prompt up to the model's first token, then everything after it
(the model's tokens, and the tool results and turn openings between them, masked out). Its reward
is its check's score; None where nothing decided it (no check, the check could not judge, the
rollout failed or its history was cut into several segments), which a trainer leaves out. A
sequence that may hold a control token where a message's text belongs (tokens.refusal) is no
sequence: it is refused, saying why, and never handed to a trainer; so is one whose text holds one
of the run's own API keys (an environment dump a tool printed: export/clean/run_keys.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..config import ConfigError, RunConfig, configure
from ..dataset import read_source
from ..export.clean.masking import texts
from ..export.clean.run_keys import RunKeys
from ..record import messages, sample_id
from ..runner import run
from ..store import DISCARDED, FAILED, RunStore
from ..tokens import TokenTrace, refusal
from ..util import atomic_write, say

Errored = Literal["sample", "group"]


@dataclass
class Rollout:
    """One sample of a group, as a trainer takes it."""

    rollout_id: str  # the step's sample id (the record's `id`)
    prompt_id: str
    sample: int
    policy_version: int  # the weights every model call of it was served by
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)  # 1 on the model's own tokens, 0 on tool results and openings
    logprobs: list[float] = field(default_factory=list)  # the server's, per completion token (0 where masked, NaN where it gave none)
    reward: float | None = None
    verdict: str | None = None  # pass, fail, error; None: no record or no check
    error: str | None = None  # why it has no token sequence, else None

    @property
    def usable(self) -> bool:
        return self.error is None


@dataclass
class Step:
    version: int
    rollouts: list[Rollout]  # one per prompt asked, in the order asked
    groups: int
    zero_variance: int  # groups whose rewards are all known and all equal: no signal for GRPO
    masked: int  # rollouts whose reward was set to None (errored="group", drop_zero_variance)
    run_dir: Path | None  # the step's own run; None: its rollouts are in a rollout service's run
    source: str  # where its records are: the step's run name, or the service's


class Rollouts:
    """Runs a dataset's prompts (a JSONL file or a directory of Harbor tasks) as groups of rollouts.

    `flags` are the run's usual flags (`model`, `base_url`, `backend`, `toolsets`, `max_turns`, …,
    as `python batch_runner.py --help` lists them); token data is always exact. `errored`: a group
    with a rollout that has no reward (its check could not judge, it failed) keeps the others'
    rewards ("sample") or gives none of its rollouts one ("group"). `drop_zero_variance`: a group
    whose rewards are all equal gives none (a trainer that does not normalise by group would still
    learn from it)."""

    def __init__(self, dataset_file: str | Path, *, run_name: str, output_dir: str | Path = "data",
                 eval_dataset_file: str | Path | None = None, errored: Errored = "sample",
                 drop_zero_variance: bool = False, **flags: Any) -> None:
        if errored not in ("sample", "group"):
            raise ConfigError(f"errored={errored!r}: give 'sample' (leave the sample out) or 'group' (mask its group)")
        self.errored, self.drop_zero_variance = errored, drop_zero_variance
        # a policy's samples are kept whatever they reason (the filter is for distillation data)
        self.flags: dict[str, Any] = {"require_reasoning": False, **flags, "tokens": "exact",
                                      "output_dir": str(output_dir), "run_name": run_name}
        self.config: RunConfig = configure({**self.flags, "dataset_file": str(dataset_file)})
        self.run_dir = self.config.run_dir
        self.rows = _rows_by_prompt(Path(dataset_file), self.run_dir / "train")
        self.train_prompts = list(self.rows)
        self.eval_rows = _rows_by_prompt(Path(eval_dataset_file), self.run_dir / "eval") if eval_dataset_file else {}
        for text, row in self.eval_rows.items():
            if self.rows.setdefault(text, row) != row:
                raise ConfigError(f"{eval_dataset_file}: a prompt of the training dataset with other fields; a trainer "
                                  "hands back only the prompt, so each prompt must name one row")
        self.calls: dict[tuple[int, str], int] = {}  # calls so far per (version, tag), naming each step's run

    @property
    def prompts(self) -> list[str]:
        """The training dataset's prompts, once each, in its order (a trainer's dataset)."""
        return list(self.train_prompts)

    @property
    def eval_prompts(self) -> list[str]:
        return list(self.eval_rows)

    def run(self, prompts: Sequence[str], version: int, *, policy: str | None = None, tag: str = "train",
            weights: str | Path | None = None, temperature: float | None = None) -> Step:
        """Rollouts of `prompts`, where a run of equal prompts is one group; every call served by
        the weights of `version` (`weights`: the GGUF file the embedded model serves them from).

        The step's run is `steps/<version>-<tag>-<n>` (the n-th call of this version and tag in
        this process), and each of its rows names `policy` (a fingerprint of the weights): asked
        again with the same weights (a trainer restarted from its checkpoint), its prompts in any
        order, it resumes and returns what it has; with other weights (a new training under the same run name), its
        rows are other rows, run afresh."""
        groups = groups_of(prompts)
        sizes = {n for _, n in groups}
        if len(sizes) != 1:
            raise ValueError(f"groups of different sizes in one step ({sorted(sizes)}): a trainer repeats each "
                             "prompt the same number of times, one after another")
        unknown = [text for text, _ in groups if text not in self.rows]
        if unknown:
            raise ValueError(f"{len(unknown)} prompt(s) are not in the dataset, e.g. {unknown[0][:80]!r}")
        key = (version, tag)
        self.calls[key] = self.calls.get(key, -1) + 1
        steps = self.run_dir / "steps"
        name = f"{version:06d}-{tag}-{self.calls[key]}"
        rows_file = steps / f"{name}.jsonl"
        # a row is what it asks: its id is its content's (and, among equal rows, which one it is), never
        # its place in the batch, which TRL hands in another order after a resume
        rows = [{**self.rows[text], "policy_version": version, "policy": policy} for text, _ in groups]
        written = _lines(rows_file)
        if _unordered(written) == _unordered(rows):
            rows = written  # as an earlier life of this step wrote them (an earlier version named their group)
        else:
            steps.mkdir(parents=True, exist_ok=True)
            atomic_write(rows_file, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())
        given: dict[str, Any] = {**self.flags, "dataset_file": str(rows_file), "output_dir": str(steps),
                                 "run_name": name, "samples": sizes.pop(),
                                 "resume": RunStore(steps / name).has_outputs()}
        if weights is not None:
            given["local_model"] = str(weights)
        if temperature is not None:
            given["temperature"] = temperature
        result = run(configure(given))
        if result.aborted is not None:
            raise RuntimeError(f"step {version}'s rollouts stopped: {result.aborted}")
        return self._step(version, groups, rows_file, steps / name)

    def _step(self, version: int, groups: list[tuple[str, int]], rows_file: Path, step_dir: Path) -> Step:
        """The step's rollouts, group by group in the order the trainer gave them."""
        dataset = read_source(rows_file, step_dir)
        records = {r["id"]: r for r in _lines(step_dir / "trajectories.jsonl")}
        failed = {r["id"]: r for name in (FAILED, DISCARDED) for r in _lines(step_dir / name)}
        keys = RunKeys([step_dir])
        rows: dict[str, list[str]] = {}  # prompt → the ids of its rows, in the file's order
        for rec in dataset.records:
            rows.setdefault(rec.prompt, []).append(rec.id)
        made = []
        for text, n in groups:  # the k-th group of a prompt is its k-th row: equal rows are the same task
            pid = rows[text].pop(0)
            made.append([_rollout(sample_id(pid, s), pid, s, version, records, failed, keys) for s in range(n)])
        return make_step(version, made, self.errored, self.drop_zero_variance, step_dir, step_dir.name)


def make_step(version: int, groups: list[list[Rollout]], errored: Errored, drop_zero_variance: bool,
              run_dir: Path | None, source: str) -> Step:
    """A step of these groups, their rewards masked as asked (`Rollouts` says how), and said."""
    rollouts: list[Rollout] = []
    zero_variance = masked = 0
    for group in groups:
        if errored == "group" and any(r.reward is None for r in group):
            masked += sum(r.reward is not None for r in group)
            for r in group:
                r.reward = None
        rewards = [r.reward for r in group]
        if None not in rewards and len(set(rewards)) == 1:
            zero_variance += 1
            if drop_zero_variance:
                masked += len(group)
                for r in group:
                    r.reward = None
        rollouts += group
    say(f"step {version}: {len(rollouts)} rollouts in {len(groups)} groups, {zero_variance} with equal rewards, "
        f"{sum(not r.usable for r in rollouts)} without a token sequence, {masked} rewards masked")
    return Step(version, rollouts, len(groups), zero_variance, masked, run_dir, source)


def _rollout(rid: str, pid: str, sample: int, version: int, records: dict[str, dict[str, Any]],
             failed: dict[str, dict[str, Any]], keys: RunKeys | None = None) -> Rollout:
    out = Rollout(rid, pid, sample, version)
    record = records.get(rid)
    if record is None:
        gone = failed.get(rid, {})
        why = gone.get("error_kind") or (f"discarded: {gone['discarded']}" if gone.get("discarded") else "not run")
        out.error = f"no trajectory ({why})"
        return out
    verification = record.get("verification") or {}
    out.verdict = verification.get("status")
    if out.verdict in ("pass", "fail") and verification.get("score") is not None:
        out.reward = float(verification["score"])
    if not record.get("tokens"):
        out.error, out.reward = "the record has no token data", None
        return out
    trace = TokenTrace.read(record["tokens"])
    if why := refusal(trace, messages(record)):
        out.error, out.reward = why, None
        return out
    if keys is not None and any(True for text in texts(record) for _ in keys.find(text)):
        out.error, out.reward = "its text holds one of the run's own API keys: its ids are not handed to a trainer", None
        return out
    return with_sequence(out, trace)


def with_sequence(out: Rollout, trace: TokenTrace) -> Rollout:
    """`out` with the one token sequence of `trace`, or no reward and the reason there is none."""
    segments = trace.rows()
    if len(segments) != 1:  # a history that was not append-only: several sequences, which no trainer takes as one
        out.error, out.reward = f"{len(segments)} token segments (one sequence is needed)", None
        return out
    ids, mask, logprobs = segments[0]["input_ids"], segments[0]["loss_mask"], segments[0]["logprobs"]
    k = mask.index(1) if 1 in mask else len(ids)
    out.prompt_ids, out.completion_ids, out.env_mask = ids[:k], ids[k:], mask[k:]
    out.logprobs = logprobs[k:]
    return out


def groups_of(prompts: Sequence[str]) -> list[tuple[str, int]]:
    """A trainer's prompts as groups: each run of equal prompts, with its length."""
    out: list[tuple[str, int]] = []
    for text in prompts:
        if out and out[-1][0] == text:
            out[-1] = (text, out[-1][1] + 1)
        else:
            out.append((text, 1))
    return out


def _rows_by_prompt(source: Path, run_dir: Path) -> dict[str, dict[str, Any]]:
    """The dataset's rows as written, by prompt; rows whose starting files are read from a directory
    beside the dataset cannot be moved into a step's rows, and are refused."""
    dataset = read_source(source, run_dir)
    out: dict[str, dict[str, Any]] = {}
    with dataset.path.open("rb") as f:
        for line, offset in zip(dataset.lines, dataset.offsets, strict=True):
            f.seek(offset)
            row = json.loads(f.readline())
            for key in ("files", "check_files", "agent_home"):
                if isinstance(row.get(key), str):
                    raise ConfigError(f"{dataset.path}:{line}: '{key}' names a directory, which rollouts cannot take "
                                      "yet: give the files inline")
            if row["prompt"] in out and out[row["prompt"]] != row:
                raise ConfigError(f"{dataset.path}:{line}: another row has the same prompt with other fields; a "
                                  "trainer hands back only the prompt, so each prompt must name one row")
            out[row["prompt"]] = row
    if not out:
        raise ConfigError(f"{dataset.path} has no usable rows")
    return out


def _unordered(rows: list[dict[str, Any]]) -> list[str]:
    """Rows as a set with repeats, leaving out the `group` an earlier version named in a step's rows."""
    return sorted(json.dumps({k: v for k, v in r.items() if k != "group"}, sort_keys=True) for r in rows)


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
