"""`fdecode::onednn_linear`: a CPU linear (x @ w^T + b) computed by oneDNN.

On a CPU the step's large linears run few rows (a verify's K + 1, a draft's one or two). For those the BLAS
behind `F.linear` (MKL) streams a weight at a third to a half of what the same weight's read costs, and
oneDNN's matmul (`torch.ops.mkldnn._linear_pointwise`, the kernel Inductor uses for frozen weights) streams
a large weight at 1.6-2.8x that speed at 1 row and 1.7-2.2x at 5-64 rows (measured per weight on the real pair's
shapes with a micro-benchmark since retired, which git history keeps). Inductor
lowers `mkldnn._linear_pointwise` only for constant (frozen, prepacked) weights, and a step's weights are
its graph's inputs, so the call is wrapped in an op of our own that Inductor leaves as an extern call
(`fdecode.backends.cpu.matmul` puts it in place of the matmuls). Eager code (a prefill) reaches it through
`OneDNNLinears`, a mode that sends `F.linear` here wherever `takes` says so.

oneDNN reads the weight as it lies, or, for two rows or more, the copy in its own layout that
`onednn_packed` keeps where `pack_linears` made one (a CPU Inductor step's linears, at `fdecode.compile`):
1.5-2.2x faster again at 2-8 rows (`onednn_packed`; BENCHMARKS.md, "Where a step of the real pair goes").

Registered through `torch.library.Library`, not `torch.library.custom_op`: a step makes hundreds of these
calls, and the lower-level registration costs ~30 us a call against ~55 us (most of it oneDNN's own).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from fdecode.backends.cpu import file_pages, onednn_packed

_lib = torch.library.Library("fdecode", "FRAGMENT")
_lib.define("onednn_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor")


@functools.cache  # asked at every eager F.linear (`OneDNNLinears`); the CPU does not change
def dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes oneDNN's CPU matmul runs here: float32, and bfloat16 where the CPU has the instructions
    (AVX-512 BF16 / AMX, or AVX-NE-CONVERT); without them oneDNN refuses a bfloat16 product, which then
    stays with the BLAS call."""
    return (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)


MIN_BYTES = 2**20  # oneDNN's fixed cost per call (~25 us) is paid back from about here (the same micro-benchmark)


def available() -> bool:
    """Whether this torch build has oneDNN (`torch.backends.mkldnn`)."""
    return torch.backends.mkldnn.is_available()


def takes_weight(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether oneDNN takes this weight and bias: a CPU weight of at least MIN_BYTES, 2-D, contiguous, of a
    dtype oneDNN runs here; a bias of one value per output."""
    return (
        available()
        and weight.dim() == 2
        and weight.is_contiguous()
        and weight.device.type == "cpu"
        and weight.dtype in dtypes()
        and weight.numel() * weight.element_size() >= MIN_BYTES
        and (bias is None or (bias.shape == weight.shape[:1] and bias.dtype == weight.dtype))
    )


def takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether x @ weight^T + bias goes to oneDNN: `takes_weight`, x of the weight's dtype and device, and
    nothing that autograd must see. Tensors or fake tensors (the graph pass asks about a traced graph's
    values)."""
    return (
        takes_weight(weight, bias)
        and x.dtype == weight.dtype
        and x.device == weight.device
        and not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)))
    )


@dataclass(frozen=True)
class Packing:
    """What `pack_linears` did: bytes of packed weights, by where they lie."""

    in_place: int = 0  # in place of checkpoint files' weights (their pages given back): no second copy
    beside: int = 0  # beside weights that are no checkpoint file's bytes (converted, edited ones): a copy
    loaded: int = 0  # of `in_place`, mapped as a former process stored them: nothing packed
    written: int = 0  # of `in_place`, packed now and written to disk (`packed_store`) for the next process

    def __add__(self, other: Packing) -> Packing:
        return Packing(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def __str__(self) -> str:
        gib = 2**30
        loaded = f", {self.loaded / gib:.2f} GiB of it stored by an earlier run" if self.loaded else ""
        return f"{self.in_place / gib:.2f} GiB in place{loaded}, {self.beside / gib:.2f} GiB beside"


def pack_linears(*models: nn.Module) -> Packing:
    """Keeps oneDNN's packed layout (`onednn_packed`) of the weight of every `nn.Linear` in `models` that
    oneDNN takes: in place of a checkpoint file's weight, beside any other."""
    mappings = file_pages.file_mappings() if file_pages.on_linux() else []
    total = Packing()
    for model in models:
        for m in model.modules():
            if isinstance(m, nn.Linear) and takes_weight(m.weight, m.bias):
                done = onednn_packed.pack(m.weight, mappings)
                if done is not None:
                    part = done.nbytes
                    in_place = part * done.in_place
                    total += Packing(in_place, part - in_place, part * done.loaded, part * done.written)
    return total


class OneDNNLinears(TorchFunctionMode):
    """Within: every `F.linear` (so every `nn.Linear`) that `takes` runs as `onednn_linear`; eager code only
    (a compiled step gets the same through its graph pass)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, bias = _linear_args(*args, **kwargs)
            if takes(x, weight, bias):
                return onednn_linear(x, weight, bias)
        return func(*args, **kwargs)


def eager_linears(device_type: str) -> OneDNNLinears | contextlib.nullcontext:
    """`OneDNNLinears` for a CPU model, nothing elsewhere."""
    return OneDNNLinears() if device_type == "cpu" and available() else contextlib.nullcontext()


def _linear_args(input, weight, bias=None):
    return input, weight, bias


def _cpu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    kept = onednn_packed.packed(weight, x.numel() // max(x.shape[-1], 1))
    if kept is not None:
        return onednn_packed.linear(x, kept, bias)
    return torch.ops.mkldnn._linear_pointwise.default(x.contiguous(), weight, bias, "none", [], "")


def _meta(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


_lib.impl("onednn_linear", _cpu, "CPU")
_lib.impl("onednn_linear", _meta, "Meta")

onednn_linear = torch.ops.fdecode.onednn_linear.default
