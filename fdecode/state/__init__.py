"""What a decode step carries: the immutable state pytree and its output (docs/design.md, "The state")."""

from fdecode.state.decode_state import DecodeState, StepOutput
from fdecode.state.ownership import KVPools, KVTicket

__all__ = ["DecodeState", "KVPools", "KVTicket", "StepOutput"]
