"""oneDNN's own layout of a CPU linear weight, kept beside the weight for `fdecode::onednn_linear`.

`fdecode::onednn_linear` hands oneDNN the weight as it lies (row-major, `[out, in]`), and oneDNN reorders it
into its blocked layout as it streams it, at every call. `torch.ops.mkldnn._reorder_linear_weight` makes
that reordered copy once (it is what Inductor bakes into a graph whose weights are frozen constants). A
step's weights are its graphs' inputs, not constants, so `pack` keeps the copy here instead, keyed by the
weight, and `onednn_linear` uses it wherever one is kept. Measured on the real pair's shapes, one weight
after another so that no cache holds them (a micro-benchmark since retired, which git history keeps; the real
pair's forwards packed and not: BENCHMARKS.md, "Where a step of the real pair goes"): a packed weight streams
1.5-2.2x as fast at 2-8 rows, ~1.35x at 16 and ~1.1x at 64, but at one row 2-15 % slower than the weight
as it lies, so a one-row product (`MIN_ROWS`) keeps the plain call. `onednn_linear.pack_linears` packs a step's models'
large linear weights when `fdecode.compile` makes an Inductor step on the CPU (`DecodeConfig.pack_weights`).

The cost is memory: a second copy of every packed weight. A copy follows its weight: it is dropped when the
weight is freed (`weakref.finalize`), and made again when the weight is changed in place (its version
counter moves: `load_state_dict`, `copy_`, an optimizer's step), so a stale copy is never used. One write
goes unseen: through `weight.data` (`weight.data.copy_(...)`), which autograd's version counter does not
see either; call `repack` after one. Weights that are inference tensors (made under
`torch.inference_mode`) have no version counter and are not packed.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

MIN_ROWS = 2  # a product of fewer rows reads the weight as it lies: at one row that is faster (see above)


@dataclass
class _Packed:
    version: int  # the weight's `_version` when packed
    weight: torch.Tensor  # oneDNN's layout of it
    holders: set[int] = field(default_factory=set)  # ids of the live tensors packed under this key


_KEPT: dict[tuple, _Packed] = {}
_STALE = -1  # a version no tensor has: `packed` makes the copy again


def _key(weight: torch.Tensor) -> tuple:
    return weight.data_ptr(), weight.shape, weight.dtype


def _reorder(weight: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def _release(key: tuple, holder: int) -> None:
    kept = _KEPT.get(key)
    if kept is not None:
        kept.holders.discard(holder)
        if not kept.holders:
            del _KEPT[key]


def pack(weight: torch.Tensor) -> int:
    """Keeps oneDNN's layout of `weight` (a 2-D CPU tensor); returns the bytes it added (0: kept already, an
    inference tensor, or a dtype this CPU's oneDNN cannot pack, such as bfloat16 without AVX-512: those run
    as they lie). Tensors that view one weight (two steps sharing a model's parameters) share one copy, kept
    while any of them lives."""
    if weight.is_inference():
        return 0
    key = _key(weight)
    kept, added = _KEPT.get(key), 0
    if kept is None:
        try:
            kept = _KEPT[key] = _Packed(weight._version, _reorder(weight))
        except RuntimeError:  # "bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"
            return 0
        added = weight.numel() * weight.element_size()
    if id(weight) not in kept.holders:
        kept.holders.add(id(weight))
        weakref.finalize(weight, _release, key, id(weight))
    return added


def packed(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's layout of `weight` if `pack` keeps one (made again first if the weight changed), else None."""
    kept = _KEPT.get(_key(weight))
    if kept is None:
        return None
    if kept.version != weight._version:
        kept.version, kept.weight = weight._version, _reorder(weight)
    return kept.weight


def kept_bytes() -> int:
    """Bytes of the packed copies kept now."""
    return sum(p.weight.numel() * p.weight.element_size() for p in _KEPT.values())


def repack(model: nn.Module) -> None:
    """Has the packed copies of `model`'s weights made again at their next use (`packed`): after writing a
    weight through `weight.data`."""
    for param in model.parameters():
        kept = _KEPT.get(_key(param))
        if kept is not None:
            kept.version = _STALE


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight^T + bias from a packed `weight` (what `packed` returns)."""
    return torch.ops.mkldnn._linear_pointwise.default(x.contiguous(), weight, bias, "none", [], "")
