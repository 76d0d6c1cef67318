"""Tree verification ops (`fdecode.ops.tree`) against plain-Python walks of the same trees, and the random
verification's output against the target's distribution (chi-square over every outcome)."""

from __future__ import annotations

import random

import pytest
import torch
from support.stats import ALPHA, chi2_pvalue

from fdecode.ops.tree import ancestors, greedy_tree_accept, node_depths, tree_accept


def random_tree(rng: random.Random, n: int, levels: int, vocab: int) -> tuple[list[int], list[int]]:
    """parents and tokens of a random tree of n nodes no deeper than `levels` (node 0 the root), some absent."""
    parents, depth = [-1], [0]
    for _ in range(1, n):
        parent = rng.choice([i for i in range(len(parents)) if depth[i] < levels])
        parents.append(parent)
        depth.append(depth[parent] + 1)
    tokens = [rng.randrange(vocab)] + [rng.randrange(vocab) if rng.random() > 0.1 else -1 for _ in range(1, n)]
    return parents, tokens


def path_to(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def greedy_reference(parents, tokens, greedy, levels):
    """The deepest node whose every draft on its path is the target's argmax at its parent (first in order)."""
    best = 0
    for node in range(len(parents)):
        path = path_to(parents, node)
        if all(tokens[c] >= 0 and tokens[c] == greedy[p] for p, c in zip(path, path[1:])):
            if len(path) > len(path_to(parents, best)):
                best = node
    path = path_to(parents, best)
    accepted = [tokens[c] for c in path[1:]] + [greedy[best]]
    return accepted + [-1] * (levels + 1 - len(accepted)), len(accepted), path + [-1] * (levels + 1 - len(path))


def test_ancestors_and_depths_follow_the_parents():
    rng = random.Random(0)
    for _ in range(20):
        parents, _ = random_tree(rng, 9, 4, 5)
        table = ancestors(torch.tensor([parents]), 4)[0]
        for i in range(9):
            assert set(torch.nonzero(table[i])[:, 0].tolist()) == set(path_to(parents, i))
        assert node_depths(torch.tensor([parents]), 4)[0].tolist() == [len(path_to(parents, i)) - 1 for i in range(9)]


def test_greedy_accepts_the_deepest_path_the_target_agrees_with():
    rng, levels, vocab = random.Random(1), 3, 3  # a tiny vocabulary: many drafts match
    trees = [random_tree(rng, 8, levels, vocab) for _ in range(200)]
    greedy = [[rng.randrange(vocab) for _ in range(8)] for _ in trees]
    parents = torch.tensor([p for p, _ in trees])
    tokens = torch.tensor([t for _, t in trees])
    accepted, length, nodes = greedy_tree_accept(tokens, parents, torch.tensor(greedy), levels)
    lengths = set()
    for b, ((p, t), g) in enumerate(zip(trees, greedy)):
        want, want_length, want_nodes = greedy_reference(p, t, g, levels)
        assert (accepted[b].tolist(), int(length[b]), nodes[b].tolist()) == (want, want_length, want_nodes), b
        lengths.add(want_length)
    assert lengths == {1, 2, 3, 4}  # every depth of path was met


# Two levels, two children each where present: root -> (a, b); a -> (c, d); b -> (e).
PARENTS = [-1, 0, 0, 1, 1, 2]
TOKENS = [0, 1, 2, 3, 1, 0]
V = 4


@pytest.mark.parametrize("filtered", [False, True])
def test_random_verification_commits_the_targets_distribution(filtered):
    gen = torch.Generator().manual_seed(7)
    probs = torch.rand(len(PARENTS), V, generator=gen) + 0.05
    if filtered:  # a filtered p (top-k / top-p leave zeros): a draft outside it is never accepted
        probs[0, 2] = 0.0
        probs[1, 1] = 0.0  # node 4's token, after node 1
    probs = probs / probs.sum(dim=-1, keepdim=True)
    batch, levels = 60000, 2
    accepted, length, nodes = tree_accept(
        torch.tensor(TOKENS).expand(batch, -1),
        torch.tensor(PARENTS).expand(batch, -1),
        probs.expand(batch, -1, -1),
        torch.rand(batch, levels, 2, generator=gen),
        torch.rand(batch, 2, generator=gen),
        levels,
    )
    # The first token follows p at the root; the next one, after a drafted node, follows p at that node.
    first = accepted[:, 0]
    assert chi2_pvalue(torch.bincount(first, minlength=V), probs[0]) > ALPHA
    for node in (1,) if filtered else (1, 2):  # filtered: node 2's token has p = 0 at the root
        after = accepted[(first == TOKENS[node]) & (length > 1), 1]
        assert after.numel() > 1000 and chi2_pvalue(torch.bincount(after, minlength=V), probs[node]) > ALPHA
    # A path of two drafts then a token from the leaf: a -> c, and the leaf's p for the third.
    third = accepted[(nodes[:, 2] == 3), 2]
    assert third.numel() > 500 and chi2_pvalue(torch.bincount(third, minlength=V), probs[3]) > ALPHA
    assert ((accepted >= 0).sum(dim=1) == length).all() and (length >= 1).all()
    if filtered:
        assert not (first == 2).any() and not ((nodes[:, 1] == 1) & (accepted[:, 1] == 1)).any()


def test_tree_verification_captures_as_one_graph_without_host_reads():
    gen = torch.Generator().manual_seed(3)
    batch, levels = 4, 2
    args = (
        torch.tensor(TOKENS).expand(batch, -1),
        torch.tensor(PARENTS).expand(batch, -1),
        torch.softmax(torch.randn(batch, len(PARENTS), V, generator=gen), dim=-1),
        torch.rand(batch, levels, 2, generator=gen),
        torch.rand(batch, 2, generator=gen),
    )
    torch._dynamo.reset()
    random = torch.compile(tree_accept, backend="eager", fullgraph=True)  # fullgraph: a break or a sync raises
    greedy = torch.compile(greedy_tree_accept, backend="eager", fullgraph=True)
    for got, want in zip(random(*args, levels), tree_accept(*args, levels)):
        assert torch.equal(got, want)
    argmax = args[2].argmax(dim=-1)
    for got, want in zip(
        greedy(args[0], args[1], argmax, levels), greedy_tree_accept(args[0], args[1], argmax, levels)
    ):
        assert torch.equal(got, want)


@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])
def test_a_tree_forward_equals_transformers_on_each_root_to_node_path(family):
    """One target forward over a tree's nodes (`TreeRows`: each sees the prompt and its ancestors, at position
    root + depth, its KV in a slot of its own) gives every node the logits transformers gives its path; for
    DeepSeek-V3 each node's latent is its own slot's, read with the absorbed queries (`fdecode.ops.latent_kv`)."""
    from support.deepseek_models import hf_deepseek
    from support.llama_models import hf_target

    from fdecode.models import from_hf
    from fdecode.ops.attention import TreeRows
    from fdecode.ops.paging import slot_of

    hf = hf_target(2) if family == "llama" else hf_deepseek()
    model, bs = from_hf(hf), 4
    prompt = [5, 9, 2, 7, 7, 3]
    tokens = [11, 4, 8, 1, 4, 6]  # the root (the token after the prompt), then the drafts of PARENTS' tree
    table = torch.tensor([[1, 2, 3, 4]])  # the lane's blocks; block 5 holds the tree's nodes
    kv = model.kv_config.new_kv(7 * bs, dtype=torch.float32, device="cpu")  # blocks 0 (scratch) .. 6
    positions = torch.arange(len(prompt))[None]
    with torch.no_grad():
        model(torch.tensor([prompt]), positions, slot_of(table, positions, bs), kv, table, block_size=bs)
        parents = torch.tensor([PARENTS])
        depth = node_depths(parents, 2)
        node_slots = 5 * bs + torch.arange(len(tokens))[None]
        tree = TreeRows(node_slots, ancestors(parents, 2), torch.tensor([len(prompt)]))
        logits, _ = model(torch.tensor([tokens]), len(prompt) + depth, node_slots, kv, table, block_size=bs, tree=tree)
        for node in range(len(tokens)):
            path = [node]
            while PARENTS[path[-1]] >= 0:
                path.append(PARENTS[path[-1]])
            sequence = prompt + [tokens[i] for i in reversed(path)]
            want = hf(torch.tensor([sequence])).logits[0, -1]
            torch.testing.assert_close(logits[0, node], want, atol=1e-4, rtol=1e-4)
