"""A recurrent (hybrid) draft LM's state in a draft tree (docs/design.md, "Trees").

The catch-up forward over the committed run (`fdecode.tree.draft`) starts from the draft's state through the
previous root (copy 0 of its leaves), its padding rows `valid` False, and leaves the state through the new root
at P: committed for live lanes in its one copy (`draft_copies`, `commit_ring`), so the draft's
committed state, like its KV, is what a from-scratch forward over the committed tokens gives, whichever branch
was accepted. At each later level every frontier node continues its own parent's state (the root's, or the
node's in the level before): the B x k nodes run as B * k lanes of one row each, with the same keys and each
node's ancestors (`branch_rows`), and the k best children take their parents' states into the next level.
"""

from __future__ import annotations

import torch

from fdecode.ops.attention import TreeRows
from fdecode.state.recurrent import State, commit_ring


def draft_start(state) -> State:
    """The draft's state through the previous root (copy 0 of its leaves), where the catch-up starts."""
    return state.draft_conv[:, :, 0], state.draft_rec[:, :, 0]


def commit_root(state, after: State, live: torch.Tensor) -> None:
    """The draft's leaves (one copy, `draft_copies`) <- its state through the new root, for `live` lanes [B]."""
    commit_ring((state.draft_conv, state.draft_rec), [after], live)


def branch_rows(draft, tokens, positions, slots, kv, context, tree: TreeRows | None, states: State, **run):
    """A recurrent draft's forward over the frontier's k nodes per lane (`tokens`, `positions`, `slots` [B, k]),
    node i of lane b from its parent's state (`states`: [B, k, L, ...] each): logits [B, k, V], hidden
    [B, k, H], and each node's state after it ([B, k, L, ...] each). tree None: a chain's node (k = 1) at its
    own position, attending causally."""
    batch, k = tokens.shape

    def lanes(t: torch.Tensor) -> torch.Tensor:  # each lane's rows, once per node
        return t.repeat_interleave(k, dim=0)

    flat = (
        None
        if tree is None
        else TreeRows(lanes(tree.slots), tree.ancestors.reshape(batch * k, 1, -1), lanes(tree.root))
    )
    logits, hidden, after = draft(
        *(t.reshape(batch * k, 1) for t in (tokens, positions, slots)), kv, lanes(context), tree=flat,
        recurrent=tuple(s.flatten(0, 1) for s in states), **run,
    )  # fmt: skip
    return (
        logits.view(batch, k, -1),
        hidden.view(batch, k, -1),
        tuple(s.view(batch, k, *s.shape[1:]) for s in after),
    )


def parent_states(states: State, parent: torch.Tensor) -> State:
    """The next frontier's states [B, k, L, ...]: node i's is that of node parent[:, i] ([B, k]) of this level."""

    def one(t: torch.Tensor) -> torch.Tensor:
        index = parent.view(*parent.shape, *([1] * (t.dim() - 2))).expand(*parent.shape, *t.shape[2:])
        return t.gather(1, index)

    return one(states[0]), one(states[1])
