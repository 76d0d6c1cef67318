"""`fdecode.generate`: the convenience loop, on top of `Engine`.

Every prompt becomes a request; the engine admits as many as there are lanes
(and KV blocks), steps until all have finished, and returns each prompt's new
tokens. Stop conditions are evaluated inside the step on the device.
"""

from __future__ import annotations

from collections.abc import Sequence

from tqdm.auto import tqdm

from fdecode.prefill import PerPrompt, Prompt, check_sampling
from fdecode.runtime.engine import Engine

# Show a progress bar by default when a call may commit at least this many tokens.
PROGRESS_MIN_TOKENS = 2048


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
    progress: bool | None = None,
) -> list[list[int]]:
    """Speculative generation. Returns the new tokens of each prompt (stop id included).

    Greedy by default; sampling parameters are scalars or one per prompt (see `Step.prefill`).
    More prompts than `max_batch` are fine: they queue and are admitted as lanes free up.
    progress: show a tqdm bar (default: for calls of PROGRESS_MIN_TOKENS tokens or more).
    """
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of token-id sequences, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("prompts is empty: pass at least one prompt")
    count = len(prompts)
    per = check_sampling(
        count, step.config, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, seeds=step.seeds
    )
    engine = Engine(step)
    ids = []
    for i, prompt in enumerate(prompts):  # a prompt's errors name it once ("prompt 3: ..."), whole-call ones not
        ids.append(
            engine._add_request(  # noqa: SLF001 - add_request with the batch index as the prompt's label
                prompt, f"prompt {i}", max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                **{name: values[i] for name, values in per.items()},
            )
        )
    outputs = {rid: [] for rid in ids}
    show = progress if progress is not None else count * max_new_tokens >= PROGRESS_MIN_TOKENS
    with tqdm(total=count * max_new_tokens, disable=not show, unit="tok", desc="fdecode") as bar:
        for event in engine.stream():
            outputs[event.request_id].extend(event.new_tokens)
            bar.update(len(event.new_tokens))
    return [outputs[rid] for rid in ids]
