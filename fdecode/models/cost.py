"""What a model's forward costs in weights read: the measure an adaptive Engine starts its depth costs from
(`fdecode.runtime.depth.depth_costs`)."""

from __future__ import annotations

import torch


def forward_bytes(model: torch.nn.Module) -> int:
    """The bytes of weights one forward reads: every parameter once, less the embedding tables, of which
    a forward gathers a few rows (unless the table is also a linear layer's weight: a tied head)."""
    linears = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    gathered = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)} - linears
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in gathered)
