"""Paged-KV addressing: where the KV of position p of lane b lives.

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
