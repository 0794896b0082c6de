"""Export a run's kept trajectories for training, one record at a time (memory stays flat).

Formats:
    openai    one row per trajectory: `messages` (user / assistant with native `tool_calls` and a
              `reasoning_content` field / tool results paired by `tool_call_id`), `tools` (the
              JSON schemas offered to that prompt), `id` and `metadata`. Arguments, tool schemas
              and metadata are JSON strings, so every row has the same Arrow schema.
    sharegpt  the records as the run wrote them (Hermes format), filtered.
    sts       the Hugging Face Hub's Session Trace Simple format: one JSONL file per trajectory
              (a session header, then one line per message), for the Hub's trace viewer.
    atif      one ATIF document (Harbor's Agent Trajectory Interchange Format) per trajectory, in a
              directory; each is validated by the `atif` package's models (interchange.py).
    preference  one row per pair of a passing and a failing sample of one prompt (--samples):
              TRL's conversational preference rows, `prompt` (the user's message), `chosen` and
              `rejected` (what each sample's agent did), `tools`, `id` and `metadata`.
Written as `.jsonl`, `.parquet`, or (a path without a suffix) a `datasets` dataset saved to disk;
`sts` always writes a directory of session files.

Curation across the samples of a prompt (`--keep`, the pass-rate window, the pairs) is curate.py's.

Every row is checked before it is written: tool results pair with calls, every call has a result,
a prompt that was offered tools says which, and the row renders through a Hermes/Qwen-style chat
template with tools (templates/hermes-tools.jinja) into as many calls and results as it holds. A
row that fails is reported and left out, never written silently.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from . import compress
from .compress import Compression
from .curate import Curation, paired, select
from .errors import UserError
from .flags import CommaList, Text
from .interchange import atif_document
from .records import prompt_id_of
from .sharegpt import legacy_turns, messages, offered_tools
from .store import RunLocation, RunStore
from .workspace import is_file_name

FORMATS = ("openai", "sharegpt", "sts", "preference", "atif")
VERDICTS = ("pass", "fail", "error", "skipped")
HARNESS = "hermes-batch"
TEMPLATE = Path(__file__).with_name("templates") / "hermes-tools.jinja"
WRITE_BATCH = 500  # rows per Parquet row group


class ExportError(UserError):
    pass


class ExportOptions(RunLocation):
    """The flags of `python batch_runner.py export`."""

    model_config = ConfigDict(extra="forbid")

    output: Text = Field(description="a .jsonl or .parquet file, or a directory (a datasets dataset; sts: session files)")
    format: Text = Field("openai", description="openai (messages + tools), sharegpt (as written), sts (Hub traces), "
                                               "preference (pairs of a passing and a failing sample of a prompt) or "
                                               "atif (one ATIF document per trajectory, Harbor's format)")
    completed_only: bool = Field(False, description="only trajectories that ended with a final answer")
    allow_unknown_tools: bool = Field(True, description="keep trajectories that called a tool that does not exist")
    allow_tool_errors: bool = Field(True, description="keep trajectories with a tool call that failed")
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
    push_to_hub: Text | None = Field(None, description="then upload the output to this Hub dataset repo (HF_TOKEN)")

    @property
    def curation(self) -> Curation:
        return Curation(keep=self.keep, min_pass_rate=self.min_pass_rate, max_pass_rate=self.max_pass_rate,
                        pairs=self.format == "preference")

    @property
    def filters(self) -> Filters:
        return Filters(completed_only=self.completed_only, allow_unknown_tools=self.allow_unknown_tools,
                       allow_tool_errors=self.allow_tool_errors, min_turns=self.min_turns, max_turns=self.max_turns,
                       toolsets=self.toolsets, status=self.status, min_score=self.min_score)

    @field_validator("status")
    @classmethod
    def _status(cls, v: list[str] | None) -> list[str] | None:
        unknown = sorted(set(v or []) - set(VERDICTS))
        if unknown:
            raise ValueError(f"unknown verdict {', '.join(unknown)}: choose from {', '.join(VERDICTS)}")
        return v


@dataclass
class Filters:
    """Which kept trajectories to export (all of them by default)."""

    completed_only: bool = False
    allow_unknown_tools: bool = True
    allow_tool_errors: bool = True
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


@dataclass
class Report:
    written: int = 0
    filtered: Counter = field(default_factory=Counter)  # reason → trajectories left out by the filters
    invalid: list[tuple[str, str]] = field(default_factory=list)  # (id, problem): would train wrongly
    legacy: int = 0  # written before turns kept their messages (see sharegpt.legacy_turns)
    pairs: bool = False  # `written` counts preference pairs
    compressed: int = 0  # rows whose middle was summarised to fit --max_tokens


# --- reading -------------------------------------------------------------------------------------
def kept_records(run_dir: Path) -> Iterator[dict[str, Any]]:
    """The run's kept trajectories, read through its store."""
    if not run_dir.is_dir():
        raise ExportError(f"no run at {run_dir} (check --run_name and --output_dir)")
    store = RunStore(run_dir)
    if not store.trajectories_path.exists() and not store.batch_files():
        raise ExportError(f"{run_dir} holds no trajectories yet")
    yield from store.kept_records()


# --- conversions ---------------------------------------------------------------------------------
def openai_row(rec: dict[str, Any]) -> dict[str, Any]:
    tools = offered_tools(rec)
    return {"id": rec["id"], "messages": messages(rec), "tools": json.dumps(tools or [], ensure_ascii=False),
            "metadata": json.dumps(_metadata(rec), ensure_ascii=False)}


def preference_row(chosen: dict[str, Any], good: dict[str, Any], rejected: dict[str, Any],
                   bad: dict[str, Any]) -> dict[str, Any] | None:
    """TRL's conversational preference row from two samples' openai rows; None when they were not
    asked the same (the prompt is what precedes the first reply)."""
    cut = next((i + 1 for i, m in enumerate(good["messages"]) if m["role"] == "user"), 0)
    prompt = good["messages"][:cut]
    if not prompt or bad["messages"][:cut] != prompt or good["tools"] != bad["tools"]:
        return None
    return {"id": f"{chosen['id']}>{rejected['id']}", "prompt": prompt, "chosen": good["messages"][cut:],
            "rejected": bad["messages"][cut:], "tools": good["tools"],
            "metadata": json.dumps({"prompt_id": prompt_id_of(chosen),
                                    "chosen": {"id": chosen["id"], **_metadata(chosen)},
                                    "rejected": {"id": rejected["id"], **_metadata(rejected)}}, ensure_ascii=False)}


def _metadata(rec: dict[str, Any]) -> dict[str, Any]:
    meta = rec.get("metadata") or {}
    keep = ("model", "stop_reason", "usage", "dataset", "backend", "distribution", "run_name", "attempt")
    return {"prompt_id": prompt_id_of(rec), "sample": rec.get("sample") or 0,
            "prompt_index": rec.get("prompt_index"), "completed": rec.get("completed"),
            "toolsets_used": rec.get("toolsets_used"), **{k: meta.get(k) for k in keep},
            "verification": verdict_of(rec)}


def sts_lines(rec: dict[str, Any], row: dict[str, Any]) -> list[dict[str, Any]]:
    """`row` is the record's openai_row (already made to check it)."""
    meta = rec.get("metadata") or {}
    first_user = next((t.get("value") for t in rec.get("conversations") or [] if t.get("from") == "human"), "")
    lines: list[dict[str, Any]] = [{"type": "session", "harness": HARNESS, "id": rec["id"],
                                    "name": (first_user or rec["id"])[:120], "model": meta.get("model"),
                                    "completed": rec.get("completed"), "stop_reason": meta.get("stop_reason"),
                                    "verification": verdict_of(rec)}]
    stamp = meta.get("timestamp")
    for m in row["messages"]:
        message: dict[str, Any] = {"role": m["role"], "content": m["content"], "timestamp": stamp}
        if m["reasoning_content"]:
            message["reasoningContent"] = m["reasoning_content"]
        if m["tool_calls"]:
            message["toolCalls"] = [{"id": c["id"], "function": c["function"]} for c in m["tool_calls"]]
        if m["tool_call_id"]:
            message["toolCallId"] = m["tool_call_id"]
        if m["role"] == "assistant":
            message["model"] = meta.get("model")
        lines.append({"type": "message", "message": message})
    return lines


# --- checks --------------------------------------------------------------------------------------
# the special tokens of the chat template rows are checked with (ChatML: Qwen, Hermes), and Llama 3's
_CONTROL_TOKEN = re.compile(r"<\|(?:im_start|im_end|endoftext|eot_id|start_header_id|end_header_id)\|>")


class Checker:
    """What would make a row train wrongly, including whether it renders through a chat template."""

    def __init__(self) -> None:
        try:
            import jinja2
        except ImportError as exc:
            raise ExportError("export checks rows with jinja2: pip install -e '.[export]'") from exc
        env = jinja2.Environment(autoescape=False, keep_trailing_newline=True)
        env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)

        def raise_exception(message: str) -> None:
            raise jinja2.TemplateError(message)

        env.globals["raise_exception"] = raise_exception
        self.template = env.from_string(TEMPLATE.read_text(encoding="utf-8"))

    def render(self, row: dict[str, Any]) -> str:
        """The row as the chat template writes it for training (what a token budget counts)."""
        return self.template.render(messages=row["messages"], tools=json.loads(row["tools"]) or None,
                                    add_generation_prompt=False)

    def problems(self, row: dict[str, Any]) -> list[str]:
        found = []
        messages, tools = row["messages"], json.loads(row["tools"])
        open_calls: dict[str, str] = {}
        calls = results = 0
        for m in messages:
            if m["role"] == "assistant":
                for c in m["tool_calls"] or []:
                    open_calls[c["id"]] = c["function"]["name"]
                    calls += 1
            elif m["role"] == "tool":
                results += 1
                if open_calls.pop(m["tool_call_id"], None) is None:
                    found.append(f"a tool result ({m['name']}) answers no call made before it")
        if open_calls:
            found.append(f"{len(open_calls)} tool call(s) with no result: {', '.join(sorted(open_calls.values()))}")
        if calls and not tools:
            found.append("tool calls, but no tools listed for the prompt (the system turn has no <tools>)")
        if not any(m["role"] == "user" for m in messages):
            found.append("no user turn")
        for m in messages:  # a chat template's own markers in a message's text would render as extra turns
            said = f"{m['content'] or ''}{m.get('reasoning_content') or ''}" + "".join(
                c["function"]["arguments"] or "" for c in m.get("tool_calls") or [])
            if marker := _CONTROL_TOKEN.search(said):
                found.append(f"a {m['role']} message holds the control token {marker.group(0)}: a chat template "
                             "would render it as the end or start of a turn")
                break
        if found:
            return found
        try:
            text = self.template.render(messages=messages, tools=tools or None, add_generation_prompt=False)
        except Exception as exc:  # the template itself refused the row
            return [f"the chat template cannot render it: {type(exc).__name__}: {exc}"]
        turns = text.split("<|im_end|>", 1)[-1]  # past the system turn, whose instructions show the tags
        # a message may mention the tags in its text (a model explaining the format): those are not calls
        said = "".join(f"{m['content'] or ''}{m['reasoning_content'] or ''}"
                       + "".join(c["function"]["arguments"] or "" for c in m["tool_calls"] or []) for m in messages)
        shown_calls = turns.count("<tool_call>") - said.count("<tool_call>")
        shown_results = turns.count("<tool_response>") - said.count("<tool_response>")
        if (shown_calls, shown_results) != (calls, results):
            found.append(f"through the chat template it shows {shown_calls} tool call(s) and {shown_results} tool "
                         f"result(s) where the trajectory has {calls} and {results}: a model trained on it would "
                         "learn a different conversation")
        if tools and "<tools>" not in text:
            found.append("renders without its tools")
        return found


# --- writing -------------------------------------------------------------------------------------
def export(run_dir: Path, fmt: str, output: Path, filters: Filters,
           on_problem: Callable[[str, str], None] | None = None, curation: Curation | None = None,
           compression: Compression | None = None) -> Report:
    if fmt not in FORMATS:
        raise ExportError(f"unknown --format={fmt!r}; choose one of: {', '.join(FORMATS)}")
    curation = curation or Curation(pairs=fmt == "preference")
    if compression is not None and fmt != "openai":
        raise ExportError("--max_tokens compresses openai rows: use --format=openai")
    if curation.pairs and curation.keep != "all":
        raise ExportError("--keep picks samples to write one by one; --format=preference writes pairs: use one of them")
    suffix = output.suffix.lower()
    if fmt in ("sts", "atif") and suffix:
        raise ExportError(f"--format={fmt} writes one file per trajectory: give --output a directory")
    if fmt == "atif":
        try:
            import atif  # noqa: F401
        except ImportError as exc:
            raise ExportError("--format=atif checks each document with the atif package: pip install -e '.[export]'") from exc
    if suffix not in ("", ".jsonl", ".parquet"):
        raise ExportError(f"--output={output}: use a .jsonl or .parquet file, or a directory for a datasets dataset")
    checker = Checker()
    if compression is not None:
        compression.render = checker.render
    report = Report(pairs=curation.pairs)
    selection = select(kept_records(run_dir), curation, filters.drop_reason) if curation.per_prompt else None
    if selection is not None:
        report.filtered.update(selection.dropped)

    def invalid(rec_id: str, problems: list[str]) -> bool:
        if problems:
            report.invalid.append((rec_id, "; ".join(problems)))
            if on_problem:
                on_problem(rec_id, "; ".join(problems))
        return bool(problems)

    def rows() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """(record, its openai row) of each kept, checked trajectory."""
        for rec in kept_records(run_dir):
            why = filters.drop_reason(rec)
            if why:
                report.filtered[why] += 1
                continue
            if selection is not None and rec["id"] not in selection.keep:
                continue  # counted by the selection
            row = openai_row(rec)
            report.legacy += legacy_turns(rec)
            if invalid(rec["id"], checker.problems(row)):
                continue
            if compression is not None:
                fitted, info = compression.fit(row)
                if fitted is None:
                    report.filtered["over --max_tokens even with its middle summarised"] += 1
                    continue
                if info is not None:
                    report.compressed += 1
                    row = {**fitted, "metadata": compress.note(fitted["metadata"], info)}
                    if invalid(rec["id"], checker.problems(row)):  # what is written is what was checked
                        continue
            report.written += 1
            yield rec, row

    def pair_rows() -> Iterator[dict[str, Any]]:
        """Each preference pair whose two halves are checked rows of one prompt."""
        for chosen, rejected in paired(kept_records(run_dir), selection.pairs if selection else []):
            good, bad = openai_row(chosen), openai_row(rejected)
            pair_id = f"{chosen['id']}>{rejected['id']}"
            if invalid(pair_id, [f"{which}: {p}" for which, row in (("chosen", good), ("rejected", bad))
                                 for p in checker.problems(row)]):
                continue
            row = preference_row(chosen, good, rejected, bad)
            if row is None:
                invalid(pair_id, ["the two samples were not given the same prompt and tools"])
                continue
            report.written += 1
            yield row

    def named_rows() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        for rec, row in rows():  # a file per trajectory, named by its id: never a path a record names
            if not is_file_name(rec.get("id")):
                report.written -= 1
                invalid(str(rec.get("id")), ["its id cannot name a file (the run directory was edited?)"])
                continue
            yield rec, row

    if fmt == "sts":
        output.mkdir(parents=True, exist_ok=True)
        for rec, row in named_rows():
            _write_lines(output / f"{rec['id']}.jsonl", sts_lines(rec, row))
        return report
    if fmt == "atif":
        output.mkdir(parents=True, exist_ok=True)
        for rec, _ in named_rows():
            try:
                document = atif_document(rec, verdict_of(rec))
            except ValueError as exc:  # pydantic's ValidationError is one
                report.written -= 1
                invalid(rec["id"], [f"not a valid ATIF document: {exc}"])
                continue
            path = output / f"{rec['id']}.json"
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(document, ensure_ascii=False, indent=1), encoding="utf-8")
            tmp.replace(path)
        return report
    # openai: the row; sharegpt: the record as the run wrote it (for Parquet, free-form parts as JSON text)
    if fmt == "preference":
        items: Iterator[dict[str, Any]] = pair_rows()
    elif fmt == "openai":
        items = (row for _, row in rows())
    else:
        items = (rec if suffix == ".jsonl" else _sharegpt_columns(rec) for rec, _ in rows())
    if suffix == ".jsonl":
        output.parent.mkdir(parents=True, exist_ok=True)
        _write_lines(output, items)
    elif suffix == ".parquet":
        _write_parquet(output, fmt, items)
    else:
        _write_dataset(output, fmt, items)
    return report


def _write_lines(path: Path, items: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for item in items:
                f.write(json.dumps(item, ensure_ascii=False) + "\n")
    except BaseException:  # a half-written file is no export
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def _sharegpt_columns(rec: dict[str, Any]) -> dict[str, Any]:
    """A record with its free-form parts as JSON text, for one Arrow schema."""
    return {"id": rec["id"], "prompt_index": rec.get("prompt_index"), "prompt_id": prompt_id_of(rec),
            "sample": int(rec.get("sample") or 0), "samples": int(rec.get("samples") or 1),
            "conversations": rec.get("conversations") or [],
            "completed": bool(rec.get("completed")), "partial": bool(rec.get("partial")),
            "api_calls": int(rec.get("api_calls") or 0), "toolsets_used": rec.get("toolsets_used") or [],
            "tool_stats": json.dumps(rec.get("tool_stats") or {}), "tool_error_counts": json.dumps(rec.get("tool_error_counts") or {}),
            "metadata": json.dumps(rec.get("metadata") or {}, ensure_ascii=False),
            "verification": json.dumps(rec.get("verification"), ensure_ascii=False)}


def arrow_schema(fmt: str) -> Any:
    import pyarrow as pa

    if fmt in ("openai", "preference"):
        call = pa.struct([("id", pa.string()), ("type", pa.string()),
                          ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
        message = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("reasoning_content", pa.string()),
                                      ("tool_calls", pa.list_(call)), ("tool_call_id", pa.string()), ("name", pa.string())]))
        if fmt == "preference":
            return pa.schema([("id", pa.string()), ("prompt", message), ("chosen", message), ("rejected", message),
                              ("tools", pa.string()), ("metadata", pa.string())])
        return pa.schema([("id", pa.string()), ("messages", message), ("tools", pa.string()), ("metadata", pa.string())])
    call = pa.struct([("id", pa.string()), ("name", pa.string()), ("arguments", pa.string())])
    turn = pa.struct([("from", pa.string()), ("value", pa.string()), ("content", pa.string()),
                      ("reasoning", pa.string()), ("tool_calls", pa.list_(call)), ("name", pa.string()),
                      ("tool_call_id", pa.string()), ("reasoning_details", pa.string())])
    return pa.schema([("id", pa.string()), ("prompt_index", pa.int64()), ("prompt_id", pa.string()),
                      ("sample", pa.int64()), ("samples", pa.int64()), ("conversations", pa.list_(turn)),
                      ("completed", pa.bool_()), ("partial", pa.bool_()), ("api_calls", pa.int64()),
                      ("toolsets_used", pa.list_(pa.string())), ("tool_stats", pa.string()),
                      ("tool_error_counts", pa.string()), ("metadata", pa.string()), ("verification", pa.string())])


def _batches(rows: Iterator[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= WRITE_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _write_parquet(path: Path, fmt: str, rows: Iterator[dict[str, Any]]) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ExportError("Parquet needs pyarrow: pip install -e '.[export]'") from exc
    schema = arrow_schema(fmt)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            for batch in _batches(rows):
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def _write_dataset(path: Path, fmt: str, rows: Iterator[dict[str, Any]]) -> None:
    """Through a Parquet file (written row group by row group), so memory stays flat."""
    try:
        import datasets
    except ImportError as exc:
        raise ExportError("a datasets dataset needs the datasets package: pip install -e '.[export]'") from exc
    with tempfile.TemporaryDirectory(prefix="hermes-export-") as tmp:
        parquet = Path(tmp) / "rows.parquet"
        _write_parquet(parquet, fmt, rows)
        features = datasets.Features.from_arrow_schema(arrow_schema(fmt))
        ds = datasets.Dataset.from_parquet(str(parquet), features=features, cache_dir=str(Path(tmp) / "cache"))
        ds.save_to_disk(str(path))


def push_to_hub(output: Path, repo: str, fmt: str) -> str:
    """Upload an exported file or directory to a dataset repo on the Hub; its URL."""
    try:
        from huggingface_hub import HfApi
    except ImportError as exc:
        raise ExportError("--push_to_hub needs huggingface_hub: pip install -e '.[export]'") from exc
    api = HfApi()
    api.create_repo(repo, repo_type="dataset", exist_ok=True)
    if output.is_dir():
        api.upload_folder(folder_path=str(output), repo_id=repo, repo_type="dataset",
                          path_in_repo="sessions" if fmt == "sts" else "")
    else:
        api.upload_file(path_or_fileobj=str(output), path_in_repo=f"data/{output.name}", repo_id=repo,
                        repo_type="dataset")
    return f"https://huggingface.co/datasets/{repo}"
