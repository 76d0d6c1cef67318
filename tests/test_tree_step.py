"""The tree step (`fdecode.tree`): a draft LM's top-k trees verified in one target forward.

Greedy lanes commit transformers' greedy tokens whatever the tree; random lanes follow the target's filtered
distribution (chi-square over every 3-token outcome at a 5-token vocabulary, as the chain's sampling tests);
the step is one graph with no break and no host sync; impossible shapes are refused before anything compiles.
"""

from __future__ import annotations

import pytest
from support.llama_models import fdecode_target, hf_greedy, independent_draft, mtp_head
from support.runs import NEW, PROMPTS, run
from support.tiny_vocab import check_follows_the_target, tiny_draft, tiny_target

import fdecode


def tree_step(kind: str, n: int, k: int, s: int, backend: str = "eager", **changes):
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=n, draft_topk=k, draft_depth=s, max_batch=4, max_seq_len=64, block_size=4, backend=backend
    )
    return fdecode.compile(target, independent_draft(kind, target), fdecode.DecodeConfig(**{**vars_of(cfg), **changes}))


def vars_of(cfg: fdecode.DecodeConfig) -> dict:
    return {f: getattr(cfg, f) for f in cfg.__dataclass_fields__ if not f.startswith("_")}


def test_the_chain_spelled_out_is_the_chain():
    chain = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=2, max_seq_len=32)
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
        (3, 0, 2, "draft_topk must be a positive int"),
        (3, 2, 0, "draft_depth must be a positive int"),
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
    with pytest.raises(ValueError, match="n-gram drafts do not draft trees yet"):
        fdecode.compile(target, "ngram", small)
    with pytest.raises(ValueError, match="penalties"):
        fdecode.compile(
            target, tiny_draft("random", target), fdecode.DecodeConfig(**{**vars_of(small), "penalties": True})
        )


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
    assert max(lengths) == 3 if kind == "self" else max(lengths) <= 4


def test_greedy_tree_stops_at_eos_and_at_the_lane_end():
    step = tree_step("partial", 6, 2, 3)
    reference = hf_greedy(PROMPTS[0], NEW, None, 2)
    eos = reference[5]
    got = fdecode.generate(step, PROMPTS, max_new_tokens=NEW, eos_token_id=eos)
    assert got == [hf_greedy(p, NEW, eos, 2) for p in PROMPTS]
    long = [tuple(range(1, 50))]  # 49 + 15 = 64 = max_seq_len: the last trees reach past the lane's blocks
    assert fdecode.generate(step, long, max_new_tokens=15) == [hf_greedy(long[0], 15, None, 2)]


@pytest.mark.parametrize("plan", ["greedy", "full+top_k+top_p"])
def test_tree_step_is_one_graph_without_host_syncs(plan):
    step = tree_step("partial", 6, 2, 3, backend="aot_eager")
    state = step.prefill([PROMPTS[0], PROMPTS[1]], max_new_tokens=8)
    report = fdecode.inspect(step, state, plan=plan)
    assert (report.graph_count, report.graph_break_count, report.host_syncs) == (1, 0, [])
    assert report.op_counts.get("aten::index_copy_", 0) + report.op_counts.get("aten::index_copy", 0) >= 1


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
        num_draft_tokens=4, draft_topk=2, draft_depth=2, max_batch=64, max_seq_len=12, block_size=4, backend="eager"
    )
    check_follows_the_target(fdecode.compile(target, tiny_draft(kind, target), cfg), target, params)
