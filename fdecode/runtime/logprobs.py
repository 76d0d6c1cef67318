"""Logprobs as the host hands them to users: one `TokenLogprob` per committed token, read from the packed
step output with the tokens, no other device read (docs/design.md, "Logit processors and logprobs")."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fdecode.state import StepOutput


@dataclass(frozen=True)
class TokenLogprob:
    """A committed token, its logprob, and the most probable tokens of the distribution it was chosen
    from ({id: logprob}, most probable first; as many as the request's `SamplingParams.logprobs`).
    Raw (the target's log_softmax) or processed, as `DecodeConfig.logprobs_mode` says."""

    token: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)


def lane_logprobs(packed: torch.Tensor, window: int) -> list[list[tuple[float, list[int], list[float]]]] | None:
    """Per lane, per window row, (token logprob, top ids, top logprobs) of a packed output on the host
    (None where the step computes no logprobs)."""
    columns = StepOutput(packed, window).logprobs
    if columns is None:
        return None
    token, ids, values = (c.tolist() for c in columns)
    return [list(zip(t, i, v)) for t, i, v in zip(token, ids, values)]


def token_logprobs(tokens: list[int], rows: list[tuple[float, list[int], list[float]]], top: int) -> list[TokenLogprob]:
    """`TokenLogprob`s of `tokens` from their window rows, keeping `top` alternatives."""
    return [TokenLogprob(t, lp, dict(zip(ids[:top], values[:top]))) for t, (lp, ids, values) in zip(tokens, rows)]
