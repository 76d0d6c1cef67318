"""Qwen3-Next and Qwen3.5-MoE (issue 17): the hybrid DeltaNet + gated-attention decoder with the Qwen MoE,
against transformers' Qwen3NextForCausalLM and Qwen3_5MoeForCausalLM.

Qwen3-Next differs from Qwen3.5 in its fused per-key-head DeltaNet projections and its MLPs (MoE with a
dense layer 1 here, `mlp_only_layers`); Qwen3.5-MoE in its MLPs (all MoE). Logits in prefill and in
incremental decode through the carried recurrent state; greedy decoding with the MTP head loaded from
a checkpoint folder in the family's layout (per-expert keys, the MTP layer an MoE) and with the target
as its own draft; the Engine, inspect, backends and errors.
"""

from __future__ import annotations

import pytest
import torch
from support.hybrid_models import (
    PATTERNS,
    PROMPTS,
    compiled,
    hf_config,
    hf_greedy,
    hf_hybrid,
    paged,
    prompts,
    run,
    save_with_mtp,
)

import fdecode
from fdecode.drafts import LM
from fdecode.models import from_hf
from fdecode.models.dense import dense_forward
from fdecode.models.families.qwen3_5 import moe_config_from_hf
from fdecode.models.families.qwen3_next import config_from_hf as next_config_from_hf
from fdecode.models.layers.deltanet import FusedGatedDeltaNet, GatedDeltaNet
from fdecode.models.layers.moe import QwenMoE
from fdecode.models.mtp.hybrid import HybridMTPHead

FAMILIES = ["qwen3_next", "qwen3_5_moe"]
PATTERN = "full-lin-lin-full"


def greedy(family: str) -> list[list[int]]:
    return [hf_greedy(p, PATTERN, family=family) for p in PROMPTS]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_prefill_logits_match_transformers(family: str, pattern: str) -> None:
    hf = hf_hybrid(pattern, family=family)
    model = from_hf(hf)
    deltanet = model.layers[1].linear_attn
    assert type(deltanet) is (FusedGatedDeltaNet if family == "qwen3_next" else GatedDeltaNet)
    # Qwen3-Next: layer 1 is in mlp_only_layers (dense), the others MoE; Qwen3.5-MoE: every layer MoE.
    assert [isinstance(layer.mlp, QwenMoE) for layer in model.layers] == [True, family == "qwen3_5_moe", True, True]
    for seq in prompts():
        expected = hf(seq[None]).logits[0]
        logits, _ = dense_forward(model, seq[None])
        assert expected.abs().max() > 1.0
        torch.testing.assert_close(logits[0], expected, rtol=0, atol=1e-4)


def test_the_text_part_of_a_multimodal_qwen3_5_moe_checkpoint_loads(tmp_path) -> None:
    """A `qwen3_5_moe` folder: config under text_config, weights under model.language_model.*, a vision
    tower's keys (ignored); per-expert keys. Its logits are the text model's."""
    import json

    from safetensors.torch import load_file, save_file

    hf = hf_hybrid(PATTERN, family="qwen3_5_moe")
    hf.save_pretrained(tmp_path)
    weights = {
        k.replace("model.", "model.language_model.", 1): t
        for k, t in load_file(str(tmp_path / "model.safetensors")).items()
    }
    weights["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3)
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    text = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"model_type": "qwen3_5_moe", "text_config": text, "vision_config": {}, "tie_word_embeddings": False}
        )
    )
    assert any(".experts.0.gate_proj." in k for k in weights)  # save_pretrained wrote the experts apart
    model = from_hf(tmp_path)
    assert model.config.model_type == "qwen3_5_moe_text" and model.config.moe.router == "softmax"
    seq = prompts()[0]
    torch.testing.assert_close(dense_forward(model, seq[None])[0][0], hf(seq[None]).logits[0], rtol=0, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_decode_matches_transformers(family: str) -> None:
    """Prefill 5 tokens, then 1 and 3 rows at a time from the carried (conv, rec) state."""
    hf = hf_hybrid(PATTERN, family=family)
    model = from_hf(hf)
    seq = prompts((17,))[0]
    expected = hf(seq[None]).logits[0]
    n = len(seq)
    kv, table, slot = paged(model, n)
    conv, rec = model.new_recurrent(1, 1, dtype=torch.float32, device="cpu")
    state, start = (conv[:, :, 0], rec[:, :, 0]), 0
    for stop in (5, 6, 9, 12, 13, n):
        pos = torch.arange(start, stop)[None]
        logits, _, snaps = model(
            seq[None, start:stop], pos, slot(pos), kv, table, block_size=n, recurrent=state, snapshots=True
        )
        torch.testing.assert_close(logits[0], expected[start:stop], rtol=0, atol=1e-4)
        state, start = (snaps[0][:, :, -1], snaps[1][:, :, -1]), stop


@pytest.mark.parametrize("family", FAMILIES)
def test_target_as_its_own_draft_is_lossless(family: str) -> None:
    target = from_hf(hf_hybrid(PATTERN, family=family))
    outs, lengths, _ = run(compiled(target, target, 2), PROMPTS)
    assert outs == greedy(family)
    assert lengths.count(3) >= len(lengths) - len(PROMPTS)  # every draft accepted but at the budget's end


@pytest.mark.parametrize("family", FAMILIES)
def test_mtp_head_from_a_checkpoint_folder_is_lossless(tmp_path, family: str) -> None:
    """The folder: transformers' save_pretrained (per-expert keys) plus a random `mtp.*` head whose layer
    is an MoE, its experts per expert too; K = 3."""
    save_with_mtp(tmp_path, family=family)
    step = compiled(str(tmp_path), "mtp", 3)
    assert isinstance(step.draft, HybridMTPHead) and isinstance(step.draft.layers[0].mlp, QwenMoE)
    outs, _, _ = run(step, PROMPTS)
    assert outs == greedy(family)


@pytest.mark.slow
def test_captured_mtp_head_of_two_layers_is_lossless(tmp_path) -> None:
    """Qwen3-Next captured (dynamo), K = 2 over a 2-layer MTP head (both layers run; K = 3 > n, which
    reuses layer 0, runs eagerly in test_mtp_layers.py). Inductor's code for these layers' ops is checked
    where each family's step compiles with it: DeltaNet in test_qwen3_5_step.py, MoE in
    test_deepseek_v3_step.py."""
    save_with_mtp(tmp_path, family="qwen3_next", layers=2)
    step = compiled(str(tmp_path), "mtp", 2, backend="dynamo")
    assert step.draft.num_mtp_layers == 2
    outs, _, _ = run(step, PROMPTS)
    assert outs == greedy("qwen3_next")


def test_engine_staggered_arrivals_equal_one_at_a_time_decoding() -> None:
    target = from_hf(hf_hybrid(PATTERN, family="qwen3_5_moe"))
    engine = fdecode.Engine(compiled(target, target, 2, max_batch=2))
    arrivals = {0: [PROMPTS[0], PROMPTS[2]], 2: [PROMPTS[1]]}
    budgets = iter([5, 9, 7])
    want, got, tick = {}, {}, 0
    while tick <= max(arrivals) or engine.has_work():
        for prompt in arrivals.get(tick, []):
            budget = next(budgets)
            want[engine.add_request(list(prompt), max_new_tokens=budget)] = hf_greedy(
                prompt, PATTERN, family="qwen3_5_moe"
            )[:budget]
        for event in engine.step():
            got[event.request_id] = got.get(event.request_id, []) + event.new_tokens
        tick += 1
        assert tick < 100
    assert got == want


@pytest.mark.slow
def test_inspect_one_graph_no_breaks_no_syncs(tmp_path) -> None:
    save_with_mtp(tmp_path, family="qwen3_next")
    step = compiled(str(tmp_path), "mtp", 2, backend="aot_eager")
    state = step.prefill(list(PROMPTS[:2]), max_new_tokens=8, temperature=[0.0, 0.8], top_k=[0, 5])
    report = fdecode.inspect(step, state)
    assert report.graph_count == 1 and report.graph_break_count == 0, report.break_reasons
    assert report.op_counts["fdecode::prepare_next_draft"] == 1
    assert report.host_syncs == []


def test_backends_and_tensor_parallelism_refuse_with_a_reason() -> None:
    from fdecode.graphs.backends import ELIGIBILITY
    from fdecode.models.parallel import TPGroup
    from fdecode.models.sharding import parallelize_pair

    target = from_hf(hf_hybrid(PATTERN, family="qwen3_next"))
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=32, device="cuda", dtype=torch.float16)
    assert "recurrent-state leaves" in ELIGIBILITY["cudagraphs"](cfg, target, target, LM)
    sharded, _ = parallelize_pair(target, target, LM, TPGroup(group=None, rank=1, size=2))
    assert sharded.tp.size == 2 and sharded.lm_head.weight.shape[0] == 49  # 97 rows: 2 x 49, the last padded


def test_bad_configs_and_checkpoints_are_refused(tmp_path) -> None:
    from fdecode.models.hybrid_config import HybridConfig

    base = hf_config(PATTERNS[PATTERN]).to_dict()
    with pytest.raises(ValueError, match=r"num_experts_per_tok \(5\) must be in 1 .. n_routed_experts \(4\)"):
        next_config_from_hf({**base, "num_experts": 4, "num_experts_per_tok": 5, "moe_intermediate_size": 8})
    with pytest.raises(ValueError, match="qwen3_5_moe checkpoint with text_config of model_type 'qwen3_5_text'"):
        moe_config_from_hf({"model_type": "qwen3_5_moe", "text_config": {**base, "model_type": "qwen3_5_text"}})
    with pytest.raises(ValueError, match="without MoE layers needs intermediate_size"):
        HybridConfig(**{**next_config_from_hf({**base, "num_experts": 0}).__dict__, "intermediate_size": 0})
    # An expert of the MTP layer missing from the checkpoint, named with its layer and number.
    save_with_mtp(tmp_path, family="qwen3_next", drop="mtp.layers.0.mlp.experts.2.up_proj.weight")
    with pytest.raises(ValueError, match=r"mtp\.layers\.0\.mlp\.experts: expert 2 is missing"):
        from_hf(tmp_path)
