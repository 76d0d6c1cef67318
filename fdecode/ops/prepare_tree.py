"""`fdecode::prepare_tree_draft`: the fused prepare op of a tree step, which turns the committed run into its
draft's first rows (docs/design.md, "Trees", "Draft KV"), as `fdecode::prepare_next_draft` does a chain step's.

Per lane b (L = length[b], the tokens the step committed, accepted[b, :L]; 0: inactive), `rows` rows, the run's
last `rows` tokens right-aligned, row r standing for run index i = r - rows + L:

    token    accepted[b, i]      position base_pos[b] + 1 + i      slot(b, that position)
    hidden   hidden[b, i]        (the target's row that chose accepted[b, i]: an MTP head pairs them)
    real     i >= 0 and L > 0

A padding row (not real) has token 0, hidden 0 and the scratch slot 0; its position is base_pos[b] + 1 + i
clamped at 0. After a tree the step passes rows = S + 1 (the whole run: a branch's nodes wrote their draft KV to
scratch), after a chain depth 2, as a chain step's repair and current rows. `prepare_tree_draft_reference` is the spec; the registered op runs
it, and a CPU step's Inductor pass compiles it into the step's kernels (`fdecode.backends.cpu.prepare`).
"""

from __future__ import annotations

import torch

from fdecode.ops.paging import slot_of
from fdecode.ops.tree import rows_at


def prepare_tree_draft_reference(
    accepted: torch.Tensor,  # [B, W] int64, the committed run first
    length: torch.Tensor,  # [B] int64, the run's tokens (0: inactive)
    hidden: torch.Tensor,  # [B, W', H] the target's hidden state of each committed row
    base_pos: torch.Tensor,  # [B] int64, position of the root (the run's first token goes to base_pos + 1)
    block_tables: torch.Tensor,  # [B, max_blocks] int64
    block_size: int,
    rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns tokens, positions, slots [B, rows] int64, hidden [B, rows, H] and real [B, rows] bool."""
    index = torch.arange(rows, device=length.device)[None, :] - rows + length[:, None]  # into accepted
    real = (index >= 0) & (length > 0)[:, None]
    at = index.clamp(0, accepted.shape[1] - 1)
    tokens = torch.where(real, accepted.gather(1, at).clamp_min(0), 0)
    positions = (base_pos[:, None] + 1 + index).clamp_min(0)
    slots = torch.where(real, slot_of(block_tables, positions, block_size), torch.zeros_like(positions))
    hidden_in = torch.where(real[..., None], rows_at(hidden, at), 0)
    return tokens, positions, slots, hidden_in, real


@torch.library.custom_op("fdecode::prepare_tree_draft", mutates_args=())
def prepare_tree_draft(
    accepted: torch.Tensor,
    length: torch.Tensor,
    hidden: torch.Tensor,
    base_pos: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
    rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused op (one graph node). See the module docstring for the exact semantics."""
    return prepare_tree_draft_reference(accepted, length, hidden, base_pos, block_tables, block_size, rows)


@prepare_tree_draft.register_fake
def _(accepted, length, hidden, base_pos, block_tables, block_size, rows):
    batch = accepted.shape[0]
    return (
        accepted.new_empty(batch, rows),
        accepted.new_empty(batch, rows),
        accepted.new_empty(batch, rows),
        hidden.new_empty(batch, rows, hidden.shape[-1]),
        accepted.new_empty(batch, rows, dtype=torch.bool),
    )
