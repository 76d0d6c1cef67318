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
from support.llama_models import fdecode_target, hf_greedy, independent_draft
from support.runs import partial_step, run_lanes
from support.stats import ALPHA, chi2_pvalue
from support.tiny_vocab import (
    LANES,
    V,
    check_follows_the_target,
    exact_distribution,
    sampled_sequences,
    tiny_draft,
    tiny_target,
)

import fdecode

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
    """Drafts propose from their top `top_k_candidates` tokens only (`fdecode.drafts.tokens.propose`), here fewer
    than the target keeps: the committed tokens still follow the target's filtered distribution."""
    target = tiny_target()
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=k, max_batch=LANES, max_seq_len=12, block_size=4, backend="eager", top_k_candidates=2
    )
    step = fdecode.compile(target, tiny_draft(draft_kind, target), cfg)
    check_follows_the_target(step, target, params)


def test_draft_equal_to_target_accepts_everything():
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=4, max_seq_len=64, block_size=4, backend="eager")
    step = fdecode.compile(target, independent_draft("self", target), cfg)
    state = step.prefill(
        [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]], max_new_tokens=40, temperature=0.9, top_p=0.95, seed=3
    )
    for _ in range(6):
        state, out = step(state)
        assert out.num_tokens.tolist() == [4, 4, 4, 4]


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
        import support.runs as t
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
