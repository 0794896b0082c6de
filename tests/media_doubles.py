"""Loopback doubles of a vision model and of image providers, answering deterministically.

- `POST /v1/chat/completions` (a vision model): reads the `data:` URL image of the user message
  and answers what it got: `image sha256=<first 16 hex> type=<mime> size=<w>x<h>; question: ...`.
- `POST /v1/images/generations` and `/v1/images/edits` (OpenAI's): a PNG drawn for the request,
  of the size asked, its colour from the prompt; edits count the images they were given.
- `POST /fal/<model>` (fal's synchronous endpoint): the same PNG as a `data:` URL.
- `POST /v1/audio/speech` (OpenAI's): a silent WAV, 100 samples per character of the input, or
  for another `response_format` bytes that start with its name.
Every request is kept (`requests`: path, headers, body) for the test to look at.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import zlib
from typing import Any

from aiohttp import web

from tests.loopback import LoopbackServer


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour PNG, written by hand (no imaging library in the double)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + bytes(rgb) * width
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(row * height)) + chunk(b"IEND", b""))


def bomb_png(width: int = 30000, height: int = 30000) -> bytes:
    """66 bytes whose header states `width`×`height` (a loader would unpack 2.7 GB for the default)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b""))


def wav(samples: int, rate: int = 16000) -> bytes:
    """A silent mono 16-bit WAV of `samples` samples."""
    data = b"\x00\x00" * samples
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, 2 * rate, 2, 16)
            + b"data" + struct.pack("<I", len(data)) + data)


def png_size(data: bytes) -> tuple[int, int] | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR":
        w, h = struct.unpack(">II", data[16:24])
        return w, h
    return None


def colour_of(prompt: str) -> tuple[int, int, int]:
    for name, rgb in (("red", (220, 20, 20)), ("green", (20, 200, 20)), ("blue", (20, 20, 220))):
        if name in prompt.lower():
            return rgb
    return (128, 128, 128)


def describe(data: bytes, mime: str) -> str:
    size = png_size(data)
    return (f"image sha256={hashlib.sha256(data).hexdigest()[:16]} type={mime} "
            f"size={'x'.join(map(str, size)) if size else '?'}")


class MediaDouble(LoopbackServer):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict[str, Any]] = []

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"path": request.path, "headers": dict(request.headers), "body": body})
        parts = body["messages"][-1]["content"]
        text = next(p["text"] for p in parts if p["type"] == "text")
        url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
        head, b64 = url.split(",", 1)
        answer = f"{describe(base64.b64decode(b64), head[5:].split(';')[0])}; question: {text.rsplit('Question: ', 1)[-1]}"
        return web.json_response({"id": "v1", "object": "chat.completion", "model": body["model"],
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                                               "finish_reason": "stop"}]})

    async def _generate(self, request: web.Request) -> web.Response:
        if request.content_type == "multipart/form-data":
            form = await request.post()
            given = [f for k, f in form.items() if k == "image[]"]
            body: dict[str, Any] = {k: v for k, v in form.items() if isinstance(v, str)}
            body["images_given"] = len(given)
        else:
            body = await request.json()
        self.requests.append({"path": request.path, "headers": dict(request.headers), "body": body})
        w, h = (int(x) for x in str(body.get("size", "64x64")).split("x"))
        picture = png(w // 16, h // 16, colour_of(body["prompt"]))  # small: the shape is what is asked
        return web.json_response({"created": 1, "data": [{"b64_json": base64.b64encode(picture).decode()}]})

    async def _fal(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"path": request.path, "headers": dict(request.headers), "body": body})
        shapes = {"landscape_4_3": (64, 48), "square_hd": (64, 64), "portrait_4_3": (48, 64)}
        picture = png(*shapes[body["image_size"]], colour_of(body["prompt"]))
        url = "data:image/png;base64," + base64.b64encode(picture).decode()
        return web.json_response({"images": [{"url": url, "content_type": "image/png"}], "seed": 1})

    async def _speech(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"path": request.path, "headers": dict(request.headers), "body": body})
        if body.get("response_format") != "wav":
            return web.Response(body=f"{body.get('response_format')}:{body['input']}".encode(), content_type="audio/mpeg")
        return web.Response(body=wav(100 * len(body["input"])), content_type="audio/wav")

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/images/generations", self._generate)
        app.router.add_post("/v1/images/edits", self._generate)
        app.router.add_post("/fal/{model:.*}", self._fal)
        app.router.add_post("/v1/audio/speech", self._speech)
