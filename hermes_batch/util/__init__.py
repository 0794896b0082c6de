"""Small helpers every floor may use, each in a home of its own so no room imports a big one for a line:
the console's voice (`say`), crash-safe writes (`atomic_write`), sizes as people write them
(`parse_size`), text cut to fit (`clip`), the adaptive limit on requests in flight (`AdaptiveLimit`),
and an image's size as its header states it (`image_size`)."""

from .console import say
from .files import atomic_write, fsync_dir, read_json_flag
from .image_size import MAX_PIXELS, image_too_large
from .limits import AdaptiveLimit
from .sizes import parse_size
from .text import clip, head_part

__all__ = [
    "MAX_PIXELS",
    "AdaptiveLimit",
    "atomic_write",
    "clip",
    "fsync_dir",
    "head_part",
    "image_too_large",
    "parse_size",
    "read_json_flag",
    "say",
]
