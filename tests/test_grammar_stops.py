"""How a constrained lane ends: its grammar's EOS ids always stop it, whatever the request's own stop ids
say, so its text stays in the language (`fdecode.params._stops`).

The oracle is the regex itself (the `regex` package matches the decoded text) and the tokenizer's
vocabulary: no id past it may come out.
"""

from __future__ import annotations

import pytest
import torch
import transformers

import fdecode
from fdecode import SamplingParams

regex = pytest.importorskip("regex")
pytest.importorskip("outlines_core")

PATTERN = r"(ab|ba)(12)?"  # a finite language: after "ab12" only EOS may follow
PROMPTS = [[5, 9, 40, 41], [7, 7, 3]]
NEW = 12


@pytest.fixture(scope="module")
def setup():
    from support.tokenizers import byte_bpe

    tokenizer = byte_bpe()
    vocab = len(tokenizer) + 3  # the model pads its vocabulary past the tokenizer's
    torch.manual_seed(3)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, initializer_range=0.2, tie_word_embeddings=False)).eval()
    grammar = fdecode.Grammar.from_regex(PATTERN, tokenizer, vocab_size=vocab)
    other = tokenizer.pad_token_id  # a stop id that is not the grammar's EOS
    assert tokenizer.eos_token_id in grammar.eos_ids and other not in grammar.eos_ids

    def compile_with(eos_default):
        target = fdecode.models.from_hf(hf)
        cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=64, block_size=4, backend="eager",
                                   max_grammar_states=grammar.num_states + 4,
                                   max_grammar_transitions=grammar.num_transitions + 8, eos_token_id=eos_default)
        return fdecode.compile(target, "ngram", cfg)

    return tokenizer, grammar, other, compile_with


def check_in_language(tokenizer, grammar, outputs: list[list[int]]) -> None:
    for tokens in outputs:
        assert all(t < len(tokenizer) for t in tokens), tokens
        assert tokens[-1] in grammar.eos_ids, tokens  # this language is finite: every lane reaches its end
        assert regex.fullmatch(PATTERN, tokenizer.decode(tokens[:-1])), tokenizer.decode(tokens)


@pytest.mark.parametrize("stops", ["ignore_eos", "other_id", "model_default_without_it", "default"])
def test_a_grammar_lane_ends_at_the_grammars_eos_whatever_its_stop_ids(setup, stops):
    tokenizer, grammar, other, compile_with = setup
    step = compile_with(other if stops == "model_default_without_it" else tokenizer.eos_token_id)
    given = {"ignore_eos": dict(ignore_eos=True), "other_id": dict(eos_token_id=[other])}.get(stops, {})
    params = SamplingParams(grammar=grammar, max_new_tokens=NEW, **given)
    outputs = fdecode.generate(step, PROMPTS, params)
    check_in_language(tokenizer, grammar, outputs)
    engine = fdecode.Engine(step)  # the Engine resolves requests the same way, and names the reason
    rids = [engine.add_request(p, params) for p in PROMPTS]
    events = [e for e in engine.stream() if e.finished]
    assert {e.request_id: e.reason for e in events} == {rid: "stop" for rid in rids}


def test_random_grammar_lanes_stay_in_the_language_too(setup):
    tokenizer, grammar, other, compile_with = setup
    step = compile_with(other)
    params = [SamplingParams(grammar=grammar, max_new_tokens=NEW, ignore_eos=True, temperature=1.5, seed=s)
              for s in range(8)]
    check_in_language(tokenizer, grammar, fdecode.generate(step, [PROMPTS[s % 2] for s in range(8)], params))


def test_the_grammars_eos_counts_toward_max_stop_ids_once(setup):
    tokenizer, grammar, other, compile_with = setup
    step = compile_with(tokenizer.eos_token_id)
    many = [other, 1, 2, 3]  # 4 ids + the grammar's EOS: 5 > max_stop_ids 4
    with pytest.raises(ValueError, match=r"5 eos ids \(with the grammar's EOS ids"):
        fdecode.generate(step, PROMPTS, SamplingParams(grammar=grammar, max_new_tokens=NEW, eos_token_id=many))
    again = [other, 1, tokenizer.eos_token_id, other]  # duplicates, and the grammar's own EOS: 3 ids
    check_in_language(tokenizer, grammar, fdecode.generate(
        step, PROMPTS, SamplingParams(grammar=grammar, max_new_tokens=NEW, eos_token_id=again)))
