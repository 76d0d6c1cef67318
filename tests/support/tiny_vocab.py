"""A 5-token vocabulary: the exact distribution of the next three tokens is enumerable (125 outcomes).

`tiny_target` and the `tiny_draft` kinds ("self", "random", "adversarial") are tiny random Llamas on
that vocabulary; `exact_distribution` enumerates P(t1, t2, t3 | PROMPT) under the filtered target and
`check_follows_the_target` compares a compiled step's sampled sequences with it (chi-square at ALPHA).
"""

from __future__ import annotations

import torch

import fdecode
from fdecode.models import LlamaModel, ModelConfig
from support.llama_models import fresh_forward
from support.stats import ALPHA, chi2_pvalue, reference_filter

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
        return reference_filter(
            logits_after(target, seq), params["temperature"], params["top_k"], params["top_p"], params["min_p"]
        )

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


def check_follows_the_target(step, target: LlamaModel, params: dict) -> None:
    """Three new tokens of `step` on LANES x 40 seeds follow the filtered target's distribution (chi-square),
    and none of them is one the filters exclude."""
    samples = sampled_sequences(step, params, batches=40)
    cells = samples[:, 0] * V * V + samples[:, 1] * V + samples[:, 2]
    expected = exact_distribution(target, params)
    counts = torch.bincount(cells, minlength=V**3)
    assert chi2_pvalue(counts, expected) > ALPHA
    assert expected[counts > 0].min() > 0
