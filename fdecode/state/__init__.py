"""What a decode step carries: the immutable state pytree, its parts and its output (docs/design.md, "The state")."""

from fdecode.state.decode_state import DecodeState, StepOutput
from fdecode.state.ownership import KVPools, KVTicket
from fdecode.state.parts import KV, Draft, Grammar, Lanes, Processors, Sampling

__all__ = [
    "KV",
    "DecodeState",
    "Draft",
    "Grammar",
    "KVPools",
    "KVTicket",
    "Lanes",
    "Processors",
    "Sampling",
    "StepOutput",
]
