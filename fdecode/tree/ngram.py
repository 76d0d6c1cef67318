"""n-gram drafts as a tree: the k most frequent continuations of the lane's last n tokens are the branches
(docs/design.md, "Trees").

Prompt lookup (`fdecode.ops.ngram.lookup`) follows the latest earlier occurrence of the lane's last n tokens
(n from max_n down to min_n: the longest n with a match). A tree keeps every occurrence at that n: the token
after each is a candidate first draft, the k most frequent of them are the root's children (distinct, best
first), and each continues as a chain along its latest occurrence, up to S tokens, never past the last
committed one. Nodes are laid out chain by chain (the most frequent branch whole first), cut at N; a node
with nothing to propose is absent (-1). Fixed shapes, no host sync: compares, a scatter-add of counts over
the vocabulary, top-k and max reductions.
"""

from __future__ import annotations

import torch

from fdecode.ops.ngram import NONE
from fdecode.tree.shape import TreeShape


def ngram_tree(
    history: torch.Tensor, last_pos: torch.Tensor, shape: TreeShape, max_n: int, min_n: int, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [B, N] (-1 absent) and parents [B, N] (0: the root) of each lane's tree of `shape`.

    history: [B, T] int64, the committed token at each position of the attention window (-1 past the last);
    last_pos: [B] int64, P, the position of each lane's last committed token (the root)."""
    k, levels, n_nodes = shape.topk, shape.levels, shape.nodes
    batch, width = history.shape
    device = history.device
    index = torch.arange(width, device=device)[None, :]  # [1, T]: the end position i of an occurrence
    tail_pos = last_pos[:, None] - torch.arange(max_n, device=device)
    tail = torch.where(tail_pos >= 0, history.gather(1, tail_pos.clamp(0, width - 1)), -2)  # h[P - j], -2 before 0
    earlier = index < last_pos[:, None]
    run = torch.ones(batch, width, dtype=torch.bool, device=device)
    found = torch.zeros(batch, width, dtype=torch.bool, device=device)  # the occurrences at the longest n
    for j in range(max_n):
        shifted = torch.cat([history.new_full((batch, j), -3), history[:, : width - j]], dim=1)  # h[i - j]
        run = run & (shifted == tail[:, j : j + 1])
        if j + 1 >= min_n:
            here = run & earlier
            found = torch.where(here.any(dim=1, keepdim=True), here, found)  # a longer n takes precedence
    after = history.gather(1, (index + 1).clamp(max=width - 1).expand(batch, width))  # the token after each i
    counts = torch.zeros(batch, vocab, dtype=torch.int64, device=device)
    counts = counts.scatter_add(1, after.clamp_min(0), (found & (after >= 0)).long())
    top, first = counts.topk(k, dim=1)  # [B, k]: the k most frequent first drafts
    same = found[:, None, :] & (after[:, None, :] == first[:, :, None])  # [B, k, T]
    latest = torch.where(same, index[:, None, :], -1).amax(dim=-1)  # [B, k]: each branch's latest occurrence
    ahead = latest[..., None] + 1 + torch.arange(levels, device=device)  # [B, k, S]
    proposed = (top > 0)[..., None] & (ahead <= last_pos[:, None, None])
    chains = torch.where(proposed, history.gather(1, ahead.clamp(0, width - 1).flatten(1)).view(batch, k, levels), NONE)
    node = torch.arange(k * levels, device=device).view(k, levels)
    parents = torch.where(node % levels == 0, 0, node)  # a chain's first node under the root, then its predecessor
    tokens = chains.flatten(1)[:, :n_nodes]
    if tokens.shape[1] < n_nodes:  # more nodes than k chains of S fill: the rest absent
        tokens = torch.cat([tokens, tokens.new_full((batch, n_nodes - tokens.shape[1]), NONE)], dim=1)
        parents = torch.cat([parents.flatten(), parents.new_zeros(n_nodes - k * levels)])
    return tokens, parents.flatten()[:n_nodes].expand(batch, n_nodes)
