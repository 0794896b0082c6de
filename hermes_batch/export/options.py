"""The flags of `python batch_runner.py export`, and which kept trajectories they let through."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import ExportError
from ..flags import CommaList, Text, flag
from ..record import fabricated_in_record
from ..store import run_name_checked
from ..util import parse_size
from .curate import Curation

VERDICTS = ("pass", "fail", "error", "skipped")
SCRUBS = ("secrets", "pii")  # what --scrub masks (export/clean/)


@dataclass(frozen=True)
class ImageOptions:
    """What --format=vision does with a row's images (export/vision.py)."""

    mode: Literal["inline", "reference", "drop"] = "inline"
    max_bytes: int = 5 * 1024 * 1024  # an image inlined at most


class ExportOptions(BaseModel):
    """The flags of `python batch_runner.py export`."""

    model_config = ConfigDict(extra="forbid")

    run_name: CommaList = Field(..., description="the run, or several exported together: a,b (a row whose id an "
                                                 "earlier run has is written as <id>@<run>)")
    output_dir: Text = flag("data", "root of run directories")
    output: Text = Field(description="a .jsonl or .parquet file, or a directory (a datasets dataset; sts: session files)")
    format: Text = Field("openai", description="openai (messages + tools), sharegpt (as written), sts (Hub traces), "
                                               "preference (pairs of a passing and a failing sample of a prompt) or "
                                               "atif (one ATIF document per trajectory, Harbor's format) or "
                                               "vision (TRL's layout for vision models: image parts and an images "
                                               "column) or tokens (token-exact rows of --tokens=exact runs: input_ids, "
                                               "loss_mask, logprobs, reward) or those rows as a trainer takes them: "
                                               "atropos (ScoredData per prompt), skyrl (GeneratorOutput per prompt), "
                                               "verl (AgentLoopOutput per segment)")
    completed_only: bool = Field(False, description="only trajectories that ended with a final answer")
    allow_unknown_tools: bool = Field(True, description="keep trajectories that called a tool that does not exist")
    allow_tool_errors: bool = Field(True, description="keep trajectories with a tool call that failed")
    keep_fabricated: bool = Field(False, description="keep trajectories with a reply that wrote a tool result no tool "
                                                     "returned (left out by default: a model would learn to invent them)")
    min_turns: int | None = Field(None, ge=0, description="at least this many assistant turns")
    max_turns: int | None = Field(None, ge=0, description="at most this many assistant turns")
    toolsets: CommaList | None = Field(None, description="only trajectories offered one of these toolsets")
    status: CommaList | None = Field(None, description="only trajectories whose verdict is one of: pass, fail, error, "
                                                       "skipped (no check)")
    min_score: float | None = Field(None, ge=0, le=1, description="only trajectories their checks scored at least "
                                                                  "this (one that could not be checked has no score)")
    keep: Literal["all", "passed", "best", "shortest"] = Field(
        "all", description="per prompt (--samples): all, passed (every passing sample), best (the one with the highest "
                           "score, then the shortest) or shortest (the passing one with the fewest turns, then tokens)")
    min_pass_rate: float | None = Field(None, ge=0, le=1, description="only prompts whose samples pass at least this "
                                                                      "often (errors left out)")
    max_pass_rate: float | None = Field(None, ge=0, le=1, description="only prompts whose samples pass at most this "
                                                                      "often (e.g. <1: the ones a model can still learn)")
    max_tokens: int | None = Field(None, ge=256, description="openai rows longer than this (as the chat template "
                                                              "renders them, by --tokenizer) have their middle "
                                                              "summarised to fit; one that cannot fit is left out")
    keep_last: int = Field(4, ge=1, description="with --max_tokens: the last messages kept as they are")
    tokenizer: Text = Field("local", description="with --max_tokens: a tokenizer.json, or local (the embedded "
                                                 "model's vocabulary)")
    summary_model: Text = Field("local", description="with --max_tokens: the model that writes summaries (local: "
                                                     "the embedded one, offline)")
    summary_base_url: Text | None = Field(None, description="its OpenAI-compatible endpoint (key in SUMMARY_API_KEY, "
                                                            "else OPENROUTER_API_KEY or OPENAI_API_KEY)")
    summary_tokens: int = Field(512, ge=32, description="with --max_tokens: the longest summary")
    summary_context: int | None = Field(None, ge=1024, description="with --max_tokens: the most tokens the summary "
                                                                   "model reads at once; a longer middle is summarised "
                                                                   "in pieces (default: 8192 for local, else no limit)")
    images: Literal["inline", "reference", "drop"] | None = Field(
        None, description="--format=vision: the images column holds each image's bytes (inline, the default; data: "
                          "URLs in .jsonl), its file's path in the run directory (reference), or nothing (drop)")
    max_image_bytes: Text = Field("5m", description="--format=vision, inline: a larger image is named in a text "
                                                    "part instead of inlined, e.g. 512k, 5m")
    push_to_hub: Text | None = Field(None, description="then upload the output to this Hub dataset repo (HF_TOKEN)")
    dedup: Literal["off", "exact", "near"] = Field(
        "off", description="leave out duplicates across every run named: exact (the same normalised conversation) or "
                           "near (also MinHash-similar actions and answers, --dedup_threshold)")
    dedup_threshold: float = Field(0.8, gt=0, le=1, description="--dedup=near: the Jaccard similarity (word 3-grams of "
                                                                "the agent's actions and answers) from which two rows "
                                                                "are duplicates")
    dedup_scope: Literal["all", "prompt"] = Field("all", description="--dedup: compare across prompts (all) or only "
                                                                     "the samples of one prompt (prompt)")
    dedup_keep: Literal["passing", "shortest", "first"] = Field(
        "passing", description="--dedup: which one of a group is kept: passing (the highest verdict, then the "
                               "shortest), shortest (fewest turns, then tokens) or first (in --run_name order)")
    decontaminate: CommaList | None = Field(
        None, description="benchmarks to check every row against: .jsonl/.json/.parquet files, Harbor task "
                          "directories, datasets saved to disk, or datasets names this machine holds")
    decontaminate_ngram: int = Field(13, ge=3, le=64, description="--decontaminate: words in the n-grams a row and "
                                                                   "a benchmark item must share")
    contaminated: Literal["drop", "flag"] = Field("drop", description="--decontaminate: leave a contaminated row out "
                                                                      "(drop) or keep it with the match in its "
                                                                      "metadata (flag)")
    scrub: CommaList | None = Field(None, description="mask in every row: secrets (keys and tokens, detect-secrets), "
                                                      "pii (e-mail addresses, phone numbers, public IP addresses, card "
                                                      "numbers); the run's own API keys are always masked")
    phone_region: Text = Field("US", description="--scrub=pii: the country whose national phone numbers are read "
                                                 "(ISO code); numbers with + are read for any country")
    dry_run: bool = Field(False, description="list what cleaning would leave out and mask; write nothing")

    @field_validator("run_name")
    @classmethod
    def _run_name(cls, names: list[str]) -> list[str]:
        if not names:
            raise ValueError("name at least one run")
        if len(set(names)) != len(names):
            raise ValueError("a run is named twice")
        return [run_name_checked(n) for n in names]

    @field_validator("scrub")
    @classmethod
    def _scrub(cls, v: list[str] | None) -> list[str] | None:
        unknown = sorted(set(v or []) - set(SCRUBS))
        if unknown:
            raise ValueError(f"unknown kind {', '.join(unknown)}: choose from {', '.join(SCRUBS)}")
        return v

    @property
    def run_dirs(self) -> list[Path]:
        return [Path(self.output_dir) / name for name in self.run_name]

    @property
    def run_dir(self) -> Path:
        return self.run_dirs[0]

    @property
    def cleaning(self) -> Any:
        from .clean import Cleaning

        return Cleaning(dedup=self.dedup, threshold=self.dedup_threshold, scope=self.dedup_scope, keep=self.dedup_keep,
                        benchmarks=tuple(self.decontaminate or ()), ngram=self.decontaminate_ngram,
                        contaminated=self.contaminated, scrub=tuple(self.scrub or ()),
                        phone_region=self.phone_region, dry_run=self.dry_run)

    @property
    def curation(self) -> Curation:
        return Curation(keep=self.keep, min_pass_rate=self.min_pass_rate, max_pass_rate=self.max_pass_rate,
                        pairs=self.format == "preference")

    @property
    def filters(self) -> Filters:
        return Filters(completed_only=self.completed_only, allow_unknown_tools=self.allow_unknown_tools,
                       allow_tool_errors=self.allow_tool_errors, keep_fabricated=self.keep_fabricated,
                       min_turns=self.min_turns, max_turns=self.max_turns,
                       toolsets=self.toolsets, status=self.status, min_score=self.min_score)

    @property
    def image_options(self) -> ImageOptions | None:
        """--format=vision's images (None for another format, which refuses --images)."""
        if self.format != "vision":
            if self.images is not None:
                raise ExportError(f"--images is for --format=vision; --format={self.format} rows are text (sharegpt "
                                  "rows name each image by its hash, as the run wrote them)")
            return None
        return ImageOptions(self.images or "inline", parse_size(self.max_image_bytes, "--max_image_bytes"))

    @field_validator("max_image_bytes")
    @classmethod
    def _image_bytes(cls, v: str) -> str:
        parse_size(v, "--max_image_bytes")
        return v

    @field_validator("status")
    @classmethod
    def _status(cls, v: list[str] | None) -> list[str] | None:
        unknown = sorted(set(v or []) - set(VERDICTS))
        if unknown:
            raise ValueError(f"unknown verdict {', '.join(unknown)}: choose from {', '.join(VERDICTS)}")
        return v


@dataclass
class Filters:
    """Which kept trajectories to export (all of them by default, but those that fabricate a tool result)."""

    completed_only: bool = False
    allow_unknown_tools: bool = True
    allow_tool_errors: bool = True
    keep_fabricated: bool = False  # a reply that wrote a tool's result itself (record/fabrication.py)
    min_turns: int | None = None  # assistant turns
    max_turns: int | None = None
    toolsets: list[str] | None = None  # offered at least one of these
    status: list[str] | None = None  # verdicts to keep
    min_score: float | None = None

    def drop_reason(self, rec: dict[str, Any]) -> str | None:
        meta = rec.get("metadata") or {}
        turns = int(meta.get("assistant_turns") or 0)
        if self.completed_only and not rec.get("completed"):
            return "not completed"
        if not self.allow_unknown_tools and meta.get("unknown_tool_calls"):
            return "unknown tool calls"
        if not self.allow_tool_errors and any((rec.get("tool_error_counts") or {}).values()):
            return "tool errors"
        if not self.keep_fabricated and fabricated_in_record(rec):
            return "a fabricated tool result (--keep_fabricated keeps it)"
        if self.min_turns is not None and turns < self.min_turns:
            return f"fewer than {self.min_turns} turns"
        if self.max_turns is not None and turns > self.max_turns:
            return f"more than {self.max_turns} turns"
        if self.toolsets and not set(self.toolsets) & set(rec.get("toolsets_used") or []):
            return "none of the toolsets"
        verdict = verdict_of(rec)
        if self.status and verdict["status"] not in self.status:
            return f"verdict {verdict['status']}"
        if self.min_score is not None and (verdict["score"] is None or verdict["score"] < self.min_score):
            return f"score below {self.min_score:g}" if verdict["score"] is not None else "no score"
        return None


def verdict_of(rec: dict[str, Any]) -> dict[str, Any]:
    """What an export row says of the record's verdict: its status and score, and each check's."""
    v = rec.get("verification") or {}
    return {"status": v.get("status") or "skipped", "score": v.get("score"), "pass_score": v.get("pass_score"),
            "check_version": v.get("check_version"),
            "checks": [{k: c.get(k) for k in ("kind", "status", "score", "error")} for c in v.get("checks") or []]}
