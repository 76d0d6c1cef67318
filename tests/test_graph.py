"""One graph per step: capture, host syncs, the fused op, no recompiles, in-place KV writes."""

from __future__ import annotations

import re

import pytest
import torch
from support.llama_models import fdecode_target, independent_draft, mtp_head
from support.probes import largest_cpu_allocation

import fdecode
from fdecode.state import DecodeState

# Writes through a view of the KV leaf (or the functional index_copy) make the compiled
# step copy the whole cache every call; the cache must only ever be written by index_put.
TORCH_RANDOM_OPS = {
    "rand",
    "randn",
    "randint",
    "rand_like",
    "exponential",
    "multinomial",
    "bernoulli",
    "uniform",
    "normal",
}
WHOLE_CACHE_COPIES = ("aten::select_scatter", "aten::slice_scatter", "aten::as_strided_scatter", "aten::index_copy")


@pytest.fixture(scope="module", params=["model", "mtp"])
def compiled(request):
    target = fdecode_target(2)
    draft = independent_draft("partial", target) if request.param == "model" else mtp_head("partial", target)
    # "dynamo" (Dynamo's graph run as captured): Dynamo's capture, guards and recompiles are every backend's
    # input, the same for Inductor (whose code the lossless tests run); `inspect` lowers the graph to ATen.
    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=4, max_seq_len=96, block_size=8, backend="dynamo")
    return fdecode.compile(target, draft, cfg)


@pytest.mark.slow
def test_inspect_reports_one_graph_without_syncs(compiled):
    # A greedy and a random lane (top-k) side by side: one graph serves both.
    state = compiled.prefill([[1, 2, 3], [4, 5, 6, 7, 8]], max_new_tokens=40, temperature=[0.0, 0.8], top_k=[0, 5])
    report = fdecode.inspect(compiled, state)
    assert report.backend == "dynamo"
    assert report.graph_count == 1
    assert report.graph_break_count == 0
    assert report.op_counts["fdecode::prepare_next_draft"] == 1
    assert report.host_syncs == []
    assert not [op for op in WHOLE_CACHE_COPIES if op in report.op_counts]
    # Randomness is the counter-based hash in the state: no torch RNG op (ACL graphs cannot hold them).
    assert not [op for op in report.op_counts if op.split("::")[1] in TORCH_RANDOM_OPS]
    # 2 target layers (validate) + 1 draft forward of 2 rows + K-1 of 1 row, one index_put per layer each.
    draft_layers = compiled.draft.kv_config.num_layers
    assert report.op_counts["aten::index_put"] == 2 + draft_layers * compiled.config.K
    # Inspection traces fake tensors: the caller's state is not consumed and the step still runs on it.
    assert report.recompiles == 0 and report.cudagraph_skips == []
    compiled(state)


@pytest.mark.slow
def test_no_recompile_over_steps_and_new_prompts(compiled):
    before = dict(compiled.plan_compile_seconds)
    with torch._dynamo.config.patch(error_on_recompile=True):
        # The lanes of the inspection test above: its last call compiled this plan's graph (one capture).
        state = compiled.prefill([[1, 2, 3], [4, 5, 6, 7, 8]], max_new_tokens=60, temperature=[0.0, 0.8], top_k=[0, 5])
        for _ in range(20):
            state, out = compiled(state)
        # A new batch: other lengths, other lane count, other budgets and a stop id.
        state = compiled.prefill(
            [[9] * 11, [3, 1], [2], [7, 7, 7]],
            max_new_tokens=30,
            eos_token_id=[5, 6],
            temperature=[0.0, 0.0, 0.9, 0.0],
            top_k=[0, 0, 3, 0],
        )
        for _ in range(5):
            state, out = compiled(state)
        # Sampling parameters and seeds are tensors too: new values (the same plan), no new graph.
        state = compiled.prefill(
            [[1, 2], [3]], max_new_tokens=30, temperature=[0.7, 1.2], top_k=[3, 2], top_p=[1.0, 0.9], min_p=0.05, seed=5
        )
        for _ in range(20):
            state, out = compiled(state)
    assert out.tokens.shape == (4, 4)
    assert compiled.plan_for(state).name == "full+top_k+top_p"  # one plan (the general one) throughout: no recompile
    made = set(compiled.plan_compile_seconds) - set(before)  # at most the general plan's graph, made once
    assert {name for _, name in made} <= {"full+top_k+top_p"} and len(made) <= 1


def test_inspect_catches_a_host_sync():
    """The scan must see a sync that fullgraph capture accepts (an .item() on a tensor)."""
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=1, max_batch=2, max_seq_len=32, block_size=4, backend="aot_eager")
    step = fdecode.compile(target, independent_draft("random", target), cfg)
    state = step.prefill([[1, 2, 3]], max_new_tokens=5)

    class SyncingStep:
        target, draft, config, backend = step.target, step.draft, step.config, "test"
        plans, plan_for, schedule, graph_set, graphs = (
            step.plans,
            staticmethod(step.plan_for),
            step.schedule,
            step.graph_set,
            step.graphs,
        )

    original = torch.ops.fdecode.prepare_next_draft

    def syncing(accepted, *args):
        torch._check(int(accepted.max().item()) < 10**9)  # a host read inside the step
        return original(accepted, *args)

    import fdecode.step as step_module

    step_module.prepare_next_draft, saved = syncing, step_module.prepare_next_draft
    try:
        with torch._dynamo.config.patch(capture_scalar_outputs=True):
            report = fdecode.inspect(SyncingStep(), state)
    finally:
        step_module.prepare_next_draft = saved
    assert any("_local_scalar_dense" in s or "item" in s for s in report.host_syncs), report.host_syncs


# ------------------------------------------------------------------ inspect: no copy of the KV, the real backend's facts


@pytest.fixture(scope="module")
def small_step():
    """A greedy-only aot_eager step of the tiny models (cheap to capture)."""
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=1, max_batch=2, max_seq_len=64, block_size=4, backend="aot_eager", sampling=False
    )
    return fdecode.compile(target, independent_draft("random", target), cfg)


def test_inspect_does_not_copy_the_kv(small_step, monkeypatch):
    """Inspection traces without a second KV pool: no clone of the state, no allocation of the KV's size,
    and the caller's state is untouched (same KV contents, not consumed, still steps)."""
    state = small_step.prefill([[1, 2, 3], [4, 5]], max_new_tokens=6)
    kv_before = (state.target_kv.clone(), state.draft_kv.clone())
    kv_bytes = min(t.numel() * t.element_size() for t in kv_before)

    def copies(self):
        raise AssertionError("inspect copied the state (a second KV pool)")

    monkeypatch.setattr(DecodeState, "clone", copies)
    reports = []
    largest = largest_cpu_allocation(lambda: reports.append(fdecode.inspect(small_step, state)))
    monkeypatch.undo()
    assert largest < kv_bytes, f"inspect allocated {largest} bytes, a KV leaf is {kv_bytes}"
    (report,) = reports
    assert report.graph_count == 1 and report.graph_break_count == 0 and report.host_syncs == []
    assert report.op_counts["fdecode::prepare_next_draft"] == 1
    assert report.op_counts["aten::index_put"] == 2 + 1 * small_step.config.K  # one per layer and forward
    assert not state.consumed
    assert torch.equal(state.target_kv, kv_before[0]) and torch.equal(state.draft_kv, kv_before[1])
    small_step(state)


def test_inspect_reports_what_the_real_backend_did(small_step):
    """Recompiles of the step's own graph (Dynamo's cache of its code object), with their reasons;
    CUDA-graph skips of its graphs; the process's counters. And a repr of real attribute names."""
    state = small_step.prefill([[1, 2, 3]], max_new_tokens=20)
    state, _ = small_step(state)
    report = fdecode.inspect(small_step, state)
    assert report.recompiles == 0 and report.recompile_reasons == [] and report.cudagraph_skips == []
    assert {"unique_graphs", "graph_breaks", "cudagraph_skips", "cudagraph_rerecords"} <= report.counters.keys()
    # Other strides of one leaf: the real graph's guards fail and Dynamo compiles it again.
    strided = state.block_tables.t().contiguous().t()
    state, _ = small_step(state.replace(block_tables=strided))
    report = fdecode.inspect(small_step, state)
    assert report.recompiles == 1 and len(report.recompile_reasons) == 1, report.recompile_reasons
    assert "block_tables" in report.recompile_reasons[0]
    text = repr(report)
    names = re.findall(r"(\w+)=", text)
    assert {"graph_count", "aten_ops", "custom_ops", "recompiles"} <= set(names)
    for name in names:
        assert f"{name}={getattr(report, name)!r}" in text  # every name shown is an attribute, shown as it is
    assert report.aten_ops == sum(v for k, v in report.op_counts.items() if k.startswith("aten::"))


def test_the_first_random_request_makes_one_graph_and_no_later_setting_another():
    """On the plain path (no warm-up), a greedy call makes the greedy graph, the first random call one more (the
    general plan, exact for every setting), and a call with other sampling settings none."""
    from support.llama_models import fdecode_target, independent_draft

    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=2, max_batch=2, max_seq_len=64, block_size=16, backend="dynamo", context_buckets=(64,)
    )
    step = fdecode.compile(target, independent_draft("partial", target), cfg)
    made = []
    for settings in (
        dict(),
        dict(temperature=0.7, top_k=20),
        dict(temperature=1.0, top_p=0.9, min_p=0.05),
        dict(temperature=[0.0, 1.2], top_k=[0, 3]),
    ):
        fdecode.generate(step, [[5, 17, 33], [7, 3]], max_new_tokens=12, seed=1, **settings)
        made.append(len(step.plan_compile_seconds))
    assert made == [1, 2, 2, 2]
