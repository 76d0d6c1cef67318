"""One graph per step: capture, host syncs, the fused op, no recompiles, in-place KV writes."""

from __future__ import annotations

import pytest
import torch

import fdecode
from conftest import fdecode_target, independent_draft, mtp_head

# Writes through a view of the KV leaf (or the functional index_copy) make the compiled
# step copy the whole cache every call; the cache must only ever be written by index_put.
TORCH_RANDOM_OPS = {"rand", "randn", "randint", "rand_like", "exponential", "multinomial", "bernoulli", "uniform", "normal"}
WHOLE_CACHE_COPIES = ("aten::select_scatter", "aten::slice_scatter", "aten::as_strided_scatter", "aten::index_copy")


@pytest.fixture(scope="module", params=["model", "mtp"])
def compiled(request):
    target = fdecode_target(2)
    draft = independent_draft("partial", target) if request.param == "model" else mtp_head("partial", target)
    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=4, max_seq_len=96, block_size=8, backend="inductor")
    return fdecode.compile(target, draft, cfg)


@pytest.mark.slow
def test_inspect_reports_one_graph_without_syncs(compiled):
    # A greedy and a random lane (top-k) side by side: one graph serves both.
    state = compiled.prefill([[1, 2, 3], [4, 5, 6, 7, 8]], max_new_tokens=40, temperature=[0.0, 0.8], top_k=[0, 5])
    report = fdecode.inspect(compiled, state)
    assert report.backend == "inductor"
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
    # Inspection clones: the caller's state is not consumed and the step still runs on it.
    compiled(state)


@pytest.mark.slow
def test_no_recompile_over_steps_and_new_prompts(compiled):
    with torch._dynamo.config.patch(error_on_recompile=True):
        state = compiled.prefill([[1, 2, 3], [4, 5, 6, 7, 8]], max_new_tokens=60)
        for _ in range(20):
            state, out = compiled(state)
        # A new batch: other lengths, other lane count, other budgets and a stop id.
        state = compiled.prefill([[9] * 11, [3, 1], [2], [7, 7, 7]], max_new_tokens=30, eos_token_id=[5, 6])
        for _ in range(5):
            state, out = compiled(state)
        # Sampling parameters and seeds are tensors too: new values, no new graph.
        state = compiled.prefill(
            [[1, 2], [3]], max_new_tokens=30, temperature=[0.7, 1.2], top_k=[3, 0], top_p=[1.0, 0.9], min_p=0.05, seed=5
        )
        for _ in range(20):
            state, out = compiled(state)
    assert out.tokens.shape == (4, 4)


def test_inspect_catches_a_host_sync():
    """The scan must see a sync that fullgraph capture accepts (an .item() on a tensor)."""
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=1, max_batch=2, max_seq_len=32, block_size=4, backend="aot_eager")
    step = fdecode.compile(target, independent_draft("random", target), cfg)
    state = step.prefill([[1, 2, 3]], max_new_tokens=5)

    class SyncingStep:
        target, draft, config, backend = step.target, step.draft, step.config, "test"

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
