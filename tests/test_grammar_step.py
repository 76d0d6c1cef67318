"""Grammars inside the step: each lane's automaton masks the verified rows and the drafts, exactly.

Greedy lanes equal transformers' generate under a `LogitsProcessor` that masks by an independent Python walk
of the same automaton (a draft LM, an MTP head, n-gram drafts); random lanes follow the masked, filtered
target (chi-square over every outcome of up to three tokens of a 5-token vocabulary, stops included); lanes
with different grammars, and without, share a step, admitted mid-flight, with no new graph.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from support.hand_grammar import HandGrammar, Masked, mask_logits, parity
from support.llama_models import VOCAB, fdecode_target, hf_target, independent_draft, mtp_head
from support.stats import ALPHA, chi2_pvalue, reference_filter
from support.tiny_vocab import PROMPT, V, logits_after, tiny_draft, tiny_target

import fdecode
from fdecode import SamplingParams

EOS = VOCAB - 1
NEW = 14
PROMPTS = [(5, 17, 33, 2, 9, 41, 60, 5, 17), (7, 3), (11, 12, 13, 14, 15, 80, 81, 82, 83, 11, 12)]
PARITY = parity(VOCAB, EOS)
# Only tokens the prompts repeat (n-gram drafts propose them), and then only after 17 or 41: may stop anywhere.
FEW = HandGrammar(
    {0: {5: 0, 17: 1, 33: 0, 41: 1, 60: 0, 12: 0}, 1: {5: 0, 60: 0, 11: 0, 12: 0}},
    final={0, 1},
    vocab_size=VOCAB,
    eos=(EOS,),
)


def hf_masked(prompt, grammar: HandGrammar | None) -> list[int]:
    ids = torch.tensor([prompt])
    processors = transformers.LogitsProcessorList([] if grammar is None else [Masked(grammar, len(prompt))])
    out = hf_target(2).generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=NEW,
        do_sample=False,
        eos_token_id=EOS,
        pad_token_id=0,
        logits_processor=processors,
    )
    return out[0, len(prompt) :].tolist()


def build(draft_kind: str, max_batch: int = 3):
    target = fdecode_target(2)
    draft = {
        "model": lambda: independent_draft("partial", target),
        "mtp": lambda: mtp_head("partial", target),
        "ngram": lambda: "ngram",
    }[draft_kind]()
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=3,
        max_batch=max_batch,
        max_seq_len=64,
        block_size=4,
        backend="eager",
        max_grammar_states=8,
        max_grammar_transitions=256,
    )
    return fdecode.compile(target, draft, cfg)


@pytest.fixture(scope="module", params=["model", "mtp", "ngram"])
def step(request):
    return build(request.param)


@pytest.mark.parametrize("name", ["parity", "few"])
def test_greedy_with_a_grammar_equals_masked_greedy_decoding(step, name):
    grammar = {"parity": PARITY, "few": FEW}[name]
    params = SamplingParams(grammar=grammar, eos_token_id=EOS, max_new_tokens=NEW)
    got = fdecode.generate(step, [list(p) for p in PROMPTS], params)
    assert got == [hf_masked(p, grammar) for p in PROMPTS]
    for seq in got:  # in the language, and a stop only where it accepts
        body = seq[:-1] if seq[-1] == EOS else seq
        assert grammar.state_after(body) is not None
        assert seq[-1] != EOS or grammar.state_after(body) in grammar.final
    assert got != fdecode.generate(step, [list(p) for p in PROMPTS], max_new_tokens=NEW, eos_token_id=EOS)


def test_lanes_with_different_grammars_share_the_engine(step):
    """Different grammars and none, more requests than lanes (admitted as lanes free up): each lane
    equals its own reference; the grammars share the state's pool."""
    engine = fdecode.Engine(step)
    requests = [(p, g) for p in PROMPTS for g in (PARITY, None, FEW)]
    ids = [
        engine.add_request(list(p), SamplingParams(grammar=g, eos_token_id=EOS, max_new_tokens=NEW))
        for p, g in requests
    ]
    results = engine.run()
    for rid, (prompt, grammar) in zip(ids, requests):
        assert results[rid] == hf_masked(prompt, grammar)


def test_grammars_are_refused_where_the_step_has_no_room():
    plain = fdecode.compile(
        fdecode_target(2),
        "ngram",
        fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=32, block_size=4, backend="eager"),
    )
    with pytest.raises(ValueError, match="max_grammar_states"):
        fdecode.generate(plain, [[1, 2]], SamplingParams(grammar=PARITY, max_new_tokens=3))
    small = fdecode.compile(
        fdecode_target(2),
        "ngram",
        fdecode.DecodeConfig(
            num_draft_tokens=2,
            max_batch=2,
            max_seq_len=32,
            block_size=4,
            backend="eager",
            max_grammar_states=8,
            max_grammar_transitions=64,
        ),
    )
    with pytest.raises(ValueError, match="max_grammar_transitions"):
        fdecode.generate(small, [[1, 2]], SamplingParams(grammar=PARITY, max_new_tokens=3))
    wrong = HandGrammar({0: {1: 0}}, final={0}, vocab_size=VOCAB + 4, eos=(EOS,))
    with pytest.raises(ValueError, match="vocab_size"):
        fdecode.generate(small, [[1, 2]], SamplingParams(grammar=wrong, max_new_tokens=3))


def test_a_batch_of_constrained_and_free_lanes_stays_one_graph(step):
    """Grammar lanes beside a free one: one graph, no break, no host sync, the fused prepare op once, and
    the automaton read by gathers and `searchsorted` (the walk over drafts) inside it."""
    params = [SamplingParams(grammar=g, eos_token_id=EOS, max_new_tokens=NEW) for g in (PARITY, FEW, None)]
    state = step.prefill([list(p) for p in PROMPTS], params=params)
    report = fdecode.inspect(step, state)
    assert (report.graph_count, report.graph_break_count, report.host_syncs) == (1, 0, [])
    assert report.op_counts["fdecode::prepare_next_draft"] == 1
    assert "aten::searchsorted" in report.op_counts


# --------------------------------------------------------------------------- random lanes: exactness

TINY = HandGrammar(
    {0: {1: 1, 2: 1, 3: 2}, 1: {4: 2, 1: 1, 3: 0}, 2: {2: 0, 4: 1, 1: 2}}, final={1, 2}, vocab_size=V, eos=(0,)
)
RANDOM = SamplingParams(temperature=1.2, grammar=TINY, eos_token_id=0, max_new_tokens=3)


def reference(target, generated: list[int]) -> torch.Tensor:
    return reference_filter(
        mask_logits(TINY, generated, logits_after(target, PROMPT + generated)).double(), RANDOM.temperature, 0, 1.0, 0.0
    )


@pytest.mark.parametrize("kind", ["random", "self"])
def test_random_lanes_with_a_grammar_follow_the_masked_target(kind):
    target = tiny_target()
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=2,
        max_batch=64,
        max_seq_len=16,
        block_size=4,
        backend="eager",
        max_grammar_states=4,
        max_grammar_transitions=16,
    )
    step = fdecode.compile(target, tiny_draft(kind, target), cfg)
    samples = []
    for batch in range(30):
        samples += fdecode.generate(
            step, [PROMPT] * 64, [RANDOM.replace(seed=1000 * batch + lane) for lane in range(64)]
        )
    stop = V  # a cell for "nothing after the stop"
    cells = torch.tensor(
        [sum(t * (V + 1) ** (2 - i) for i, t in enumerate(s + [stop] * (3 - len(s)))) for s in samples]
    )
    expected = torch.zeros((V + 1) ** 3, dtype=torch.float64)

    def walk(prefix: list[int], p: float) -> None:
        if len(prefix) == 3 or (prefix and prefix[-1] == 0):
            padded = prefix + [stop] * (3 - len(prefix))
            expected[sum(t * (V + 1) ** (2 - i) for i, t in enumerate(padded))] += p
            return
        for t, q in enumerate(reference(target, prefix).tolist()):
            if q > 0:
                walk(prefix + [t], p * q)

    walk([], 1.0)
    counts = torch.bincount(cells, minlength=(V + 1) ** 3)
    assert chi2_pvalue(counts, expected) > ALPHA
    assert counts[expected == 0].sum() == 0


def test_ngram_proposals_that_leave_the_language_end_there():
    """Every draft an n-gram step carries continues the lane's committed tokens inside the language."""
    step = build("ngram", max_batch=2)
    prompts = [[5, 17, 60, 5, 17, 2, 9, 5, 17, 12, 5, 17, 33, 8, 5, 17], [41, 11, 3, 41, 12, 60, 41, 11, 3, 41]]
    state = step.prefill(prompts, params=SamplingParams(grammar=FEW, eos_token_id=EOS, max_new_tokens=NEW))
    committed = [state.step_output.tokens[b, :1].tolist() for b in range(2)]
    carried = 0
    while not bool(state.step_output.finished[:2].all()):
        for b in range(2):
            if bool(state.step_output.finished[b]):
                continue
            drafts = [t for t in state.tokens[b, 1:].tolist() if t >= 0]
            carried += len(drafts)
            assert FEW.state_after(committed[b] + drafts) is not None, (committed[b], drafts)
        state, out = step(state)
        for b in range(2):
            committed[b] += out.tokens[b, : int(out.num_tokens[b])].tolist()
    assert carried > 0


# --------------------------------------------------------------------------- a real Grammar, end to end


@pytest.mark.parametrize("which", ["byte-bpe", "sentencepiece"])
def test_a_regex_grammar_on_a_real_tokenizer_decodes_text_the_regex_matches(which):
    """`Grammar.from_regex` over a tokenizer, a model of that vocabulary: greedy lanes equal transformers
    masked by the grammar's tables (`fdecode.grammar.lookup`, the reference reads), and the text of a
    lane that stopped is a whole match of the pattern."""
    regex = pytest.importorskip("regex", reason='needs regex: pip install -e ".[test]"')
    pytest.importorskip("outlines_core", reason='needs outlines-core: pip install -e ".[grammar]"')
    from support.tokenizers import byte_bpe, sentencepiece

    from fdecode.grammar.lookup import allowed_tokens, next_state

    tokenizer = {"byte-bpe": byte_bpe, "sentencepiece": sentencepiece}[which]()
    vocab = len(tokenizer) + 3  # the model pads its vocabulary past the tokenizer's
    torch.manual_seed(3)
    hf = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            initializer_range=0.2,
            tie_word_embeddings=False,
        )
    ).eval()
    pattern = r"(ab|ba|12)+(\.c|é)? (true|1\.2)"
    grammar = fdecode.Grammar.from_regex(pattern, tokenizer, vocab_size=vocab)
    tables, eos = grammar.tables(), tokenizer.eos_token_id

    class Reference(transformers.LogitsProcessor):
        def __init__(self, start):
            self.start = start

        def __call__(self, input_ids, scores):
            state = torch.tensor(0)
            for t in input_ids[0, self.start :].tolist():
                state = next_state(tables, state, torch.tensor(t), vocab)
            return torch.where(allowed_tokens(tables, state, vocab), scores, float("-inf"))

    target = fdecode.models.from_hf(hf)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=2,
        max_batch=2,
        max_seq_len=64,
        block_size=4,
        backend="eager",
        max_grammar_states=grammar.num_states + 4,
        max_grammar_transitions=grammar.num_transitions + 8,
    )
    step = fdecode.compile(target, fdecode.models.LlamaModel.random(target.config.replace(num_layers=1), seed=1), cfg)
    prompts = [[5, 9, 40, 41], [7, 7, 3]]
    got = fdecode.generate(step, prompts, SamplingParams(grammar=grammar, eos_token_id=eos, max_new_tokens=24))
    for prompt, tokens in zip(prompts, got):
        ids = torch.tensor([prompt])
        want = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
            logits_processor=transformers.LogitsProcessorList([Reference(len(prompt))]),
        )
        assert tokens == want[0, len(prompt) :].tolist()
        if tokens[-1] == eos:
            assert regex.fullmatch(pattern, tokenizer.decode(tokens[:-1]))
    assert any(tokens[-1] == eos for tokens in got)  # at least one lane reached a whole match and stopped
