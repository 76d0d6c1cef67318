"""What a decode step carries: the immutable state pytree and its output."""

from fdecode.state.decode_state import DecodeState, KVLease, StepOutput

__all__ = ["DecodeState", "KVLease", "StepOutput"]
