"""`DecodeConfig(draft_topk="auto")`, the default (`fdecode.tree.auto`): the chain of K on a CPU, without a depth
controller, or where no tree can run; on an accelerator a tree of 4K nodes over K levels (k = 4) whose step also
runs the chains of 1 .. K, starting at the chain of K."""

from __future__ import annotations

import dataclasses

import pytest
from support.llama_models import fdecode_target, hf_greedy, independent_draft
from support.runs import NEW, PROMPTS, over_depths

import fdecode
from fdecode.drafts import drafter_for
from fdecode.tree.auto import auto_shape
from fdecode.tree.shape import first_depth


def config(k: int = 4, **changes) -> fdecode.DecodeConfig:
    return fdecode.DecodeConfig(num_draft_tokens=k, max_batch=4, max_seq_len=64, block_size=4, **changes)


def test_the_default_is_auto_and_the_chain_of_k_until_compiled():
    cfg = config()
    assert cfg.draft_topk == "auto" and not cfg.tree and cfg.K == 4 and cfg.levels == 4 and cfg.W == 5
    assert config(draft_depth=4) == cfg  # the chain's depth, spelled out
    with pytest.raises(ValueError, match=r"draft_depth shapes a tree whose children per node you name"):
        config(8, draft_depth=4)  # a tree's levels without its k
    with pytest.raises(ValueError, match=r"draft_topk must be 'auto' or a positive int, got 'wide'"):
        config(draft_topk="wide")


@pytest.fixture(scope="module")
def pair():
    target = fdecode_target(2)
    draft = independent_draft("partial", target)
    return target, draft, drafter_for(draft)


@pytest.mark.parametrize(("k", "nodes"), [(4, 16), (2, 8), (1, 4)])
def test_on_an_accelerator_auto_is_a_tree_of_4k_nodes_over_k_levels(pair, k, nodes):
    cfg, reason = auto_shape(*pair, config(k, device="cuda"))
    assert (cfg.num_draft_tokens, cfg.draft_topk, cfg.levels) == (nodes, 4, k)
    assert first_depth(cfg) == k  # the chain a chain config of K runs first, the trees once measured
    assert f"a tree of {nodes} nodes over {k} levels" in reason and "on cuda" in reason


def test_auto_keeps_the_chain_on_a_cpu_without_a_controller_and_where_no_tree_runs(pair):
    target, draft, drafter = pair
    cfg, reason = auto_shape(target, draft, drafter, config())
    assert (cfg.draft_topk, cfg.K, cfg.tree) == (1, 4, False) and "on a CPU" in reason
    cfg, reason = auto_shape(target, draft, drafter, config(device="cuda", adaptive_depth=False))
    assert (cfg.draft_topk, cfg.K) == (1, 4) and "adaptive_depth=False" in reason

    class NoTrees(type(drafter)):
        def tree_reason(self, draft):
            return "this draft drafts no trees"

    cfg, reason = auto_shape(target, draft, NoTrees(), config(device="cuda"))
    assert (cfg.draft_topk, cfg.K) == (1, 4) and "no tree can run (this draft drafts no trees)" in reason
    named = config(draft_topk=1)
    assert auto_shape(target, draft, drafter, named) == (named, None)  # a k the config names is kept


def test_compile_resolves_auto_and_says_why(pair):
    target, draft, _ = pair
    step = fdecode.compile(target, draft, config(backend="eager"))
    assert step.config.draft_topk == 1 and step.config.K == 4 and step.depths == (0, 1, 2, 3, 4)
    assert "on a CPU: the chain of 4" in step.shape_reason and "a tree" not in repr(step)
    assert fdecode.compile(target, draft, config(draft_topk=1, backend="eager")).shape_reason is None


def test_the_tree_auto_chooses_on_an_accelerator_runs_losslessly_among_the_chains(pair):
    """The accelerator's default, run here on the CPU: its depths are the chains 0 .. K and trees of 10 and 16
    nodes, its first stream the chain of K, and greedy lanes commit transformers' tokens at every depth."""
    target, draft, drafter = pair
    tree, _ = auto_shape(target, draft, drafter, config(device="cuda", backend="eager"))
    step = fdecode.compile(target, draft, dataclasses.replace(tree, device="cpu"))
    assert step.depths == (0, 1, 2, 3, 4, 10, 16) and step.first_depth == 4 and step.shape_reason is None
    assert "a tree: k=4, S=4" in repr(step)
    schedule = [16, 1, 10, 4, 0, 16, 3, 2, 10, 16]
    outs, longest = over_depths(step, step.prefill(PROMPTS, max_new_tokens=NEW), schedule, len(PROMPTS))
    assert outs == [hf_greedy(prompt, NEW) for prompt in PROMPTS]
    assert longest >= 3  # drafts were accepted, not only the target's own token
