"""Token-exact rollouts: a rollout's token ids per model call as the endpoint produced them
(`TokenTrace`), stored compactly in the record (codec.py), the text formats models write tool
calls in, read back client-side (`FORMATS`: hermes), and where a rendering's control tokens may be:
the template's own, never a message's text (controls.py: `Skeleton`, `refusal`)."""

from .codec import pack_ids, pack_logprobs, unpack_ids, unpack_logprobs
from .controls import Skeleton, marker, refusal
from .toolcalls import FORMATS, Call, new_call_id, tagged_calls
from .trace import TokenCall, TokenTrace

__all__ = ["FORMATS", "Call", "Skeleton", "TokenCall", "TokenTrace", "marker", "new_call_id", "pack_ids",
           "pack_logprobs", "refusal", "tagged_calls", "unpack_ids", "unpack_logprobs"]
