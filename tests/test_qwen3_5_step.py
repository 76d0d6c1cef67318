"""The decode step on Qwen3.5 (issue 16): verify with rollback of the recurrent state, in the graph.

Lossless greedy against transformers with the target as its own draft (L = K + 1) and a partially
agreeing hybrid draft (mixed L, so rollback runs), states after mixed acceptance against a
from-scratch forward, frozen lanes bit-identical, the MTP head from a checkpoint folder, the Engine,
exact-distribution sampling, the baselines, context buckets, backends, errors.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from support.hybrid_models import (
    NEW,
    PROMPTS,
    VOCAB,
    compiled,
    hf_greedy,
    hybrid_target,
    near_copy,
    run,
    save_with_mtp,
    scratch_states,
    staggered,
)

import fdecode
from fdecode.drafts import LM, MTP
from fdecode.models import from_hf
from fdecode.models.hybrid import HybridModel
from fdecode.models.hybrid_config import FULL, LINEAR, HybridConfig
from fdecode.models.mtp.hybrid import HybridMTPHead


@pytest.mark.parametrize("k", [1, 2, 3])
def test_target_as_its_own_draft_accepts_every_draft(k: int) -> None:
    target = hybrid_target()
    outs, lengths, _ = run(compiled(target, target, k), PROMPTS)
    assert outs == [hf_greedy(p) for p in PROMPTS]
    # Every step commits K + 1 tokens except where a lane's budget ends.
    assert lengths.count(k + 1) >= len(lengths) - len(PROMPTS) and all(n <= k + 1 for n in lengths)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_partially_agreeing_draft_is_lossless(k: int) -> None:
    target = hybrid_target()
    outs, lengths, _ = run(compiled(target, near_copy(target), k), PROMPTS)
    assert outs == [hf_greedy(p) for p in PROMPTS]
    assert len(set(lengths)) > 1 and min(lengths) < k + 1  # rollback was exercised


def test_states_after_mixed_acceptance_equal_a_from_scratch_forward() -> None:
    """After every step: the target's state = forward over the committed tokens before t; the draft's
    copy j = its forward over the committed tokens through t (the current row at P), then d'1 .. d'j."""
    target = hybrid_target()
    draft = near_copy(target, noise=0.08)
    step = compiled(target, draft, 3)
    state = step.prefill(list(PROMPTS), max_new_tokens=NEW)
    seqs = [list(p) for p in PROMPTS]
    out, mixed = state.step_output, set()
    for _ in range(6):
        for lane, seq in enumerate(seqs):
            n = int(out.num_tokens[lane])
            seq += out.tokens[lane, :n].tolist()
            mixed.add(n)
            assert int(state.base_pos[lane]) == len(seq) - 1
            conv, rec = scratch_states(target, seq[:-1])
            torch.testing.assert_close(state.target_conv[lane, :, 0], conv, rtol=0, atol=1e-5)
            torch.testing.assert_close(state.target_rec[lane, :, 0], rec, rtol=0, atol=1e-5)
            drafts = state.tokens[lane, 1:].tolist()  # d'1 .. d'K: copy j went through seq + d'1 .. d'j
            for j in range(state.draft_conv.shape[2]):
                conv, rec = scratch_states(draft, seq + drafts[:j])
                torch.testing.assert_close(state.draft_conv[lane, :, j], conv, rtol=0, atol=1e-5)
                torch.testing.assert_close(state.draft_rec[lane, :, j], rec, rtol=0, atol=1e-5)
        state, out = step(state)
    assert len(mixed - {1}) > 1  # several accepted lengths were rolled back to


def test_finished_and_free_lanes_keep_their_states_bit_identical() -> None:
    """Lane 0 stops on an id that lane 1 never emits; lanes 2, 3 are free. While lane 1 steps on, the
    recurrent leaves of the others never change, not by one bit."""
    target = hybrid_target()
    step = compiled(target, near_copy(target), 2)
    eos = next(t for t in hf_greedy(PROMPTS[0])[1:] if t not in hf_greedy(PROMPTS[1]))
    state = step.prefill([PROMPTS[0], PROMPTS[1]], max_new_tokens=NEW, eos_token_id=eos)
    leaves = ("target_conv", "target_rec", "draft_conv", "draft_rec")
    frozen: dict[int, list[torch.Tensor]] = {lane: [getattr(state, n)[lane].clone() for n in leaves] for lane in (2, 3)}
    steps_after = 0
    while not bool(state.step_output.finished[1]):
        state, out = step(state)
        for lane, before in frozen.items():
            assert all(torch.equal(getattr(state, n)[lane], b) for n, b in zip(leaves, before)), (lane, steps_after)
        if bool(out.finished[0]) and 0 not in frozen:
            frozen[0] = [getattr(state, n)[0].clone() for n in leaves]
        steps_after += 0 in frozen
    assert 0 in frozen and steps_after >= 2  # lane 0 finished while lane 1 kept stepping


@pytest.mark.slow
def test_inspect_one_graph_no_breaks_no_syncs() -> None:
    target = hybrid_target("lin-full")  # both kinds of layer; the capture does not depend on the depth
    step = compiled(target, near_copy(target), 2, backend="aot_eager")
    state = step.prefill(list(PROMPTS[:2]), max_new_tokens=NEW, temperature=[0.0, 0.8], top_k=[0, 5])
    report = fdecode.inspect(step, state)
    assert report.graph_count == 1 and report.graph_break_count == 0, report.break_reasons
    assert report.op_counts["fdecode::prepare_next_draft"] == 1
    assert report.host_syncs == []  # (the state still steps after inspect: tests/test_graph.py)


@pytest.mark.parametrize("k", [1, 3])
def test_mtp_head_from_a_checkpoint_folder_is_lossless(tmp_path, k: int) -> None:
    save_with_mtp(tmp_path)
    step = compiled(str(tmp_path), "mtp", k)
    assert isinstance(step.draft, HybridMTPHead) and step.draft_kind == "mtp"
    assert step.draft.kv_config.kv_shape(8)[0] == 1  # one gated-attention layer, its own paged KV
    outs, lengths, _ = run(step, PROMPTS)
    assert outs == [hf_greedy(p) for p in PROMPTS]


def test_engine_staggered_arrivals_equal_one_at_a_time_decoding() -> None:
    """Two lanes, five requests arriving over time: lanes are re-primed mid-flight, next to a live lane."""
    target = hybrid_target()
    engine = fdecode.Engine(compiled(target, near_copy(target), 2, max_batch=2))
    arrivals = {0: [PROMPTS[0], PROMPTS[2]], 1: [PROMPTS[1]], 3: [PROMPTS[2]], 4: [PROMPTS[0][:3]]}
    got, want = staggered(engine, arrivals, [5, 9, 6, 12, 7], hf_greedy)
    assert got == want


SAMPLING_V = 5


TINY_HYBRID = HybridConfig(
    vocab_size=SAMPLING_V,
    hidden_size=16,
    intermediate_size=32,
    num_layers=3,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    model_type="qwen3_5_text",
    layer_types=(LINEAR, FULL, LINEAR),
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_key_head_dim=4,
    linear_value_head_dim=4,
    partial_rotary_factor=0.5,
)


@pytest.mark.slow
def test_random_sampling_follows_the_filtered_target() -> None:
    """Two new tokens over a 5-token vocabulary (25 outcomes, enumerated) from 1024 seeded lanes-runs,
    K = 2 with a draft that agrees only partly: a chi-square test against the exact distribution."""
    from support.stats import assert_two_new_tokens_follow_the_target

    target = HybridModel.random(TINY_HYBRID, seed=11, std=0.6)
    draft = near_copy(target, noise=0.6)
    lanes, prompt, params = 128, [1, 3, 2], dict(temperature=0.9, top_k=0, top_p=0.9, min_p=0.0)
    step = compiled(target, draft, 2, max_batch=lanes, max_seq_len=8)
    assert_two_new_tokens_follow_the_target(step, target, prompt, params, vocab=SAMPLING_V, lanes=lanes)


@pytest.mark.slow
def test_inductor_partially_agreeing_draft_is_lossless() -> None:
    """Inductor's code for a DeltaNet + gated-attention step and its rollback, layers as compile regions (the
    default from 12 layer calls a step); two layers (one of each kind) and K = 1 keep the graph small
    enough to compile in CI's budget."""
    target = hybrid_target("lin-full")
    outs, lengths, _ = run(compiled(target, near_copy(target), 1, backend="inductor", layer_regions=True), PROMPTS)
    assert outs == [hf_greedy(p, "lin-full") for p in PROMPTS]
    assert len(set(lengths)) > 1


def test_backends_and_tensor_parallelism_refuse_hybrids_with_a_reason() -> None:
    from fdecode.graphs.backends import ELIGIBILITY, recurrent_reason
    from fdecode.models.parallel import TPGroup
    from fdecode.models.sharding import parallelize_pair

    target, llama = (
        hybrid_target(),
        from_hf(
            transformers.LlamaForCausalLM(
                transformers.LlamaConfig(
                    vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
                )
            )
        ),
    )
    assert "recurrent-state leaves" in recurrent_reason(target, HybridMTPHead(target.config), MTP)
    assert "recurrent-state leaves" in recurrent_reason(llama, target, LM)
    assert recurrent_reason(llama, llama, LM) is None
    for backend, device in (("cudagraphs", "cuda"), ("torchair", "npu")):  # on their device, before anything else
        cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=32, device=device, dtype=torch.float16)
        assert "recurrent-state leaves" in ELIGIBILITY[backend](cfg, target, target, LM)
        assert "recurrent-state leaves" not in (ELIGIBILITY[backend](cfg, llama, llama, LM) or "")
    sharded, _ = parallelize_pair(target, target, LM, TPGroup(group=None, rank=1, size=2))
    assert sharded.tp.size == 2 and sharded.lm_head.weight.shape[0] == 49  # 97 rows: 2 x 49, the last padded


def test_a_state_of_another_layout_is_refused() -> None:
    target = hybrid_target()
    step = compiled(target, target, 2)
    other = compiled(target, hybrid_target("lin-lin-lin-full"), 2)
    state = other.prefill([PROMPTS[0]], max_new_tokens=4)
    with pytest.raises(ValueError, match=r"state\.draft_conv is .* this step's draft holds"):
        step(state.clone())


@pytest.mark.parametrize("k", [1, 3])
def test_before_loop_and_target_only_carry_the_recurrent_state(k: int) -> None:
    """The baselines the benchmark compares against give transformers' greedy tokens on the hybrid too."""
    from fdecode.baseline import BeforeLoop, TargetOnly

    target = hybrid_target()
    step = compiled(target, near_copy(target), k)
    want = [hf_greedy(p) for p in PROMPTS]
    before, iterations = BeforeLoop(step, backend="eager").generate([list(p) for p in PROMPTS], max_new_tokens=NEW)
    assert before == want and iterations < NEW
    only, _ = TargetOnly(step, backend="eager").generate([list(p) for p in PROMPTS], max_new_tokens=NEW)
    assert only == want


def test_context_buckets_switch_windows_on_the_hybrid() -> None:
    """The attention layers read a context bucket; the windows change as the lanes grow, tokens do not."""
    target = hybrid_target()
    step = compiled(target, near_copy(target), 2, context_buckets=(8, 16, 24))
    outs, _, _ = run(step, PROMPTS)
    assert outs == [hf_greedy(p) for p in PROMPTS]
    assert len(step.compile_seconds) >= 2, step.compile_seconds  # more than one window ran


@pytest.mark.slow
def test_admitting_requests_into_a_live_state_never_recompiles() -> None:
    """Priming resets and fills a lane's recurrent leaves in place of the old rows: same shapes, no recompile."""
    target = hybrid_target("lin-full")  # both kinds of layer; the guards do not depend on the depth
    engine = fdecode.Engine(compiled(target, near_copy(target), 2, max_batch=2, backend="dynamo"))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i in range(5):
            engine.add_request(list(PROMPTS[i % 3]), max_new_tokens=2 + i, temperature=0.7 * (i % 2), seed=i)
            engine.step()
        engine.run()
    # No graph per admission either: the greedy plan's and the general plan's.
    assert sorted(name for _, name in engine.step_fn.plan_compile_seconds) == ["full+top_k+top_p", "greedy"]
    assert len(engine.step_fn.graphs) == 2
