"""The rows every format is made from, checked before anything is written: a run's kept trajectories
(`kept_records`) as OpenAI rows (`openai_row`), filtered and curated (`Rows`), each checked to train
as it reads (`Checker`: tool results pair with calls, every call has a result, a prompt offered tools
says which, and the row renders through a Hermes/Qwen chat template with tools,
llm/templates/hermes-tools.jinja, into as many calls and results as it holds). A row that fails is
reported and left out, never written silently."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..llm.local_model import TEMPLATES
from ..record import legacy_turns, messages, offered_tools, prompt_id_of, sample_number
from ..store import RunStore, is_file_name
from ..tokens import TokenTrace
from ..tokens.controls import held_control, refusal
from . import compress
from .clean import Cleaner, Cleaning, CleaningReport, Provenance
from .compress import Compression
from .curate import Curation, Selection, select
from .options import ExportError, Filters, verdict_of

TEMPLATE = TEMPLATES / "hermes-tools.jinja"


@dataclass
class Report:
    written: int = 0
    filtered: Counter = field(default_factory=Counter)  # reason → trajectories left out by the filters
    invalid: list[tuple[str, str]] = field(default_factory=list)  # (id, problem): would train wrongly
    legacy: int = 0  # written before turns kept their messages (see record/conversation.py legacy_turns)
    pairs: bool = False  # `written` counts preference pairs
    compressed: int = 0  # rows whose middle was summarised to fit --max_tokens
    images_over_cap: int = 0  # images named in place of their bytes (over --max_image_bytes)
    cleaning: CleaningReport = field(default_factory=CleaningReport)  # duplicates, contamination, masks
    sources: Provenance = field(default_factory=Provenance)  # where each written trajectory came from (the card)
    card: Path | None = None  # the dataset card written beside the output


def kept_records(run_dir: Path) -> Iterator[dict[str, Any]]:
    """The run's kept trajectories, read through its store."""
    if not run_dir.is_dir():
        raise ExportError(f"no run at {run_dir} (check --run_name and --output_dir)")
    store = RunStore(run_dir)
    if not store.trajectories_path.exists() and not store.batch_files():
        raise ExportError(f"{run_dir} holds no trajectories yet")
    yield from store.kept_records()


def records_of(run_dirs: list[Path], at: list[Path] | None = None) -> Iterator[dict[str, Any]]:
    """The kept trajectories of every run in turn; a record whose id an earlier run has is named
    `<id>@<run>` (the same prompt in a resumed copy of a run), so each row's id is its own. `at`,
    when given, holds the run directory of the record last yielded."""
    seen: set[str] = set()
    for run_dir in run_dirs:
        for rec in kept_records(run_dir):
            if at is not None:
                at[:] = [run_dir]
            if len(run_dirs) > 1:
                if rec["id"] in seen:
                    rec = {**rec, "id": f"{rec['id']}@{run_dir.name}"}
                seen.add(rec["id"])
            yield rec


def openai_row(rec: dict[str, Any]) -> dict[str, Any]:
    tools = offered_tools(rec)
    return {"id": rec["id"], "messages": messages(rec), "tools": json.dumps(tools or [], ensure_ascii=False),
            "metadata": json.dumps(metadata(rec), ensure_ascii=False)}


def metadata(rec: dict[str, Any]) -> dict[str, Any]:
    meta = rec.get("metadata") or {}
    keep = ("model", "stop_reason", "usage", "dataset", "backend", "distribution", "run_name", "attempt")
    out = {"prompt_id": prompt_id_of(rec), "sample": sample_number(rec),
           "prompt_index": rec.get("prompt_index"), "completed": rec.get("completed"),
           "toolsets_used": rec.get("toolsets_used"), **{k: meta.get(k) for k in keep},
           "verification": verdict_of(rec)}
    if meta.get("cleaning"):  # what cleaning found and did (export/clean/); said only when it did something
        out["cleaning"] = meta["cleaning"]
    if isinstance(rec.get("tokens"), dict):  # said only when so: rows of earlier runs keep their bytes
        out["token_exact"] = {"segments": rec["tokens"].get("segments"), "export": "--format=tokens"}
    return out


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
        # the file's last newline is the file's, not the template's (a rendering ends where the template does)
        self.template = env.from_string(TEMPLATE.read_text(encoding="utf-8").removesuffix("\n"))

    def render(self, row: dict[str, Any], generation: bool = False) -> str:
        """The row as the chat template writes it for training (what a token budget counts); with
        `generation`, followed by the opening of the assistant's next turn."""
        return self.template.render(messages=row["messages"], tools=json.loads(row["tools"]) or None,
                                    add_generation_prompt=generation)

    def problems(self, row: dict[str, Any], tokens: TokenTrace | None = None) -> list[str]:
        """`tokens`: the row is written as these ids (a token format), not rendered from its text."""
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
        if tokens is not None:  # ids made with message text as text carry it as text; others may not
            if why := refusal(tokens, messages):
                found.append(why)
        elif held := held_control(messages):  # a chat template's own markers in a message's text render as extra turns
            found.append(f"a {held[0]} message holds the control token {held[1]}: a chat template "
                         "would render it as the end or start of a turn")
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


class Rows:
    """The kept trajectories an export writes, as (record, its openai row), each cleaned and checked
    (and fitted to --max_tokens) before it is yielded; what was left out, and why, is counted in `report`."""

    def __init__(self, run_dirs: Path | list[Path], filters: Filters, curation: Curation,
                 compression: Compression | None, on_problem: Callable[[str, str], None] | None,
                 fits_itself: bool = False, cleaner: Cleaner | None = None):
        """`fits_itself`: the format fits its own rows to --max_tokens (token ids: `token_budget`), so
        the openai rows are yielded as they are. `cleaner`: duplicates, contamination and masks."""
        self.run_dirs = [run_dirs] if isinstance(run_dirs, Path) else list(run_dirs)
        self._at = [self.run_dirs[0]]
        self.filters, self.on_problem = filters, on_problem
        self.checker = Checker()
        if compression is not None:
            compression.render = self.checker.render
        self.compression = None if fits_itself else compression
        self.token_budget = compression if fits_itself else None
        self.token_ids = fits_itself  # rows written as their records' token ids, not rendered from their text
        self.cleaner = cleaner or Cleaner(Cleaning(), self.run_dirs)
        self.report = Report(pairs=curation.pairs, cleaning=self.cleaner.report)
        self.images: Any = None  # --format=vision's ImageOptions
        self.selection: Selection | None = None
        if self.cleaner.surveys:
            self.cleaner.survey(r for r in self.records() if not filters.drop_reason(r))
        if curation.per_prompt:
            self.selection = select(self.records(), curation,
                                    lambda r: filters.drop_reason(r) or self.cleaner.drop_reason(r))
            self.report.filtered.update(self.selection.dropped)

    @property
    def run_dir(self) -> Path:
        """The run directory of the record last read (where its images are)."""
        return self._at[0]

    def records(self) -> Iterator[dict[str, Any]]:
        return records_of(self.run_dirs, self._at)

    def invalid(self, rec_id: str, problems: list[str]) -> bool:
        """Whether a row has problems: each one is reported, and the row left out."""
        if problems:
            self.report.invalid.append((rec_id, "; ".join(problems)))
            if self.on_problem:
                self.on_problem(rec_id, "; ".join(problems))
        return bool(problems)

    def left_out(self, rec_id: str, why: str) -> None:
        """A row yielded (and counted written) that its format could not write after all."""
        self.report.written -= 1
        self.report.sources.remove(rec_id)
        self.invalid(rec_id, [why])

    def __iter__(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        report, compression = self.report, self.compression
        for rec in self.records():
            why = self.filters.drop_reason(rec)
            if why:
                report.filtered[why] += 1
                continue
            if self.cleaner.drop_reason(rec):
                continue  # counted by the cleaning report
            if self.selection is not None and rec["id"] not in self.selection.keep:
                continue  # counted by the selection
            rec = self.cleaner.cleaned(rec)
            row = openai_row(rec)
            report.legacy += legacy_turns(rec)
            tokens = _trace(rec) if self.token_ids else None  # as cleaning left them
            if self.invalid(rec["id"], self.checker.problems(row, tokens)):
                continue
            if compression is not None:
                fitted, info = compression.fit(row)
                if fitted is None:
                    report.filtered["over --max_tokens even with its middle summarised"] += 1
                    continue
                if info is not None:
                    report.compressed += 1
                    row = {**fitted, "metadata": compress.note(fitted["metadata"], info)}
                    if self.invalid(rec["id"], self.checker.problems(row)):  # what is written is what was checked
                        continue
            report.written += 1
            report.sources.add(rec)
            yield rec, row

    def named(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """The rows of formats that write a file per trajectory, named by its id: never a path a record names."""
        for rec, row in self:
            if not is_file_name(rec.get("id")):
                self.left_out(str(rec.get("id")), "its id cannot name a file (the run directory was edited?)")
                continue
            yield rec, row


def _trace(rec: dict[str, Any]) -> TokenTrace | None:
    """The record's token data, where it can be read (what cannot, its format leaves out, saying so)."""
    try:
        return TokenTrace.read(rec["tokens"]) if rec.get("tokens") else None
    except ValueError:
        return None

