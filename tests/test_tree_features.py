"""Request features on draft trees (`fdecode.tree.processing`): each node's row is processed after its own path.

Greedy lanes of a tree step equal transformers' `generate` under the same processors (`repetition_penalty`,
`sequence_bias`, `min_new_tokens`, a `LogitsProcessor` for frequency / presence and one masking by a hand-written
automaton), for a draft LM, an MTP head and n-gram drafts; every node the draft puts in a tree is inside the lane's
language; logprobs of the committed tokens equal transformers' logits and scores; random lanes follow the
processed target exactly (chi-square over every outcome at a 5-token vocabulary); one graph, no break, no sync.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.deepseek_models import VOCAB as MLA_VOCAB
from support.deepseek_models import compiled, deepseek_target, hf_deepseek
from support.hand_grammar import HandGrammar, parity
from support.llama_models import VOCAB, draft_of, fdecode_target
from support.processor_oracle import TINY_REQUEST, hf_processed, reference_next
from support.runs import over_depths
from support.stats import ALPHA, chi2_pvalue
from support.tiny_vocab import PROMPT, V, tiny_draft, tiny_target

import fdecode
from fdecode import SamplingParams
from fdecode.ops.processors import Processors, process
from fdecode.ops.tree import ancestors
from fdecode.tree.draft import select
from fdecode.tree.processing import node_paths
from fdecode.tree.shape import TreeShape

PROMPTS = [(5, 17, 33, 2, 9, 41, 60, 5, 17), (7, 3), (11, 12, 13, 14, 15, 80, 81, 82, 83, 11, 12)]
NEW = 16
EOS = VOCAB - 1
TREE = dict(num_draft_tokens=6, draft_topk=2, draft_depth=3)
FEATURES = dict(
    penalties=True, min_tokens=True, max_logit_bias=3, max_logprobs=3, max_grammar_states=8, max_grammar_transitions=256
)
REQUESTS = {
    "repetition": SamplingParams(repetition_penalty=1.8),
    "frequency_presence": SamplingParams(frequency_penalty=0.9, presence_penalty=0.6),
    "logit_bias": SamplingParams(logit_bias={3: 2.5, 40: 1.5, 77: -9.0}),
    "all": SamplingParams(repetition_penalty=0.7, frequency_penalty=-0.3, presence_penalty=0.4, logit_bias={17: 1.0}),
}
PARITY = parity(VOCAB, EOS)
# Only tokens the prompts repeat (n-gram drafts propose them), and then only after 17 or 41: may stop anywhere.
FEW = HandGrammar(
    {0: {5: 0, 17: 1, 33: 0, 41: 1, 60: 0, 12: 0}, 1: {5: 0, 60: 0, 11: 0, 12: 0}},
    final={0, 1},
    vocab_size=VOCAB,
    eos=(EOS,),
)
# 5 or 7, then 6 or 8, and again; stops after a pair.
ALTERNATE = HandGrammar({0: {5: 1, 7: 1}, 1: {6: 0, 8: 0}}, final={0}, vocab_size=VOCAB, eos=(EOS,))


def build(draft_kind: str, kind: str = "partial", backend: str = "eager", **changes):
    target = fdecode_target(2)
    draft = draft_of(draft_kind, kind, target)
    cfg = fdecode.DecodeConfig(
        max_batch=3,
        max_seq_len=64,
        block_size=4,
        backend=backend,
        **{**TREE, **FEATURES, "adaptive_depth": False, **changes},
    )
    return fdecode.compile(target, draft, cfg)


def inside(grammar: HandGrammar, tokens: list[int]) -> bool:
    """Whether `tokens` are in the grammar's language, ending at an EOS only where it accepts."""
    stopped = tokens[-1] in grammar.eos
    state = grammar.state_after(tokens[:-1] if stopped else tokens)
    return state is not None and (not stopped or state in grammar.final)


@pytest.fixture(scope="module", params=["model", "mtp", "ngram"])
def step(request):
    return build(request.param)


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_greedy_tree_with_processors_equals_transformers(step, name):
    params = REQUESTS[name].replace(max_new_tokens=NEW)
    got = fdecode.generate(step, [list(p) for p in PROMPTS], params=params)
    assert got == [hf_processed(p, params, NEW)[0] for p in PROMPTS]
    assert got != fdecode.generate(step, [list(p) for p in PROMPTS], max_new_tokens=NEW)  # the processors did something


def test_min_tokens_masks_stop_ids_at_every_node(step):
    """A stop id the target would emit early is masked at every node of depth below min_tokens, then ends the lane."""
    prompt = list(PROMPTS[0])
    plain = fdecode.generate(step, [prompt], max_new_tokens=NEW)[0]
    eos = plain[2]  # greedy decoding would stop on its third token
    params = SamplingParams(min_tokens=9, eos_token_id=eos, max_new_tokens=NEW)
    got = fdecode.generate(step, [prompt], params=params)[0]
    assert got == hf_processed(prompt, params, NEW, eos=eos)[0] and eos not in got[:9]


@pytest.mark.parametrize("name", ["parity", "few"])
def test_greedy_tree_with_a_grammar_equals_masked_greedy_decoding(step, name):
    grammar = {"parity": PARITY, "few": FEW}[name]
    params = SamplingParams(grammar=grammar, eos_token_id=EOS, max_new_tokens=NEW)
    got = fdecode.generate(step, [list(p) for p in PROMPTS], params)
    assert got == [hf_processed(p, params, NEW, eos=EOS)[0] for p in PROMPTS]
    assert got != fdecode.generate(step, [list(p) for p in PROMPTS], max_new_tokens=NEW, eos_token_id=EOS)


def test_every_drafted_node_is_inside_the_language(step):
    """The draft's trees respect each lane's grammar: every node's path continues the committed tokens inside the
    language (a draft LM or MTP head masks its rows, n-gram nodes that leave it are absent), over a whole run."""
    prompts = [
        [5, 17, 60, 5, 17, 2, 9, 5, 17, 12],
        [41, 11, 3, 41, 12, 60],
        [5, 7, 5, 9, 7, 5, 5, 6, 7, 7, 8, 5, 6, 7, 8],
    ]
    grammars = [FEW, PARITY, ALTERNATE]  # ALTERNATE's prompt follows 5 and 7 by odd tokens too: n-gram nodes to drop
    params = [SamplingParams(grammar=g, eos_token_id=EOS, max_new_tokens=NEW) for g in grammars]
    state = step.prefill(prompts, params=params)
    committed = [state.step_output.tokens[b, :1].tolist() for b in range(3)]
    nodes = 0
    while not bool(state.step_output.finished[:3].all()):
        for b, grammar in enumerate(grammars):
            if bool(state.step_output.finished[b]):
                continue
            tokens, parents = state.tokens[b].tolist(), state.tree_parents[b].tolist()
            for i in range(1, len(tokens)):
                if tokens[i] < 0:
                    continue
                path, j = [], i
                while j > 0:
                    path.insert(0, tokens[j])
                    j = parents[j]
                nodes += 1
                assert inside(grammar, committed[b] + path), (committed[b], path)
        state, out = step(state)
        for b in range(3):
            committed[b] += out.tokens[b, : int(out.num_tokens[b])].tolist()
    assert nodes > 0


def test_mixed_lanes_in_the_engine_commit_what_the_chain_commits(step):
    """Lanes with different features and grammars, and none, admitted mid-flight: the tree step (depth K every
    launch, and the Engine's choice among the tree and chains of 1 .. S) commits what the chain's step of the same
    draft commits (all lossless), and transformers' tokens."""
    cfg = step.config
    adaptive = fdecode.compile(step.target, step.draft, dataclasses.replace(cfg, adaptive_depth=True))
    adaptive.warmup(depths=adaptive.depths)  # every depth to choose from (a CPU's would start at the chain alone)
    chain = fdecode.compile(
        step.target, step.draft, dataclasses.replace(cfg, draft_topk=1, draft_depth=3, num_draft_tokens=3)
    )
    requests = [(p, REQUESTS["all"].replace(min_tokens=5)) for p in PROMPTS] + [
        (PROMPTS[0], SamplingParams(grammar=PARITY, repetition_penalty=1.3)),
        (PROMPTS[2], SamplingParams(grammar=FEW)),
        (PROMPTS[1], SamplingParams()),
    ]
    results = []
    for s in (step, adaptive, chain):
        engine = fdecode.Engine(s)
        ids = [engine.add_request(list(p), r.replace(max_new_tokens=NEW, eos_token_id=EOS)) for p, r in requests]
        done = engine.run()
        results.append([done[i] for i in ids])
    assert (
        results[0] == results[1] == [hf_processed(p, r.replace(eos_token_id=EOS), NEW, eos=EOS)[0] for p, r in requests]
    )


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_tree_logprobs_equal_transformers_logits_or_scores(mode):
    """The logprobs of each committed token come from the accepted path's row that chose it."""
    step = build("model", logprobs_mode=mode)
    params = REQUESTS["repetition"].replace(max_new_tokens=NEW, logprobs=2)
    done = fdecode.generate(step, [list(PROMPTS[0])], params, details=True)[0]
    want, out = hf_processed(PROMPTS[0], params, NEW, output_logits=True, output_scores=True)
    assert done.tokens == want and [lp.token for lp in done.logprobs] == want
    rows = torch.log_softmax(torch.cat(out.logits if mode == "raw" else out.scores).float(), dim=-1)
    for lp, row, t in zip(done.logprobs, rows, want):
        assert lp.logprob == pytest.approx(row[t].item(), abs=1e-4)
        values, top = torch.topk(row, 2)
        assert list(lp.top) == top.tolist() and list(lp.top.values()) == pytest.approx(values.tolist(), abs=1e-4)
    assert done.metrics.drafts_accepted >= 5  # committed paths of several nodes, off the draft's chain too


def test_a_tree_step_with_every_feature_is_one_graph_without_host_syncs():
    step = build("model", backend="aot_eager", num_draft_tokens=4, draft_depth=2)
    params = [
        REQUESTS["all"].replace(max_new_tokens=NEW, logprobs=3, min_tokens=4, grammar=PARITY, eos_token_id=EOS),
        SamplingParams(temperature=0.8, top_k=5, seed=1, repetition_penalty=1.2, logprobs=1, max_new_tokens=NEW),
    ]
    state = step.prefill([list(p) for p in PROMPTS[:2]], params=params)
    report = fdecode.inspect(step, state)
    assert (report.graph_count, report.graph_break_count, report.host_syncs) == (1, 0, [])
    assert "aten::searchsorted" in report.op_counts and "aten::scatter_add" in report.op_counts


# A grammar at the 5-token vocabulary (EOS 0, allowed in states 1 and 2): with TINY_REQUEST's min_tokens = 2 every
# lane commits three tokens, each from the penalised, biased, masked target.
TINY_GRAMMAR = HandGrammar(
    {0: {1: 1, 2: 1, 3: 2}, 1: {4: 2, 1: 1, 3: 0}, 2: {2: 0, 4: 1, 1: 2}}, final={1, 2}, vocab_size=V, eos=(0,)
)


@pytest.mark.parametrize("kind", ["random", "self"])
def test_random_tree_lanes_with_processors_follow_the_processed_target(kind):
    target = tiny_target()
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=4,
        draft_topk=2,
        draft_depth=2,
        max_batch=64,
        max_seq_len=12,
        block_size=4,
        backend="eager",
        penalties=True,
        min_tokens=True,
        max_logit_bias=2,
        adaptive_depth=False,  # a tree every step (a CPU's Engine would keep the chain)
        max_grammar_states=4,
        max_grammar_transitions=16,
    )
    step = fdecode.compile(target, tiny_draft(kind, target), cfg)
    request = TINY_REQUEST.replace(grammar=TINY_GRAMMAR)
    samples = []
    for batch in range(30):
        samples += fdecode.generate(
            step, [PROMPT] * 64, [request.replace(seed=1000 * batch + lane) for lane in range(64)]
        )
    assert all(len(s) == 3 for s in samples)
    cells = torch.tensor([(a * V + b) * V + c for a, b, c in samples])
    expected = torch.zeros(V, V, V, dtype=torch.float64)
    p1 = reference_next(target, [], request)
    for a in range(V):
        p2 = reference_next(target, [a], request) if p1[a] > 0 else torch.zeros(V, dtype=torch.float64)
        for b in range(V):
            if p2[b] > 0:
                expected[a, b] = p1[a] * p2[b] * reference_next(target, [a, b], request)
    counts = torch.bincount(cells, minlength=V**3)
    assert chi2_pvalue(counts, expected.flatten()) > ALPHA
    assert counts[expected.flatten() == 0].sum() == 0


def test_each_node_is_processed_as_the_chain_row_after_its_path():
    """A tree node's row is the chain's row after the node's path (its ancestors and itself past the root): penalties
    count the path's tokens, not its siblings', min_tokens counts its depth, the grammar walks the path."""
    torch.manual_seed(0)
    vocab, batch = 12, 3
    grammar = parity(vocab, vocab - 1)
    tables = grammar.tables()
    cfg = fdecode.DecodeConfig(
        **TREE, max_batch=batch, max_seq_len=16, penalties=True, min_tokens=True, max_logit_bias=2,
        max_grammar_states=4, max_grammar_transitions=64,
    )  # fmt: skip
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3], [-1, 0, 1, 2, 0, 4, 0], [-1, 0, 0, 1, 2, 3, 4]])
    tokens = torch.randint(0, 6, (batch, 7))  # few distinct tokens: siblings and ancestors share some
    tokens[0] = torch.tensor([9, 0, 2, 1, 3, 5, 4])  # lane 0: every path inside the parity language
    tokens[1, 6] = -1  # an absent node
    lanes = Processors(
        penalties=torch.tensor([[1.7, 0.4, 0.3], [0.6, -0.2, 0.5], [1.0, 0.0, 0.0]]),
        counts=torch.randint(0, 3, (batch, vocab), dtype=torch.int32),
        seen=torch.rand(batch, vocab) < 0.3,
        min_left=torch.tensor([2, 0, 5]),
        bias_ids=torch.tensor([[3, -1], [0, 7], [-1, -1]]),
        bias=torch.tensor([[1.5, 0.0], [-2.0, 0.7], [0.0, 0.0]]),
        stop_ids=torch.tensor([[vocab - 1, 4], [vocab - 1, -1], [2, -1]]),
        grammar_state=torch.tensor([0, -1, 1]),
        grammar_allowed=tables.allowed,
        grammar_keys=tables.keys,
        grammar_next=tables.next,
    )
    logits = torch.randn(batch, 7, vocab)
    flags = dict(penalties=True, min_tokens=True, bias=True, grammars=True)
    paths = node_paths(cfg, lanes, tokens, parents, ancestors(parents, cfg.levels), vocab)
    tree = process(logits, lanes, paths=paths, **flags)
    for b in range(batch):
        lane = lanes._replace(**{f: getattr(lanes, f)[b : b + 1] for f in Processors._fields[:8]})
        for i in range(7):
            path, j = [], i
            while j > 0:
                path.insert(0, int(tokens[b, j]))
                j = int(parents[b, j])
            chain = process(logits[b : b + 1, i : i + 1], lane, torch.tensor([path]).view(1, -1), len(path), **flags)
            torch.testing.assert_close(tree[b, i], chain[0, 0], msg=f"lane {b}, node {i}, path {path}")


def test_a_masked_node_of_the_drafts_chain_keeps_the_chains_rows():
    """Rows 1 .. S hold the draft's chain (a shallower step verifies them as a chain) even where the processors
    masked a chain node (its path log-probability -inf): the node is absent there, the layout unchanged."""
    inf = float("inf")
    level1 = (torch.tensor([[10, 11]]), torch.tensor([[-0.1, -2.0]]), torch.tensor([[-1, -1]]))
    # the chain's node 10 allowed no child (a grammar's end beside min_tokens); node 11's children are allowed
    level2 = (torch.tensor([[20, 21, 22, 23]]), torch.tensor([[-inf, -inf, -2.5, -3.0]]), torch.tensor([[0, 0, 1, 1]]))
    tokens, parents = select(TreeShape(nodes=4, topk=2, levels=2), [level1, level2], masked=True)
    assert tokens.tolist() == [[10, -1, 11, 22]] and parents.tolist() == [[0, 1, 0, 3]]


BANG, YES = 10, 11
BANGS_THEN_YES = HandGrammar({0: {BANG: 0, YES: 1}}, final={1}, vocab_size=VOCAB, eos=(EOS,))  # "!"*, "yes", end


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_node_whose_row_allows_no_token_ends_the_lane_with_an_error(step, temperature):
    """ "!" (pushed by a logit bias) comes first, then the presence penalty makes "yes" win, after which the grammar
    allows only EOS while min_tokens masks it: the row after the "yes" node allows nothing. The lane keeps what came
    before it and ends with an error; the other lane goes on unharmed."""
    stuck = SamplingParams(
        grammar=BANGS_THEN_YES,
        min_tokens=8,
        max_new_tokens=12,
        eos_token_id=EOS,
        logit_bias={BANG: 60.0, YES: 45.0},
        presence_penalty=30.0,
        temperature=temperature,
        seed=1,
    )
    free = SamplingParams(max_new_tokens=12, eos_token_id=EOS, temperature=temperature, seed=2)
    got = fdecode.generate(step, [[5, 6, 7], [9, 8]], [stuck, free], details=True)
    assert (got[0].tokens, got[0].reason) == ([BANG, YES], "error") and "no token was allowed" in got[0].error
    assert got[1].reason != "error" and (len(got[1].tokens) == 12 or got[1].tokens[-1] == EOS)


@pytest.mark.parametrize("draft", ["self", "ngram"])
def test_greedy_mla_tree_with_processors_equals_transformers(draft):
    """DeepSeek-V3 over its latent cache (the target as its own draft, or n-gram drafts): the features per node
    are the model's logits' business only, so its greedy lanes equal transformers' under the same processors."""
    target = deepseek_target()
    features = {**FEATURES, "max_logprobs": None, "adaptive_depth": False}
    step = compiled(target, target if draft == "self" else "ngram", 6, draft_topk=2, draft_depth=3, **features)
    eos = MLA_VOCAB - 1
    requests = [
        REQUESTS["all"].replace(min_tokens=4, eos_token_id=eos),
        SamplingParams(grammar=parity(MLA_VOCAB, eos), repetition_penalty=1.4, eos_token_id=eos),
    ]
    for params in requests:
        params = params.replace(max_new_tokens=NEW)
        got = fdecode.generate(step, [list(p) for p in PROMPTS], params)
        assert got == [hf_processed(p, params, NEW, eos=eos, model=hf_deepseek(0))[0] for p in PROMPTS]
        assert got != fdecode.generate(step, [list(p) for p in PROMPTS], max_new_tokens=NEW, eos_token_id=eos)


def test_tree_steps_at_every_depth_with_processors_equal_transformers(step):
    """Depths 0 .. S (the window's first rows, then a chain) and K (the tree), in any order, each process their
    rows after their paths: penalties, a bias and min_tokens on one lane, a grammar on another."""
    assert step.depths == (0, 1, 2, 3, 4, 6)
    params = [
        REQUESTS["all"].replace(min_tokens=6, eos_token_id=EOS, max_new_tokens=NEW, logprobs=1),
        SamplingParams(grammar=PARITY, presence_penalty=0.5, eos_token_id=EOS, max_new_tokens=NEW),
        SamplingParams(eos_token_id=EOS, max_new_tokens=NEW),
    ]
    # tree -> chain -> tree, the 4-node tree between, each depth after each
    schedule = [6, 1, 6, 3, 0, 2, 6, 6, 2, 1, 3, 0, 3, 6, 4, 6, 4, 4, 0, 4, 2, 4, 1, 4, 3]
    outs, _ = over_depths(step, step.prefill([list(p) for p in PROMPTS], params=params), schedule, len(PROMPTS))
    assert outs == [hf_processed(p, r, NEW, eos=EOS)[0] for p, r in zip(PROMPTS, params)]
