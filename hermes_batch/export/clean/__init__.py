"""Clean data at export: duplicates (`duplicates`), benchmark contamination (`contamination`, its
benchmarks read by `benchmarks`), the run's own keys (`run_keys`, always), secrets (`secrets`) and
personal data (`personal`) masked consistently within a trajectory (`masking`), token rows
re-tokenised where masked (`token_rows`); all run by `Cleaner` and said in a dataset card (`card`)."""

from .card import Provenance, card_path, write_card
from .cleaner import Cleaner, Cleaning, CleaningReport, cleaner_for

__all__ = ["Cleaner", "Cleaning", "CleaningReport", "Provenance", "card_path", "cleaner_for", "write_card"]
