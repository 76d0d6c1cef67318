"""`fdecode.inspect`: what a step captures, for graph-capture tests.

The step is traced by Dynamo (without `fullgraph`, so breaks are counted rather
than raised) and lowered by AOTAutograd to ATen, the level every backend
(inductor, CUDA graphs, torchair) starts from. The report counts graphs, breaks,
ops by qualified name, and the nodes that force a device -> host sync. Since
torch 2.10 `fullgraph=True` accepts `.item()` and `nonzero` (scalar outputs are
captured), so syncs are found by scanning the graph, not by trusting capture.

Inspection runs on a clone of the state: the caller's state is not consumed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import make_boxed_func

from fdecode.graphs.compile import fresh_code
from fdecode.state import DecodeState
from fdecode.step import decode_step

# ATen ops whose kernels read a device value on the host (scalar reads, data-dependent output shapes).
SYNC_OPS = frozenset(
    {
        "aten::_local_scalar_dense",
        "aten::item",
        "aten::nonzero",
        "aten::nonzero_static",
        "aten::masked_select",
        "aten::_unique2",
        "aten::unique_consecutive",
        "aten::unique_dim",
        "aten::is_nonzero",
        "aten::equal",
        "aten::allclose",
        "aten::repeat_interleave",
        "aten::multinomial",
    }
)
# Tensor methods that sync when they appear in the Dynamo graph.
SYNC_METHODS = frozenset({"item", "tolist", "nonzero", "cpu", "numpy", "__bool__", "__int__", "__float__"})


@dataclass(frozen=True)
class GraphReport:
    backend: str  # what the step runs with; the captured graph itself is backend-independent
    context: int  # attention window (tokens) of the inspected graph: one of `step.buckets`
    graph_count: int
    graph_break_count: int
    break_reasons: list[str]
    op_counts: dict[str, int]  # qualified op name ("aten::index_copy", "fdecode::prepare_next_draft") -> count
    host_syncs: list[str]  # nodes that force a device -> host sync
    graphs: list[torch.fx.GraphModule] = field(repr=False)  # the ATen graphs

    @property
    def overload_counts(self) -> dict[str, int]:
        """Nodes per op overload ("aten.index_put.default", "fdecode.prepare_next_draft.default")."""
        counts: Counter[str] = Counter()
        for gm in self.graphs:
            for node in gm.graph.nodes:
                op = node_op(node)
                if op is not None:
                    counts[str(op)] += 1
        return dict(counts)

    def __repr__(self) -> str:
        top = ", ".join(f"{k}: {v}" for k, v in sorted(self.op_counts.items()) if not k.startswith("aten::"))
        return (
            f"GraphReport(backend={self.backend!r}, context={self.context}, graph_count={self.graph_count}, "
            f"graph_break_count={self.graph_break_count}, host_syncs={self.host_syncs}, "
            f"aten_ops={sum(v for k, v in self.op_counts.items() if k.startswith('aten::'))}, custom_ops={{{top}}})"
        )


def node_op(node: torch.fx.Node) -> torch._ops.OpOverload | None:
    """The op overload an ATen-graph node calls, or None (placeholders, getitem, ...). A mutating custom
    op, functionalized into `auto_functionalized(op, ...)`, counts as the op itself."""
    if node.op != "call_function":
        return None
    target = node.target
    if getattr(target, "name", lambda: None)() in ("auto_functionalized", "auto_functionalized_v2"):
        target = node.args[0]
    return target if hasattr(target, "_schema") else None


def inspect(step, state: DecodeState, *, context: int | None = None) -> GraphReport:
    """Trace `step` on a clone of `state` and report what it captures.

    context: which attention window's graph (tokens, one of `step.buckets`); None: the one `step`
    would run for `state`.
    """
    cfg = step.config
    if context is None:
        blocks = cfg.bucket_for(state.max_position)
    elif context in step.buckets:
        blocks = context // cfg.block_size
    else:
        raise ValueError(f"context {context} is not one of this step's windows {step.buckets}")
    dynamo_graphs: list[torch.fx.GraphModule] = []
    aten_graphs: list[torch.fx.GraphModule] = []

    def keep_aten(gm: torch.fx.GraphModule, _inputs):
        aten_graphs.append(gm)
        return make_boxed_func(gm.forward)

    lower = aot_autograd(fw_compiler=keep_aten)

    def capture(gm: torch.fx.GraphModule, example_inputs):
        dynamo_graphs.append(gm)
        return lower(gm, example_inputs)

    def traced(state):
        return decode_step(step.target, step.draft, cfg, state, context_blocks=blocks)

    # A fresh code object per call: repeated inspections neither hit an old trace nor count as
    # recompiles of the user's step.
    fresh = fresh_code(traced, "fdecode_inspect")
    breaks_before = Counter(counters["graph_break"])
    with torch.no_grad():
        torch.compile(fresh, backend=capture, fullgraph=False, dynamic=False)(state.clone())
    new_breaks = Counter(counters["graph_break"]) - breaks_before

    op_counts: Counter[str] = Counter()
    syncs: list[str] = []
    for gm in aten_graphs:
        for node in gm.graph.nodes:
            op = node_op(node)
            if op is None:
                continue
            name = op._schema.name
            op_counts[name] += 1
            if name in SYNC_OPS:
                syncs.append(f"{name} ({node.name})")
    for gm in dynamo_graphs:
        for node in gm.graph.nodes:
            if node.op == "call_method" and node.target in SYNC_METHODS:
                syncs.append(f"Tensor.{node.target} ({node.name})")
    return GraphReport(
        backend=step.backend,
        context=blocks * cfg.block_size,
        graph_count=len(dynamo_graphs),
        graph_break_count=max(len(dynamo_graphs) - 1, sum(new_breaks.values())),
        break_reasons=sorted(new_breaks),
        op_counts=dict(op_counts),
        host_syncs=syncs,
        graphs=aten_graphs,
    )
