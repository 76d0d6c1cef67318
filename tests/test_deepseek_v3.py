"""DeepSeek-V3 (issue 17): MLA over the paged latent cache, against transformers' DeepseekV3ForCausalLM.

Logits in prefill and in incremental decode through the paged cache (q_lora_rank None and set, YaRN
with mscale, interleaved and plain rope layouts, a dense first layer and MoE layers routed within
2 of 4 groups); the cache leaf holds kv_lora_rank + qk_rope_head_dim values per token; the captured
decode step never forms per-head keys or values over the context; config errors.
"""

from __future__ import annotations

import pytest
import torch
from support.deepseek_models import VOCAB, hf_config, hf_deepseek, prompts

import fdecode
from fdecode.models import from_hf
from fdecode.models.deepseek_config import DeepseekV3Config
from fdecode.models.dense import dense_forward
from fdecode.models.families.deepseek_v3 import DeepseekV3Model, config_from_hf
from fdecode.models.layers.moe import DeepseekMoE

VARIANTS = {
    "q_lora": {},
    "no_q_lora": {"q_lora_rank": None},
    "plain_rope_layout": {"rope_interleave": False, "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
    "bias_tied": {"attention_bias": True, "tie_word_embeddings": True, "q_lora_rank": None},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_logits_match_transformers(variant: str) -> None:
    hf = hf_deepseek(**VARIANTS[variant])
    model = from_hf(hf)
    assert isinstance(model, DeepseekV3Model) and model.config.q_lora_rank == hf.config.q_lora_rank
    assert [isinstance(layer.mlp, DeepseekMoE) for layer in model.layers] == [False, True, True]  # 1 dense layer
    assert model.config.moe.topk_group < model.config.moe.n_group
    for seq in prompts((7, 19)):
        seq = torch.tensor(seq)
        expected = hf(seq[None]).logits[0]
        logits, _ = dense_forward(model, seq[None])
        assert expected.abs().max() > 1.0  # the comparison is not between near-zero logits
        torch.testing.assert_close(logits[0], expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("variant", ["q_lora", "no_q_lora"])
@pytest.mark.parametrize("chunk", [1, 3])
def test_incremental_decode_through_the_paged_cache_matches_transformers(variant: str, chunk: int) -> None:
    """Prefill 5 tokens, then `chunk` rows at a time over a block table of 4-token blocks out of order."""
    hf = hf_deepseek(**VARIANTS[variant])
    model = from_hf(hf)
    seq = torch.tensor(prompts((17,))[0])
    expected = hf(seq[None]).logits[0]  # [17, V]
    bs, n = 4, len(seq)
    table = torch.tensor([[3, 1, 5, 2, 4]])  # blocks in any order; block 0 is scratch
    kv = model.kv_config.new_kv(6 * bs, dtype=torch.float32, device="cpu")
    start = 0
    for stop in [5, *range(5 + chunk, n, chunk), n]:
        pos = torch.arange(start, stop)[None]
        slots = table[0, pos // bs] * bs + pos % bs
        logits, _ = model(seq[None, start:stop], pos, slots, kv, table, block_size=bs)
        torch.testing.assert_close(logits[0], expected[start:stop], rtol=0, atol=1e-4)
        start = stop


def test_the_cache_holds_the_latent_per_token() -> None:
    """Per token and layer: kv_lora_rank + qk_rope_head_dim values (16 + 8), one kind, one head; the step's
    KV leaves (target and an MTP-less self-draft) have that layout."""
    model = from_hf(hf_deepseek())
    cfg = model.config
    assert model.kv_config.kv_shape(40) == (3, 1, 40, 1, cfg.kv_lora_rank + cfg.qk_rope_head_dim) == (3, 1, 40, 1, 24)
    step = fdecode.compile(
        model,
        model,
        fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=32, block_size=4, dtype=torch.float32),
    )
    state = step.prefill([[1, 2, 3]], max_new_tokens=2)
    for kv in (state.target_kv, state.draft_kv):
        assert kv.shape[1] == 1 and kv.shape[3] == 1 and kv.shape[-1] == 24
    # The expanded per-head keys and values would be H * (Dn + Dr + Dv) = 4 * 30 values per token.
    assert 4 * (12 + 8 + 10) == 5 * state.target_kv.shape[-1]


# Shapes whose per-head key / value widths collide with no other width in the step's graph.
GRAPH_MLA = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_layers=2,
    num_heads=4,
    num_kv_heads=4,
    head_dim=8,
    model_type="deepseek_v3",
    q_lora_rank=None,
    kv_lora_rank=18,
    qk_nope_head_dim=14,
    qk_rope_head_dim=8,
    v_head_dim=6,
)


def per_head_context_nodes(graphs, *, window: int, heads: int, nope: int, rope: int, value: int) -> list[str]:
    """Nodes whose value spans the context (a dimension equal to the window, or symbolic) and has a
    per-head key or value width: Dn, Dv, Dn + Dr, Dn + Dv, or H times one of them."""
    widths = {nope, value, nope + rope, nope + value}
    widths |= {heads * w for w in widths}
    found = []
    for gm in graphs:
        for node in gm.graph.nodes:
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):
                continue
            shape = list(val.shape)
            spans = [i for i, d in enumerate(shape) if not isinstance(d, int) or d == window]
            if spans and any(isinstance(d, int) and d in widths for i, d in enumerate(shape) if i not in spans):
                found.append(f"{node.name}: {tuple(shape)}")
    return found


def test_decode_attention_never_materialises_per_head_keys_over_the_context() -> None:
    """The captured step (verify, draft forwards over a 40-token window) is one graph, no break, no host
    sync, the fused op once, and no tensor over the window has a per-head key or value width; the
    detector itself flags the expanded form (kv_b_proj over the latents)."""
    cfg = DeepseekV3Config(**GRAPH_MLA)
    model = DeepseekV3Model.random(cfg, seed=3, std=0.3)
    step = fdecode.compile(
        model,
        model,
        fdecode.DecodeConfig(
            num_draft_tokens=2,
            max_batch=4,
            max_seq_len=64,
            block_size=4,
            context_buckets=(40, 64),
            dtype=torch.float32,
            backend="aot_eager",
        ),
    )
    state = step.prefill([[1, 2, 3, 4, 5], [6, 7]], max_new_tokens=4)
    report = fdecode.inspect(step, state, context=40)
    assert report.graph_count == 1 and report.graph_break_count == 0, report.break_reasons
    assert report.host_syncs == [] and report.op_counts["fdecode::prepare_next_draft"] == 1
    dims = dict(window=40, heads=4, nope=14, rope=8, value=6)
    assert per_head_context_nodes(report.graphs, **dims) == []
    assert report.op_counts.get("aten::bmm", 0) > 0  # the latent products are in the graph

    attn = model.layers[0].self_attn
    latents = torch.zeros(4, 40, cfg.kv_lora_rank)  # [B, S, R]: what the absorbed path reads instead

    def expanded(c):  # transformers' prefill form: per-head keys and values of every context token
        return attn.kv_b_proj(c).view(4, 40, 4, 14 + 6).split([14, 6], dim=-1)

    gm = torch.fx.experimental.proxy_tensor.make_fx(expanded)(latents)
    assert per_head_context_nodes([gm], **dims)


def test_config_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="head_dim = qk_rope_head_dim"):
        DeepseekV3Config(**{**GRAPH_MLA, "head_dim": 22})
    with pytest.raises(ValueError, match="qk_rope_head_dim even"):
        DeepseekV3Config(**{**GRAPH_MLA, "qk_rope_head_dim": 7, "head_dim": 7})
    hf = hf_config().to_dict()
    with pytest.raises(ValueError, match="hidden_act"):
        config_from_hf({**hf, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="topk_method"):
        config_from_hf({**hf, "topk_method": "group_limited_greedy"})
    with pytest.raises(ValueError, match="quantized checkpoints are not supported"):
        config_from_hf({**hf, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})
    with pytest.raises(ValueError, match="RoPE type"):
        config_from_hf({**hf, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}})
