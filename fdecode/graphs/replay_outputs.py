"""Take a CUDA graph replay's outputs out of the graph's memory pool (docs/design.md, "Backends and kernels").

CUDA graph trees (the `cudagraphs` backend) return outputs that live in the graphs' private memory pool. In
inference each call of a compiled function starts a new generation, and the next call overwrites what the last
one returned: the state a step returns is exactly what the next step reads, and the host reads a step's output
one step behind. So the outputs are copied into ordinary allocations right after the call, all in one
`torch._foreach_copy_` launch on the device's stream: no sync, and the next replay copies its inputs from
there into its own placeholders, as it does for any input that is not a static address. Leaves that are inputs
the graph wrote in place (the KV pools, static addresses) come back as those inputs, and are kept as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch.utils import _pytree as pytree


def owned_outputs(inputs: object, outputs: object) -> object:
    """`outputs` (any pytree) with every tensor leaf that does not share storage with a tensor of `inputs`
    replaced by a copy outside the graph pool; a tensor reached twice is copied once."""
    kept = {t.untyped_storage().data_ptr() for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)}
    kept.discard(0)  # tensors without elements have no storage to share
    leaves, spec = pytree.tree_flatten(outputs)
    copies: dict[int, torch.Tensor] = {}
    sources, targets = [], []
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor) or id(leaf) in copies or leaf.untyped_storage().data_ptr() in kept:
            continue
        copies[id(leaf)] = torch.empty_like(leaf)
        sources.append(leaf)
        targets.append(copies[id(leaf)])
    if targets:
        torch._foreach_copy_(targets, sources)
    return pytree.tree_unflatten([copies.get(id(leaf), leaf) for leaf in leaves], spec)


def owning_outputs(compiled: Callable) -> Callable:
    """`compiled` (a `mode="reduce-overhead"` compilation), returning `owned_outputs` of its arguments."""

    @functools.wraps(compiled)
    def call(*args):
        return owned_outputs(args, compiled(*args))

    return call
