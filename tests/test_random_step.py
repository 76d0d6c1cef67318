"""Random mode end to end: the step's emitted tokens follow the target's filtered distribution.

A 5-token vocabulary makes the exact distribution of the next three tokens
enumerable from the target model (125 outcomes), so the sampled sequences are
checked with a chi-square test at ALPHA (fixed seeds: deterministic in CI).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import pytest
import torch

import fdecode
from conftest import fdecode_target, fresh_forward, hf_greedy, independent_draft
from fdecode.models import LlamaModel, ModelConfig
from test_sampling import ALPHA, chi2_pvalue, reference_filter

V = 5
PROMPT = [1, 3, 2]
LANES = 64
TINY = ModelConfig(
    vocab_size=V, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8
)


def tiny_target() -> LlamaModel:
    return LlamaModel.random(TINY, seed=11, std=0.6)


def tiny_draft(kind: str, target: LlamaModel) -> LlamaModel:
    if kind == "self":
        return target
    if kind == "random":
        return LlamaModel.random(TINY.replace(num_layers=1), seed=5, std=0.6)
    if kind == "adversarial":  # puts nearly all its mass on one token, whatever the context
        draft = LlamaModel.random(TINY.replace(num_layers=1), seed=6, std=0.6)
        with torch.no_grad():
            draft.lm_head.weight.zero_()
            draft.lm_head.weight[4] = 50.0
        return draft
    raise ValueError(kind)


def logits_after(model: LlamaModel, seq: list[int]) -> torch.Tensor:
    """Next-token logits after `seq` from a plain forward (one lane, fresh cache)."""
    return fresh_forward(model, seq)[0][0, -1]


def exact_distribution(target: LlamaModel, params: dict) -> torch.Tensor:
    """P(t1, t2, t3 | PROMPT) under the filtered target, enumerated: [V**3] float64."""
    def dist(seq):
        return reference_filter(logits_after(target, seq), params["temperature"], params["top_k"], params["top_p"], params["min_p"])

    probs = torch.zeros(V, V, V, dtype=torch.float64)
    p1 = dist(PROMPT)
    for a in range(V):
        if p1[a] == 0:
            continue
        p2 = dist(PROMPT + [a])
        for b in range(V):
            if p2[b] > 0:
                probs[a, b] = p1[a] * p2[b] * dist(PROMPT + [a, b])
    return probs.flatten()


def sampled_sequences(step, params: dict, batches: int) -> torch.Tensor:
    """Three new tokens for LANES x batches independent seeds: [N, 3]."""
    out = []
    for batch in range(batches):
        seeds = [1000 * batch + lane for lane in range(LANES)]
        got = fdecode.generate(step, [PROMPT] * LANES, max_new_tokens=3, seed=seeds, **params)
        out.append(torch.tensor(got))
    return torch.cat(out)


CASES = [
    # (draft, K, sampling parameters)
    ("self", 1, dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)),
    ("random", 1, dict(temperature=0.7, top_k=3, top_p=1.0, min_p=0.0)),
    ("adversarial", 1, dict(temperature=1.3, top_k=0, top_p=0.8, min_p=0.0)),
    ("self", 3, dict(temperature=0.8, top_k=4, top_p=0.9, min_p=0.0)),
    ("random", 3, dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1)),
    ("adversarial", 3, dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)),
]


@pytest.mark.parametrize(("draft_kind", "k", "params"), CASES)
def test_emitted_sequences_follow_the_filtered_target(draft_kind, k, params):
    target = tiny_target()
    cfg = fdecode.DecodeConfig(num_draft_tokens=k, max_batch=LANES, max_seq_len=12, block_size=4, backend="eager")
    step = fdecode.compile(target, tiny_draft(draft_kind, target), cfg)
    samples = sampled_sequences(step, params, batches=40)
    cells = samples[:, 0] * V * V + samples[:, 1] * V + samples[:, 2]
    expected = exact_distribution(target, params)
    assert chi2_pvalue(torch.bincount(cells, minlength=V**3), expected) > ALPHA
    assert expected[torch.bincount(cells, minlength=V**3) > 0].min() > 0  # nothing the filters exclude


TRUNCATED_CASES = [  # (draft, K, sampling parameters); the draft proposes from its top 2 of 5 tokens
    ("self", 2, dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)),  # full plan
    ("random", 3, dict(temperature=0.9, top_k=4, top_p=0.9, min_p=0.0)),  # full+top_k+top_p plan
]


@pytest.mark.parametrize(("draft_kind", "k", "params"), TRUNCATED_CASES)
def test_drafts_truncated_to_their_candidates_keep_the_target_distribution(draft_kind, k, params):
    """Drafts propose from their top `top_k_candidates` tokens only (`fdecode.step.propose`), here fewer
    than the target keeps: the committed tokens still follow the target's filtered distribution."""
    target = tiny_target()
    cfg = fdecode.DecodeConfig(num_draft_tokens=k, max_batch=LANES, max_seq_len=12, block_size=4, backend="eager",
                               top_k_candidates=2)
    step = fdecode.compile(target, tiny_draft(draft_kind, target), cfg)
    check_follows_the_target(step, target, params)


def check_follows_the_target(step, target: LlamaModel, params: dict) -> None:
    """Three new tokens of `step` on LANES x 40 seeds follow the filtered target's distribution (chi-square),
    and none of them is one the filters exclude."""
    samples = sampled_sequences(step, params, batches=40)
    cells = samples[:, 0] * V * V + samples[:, 1] * V + samples[:, 2]
    expected = exact_distribution(target, params)
    counts = torch.bincount(cells, minlength=V**3)
    assert chi2_pvalue(counts, expected) > ALPHA
    assert expected[counts > 0].min() > 0


def test_draft_equal_to_target_accepts_everything():
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=4, max_seq_len=64, block_size=4, backend="eager")
    step = fdecode.compile(target, independent_draft("self", target), cfg)
    state = step.prefill([[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]], max_new_tokens=40, temperature=0.9, top_p=0.95, seed=3)
    for _ in range(6):
        state, out = step(state)
        assert out.num_tokens.tolist() == [4, 4, 4, 4]


def run_lanes(step, prompts, seeds, temperature=0.9):
    return fdecode.generate(step, prompts, max_new_tokens=12, temperature=temperature, top_k=20, seed=seeds)


def partial_step(backend="eager", k=2):
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=k, max_batch=3, max_seq_len=40, block_size=4, backend=backend)
    return fdecode.compile(target, independent_draft("partial", target), cfg)


def test_a_lanes_tokens_do_not_depend_on_the_other_lanes():
    step = partial_step()
    a, b, c = [5, 17, 33], [7, 3], [11, 12, 13, 14]
    alone = run_lanes(step, [a], [42])[0]
    assert run_lanes(step, [a, b], [42, 1])[0] == alone
    assert run_lanes(step, [c, b, a], [9, 1, 42])[2] == alone
    assert run_lanes(step, [a], [43])[0] != alone  # and the seed matters


def test_greedy_and_random_lanes_mix_in_one_batch():
    step = partial_step()
    prompts = [(5, 17, 33, 2), (7, 3), (11, 12, 13)]
    got = fdecode.generate(step, prompts, max_new_tokens=12, temperature=[0.0, 1.0, 0.0], seed=[0, 1, 2])
    assert got[0] == hf_greedy(prompts[0], 12) and got[2] == hf_greedy(prompts[2], 12)
    assert got[1] != hf_greedy(prompts[1], 12)


def test_same_seed_same_tokens_in_another_process():
    script = textwrap.dedent(
        """
        import sys; sys.path.insert(0, "tests")
        import test_random_step as t
        print(t.run_lanes(t.partial_step(), [[5, 17, 33], [7, 3]], [42, 7]))
        """
    )
    here = str(run_lanes(partial_step(), [[5, 17, 33], [7, 3]], [42, 7]))
    other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=_root())
    assert other.stdout.strip().splitlines()[-1] == here


def _root() -> str:
    import pathlib

    return str(pathlib.Path(__file__).resolve().parent.parent)


def test_every_outcome_enumerated_sums_to_one():
    probs = exact_distribution(tiny_target(), dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0))
    assert abs(float(probs.sum()) - 1) < 1e-9
    assert len(list(itertools.product(range(V), repeat=3))) == probs.numel()
