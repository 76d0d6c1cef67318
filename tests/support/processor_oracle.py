"""transformers' greedy `generate` under a request's logit processors: the oracle of tests/test_processors.py
and tests/test_tree_features.py; and the processed, filtered next-token distribution at the 5-token vocabulary
(`reference_next`), the oracle of their random lanes.

`repetition_penalty`, `sequence_bias` (logit bias) and `min_new_tokens` are transformers' own; OpenAI's
frequency / presence penalties, which transformers lacks, are a `LogitsProcessor` written here.
"""

from __future__ import annotations

import torch
import transformers

from fdecode import SamplingParams
from support.hand_grammar import Masked, mask_logits
from support.llama_models import hf_target
from support.stats import reference_filter
from support.tiny_vocab import PROMPT, logits_after

TINY_REQUEST = SamplingParams(
    temperature=1.3,
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    repetition_penalty=1.6,
    frequency_penalty=0.5,
    presence_penalty=0.4,
    logit_bias={4: 0.8},
    min_tokens=2,
    eos_token_id=0,
    max_new_tokens=3,
)


class OpenAIPenalties(transformers.LogitsProcessor):
    """OpenAI's frequency / presence penalties over the generated tokens."""

    def __init__(self, prompt_length: int, frequency: float, presence: float) -> None:
        self.start, self.frequency, self.presence = prompt_length, frequency, presence

    def __call__(self, input_ids, scores):
        counts = torch.zeros_like(scores)
        for row, ids in enumerate(input_ids[:, self.start :]):
            for t in ids.tolist():
                counts[row, t] += 1
        return scores - self.frequency * counts - self.presence * (counts > 0).float()


def hf_processed(prompt, params: SamplingParams, new: int, eos=None, num_layers: int = 2, model=None, **extra):
    """transformers' greedy continuation of `prompt` under `params`' processors (new tokens only), and
    generate's whole output (`extra`: e.g. output_logits=True). model: a transformers model (None: the tiny
    Llama of `num_layers` layers, `support.llama_models.hf_target`)."""
    ids = torch.tensor([prompt])
    processors = transformers.LogitsProcessorList()
    if params.frequency_penalty or params.presence_penalty:
        processors.append(OpenAIPenalties(len(prompt), params.frequency_penalty, params.presence_penalty))
    if params.grammar is not None:  # a `support.hand_grammar.HandGrammar`
        processors.append(Masked(params.grammar, len(prompt)))
    out = (hf_target(num_layers) if model is None else model).generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
        repetition_penalty=params.repetition_penalty,
        logits_processor=processors,
        sequence_bias=None if params.logit_bias is None else {(t,): b for t, b in params.logit_bias},
        min_new_tokens=params.min_tokens or None,
        return_dict_in_generate=True,
        **extra,
    )
    return out.sequences[0, len(prompt) :].tolist(), out


def reference_next(target, generated: list[int], p: SamplingParams) -> torch.Tensor:
    """The processed, filtered next-token distribution after PROMPT + generated (written for the tests), a
    `support.hand_grammar.HandGrammar` in `p.grammar` masking last."""
    logits = logits_after(target, PROMPT + generated).double().clone()
    for t, b in p.logit_bias or ():
        logits[t] += b
    for t in set(PROMPT + generated):
        logits[t] = logits[t] / p.repetition_penalty if logits[t] > 0 else logits[t] * p.repetition_penalty
    for t in set(generated):
        logits[t] -= p.frequency_penalty * generated.count(t) + p.presence_penalty
    if len(generated) < p.min_tokens:
        logits[list(p.eos_token_id)] = float("-inf")
    if p.grammar is not None:
        logits = mask_logits(p.grammar, generated, logits)
    return reference_filter(logits, p.temperature, p.top_k, p.top_p, p.min_p)
