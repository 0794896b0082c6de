"""`--format=vision`: TRL's layout for vision-language models: `messages` whose `content` is a list of
parts (`{"type": "text", "text": ...}`, `{"type": "image"}`) and an `images` column holding, in order,
the image of each image part. A tool turn that saw or made images (record/images.py) gets one image
part per image after its text; `tools` and `metadata` are the openai rows'.

`--images` says what the `images` column holds: `inline` (the bytes: a `datasets` Image in Parquet
and datasets, a `data:` URL in JSON lines), `reference` (the file's absolute path in the run
directory, which `datasets` opens when it reads the row), or `drop` (no image parts, no images).
An image larger than `--max_image_bytes` is not inlined: its part becomes a text part naming it, and
the export says how many. A record naming an image its run no longer holds (or holds changed), or
one whose header states more pixels than a trainer's loader takes (or no size: util/image_size.py),
is left out with its reason, never written with a hole. Every image is read and checked, by
reference too."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from ..record import image_file, is_image_ref, read_image, tool_results
from ..util import image_too_large
from .files import write_rows
from .options import ImageOptions
from .rows import Rows


def write(rows: Rows, output: Path) -> None:
    options = rows.images or ImageOptions()
    as_urls = output.suffix.lower() == ".jsonl"  # JSON has no bytes: a data: URL
    made = (vision_row(rec, row, rows.run_dir, options, as_urls, rows) for rec, row in rows)
    write_rows(output, (r for r in made if r is not None), schema)


def vision_row(rec: dict[str, Any], row: dict[str, Any], run_dir: Path, options: ImageOptions, as_urls: bool,
               rows: Rows) -> dict[str, Any] | None:
    """The openai `row` of `rec` in TRL's vision layout; None (reported) when an image it names is gone."""
    by_call = {r.get("tool_call_id"): r["images"] if isinstance(r.get("images"), list) else []
               for t in rec.get("conversations") or [] if t.get("from") == "tool" for r in tool_results(t)}
    images: list[Any] = []
    out = []
    for m in row["messages"]:
        parts: list[dict[str, Any]] = [{"type": "text", "text": m["content"]}]
        for ref in by_call.get(m["tool_call_id"], []) if m["role"] == "tool" and options.mode != "drop" else []:
            part = _image_part(ref, run_dir, options, as_urls, images)
            if isinstance(part, str):
                rows.left_out(rec["id"], part)
                return None
            if part["type"] == "text":
                rows.report.images_over_cap += 1
            parts.append(part)
        out.append({**m, "content": parts})
    return {**row, "messages": out, "images": images}


def _image_part(ref: Any, run_dir: Path, options: ImageOptions, as_urls: bool,
                images: list[Any]) -> dict[str, Any] | str:
    """The image's part (its bytes or path added to `images`), or why its record is left out."""
    data = read_image(run_dir, ref) if is_image_ref(ref) else None
    if data is None:
        return f"it names an image the run directory no longer holds as it was: {ref!r}"
    if why := image_too_large(data):  # a loader would refuse it, and the whole row with it
        return f"it names an image a trainer cannot load, {image_file(ref)}: {why}"
    if options.mode == "reference":
        path = run_dir.resolve() / image_file(ref)
        images.append(str(path) if as_urls else {"bytes": None, "path": str(path)})
        return {"type": "image", "text": None}
    if ref["bytes"] > options.max_bytes:
        return {"type": "text", "text": f"[image {ref['sha256'][:16]} ({ref['mime']}, {ref['bytes']} bytes) not "
                                        f"inlined: over --max_image_bytes]"}
    if as_urls:
        images.append(f"data:{ref['mime']};base64,{base64.b64encode(data).decode()}")
    else:
        images.append({"bytes": data, "path": None})
    return {"type": "image", "text": None}


def schema() -> Any:
    """The Arrow schema, carrying `datasets`' own description of it (the images column is a list of
    Image), so a Parquet file loads with its pictures as pictures."""
    import datasets

    text_or_image = [{"type": datasets.Value("string"), "text": datasets.Value("string")}]
    call = {"id": datasets.Value("string"), "type": datasets.Value("string"),
            "function": {"name": datasets.Value("string"), "arguments": datasets.Value("string")}}
    message = {"role": datasets.Value("string"), "content": text_or_image,
               "reasoning_content": datasets.Value("string"), "tool_calls": [call],
               "tool_call_id": datasets.Value("string"), "name": datasets.Value("string")}
    features = datasets.Features({"id": datasets.Value("string"), "messages": [message],
                                  "images": datasets.Sequence(datasets.Image()), "tools": datasets.Value("string"),
                                  "metadata": datasets.Value("string")})
    return features.arrow_schema

