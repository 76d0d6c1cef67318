"""Paged-KV addressing: where the KV of position p of lane b lives (docs/design.md, "Invariants").

    slot(b, p) = block_tables[b, p // bs] * bs + p % bs
    slot(b, p) = 0 (scratch) if p < 0, p // bs >= max_blocks, or the block id < 0

Block 0 of every pool is the scratch block: writes that must not land anywhere
(inactive lanes, redirected repair rows, positions past a lane's blocks) go to
slot 0, which no lane ever reads as a real key.
"""

from __future__ import annotations

import torch


def slot_of(block_tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat KV slot of each position.

    block_tables: [B, max_blocks] int64, -1 = unallocated
    positions:    [B, Q] int64 (any values; out-of-range ones map to the scratch slot)
    returns:      [B, Q] int64
    """
    max_blocks = block_tables.shape[1]
    block_idx = torch.div(positions, block_size, rounding_mode="floor")
    in_range = (positions >= 0) & (block_idx < max_blocks)
    block = block_tables.gather(1, block_idx.clamp(0, max_blocks - 1))
    ok = in_range & (block >= 0)
    return torch.where(ok, block * block_size + positions % block_size, torch.zeros_like(positions))


def window_columns(block_tables: torch.Tensor, blocks: int | torch.Tensor | None) -> torch.Tensor:
    """The first `blocks` columns of the block tables, [B, blocks]: the attention window (None: all).

    blocks may also be a [n, 0] tensor whose length n is the window: what the one graph of every window
    takes (`fdecode.graphs.compile.Step`), n a symbolic size there. Then the columns are gathered, not
    sliced: a slice's strides tell the whole lane (contiguous) from a narrower window (strided), which
    the graph would guard on and compile again for the last window."""
    if blocks is None:
        return block_tables
    if isinstance(blocks, torch.Tensor):
        return block_tables.index_select(1, torch.arange(blocks.shape[0], device=block_tables.device))
    return block_tables[:, :blocks]
