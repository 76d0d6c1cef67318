"""GLM-4.5 (`glm4_moe`, issue 17): GQA with q/k/v bias, q/k norm and partial RoPE, the DeepSeek-style MoE
and MTP head, against transformers' Glm4MoeForCausalLM; sharded checkpoint loading; what it refuses."""

from __future__ import annotations

import json

import pytest
import torch
from support.glm_models import NEW, PROMPTS, VARIANTS, hf_glm, hf_greedy, prompts, save_glm
from support.hybrid_models import assert_prefill_logits_match, compiled, run, staggered

import fdecode
from fdecode.drafts import LM
from fdecode.models import from_hf
from fdecode.models.families.glm4_moe import Glm4MoeModel, Glm4MoeMTPHead, config_from_hf
from fdecode.models.loading.checkpoint import CheckpointTensors


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_logits_match_transformers(variant: str) -> None:
    hf = hf_glm(variant)
    model = from_hf(hf)
    assert isinstance(model, Glm4MoeModel) and model.config.rotary_dim == 8
    assert model.layers[0].mlp.__class__.__name__ == "MLP" and model.layers[2].mlp.__class__.__name__ == "DeepseekMoE"
    assert_prefill_logits_match(model, hf, prompts())


@pytest.mark.parametrize("chunk", [1, 3])
def test_incremental_decode_through_the_paged_cache_matches_transformers(chunk: int) -> None:
    """Prefill 5 tokens, then feed the rest `chunk` rows at a time over the cache, blocks of 4 out of order."""
    hf = hf_glm()
    model = from_hf(hf)
    seq = prompts((17,))[0]
    expected = hf(seq[None]).logits[0]  # [17, V]
    block_size, table = 4, torch.tensor([[3, 1, 5, 2, 4]])
    kv = model.kv_config.new_kv(6 * block_size, dtype=torch.float32, device="cpu")
    start = 0
    for stop in [5, *range(5 + chunk, len(seq), chunk), len(seq)]:
        pos = torch.arange(start, stop)[None]
        slots = table[0, pos // block_size] * block_size + pos % block_size
        logits, _ = model(seq[None, start:stop], pos, slots, kv, table, block_size=block_size)
        torch.testing.assert_close(logits[0], expected[start:stop], rtol=0, atol=1e-4)
        start = stop


def test_mtp_head_from_a_sharded_checkpoint_in_glm_layout_is_lossless(tmp_path) -> None:
    weight_map = save_glm(tmp_path)
    assert len(set(weight_map.values())) > 2 and "model.layers.3.mlp.experts.7.down_proj.weight" in weight_map
    step = compiled(str(tmp_path), "mtp", 3)
    assert isinstance(step.draft, Glm4MoeMTPHead) and step.draft_kind == "mtp"
    assert step.draft.layers[0].layer.mlp.__class__.__name__ == "DeepseekMoE"  # the MTP layer is an MoE layer
    outs, _, _ = run(step, PROMPTS, NEW)
    assert outs == [hf_greedy(p) for p in PROMPTS]


def test_target_as_its_own_draft_accepts_every_draft() -> None:
    target = from_hf(hf_glm())
    outs, lengths, _ = run(compiled(target, target, 2), PROMPTS, NEW)
    assert outs == [hf_greedy(p) for p in PROMPTS]
    assert lengths.count(3) >= len(lengths) - len(PROMPTS) and all(n <= 3 for n in lengths)


def test_captured_mtp_head_from_a_checkpoint_folder_is_lossless(tmp_path) -> None:
    """One captured graph (dynamo). Inductor's code for the sigmoid-routed MoE and the DeepSeek-layout MTP
    head runs in tests/test_deepseek_v3_step.py, for GQA attention in tests/test_lossless.py; GLM's own q/k/v
    bias and partial rotary run captured here, not through Inductor (kept out of CI's time budget)."""
    save_glm(tmp_path)
    outs, _, _ = run(compiled(str(tmp_path), "mtp", 2, backend="dynamo"), PROMPTS, NEW)
    assert outs == [hf_greedy(p) for p in PROMPTS]


def test_engine_staggered_arrivals_equal_one_at_a_time_decoding(tmp_path) -> None:
    """Two lanes, five requests arriving over time (lanes re-primed mid-flight next to a live lane), the
    MTP head drafting: every request's tokens equal transformers' greedy continuation."""
    save_glm(tmp_path)
    engine = fdecode.Engine(compiled(str(tmp_path), "mtp", 2, max_batch=2))
    arrivals = {0: [PROMPTS[0], PROMPTS[2]], 1: [PROMPTS[1]], 3: [PROMPTS[2]], 4: [PROMPTS[0][:3]]}
    got, want = staggered(engine, arrivals, [5, 9, 6, 10, 7], hf_greedy)
    assert got == want


def test_a_sharded_folder_is_read_one_tensor_at_a_time(tmp_path, monkeypatch) -> None:
    """Each tensor is read once, by itself (never a whole file), and the result equals the live model."""
    weight_map = save_glm(tmp_path)
    reads: list[str] = []
    get = CheckpointTensors.__getitem__
    monkeypatch.setattr(CheckpointTensors, "__getitem__", lambda self, key: reads.append(key) or get(self, key))
    model = from_hf(tmp_path)
    ignored = {k for k in weight_map if k.endswith(("layers.3.embed_tokens.weight", "shared_head.head.weight"))}
    assert sorted(reads) == sorted(set(weight_map) - ignored)  # each once; the MTP layer's copies never
    live = from_hf(hf_glm())
    for name, tensor in live.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0)


def test_an_expert_missing_from_the_checkpoint_is_named_before_any_tensor_is_read(tmp_path, monkeypatch) -> None:
    save_glm(tmp_path, change=lambda t: t.pop("model.layers.3.mlp.experts.5.up_proj.weight"))
    monkeypatch.setattr(CheckpointTensors, "__getitem__", lambda self, key: pytest.fail(f"read {key}"))
    with pytest.raises(
        ValueError,
        match=r"mtp.layers.0.layer.mlp.experts: expert 5 is missing from the checkpoint "
        r"\(mtp.layers.0.layer.mlp.experts.5.up_proj.weight\)",
    ):
        from_hf(tmp_path)


def test_an_mtp_layer_whose_shapes_do_not_match_the_target_is_refused(tmp_path) -> None:
    def narrow(t):
        t["model.layers.3.self_attn.q_proj.weight"] = t["model.layers.3.self_attn.q_proj.weight"][:32].contiguous()

    save_glm(tmp_path, change=narrow)
    with pytest.raises(
        ValueError,
        match=r"model.layers.3.self_attn.q_proj.weight \(mtp.layers.0.layer.self_attn.q_proj.weight\): shape "
        r"\(32, 32\) in the checkpoint, the model expects \(64, 32\) \(the MTP layer must have",
    ):
        from_hf(tmp_path)

    def expert_narrow(t):
        t["model.layers.3.mlp.experts.2.down_proj.weight"] = t["model.layers.3.mlp.experts.2.down_proj.weight"][
            :, :4
        ].contiguous()

    save_glm(tmp_path, change=expert_narrow)
    with pytest.raises(
        ValueError, match=r"experts.2.down_proj.weight: expert shape \(32, 4\), the model expects \(32, 8\)"
    ):
        from_hf(tmp_path)


def test_unsupported_configs_are_refused_before_any_weight_is_read(tmp_path) -> None:
    hf = hf_glm().config.to_dict()
    assert config_from_hf(hf).moe.topk_method == "noaux_tc"
    with pytest.raises(ValueError, match="unsupported MoE routing method topk_method='group_limited_greedy'"):
        config_from_hf({**hf, "topk_method": "group_limited_greedy"})
    assert (
        config_from_hf({**hf, "num_nextn_predict_layers": 2}).mtp_num_layers == 2
    )  # a 2-module head (test_mtp_layers)
    (tmp_path / "config.json").write_text(json.dumps({**hf, "topk_method": "softmax_topk"}))  # and no weights
    with pytest.raises(ValueError, match="topk_method='softmax_topk'"):
        from_hf(tmp_path)


def test_tensor_parallelism_shards_moe_families() -> None:
    from fdecode.models.parallel import TPGroup
    from fdecode.models.sharding import parallelize_pair

    target = from_hf(hf_glm())
    sharded, _ = parallelize_pair(target, target, LM, TPGroup(group=None, rank=1, size=2))
    assert sharded.tp.size == 2 and sharded.lm_head.weight.shape[0] == 49  # 97 rows: 2 x 49, the last padded


@pytest.mark.slow
def test_inspect_one_graph_no_breaks_no_syncs() -> None:
    """The MoE step with its MTP head: one graph, no break, no host sync (the routers' top-k and the
    experts' gathers included), the fused prepare op once."""
    target = from_hf(hf_glm())
    target.mtp = Glm4MoeMTPHead.random(target.config, seed=4, std=0.3).bind(target)
    step = compiled(target, "mtp", 2, backend="aot_eager")
    state = step.prefill(list(PROMPTS[:2]), max_new_tokens=NEW, temperature=[0.0, 0.8], top_k=[0, 5])
    report = fdecode.inspect(step, state)
    assert report.graph_count == 1 and report.graph_break_count == 0, report.break_reasons
    assert report.op_counts["fdecode::prepare_next_draft"] == 1
    assert report.host_syncs == []


@pytest.mark.slow
def test_random_sampling_follows_the_filtered_target() -> None:
    """Two new tokens over a 5-token vocabulary (25 outcomes, enumerated) from 1024 seeded lane-runs of
    the GLM MoE target with its MTP head, K = 2: a chi-square test against the exact distribution."""
    from support.stats import assert_two_new_tokens_follow_the_target

    from fdecode.models.families.glm4_moe import Glm4MoeConfig
    from fdecode.models.moe_config import MoEConfig

    v = 5
    cfg = Glm4MoeConfig(
        vocab_size=v,
        hidden_size=16,
        intermediate_size=24,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        attention_bias=True,
        model_type="glm4_moe",
        mtp_num_layers=1,
        moe=MoEConfig(num_experts=4, top_k=2, moe_intermediate_size=8, n_group=2, topk_group=1),
    )
    target = Glm4MoeModel.random(cfg, seed=11, std=0.6)
    target.mtp = Glm4MoeMTPHead.random(cfg, seed=12, std=0.6).bind(target)
    lanes, prompt, params = 128, [1, 3, 2], dict(temperature=0.9, top_k=0, top_p=0.9, min_p=0.0)
    step = compiled(target, "mtp", 2, max_batch=lanes, max_seq_len=8)
    assert_two_new_tokens_follow_the_target(step, target, prompt, params, vocab=v, lanes=lanes)


def test_save_hf_refuses_glm_and_says_how_to_save_it(tmp_path) -> None:
    from fdecode.models import save_hf

    with pytest.raises(ValueError, match="Glm4MoeForCausalLM.save_pretrained"):
        save_hf(from_hf(hf_glm()), tmp_path)
    assert not any(tmp_path.iterdir())


def test_router_correction_bias_stays_float32_in_a_bfloat16_model() -> None:
    """As in transformers (`_keep_in_fp32_modules_strict`): the bias that picks the experts is not rounded."""
    hf = hf_glm()
    model = from_hf(hf, dtype=torch.bfloat16)
    bias = model.layers[1].mlp.gate.e_score_correction_bias
    assert model.layers[1].mlp.experts.gate_up_proj.dtype == torch.bfloat16 and bias.dtype == torch.float32
    assert torch.equal(bias, hf.model.layers[1].mlp.gate.e_score_correction_bias)
    step = compiled(model, model, 2)  # the step's copy keeps it too (`resolve.owned` keeps buffer dtypes)
    assert step.target.layers[1].mlp.gate.e_score_correction_bias.dtype == torch.float32


def test_shards_without_an_index_load_and_a_missing_shard_is_named(tmp_path) -> None:
    save_glm(tmp_path, mtp=False)
    index = tmp_path / "model.safetensors.index.json"
    listed = json.loads(index.read_text())
    index.unlink()  # the keys then come from every *.safetensors file's header
    assert len(CheckpointTensors(tmp_path)) == len(listed["weight_map"])
    torch.testing.assert_close(from_hf(tmp_path).state_dict(), from_hf(hf_glm()).state_dict(), rtol=0, atol=0)
    index.write_text(json.dumps(listed))
    lost = sorted(set(listed["weight_map"].values()))[1]
    (tmp_path / lost).unlink()
    with pytest.raises(FileNotFoundError, match=f"names shard\\(s\\) the folder lacks: {lost}"):
        from_hf(tmp_path)
