"""The k largest entries of the last dimension, cheaper than `torch.topk` at real vocabularies.

`torch.topk` over V = 151,936 is a partial sort per row, on the CPU an ATen call that no compiler
fuses. `topk` reads the row once for the maxima of its blocks of `BLOCK` entries (one reduction,
which Inductor generates code for), then runs `torch.topk` on those maxima and on the k best blocks
only. The k largest entries lie in the k blocks with the largest maxima: an entry of any other block
has k block maxima, k distinct entries, at least as large. So the result equals `torch.topk`'s, values
and ids, but where entries tie (equal values may come back in another order, or another of the tied
ids at the k-th place). Used where V is a multiple of `BLOCK` (real vocabularies are padded to one)
and has at least `MIN_BLOCKS` blocks; elsewhere it is `torch.topk`.
"""

from __future__ import annotations

import torch

BLOCK = 128
MIN_BLOCKS = 32  # below 4,096 entries one torch.topk costs little


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, ids) of the `k` largest entries of `x`'s last dimension, sorted descending, as torch.topk."""
    size = x.shape[-1]
    blocks = size // BLOCK
    if size % BLOCK or blocks < max(MIN_BLOCKS, k) or k == 0:
        return torch.topk(x, k, dim=-1)
    rows = x.reshape(*x.shape[:-1], blocks, BLOCK)
    _, best = torch.topk(rows.amax(dim=-1), k, dim=-1)  # [..., k] the blocks holding the k largest
    candidates = rows.gather(-2, best[..., None].expand(*best.shape, BLOCK)).flatten(-2)  # [..., k * BLOCK]
    values, index = torch.topk(candidates, k, dim=-1)
    return values, best.gather(-1, index // BLOCK) * BLOCK + index % BLOCK
