"""`HostRecord`: what the host knows of a state without reading it; `HostRecords`: a Step's records of the states
it made (docs/design.md, "Host records").

Three host facts pick the graph a step runs without a device read (`fdecode.graphs.schedule`): an upper bound on
every active lane's `base_pos` (the attention window), each lane's sampling inputs (the sampling plan) and the
depth-0 steps a draft LM sat out (the catch-up graph). None of them rides on the state. The Step's `Schedule` keeps
a record for each state the Step made (prefill, priming, a step); a caller that knows better (an `Engine`) passes
one in (`step(state, host=...)`). A record is a fact about the values of some leaves, so it holds for any state
that carries those very tensors (a `state.replace` of other leaves, a pytree map that keeps them); for a state
with other tensors there (built by hand, a copy) the schedule reads the fact from its tensors (`read_record`),
a device read such a state alone costs. A fact a record holds as None is unknown, and the safe choice is made
for it: the whole lane's window, the plan exact for any parameters, a catch-up before the draft runs.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor

from fdecode.state.decode_state import LEAVES, DecodeState, leaves_of

# A lane's `SamplingParams.plan_inputs`: (temperature, top_k, top_p, processed), None for a free lane.
LaneSampling = tuple[tuple[float, int, float, bool] | None, ...]

# The leaves each fact describes: a state holding other tensors there has it unknown.
DESCRIBES = (
    ("max_position", ("base_pos", "active")),
    ("lane_sampling", ("active", "temperature", "top_k", "top_p", "penalties", "min_left", "bias_ids")),
    ("draft_lag", ("missed",)),
)
KEEP = 64  # records kept, newest first: about one per chain of states alive (a step's drops its input's)
_NAMES = tuple(dict.fromkeys(name for _, names in DESCRIBES for name in names))
_COLUMNS = tuple((fact, tuple(_NAMES.index(name) for name in names)) for fact, names in DESCRIBES)
_DESCRIBED = operator.itemgetter(*(LEAVES.index(name) for name in _NAMES))
_BY_NAME = operator.attrgetter(*_NAMES)


def _leaves(state) -> tuple:
    """`state`'s described leaves, in `_NAMES`' order: from the leaves a `DecodeState` keeps once read, else
    (any object with the flat names) by name."""
    return _DESCRIBED(leaves_of(state)) if isinstance(state, DecodeState) else _BY_NAME(state)


@dataclass(frozen=True)
class HostRecord:
    """What the host knows of a state; None: unknown (the safe choice is made for it).

    max_position: upper bound on every active lane's `base_pos` (prefill knows the prompts, each step adds at most
    W, an `Engine` tightens it from what it has read). lane_sampling: `SamplingParams.plan_inputs` of each lane that
    may be active (None: a free lane). draft_lag: depth-0 steps a draft LM sat out since it last ran, an upper bound
    on the tokens any lane's draft missed (`fdecode.ops.catch_up`; 0 where the draft never sits out)."""

    max_position: int | None = None
    lane_sampling: LaneSampling | None = None
    draft_lag: int | None = None

    @staticmethod
    def empty(batch: int) -> HostRecord:
        """The record of a state whose `batch` lanes are all free (`Step.empty_state`)."""
        return HostRecord(0, (None,) * batch, 0)

    def stepped(self, width: int, idle: bool) -> HostRecord:
        """The record of the state a step returns: every lane advanced by at most `width` (W) positions; `idle`: the
        draft sat the step out (one more step missed), else it ran (none missed)."""
        lag = self.draft_lag
        return HostRecord(
            None if self.max_position is None else self.max_position + width,
            self.lane_sampling,
            (None if lag is None else lag + 1) if idle else 0,
        )

    def primed(self, lanes: list[int], inputs: list, longest: int) -> HostRecord:
        """The record after priming requests of sampling `inputs` into `lanes`, the longest prompt `longest` tokens:
        the new lanes start at base_pos = len(prompt), the others keep theirs; their drafts missed nothing."""
        known = self.lane_sampling
        if known is not None:
            known = list(known)
            for lane, lane_inputs in zip(lanes, inputs):
                known[lane] = lane_inputs
            known = tuple(known)
        bound = None if self.max_position is None else max(self.max_position, longest)
        return HostRecord(bound, known, self.draft_lag)


class HostRecords:
    """The records of the states a Step made, newest first, each held with the leaves its facts describe (small
    per-lane tensors): `of(state)` takes each fact from the newest record whose leaves `state` carries. A record
    goes when a step or priming consumes its state (or a state over the same leaves), or past the newest `KEEP`.

    Records are grouped by the identities of the leaves they describe, so a step drops its input's records and
    notes its output's in constant time, however many chains of states were left behind (each `generate` call
    leaves one)."""

    def __init__(self) -> None:
        # ids of the described leaves -> (those leaves, [(state, record), newest first]); oldest group first
        self._groups: dict[tuple[int, ...], tuple[tuple, list[tuple[weakref.ref, HostRecord]]]] = {}

    def note(self, state: object, record: HostRecord, *, spent: object = None) -> None:
        """`record` is what the host knows of `state`, a state the Step just made (from `spent`, consumed)."""
        groups = self._groups
        if spent is not None:  # its record, and those of the states over the very same leaves
            newest = self._made_last(spent)  # a step's input is mostly the state the Step made last
            if newest is not None:
                del groups[newest]
            else:
                groups.pop(tuple(map(id, _leaves(spent))), None)
        leaves = _leaves(state)
        key = tuple(map(id, leaves))
        held = groups.pop(key, None)
        groups[key] = (leaves, [(weakref.ref(state), record), *([] if held is None else held[1][: KEEP - 1])])
        if len(groups) > KEEP:
            del groups[next(iter(groups))]

    def _made_last(self, state: object) -> tuple[int, ...] | None:
        """The newest group's key where its newest record is `state`'s own, else None."""
        newest = next(reversed(self._groups), None)
        return newest if newest is not None and self._groups[newest][1][0][0]() is state else None

    def _newest_first(self):
        """(made, held leaves, record) of every record, newest first."""
        for held, records in reversed(self._groups.values()):
            for made, record in records:
                yield made, held, record

    def of(self, state: object, fill: Callable[[], HostRecord] | None = None) -> HostRecord:
        """What the host knows of `state`: its record where the Step made it, else each fact of the newest record
        whose described leaves are `state`'s very tensors; a fact no record has is `fill()`'s (None: unknown)."""
        newest = self._made_last(state)  # mostly the state the Step made last: no walk over the records
        if newest is not None:
            return self._groups[newest][1][0][1]
        for made, _, record in self._newest_first():
            if made() is state:
                return record
        leaves = _leaves(state)
        facts, missing = {}, []
        for fact, columns in _COLUMNS:
            for _, held, record in self._newest_first():
                if all(held[i] is leaves[i] for i in columns):
                    facts[fact] = getattr(record, fact)
                    break
            else:
                missing.append(fact)
        if missing and fill is not None:
            filled = fill()
            facts.update((fact, getattr(filled, fact)) for fact in missing)
        return HostRecord(**facts)


def read_record(state) -> HostRecord:
    """The facts of `state` read from its tensors (a device read: for a state no record describes, built by hand
    or copied), exact rather than bounds; unknown where a leaf cannot be read (a meta or fake tensor)."""
    leaves = _leaves(state)  # in `_NAMES`' order, unpacked below
    present = [t for t in leaves if t is not None]  # penalties, bias_ids, missed: absent where the step has none
    if any(not isinstance(t, torch.Tensor) or isinstance(t, FakeTensor) or t.device.type == "meta" for t in present):
        return HostRecord()
    base_pos, active, temperature, top_k, top_p, penalties, min_left, bias_ids, missed = (
        None if t is None else t.cpu() for t in leaves
    )
    off = torch.tensor([1.0, 0.0, 0.0])  # repetition, frequency, presence: off
    processed = min_left > 0
    if penalties is not None:
        processed |= (penalties != off).any(1)
    if bias_ids is not None:
        processed |= (bias_ids >= 0).any(1)
    processed = processed.tolist()
    lanes = tuple(
        (t, k, p, used) if on else None
        for on, t, k, p, used in zip(active.tolist(), temperature.tolist(), top_k.tolist(), top_p.tolist(), processed)
    )
    bound = int(base_pos[active].max()) if bool(active.any()) else 0
    lag = 0 if missed is None else int((missed >= 0).sum(1).max())
    return HostRecord(bound, lanes, lag)
