"""Token-exact rollouts: a rollout's token ids per model call as the endpoint produced them
(`TokenTrace`), stored compactly in the record (codec.py), and the text formats models write tool
calls in, read back client-side (`FORMATS`: hermes)."""

from .codec import pack_ids, pack_logprobs, unpack_ids, unpack_logprobs
from .toolcalls import FORMATS, Call, new_call_id, tagged_calls
from .trace import TokenCall, TokenTrace

__all__ = ["FORMATS", "Call", "TokenCall", "TokenTrace", "new_call_id", "pack_ids", "pack_logprobs", "tagged_calls",
           "unpack_ids", "unpack_logprobs"]
