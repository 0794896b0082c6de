"""Token data as compact text for JSON records: ids and log-probabilities packed, compressed and
base64-encoded, each string tagged with its encoding so a later version can read older ones.

    z1:<base64>   ids: little-endian uint32, zlib-compressed
    q4:<base64>   log-probabilities: -logprob in units of 1e-4 nats as uint32 (NaN: 0xFFFFFFFF), zlib
"""

from __future__ import annotations

import base64
import math
import zlib
from array import array

_IDS, _LOGPROBS = "z1:", "q4:"
_MISSING = 0xFFFFFFFF
_SCALE = 10_000  # 1e-4 nats: far finer than the spread of the same logprob between two servers


def pack_ids(ids: list[int]) -> str:
    data = array("I", ids)
    if data.itemsize != 4:  # pragma: no cover (every platform Python runs on here)
        raise RuntimeError("uint32 arrays are not 4 bytes here")
    return _IDS + base64.b64encode(zlib.compress(_little_endian(data).tobytes(), 9)).decode()


def unpack_ids(text: str) -> list[int]:
    return list(_unpack(text, _IDS))


def pack_logprobs(logprobs: list[float]) -> str:
    data = array("I", (_MISSING if math.isnan(lp) else min(_MISSING - 1, round(max(0.0, -lp) * _SCALE))
                       for lp in logprobs))
    return _LOGPROBS + base64.b64encode(zlib.compress(_little_endian(data).tobytes(), 9)).decode()


def unpack_logprobs(text: str) -> list[float]:
    return [math.nan if v == _MISSING else -v / _SCALE for v in _unpack(text, _LOGPROBS)]


def _unpack(text: str, tag: str) -> array:
    if not isinstance(text, str) or not text.startswith(tag):
        raise ValueError(f"token data {str(text)[:20]!r} is not of the encoding {tag!r}")
    data = array("I")
    data.frombytes(zlib.decompress(base64.b64decode(text[len(tag):])))
    return _little_endian(data)


def _little_endian(data: array) -> array:
    import sys

    if sys.byteorder == "big":  # pragma: no cover
        data = array("I", data)
        data.byteswap()
    return data
