"""`fdecode.generate`: the convenience loop, on top of `Engine` (docs/design.md, "The Engine").

Every prompt becomes a request; the engine admits as many as there are lanes
(and KV blocks), steps until all have finished, and returns each prompt's new
tokens. Stop conditions are evaluated inside the step on the device.
A prompt may also be a string or chat messages (`fdecode.text`): it is encoded with
the tokenizer (passed, or saved beside the target's checkpoint), stops at the
tokenizer's EOS too, and its result is text, decoded as it streams (`fdecode.detokenize`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fdecode.detokenize import Detokenizer
from fdecode.params import PerPrompt, SamplingParams, request_params
from fdecode.prefill import Prompts, check_prompt, prompt_rows
from fdecode.progress import bar as progress_bar
from fdecode.runtime.engine import Engine
from fdecode.runtime.logprobs import TokenLogprob
from fdecode.runtime.metrics import RequestMetrics
from fdecode.text import encode, find_tokenizer, is_messages, is_text, stop_ids

# Show a progress bar by default when a call may commit at least this many tokens.
PROGRESS_MIN_TOKENS = 2048


@dataclass
class Completion:
    """One prompt's result with details (`generate(..., details=True)`)."""

    tokens: list[int] = field(default_factory=list)  # the new tokens, stop id included
    reason: str | None = None  # why it ended: "stop", "length" or "error" (`Event.reason`)
    error: str | None = None  # what went wrong, for reason "error"
    logprobs: list[TokenLogprob] | None = None  # one per token where the request asked (`SamplingParams.logprobs`)
    metrics: RequestMetrics | None = None  # drafts proposed and accepted, steps (`Event.metrics`)
    text: str | None = None  # the tokens as text, for a prompt given as text (special tokens left out)


def generate(
    step,
    prompts: Prompts,
    params: SamplingParams | Sequence[SamplingParams] | None = None,
    *,
    max_new_tokens: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    ignore_eos: bool = False,
    temperature: PerPrompt = None,
    top_k: PerPrompt = None,
    top_p: PerPrompt = None,
    min_p: PerPrompt = None,
    seed: PerPrompt = None,
    progress: bool | None = None,
    details: bool = False,
    tokenizer=None,
) -> list[list[int]] | list[str] | list[Completion]:
    """Speculative generation. Returns the new tokens of each prompt (stop id included; its text for a prompt
    given as a string or chat messages), or with
    details=True a `Completion` per prompt: its tokens, why it ended, its logprobs and acceptance metrics.

    Greedy, stopping at the model's EOS ids, by default. Prompts and sampling settings as `Step.prefill`
    takes them: `params` (one `fdecode.SamplingParams` for the call, or one per prompt) or the keyword
    shortcuts (see `fdecode.params`). More prompts than `max_batch` are fine: they queue and are
    admitted as lanes free up.
    progress: show a tqdm bar (default: for calls of PROGRESS_MIN_TOKENS tokens or more).
    tokenizer: encodes prompts given as strings or chat messages (`fdecode.text`; default: the one saved
        in the target's checkpoint folder); such a prompt's result is its text (`Completion.text`).
    """
    if isinstance(prompts, str) or is_messages(prompts):
        raise TypeError("prompts must be a list of prompts: pass [prompt]")
    prompts = prompt_rows(prompts)
    texts = [is_text(p) for p in prompts]
    if any(texts):
        tokenizer = find_tokenizer(step, tokenizer)
        prompts = [encode(tokenizer, p) if t else p for p, t in zip(prompts, texts)]
        if params is None and eos_token_id is None and not ignore_eos:
            eos_token_id = stop_ids(step, tokenizer)
    vocab = step.target.config.vocab_size
    # A prompt's errors name it once ("prompt 3: ..."), whole-call ones name only the argument.
    checked = [check_prompt(prompt, vocab, f"prompt {i}") for i, prompt in enumerate(prompts)]
    requests = request_params(
        len(checked),
        step.config,
        vocab,
        params=params,
        seeds=step.seeds,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        ignore_eos=ignore_eos,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        seed=seed,
    )
    engine = Engine(step)
    ids = [engine.add_resolved(prompt, p, label=f"prompt {i}") for i, (prompt, p) in enumerate(zip(checked, requests))]
    outputs = {rid: Completion() for rid in ids}
    detokenizers = {rid: Detokenizer(tokenizer, p) for rid, p, t in zip(ids, checked, texts) if t}
    for rid in detokenizers:
        outputs[rid].text = ""
    total = sum(engine.requests[rid].budget for rid in ids)  # the budgets it checked
    show = progress if progress is not None else total >= PROGRESS_MIN_TOKENS
    with progress_bar(total=total, disable=not show, unit="tok", desc="fdecode") as bar:
        for event in engine.stream():
            done = outputs[event.request_id]
            done.tokens += event.new_tokens
            if event.logprobs is not None:
                done.logprobs = (done.logprobs or []) + event.logprobs
            if event.finished:
                done.reason, done.error, done.metrics = event.reason, event.error, event.metrics
            if event.request_id in detokenizers:
                piece = detokenizers[event.request_id]
                done.text += piece.push(event.new_tokens) + (piece.flush() if event.finished else "")
            bar.update(len(event.new_tokens))
    if details:
        return [outputs[rid] for rid in ids]
    return [outputs[rid].text if rid in detokenizers else outputs[rid].tokens for rid in ids]
