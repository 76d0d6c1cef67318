"""Grammars on the device: which tokens may follow a lane's automaton state, and where a token leads
(docs/design.md, "Structured output").

The state's pool holds every grammar its lanes use, each at a state offset (`fdecode.state.grammar_pool`):
`allowed` [S, ceil(V / 32)] int32 bitmask rows, and the transitions as one ascending list of global keys
state * V + token with the next (global) state beside each, searched with `torch.searchsorted`. A lane's
state is -1 without a grammar (everything allowed, nothing walked) and -2 once a walk left the language
(a draft nobody will accept: its rows are never used, so they allow everything rather than nothing).
"""

from __future__ import annotations

import torch


def next_states(
    keys: torch.Tensor, nxt: torch.Tensor, state: torch.Tensor, token: torch.Tensor, vocab: int
) -> torch.Tensor:
    """Where `token` leads from `state` (both [...] int64): the pool's next state, -2 where the token is no
    transition (not allowed there, an EOS id, or -1: nothing proposed); states < 0 stay as they are."""
    key = state.clamp_min(0) * vocab + token.clamp_min(0)
    at = torch.searchsorted(keys, key).clamp(max=keys.shape[0] - 1)
    found = (keys[at] == key) & (token >= 0)
    return torch.where(state < 0, state, torch.where(found, nxt[at], torch.full_like(state, -2)))


def walk(
    keys: torch.Tensor,
    nxt: torch.Tensor,
    state: torch.Tensor,
    tokens: torch.Tensor,
    vocab: int,
    upto: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, A + 1]: the state before `tokens` [B, A] and after each of them, from `state` [B]; with `upto` [B],
    tokens from index upto on are not walked (the state stays)."""
    states = [state]
    for j in range(tokens.shape[1]):
        moved = next_states(keys, nxt, states[-1], tokens[:, j], vocab)
        states.append(moved if upto is None else torch.where(j < upto, moved, states[-1]))
    return torch.stack(states, dim=1)


def allowed_tokens(allowed: torch.Tensor, states: torch.Tensor, vocab: int) -> torch.Tensor:
    """[..., V] bool: the tokens each of `states` ([...] int64) allows; all of them for states < 0."""
    words = allowed[states.clamp_min(0)]  # [..., ceil(V / 32)] int32
    token = torch.arange(vocab, device=words.device)
    bits = (words[..., token // 32] >> (token % 32).to(words.dtype)) & 1  # arithmetic shift: bit 31 reads as 1
    return (bits != 0) | (states < 0)[..., None]


def walk_tree(
    keys: torch.Tensor,
    nxt: torch.Tensor,
    state: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    levels: int,
    vocab: int,
) -> torch.Tensor:
    """[B, N]: the state after each tree node's path from `state` [B] (node 0, the root, has `state`): a node's is
    its parent's advanced by its token. tokens, parents: [B, N] (-1: absent, the root's parent), nodes in
    topological order, at most `levels` deep; each pass settles one more level (no host loop over nodes)."""
    root = state[:, None].expand_as(tokens)
    states = root
    for _ in range(levels):
        moved = next_states(keys, nxt, states.gather(1, parents.clamp_min(0)), tokens, vocab)
        states = torch.where(parents >= 0, moved, root)
    return states
