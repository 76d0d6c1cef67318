"""The tree step (`fdecode.tree`): a draft LM's top-k trees verified in one target forward.

Greedy lanes commit transformers' greedy tokens whatever the tree; random lanes follow the target's filtered
distribution (chi-square over every 3-token outcome at a 5-token vocabulary, as the chain's sampling tests);
the step is one graph with no break and no host sync; impossible shapes are refused before anything compiles.
"""

from __future__ import annotations

import pytest
import torch
from support.llama_models import fdecode_target, fresh_forward, hf_greedy, independent_draft, mtp_head
from support.runs import NEW, PROMPTS, run
from support.tiny_vocab import (
    ALPHA,
    LANES,
    PROMPT,
    V,
    check_follows_the_target,
    chi2_pvalue,
    exact_distribution,
    tiny_draft,
    tiny_target,
)

import fdecode
from fdecode.drafts import NgramDraft, drafter_for
from fdecode.ops import slot_of
from fdecode.runtime.depth import DepthController
from fdecode.tree.ngram import ngram_tree
from fdecode.tree.shape import TreeShape, first_depth, tree_reason


def tree_step(kind: str, n: int, k: int, s: int, backend: str = "eager", **changes):
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=n, draft_topk=k, draft_depth=s, max_batch=4, max_seq_len=64, block_size=4, backend=backend
    )
    return fdecode.compile(target, independent_draft(kind, target), fdecode.DecodeConfig(**{**vars_of(cfg), **changes}))


def vars_of(cfg: fdecode.DecodeConfig) -> dict:
    return {f: getattr(cfg, f) for f in cfg.__dataclass_fields__ if not f.startswith("_")}


def test_the_chain_spelled_out_is_the_chain():
    chain = fdecode.DecodeConfig(num_draft_tokens=3, draft_topk=1, max_batch=2, max_seq_len=32)
    spelled = fdecode.DecodeConfig(num_draft_tokens=3, draft_topk=1, draft_depth=3, max_batch=2, max_seq_len=32)
    assert spelled == chain and hash(spelled) == hash(chain) and not spelled.tree and spelled.levels == 3
    tree = fdecode.DecodeConfig(num_draft_tokens=6, draft_topk=2, draft_depth=3, max_batch=2, max_seq_len=32)
    assert tree.tree and tree.levels == 3 and tree.K == 6 and tree.W == 7


@pytest.mark.parametrize(
    ("n", "k", "s", "match"),
    [
        (4, 1, 2, "draft_topk=1 is the chain"),  # k = 1 makes S nodes
        (11, 2, 3, "at most 10 nodes"),  # 2 + 2 * 4
        (3, 2, 4, "at least one node a level"),
        (3, 0, 2, "draft_topk must be 'auto' or a positive int"),
        (3, 2, 0, "draft_depth must be a positive int"),
        (4, 2, None, "needs draft_depth < num_draft_tokens"),  # S = N levels hold the chain alone
        (4, 3, 4, "needs draft_depth < num_draft_tokens"),
        (1, 2, 1, "needs draft_depth < num_draft_tokens"),
    ],
)
def test_impossible_trees_are_refused(n, k, s, match):
    with pytest.raises(ValueError, match=match):
        fdecode.DecodeConfig(num_draft_tokens=n, draft_topk=k, draft_depth=s, max_batch=2, max_seq_len=32)


def test_trees_a_step_cannot_run_are_refused_before_compiling():
    target = tiny_target()  # 5 tokens
    cfg = fdecode.DecodeConfig(num_draft_tokens=6, draft_topk=6, draft_depth=1, max_batch=2, max_seq_len=16)
    with pytest.raises(ValueError, match="draft_topk=6 exceeds the vocabulary"):
        fdecode.compile(target, tiny_draft("random", target), cfg)
    small = fdecode.DecodeConfig(num_draft_tokens=3, draft_topk=2, draft_depth=2, max_batch=2, max_seq_len=16)
    ngram = NgramDraft().bound(target)
    tp = fdecode.DecodeConfig(**{**vars_of(small), "tp_size": 2})  # TP runs trees (tests/test_tp_families.py)
    assert tree_reason(target, ngram, drafter_for(ngram), tp) is None


def test_a_tree_steps_chains_run_on_its_kernel_and_its_trees_on_the_reference(monkeypatch):
    """A device kernel reads keys by position through the block tables, where a tree's nodes write to slots of
    their own: a tree step's chain depths (the verify, the draft's catch-up and its chain) run on the step's
    kernel, its trees' forwards on the reference. Here flash_attn is let through on the CPU and stood in for by
    the reference over the same causal, by-position context it would read; greedy output over a schedule of every
    depth is still transformers'."""
    from fdecode.graphs import backends
    from fdecode.ops import attention

    calls = {"device": 0, "tree": 0}
    reference = attention.paged_attention_reference

    def stand_in(q, kv, layer, ctx):  # what flash_attn_with_kvcache reads: keys by position, causal
        calls["device"] += 1
        return reference(q, kv, layer, ctx)

    def counted(q, kv, layer, ctx):
        calls["tree"] += 1
        return reference(q, kv, layer, ctx)

    monkeypatch.setitem(backends.ATTENTION_ELIGIBILITY, "flash_attn", lambda cfg, shapes: None)
    monkeypatch.setattr(attention, "_flash_attn", stand_in)
    monkeypatch.setattr(attention, "paged_attention_reference", counted)
    step = tree_step("partial", 6, 2, 3, attention="flash_attn")
    assert step.config.attention == "flash_attn"
    assert step.attention_reason == (
        "flash_attn takes no tree mask: the trees' forwards (depths 4 and 6) run the reference, 'torch'"
    )
    assert tree_step("partial", 6, 2, 3).attention_reason is None  # the reference everywhere: nothing to say
    schedule = [6, 1, 6, 3, 0, 2, 6, 4, 2, 1, 3, 0, 3, 6, 4]
    state = step.prefill(PROMPTS, max_new_tokens=NEW)
    outs = [state.step_output.tokens[lane, :1].tolist() for lane in range(len(PROMPTS))]
    seen = {}
    for i in range(60):
        if bool(state.step_output.finished[: len(PROMPTS)].all()):
            break
        depth = schedule[i % len(schedule)]
        before = dict(calls)
        state, out = step(state, depth=depth)
        seen.setdefault(depth, {key: calls[key] - before[key] for key in calls})
        for lane in range(len(PROMPTS)):
            outs[lane] += out.tokens[lane, : int(out.num_tokens[lane])].tolist()
    assert outs == [hf_greedy(prompt, NEW, None, 2) for prompt in PROMPTS]
    t, d = step.target.config.num_layers, step.draft.config.num_layers  # a forward attends once per layer
    assert seen[1] == {"device": t + d, "tree": 0}  # the verify, the draft's catch-up
    assert seen[3] == {"device": t + 3 * d, "tree": 0}  # and its chain's two further forwards
    assert seen[6] == {"device": d, "tree": t + 2 * d}  # the catch-up; the tree's verify and two levels


@pytest.mark.parametrize(("kind", "n", "k", "s"), [("partial", 6, 2, 3), ("random", 5, 3, 2), ("self", 8, 4, 3)])
def test_greedy_tree_equals_transformers(kind, n, k, s):
    step = tree_step(kind, n, k, s)
    outs, lengths = run(step)
    for prompt, got in zip(PROMPTS, outs):
        assert got == hf_greedy(prompt, NEW, None, 2)
    assert max(lengths) <= s + 1
    if kind != "random":  # a draft that agrees with the target has paths accepted to depth 2 and more
        assert max(lengths) >= 3, lengths


@pytest.mark.parametrize("kind", ["partial", "self"])
def test_greedy_mtp_tree_equals_transformers(kind):
    """A one-layer MTP head drafts trees from the target's hidden states (its own output at a node's parent)."""
    layers = 1 if kind == "self" else 2
    target = fdecode_target(layers)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=6, draft_topk=2, draft_depth=3, max_batch=4, max_seq_len=64, block_size=4, backend="eager"
    )
    outs, lengths = run(fdecode.compile(target, mtp_head(kind, target), cfg))
    assert outs == [hf_greedy(prompt, NEW, None, layers) for prompt in PROMPTS]
    assert max(lengths) <= 4 and (kind != "self" or max(lengths) >= 3)  # S = 3: a head equal to the target goes deep


def test_ngram_tree_branches_are_the_most_frequent_continuations():
    history = torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2, -1, -1]])  # "1 2" ends at 1, 4, 7: then 3, 4, 3
    shape = TreeShape(nodes=6, topk=2, levels=3)
    tokens, parents = ngram_tree(history, torch.tensor([10]), shape, max_n=2, min_n=1, vocab=8)
    # 3 (twice) along its latest occurrence (ending at 7), then 4; neither runs past the last token (10)
    assert tokens.tolist() == [[3, 1, 2, 4, 1, 2]] and parents.tolist() == [[0, 1, 2, 0, 4, 5]]
    tokens, _ = ngram_tree(history, torch.tensor([8]), shape, max_n=2, min_n=1, vocab=8)  # "2 3": once, then 1 2
    assert tokens.tolist() == [[1, 2, 4, -1, -1, -1]]


def test_greedy_ngram_tree_equals_transformers():
    target = fdecode_target(2)
    prompts = [(5, 17, 33, 2, 9, 5, 17, 33, 4, 5, 17, 33, 2), (7, 3), (11, 12, 13, 14, 11, 12, 13, 15, 11, 12)]
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=6, draft_topk=2, draft_depth=3, max_batch=4, max_seq_len=64, block_size=4, backend="eager"
    )
    outs, lengths = run(fdecode.compile(target, "ngram", cfg), prompts=prompts, max_new_tokens=30)
    assert outs == [hf_greedy(prompt, 30, None, 2) for prompt in prompts]
    assert max(lengths) >= 3  # the target repeats itself: some branch is accepted to depth 2 or more


def test_an_adaptive_tree_step_starts_at_its_chain_and_makes_the_tree_in_the_background(monkeypatch):
    """An adaptive tree step starts where no depth's graph is made at the chain of depth S (`Step.first_depth`), on
    a CPU (which charges for a tree's rows) and on an accelerator alike (the stream a chain config of S runs, until
    the tree is measured): `warmup()` makes it, an Engine without a warmup call launches it, and the tree's graph is
    asked for in the background (last) and made, for the controller to weigh. Tokens: transformers' greedy ones. A
    step with `adaptive_depth=False` starts at K, the tree, which it runs at every step."""
    step = tree_step("partial", 6, 2, 3)
    assert step.first_depth == 3 and step.depths == (0, 1, 2, 3, 4, 6)
    accelerator = fdecode.DecodeConfig(**{**vars_of(step.config), "device": "cuda"})
    fixed = tree_step("partial", 6, 2, 3, adaptive_depth=False)  # every step the tree: so is the first
    fixed.warmup()
    assert fixed.first_depth == 6 and {key.depth for key in fixed.graphs} == {6}
    assert (
        first_depth(accelerator) == 3
        and first_depth(fdecode.DecodeConfig(num_draft_tokens=4, max_batch=1, max_seq_len=32)) == 4
    )
    engine = fdecode.Engine(step)  # background graphs off (the suite's default): the first depth alone
    ids = [engine.add_request(list(prompt), max_new_tokens=NEW) for prompt in PROMPTS]
    got = engine.run()
    assert [got[i] for i in ids] == [hf_greedy(prompt, NEW) for prompt in PROMPTS]
    assert {d for d, count in engine.policy.launches.items() if count} == {3}, engine.policy
    assert {key.depth for key in step.graphs} == {3}
    step.warmup()
    assert {key.depth for key in step.graphs} == {3}  # warmup()'s default is the first depth too
    monkeypatch.setenv("FDECODE_BACKGROUND_GRAPHS", "1")
    engine = fdecode.Engine(step)
    engine.add_request(list(PROMPTS[0]), max_new_tokens=4)
    engine.run()
    assert step.graph_set.background.wait(timeout=120)
    asked = [key.depth for key in engine.depth_graphs.asked if not key.catch_up]
    assert asked == [0, 4, 2, 1, 6], engine.depth_graphs  # the tree (K) last
    assert {key.depth for key in step.graphs} >= {0, 1, 2, 3, 4, 6}, step.graph_set.background  # all made


def test_an_engine_weighs_an_ngram_trees_rows_against_its_chains():
    """n-gram trees take the depth controller, as a draft LM's do: where a tree costs more than it commits (its
    rows timed at 3x a chain's here, a CPU's case) the Engine launches chains and the target alone, and the tokens
    are transformers' greedy ones."""
    target = fdecode_target(2)
    prompts = [(5, 17, 33, 2, 9, 5, 17, 33, 4, 5, 17, 33, 2), (11, 12, 13, 14, 11, 12, 13, 15, 11, 12)]
    base = dict(num_draft_tokens=6, draft_topk=2, draft_depth=3, max_batch=4, max_seq_len=64, block_size=4)
    step = fdecode.compile(target, "ngram", fdecode.DecodeConfig(**base, backend="eager"))
    step.warmup(depths=step.depths)  # every depth's graph made (an Engine launches only those)
    engine = fdecode.Engine(step)
    assert isinstance(engine.policy, DepthController) and engine.policy.tree_levels == 3
    engine.policy.costs = [1.0, 1.1, 1.2, 1.3, 3.9, 3.9, 3.9]  # depths 0 .. 3 chains, 4 and 6 trees
    engine.policy.learn_costs = False
    ids = [engine.add_request(list(prompt), max_new_tokens=24, eos_token_id=[]) for prompt in prompts]
    got = engine.run()
    assert [got[i] for i in ids] == [hf_greedy(prompt, 24, None, 2) for prompt in prompts]
    launched = {d for d, count in engine.policy.launches.items() if count}
    assert launched & {1, 2, 3} and launched <= {0, 1, 2, 3}, engine.policy  # no tree of 4 or 6 nodes


def test_a_tree_holds_first_the_chain_the_draft_would_draft():
    """The draft's chain of depth S is the first S nodes of every tree it drafts, even where its deepest nodes
    score below the root's other children (a near-uniform random draft, 4 nodes for 3 levels): the tree never
    verifies less than the chain would, and a shallower step verifies that chain."""
    target = fdecode_target(2)
    draft = independent_draft("random", target)
    base = dict(max_batch=4, max_seq_len=64, block_size=4, backend="eager")
    chain = fdecode.compile(target, draft, fdecode.DecodeConfig(num_draft_tokens=3, **base))
    tree = fdecode.compile(target, draft, fdecode.DecodeConfig(num_draft_tokens=4, draft_topk=3, draft_depth=3, **base))
    want = chain.prefill(PROMPTS, max_new_tokens=8).tokens[: len(PROMPTS), 1:].tolist()
    state = tree.prefill(PROMPTS, max_new_tokens=8)
    for lane, drafts in enumerate(want):
        tokens, parents = state.tokens[lane].tolist(), state.tree_parents[lane].tolist()
        path = [next(i for i in range(1, 5) if parents[i] == 0 and tokens[i] == drafts[0])]
        for token in drafts[1:]:
            path.append(next(i for i in range(1, 5) if parents[i] == path[-1] and tokens[i] == token))
        assert path == [1, 2, 3]  # first: a depth-d step verifies the window's first d + 1 rows


@pytest.mark.parametrize("kind", ["partial", "ngram"])
def test_tree_steps_at_every_depth_equal_transformers(kind):
    """A tree step's depths 0 .. S verify the window's first rows (the chain every tree holds first) and draft a
    chain (one draft at 0); 4 verifies the first 4 nodes and drafts a tree of 4, K the whole tree and a tree of
    K. Any order of them commits transformers' greedy tokens."""
    if kind == "ngram":
        target = fdecode_target(2)
        cfg = fdecode.DecodeConfig(
            num_draft_tokens=6, draft_topk=2, draft_depth=3, max_batch=4, max_seq_len=64, block_size=4, backend="eager"
        )
        step = fdecode.compile(target, "ngram", cfg)
    else:
        step = tree_step(kind, 6, 2, 3)
    assert step.depths == (0, 1, 2, 3, 4, 6)
    # tree -> chain -> tree, the 4-node tree between, each depth after each
    schedule = [6, 1, 6, 3, 0, 2, 6, 6, 2, 1, 3, 0, 3, 6, 4, 6, 4, 4, 0, 4, 2, 4, 1, 4, 3]
    state = step.prefill(PROMPTS, max_new_tokens=NEW)
    outs = [state.step_output.tokens[lane, :1].tolist() for lane in range(len(PROMPTS))]
    for i in range(60):
        if bool(state.step_output.finished[: len(PROMPTS)].all()):
            break
        state, out = step(state, depth=schedule[i % len(schedule)])
        assert schedule[i % len(schedule)] or int(out.num_tokens.max()) <= 1  # depth 0: the target's one token
        for lane in range(len(PROMPTS)):
            outs[lane] += out.tokens[lane, : int(out.num_tokens[lane])].tolist()
    assert outs == [hf_greedy(prompt, NEW, None, 2) for prompt in PROMPTS]
    with pytest.raises(ValueError, match="a tree step runs depths 0, 1, 2, 3, 4, 6"):
        step(state, depth=5)


@pytest.mark.slow  # 64 lanes x 40 batches of the eager tree step
def test_random_lanes_of_a_tree_step_at_a_chain_depth_follow_the_target():
    """Depth 1 of a tree step verifies the primed tree's first two rows, then chains of one draft: exact too."""
    target = tiny_target()
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=4, draft_topk=2, draft_depth=2, max_batch=64, max_seq_len=12, block_size=4, backend="eager"
    )
    step = fdecode.compile(target, tiny_draft("self", target), cfg)
    params = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    samples = []
    for batch in range(40):
        seeds = [1000 * batch + lane for lane in range(LANES)]
        state = step.prefill([PROMPT] * LANES, max_new_tokens=3, seed=seeds, **params)
        got = [state.step_output.tokens[lane, :1].tolist() for lane in range(LANES)]
        while not bool(state.step_output.finished.all()):
            state, out = step(state, depth=1)
            for lane in range(LANES):
                got[lane] += out.tokens[lane, : int(out.num_tokens[lane])].tolist()
        samples.append(torch.tensor(got))
    samples = torch.cat(samples)
    cells = samples[:, 0] * V * V + samples[:, 1] * V + samples[:, 2]
    counts = torch.bincount(cells, minlength=V**3)
    expected = exact_distribution(target, params)
    assert chi2_pvalue(counts, expected) > ALPHA and expected[counts > 0].min() > 0


@pytest.mark.parametrize(
    ("kind", "schedule"),
    [
        ("partial", [6]),
        ("partial", [6, 1, 4, 2, 6, 3, 0, 4, 1, 6, 2, 3]),
        ("partial", [6, 0, 0, 0, 2, 6, 0, 0, 4, 1, 0, 6]),
        ("self", [6, 3, 6, 3, 4, 3, 6, 2, 6, 3]),
    ],
    ids=["trees", "every depth", "idle draft", "whole chains after trees"],
)
def test_committed_kv_is_contiguous_after_trees(kind, schedule):
    """After several tree steps, the target's KV of every position before t and the draft's of every committed
    position (t included) equal a from-scratch forward over the committed tokens: the accepted path's KV was moved
    to the lane's next positions, the draft caught up on the accepted branch, rejected nodes left nothing. Over
    every depth too: a tree catches the draft up on its S + 1 rows, a chain depth on two (below). The
    draft LM sits depth-0 steps out (no node drafted, the tokens wait in `missed`) and the next step that drafts
    is the catch-up graph, which feeds it what it missed. A chain depth commits a prefix of the draft's chain,
    whose KV the draft wrote at its own positions (a tree's siblings at scratch past them), so it catches up on
    two rows: the self-draft accepts whole chains of three after trees."""
    step = tree_step(kind, 6, 2, 3)
    assert step.idles_draft
    prompts = [[5, 17, 33, 2, 9], [7, 3, 4, 4, 1, 1, 2, 60, 61], [11, 12]]
    state = step.prefill(prompts, max_new_tokens=40)
    seqs, lengths = [list(p) for p in prompts], set()
    for i in range(len(schedule) if len(schedule) > 1 else 7):
        for lane in range(len(prompts)):
            n = int(state.step_output.num_tokens[lane])
            seqs[lane] += state.step_output.tokens[lane, :n].tolist()
            if i:
                lengths.add(n)
        before, depth = state, schedule[i % len(schedule)]
        state, _ = step(state, depth=depth)
        if depth == 0:  # the draft sat it out: no node, the committed token waits for it
            assert bool((state.tokens[:, 1:] == -1).all()) and bool((state.missed[: len(prompts), -1] >= 0).all())
        elif i and schedule[(i - 1) % len(schedule)] == 0:  # the catch-up graph: what the draft missed, one node
            assert bool((before.missed[: len(prompts)] >= 0).any()) and bool((state.missed == -1).all())
            assert bool((state.tokens[: len(prompts), 1] >= 0).all()) and bool((state.tokens[:, 2:] == -1).all())
    for lane in range(len(prompts)):
        seqs[lane] += state.step_output.tokens[lane, : int(state.step_output.num_tokens[lane])].tolist()
    assert {2, 3} <= lengths or {1, 2} <= lengths or kind == "self", lengths  # paths of several depths accepted
    assert kind != "self" or 4 in lengths, lengths  # whole chains of three
    bs = step.config.block_size
    for lane, seq in enumerate(seqs):
        n = int(state.base_pos[lane]) + 1
        assert n == len(seq)
        slots = slot_of(state.block_tables[lane : lane + 1], torch.arange(n)[None], bs)[0]
        want = fresh_forward(step.target, seq[:n], block_size=bs)[2]
        torch.testing.assert_close(state.target_kv[:, :, slots[:-1]], want[:, :, :-1], rtol=1e-5, atol=1e-5)
        want = fresh_forward(step.draft, seq[:n], block_size=bs)[2]
        torch.testing.assert_close(state.draft_kv[:, :, slots], want, rtol=1e-5, atol=1e-5)


def test_greedy_tree_stops_at_eos_and_at_the_lane_end():
    step = tree_step("partial", 6, 2, 3, adaptive_depth=False)  # a tree every step (a CPU's Engine keeps the chain)
    reference = hf_greedy(PROMPTS[0], NEW, None, 2)
    eos = reference[5]
    got = fdecode.generate(step, PROMPTS, max_new_tokens=NEW, eos_token_id=eos)
    assert got == [hf_greedy(p, NEW, eos, 2) for p in PROMPTS]
    long = [tuple(range(1, 50))]  # 49 + 15 = 64 = max_seq_len: the last trees reach past the lane's blocks
    assert fdecode.generate(step, long, max_new_tokens=15) == [hf_greedy(long[0], 15, None, 2)]


# The tree the graph tests capture: two levels of top-2 children, 4 of their 6 nodes kept (level 2 prunes 2 of its 4
# candidates by path probability). Half the ops of (6, 2, 3), and half its Inductor compile.
CAPTURED = (4, 2, 2)


@pytest.mark.parametrize("plan", ["greedy", "full+top_k+top_p"])
def test_tree_step_is_one_graph_without_host_syncs(plan):
    step = tree_step("partial", *CAPTURED, backend="aot_eager")
    state = step.prefill([PROMPTS[0], PROMPTS[1]], max_new_tokens=8)
    report = fdecode.inspect(step, state, plan=plan)
    assert (report.graph_count, report.graph_break_count, report.host_syncs) == (1, 0, [])
    assert report.op_counts.get("aten::index_copy_", 0) + report.op_counts.get("aten::index_copy", 0) >= 1
    assert report.op_counts["fdecode::prepare_tree_draft"] == 1  # the draft's first rows: one fused node
    assert report.op_counts.get("fdecode::prepare_next_draft", 0) == 0


@pytest.mark.slow  # 64 lanes x 40 batches of the eager tree step
@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("self", dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)),
        ("random", dict(temperature=0.8, top_k=4, top_p=0.9, min_p=0.0)),
    ],
)
def test_random_tree_lanes_follow_the_target(kind, params):
    target = tiny_target()
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=4, draft_topk=2, draft_depth=2, max_batch=64, max_seq_len=12, block_size=4, backend="eager",
        adaptive_depth=False,
    )  # fmt: skip
    check_follows_the_target(fdecode.compile(target, tiny_draft(kind, target), cfg), target, params)


@pytest.mark.slow
def test_inductor_tree_step_equals_transformers_in_one_graph():
    """Inductor's code for the tree step: greedy lanes commit transformers' tokens, from one graph (captured
    with `fullgraph`, so a break would raise) that later steps run without recompiling. The graph is the one
    `test_tree_step_is_one_graph_without_host_syncs` inspects (same shape; the capture is backend-independent),
    so it is not traced a third time here."""
    step = tree_step("partial", *CAPTURED, backend="inductor")
    assert step.backend == "inductor"
    state = step.prefill(PROMPTS, max_new_tokens=NEW)
    state, _ = step(state)  # the first step makes the graph
    made = len(step.graphs)
    with torch._dynamo.config.patch(error_on_recompile=True):
        outs, _ = run(step)
    assert len(step.graphs) == made == 1
    assert outs == [hf_greedy(prompt, NEW, None, 2) for prompt in PROMPTS]


def test_a_lanes_last_trees_keep_every_node():
    """A node's KV slot lies past its depth (node i at P + i), so a lane's last steps write nodes past its budget's
    end that may still be committed: the lane owns those slots too (`slot_reach`: N = 6 here), and every tree it
    verifies holds its N nodes to the lane's last step, in a prefilled state as in an Engine. A chain's lane owns
    prompt + budget. Before, a tree's lane owned prompt + budget too, and its last trees lost the nodes past it."""
    prompt, budget = [1, 2, 3, 4, 5], 7  # 12 positions: 3 blocks of 4; 18 with the reach: 5
    step = tree_step("partial", 6, 2, 3, adaptive_depth=False)  # a tree every step, in the Engine too
    state = step.prefill([prompt], max_new_tokens=budget)
    assert int((state.block_tables[0] >= 0).sum()) == 5
    verified = []
    while not bool(state.step_output.finished[0]):
        state, out = step(state)
        verified.append(int(out.num_drafts[0]))
    assert len(verified) > 1 and verified == [6] * len(verified)
    engine = fdecode.Engine(step)
    request = engine.add_request(prompt, max_new_tokens=budget)
    assert engine.requests[request].blocks_needed == 5
    assert engine.run()[request] == hf_greedy(tuple(prompt), budget)
    chain = tree_step("partial", 3, 1, 3)
    assert int((chain.prefill([prompt], max_new_tokens=budget).block_tables[0] >= 0).sum()) == 3
    engine = fdecode.Engine(chain)
    assert engine.requests[engine.add_request(prompt, max_new_tokens=budget)].blocks_needed == 3
    # A pool with room for prompt + budget alone (3 blocks past scratch) still runs the tree, its last ones short.
    small = tree_step("partial", 6, 2, 3, num_blocks=4, adaptive_depth=False)
    assert int((small.prefill([prompt], max_new_tokens=budget).block_tables[0] >= 0).sum()) == 3
    engine = fdecode.Engine(small)
    request = engine.add_request(prompt, max_new_tokens=budget)
    assert engine.requests[request].blocks_needed == 3
    assert engine.run()[request] == hf_greedy(tuple(prompt), budget)
