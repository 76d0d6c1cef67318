"""Random mode: PRNG, filters, and lossless rejection sampling, with stated significance.

Statistical tests use fixed seeds (deterministic in CI) and a chi-square test at
significance ALPHA = 1e-3: with correct code each fails with probability 1e-3 for
a fresh seed, and the chosen seeds pass; with the classic bugs the statistic is
orders of magnitude past the critical value.
"""

from __future__ import annotations

import math

import pytest
import torch

from fdecode.ops.filters import filtered_probs
from fdecode.ops.random import hash32, uniform
from fdecode.ops.sampling import sample, speculative_accept

ALPHA = 1e-3


def chi2_pvalue(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; cells with expected count < 5 are pooled."""
    n = observed.sum()
    expected = expected_probs.double() * n
    small = expected < 5
    obs = torch.cat([observed[~small].double(), observed[small].double().sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


# ---------------------------------------------------------------- PRNG


def lowbias32(x: int) -> int:
    """Reference: the published lowbias32 with native 32-bit xor, shifts and products."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_hash_matches_the_reference_bit_for_bit():
    xs = [0, 1, 2, 12345, 2**31 - 1, 2**31, 2**32 - 1, 0xDEADBEEF, 0x9E3779B9]
    assert hash32(torch.tensor(xs)).tolist() == [lowbias32(x) for x in xs]


def test_uniform_is_reproducible_per_lane_and_well_spread():
    seed, counter = torch.tensor([1, 2, 3]), torch.tensor([0, 0, 5])
    u = uniform(seed, counter, 20000)
    assert torch.equal(u, uniform(seed, counter, 20000))
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01
    # A lane's numbers depend on its own seed/counter only, not on the batch it sits in.
    assert torch.equal(uniform(seed[1:2], counter[1:2], 20000)[0], u[1])
    assert not torch.equal(uniform(seed, counter + 1, 100), u[:, :100])
    assert torch.equal(uniform(seed, counter, 100), u[:, :100])  # a prefix of the same draw
    hist = torch.histc(u[0], bins=10, min=0, max=1)
    assert chi2_pvalue(hist, torch.full((10,), 0.1)) > ALPHA


def test_uniform_is_bit_identical_compiled():
    seed, counter = torch.tensor([7, 2**32 - 1]), torch.tensor([3, 9])
    compiled = torch.compile(uniform, backend="inductor", fullgraph=True, dynamic=False)
    assert torch.equal(compiled(seed, counter, 4096), uniform(seed, counter, 4096))


# ---------------------------------------------------------------- filters


def reference_filter(logits, temperature, top_k, top_p, min_p):
    """Sort-based reference for one row (written independently of the radix search)."""
    probs = torch.softmax(logits.double() / (temperature if temperature > 0 else 1.0), dim=-1)
    order = torch.argsort(probs, descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    if top_k > 0:
        kth = probs[order[min(top_k, len(probs)) - 1]]
        keep_k = probs >= kth
    else:
        keep_k = torch.ones_like(keep)
    probs = torch.where(keep_k, probs, 0.0)
    probs = probs / probs.sum()
    if top_p < 1:
        sorted_p = probs[order]
        cum = torch.cumsum(sorted_p, 0)
        last = int((cum < top_p - 1e-7).sum())  # the smallest prefix reaching top_p
        threshold = sorted_p[min(last, len(probs) - 1)]
        probs = torch.where(probs >= threshold, probs, 0.0)
    probs = torch.where(probs >= min_p * probs.max(), probs, 0.0)
    return probs / probs.sum()


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "min_p"),
    [(1.0, 0, 1.0, 0.0), (0.7, 3, 1.0, 0.0), (1.3, 0, 0.8, 0.0), (1.0, 0, 1.0, 0.2), (0.5, 5, 0.6, 0.05), (1.0, 100, 0.95, 0.0)],
)
def test_filters_match_a_sort_based_reference(temperature, top_k, top_p, min_p):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 1, 40, generator=gen) * 2
    b = logits.shape[0]
    got = filtered_probs(
        logits, torch.full((b,), temperature), torch.full((b,), top_k), torch.full((b,), top_p), torch.full((b,), min_p)
    )
    for row in range(b):
        want = reference_filter(logits[row, 0], temperature, top_k, top_p, min_p)
        torch.testing.assert_close(got[row, 0].double(), want, rtol=1e-5, atol=1e-6)


def test_filters_are_per_lane():
    logits = torch.randn(2, 3, 30, generator=torch.Generator().manual_seed(1))
    probs = filtered_probs(logits, torch.tensor([1.0, 1.0]), torch.tensor([2, 0]), torch.ones(2), torch.zeros(2))
    assert ((probs[0] > 0).sum(-1) == 2).all() and ((probs[1] > 0).sum(-1) == 30).all()


# ---------------------------------------------------------------- rejection sampling, at the op level

V = 6
N = 40000  # samples (one lane each) per statistical test


def rows(*values):
    t = torch.tensor(values, dtype=torch.float32)
    return t / t.sum(-1, keepdim=True)


P = rows([5, 1, 1, 3, 0, 2], [1, 4, 2, 0, 2, 3], [2, 2, 2, 2, 1, 1], [0, 0, 6, 1, 1, 1])  # p_0 .. p_3
Q = rows([1, 1, 4, 1, 2, 1], [3, 0, 1, 1, 1, 4], [1, 1, 1, 5, 1, 1])  # q_1 .. q_3, context-free draft


def draw(k: int, accept_fn=speculative_accept, draft_q=None, seed=0):
    """N lanes: sample drafts from Q, verify against P with `accept_fn`; returns accepted [N, k+1]."""
    lanes = torch.arange(N) + seed * N
    zero = torch.zeros(N, dtype=torch.int64)
    q = Q[:k].expand(N, k, V)
    drafts = torch.stack([sample(q[:, j], uniform(lanes, zero + 10 + j, V)) for j in range(k)], dim=1)
    tokens = torch.cat([torch.zeros(N, 1, dtype=torch.int64), drafts], dim=1)
    p = P[: k + 1].expand(N, k + 1, V)
    noise = uniform(lanes, zero + 0, (k + 1) * V).view(N, k + 1, V)
    accepted, _ = accept_fn(tokens, q if draft_q is None else draft_q[:k].expand(N, k, V), p, uniform(lanes, zero + 1, k), noise)
    return accepted


def position_pvalues(accepted: torch.Tensor) -> list[float]:
    """For each window position j: do the tokens emitted there follow p_j? (rows are context-free)."""
    out = []
    for j in range(accepted.shape[1]):
        emitted = accepted[:, j][accepted[:, j] >= 0]
        out.append(chi2_pvalue(torch.bincount(emitted, minlength=V), P[j]))
    return out


@pytest.mark.parametrize("k", [1, 3])
def test_emitted_tokens_follow_the_target(k):
    assert min(position_pvalues(draw(k))) > ALPHA


def test_acceptance_length_matches_theory():
    # Context-free rows: E[L] = 1 + a1 + a1 a2 + a1 a2 a3 with a_j = sum min(p_{j-1}, q_j).
    alpha = torch.minimum(P[:3], Q[:3]).sum(-1)
    expected = 1 + alpha[0] + alpha[0] * alpha[1] + alpha[0] * alpha[1] * alpha[2]
    lengths = (draw(3) >= 0).sum(1).double()
    assert abs(float(lengths.mean()) - float(expected)) < 4 * float(lengths.std()) / math.sqrt(N)


def test_draft_equal_to_target_is_always_accepted():
    lanes, zero = torch.arange(N), torch.zeros(N, dtype=torch.int64)
    q = P[:3].expand(N, 3, V)  # the draft's distributions are the target's
    drafts = torch.stack([sample(q[:, j], uniform(lanes, zero + 10 + j, V)) for j in range(3)], dim=1)
    tokens = torch.cat([torch.zeros(N, 1, dtype=torch.int64), drafts], dim=1)
    noise = uniform(lanes, zero + 0, 4 * V).view(N, 4, V)
    accepted, length = speculative_accept(tokens, q, P.expand(N, 4, V), uniform(lanes, zero + 1, 3), noise)
    assert bool((length == 4).all())
    assert torch.equal(accepted[:, :3], drafts)


# The classic bugs, each a small variant of the verifier; the same statistical test must reject them.


def bug_recover_from_target(tokens, q, p, accept_u, noise):
    """Forgets the residual: resamples a rejected position from p instead of norm(max(0, p - q))."""
    accepted, length = speculative_accept(tokens, q, p, accept_u, noise)
    at = (length - 1)[:, None]
    rejected = (length < tokens.shape[1])[:, None]
    wrong = torch.where(rejected, sample(p, noise).gather(1, at), accepted.gather(1, at))
    return accepted.scatter(1, at, wrong), length


def bug_bonus_from_wrong_row(tokens, q, p, accept_u, noise):
    """Samples the bonus token from row K-1 instead of row K."""
    wrong = torch.cat([p[:, :-1], p[:, -2:-1]], dim=1)
    return speculative_accept(tokens, q, wrong, accept_u, noise)  # acceptance is unchanged: rows < K are right


def test_statistical_test_catches_the_classic_bugs():
    assert min(position_pvalues(draw(3, accept_fn=bug_bonus_from_wrong_row))) < 1e-12
    unfiltered = rows([3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8], [9, 7, 9, 3, 2, 3])
    # Verifying with probabilities other than those the drafts were sampled from (e.g. unfiltered ones).
    assert min(position_pvalues(draw(3, draft_q=unfiltered))) < 1e-12
    assert min(position_pvalues(draw(3, accept_fn=bug_recover_from_target))) < 1e-12
