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
from support.stats import ALPHA, chi2_pvalue, reference_filter

from fdecode.ops.filters import filtered_probs, full_filter
from fdecode.ops.random import philox, random_bits, uniform
from fdecode.ops.sampling import sample, speculative_accept

# ---------------------------------------------------------------- PRNG


def philox_reference(counter: tuple[int, ...], key: tuple[int, ...]) -> tuple[int, ...]:
    """Philox4x32-10 as published, with native 64-bit products, shifts and xor (independent of the op)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c3 ^ k1, p0 & 0xFFFFFFFF
    return c0, c1, c2, c3


# Known-answer vectors of Random123 (kat_vectors: philox4x32 10): counter, key -> output.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize(("counter", "key", "want"), KAT)
def test_philox_matches_the_known_answers(counter, key, want):
    got = philox(tuple(torch.tensor([c]) for c in counter), tuple(torch.tensor([k]) for k in key))
    assert tuple(int(w) for w in got) == want == philox_reference(counter, key)


def test_random_bits_are_the_lane_stream_bit_for_bit():
    """Word i of (seed, counter) is word i % 4 of Philox((i // 4, counter lo, counter hi, 0), seed split in two)."""
    seeds, counters = [0, 7, 2**63 - 1, 0xDEADBEEF12345], [0, 3, 2**32 + 5, 2**40]
    bits = random_bits(torch.tensor(seeds), torch.tensor(counters), 10)
    for lane, (seed, n) in enumerate(zip(seeds, counters)):
        key = (seed & 0xFFFFFFFF, seed >> 32)
        want = [w for i in range(3) for w in philox_reference((i, n & 0xFFFFFFFF, n >> 32, 0), key)][:10]
        assert bits[lane].tolist() == want


def test_streams_of_distinct_seed_counter_pairs_are_disjoint():
    """Property: the counter blocks two distinct (seed, counter) pairs read never coincide (Philox is a
    bijection of the block for a fixed key, and the key is the seed), so neither do their words:
    no 64-bit value (two consecutive words) repeats across 4096 streams of 64 words."""
    gen = torch.Generator().manual_seed(3)
    seeds = torch.randint(0, 2**62, (64,), generator=gen).repeat_interleave(64)
    counters = torch.arange(64).repeat(64) + torch.randint(0, 2**40, (1,), generator=gen)
    words = random_bits(seeds, counters, 64)
    pairs = (words[:, 0::2] * 2**31 + torch.div(words[:, 1::2], 2, rounding_mode="floor")).flatten()
    assert pairs.unique().numel() == pairs.numel()
    # Nearby counters and seeds (the case a hash of seed + counter gets wrong) differ everywhere.
    a = random_bits(torch.tensor([5, 5, 6]), torch.tensor([9, 10, 9]), 4096)
    assert not bool((a[0] == a[1]).any() or (a[0] == a[2]).any())


def test_uniform_is_on_the_grid_inside_zero_one():
    seed, counter = torch.tensor([1, 2, 3]), torch.tensor([0, 0, 5])
    u = uniform(seed, counter, 20000)
    assert torch.equal(u, uniform(seed, counter, 20000))
    assert 0 <= float(u.min()) and float(u.max()) < 1
    assert torch.equal(u * 2**24, (u * 2**24).round())  # exact multiples of 2**-24
    assert float(torch.tensor(1 - 2**-24, dtype=torch.float32)) < 1  # the largest value is exact, below 1
    assert abs(float(u.mean()) - 0.5) < 0.01
    # A lane's numbers depend on its own seed/counter only, not on the batch it sits in.
    assert torch.equal(uniform(seed[1:2], counter[1:2], 20000)[0], u[1])
    assert not torch.equal(uniform(seed, counter + 1, 100), u[:, :100])
    assert torch.equal(uniform(seed, counter, 100), u[:, :100])  # a prefix of the same draw
    hist = torch.histc(u[0], bins=10, min=0, max=1)
    assert chi2_pvalue(hist, torch.full((10,), 0.1)) > ALPHA


def test_uniform_is_bit_identical_compiled():
    seed, counter = torch.tensor([7, 2**62 + 3]), torch.tensor([3, 2**33 + 9])
    compiled = torch.compile(uniform, backend="inductor", fullgraph=True, dynamic=False)
    assert torch.equal(compiled(seed, counter, 4096), uniform(seed, counter, 4096))


# ---------------------------------------------------------------- sampling by inversion

EXTREMES = (0.0, 1 - 2**-24)  # the smallest and the largest value `uniform` can produce


@pytest.mark.parametrize("n", [4, 5000])
def test_noise_at_the_extremes_never_selects_a_zero_entry(n):
    """Zero-probability entries at both ends and in between; every extreme pair of uniforms picks a positive one."""
    probs = torch.zeros(3, n)
    probs[0, 1:3] = torch.tensor([0.7, 0.3])  # zeros first and last
    probs[1, n // 2] = 1.0  # one positive entry in the middle
    probs[2, ::2] = 1e-30  # tiny positives among zeros
    probs[2, 1] = 1.0
    for u0 in EXTREMES:
        for u1 in EXTREMES:
            u = torch.tensor([u0, u1]).expand(3, 2)
            picked = sample(probs, u)
            assert bool((probs.gather(1, picked[:, None]) > 0).all()), (u0, u1, picked)


def test_the_old_repro_selects_no_filtered_token():
    # Was: the exponential race with u == 1.0 on a zero entry computed 0 / -log(1) = NaN, and argmax took it.
    probs = torch.tensor([[0.7, 0.3, 0.0, 0.0]])
    for u0 in EXTREMES:
        assert int(sample(probs, torch.tensor([[u0, 0.5]]))) in (0, 1)


def test_sample_follows_the_distribution_at_a_large_vocabulary():
    """Two-level inversion (V > CHUNK): a distribution with mass spread over many buckets and one spike."""
    v, n = 3000, 60000
    weights = torch.zeros(v)
    weights[::7] = torch.linspace(1, 3, len(weights[::7]))
    weights[1500] = 200.0
    probs = weights / weights.sum()
    u = uniform(torch.arange(n), torch.zeros(n, dtype=torch.int64), 2)
    picked = sample(probs.expand(n, v), u)
    assert bool((probs[picked] > 0).all())
    # Chi-square over coarse cells (each cell: 30 consecutive tokens) and the spike on its own.
    cells = torch.div(torch.arange(v), 30, rounding_mode="floor")
    cells[1500] = cells.max() + 1
    observed = torch.bincount(cells[picked], minlength=int(cells.max()) + 1)
    expected = torch.zeros_like(observed, dtype=torch.float64).index_add_(0, cells, probs.double())
    assert chi2_pvalue(observed, expected) > ALPHA


# ---------------------------------------------------------------- filters


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "min_p"),
    [
        (1.0, 0, 1.0, 0.0),
        (0.7, 3, 1.0, 0.0),
        (1.3, 0, 0.8, 0.0),
        (1.0, 0, 1.0, 0.2),
        (0.5, 5, 0.6, 0.05),
        (1.0, 100, 0.95, 0.0),
    ],
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


def sorted_threshold_keep(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Which tokens top-k then top-p keep, by a full sort of the float32 probabilities: the k-th largest
    value, then the value where the fixed-point mass (each probability rounded to the nearest 2**-30, the
    documented unit) of the kept tokens, summed in descending order, first reaches top_p of their total."""
    values, _ = torch.sort(probs, descending=True)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if top_k > 0:
        keep = probs >= values[min(top_k, len(values)) - 1]
    if top_p < 1:
        mass = torch.where(keep, (probs * 2.0**30 + 0.5).long(), 0)  # float32 math, as the filter rounds
        total = int(mass.sum())
        need = min(max(int(torch.tensor(top_p) * torch.tensor(float(total))), 1), total)
        order_mass = mass[torch.argsort(probs, descending=True, stable=True)]
        index = int((order_mass.cumsum(0) < need).sum())
        keep = keep & (probs >= values[index])
    return keep


@pytest.mark.parametrize("way", ["scatter_add", "scatter_reduce"])
def test_threshold_searches_equal_a_sort_at_a_real_vocabulary(way, monkeypatch):
    """At V = 151,936 the radix searches keep exactly the tokens a full sort keeps, for peaked and flat
    rows, a row of heavy ties and a row of tiny tails, by either histogram op."""
    from fdecode.ops import histogram

    monkeypatch.setitem(histogram.WAY, "cpu", way)
    v = 151_936
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(4, v, generator=gen)
    logits = torch.stack([base[0] * 3, base[1] * 0.05, (base[2] * 2).round(), base[3] * 12])[:, None]
    for top_k, top_p in [(0, 0.95), (0, 0.5), (20, 1.0), (50_000, 0.9), (1000, 0.8)]:
        b = logits.shape[0]
        got = full_filter(logits, torch.ones(b), torch.full((b,), top_k), torch.full((b,), top_p), torch.zeros(b))
        probs = torch.softmax(logits.float(), dim=-1)
        for row in range(b):
            want = sorted_threshold_keep(probs[row, 0], top_k, top_p)
            assert torch.equal(got[row, 0] > 0, want), (row, top_k, top_p)


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
    drafts = torch.stack([sample(q[:, j], uniform(lanes, zero + 10 + j, 2)) for j in range(k)], dim=1)
    tokens = torch.cat([torch.zeros(N, 1, dtype=torch.int64), drafts], dim=1)
    p = P[: k + 1].expand(N, k + 1, V)
    noise = uniform(lanes, zero + 0, 2)
    accepted, _ = accept_fn(
        tokens, q if draft_q is None else draft_q[:k].expand(N, k, V), p, uniform(lanes, zero + 1, k), noise
    )
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
    drafts = torch.stack([sample(q[:, j], uniform(lanes, zero + 10 + j, 2)) for j in range(3)], dim=1)
    tokens = torch.cat([torch.zeros(N, 1, dtype=torch.int64), drafts], dim=1)
    noise = uniform(lanes, zero + 0, 2)
    accepted, length = speculative_accept(tokens, q, P.expand(N, 4, V), uniform(lanes, zero + 1, 3), noise)
    assert bool((length == 4).all())
    assert torch.equal(accepted[:, :3], drafts)


# The classic bugs, each a small variant of the verifier; the same statistical test must reject them.


def bug_recover_from_target(tokens, q, p, accept_u, noise):
    """Forgets the residual: resamples a rejected position from p instead of norm(max(0, p - q))."""
    accepted, length = speculative_accept(tokens, q, p, accept_u, noise)
    at = (length - 1)[:, None]
    rejected = (length < tokens.shape[1])[:, None]
    from_p = sample(p, noise[:, None].expand(*p.shape[:2], 2))  # [N, W]: row j drawn from p_j
    wrong = torch.where(rejected, from_p.gather(1, at), accepted.gather(1, at))
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
