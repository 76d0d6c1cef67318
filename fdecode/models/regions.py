"""Compile each repeated decoder layer once inside the one step graph (hierarchical compilation)
(docs/design.md, "Compile regions: each layer kind compiled once").

`call_layer` runs a layer through `torch.compiler.nested_compile_region`: under `torch.compile` the
first call of each distinct layer (module structure, input shapes, dtypes, strides) is compiled once,
and every later call of the same kind is one `invoke_subgraph` node calling that code, instead of
layers x (K + 1) unrolled copies. The captured step is still one graph; in eager mode (the `eager`
backend, prefill) the region is a plain call. Reuse needs identical inputs, so a layer's place in
the KV leaf is a [1] int64 tensor (`layer_indices`), not a Python int. flash-attn, the NPU kernel and
the NPU's "scatter_nd" write need an int, so with them layers run unrolled, as they do with
`DecodeConfig.layer_regions=False`; `PagedContext.regions` says which applies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from fdecode.ops.attention import PagedContext

if TYPE_CHECKING:
    from fdecode.drafts.base import Drafter

# `DecodeConfig.layer_regions="auto"` uses regions from this many layer copies per step: a region call
# costs host time in Inductor's CPU wrapper, which few copies do not win back in compile time, and many
# do (`python bench/cold_start.py --modes regions unrolled`: compile time and step time of both; BENCHMARKS.md,
# "Cold start and warm-up").
AUTO_MIN_COPIES = 12
# Distinct layer kinds one region may compile in one graph before torch refuses (its reuse cache). A step
# sees a handful: the target's layers at K + 1 rows, the draft's at 2 rows and at 1, dense and MoE
# layers, attention and linear-attention layers, MTP layers.
MAX_KINDS = 64


def _compile_region(fn):
    """`torch.compiler.nested_compile_region` with room for `MAX_KINDS` kinds. Torch before 2.13 (the image of
    the GPU machine the device checks run on has 2.11) takes no cap: there the region keeps its own default."""
    try:
        return torch.compiler.nested_compile_region(max_reuse_entries=MAX_KINDS)(fn)
    except TypeError:
        return torch.compiler.nested_compile_region(fn)


@_compile_region
def _region(layer: nn.Module, ctx_at: int, *args, **kwargs):
    if ctx_at >= 0:  # the layer's `PagedContext` came in as its fields (`call_layer`)
        size = len(PagedContext._fields)
        args = (*args[:ctx_at], PagedContext(*args[ctx_at : ctx_at + size]), *args[ctx_at + size :])
    return layer(*args, **kwargs)


def decoder_layers(model: nn.Module) -> int:
    """The decoder layers `model` holds: its `layers`, else one `layer`, else none."""
    if hasattr(model, "layers"):
        return len(model.layers)
    return 1 if hasattr(model, "layer") else 0


def layer_copies(target: nn.Module, draft: nn.Module, drafter: Drafter, k: int) -> int:
    """Decoder-layer calls in one step: the target's layers once, the draft's K times (each draft forward runs
    `Drafter.layers_per_forward`: an MTP head one layer, an n-gram draft none)."""
    return decoder_layers(target) + k * drafter.layers_per_forward(draft)


def resolve_regions(setting: bool | str, target: nn.Module, draft: nn.Module, drafter: Drafter, k: int) -> bool:
    """`DecodeConfig.layer_regions` as a bool: "auto" is True from `AUTO_MIN_COPIES` layer copies a step."""
    if setting == "auto":
        return layer_copies(target, draft, drafter, k) >= AUTO_MIN_COPIES
    return bool(setting)


def shares_parameters(first: nn.Module, second: nn.Module) -> bool:
    """Whether two models hold a parameter in common (a model drafting for itself). Regions of the second
    must then run unrolled: when a module's parameters reach the graph under two names (`target.*` and
    `draft.*`), torch 2.13's region reuse binds a reused region to another layer's parameters (seen: the
    draft's layer 1 computed with layer 0's weights, losslessly verified but rarely accepted)."""
    if first is second:
        return True
    seen = {id(p) for p in first.parameters()}
    return any(id(p) in seen for p in second.parameters())


def compiling_regions(regions: bool) -> bool:
    """Whether layers run as compile regions now: asked for, and inside a `torch.compile` trace."""
    return regions and torch.compiler.is_compiling()


def call_layer(layer: nn.Module, regions: bool, *args, **kwargs):
    """`layer(*args, **kwargs)`, as a compile region where `regions` (`PagedContext.regions`).

    A region's arguments go in flat: its `PagedContext` as the context's fields (tensors and constants),
    rebuilt inside. Dynamo matches a call against the regions it has traced by its arguments; with a
    named tuple among them it flattens them by tracing `pytree.tree_flatten`, ~0.1 s a call (14 of a
    real-pair graph's ~17 s of Dynamo trace, 124 calls), and flat leaves cost it next to nothing."""
    if compiling_regions(regions):
        for at, arg in enumerate(args):  # a loop, not a generator: Dynamo traces it at every call
            if isinstance(arg, PagedContext):
                return _region(layer, at, *args[:at], *arg, *args[at + 1 :], **kwargs)
        return _region(layer, -1, *args, **kwargs)
    return layer(*args, **kwargs)


def layer_indices(count: int, regions: bool, device: torch.device) -> torch.Tensor | range:
    """Layers 0..count-1's indices into a KV leaf: inside compile regions a [count, 1] int64 tensor whose
    row i is layer i's [1] index (one region serves every layer), else the ints. One `arange` makes them
    all, and each row is a view of it: a tensor made per layer (`torch.tensor([i])`) is a kernel of its
    own, one C++ build each in a cold CPU compile (27 of the real pair's 55 kernels were such constants)."""
    return torch.arange(count, device=device).view(count, 1) if compiling_regions(regions) else range(count)
