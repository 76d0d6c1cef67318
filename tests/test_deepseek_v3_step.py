"""The decode step on DeepSeek-V3 (issue 17): MLA over the latent cache, MoE, the DeepSeek MTP head.

Lossless greedy against transformers' generate with the MTP head loaded from a sharded checkpoint
folder in DeepSeek's layout (K = 3) and with the target as its own draft (K = 2, every draft
accepted), eager and inductor; exact-distribution sampling; the Engine; context buckets;
the baselines; backend, kernel and tensor-parallel refusals; a bad MTP layer. (`fdecode.inspect` of
the step: tests/test_deepseek_v3.py, with the check that no per-head keys are formed.)
"""

from __future__ import annotations

import pytest
import torch
from support.deepseek_models import (
    NEW,
    PROMPTS,
    TINY_MLA,
    compiled,
    deepseek_target,
    generate,
    hf_greedy,
    random_mtp_state,
    save_with_mtp,
)
from support.deepseek_models import TINY_MLA_VOCAB as SAMPLING_V
from support.hybrid_models import run, staggered  # (tokens per prompt, accepted length per live lane-step, last state)

import fdecode
from fdecode.drafts import LM
from fdecode.models.families.deepseek_v3 import DeepseekV3Model
from fdecode.models.mtp.nextn import NextNMTPHead


def test_target_as_its_own_draft_accepts_every_draft() -> None:
    target = deepseek_target()
    outs, lengths, _ = run(compiled(target, target, 2), PROMPTS, NEW)
    assert outs == [hf_greedy(p) for p in PROMPTS]
    assert lengths.count(3) >= len(lengths) - len(PROMPTS) and all(n <= 3 for n in lengths)


def test_mtp_head_from_a_sharded_checkpoint_folder_is_lossless(tmp_path) -> None:
    save_with_mtp(tmp_path, random_mtp_state())
    step = compiled(str(tmp_path), "mtp", 3)
    assert isinstance(step.draft, NextNMTPHead) and step.draft_kind == "mtp"
    assert step.draft.kv_config.kv_shape(8) == (1, 1, 8, 1, 24)  # one MLA layer: its own latent cache
    assert (
        type(step.draft.layers[0].layer.mlp).__name__ == "DeepseekMoE"
    )  # layer num_hidden_layers >= first_k_dense_replace
    outs, _, _ = run(step, PROMPTS, NEW)
    assert outs == [hf_greedy(p) for p in PROMPTS]


def test_an_mtp_layer_of_the_wrong_shape_is_refused(tmp_path) -> None:
    state = random_mtp_state()
    state["layers.0.layer.self_attn.kv_b_proj.weight"] = torch.zeros(4 * 20, 16)  # Dn + Dv = 20, the target's is 22
    save_with_mtp(tmp_path, state)
    with pytest.raises(ValueError, match=r"mtp\.layers\.0\.layer\.self_attn\.kv_b_proj\.weight"):
        compiled(str(tmp_path), "mtp", 2)


@pytest.mark.slow
def test_inductor_mtp_head_is_lossless(tmp_path) -> None:
    """Inductor's code for MLA, MoE and the MTP head, at a capacity that is not a whole number of blocks
    (as tests/test_lossless.py's Inductor tests for LM and n-gram drafts), through the graph of every
    window, with layers as compile regions (the default from 12 layer calls a step). K = 1 keeps the
    compile in CI's budget."""
    save_with_mtp(tmp_path, random_mtp_state())
    step = compiled(
        str(tmp_path),
        "mtp",
        1,
        backend="inductor",
        max_seq_len=37,
        block_size=8,
        context_buckets=(16,),
        layer_regions=True,
    )
    assert step.dynamic_window and step.config.max_seq_len % 8
    outs, _, _ = run(step, PROMPTS, NEW)
    assert outs == [hf_greedy(p) for p in PROMPTS]


def test_engine_staggered_arrivals_equal_one_at_a_time_decoding() -> None:
    """Two lanes, four requests arriving over time: lanes re-primed mid-flight next to a live lane."""
    target = deepseek_target()
    engine = fdecode.Engine(compiled(target, target, 2, max_batch=2))
    arrivals = {0: [PROMPTS[0], PROMPTS[2]], 1: [PROMPTS[1]], 3: [PROMPTS[2][:3]]}
    got, want = staggered(engine, arrivals, [5, 9, 6, 7], hf_greedy)
    assert got == want


def test_context_buckets_and_the_baselines() -> None:
    """The latent cache is read through a context window that changes as lanes grow; the before loop
    and target-only decoding (what the benchmark compares against) give transformers' tokens too."""
    from fdecode.baseline import BeforeLoop, TargetOnly

    target = deepseek_target()
    step = compiled(target, target, 2, context_buckets=(8, 16, 24))
    want = [hf_greedy(p) for p in PROMPTS]
    assert generate(step) == want
    assert len(step.compile_seconds) >= 2, step.compile_seconds  # more than one window ran
    before, iterations = BeforeLoop(step, backend="eager").generate([list(p) for p in PROMPTS], max_new_tokens=NEW)
    assert before == want and iterations < NEW
    only, _ = TargetOnly(step, backend="eager").generate([list(p) for p in PROMPTS], max_new_tokens=NEW)
    assert only == want


@pytest.mark.slow
def test_random_sampling_follows_the_filtered_target() -> None:
    """Two new tokens over a 5-token vocabulary (25 outcomes, enumerated) from 1024 seeded lane-runs,
    K = 2 with another random DeepSeek as the draft: a chi-square test against the exact distribution."""
    from support.stats import assert_two_new_tokens_follow_the_target

    target = DeepseekV3Model.random(TINY_MLA, seed=11, std=0.6)
    draft = DeepseekV3Model.random(TINY_MLA, seed=12, std=0.6)
    lanes, prompt, params = 128, [1, 3, 2], dict(temperature=0.9, top_k=0, top_p=0.9, min_p=0.0)
    step = compiled(target, draft, 2, max_batch=lanes, max_seq_len=8)

    assert_two_new_tokens_follow_the_target(step, target, prompt, params, vocab=SAMPLING_V, lanes=lanes)


def test_backends_kernels_and_tensor_parallelism_state_what_they_refuse() -> None:
    from fdecode.graphs.backends import ELIGIBILITY, choose_attention, latent_reason
    from fdecode.models.parallel import TPGroup
    from fdecode.models.sharding import parallelize_pair

    target = deepseek_target()
    assert "MLA latent cache" in latent_reason(target, target)
    for kernel, device in (("flash_attn", "cuda"), ("npu_fused_infer_attention", "npu")):
        cfg = fdecode.DecodeConfig(
            num_draft_tokens=2,
            max_batch=2,
            max_seq_len=512,
            block_size=256,
            device=device,
            dtype=torch.bfloat16,
            attention=kernel,
        )
        with pytest.raises(ValueError, match="MLA latent cache"):
            choose_attention(cfg, ((4, 4, 8),), latent=latent_reason(target, target))
        auto = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=512, device=device)
        kernel_run, reason = choose_attention(auto, ((4, 4, 8),), latent=latent_reason(target, target))
        assert kernel_run == "torch" and kernel in reason
    # Graph replay holds the latent leaves as it holds any KV leaf: no MLA-specific refusal.
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=32, device="cuda", dtype=torch.float16)
    assert "MLA" not in (ELIGIBILITY["cudagraphs"](cfg, target, target, LM) or "")
    sharded, _ = parallelize_pair(target, target, LM, TPGroup(group=None, rank=1, size=2))
    assert sharded.tp.size == 2 and sharded.lm_head.weight.shape[0] == 49  # 97 rows: 2 x 49, the last padded
