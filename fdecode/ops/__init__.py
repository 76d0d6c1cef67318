"""Pure functions and custom ops of the decode step (the math; graphs/ only composes them)
(docs/design.md, "The iteration")."""

from fdecode.ops import prepare_triton  # noqa: F401 - registers the op's CUDA kernel where triton imports
from fdecode.ops.paging import slot_of
from fdecode.ops.prepare import prepare_next_draft, prepare_next_draft_reference
from fdecode.ops.sampling import apply_stops, greedy_accept

__all__ = ["apply_stops", "greedy_accept", "prepare_next_draft", "prepare_next_draft_reference", "slot_of"]
