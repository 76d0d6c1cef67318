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

regex = pytest.importorskip("regex", reason='needs regex: pip install -e ".[test]"')
pytest.importorskip("outlines_core", reason='needs outlines-core: pip install -e ".[grammar]"')

PATTERN = r"(ab|ba)(12)?"  # a finite language: after "ab12" only EOS may follow
PROMPTS = [[5, 9, 40, 41], [7, 7, 3]]
NEW = 12


@pytest.fixture(scope="module")
def setup():
    from support.tokenizers import byte_bpe

    tokenizer = byte_bpe()
    vocab = len(tokenizer) + 3  # the model pads its vocabulary past the tokenizer's
    torch.manual_seed(3)
    hf = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            initializer_range=0.2,
            tie_word_embeddings=False,
        )
    ).eval()
    grammar = fdecode.Grammar.from_regex(PATTERN, tokenizer, vocab_size=vocab)
    other = tokenizer.pad_token_id  # a stop id that is not the grammar's EOS
    assert tokenizer.eos_token_id in grammar.eos_ids and other not in grammar.eos_ids

    def compile_with(eos_default):
        target = fdecode.models.from_hf(hf)
        cfg = fdecode.DecodeConfig(
            num_draft_tokens=2,
            max_batch=2,
            max_seq_len=64,
            block_size=4,
            backend="eager",
            max_grammar_states=grammar.num_states + 4,
            max_grammar_transitions=grammar.num_transitions + 8,
            eos_token_id=eos_default,
        )
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
    params = [
        SamplingParams(grammar=grammar, max_new_tokens=NEW, ignore_eos=True, temperature=1.5, seed=s) for s in range(8)
    ]
    check_in_language(tokenizer, grammar, fdecode.generate(step, [PROMPTS[s % 2] for s in range(8)], params))


def test_the_grammars_eos_counts_toward_max_stop_ids_once(setup):
    tokenizer, grammar, other, compile_with = setup
    step = compile_with(tokenizer.eos_token_id)
    many = [other, 1, 2, 3]  # 4 ids + the grammar's EOS: 5 > max_stop_ids 4
    with pytest.raises(ValueError, match=r"5 eos ids \(with the grammar's EOS ids"):
        fdecode.generate(step, PROMPTS, SamplingParams(grammar=grammar, max_new_tokens=NEW, eos_token_id=many))
    again = [other, 1, tokenizer.eos_token_id, other]  # duplicates, and the grammar's own EOS: 3 ids
    check_in_language(
        tokenizer,
        grammar,
        fdecode.generate(step, PROMPTS, SamplingParams(grammar=grammar, max_new_tokens=NEW, eos_token_id=again)),
    )


# --------------------------------------------------------------------------- constraints that mask every token

from support.hand_grammar import HandGrammar  # noqa: E402
from support.llama_models import VOCAB, fdecode_target  # noqa: E402

EOS = VOCAB - 1
YES, NO, BANG = 11, 12, 13
YES_OR_NO = HandGrammar({0: {YES: 1, NO: 1}}, final={1}, vocab_size=VOCAB, eos=(EOS,))  # (yes|no), one token each
# Any run of "!" then one "yes": unbounded, so min_tokens cannot be refused up front, yet "yes" ends it.
BANGS_THEN_YES = HandGrammar({0: {BANG: 0, YES: 1}}, final={1}, vocab_size=VOCAB, eos=(EOS,))


@pytest.fixture(scope="module")
def constrained_step():
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=3,
        max_batch=3,
        max_seq_len=64,
        block_size=4,
        backend="eager",
        max_grammar_states=8,
        max_grammar_transitions=64,
        min_tokens=True,
        max_logit_bias=2,
        sampling=True,
    )
    return fdecode.compile(fdecode_target(2), "ngram", cfg)


def test_min_tokens_a_grammar_can_never_reach_is_refused_up_front(constrained_step):
    from fdecode.grammar.length import longest_output

    assert (longest_output(YES_OR_NO), longest_output(BANGS_THEN_YES)) == (1, None)
    params = SamplingParams(grammar=YES_OR_NO, min_tokens=6, max_new_tokens=10, eos_token_id=EOS)
    with pytest.raises(ValueError, match="min_tokens=6 can never be met: the grammar's longest output is 1"):
        fdecode.generate(constrained_step, [[5, 6, 7]], params)
    with pytest.raises(ValueError, match="min_tokens=6 can never be met"):
        fdecode.Engine(constrained_step).add_request([5, 6, 7], params)
    assert fdecode.generate(constrained_step, [[5, 6, 7]], params.replace(min_tokens=1))[0][-1] == EOS


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_lane_whose_row_allows_no_token_ends_with_an_error_and_no_masked_token(constrained_step, temperature):
    """ "yes" (pushed by a logit bias) ends the grammar's language while min_tokens still masks EOS: the
    next row allows nothing. The lane keeps what came before and ends with an error; the other lanes
    go on unharmed."""
    stuck = SamplingParams(
        grammar=BANGS_THEN_YES,
        min_tokens=8,
        max_new_tokens=12,
        eos_token_id=EOS,
        logit_bias={YES: 60.0, BANG: 30.0},
        temperature=temperature,
        seed=1,
    )
    late = stuck.replace(logit_bias={BANG: 60.0, YES: 30.0})  # "!" first: reaches min_tokens, then may stop
    free = SamplingParams(max_new_tokens=12, eos_token_id=EOS, temperature=temperature, seed=2)
    got = fdecode.generate(constrained_step, [[5, 6, 7], [5, 6, 7], [9, 8]], [stuck, late, free], details=True)
    assert (got[0].tokens, got[0].reason) == ([YES], "error")
    assert "no token was allowed" in got[0].error
    assert got[1].reason != "error" and BANGS_THEN_YES.state_after(got[1].tokens[:-1]) is not None
    assert got[2].reason != "error" and (len(got[2].tokens) == 12 or got[2].tokens[-1] == EOS)


def test_the_masked_row_cut_stays_inside_the_one_graph(constrained_step):
    params = SamplingParams(grammar=BANGS_THEN_YES, min_tokens=4, max_new_tokens=8, eos_token_id=EOS)
    state = constrained_step.prefill([[5, 6, 7]], params=params)
    report = fdecode.inspect(constrained_step, state)
    assert (report.graph_count, report.graph_break_count, report.host_syncs) == (1, 0, [])
