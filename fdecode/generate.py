"""`fdecode.generate`: the convenience loop over a compiled step.

Prefill, then step until every lane has finished (stop id, budget, or capacity);
collect each lane's committed tokens. Stop conditions are evaluated inside the
step on the device; the host only reads the packed output.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fdecode.prefill import PerPrompt, Prompt
from fdecode.state import StepOutput


def generate(
    step,
    prompts: Sequence[Prompt],
    *,
    max_new_tokens: int,
    eos_token_id: int | Sequence[int] | None = None,
    temperature: PerPrompt = None,
    top_k: PerPrompt = None,
    top_p: PerPrompt = None,
    min_p: PerPrompt = None,
    seed: PerPrompt = None,
) -> list[list[int]]:
    """Speculative generation. Returns the new tokens of each prompt (stop id included).

    Greedy by default; sampling parameters are scalars or one per prompt (see `Step.prefill`).
    """
    state = step.prefill(
        prompts, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
    )
    outputs: list[list[int]] = [[] for _ in prompts]
    out = state.step_output
    # Each step commits at least one token per active lane, so max_new_tokens steps always suffice.
    for _ in range(max_new_tokens):
        if _collect(out, outputs):
            break
        state, out = step(state)
    return outputs


def _collect(out: StepOutput, outputs: list[list[int]]) -> bool:
    """Append the committed tokens of `out` to `outputs`; True when every prompt's lane has finished."""
    packed = out.packed.cpu()
    tokens, counts, finished = packed[:, :-2], packed[:, -2], packed[:, -1]
    for lane, seq in enumerate(outputs):
        seq.extend(tokens[lane, : int(counts[lane])].tolist())
    return bool(torch.all(finished[: len(outputs)] == 1))
