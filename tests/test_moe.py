"""The MoE feed-forward block and its routers against transformers' (fp32, tiny random configs)."""

from __future__ import annotations

import pytest
import torch

from fdecode.models.config import ModelConfig
from fdecode.models.layers import moe as moe_module
from fdecode.models.layers.moe import DeepseekMoE, QwenMoE, moe_block
from fdecode.models.moe_config import MoEConfig, sigmoid_moe_from_hf, softmax_moe_from_hf

H = 32


def _randomise_(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            tensor.copy_(torch.randn(tensor.shape, generator=gen) * 0.3)


def _hidden(seed: int, rows: int = 24) -> torch.Tensor:
    return torch.randn(2, rows // 2, H, generator=torch.Generator().manual_seed(seed))


def _ours(hf_block: torch.nn.Module, moe: MoEConfig) -> torch.nn.Module:
    ours = moe_block(
        ModelConfig(
            vocab_size=8, hidden_size=H, intermediate_size=1, num_layers=1, num_heads=1, num_kv_heads=1, head_dim=H
        ),
        moe,
    )
    ours.load_state_dict(hf_block.state_dict(), strict=True)  # the same names and the same stacked layout
    return ours


def _deepseek_style(kind: str, **over):
    import transformers

    fields = {
        **dict(
            hidden_size=H,
            moe_intermediate_size=8,
            n_routed_experts=16,
            num_experts_per_tok=4,
            n_group=4,
            topk_group=2,
            n_shared_experts=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
        ),
        **over,
    }
    if kind == "deepseek_v3":
        cfg = transformers.DeepseekV3Config(**fields)
        block = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE(cfg)
    else:
        cfg = transformers.Glm4MoeConfig(**fields)
        block = transformers.models.glm4_moe.modeling_glm4_moe.Glm4MoeMoE(cfg)
    return cfg, block


@pytest.mark.parametrize("kind", ["deepseek_v3", "glm4_moe"])
@pytest.mark.parametrize(
    "over", [{}, {"n_group": 1, "topk_group": 1}, {"norm_topk_prob": False, "n_shared_experts": 1}]
)
def test_sigmoid_moe_matches_transformers(kind, over):
    cfg, hf_block = _deepseek_style(kind, **over)
    _randomise_(hf_block, seed=1)  # e_score_correction_bias too: selection and weights differ
    moe = sigmoid_moe_from_hf(cfg.to_dict(), defaults={})
    assert (moe.n_group, moe.topk_group, moe.routed_scaling_factor) == (cfg.n_group, cfg.topk_group, 2.5)
    ours = _ours(hf_block, moe)
    assert isinstance(ours, DeepseekMoE)
    x = _hidden(2)
    torch.testing.assert_close(ours(x), hf_block(x), atol=1e-5, rtol=0)


def test_grouped_routing_keeps_only_the_best_groups():
    """With topk_group < n_group, the experts of the dropped groups are never chosen, even where their
    own scores are the highest: the bias lifts group 0's two best experts, so group 0 always wins."""
    moe = MoEConfig(num_experts=8, top_k=2, moe_intermediate_size=4, n_group=4, topk_group=1)
    router = moe_block(ModelConfig(8, H, 1, 1, 1, 1, H), moe).gate
    _randomise_(router, seed=3)
    with torch.no_grad():
        router.e_score_correction_bias.copy_(torch.tensor([5.0, 5.0, 0, 0, 0, 0, 0, 0]))
    weights, experts = router(_hidden(4).view(-1, H))
    assert sorted(experts.unique().tolist()) == [0, 1]
    # The weights are the plain sigmoid scores of the chosen experts (never the biased ones), renormalised.
    torch.testing.assert_close(weights.sum(-1), torch.ones(len(weights)))


def test_greedy_routing_is_plain_top_k_of_the_sigmoid_scores():
    moe = MoEConfig(
        num_experts=8,
        top_k=3,
        moe_intermediate_size=4,
        topk_method="greedy",
        norm_topk_prob=False,
        routed_scaling_factor=2.0,
    )
    router = moe_block(ModelConfig(8, H, 1, 1, 1, 1, H), moe).gate
    _randomise_(router, seed=5)  # a nonzero bias, which greedy does not use
    x = _hidden(6).view(-1, H)
    weights, experts = router(x)
    scores = (x @ router.weight.T).sigmoid()
    expected = scores.topk(3, dim=-1).values * 2.0
    torch.testing.assert_close(weights.sort(-1).values, expected.sort(-1).values)


@pytest.mark.parametrize("kind", ["qwen3_next", "qwen3_5_moe"])
def test_softmax_moe_matches_transformers(kind):
    import transformers

    fields = dict(
        hidden_size=H,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=12,
        num_experts=16,
        num_experts_per_tok=4,
    )
    if kind == "qwen3_next":
        cfg = transformers.Qwen3NextConfig(**fields, norm_topk_prob=False)
        hf_block = transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextSparseMoeBlock(cfg)
        moe = softmax_moe_from_hf(cfg.to_dict())
        assert not moe.norm_topk_prob
    else:
        cfg = transformers.Qwen3_5MoeTextConfig(**fields)
        hf_block = transformers.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeSparseMoeBlock(cfg)
        moe = softmax_moe_from_hf(cfg.to_dict(), norm_topk_prob=True)  # Qwen3.5-MoE always renormalises
    _randomise_(hf_block, seed=7)
    ours = _ours(hf_block, moe)
    assert isinstance(ours, QwenMoE)
    x = _hidden(8)
    torch.testing.assert_close(ours(x), hf_block(x), atol=1e-5, rtol=0)


def test_rows_in_chunks_equal_all_rows_at_once(monkeypatch):
    cfg, hf_block = _deepseek_style("glm4_moe")
    _randomise_(hf_block, seed=9)
    ours = _ours(hf_block, sigmoid_moe_from_hf(cfg.to_dict(), defaults={}))
    x = _hidden(10, rows=30)
    whole = ours(x)
    per_pair = 3 * 8 * H
    monkeypatch.setattr(moe_module, "GATHER_BUDGET", 4 * 7 * per_pair)  # 7 rows per chunk: 5 chunks, the last short
    torch.testing.assert_close(ours(x), whole, atol=1e-6, rtol=0)


def test_moe_block_is_one_graph():
    cfg, hf_block = _deepseek_style("deepseek_v3")
    _randomise_(hf_block, seed=11)
    ours = _ours(hf_block, sigmoid_moe_from_hf(cfg.to_dict(), defaults={}))
    x = _hidden(12)
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")  # fullgraph: a break or host sync raises
    torch.testing.assert_close(compiled(x), hf_block(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"topk_method": "group_limited_greedy"}, "unsupported MoE routing method topk_method='group_limited_greedy'"),
        ({"scoring_func": "softmax"}, "unsupported MoE scoring_func 'softmax'"),
        ({"n_group": 3}, "n_group \\(3\\) must divide the 16 experts"),
        ({"topk_group": 5}, "topk_group \\(5\\) be in 1 .. n_group"),
        ({"num_experts_per_tok": 17}, "num_experts_per_tok \\(17\\) must be in 1 .. n_routed_experts \\(16\\)"),
    ],
)
def test_bad_routing_configs_are_refused(fields, message):
    hf = {
        "n_routed_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 8,
        "n_group": 4,
        "topk_group": 2,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "n_shared_experts": 1,
        **fields,
    }
    with pytest.raises(ValueError, match=message):
        sigmoid_moe_from_hf(hf, defaults={})


def test_expert_work_follows_the_chosen_experts_not_their_number():
    """The MoE block's matmul FLOPs at E = 8 and E = 64 (same top-k, same expert sizes) differ by the
    router's [N, H] x [H, E] logits alone: the experts' work is N * K expert-MLPs whatever E is."""
    from torch.utils.flop_counter import FlopCounterMode

    def flops(num_experts: int) -> int:
        moe = MoEConfig(num_experts=num_experts, top_k=2, moe_intermediate_size=8, n_shared_experts=1)
        block = moe_block(ModelConfig(8, H, 1, 1, 1, 1, H), moe)
        _randomise_(block, seed=13)
        with FlopCounterMode(display=False) as counter:
            block(_hidden(14))
        return counter.get_total_flops()

    n = 24  # rows of _hidden
    assert flops(64) - flops(8) == 2 * n * H * (64 - 8)
    assert flops(8) > 2 * n * H * 8  # the experts' matmuls are counted too
