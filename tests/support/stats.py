"""Sampling statistics: a chi-square test at significance ALPHA and a sort-based filter reference.

With ALPHA = 1e-3 a statistical test of correct code fails with probability 1e-3 for a fresh seed
(the tests' seeds are fixed and pass); `assert_two_new_tokens_follow_the_target` runs such a test
on a compiled step against the exact distribution of its target's next two tokens.
"""

from __future__ import annotations

import torch

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


def assert_two_new_tokens_follow_the_target(step, target, prompt, params, *, vocab: int, lanes: int, runs: int = 8):
    """Two new tokens after `prompt`, from `runs` x `lanes` seeded lane-runs of `step` (lanes <= its max_batch),
    against the exact filtered distribution of `target` over the vocab**2 outcomes (enumerated with
    whole-sequence forwards): a chi-square test, and no outcome the filters exclude."""
    import fdecode
    from fdecode.models.dense import dense_forward

    def dist(seq):
        logits = dense_forward(target, torch.tensor([seq]))[0][0, -1]
        return reference_filter(logits, params["temperature"], params["top_k"], params["top_p"], params["min_p"])

    p1 = dist(prompt)
    expected = torch.stack([p1[a] * dist(prompt + [a]) for a in range(vocab)]).flatten()
    samples = torch.cat(
        [
            torch.tensor(
                fdecode.generate(
                    step, [prompt] * lanes, max_new_tokens=2, seed=[lanes * b + i for i in range(lanes)], **params
                )
            )
            for b in range(runs)
        ]
    )
    counts = torch.bincount(samples[:, 0] * vocab + samples[:, 1], minlength=vocab**2)
    assert chi2_pvalue(counts, expected) > ALPHA
    assert expected[counts > 0].min() > 0  # nothing the filters exclude
