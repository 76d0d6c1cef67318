"""Host bookkeeping of a state's grammar pool: which grammars are resident at which state offset, and
their upload into the pool's leaves (docs/design.md, "Structured output").

A state's lanes share one pool of `DecodeConfig.max_grammar_states` bitmask rows and
`max_grammar_transitions` transitions. A grammar is placed at the first gap of rows that holds it; the
transitions of every resident grammar, in row order, form one ascending key list (a key is
global state * V + token), rewritten whole when a grammar arrives. A grammar no lane uses stays resident
(a later request may reuse it) until its room is needed. Where the free rows add up to enough but no
single gap holds the grammar (the pool is fragmented), the resident grammars are compacted to the pool's
start: their rows move on the device, and the running lanes' automaton states move with them
(`Admitted.grammar_state`), since a grammar's rows and keys are offsets from its first row. So a request
whose grammar fits the pool's free room in total is admitted. Writes go into the pool's tensors in place,
as the KV: no graph sees a new shape, so admitting a request with a new grammar compiles nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from fdecode.config import DecodeConfig

FREE_KEY = torch.iinfo(torch.int64).max  # past every real key: searchsorted never lands on free room


@dataclass
class _Resident:
    grammar: object
    offset: int  # its state 0 is the pool's row `offset`
    states: int
    transitions: int


class Admitted(NamedTuple):
    """What `GrammarPool.admit` did: the new lanes' initial automaton states, and the state's `grammar_state`
    leaf with the running lanes moved along with a compaction (the leaf itself where nothing moved)."""

    initial: list[int]  # per new lane: its grammar's first row, -1 without a grammar
    grammar_state: torch.Tensor  # [B] int64


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
        return (
            sum(g.num_states for g in used.values()) <= self.states
            and sum(g.num_transitions for g in used.values()) <= self.transitions
        )

    def release(self, lane: int) -> None:
        """The lane's request is gone: its grammar may be evicted when room is needed."""
        self._lanes.pop(lane, None)

    def admit(self, state, lanes: list[int], grammars: list) -> Admitted:
        """Place `grammars` (one per new lane, None: none) and write the new ones into `state`'s pool leaves
        in place (compacting the pool where it is fragmented). Raises ValueError where they cannot be
        resident together with the grammars of running lanes (`fits` says so beforehand)."""
        for lane in lanes:
            self.release(lane)
        if not self.fits(grammars):
            raise ValueError(
                f"the grammars of these requests and of the running ones need more than the pool's "
                f"{self.states} states / {self.transitions} transitions (DecodeConfig.max_grammar_states / "
                f"max_grammar_transitions)"
            )
        changed, lane_states = False, state.grammar_state
        # Kept resident while placing: the running lanes' grammars and every one of this call (placing the
        # second must not evict the first).
        keep = {id(g) for g in self._lanes.values()} | {id(g) for g in grammars if g is not None}
        for grammar in grammars:
            if grammar is None or id(grammar) in self._resident:
                continue
            lane_states = self._place(state, grammar, lane_states, keep)
            changed = True
        if changed:
            self._write_transitions(state)
        for lane, grammar in zip(lanes, grammars):
            if grammar is not None:
                self._lanes[lane] = grammar
        return Admitted([-1 if g is None else self._resident[id(g)].offset for g in grammars], lane_states)

    def _place(self, state, grammar, lane_states: torch.Tensor, keep: set[int]) -> torch.Tensor:
        """Make `grammar` resident: evict grammars not in `keep` (ids) while it does not fit, compact where
        the free rows are enough but scattered. Returns `lane_states` moved along with the compaction."""
        while not self._room(grammar) or self._gap(grammar.num_states) is None:
            idle = [key for key in self._resident if key not in keep]
            if not idle:
                break
            del self._resident[idle[0]]
        if not self._room(grammar):  # `fits` is checked before admitting: this is a caller's bug
            raise RuntimeError("GrammarPool.admit called for grammars that do not fit (check GrammarPool.fits)")
        offset = self._gap(grammar.num_states)
        if offset is None:
            lane_states = self._compact(state, lane_states)
            offset = self._gap(grammar.num_states)
        tables = grammar.tables()
        state.grammar_allowed[offset : offset + grammar.num_states].copy_(tables.allowed, non_blocking=True)
        self._resident[id(grammar)] = _Resident(grammar, offset, grammar.num_states, grammar.num_transitions)
        return lane_states

    def _room(self, grammar) -> bool:
        """Whether the pool's free rows and transitions, in total, hold `grammar` beside the resident ones."""
        resident = self._resident.values()
        return (
            sum(r.states for r in resident) + grammar.num_states <= self.states
            and sum(r.transitions for r in resident) + grammar.num_transitions <= self.transitions
        )

    def _compact(self, state, lane_states: torch.Tensor) -> torch.Tensor:
        """Move every resident grammar's rows to the pool's start, in row order (device copies; the keys are
        rewritten by the caller), and the automaton states of the lanes that follow them (`lane_states`
        [B]: a state s in a moved grammar's rows [old, old + n) becomes s - old + new; states < 0 stay).
        Returns the moved `lane_states`."""
        start, moved = 0, lane_states
        for r in sorted(self._resident.values(), key=lambda r: r.offset):
            if r.offset != start:
                rows = state.grammar_allowed[r.offset : r.offset + r.states].clone()  # the ranges may overlap
                state.grammar_allowed[start : start + r.states].copy_(rows)
                inside = (lane_states >= r.offset) & (lane_states < r.offset + r.states)  # the old states
                moved = torch.where(inside, lane_states + (start - r.offset), moved)
                r.offset = start
            start += r.states
        return moved

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
