"""The fused prepare op, paging and greedy acceptance, checked on inputs worked out by hand."""

from __future__ import annotations

import pytest
import torch

import fdecode  # noqa: F401 - registers torch.ops.fdecode
from fdecode.ops import apply_stops, greedy_accept, prepare_next_draft_reference, slot_of

BS = 4


def design_example():
    """docs/design.md's worked example: block size 4, K = 3, three lanes with L = 4, 2, 1."""
    accepted = torch.tensor([[10, 11, 12, 13], [20, 21, -1, -1], [30, -1, -1, -1]])
    hidden = torch.arange(3 * 4 * 2, dtype=torch.float32).view(3, 4, 2)  # row (b, j) holds 8b + 2j, 8b + 2j + 1
    placeholder = torch.tensor([-1.0, -1.0])
    base_pos = torch.tensor([4, 8, 12])
    # Identity-ish tables: lane b owns blocks 1 + 5b ... so slot(b, p) = (1 + 5b + p // 4) * 4 + p % 4.
    tables = torch.stack([torch.arange(1 + 5 * b, 6 + 5 * b) for b in range(3)])
    return accepted, hidden, placeholder, base_pos, base_pos + 1, tables


def slot(lane: int, pos: int) -> int:
    return (1 + 5 * lane + pos // BS) * BS + pos % BS


def test_design_worked_example():
    tokens, hidden, positions, kv_lens, slots = prepare_next_draft_reference(*design_example(), BS)
    assert tokens.tolist() == [12, 13, 20, 21, 30, 30]
    assert positions.tolist() == [7, 8, 9, 10, 12, 13]
    assert kv_lens.tolist() == [9, 11, 14]
    # Lane 0 accepted everything: the repair row writes position 7. Lanes 1, 2 redirect to P + 1.
    assert slots.tolist() == [slot(0, 7), slot(0, 8), slot(1, 11), slot(1, 10), slot(2, 14), slot(2, 13)]
    # Hidden rows: repair takes row L-2, current row L-1; L == 1 takes the placeholder.
    assert hidden.tolist() == [[4, 5], [6, 7], [8, 9], [10, 11], [-1, -1], [16, 17]]


def test_registered_op_matches_reference_and_passes_opcheck():
    args = design_example()
    got = torch.ops.fdecode.prepare_next_draft(*args, BS)
    want = prepare_next_draft_reference(*args, BS)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    torch.library.opcheck(torch.ops.fdecode.prepare_next_draft.default, (*args, BS))


def test_inactive_and_out_of_range_lanes_write_scratch():
    accepted = torch.tensor([[-1, -1], [5, 6], [7, -1]])
    hidden = torch.ones(3, 2, 3)
    tables = torch.tensor([[1, 2], [3, -1], [4, 5]])
    base_pos = torch.tensor([0, 2, 7])  # lane 1: P = 4 lies in unallocated block 1; lane 2: P = 8 is past its blocks
    tokens, _, positions, kv_lens, slots = prepare_next_draft_reference(
        accepted, hidden, torch.zeros(3), base_pos, base_pos + 1, tables, BS
    )
    assert tokens[:2].tolist() == [0, 0] and slots[:2].tolist() == [0, 0]  # inactive lane
    assert kv_lens[0] == 1  # unchanged for L = 0
    assert slots[2:4].tolist() == [slot_at(tables, 1, 3), 0]  # L == W: repair writes P - 1 = 3; P = 4 unallocated
    assert slots[4:].tolist() == [0, 0]  # P + 1 = 9 and P = 8 are past lane 2's two blocks
    assert positions.tolist() == [-1, 0, 3, 4, 7, 8]


def slot_at(tables, lane, pos):
    return int(tables[lane, pos // BS]) * BS + pos % BS


def test_slot_of_maps_out_of_range_to_scratch():
    tables = torch.tensor([[3, -1, 7]])
    positions = torch.tensor([[-1, 0, 5, 9, 11, 12, 100]])
    assert slot_of(tables, positions, BS).tolist() == [[0, 12, 0, 29, 31, 0, 0]]


def logits_for(argmax: list[list[int]], vocab: int = 8) -> torch.Tensor:
    """Logits whose argmax at [b, j] is argmax[b][j]."""
    target = torch.tensor(argmax)
    return torch.nn.functional.one_hot(target, vocab).float() * 5.0


@pytest.mark.parametrize(
    ("drafts", "want"),
    [
        ([1, 2, 3], [1, 2, 3, 4]),  # perfect match: every draft plus the bonus
        ([5, 2, 3], [1, -1, -1, -1]),  # early mismatch: only the correction
        ([1, 2, 5], [1, 2, 3, -1]),  # late mismatch
        ([1, 5, 3], [1, 2, -1, -1]),  # a later match after a mismatch is not accepted
    ],
)
def test_greedy_accept(drafts, want):
    tokens = torch.tensor([[0, *drafts]])
    accepted, length = greedy_accept(tokens, logits_for([[1, 2, 3, 4]]))
    assert accepted.tolist() == [want]
    assert length.tolist() == [sum(t >= 0 for t in want)]


def test_apply_stops_cuts_at_stop_id_budget_and_inactive():
    accepted = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, -1, -1]])
    length = torch.tensor([4, 4, 4, 2])
    active = torch.tensor([True, True, False, True])
    remaining = torch.tensor([10, 2, 10, 10])
    stop_ids = torch.tensor([[3, -1], [-1, -1], [1, -1], [9, 8]])
    cut, length, remaining, finished = apply_stops(accepted, length, active, remaining, stop_ids)
    assert cut.tolist() == [[1, 2, 3, -1], [1, 2, -1, -1], [-1] * 4, [1, 2, -1, -1]]
    assert length.tolist() == [3, 2, 0, 2]
    assert remaining.tolist() == [7, 0, 10, 8]
    assert finished.tolist() == [True, True, True, False]
