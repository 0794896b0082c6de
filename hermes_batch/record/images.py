"""How a record names the images a trajectory's tools saw or made (a screenshot, a generated
picture, an image given to vision), each kept once in the run directory (the store writes it) under
`images/<sha256>.<ext>`: content-addressed, so a retried or resumed prompt writes nothing twice and
no record can name a file another one changes.
A record's tool turn refers to its images by `{"sha256", "mime", "bytes"}` (`ref`); exports and the
viewer find the file from that alone (`image_file`), and a tampered ref names no file (`is_image_ref`)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

IMAGES_DIRECTORY = "images"
EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}
_SHA256 = re.compile(r"[0-9a-f]{64}")


def ref(data: bytes, mime: str) -> dict[str, Any]:
    """How a record names an image."""
    return {"sha256": hashlib.sha256(data).hexdigest(), "mime": mime, "bytes": len(data)}


def image_files(transcript: list[dict[str, Any]]) -> dict[str, bytes]:
    """The image files a run's tool messages name, by file name: what the store writes beside the record."""
    return {image_file(ref(i.data, i.mime)): i.data for m in transcript for i in m.get("images") or ()}


def is_image_ref(value: object) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("sha256"), str) and bool(_SHA256.fullmatch(value["sha256"]))
            and value.get("mime") in EXTENSIONS and isinstance(value.get("bytes"), int) and value["bytes"] >= 0)


def image_file(image: dict[str, Any]) -> str:
    """The image's file, relative to the run directory."""
    if not is_image_ref(image):
        raise ValueError(f"{image!r} does not name an image")
    return f"{IMAGES_DIRECTORY}/{image['sha256']}.{EXTENSIONS[image['mime']]}"


def read_image(run_dir: Path, image: dict[str, Any]) -> bytes | None:
    """The image's bytes, if the run holds them and they are what the ref says (None otherwise)."""
    try:
        data = (run_dir / image_file(image)).read_bytes()
    except (OSError, ValueError):
        return None
    return data if hashlib.sha256(data).hexdigest() == image["sha256"] else None
