"""A grammar's automaton as the tensors the decode step reads (docs/design.md, "Structured output").

A dense [S, V] next-state table does not fit: at V = 151,936 each state costs 600 KB as int32, and a
JSON schema has hundreds to thousands of states. So the two questions the step asks are split:
- "which tokens may follow state s": a bitmask row of V / 8 bytes (19 KB at V = 151,936), one gather
  per lane, expanded to a [V] mask with shifts;
- "where does token v lead from s": the transitions as one sorted list of keys s * V + v, searched on
  the device by binary search (`torch.searchsorted`), with the next state beside each key.
Most states allow a handful of tokens, so the list is short; the few string states that allow nearly
the whole vocabulary cost 16 bytes per allowed token there.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from fdecode.grammar.automaton import Automaton


class GrammarTables(NamedTuple):
    """One grammar's tables, CPU tensors (S states, T transitions, V the model's vocabulary size)."""

    allowed: torch.Tensor  # [S, ceil(V / 32)] int32: bit v % 32 of word v // 32 set where token v may follow s
    keys: torch.Tensor  # [T] int64 ascending: state * V + token of each transition (EOS is none)
    next: torch.Tensor  # [T] int64: the state each key's token leads to
    final: torch.Tensor  # [S] bool: accepting states, the only ones whose rows allow the EOS ids

    def nbytes(self) -> int:
        """The tables' size in bytes."""
        return sum(t.numel() * t.element_size() for t in self)


def pack(automaton: Automaton, *, vocab_size: int, eos_ids: tuple[int, ...]) -> GrammarTables:
    """`automaton`'s tables over `vocab_size` ids (ids past the tokenizer's are never allowed)."""
    s_count, words = automaton.num_states, -(-vocab_size // 32)
    finals = np.flatnonzero(automaton.final)
    eos = np.asarray(eos_ids, np.int64)
    rows = np.concatenate([automaton.src, np.repeat(finals, len(eos))])
    cols = np.concatenate([automaton.token, np.tile(eos, len(finals))])
    # Each (state, token) is set once, so summing the bits ORs them; float64 holds 32-bit sums exactly.
    bits = np.bincount(rows * words + cols // 32, weights=np.ldexp(1.0, cols % 32), minlength=s_count * words)
    allowed = bits.astype(np.uint32).view(np.int32).reshape(s_count, words)
    keys = automaton.src * vocab_size + automaton.token
    return GrammarTables(
        allowed=torch.from_numpy(allowed.copy()),
        keys=torch.from_numpy(keys),
        next=torch.from_numpy(automaton.dst.copy()),
        final=torch.from_numpy(automaton.final.copy()),
    )
