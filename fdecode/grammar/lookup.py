"""The two reads of a grammar's tables, in plain torch: the reference the step's kernels are held to
(docs/design.md, "Structured output").

    allowed_tokens(tables, state, V) -> [..., V] bool     the bitmask row of each state, expanded
    next_state(tables, state, token, V) -> [...] int64    binary search of state * V + token; -1 if absent

Both are gathers and a `searchsorted`, with fixed shapes and no host sync.
"""

from __future__ import annotations

import torch

from fdecode.grammar.tables import GrammarTables


def allowed_tokens(tables: GrammarTables, state: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[..., V] bool: which tokens may follow each state of `state` ([...] int64, local states)."""
    words = tables.allowed[state]  # [..., W] int32
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    bits = (words.unsqueeze(-1) >> shifts) & 1  # arithmetic shift: bit 31 still reads as 1
    return bits.flatten(-2)[..., :vocab_size].bool()


def next_state(tables: GrammarTables, state: torch.Tensor, token: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[...] int64: where `token` leads from `state` (both [...] int64); -1 where it is no transition (a
    token not allowed there, or an EOS id)."""
    key = state * vocab_size + token
    if tables.keys.numel() == 0:  # a grammar of the empty text alone
        return torch.full_like(key, -1)
    at = torch.searchsorted(tables.keys, key).clamp(max=tables.keys.numel() - 1)
    return torch.where(tables.keys[at] == key, tables.next[at], -1)
