"""The trajectory record's one home: how an episode becomes a record (`build_record`), what a settled
prompt is (`Outcome`: kept, discarded or failed), how a record is written (`dumps`, with its format
version) and read back whatever version wrote it (`prompt_id_of`, `format_of`), the conversation both ways
(ShareGPT turns as written, OpenAI messages for export), a sample's id and seed, and the images a
record names (kept once each in the run directory, by hash)."""

from .build import build_record, side_token_calls, usage_totals
from .conversation import assistant_message, legacy_turns, messages, offered_tools, tool_results, tool_text
from .fabrication import fabricated_in_record
from .images import IMAGES_DIRECTORY, image_file, image_files, is_image_ref, read_image
from .outcome import Outcome, discarded, dumps, failure, kept, now_iso, verdict_note
from .samples import each_sample, index_of_samples, sample_id, sample_of, sample_seed
from .transcript import AgentRun, ToolOutcome, has_reasoning
from .version import FORMAT, NewerFormat, format_of, prompt_id_of, sample_number, samples_of

__all__ = [
    "AgentRun",
    "ToolOutcome",
    "has_reasoning",
    "IMAGES_DIRECTORY",
    "image_file",
    "image_files",
    "is_image_ref",
    "read_image",
    "FORMAT",
    "NewerFormat",
    "format_of",
    "sample_number",
    "samples_of",
    "Outcome",
    "assistant_message",
    "build_record",
    "discarded",
    "dumps",
    "each_sample",
    "fabricated_in_record",
    "failure",
    "index_of_samples",
    "kept",
    "legacy_turns",
    "messages",
    "side_token_calls",
    "now_iso",
    "offered_tools",
    "prompt_id_of",
    "sample_id",
    "sample_of",
    "sample_seed",
    "tool_results",
    "tool_text",
    "usage_totals",
    "verdict_note",
]
