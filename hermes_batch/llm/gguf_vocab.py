"""A GGUF model's own vocabulary as a tokenizer.json, read from the file's header without loading the
model (`export --max_tokens --tokenizer=local` counts with it, so no model starts just to count).

Only vocabularies whose tokenisation is known here are read: a byte-level BPE (`gpt2`) with the
pre-tokenizer of Qwen2 (the embedded model's), written as llama.cpp splits it (no normalisation),
and its control tokens recognised in the text as llama.cpp's /tokenize does. Another vocabulary
gives None: the caller asks the model's server instead. The file is made once per weights file
into the user's cache (a temporary file renamed into place) and read from there after.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

BUILD = 1  # of what is written: a change makes every cached file anew
HEADER_BYTES = 64 << 20  # the metadata (vocabulary included) is at the start of the file
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types that /tokenize reads in text (parse_special)
# llama.cpp's split for its Qwen2 pre-tokenizer (LLAMA_VOCAB_PRE_TYPE_QWEN2)
SPLITS = {
    "qwen2": r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
WANTED = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
          "tokenizer.ggml.token_type")


def read_metadata(path: Path, wanted: tuple[str, ...] = WANTED) -> dict[str, Any]:
    """The values of `wanted` keys in a GGUF file's metadata (ValueError: not a GGUF file, or cut short)."""
    with open(path, "rb") as f:
        data = f.read(HEADER_BYTES)
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise ValueError(f"{path}: its metadata runs past its first {HEADER_BYTES >> 20} MiB, or the file is cut short")
        pos += n
        return data[pos - n:pos]

    def number(fmt: str) -> Any:
        return struct.unpack("<" + fmt, take(struct.calcsize(fmt)))[0]

    def text() -> str:
        return take(number("Q")).decode("utf-8", "replace")

    def value(kind: int) -> Any:
        if kind == _STRING:
            return text()
        if kind == _ARRAY:
            item, n = number("I"), number("Q")
            if item == _STRING:
                return [text() for _ in range(n)]
            fmt = _SCALARS[item]
            return list(struct.unpack(f"<{n}{fmt}", take(struct.calcsize(fmt) * n)))
        return number(_SCALARS[kind])

    if take(4) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    number("I")  # version
    number("Q")  # tensors
    found = {}
    for _ in range(number("Q")):
        key, kind = text(), number("I")
        found[key] = value(kind)
        if all(k in found for k in wanted):
            break
    return {k: found[k] for k in wanted if k in found}


def tokenizer_file(model_file: Path, cache: Path) -> Path | None:
    """A tokenizer.json of `model_file`'s vocabulary in `cache` (made on first use), or None when its
    vocabulary is not one read here."""
    st = model_file.stat()
    key = hashlib.sha256(json.dumps([BUILD, str(model_file.resolve()), st.st_size, st.st_mtime_ns, st.st_ino]).encode())
    path = cache / f"{key.hexdigest()[:32]}.json"
    if path.exists():
        return path
    spec = tokenizer_spec(read_metadata(model_file))
    if spec is None:
        return None
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=".tokenizer-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(spec, out, ensure_ascii=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def tokenizer_spec(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The tokenizer.json (the `tokenizers` library's format) of a GGUF vocabulary read here, or None."""
    split = SPLITS.get(meta.get("tokenizer.ggml.pre", ""))
    if meta.get("tokenizer.ggml.model") != "gpt2" or split is None or "tokenizer.ggml.merges" not in meta:
        return None
    tokens, kinds = meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type") or []
    special = [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for i, kind in enumerate(kinds) if kind in (CONTROL, USER_DEFINED)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": meta["tokenizer.ggml.merges"]},
    }
