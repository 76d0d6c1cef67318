"""Draft trees as fixed-shape tensors: ancestry, depths, and lossless verification of N nodes at once
(docs/design.md, "Trees").

A lane's tree is N nodes in topological order: node 0 is the root (the last committed token, the verify's
first row), every other node a draft whose `parents` entry is an earlier node, siblings ordered best first;
a node whose token is -1 is absent (never accepted). The target runs once over the N nodes, each seeing the
context and its ancestors (`ancestors`) at position base + its depth (`node_depths`). Verification walks
from the root:

- greedy (`greedy_tree_accept`): a node is accepted when its token is the target's argmax at its parent and
  its parent is accepted; the lane commits the deepest accepted path (the first such node in index order)
  and the target's argmax after it;
- random (`tree_accept`): at each node the children are tried in order, each accepted with probability
  p(c) / (mass left), and a rejected child's mass is removed (p's residual after a point mass); where none
  is accepted the lane draws from what is left. Each tried child is a point mass of the draft, so the token
  committed after a node follows p exactly however the children were chosen (top-k, without replacement,
  deterministic): trying c1, then c2 given not c1, ..., then drawing from the rest, is a draw from p.

Every loop runs over static sizes (levels S, siblings k), so the functions capture as one graph.
"""

from __future__ import annotations

import torch

from fdecode.ops.sampling import first_true, sample


def rows_at(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """rows [B, R, X] at `index` [B, M] (each in 0 .. R - 1): [B, M, X], row index[b, m] of lane b."""
    return rows.gather(1, index[..., None].expand(-1, -1, rows.shape[-1]))


def ancestors(parents: torch.Tensor, levels: int) -> torch.Tensor:
    """[B, N, N] bool: entry (b, i, j) is True where node j is node i or one of its ancestors.

    parents: [B, N] int64, -1 for the root (node 0); levels: the deepest node's depth, S."""
    batch, n = parents.shape
    node = torch.arange(n, device=parents.device).expand(batch, n)
    seen = torch.eye(n, dtype=torch.bool, device=parents.device).expand(batch, n, n).clone()
    for _ in range(levels):
        up = parents.gather(1, node.clamp_min(0))  # [B, N]: each node's next ancestor (-1 past the root)
        node = torch.where(node >= 0, up, node)
        seen |= torch.nn.functional.one_hot(node.clamp_min(0), n).bool() & (node >= 0)[..., None]
    return seen


def node_depths(parents: torch.Tensor, levels: int) -> torch.Tensor:
    """[B, N] int64: each node's depth (the root 0), its position past the root's."""
    return ancestors(parents, levels).sum(dim=-1) - 1


def _path(
    nodes: list[torch.Tensor], tokens: torch.Tensor, last: torch.Tensor, levels: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """accepted [B, S + 1] (the drafts of the path at `nodes[1:]`, then `last`, -1 padded) and length [B]."""
    batch = tokens.shape[0]
    depth = torch.stack([n >= 0 for n in nodes[1:]], dim=1).sum(dim=1) if levels else tokens.new_zeros(batch)
    columns = [tokens.gather(1, n.clamp_min(0)[:, None])[:, 0] for n in nodes[1:]] + [last.new_full((batch,), -1)]
    accepted = torch.stack(columns, dim=1)  # [B, S + 1]
    index = torch.arange(levels + 1, device=tokens.device)[None, :]
    accepted = torch.where(index < depth[:, None], accepted, -1)
    accepted = torch.where(index == depth[:, None], last[:, None], accepted)
    return accepted, depth + 1


def greedy_tree_accept(
    tokens: torch.Tensor, parents: torch.Tensor, greedy: torch.Tensor, levels: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy verification of a tree.

    tokens: [B, N] int64 (root, then drafts; -1 absent); parents: [B, N]; greedy: [B, N] the target's argmax
    at each node's row. Returns accepted [B, S + 1] (-1 padded), length [B] (1 .. S + 1) and the accepted
    path's nodes [B, S + 1] (-1 past its end): the rows whose KV and hidden states the lane keeps."""
    n = tokens.shape[1]
    from_parent = greedy.gather(1, parents.clamp_min(0))  # [B, N]: the target's token after each node's parent
    ok = (tokens == from_parent) & (tokens >= 0)
    ok[:, 0] = True  # the root is committed already
    reached = ~(ancestors(parents, levels) & ~ok[:, None, :]).any(dim=-1)  # [B, N]: every ancestor accepted
    depth = node_depths(parents, levels)
    score = torch.where(reached, depth * n + (n - 1 - torch.arange(n, device=tokens.device)), -1)
    best = score.argmax(dim=1)  # the deepest accepted node, the first in index order
    nodes = _walk_up(parents, best, depth.gather(1, best[:, None])[:, 0], levels)
    accepted, length = _path(nodes, tokens, greedy.gather(1, best[:, None])[:, 0], levels)
    return accepted, length, torch.stack(nodes, dim=1)


def _walk_up(parents: torch.Tensor, node: torch.Tensor, depth: torch.Tensor, levels: int) -> list[torch.Tensor]:
    """The path from the root to `node` (at `depth`), as S + 1 columns of node ids (-1 past `depth`)."""
    columns = [node.new_full(node.shape, -1) for _ in range(levels + 1)]
    current = node
    for d in range(levels, -1, -1):  # fill from the deepest column up: node sits at column `depth`
        here = depth == d
        columns[d] = torch.where(here, current, columns[d])
        current = torch.where(here, parents.gather(1, current.clamp_min(0)[:, None])[:, 0], current)
        depth = torch.where(here, depth - 1, depth)
    return columns


def tree_accept(
    tokens: torch.Tensor,  # [B, N] int64: root, then drafts (-1 absent)
    parents: torch.Tensor,  # [B, N] int64: -1 for the root
    target_probs: torch.Tensor,  # [B, N, V] p: the target's (filtered) distribution after each node
    accept_u: torch.Tensor,  # [B, S, k] uniform [0, 1): a test per level and sibling
    noise_u: torch.Tensor,  # [B, 2] uniform [0, 1): the last token's draw
    levels: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossless verification of a tree for random lanes (see the module docstring). Returns accepted
    [B, S + 1] (-1 padded), length [B] and the accepted path's nodes [B, S + 1] (-1 past its end)."""
    batch, n = tokens.shape
    siblings = accept_u.shape[2]
    lanes = torch.arange(batch, device=tokens.device)
    node = torch.zeros(batch, dtype=torch.int64, device=tokens.device)
    alive = torch.ones(batch, dtype=torch.bool, device=tokens.device)  # still walking down
    left = target_probs[:, 0].clone()  # the mass not yet rejected at the current node
    nodes = [node]
    for level in range(levels):
        children = (parents == node[:, None]) & (tokens >= 0)  # [B, N]
        rank = children.long().cumsum(dim=1)  # 1 for the first child, 2 for the second, ...
        moved = torch.zeros_like(alive)
        for r in range(siblings):
            child = first_true(children & (rank == r + 1))  # [B], N where there is no r-th child
            has = (child < n) & alive & ~moved
            token = tokens.gather(1, child.clamp(max=n - 1)[:, None])[:, 0].clamp_min(0)
            mass = left[lanes, token]
            take = has & (accept_u[:, level, r] * left.sum(dim=1) < mass)  # p(c) / mass left, never dividing
            reject = has & ~take
            left = torch.where(
                reject[:, None] & (torch.arange(left.shape[1], device=left.device) == token[:, None]), 0.0, left
            )
            node = torch.where(take, child, node)
            moved |= take
        alive &= moved
        left = torch.where(moved[:, None], target_probs[lanes, node], left)  # a fresh node: its own p
        nodes.append(torch.where(alive, node, -1))
    last = sample(left, noise_u)  # the residual where a level rejected every child, else p at the leaf
    accepted, length = _path(nodes, tokens, last, levels)
    return accepted, length, torch.stack(nodes, dim=1)
