"""Each kind of decoder layer compiles once (`fdecode.models.regions`): counted regions, same tokens, same work."""

from __future__ import annotations

import pytest
import torch
from support.hybrid_models import hybrid_target, near_copy
from support.llama_models import fdecode_target, mtp_head, truncated

import fdecode
from fdecode.bench import deepseek_v3
from fdecode.drafts import drafter_for
from fdecode.models.regions import layer_copies
from fdecode.ops import kv
from fdecode.ops.attention import paged_context

K = 3
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8]]
# Ops whose executed count is the layers' work: the same whether each copy is unrolled or a region's call.
WORK_OPS = ("aten::mm", "aten::index_put", "aten::index", "aten::_scaled_dot_product_flash_attention_for_cpu")


def step_of(target, draft, *, regions: bool | str, backend: str = "dynamo", **changes):
    cfg = fdecode.DecodeConfig(
        **{
            "num_draft_tokens": K,
            "max_batch": 2,
            "max_seq_len": 64,
            "block_size": 8,
            "backend": backend,
            "layer_regions": regions,
            **changes,
        }
    )
    return fdecode.compile(target, draft, cfg, announce=False)


def tokens(step, steps: int = 6) -> torch.Tensor:
    """The committed tokens and the next window's drafts of `steps` steps: lossless verification keeps the
    committed ones right even where a draft forward is wrong, the drafts show it."""
    state = step.prefill(PROMPTS, max_new_tokens=30)
    outs = []
    for _ in range(steps):
        state, out = step(state)
        outs += [out.tokens, state.tokens]
    return torch.cat(outs, dim=1)


def work(report) -> dict[str, int]:
    return {op: report.op_counts.get(op, 0) for op in WORK_OPS}


@pytest.fixture(scope="module")
def deep_pair():
    """A 4-layer target with a 2-layer draft LM: 4 + 2 * K layer copies in a step."""
    target = fdecode_target(4)
    return target, truncated(target, 2)  # its first two layers, copied


@pytest.fixture(scope="module")
def regions_run(deep_pair):
    """The deep pair's step with regions (Dynamo), run a step and inspected once for the tests below, with spies
    on what Dynamo and the step call while it traces."""
    import importlib

    from torch._dynamo.variables import invoke_subgraph

    from fdecode.models.regions import shares_parameters

    target, draft = deep_pair
    fingerprints, traced = [], []
    original = invoke_subgraph.build_fingerprint_with_pytree

    def spy(first, second):
        traced.append(torch.compiler.is_compiling())
        return shares_parameters(first, second)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            invoke_subgraph, "build_fingerprint_with_pytree", lambda *args: fingerprints.append(1) or original(*args)
        )
        for module in ("fdecode.step", "fdecode.graphs.pure"):  # where `decode_step` and `pure_step` call it
            patch.setattr(importlib.import_module(module), "shares_parameters", spy, raising=False)
        step = step_of(target, draft, regions=True)
        state, _ = step(step.prefill(PROMPTS, max_new_tokens=30))
        report = fdecode.inspect(step, state)
    return step, report, fingerprints, traced


def test_each_layer_kind_compiles_once(deep_pair, regions_run):
    target, draft = deep_pair
    on, with_regions, _, _ = regions_run
    off = step_of(target, draft, regions=False)
    unrolled = fdecode.inspect(off, on.prefill(PROMPTS, max_new_tokens=30))
    # Three regions: the target's layer at K + 1 rows (4 calls), the draft's at 2 rows (its first forward,
    # 2 layers) and at 1 row (K - 1 forwards of 2 layers), each compiled once.
    assert sorted(with_regions.regions.values()) == sorted([4, 2, 2 * (K - 1)])
    assert unrolled.regions == {}
    # Still one graph, no break, no host sync, the fused prepare op one node; the same work executed.
    for report in (with_regions, unrolled):
        assert (report.graph_count, report.graph_break_count, report.host_syncs) == (1, 0, [])
        assert report.op_counts["fdecode::prepare_next_draft"] == 1
    assert work(with_regions) == work(unrolled)
    assert work(unrolled)["aten::index_put"] == 4 + 2 * K  # one KV write per layer copy
    # Each layer's [1] KV index is a view of one arange per forward, not a constant tensor per layer (a
    # kernel, and a C++ build, each under Inductor on the CPU).
    assert "aten::lift_fresh_copy" not in with_regions.op_counts
    assert torch.equal(tokens(on), tokens(step_of(target, draft, regions=False, backend="eager")))


def test_a_model_drafting_for_itself_accepts_every_draft(deep_pair):
    """Where the draft shares the target's parameters, its layers run unrolled (`shares_parameters`): torch's
    region reuse bound the draft's second layer to the first one's weights, and acceptance fell to 1 token."""
    target, _ = deep_pair
    step = step_of(target, target, regions=True)
    state = step.prefill(PROMPTS, max_new_tokens=30)
    for _ in range(3):
        state, out = step(state)
        assert ((out.tokens >= 0).sum(dim=1) == K + 1).all()
    assert torch.equal(tokens(step), tokens(step_of(target, target, regions=False, backend="eager")))


def test_regions_follow_the_config_and_the_kernel(deep_pair, monkeypatch):
    target, draft = deep_pair
    assert step_of(target, draft, regions=True).config.layer_regions
    with pytest.raises(ValueError, match="layer_regions must be 'auto', True or False"):
        fdecode.DecodeConfig(num_draft_tokens=1, max_batch=1, max_seq_len=16, layer_regions=1)
    # "auto": regions from AUTO_MIN_COPIES layer calls a step (4 target layers + K x 2 draft layers = 10).
    assert layer_copies(target, draft, drafter_for(draft), K) == 4 + 2 * K
    assert step_of(target, draft, regions="auto").config.layer_regions is False
    assert step_of(target, draft, regions="auto", num_draft_tokens=4).config.layer_regions is True
    # A device kernel that takes a per-layer view of the cache, or the NPU's KV write, runs layers unrolled.
    tables, positions = torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long)
    assert paged_context(tables, positions, 8, kernel="torch", regions=True).regions
    for kernel in ("flash_attn", "npu_fused_infer_attention"):
        assert not paged_context(tables, positions, 8, kernel=kernel, regions=True).regions
    with monkeypatch.context() as patch:
        patch.setitem(kv.KV_WRITE, "cpu", "scatter_nd")
        assert not paged_context(tables, positions, 8, kernel="torch", regions=True).regions


@pytest.mark.parametrize("family", ["mtp", "hybrid", "deepseek"])
def test_other_families_run_their_layers_as_regions(family):
    """An MTP head's layer, a hybrid's attention and linear-attention layers, DeepSeek's MLA + MoE layers:
    regions in one graph, the same tokens and drafts as eager, unrolled (the same work: the dense test above)."""
    if family == "mtp":
        target = fdecode_target(2)
        draft = mtp_head("partial", target)
    elif family == "hybrid":
        target = hybrid_target("lin-full")
        draft = near_copy(target)
    else:  # a dense layer, then two MoE layers, and the MTP head (an MoE layer over the latent cache)
        target = deepseek_v3(256, 64, 3, seed=1)
        draft = "mtp"
    on, unrolled = step_of(target, draft, regions=True), step_of(target, draft, regions=False, backend="eager")
    with_regions = fdecode.inspect(on, on.prefill(PROMPTS, max_new_tokens=30))
    assert sum(with_regions.regions.values()) > len(with_regions.regions) > 0  # some region is called again
    assert (with_regions.graph_count, with_regions.graph_break_count, with_regions.host_syncs) == (1, 0, [])
    assert torch.equal(tokens(on, steps=4), tokens(unrolled, steps=4))


@pytest.mark.slow  # the module's region step (`regions_run`): a Dynamo compile and an inspection
def test_a_region_call_matches_its_layer_kind_without_tracing_pytree(regions_run):
    """Dynamo matches each region call against the layer kinds it has traced from its arguments; flat ones
    (tensors, constants, modules: the context goes in as its fields) take its fast path, a named tuple
    among them a trace of `pytree.tree_flatten` per call (~0.1 s each on the real pair's 124 calls)."""
    _, report, fingerprints, _ = regions_run
    assert report.regions  # the calls were regions
    assert fingerprints == []


@pytest.mark.slow  # the module's region step (`regions_run`): a Dynamo compile and an inspection
def test_the_trace_does_not_walk_the_models_parameters(regions_run):
    """Whether the draft shares the target's parameters is checked once per graph, on the host: inside the
    step Dynamo traced that check through every parameter of both models (`named_modules` ~80 times a layer),
    +1 s of trace from 14 to 28 layers of the depth benchmark."""
    _, report, _, traced = regions_run
    assert traced and not any(traced)  # checked, and never inside the trace
    assert report.regions  # the draft's layers were regions all the same
