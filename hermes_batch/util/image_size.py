"""An image's width and height as its header states them, read from the header alone: never its
pixels, since a 69-byte PNG may state 30000×30000, which a loader would try to unpack (Pillow then
refuses the whole row a trainer reads). Every image kept (tools/media.py) or exported is checked
against one cap."""

from __future__ import annotations

import struct

MAX_PIXELS = 40_000_000  # width × height: a 6000×6000 photograph fits; Pillow refuses from 89,478,485
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}  # JPEG frame headers


def dimensions(data: bytes) -> tuple[int, int] | None:
    """(width, height) that a PNG, JPEG, GIF, WebP or BMP header states; None when it states none."""
    try:
        if data.startswith(b"\x89PNG\r\n\x1a\n"):
            size = struct.unpack_from(">II", data, 16) if data[12:16] == b"IHDR" else None
        elif data.startswith(b"\xff\xd8"):
            size = _jpeg(data)
        elif data[:6] in (b"GIF87a", b"GIF89a"):
            size = _gif(data)
        elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            size = _webp(data)
        elif data.startswith(b"BM"):
            size = struct.unpack_from("<HH" if data[14:18] == b"\x0c\0\0\0" else "<ii", data, 18)
            size = (size[0], abs(size[1]))  # a negative height: rows stored top down
        else:
            size = None
    except struct.error:  # cut short inside its header
        return None
    return (int(size[0]), int(size[1])) if size and size[0] > 0 and size[1] > 0 else None


def image_too_large(data: bytes) -> str | None:
    """Why an image is not one to keep or hand a trainer (its size unstated, or over MAX_PIXELS); None if it is."""
    size = dimensions(data)
    if size is None:
        return "its header states no width and height that can be read"
    if size[0] * size[1] > MAX_PIXELS:
        return f"its header states {size[0]}x{size[1]} pixels, more than {MAX_PIXELS:,}"
    return None


def _jpeg(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill
            i += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
        elif marker in _SOF:
            height, width = struct.unpack_from(">HH", data, i + 5)
            return width, height
        elif marker in (0xD9, 0xDA):  # the end, or the scan, before any frame header
            return None
        else:
            i += 2 + struct.unpack_from(">H", data, i + 2)[0]
    return None


def _gif(data: bytes) -> tuple[int, int]:
    """The screen's size, or the first frame's where it reaches further (Pillow grows the image to it)."""
    width, height, flags = struct.unpack_from("<HHB", data, 6)
    i = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)  # past the global colour table
    while i < len(data) and data[i] == 0x21:  # extensions: a label, then sub-blocks to an empty one
        i += 2
        while i < len(data) and data[i]:
            i += data[i] + 1
        i += 1
    if i < len(data) and data[i] == 0x2C:
        left, top, w, h = struct.unpack_from("<HHHH", data, i + 1)
        width, height = max(width, left + w), max(height, top + h)
    return width, height


def _webp(data: bytes) -> tuple[int, int] | None:
    kind = data[12:16]
    if kind == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack_from("<HH", data, 26)
        return w & 0x3FFF, h & 0x3FFF
    if kind == b"VP8L" and data[20] == 0x2F:
        bits = struct.unpack_from("<I", data, 21)[0]
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8X":
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None
