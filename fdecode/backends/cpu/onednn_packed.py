"""oneDNN's own layout of a CPU linear weight, kept for `fdecode::onednn_linear`, in place of the weight
where the weight is a checkpoint file's bytes.

`fdecode::onednn_linear` hands oneDNN the weight as it lies (row-major, `[out, in]`), and oneDNN reorders it
into its blocked layout as it streams it, at every call. `torch.ops.mkldnn._reorder_linear_weight` makes
that reordered copy once (it is what Inductor bakes into a graph whose weights are frozen constants). A
step's weights are its graphs' inputs, not constants, so `pack` keeps the copy here instead, keyed by the
weight, and `onednn_linear` uses it wherever one is kept. Measured on the real pair's shapes, one weight
after another so that no cache holds them (a micro-benchmark since retired, which git history keeps; the real
pair's forwards packed and not: BENCHMARKS.md, "Where a step of the real pair goes"): a packed weight streams
1.5-2.2x as fast at 2-8 rows, ~1.35x at 16 and ~1.1x at 64, but at one row 2-15 % slower than the weight
as it lies, so a one-row product (`MIN_ROWS`) keeps the plain call where the weight is kept too.
`onednn_linear.pack_linears` packs a step's models' large linear weights when `fdecode.compile` makes an
Inductor step on the CPU (`DecodeConfig.pack_weights`).

One copy or two. A weight that is still the bytes of a checkpoint file the process maps (what `from_hf`
of a folder loads: `file_pages.file_backed`) is packed *in place*: its packed layout is kept on disk
(`packed_store`, mapped, so a later process packs nothing) and the original's pages are given back
(`file_pages.release`); every product then reads the packed layout, and whatever else reads the original
gets it from the file again. Any other weight (converted, dequantized, edited since it was read) keeps its
packed copy *beside* it in memory: a second copy. A copy follows its weight: it is dropped when the weight
is freed (`weakref.finalize`), and made again when the weight is changed in place (its version counter
moves: `load_state_dict`, `copy_`, an optimizer's step), so a stale copy is never used. One write goes
unseen: through `weight.data` (`weight.data.copy_(...)`), which autograd's version counter does not see
either; call `repack` after one. Inference tensors (made under `torch.inference_mode`) have no version
counter and are not packed.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

from fdecode.backends.cpu import file_pages, packed_store

MIN_ROWS = 2  # a product of fewer rows reads the weight as it lies: at one row that is faster (see above)


@dataclass
class _Packed:
    version: int  # the weight's `_version` when packed
    weight: torch.Tensor  # oneDNN's layout of it
    holders: set[int] = field(default_factory=set)  # ids of the live tensors packed under this key
    memory: torch.Tensor | None = None  # the stored file's mapped bytes `weight` lies in (`packed_store`)
    in_place: bool = False  # the original's pages given back: every product reads `weight`


@dataclass(frozen=True)
class Packed:
    """What `pack` did with one weight."""

    nbytes: int  # the packed layout's bytes
    in_place: bool  # True: in place of the original (a checkpoint file's bytes); False: beside it
    loaded: bool  # mapped from `packed_store` as a former process stored it: nothing packed
    written: bool  # packed now and written to `packed_store`


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


def pack(weight: torch.Tensor, mappings: list | None = None) -> Packed | None:
    """Keeps oneDNN's layout of `weight` (a 2-D CPU tensor), in place of it where it is a checkpoint file's
    bytes (see the module's docstring), else beside it. None: kept already, an inference tensor, or a
    dtype this CPU's oneDNN cannot pack, such as bfloat16 without AVX-512 (those run as they lie).
    Tensors that view one weight (two steps sharing a model's parameters) share one copy, kept while any of
    them lives. mappings: `file_pages.file_mappings()`, read once for many weights."""
    if weight.is_inference():
        return None
    key = _key(weight)
    kept, done = _KEPT.get(key), None
    if kept is None:
        source = file_pages.file_backed(weight, mappings)
        stored = packed_store.load(source, weight) if source is not None else None
        if stored is None:
            try:
                made = _reorder(weight)
            except RuntimeError:  # "bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"
                return None
            # The first process stores what it packed and maps it back, as a later one will: one copy, on disk.
            mapped = packed_store.save(source, weight, made) if source is not None else None
            layout, memory = mapped if mapped is not None else (made, None)
        else:
            layout, memory = stored
        if source is not None:
            file_pages.release(weight)
        kept = _KEPT[key] = _Packed(weight._version, layout, memory=memory, in_place=source is not None)
        nbytes = weight.numel() * weight.element_size()
        done = Packed(nbytes, source is not None, stored is not None, stored is None and memory is not None)
    if id(weight) not in kept.holders:
        kept.holders.add(id(weight))
        weakref.finalize(weight, _release, key, id(weight))
    return done


def packed(weight: torch.Tensor, rows: int = MIN_ROWS) -> torch.Tensor | None:
    """oneDNN's layout of `weight` for a product of `rows` rows, if `pack` keeps one (made again first if the
    weight changed), else None: also for fewer than `MIN_ROWS` rows where the original is kept beside."""
    kept = _KEPT.get(_key(weight))
    if kept is None or (rows < MIN_ROWS and not kept.in_place):
        return None
    if kept.version != weight._version:  # changed since: packed again in memory, from the weight as it is now
        kept.version, kept.weight, kept.memory, kept.in_place = weight._version, _reorder(weight), None, False
    return kept.weight


def kept_bytes() -> int:
    """Bytes of the packed layouts kept now, in memory or mapped from disk."""
    return sum(p.weight.numel() * p.weight.element_size() for p in _KEPT.values())


def in_place(weight: torch.Tensor) -> bool:
    """Whether `weight`'s packed layout is kept in place of it (its pages given back)."""
    kept = _KEPT.get(_key(weight))
    return kept is not None and kept.in_place


def repack(model: nn.Module) -> None:
    """Has the packed copies of `model`'s weights made again at their next use (`packed`): after writing a
    weight through `weight.data`."""
    for param in model.parameters():
        kept = _KEPT.get(_key(param))
        if kept is not None:
            kept.version = _STALE


def read_original_at_one_row(*models: nn.Module) -> None:
    """Has one-row products of `models`' weights read the original where its packed layout is kept in place of
    it, as they do where the layout is kept beside: the original's pages then come back from the file. What
    in place saves at one row, measured (bench/weights_memory.py, "rows"); the products are the same."""
    for model in models:
        for param in model.parameters():
            kept = _KEPT.get(_key(param))
            if kept is not None:
                kept.in_place = False


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight^T + bias from a packed `weight` (what `packed` returns)."""
    return torch.ops.mkldnn._linear_pointwise.default(x.contiguous(), weight, bias, "none", [], "")
