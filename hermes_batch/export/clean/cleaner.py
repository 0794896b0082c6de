"""What an export's cleaning does to the rows (`Cleaner`): a first read of the rows the filters keep,
when duplicates or contamination are looked for (`survey`), decides which to leave out; every row
written is masked (`cleaned`: the run's own keys always, secrets and personal data with --scrub);
token rows of a masked trajectory are re-tokenised where it changed (`token_rows`). What was found
is counted in `CleaningReport`, which the export's summary and its dataset card say."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...record import messages as messages_of
from . import masking
from .contamination import Decontaminator, Finding
from .duplicates import Duplicates
from .masking import Masked
from .run_keys import RunKeys
from .token_rows import retokenised


@dataclass(frozen=True)
class Cleaning:
    """The export's cleaning flags (options.py declares them)."""

    dedup: str = "off"  # off | exact | near
    threshold: float = 0.8
    scope: str = "all"  # all | prompt
    keep: str = "passing"  # passing | shortest | first
    benchmarks: tuple[str, ...] = ()
    ngram: int = 13
    contaminated: str = "drop"  # drop | flag
    scrub: tuple[str, ...] = ()  # secrets, pii
    phone_region: str = "US"
    dry_run: bool = False


@dataclass
class CleaningReport:
    cleaning: Cleaning = field(default_factory=Cleaning)
    surveyed: int = 0  # rows the filters kept, looked at for duplicates and contamination
    duplicates: Counter = field(default_factory=Counter)  # exact, near, within a prompt, across prompts → removed
    contaminated: Counter = field(default_factory=Counter)  # benchmark → rows found
    benchmarks: list[dict[str, Any]] = field(default_factory=list)  # each one checked against
    masked: Counter = field(default_factory=Counter)  # kind → values masked (distinct within a trajectory)
    rows_masked: int = 0  # rows with at least one value masked
    not_token_exact: int = 0  # token rows re-tokenised where masked
    short_keys: list[str] = field(default_factory=list)  # keys the run held too short to be masked


class Cleaner:
    def __init__(self, cleaning: Cleaning, run_dirs: list[Path], tokenizer: Callable[[], Any] | None = None,
                 on_change: Callable[[str], None] | None = None):
        """`tokenizer`: gives the run's model's vocabulary when a token row must be re-tokenised
        (None when there is none); `on_change`: told each change, one line each (a dry run's list)."""
        self.cleaning, self.on_change = cleaning, on_change
        self.report = CleaningReport(cleaning)
        self.run_keys = RunKeys(run_dirs)
        self.report.short_keys = self.run_keys.too_short
        self.finders: list[masking.Finder] = [self.run_keys.find]
        self._closers: list[Callable[[], None]] = []
        if "secrets" in cleaning.scrub:
            from .secrets import SecretFinder

            secrets = SecretFinder()
            self.finders.append(secrets.find)
            self._closers.append(secrets.close)
        if "pii" in cleaning.scrub:
            from .personal import PersonalFinder

            self.finders.append(PersonalFinder(cleaning.phone_region).find)
        self.duplicates = Duplicates(cleaning.dedup, cleaning.threshold, cleaning.scope, cleaning.keep) \
            if cleaning.dedup != "off" else None
        self.decontaminator = Decontaminator(list(cleaning.benchmarks), cleaning.ngram) if cleaning.benchmarks else None
        if self.decontaminator is not None:
            self.report.benchmarks = self.decontaminator.describe()
        self.found: dict[str, Finding] = {}  # id → its contamination (only rows that have one)
        self._tokenizer = tokenizer
        self.current: tuple[str, Any, Masked] | None = None  # the last row cleaned: id, its token data, its masks

    @property
    def surveys(self) -> bool:
        return self.duplicates is not None or self.decontaminator is not None

    def close(self) -> None:
        for close in self._closers:
            close()

    def survey(self, records: Iterable[dict[str, Any]]) -> None:
        """The first read: each row the filters keep, for duplicates and contamination."""
        for rec in records:
            self.report.surveyed += 1
            said = messages_of(rec)  # made once for both
            if self.duplicates is not None:
                self.duplicates.add(rec, said)
            if self.decontaminator is not None and (found := self.decontaminator.check(said)) is not None:
                self.found[str(rec["id"])] = found
                self.report.contaminated[found.benchmark] += 1
        if self.duplicates is not None:
            self.duplicates.resolve()
            self.report.duplicates.update(self.duplicates.counts)
            for rec_id, why in self.duplicates.dropped.items():
                self._list(f"{rec_id}: left out, {why}")
        for rec_id, f in self.found.items():
            action = "left out" if self.cleaning.contaminated == "drop" else "flagged"
            self._list(f"{rec_id}: {action}, contaminated by {f.benchmark} item {f.item} ({f.words} words in its "
                       f"{f.where}): {f.span!r}")

    def drop_reason(self, rec: dict[str, Any]) -> str | None:
        """Why cleaning leaves a row out (a duplicate, a contaminated row with --contaminated=drop)."""
        rec_id = str(rec["id"])
        if self.duplicates is not None and (why := self.duplicates.dropped.get(rec_id)):
            return why
        if self.cleaning.contaminated == "drop" and (found := self.found.get(rec_id)):
            return f"contaminated by {found.benchmark}"
        return None

    def cleaned(self, rec: dict[str, Any]) -> dict[str, Any]:
        """The row as it is written: masked, its contamination noted (flag), what was done said in
        metadata.cleaning; a masked row's token data leaves the record (its ids spell the values)."""
        masked = masking.find(rec, self.finders)
        self.current = (str(rec["id"]), rec.get("tokens"), masked)
        note: dict[str, Any] = {}
        if (found := self.found.get(str(rec["id"]))) is not None:
            note["contamination"] = found.as_dict()
        if masked:
            self.report.rows_masked += 1
            self.report.masked.update(masked.counts())
            note["masked"] = masked.counts()
            for value, placeholder in masked.placeholders.items():
                self._list(f"{rec['id']}: {placeholder} in place of {masking.preview(value)}")
            rec = masking.masked_record(rec, masked)
            if rec.pop("tokens", None) is not None:
                note["token_exact"] = False
        if note:
            rec = {**rec, "metadata": {**(rec.get("metadata") or {}), "cleaning": note}}
        return rec

    def token_rows(self, rec: dict[str, Any], segments: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
        """The token rows of the row last cleaned, re-tokenised where masked; ([], why) when they cannot be."""
        assert self.current is not None and self.current[0] == str(rec["id"])
        masked = self.current[2]
        if not masked:
            return [{**s, "token_exact": True} for s in segments], None
        tokenizer = self._tokenizer() if self._tokenizer else None
        if tokenizer is None:
            return [], ("its text was masked and its ids must be re-tokenised, which needs the run's model's "
                        "vocabulary: give --tokenizer=its tokenizer.json (or local, for the embedded model)")
        prompt = next((m.get("content") or "" for m in messages_of(rec) if m["role"] == "user"), "")
        out = []
        for seg in segments:
            new, why = retokenised(seg, masked.replacements(), tokenizer, _unmasked(prompt, masked))
            if new is None:
                return [], why
            out.append(new if "token_exact" in new else {**new, "token_exact": True})
        self.report.not_token_exact += sum(not s["token_exact"] for s in out)
        return out, None

    def token_data(self, rec: dict[str, Any]) -> Any:
        """The record's token data as the run wrote it (the cleaned record has none when masked)."""
        if self.current is not None and self.current[0] == str(rec["id"]):
            return self.current[1]
        return rec.get("tokens")

    def _list(self, line: str) -> None:
        if self.on_change is not None:
            self.on_change(line)


def _unmasked(text: str, masked: Masked) -> str:
    """The prompt as the ids spell it (the cleaned record's has placeholders in it)."""
    for value, placeholder in masked.placeholders.items():
        text = text.replace(placeholder, value)
    return text


@contextlib.contextmanager
def cleaner_for(opts: Any, say: Callable[[str], None], compression: Any = None) -> Iterator[Cleaner]:
    """The cleaner `export`'s flags ask for; the run's model's vocabulary (--tokenizer) is opened the
    first time a masked token row needs it (the embedded model's server, for `local`), and closed
    with the block. A dry run's changes are said as they are found."""
    from ..compress import EmbeddedOnDemand, FileTokenizer, local_tokenizer

    with contextlib.ExitStack() as stack:
        opened: list[Any] = []

        def tokenizer() -> Any:
            if compression is not None:
                return compression.tokenizer
            if not opened:
                try:
                    if opts.tokenizer != "local":
                        opened.append(FileTokenizer(opts.tokenizer))
                    else:
                        opened.append(local_tokenizer(EmbeddedOnDemand(stack, say)))
                except Exception as exc:  # none to be had (not installed, a missing file): the rows say so
                    say(f"note: --tokenizer={opts.tokenizer} cannot re-tokenise masked token rows: {exc}")
                    opened.append(None)
            return opened[0]

        cleaner = Cleaner(opts.cleaning, opts.run_dirs, tokenizer,
                          on_change=(lambda line: say(f"dry run: {line}")) if opts.dry_run else None)
        stack.callback(cleaner.close)
        yield cleaner
