"""`fdecode.inspect`: what a step captures, for graph-capture tests (docs/design.md, "Invariants").

The step is traced by Dynamo (without `fullgraph`, so breaks are counted rather
than raised) and lowered by AOTAutograd to ATen. The report counts graphs, breaks,
ops by qualified name, and the nodes that force a device -> host sync (found by
scanning the graph, not by trusting capture). Ops of nested compile regions
(`fdecode.models.regions`) are counted as executed; `GraphReport.regions` says how
many distinct subgraphs were compiled and how often each is called.

Inspection copies nothing: it traces the step on fake tensors of the state's shapes,
strides, dtypes and devices, so no second KV pool is allocated, no kernel runs, and
the caller's state is neither written nor consumed. What the step's real backend did
(recompiles, CUDA-graph skips) is read from Dynamo's records of the step's own graphs,
and the process's counters (`torch._dynamo.utils.counters`) are reported alongside.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters, get_compilation_metrics
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from fdecode.graphs.pure import fresh_code, pure_step, window_width
from fdecode.graphs.schedule import requested_depth
from fdecode.ops.plan import SamplingPlan
from fdecode.state import DecodeState
from fdecode.state.decode_state import map_leaves

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
    """What `inspect` found. The captured graph (graph_count .. host_syncs, graphs) is backend-independent;
    recompiles .. counters say what the step's real backend did.

    backend: what the step runs with.
    context: attention window (tokens) of the inspected graph, one of `step.buckets`.
    dynamic_window: the graph serves every window of 2 blocks or more (its width a symbolic size); it was
        traced with `context`'s width as the example.
    plan: name of the inspected graph's sampling plan (`fdecode.ops.plan`), one of `step.plans`.
    graph_count, graph_break_count, break_reasons: Dynamo graphs of the traced step, breaks between them.
    op_counts: qualified op name ("aten::index_put", "fdecode::prepare_next_draft") -> nodes executed per
        run (a compile region's nodes once per call).
    host_syncs: nodes that force a device -> host sync.
    regions: compile regions (`invoke_subgraph`, `fdecode.models.regions`): subgraph name -> calls. Each
        name is code compiled once; {} where every layer copy is unrolled.
    recompiles: how many times Dynamo compiled the step's real graphs for this window again after the
        first compile (guard failures), summed over the window's graphs (one per sampling plan where
        the step has several); 0 for eager or graphs not yet run. Read from Dynamo's cache of the
        step's own code objects, so other steps and functions never count.
    recompile_reasons: the guard failure behind each recompile (where Dynamo's recent compilation
        records still hold it).
    cudagraph_skips: why CUDA graph replay was skipped for the step's graphs ("skipping cudagraphs
        due to ..."), one entry per skipped graph; empty where every graph replays (or none is CUDA-graphed).
    counters: process-wide counts from `torch._dynamo.utils.counters` and the CUDA-graph trees, all
        compiled code in this process up to this inspection (its own tracing excluded): "unique_graphs"
        (Dynamo graphs compiled), "graph_breaks", "cudagraph_skips" (also those of CPU graphs, whose
        reason Inductor does not record), "cudagraph_rerecords" (unexpected CUDA graph re-recordings).
    graphs: the ATen graphs (not in the repr).
    aten_ops, custom_ops (properties): ATen nodes in all, nodes per non-ATen op.
    """

    backend: str
    context: int
    dynamic_window: bool
    plan: str
    graph_count: int
    graph_break_count: int
    break_reasons: list[str]
    op_counts: dict[str, int]
    host_syncs: list[str]
    regions: dict[str, int]
    recompiles: int
    recompile_reasons: list[str]
    cudagraph_skips: list[str]
    counters: dict[str, int]
    graphs: list[torch.fx.GraphModule] = field(repr=False)

    @property
    def aten_ops(self) -> int:
        """ATen nodes in the captured graphs."""
        return sum(v for k, v in self.op_counts.items() if k.startswith("aten::"))

    @property
    def custom_ops(self) -> dict[str, int]:
        """Nodes per op that is not ATen ("fdecode::prepare_next_draft", ...), sorted by name."""
        return {k: v for k, v in sorted(self.op_counts.items()) if not k.startswith("aten::")}

    @property
    def overload_counts(self) -> dict[str, int]:
        """Nodes per op overload ("aten.index_put.default", "fdecode.prepare_next_draft.default")."""
        counts: Counter[str] = Counter()
        for gm in self.graphs:
            for node in executed_nodes(gm):
                op = node_op(node)
                if op is not None:
                    counts[str(op)] += 1
        return dict(counts)

    def __repr__(self) -> str:
        shown = (
            "backend",
            "context",
            "dynamic_window",
            "plan",
            "graph_count",
            "graph_break_count",
            "host_syncs",
            "regions",
            "aten_ops",
            "custom_ops",
            "recompiles",
            "cudagraph_skips",
        )
        # Not a constructor call (aten_ops and custom_ops are properties): <GraphReport name=value ...>.
        return f"<GraphReport {' '.join(f'{name}={getattr(self, name)!r}' for name in shown)}>"


def node_op(node: torch.fx.Node) -> torch._ops.OpOverload | None:
    """The op overload an ATen-graph node calls, or None (placeholders, getitem, ...). A mutating custom
    op, functionalized into `auto_functionalized(op, ...)`, counts as the op itself."""
    if node.op != "call_function":
        return None
    target = node.target
    if getattr(target, "name", lambda: None)() in ("auto_functionalized", "auto_functionalized_v2"):
        target = node.args[0]
    return target if hasattr(target, "_schema") else None


def called_subgraphs(gm: torch.fx.GraphModule, node: torch.fx.Node) -> list[tuple[str, torch.fx.GraphModule]]:
    """The subgraphs a node calls (a higher-order op such as `invoke_subgraph`, functionalized or not, takes
    them as `get_attr` arguments or keywords): (attribute name, graph module)."""
    found = []
    for arg in (*node.args, *node.kwargs.values()):
        if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
            sub = getattr(gm, arg.target, None)
            if isinstance(sub, torch.fx.GraphModule):
                found.append((arg.target, sub))
    return found


def executed_nodes(gm: torch.fx.GraphModule, calls: Counter | None = None):
    """Every node a run of `gm` executes: its own, and a called subgraph's once per call (recursively).
    `calls` (if given) counts the calls per subgraph name."""
    for node in gm.graph.nodes:
        yield node
        if node.op != "call_function":
            continue
        for name, sub in called_subgraphs(gm, node):
            if calls is not None:
                calls[name] += 1
            yield from executed_nodes(sub, calls)


def fake_state(state: DecodeState, mode: FakeTensorMode) -> DecodeState:
    """`state` with every leaf a fake tensor of the leaf's shape, strides, dtype and device: no memory."""
    return map_leaves(state, mode.from_tensor)


def inspect(
    step,
    state: DecodeState,
    *,
    context: int | None = None,
    plan: SamplingPlan | str | None = None,
    speculate: bool = True,
    depth: int | None = None,
) -> GraphReport:
    """Trace `step` on fake tensors of `state`'s leaves and report what it captures and what the step's
    real backend did (see `GraphReport`). Copies nothing: `state` is neither written nor consumed.

    context: which attention window's graph (tokens, one of `step.buckets`); None: the one `step`
    would run for `state`. Where one graph serves every window (`step.dynamic_window`), that graph is
    traced as the step compiles it, the window's width a symbolic size (`GraphReport.dynamic_window`).
    plan: which sampling plan's graph (a `SamplingPlan` or its name, one of `step.plans`); None: the
    one `step` would run for `state` (`step.plan_for`).
    speculate, depth: which depth's graph (`Step.__call__`'s: None is K, or 0 with speculate=False).
    """
    cfg = step.config
    if plan is None:
        plan = step.plan_for(state)
    elif isinstance(plan, str):
        names = {p.name: p for p in step.plans}
        if plan not in names:
            raise ValueError(f"plan {plan!r} is not one of this step's plans {sorted(names)}")
        plan = names[plan]
    if context is None:
        blocks = cfg.bucket_for(step.schedule.record(state).max_position)
    elif context in step.buckets:
        blocks = context // cfg.block_size
    else:
        raise ValueError(f"context {context} is not one of this step's windows {step.buckets}")
    process = process_counters()  # before this inspection's own tracing adds to them
    dynamo_graphs: list[torch.fx.GraphModule] = []
    aten_graphs: list[torch.fx.GraphModule] = []

    def keep_aten(gm: torch.fx.GraphModule, _inputs):
        aten_graphs.append(gm)
        return make_boxed_func(gm.forward)

    lower = aot_autograd(fw_compiler=keep_aten)

    def capture(gm: torch.fx.GraphModule, example_inputs):
        dynamo_graphs.append(gm)
        return lower(gm, example_inputs)

    # A fresh code object per call: repeated inspections neither hit an old trace nor count as
    # recompiles of the user's step.
    depth = step.schedule.check_depth(requested_depth(speculate, depth, cfg.K))
    _, key = step.schedule.key(state, depth, blocks=blocks, plan=plan)  # the graph `step` runs
    fresh = fresh_code(pure_step(step.target, step.draft, cfg, key), "fdecode_inspect")
    window = () if key.window is not None else (window_width(cfg, blocks),)
    # Fake leaves (static shapes, as the step compiles with dynamic=False); the weights stay real and are
    # read as fakes. The shape environment gives a captured scalar read (`.item()`) a symbol, not a value.
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv(), static_shapes=True)
    breaks_before = Counter(counters["graph_break"])
    with torch.no_grad():
        torch.compile(fresh, backend=capture, fullgraph=False, dynamic=False)(fake_state(state, mode), *window)
    new_breaks = Counter(counters["graph_break"]) - breaks_before

    op_counts: Counter[str] = Counter()
    syncs: list[str] = []
    region_calls: Counter[str] = Counter()
    for gm in aten_graphs:
        for node in executed_nodes(gm, region_calls):
            op = node_op(node)
            if op is None:
                continue
            name = op._schema.name
            op_counts[name] += 1
            if name in SYNC_OPS:
                syncs.append(f"{name} ({node.name})")
    for gm in dynamo_graphs:
        for node in executed_nodes(gm):
            if node.op == "call_method" and node.target in SYNC_METHODS:
                syncs.append(f"Tensor.{node.target} ({node.name})")
    recompiles, recompile_reasons, cudagraph_skips = real_backend_facts(step, blocks)
    return GraphReport(
        backend=step.backend,
        context=blocks * cfg.block_size,
        dynamic_window=key.window is None,
        plan=key.name(cfg.K),
        graph_count=len(dynamo_graphs),
        graph_break_count=max(len(dynamo_graphs) - 1, sum(new_breaks.values())),
        break_reasons=sorted(new_breaks),
        op_counts=dict(op_counts),
        host_syncs=syncs,
        regions=dict(region_calls),
        recompiles=recompiles,
        recompile_reasons=recompile_reasons,
        cudagraph_skips=cudagraph_skips,
        counters=process,
        graphs=aten_graphs,
    )


def step_graphs(step, blocks: int) -> list[Callable]:
    """The callables the step runs for a window of `blocks` blocks (one per sampling plan it has run)."""
    window = step.graph_set.window_of(blocks)  # None: the graph of every window
    return [graph for key, graph in step.graphs.items() if key.window == window]


def real_backend_facts(step, blocks: int) -> tuple[int, list[str], list[str]]:
    """(recompiles, their reasons, CUDA-graph skip reasons) of the step's compiled graphs for the window.

    Each graph compiles its own code object (`fresh_code`), so Dynamo's cache entries on that code are
    this graph's compiles and nobody else's; their compile ids select Dynamo's compilation records."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    recompiles, ids = 0, set()
    for graph in step_graphs(step, blocks):
        code = getattr(getattr(graph, "_torchdynamo_orig_callable", None), "__code__", None)
        if code is None:  # eager: nothing is compiled
            continue
        entries = _debug_get_cache_entry_list(code)
        recompiles += max(len(entries) - 1, 0)
        ids.update(str(entry.compile_id) for entry in entries)
    reasons, skips = [], []
    for record in get_compilation_metrics():
        if record.compile_id not in ids:
            continue
        if record.recompile_reason:
            reasons.append(record.recompile_reason)
        if record.cudagraph_skip_reason:
            skips.append(record.cudagraph_skip_reason)
    return recompiles, reasons, skips


def process_counters() -> dict[str, int]:
    """Process-wide counts of what compiled code did (see `GraphReport.counters`)."""
    return {
        "unique_graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
        "cudagraph_rerecords": cudagraph_rerecords(),
    }


def cudagraph_rerecords() -> int:
    """Unexpected re-recordings counted by the CUDA-graph tree managers of this thread (0 where CUDA graph
    trees never ran). Reads Inductor's private state, without creating a manager or touching CUDA."""
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None:
        return 0
    try:
        containers = trees.get_obj(trees.local, "tree_manager_containers")
        managers = [c.tree_manager for c in containers.values() if c.tree_manager is not None]
        return sum(n for m in managers for per_node in m.num_rerecord.values() for n in per_node.values())
    except (AttributeError, KeyError, TypeError):  # another torch's internals: nothing to say
        return 0
