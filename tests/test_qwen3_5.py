"""Qwen3.5 (Gated DeltaNet + gated attention): logits parity with transformers' Qwen3_5ForCausalLM.

Tiny random fp32 configs with a mix of linear and full layers, GQA and partial RoPE; every
parameter is re-drawn at a scale where a dropped norm offset, a swapped gate half or a wrong
rotary width moves the logits by far more than the 1e-4 tolerance.
"""

from __future__ import annotations

import functools

import pytest
import torch
import transformers

from fdecode.models import from_hf
from fdecode.models.dense import dense_forward
from fdecode.models.hybrid import HybridModel
from fdecode.models.hybrid_config import FULL, LINEAR

VOCAB = 97
PATTERNS = {
    "lin-lin-lin-full": (LINEAR, LINEAR, LINEAR, FULL),
    "full-lin-lin-full": (FULL, LINEAR, LINEAR, FULL),
}


def hf_config(layer_types=PATTERNS["lin-lin-lin-full"], **overrides) -> transformers.Qwen3_5TextConfig:
    base = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=len(layer_types),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,  # GQA 2:1, rotary dim 4 of 16
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        layer_types=list(layer_types), max_position_embeddings=512, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    base.update(overrides)
    return transformers.Qwen3_5TextConfig(**base)


@functools.lru_cache(maxsize=None)
def hf_hybrid(pattern: str = "lin-lin-lin-full", seed: int = 0, **overrides) -> transformers.Qwen3_5ForCausalLM:
    """A random Qwen3.5 whose every weight is drawn afresh (transformers' init zeroes the norms)."""
    torch.manual_seed(seed)
    model = transformers.Qwen3_5ForCausalLM(hf_config(PATTERNS[pattern], **dict(overrides))).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.05, 1.0, generator=gen).log())
            elif name.endswith("dt_bias"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return model


def prompts(lengths=(7, 11, 4), seed=1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen) for n in lengths]


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_prefill_logits_match_transformers(pattern: str) -> None:
    hf = hf_hybrid(pattern)
    model = from_hf(hf)
    assert isinstance(model, HybridModel) and model.config.layer_types == PATTERNS[pattern]
    for seq in prompts():
        expected = hf(seq[None]).logits[0]
        logits, _ = dense_forward(model, seq[None])
        assert expected.abs().max() > 1.0  # the comparison is not between near-zero logits
        torch.testing.assert_close(logits[0], expected, rtol=0, atol=1e-4)


def paged(model: HybridModel, length: int):
    """One lane in block 1 of a throwaway cache (block_size = length): (kv, block_tables, slot of p)."""
    kv = model.kv_config.new_kv(2 * length, dtype=torch.float32, device="cpu")
    return kv, torch.tensor([[1]]), lambda p: length + p


@pytest.mark.parametrize("chunk", [1, 3])
def test_incremental_decode_matches_transformers(chunk: int) -> None:
    """Prefill 5 tokens, then feed the rest `chunk` rows at a time from the carried (conv, rec) state."""
    hf = hf_hybrid("full-lin-lin-full")
    model = from_hf(hf)
    seq = prompts((17,))[0]
    expected = hf(seq[None]).logits[0]  # [17, V]
    n = len(seq)
    kv, table, slot = paged(model, n)
    conv, rec = model.new_recurrent(1, 1, dtype=torch.float32, device="cpu")
    state = (conv[:, :, 0], rec[:, :, 0])
    start = 0
    for stop in [5, *range(5 + chunk, n, chunk), n]:
        pos = torch.arange(start, stop)[None]
        logits, _, snaps = model(seq[None, start:stop], pos, slot(pos), kv, table, block_size=n, recurrent=state,
                                 snapshots=True)
        torch.testing.assert_close(logits[0], expected[start:stop], rtol=0, atol=1e-4)
        state = (snaps[0][:, :, -1], snaps[1][:, :, -1])  # [B, L_lin, ...] after the last row
        start = stop


# ---- the decode step: verify with rollback, lossless greedy, state checks ----------------------------

import copy  # noqa: E402

import fdecode  # noqa: E402

NEW = 12


@functools.lru_cache(maxsize=None)
def hf_greedy(prompt: tuple[int, ...], pattern: str = "full-lin-lin-full", new: int = NEW) -> list[int]:
    out = hf_hybrid(pattern).generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def hybrid_target(pattern: str = "full-lin-lin-full") -> HybridModel:
    return from_hf(hf_hybrid(pattern))


def near_copy(model: HybridModel, noise: float = 0.15, seed: int = 5) -> HybridModel:
    """The model with noise on its MLPs: a draft that agrees with it often, not always (mixed L)."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if ".mlp." in name:
                p.add_(noise * torch.randn(p.shape, generator=gen))
    return draft


def run(step, prompts, new=NEW, **kwargs):
    """Committed tokens per prompt and the accepted length of every (lane, step) of a live lane."""
    state = step.prefill(prompts, max_new_tokens=new, **kwargs)
    outs, lengths, out, first = [[] for _ in prompts], [], state.step_output, True
    while True:
        for lane in range(len(prompts)):
            n = int(out.num_tokens[lane])
            outs[lane] += out.tokens[lane, :n].tolist()
            if n and not first:
                lengths.append(n)
        if bool(out.finished[: len(prompts)].all()):
            return outs, lengths, state
        state, out = step(state)
        first = False


PROMPTS = [tuple(p.tolist()) for p in prompts((7, 11, 4))]


def compiled(target, draft, k: int, backend: str = "eager", **changes):
    cfg = fdecode.DecodeConfig(num_draft_tokens=k, max_batch=4, max_seq_len=64, block_size=4, backend=backend, **changes)
    return fdecode.compile(target, draft, cfg)


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


def scratch_states(model: HybridModel, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(conv [L, C, k-1], rec [L, Hv, dk, dv]) after a from-scratch forward over `tokens`."""
    n = len(tokens)
    kv, table, slot = paged(model, n)
    conv, rec = model.new_recurrent(1, 1, dtype=torch.float32, device="cpu")
    pos = torch.arange(n)[None]
    _, _, (conv, rec) = model(torch.tensor([tokens]), pos, slot(pos), kv, table, block_size=n,
                              recurrent=(conv[:, :, 0], rec[:, :, 0]))
    return conv[0], rec[0]


def test_states_after_mixed_acceptance_equal_a_from_scratch_forward() -> None:
    """After every step: the target's state = forward over the committed tokens before t, and the
    draft's copy 0 = its forward over the committed tokens through t (the current row at P)."""
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
            conv, rec = scratch_states(draft, seq)
            torch.testing.assert_close(state.draft_conv[lane, :, 0], conv, rtol=0, atol=1e-5)
            torch.testing.assert_close(state.draft_rec[lane, :, 0], rec, rtol=0, atol=1e-5)
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
