"""What the host knows of a state lives with the Step's schedule, not on the state (issue 52, item 3).

A record holds for any state that carries the very leaves it describes (a `replace` of other leaves, a pytree
map); a state with other tensors there has the fact read from its tensors, and a fact a caller passes in is
the one the step uses and carries on.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch
from support.llama_models import fdecode_target, independent_draft
from torch.utils import _pytree as pytree

import fdecode
from fdecode.host_record import HostRecord, HostRecords, read_record
from fdecode.state.decode_state import LEAVES, MEMO, leaves_of
from fdecode.state.ownership import TICKET

PROMPTS = [[5, 17, 33, 2, 9], [7, 3, 4]]


class Leaves(SimpleNamespace):
    """A stand-in for a state's leaves (a record holds its state weakly)."""


def lanes(**changes) -> Leaves:
    leaves = dict(
        base_pos=torch.tensor([6, 3, 0]),
        active=torch.tensor([True, True, False]),
        temperature=torch.tensor([0.0, 0.5, 0.0]),
        top_k=torch.tensor([0, 20, 0]),
        top_p=torch.tensor([1.0, 0.5, 1.0]),
        penalties=torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.2, 0.0], [1.0, 0.0, 0.0]]),
        min_left=torch.tensor([0, 0, 0]),
        bias_ids=torch.full((3, 2), -1),
        missed=torch.tensor([[-1, -1], [4, -1], [-1, -1]]),
    )
    return Leaves(**{**leaves, **changes})


def test_a_record_holds_for_the_leaves_it_describes():
    records = HostRecords()
    state = lanes()
    record = HostRecord(9, ((0.0, 0, 1.0, False), None, None), 1)
    records.note(state, record)
    assert records.of(state) is record
    same = Leaves(**vars(state))  # another object over the very tensors
    assert records.of(same) == record
    moved = Leaves(**{**vars(state), "base_pos": state.base_pos + 1})
    assert records.of(moved) == dataclasses.replace(record, max_position=None)  # only that fact is unknown
    fill = HostRecord(7, None, 5)
    assert records.of(moved, lambda: fill) == dataclasses.replace(record, max_position=7)


def test_a_step_drops_the_record_of_the_state_it_consumed():
    records = HostRecords()
    old, new = lanes(), lanes()
    records.note(old, HostRecord(1, None, 0))
    records.note(new, HostRecord(2, None, 0), spent=old)
    assert records.of(old) == HostRecord()  # nothing describes it any more


def test_read_record_reads_the_facts_from_the_tensors():
    read = read_record(lanes())
    assert read == HostRecord(6, ((0.0, 0, 1.0, False), (0.5, 20, 0.5, True), None), 1)
    meta = lanes(base_pos=torch.empty(3, dtype=torch.int64, device="meta"))
    assert read_record(meta) == HostRecord()  # nothing to read: unknown


def test_no_host_bookkeeping_rides_on_the_state():
    """Only the KV ticket (ownership, `fdecode.state.ownership`) is held beside a state's leaves, and the tuple of
    those leaves once read (`leaves_of`: its own fields, nothing of the host's)."""
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=64, block_size=4, backend="eager")
    step = fdecode.compile(target, independent_draft("partial", target), cfg)
    state = step.prefill(PROMPTS, max_new_tokens=12)
    fields = {f.name for f in dataclasses.fields(state)}
    for _ in range(2):
        state, _ = step(state)
        assert set(vars(state)) - {MEMO} == fields | {TICKET} and state.kv_ticket is not None
        assert all(a is getattr(state, name) for a, name in zip(leaves_of(state), LEAVES, strict=True))
    record = step.schedule.record(state)
    assert record.max_position == len(PROMPTS[0]) + 2 * cfg.W  # prefill's bound, W per step
    assert step.schedule.record(pytree.tree_map(lambda t: t, state)) == record
    # A caller's facts are the step's: it runs the whole lane and carries the unknown bound on.
    state, _ = step(state, host=dataclasses.replace(record, max_position=None))
    assert step.schedule.record(state).max_position is None
    # A copy has other tensors: its facts are read from them (exact, not the bound).
    copied = state.clone()
    assert step.schedule.record(copied).max_position == max(state.base_pos[state.active].tolist())
