"""`weight_stationary`: an Inductor pass that runs the linears of a CPU step by oneDNN from the weight as it
lies, and the few-row ones of small weights as weight @ rows^T (docs/design.md, "Prompt lookup: n-gram
drafts").

A weight of at least `onednn_linear.MIN_BYTES` goes to `fdecode::onednn_linear` (`fdecode/backends/cpu/onednn_linear.py`),
whatever the rows: 1.6-2.8x the speed of MKL's `F.linear` at 1-64 rows (at 2 rows the form below is sometimes
faster still, but one row in a step's five forwards is not worth a second rule). Below that size oneDNN's fixed cost per
call (~25 us) outweighs what it saves, and the rest of this docstring applies.

A linear over a few rows lowers to mm(x [M, k], w^T [k, n]). With M = 2 .. 64 rows (a verify's K + 1
per lane) and the CPU's BLAS at one or two threads, that call costs well over one row's matrix-vector
product, which streams the weight once. The same product computed the other way round,
(w [n, k] @ x^T [k, M])^T, streams the weight as the single row does (the product comes out transposed
and is copied back to row-major order, a few rows' worth, by an extern call: `aten._reshape_copy`, see
`_row_major`); a micro-benchmark since retired measured it (git history keeps it). That difference is most of a CPU
verify's price over a one-token step, so the pass rewrites every such mm / addmm in a CPU graph; one row (a matrix-vector product
already) and more than `MAX_ROWS` rows are left alone. The result is the same product: only the
summation order inside the BLAS call may differ, by float rounding.

A weight under `STATIONARY_BYTES` is left alone too: it stays in the core's cache whatever the order, so
there is nothing to stream, while the copy back is one more extern call from Inductor's Python wrapper
(`bench/small_linears.py`: the weight-first form took 1.6-1.8x mm's time at 4-32 rows and weights of
4-64 KiB; docs/host-time.md). A tiny weight (under `FUSED_BYTES`) over few rows (rows x weight bytes at
most `FUSED_WORK`) is not a BLAS call at all: the product is written as the sum over k of
x[:, None, :] * w[None], a reduction Inductor fuses into the C++ kernels around it, which saves the extern
call, its output buffer and its views (0.72-0.96x mm's time there). A 1-layer, 32-wide model's step has
~30 such linears; a real model has none, and a graph of larger weights is unchanged.

Only the CPU's Inductor graphs get it (`fdecode.graphs.backends.capture`): GPU and NPU matmul
libraries pick their own tiles for few rows.
"""

from __future__ import annotations

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from fdecode.backends.cpu import onednn_linear

aten = torch.ops.aten
MAX_ROWS = 64  # a verify of 16 lanes at K = 3; no slower than mm(x, w^T) up to here (a micro-benchmark since retired)
STATIONARY_BYTES = 128 * 1024  # smaller weights keep mm(x, w^T): the copy back costs more (bench/small_linears.py)
FUSED_BYTES = 16 * 1024  # smaller weights: a reduction in Inductor's C++ kernels, no extern call (same script),
FUSED_WORK = 128 * 1024  # where rows x weight bytes is at most this (past it the BLAS call is faster)
TRANSPOSES = (aten.permute.default, aten.t.default)


def _rows(node: torch.fx.Node) -> int | None:
    value = node.meta.get("val")
    if value is None or value.dim() != 2 or value.device.type != "cpu":
        return None
    rows = value.shape[0]
    return rows if isinstance(rows, int) else None


def _weight(node: torch.fx.Node) -> torch.fx.Node | None:
    """w where `node` is w^T, a transpose of a 2-D tensor, else None."""
    if node.op != "call_function" or node.target not in TRANSPOSES:
        return None
    if node.target is aten.permute.default and list(node.args[1]) != [1, 0]:
        return None
    return node.args[0]


def _call(graph: torch.fx.Graph, op, *args) -> torch.fx.Node:
    """A new node computing op(*args), with the fake value Inductor's lowering reads."""
    node = graph.call_function(op, args)
    node.meta["val"] = op(*(a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args))
    return node


def _row_major(graph: torch.fx.Graph, product: torch.fx.Node) -> torch.fx.Node:
    """product [n, m] -> its transpose [m, n] copied to row-major order, by an ATen call Inductor neither lowers
    nor fuses (`_reshape_copy` has no Inductor lowering or decomposition: an implicit fallback).

    Why not a fused copy: Inductor 2.13's C++ kernels read the transposed products wrongly once several are
    fused with their consumers (a DeepSeek-shaped model's logits differed from eager with residual-stream
    products rewritten; right with `cpp.simdlen=1`; tests/test_cpu_matmul.py). Why not a Python custom op
    (the first version): its per-call dispatch cost over a step's hundreds of linears; this call is the
    copy alone."""
    transposed = _call(graph, aten.permute.default, product, [1, 0])  # a strided view
    return _call(graph, aten._reshape_copy.default, transposed, list(transposed.meta["val"].shape))  # row-major


def _value(node: object) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _bytes(node: torch.fx.Node) -> int | None:
    value = _value(node)
    return None if value is None else value.numel() * value.element_size()


def _form(rows: int, weight: torch.fx.Node) -> str | None:
    """How a product of `rows` rows and a weight below oneDNN's size runs: "fused" (a tiny weight and few rows),
    "stationary" (weight @ rows^T) or None (Inductor's mm, as traced)."""
    size = _bytes(weight)
    if size is None or rows > MAX_ROWS:
        return None
    if size < FUSED_BYTES and rows * size <= FUSED_WORK:
        return "fused"
    return "stationary" if rows >= 2 and size >= STATIONARY_BYTES else None


def _onednn(x: torch.fx.Node, weight: torch.fx.Node, bias: torch.fx.Node | None) -> bool:
    """Whether oneDNN takes this product (`onednn_linear.takes` on the traced values)."""
    xv, wv, bv = _value(x), _value(weight), _value(bias)
    return xv is not None and wv is not None and (bias is None or bv is not None) and onednn_linear.takes(xv, wv, bv)


def _product(
    graph: torch.fx.Graph, x: torch.fx.Node, weight: torch.fx.Node, bias: torch.fx.Node | None, form: str
) -> torch.fx.Node:
    """x @ weight^T (+ bias), row-major, in `form`: by oneDNN (a large weight, `_onednn`), as (weight @ x^T)^T
    ("stationary") or as the sum over k of x[:, None, :] * weight[None] ("fused": a reduction Inductor writes
    into the C++ kernels around it)."""
    if form == "onednn":
        return _call(graph, onednn_linear.onednn_linear, x, weight, bias)
    if form == "fused":
        rows = _call(graph, aten.unsqueeze.default, x, 1)  # [M, 1, k]
        products = _call(graph, aten.mul.Tensor, rows, _call(graph, aten.unsqueeze.default, weight, 0))  # [M, n, k]
        out = _call(graph, aten.sum.dim_IntList, products, [2])
    else:
        xt = _call(graph, aten.permute.default, x, [1, 0])  # a strided view: the BLAS call reads it
        out = _row_major(graph, _call(graph, aten.mm.default, weight, xt))  # row-major, as traced
    return out if bias is None else _call(graph, aten.add.Tensor, out, bias)


class WeightStationary(CustomGraphPass):
    """Rewrites mm(x, w^T) / addmm(b, x, w^T) as onednn_linear(x, w, b) for a large w; for up to MAX_ROWS rows,
    as a fused reduction for a w under FUSED_BYTES (rows x bytes up to FUSED_WORK) and as (w @ x^T)^T (+ b) for
    2 rows or more and a w of at least STATIONARY_BYTES; the rest stays mm."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
                continue
            bias, x, wt = (None, *node.args[:2]) if node.target is aten.mm.default else node.args[:3]
            if node.kwargs or not isinstance(x, torch.fx.Node) or not isinstance(wt, torch.fx.Node):
                continue
            rows, weight = _rows(x), _weight(wt)
            if weight is None or rows is None:
                continue
            onednn = _onednn(x, weight, bias)
            form = "onednn" if onednn else _form(rows, weight)
            if form is None:
                continue
            with graph.inserting_before(node):
                out = _product(graph, x, weight, bias, form)
            node.replace_all_uses_with(out)
            graph.erase_node(node)
        graph.eliminate_dead_code()

    def uuid(self) -> str:
        return f"fdecode-weight-stationary-{MAX_ROWS}-{STATIONARY_BYTES}-onednn-{onednn_linear.MIN_BYTES}-{FUSED_BYTES}-{FUSED_WORK}-v7"


weight_stationary = WeightStationary()
