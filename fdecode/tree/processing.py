"""Request features per tree node (docs/design.md, "Trees"): a node's row comes after its own path, not after
the rows before it, so penalties count its path's drafts, min_tokens counts its depth, and its grammar state
is its parent's advanced by the parent's token. These are the `Paths` that `fdecode.ops.processors.process`
takes in place of a chain's prefixes: the verify's for every node (`node_paths`), the draft's for each level's
frontier, grown a token at a time from the root's (`root_paths`, `child_paths`).
"""

from __future__ import annotations

import torch

from fdecode.ops.grammar import next_states, walk_tree
from fdecode.ops.processors import Paths, Processors
from fdecode.ops.tree import rows_at


def node_paths(
    cfg, lanes: Processors, tokens: torch.Tensor, parents: torch.Tensor, seen: torch.Tensor, vocab: int
) -> Paths:
    """The `Paths` of a tree's rows: row i verifies the token after node i, so in front of it are node i and its
    ancestors past the root. tokens, parents: [B, N + 1] (root first; -1 absent); seen: `ancestors`, [B, N + 1, N + 1]."""
    ids = torch.where(seen[..., 1:], tokens[:, None, 1:], -1) if cfg.penalties else None  # [B, N + 1, N]
    depth = seen.sum(dim=-1) - 1 if cfg.min_tokens else None
    grammar = None
    if cfg.grammars:
        keys, nxt = lanes.grammar_keys, lanes.grammar_next
        grammar = walk_tree(keys, nxt, lanes.grammar_state, tokens, parents, cfg.levels, vocab)
    return Paths(ids, depth, grammar)


def root_paths(cfg, lanes: Processors) -> Paths:
    """The `Paths` of one row per lane right after its committed tokens (the tree's root): nothing in front."""
    zeros = lanes.min_left.new_zeros(lanes.min_left.shape[0], 1)  # [B, 1]
    grammar = lanes.grammar_state[:, None] if cfg.grammars else None
    return Paths(zeros[..., :0] if cfg.penalties else None, zeros if cfg.min_tokens else None, grammar)


def child_paths(cfg, lanes: Processors, paths: Paths, parent: torch.Tensor, child: torch.Tensor, vocab: int) -> Paths:
    """The `Paths` of rows after the tokens `child` [B, k], each a child of row `parent` [B, k] of `paths`."""
    ids = index = grammar = None
    if cfg.penalties:
        ids = torch.cat([rows_at(paths.ids, parent), child[..., None]], -1)
    if cfg.min_tokens:
        index = paths.index.gather(1, parent) + 1
    if cfg.grammars:
        grammar = next_states(lanes.grammar_keys, lanes.grammar_next, paths.grammar.gather(1, parent), child, vocab)
    return Paths(ids, index, grammar)
