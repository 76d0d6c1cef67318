"""Host bookkeeping of a state's grammar pool: which grammars are resident at which state offset, and
their upload into the pool's leaves (docs/design.md, "Structured output").

A state's lanes share one pool of `DecodeConfig.max_grammar_states` bitmask rows and
`max_grammar_transitions` transitions. A grammar is placed at the first gap of rows that holds it; the
transitions of every resident grammar, in row order, form one ascending key list (a key is
global state * V + token), rewritten whole when a grammar arrives. A grammar no lane uses stays resident
(a later request may reuse it) until its room is needed. Writes go into the pool's tensors in place, as
the KV: no graph sees a new shape, so admitting a request with a new grammar compiles nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fdecode.config import DecodeConfig

FREE_KEY = torch.iinfo(torch.int64).max  # past every real key: searchsorted never lands on free room


@dataclass
class _Resident:
    grammar: object
    offset: int  # its state 0 is the pool's row `offset`
    states: int
    transitions: int


class GrammarPool:
    """The grammars resident in one state's pool (an `Engine` keeps one; `prefill` one per call)."""

    def __init__(self, cfg: DecodeConfig, vocab: int) -> None:
        self.states, self.transitions, self.vocab = cfg.max_grammar_states, cfg.max_grammar_transitions, vocab
        self._resident: dict[int, _Resident] = {}  # id(grammar) -> placement
        self._lanes: dict[int, object] = {}  # lane -> the grammar it follows

    def _gap(self, size: int) -> int | None:
        """The first row offset with `size` free rows, or None."""
        start = 0
        for r in sorted(self._resident.values(), key=lambda r: r.offset):
            if r.offset - start >= size:
                return start
            start = r.offset + r.states
        return start if self.states - start >= size else None

    def fits(self, grammars: list) -> bool:
        """Whether `grammars` (with the resident ones still used by a lane) can be resident at once."""
        used = {id(g): g for g in self._lanes.values()} | {id(g): g for g in grammars if g is not None}
        return (sum(g.num_states for g in used.values()) <= self.states
                and sum(g.num_transitions for g in used.values()) <= self.transitions)

    def release(self, lane: int) -> None:
        """The lane's request is gone: its grammar may be evicted when room is needed."""
        self._lanes.pop(lane, None)

    def admit(self, state, lanes: list[int], grammars: list) -> list[int]:
        """Place `grammars` (one per new lane, None: none) and write the new ones into `state`'s pool leaves
        in place. Returns each lane's initial automaton state (-1: no grammar). Raises ValueError where they
        cannot be resident together with the grammars of running lanes."""
        for lane in lanes:
            self.release(lane)
        if not self.fits(grammars):
            raise ValueError(
                f"the grammars of these requests and of the running ones need more than the pool's "
                f"{self.states} states / {self.transitions} transitions (DecodeConfig.max_grammar_states / "
                f"max_grammar_transitions)")
        changed = False
        for grammar in grammars:
            if grammar is None or id(grammar) in self._resident:
                continue
            changed |= self._place(state, grammar)
        if changed:
            self._write_transitions(state)
        for lane, grammar in zip(lanes, grammars):
            if grammar is not None:
                self._lanes[lane] = grammar
        return [-1 if g is None else self._resident[id(g)].offset for g in grammars]

    def _place(self, state, grammar) -> bool:
        offset = self._gap(grammar.num_states)
        while offset is None or sum(r.transitions for r in self._resident.values()) + grammar.num_transitions > \
                self.transitions:
            used = {id(g) for g in self._lanes.values()}
            idle = [key for key in self._resident if key not in used]
            if not idle:  # `fits` said the used ones fit: a gap opens once the idle ones are gone
                raise AssertionError("grammar pool bookkeeping out of step")
            del self._resident[idle[0]]
            offset = self._gap(grammar.num_states)
        tables = grammar.tables()
        state.grammar_allowed[offset : offset + grammar.num_states].copy_(tables.allowed, non_blocking=True)
        self._resident[id(grammar)] = _Resident(grammar, offset, grammar.num_states, grammar.num_transitions)
        return True

    def _write_transitions(self, state) -> None:
        """Every resident grammar's transitions, in row order, as the pool's one ascending key list."""
        keys, nxt = [], []
        for r in sorted(self._resident.values(), key=lambda r: r.offset):
            tables = r.grammar.tables()
            keys.append(tables.keys + r.offset * self.vocab)  # (offset + s) * V + token
            nxt.append(tables.next + r.offset)
        used = sum(k.numel() for k in keys)
        keys.append(torch.full((self.transitions - used,), FREE_KEY, dtype=torch.int64))
        nxt.append(torch.full((self.transitions - used,), -1, dtype=torch.int64))
        state.grammar_keys.copy_(torch.cat(keys), non_blocking=True)
        state.grammar_next.copy_(torch.cat(nxt), non_blocking=True)
