"""Images the model names to a tool: a file in its work directory, a public http(s) URL (through
the network guard), or a `data:` URL; read, bounded in size, and known by their bytes' type."""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import re

from ..util import MAX_PIXELS, image_too_large
from .base import Image, ToolContext, ToolError, confine
from .netguard import AddressRefused, refuse_internal

MAX_IMAGE_BYTES = 20 * 1024 * 1024
ACCEPTED = "PNG, JPEG, GIF, WebP or BMP"


def sniff(data: bytes) -> str | None:
    """The image type its first bytes say (never its name or a header the sender chose)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"BM"):
        return "image/bmp"
    head = data[:1024].lstrip().lower()
    if head.startswith(b"<svg") or (head.startswith(b"<?xml") and b"<svg" in head):
        return "image/svg+xml"
    return None


def as_image(data: bytes, where: str) -> Image:
    """Checked and made one a vision model reads: BMP becomes PNG; other types are refused by name,
    and so is one whose header states more than MAX_PIXELS, or no size (its pixels are never decoded)."""
    if len(data) > MAX_IMAGE_BYTES:
        raise ToolError(f"{where} is larger than {MAX_IMAGE_BYTES // (1024 * 1024)} MB")
    mime = sniff(data)
    if mime == "image/svg+xml":
        raise ToolError(f"{where} is an SVG drawing; render it to PNG in the sandbox first (accepted: {ACCEPTED})")
    if mime is None:
        raise ToolError(f"{where} is not an image ({ACCEPTED})")
    if why := image_too_large(data):
        raise ToolError(f"{where} is refused: {why}")
    if mime == "image/bmp":
        return Image(_bmp_to_png(data, where), "image/png")
    return Image(data, mime)


def _bmp_to_png(data: bytes, where: str) -> bytes:
    try:
        from PIL import Image as Pillow
    except ImportError:
        raise ToolError("a BMP image needs Pillow on the runner to be converted: pip install -e '.[media]'") from None
    try:
        picture = Pillow.open(io.BytesIO(data))  # reads the header only
        if picture.width * picture.height > MAX_PIXELS:  # a small compressed file can unpack to gigabytes
            raise ToolError(f"{where} is {picture.width}x{picture.height} pixels, more than {MAX_PIXELS:,}")
        out = io.BytesIO()
        picture.save(out, format="PNG")
    except (OSError, ValueError, Pillow.DecompressionBombError) as exc:
        raise ToolError(f"{where} is not a BMP image that can be read: {exc}") from None
    return out.getvalue()


async def load_image(ref: str, ctx: ToolContext) -> Image:
    """The image `ref` names, checked (`as_image`, off the event loop: a conversion takes CPU)."""
    return await asyncio.to_thread(as_image, *await _read(ref, ctx))


async def _read(ref: str, ctx: ToolContext) -> tuple[bytes, str]:
    ref = ref.strip()
    if ref.startswith("data:"):
        m = re.match(r"data:[\w/+.-]*(;[\w=-]+)*;base64,(.*)", ref, re.S)
        if not m:
            raise ToolError("a data: URL must be base64 (data:image/png;base64,...)")
        try:
            data = base64.b64decode(m.group(2), validate=False)
        except (binascii.Error, ValueError):
            raise ToolError("the data: URL's base64 does not decode") from None
        return data, "the data: URL"
    if re.match(r"https?://", ref, re.I):
        if ctx.fetch_http is None:
            raise ToolError("this run fetches no URLs; save the image in your work directory and give its path")
        try:
            await refuse_internal(ref)
            async with ctx.fetch_http.stream("GET", ref, follow_redirects=True) as res:
                if res.status_code >= 400:
                    raise ToolError(f"{ref} answered HTTP {res.status_code}")
                body = bytearray()
                async for chunk in res.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_IMAGE_BYTES:
                        break
        except AddressRefused as exc:
            raise ToolError(str(exc)) from None
        except ToolError:
            raise
        except Exception as exc:  # the network's failures, as the model can read them
            raise ToolError(f"could not fetch {ref}: {type(exc).__name__}: {exc}") from None
        return bytes(body), ref
    sandbox, path = await confine(ctx, ref)
    return await sandbox.read_file(path, MAX_IMAGE_BYTES + 1), ref
