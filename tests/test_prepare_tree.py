"""`fdecode::prepare_tree_draft`, a tree step's fused prepare op (`fdecode.ops.prepare_tree`): its spec on a worked
example, and its CPU compile (`fdecode.backends.cpu.prepare`) equal to the reference, with no extern call left."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import fdecode  # noqa: F401 - registers the op
from fdecode.backends.cpu.prepare import inline_prepare
from fdecode.backends.cpu.vec_isa import isa_options
from fdecode.ops.prepare_tree import prepare_tree_draft_reference

BS = 4


def worked_example():
    """Three lanes at base_pos 5 / 9 / 2 with L = 3 / 5 / 0 committed tokens, blocks (1, 2, 3) / (4, 5, 6) /
    (7, 8, 9); hidden row i of lane b is 10 b + i."""
    accepted = torch.tensor([[11, 12, 13, -1, -1], [21, 22, 23, 24, 25], [-1, -1, -1, -1, -1]])
    length = torch.tensor([3, 5, 0])
    hidden = (10 * torch.arange(3)[:, None] + torch.arange(5)[None, :]).float()[..., None].expand(3, 5, 2)
    base_pos = torch.tensor([5, 9, 2])
    tables = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    return accepted, length, hidden.contiguous(), base_pos, tables


def test_the_rows_are_the_runs_last_tokens_right_aligned():
    tokens, positions, slots, hidden, real = prepare_tree_draft_reference(*worked_example(), BS, 4)
    # lane 0: one padding row, then the run's 3 tokens at 6, 7, 8; lane 1: the last 4 of 5 at 11 .. 14; lane 2: pad
    assert tokens.tolist() == [[0, 11, 12, 13], [22, 23, 24, 25], [0, 0, 0, 0]]
    assert real.tolist() == [[False, True, True, True], [True] * 4, [False] * 4]
    assert positions.tolist() == [[5, 6, 7, 8], [11, 12, 13, 14], [0, 0, 1, 2]]  # 3 + i for i = -4 .. -1, at >= 0
    # slot = block_tables[b, p // 4] * 4 + p % 4: lane 0 at 6, 7 in block 2, 8 in block 3; lane 1 at 11 in block 6,
    # 12 .. 14 past its table (scratch 0, as `slot_of` gives); padding: scratch 0
    assert slots.tolist() == [[0, 10, 11, 12], [27, 0, 0, 0], [0, 0, 0, 0]]
    assert hidden[..., 0].tolist() == [[0, 0, 1, 2], [11, 12, 13, 14], [0, 0, 0, 0]]
    two = prepare_tree_draft_reference(*worked_example(), BS, 2)  # after a chain depth: the last two
    assert two[0].tolist() == [[12, 13], [24, 25], [0, 0]] and two[1].tolist() == [[7, 8], [13, 14], [1, 2]]
    op = torch.ops.fdecode.prepare_tree_draft(*worked_example(), BS, 4)
    assert all(torch.equal(a, b) for a, b in zip(op, (tokens, positions, slots, hidden, real)))


def random_case(gen: torch.Generator, batch: int = 5, window: int = 5, width: int = 8):
    length = torch.randint(0, window + 1, (batch,), generator=gen)
    length[0], length[1] = window, 0  # a whole run and an inactive lane in every case
    accepted = torch.randint(0, 100, (batch, window), generator=gen)
    accepted = torch.where(torch.arange(window)[None, :] < length[:, None], accepted, -1)
    hidden = torch.randn(batch, window, 2 * width, generator=gen)[..., ::2]  # strided
    base_pos = torch.randint(0, 20, (batch,), generator=gen)
    tables = torch.randint(1, 40, (batch, 8), generator=gen)
    return accepted, length, hidden, base_pos, tables


@pytest.mark.slow
def test_the_compiled_cpu_op_equals_the_reference_and_calls_no_extern():
    torch._dynamo.reset()
    options = {**isa_options(), "post_grad_custom_post_pass": inline_prepare}

    def call(*args):
        return torch.ops.fdecode.prepare_tree_draft(*args, BS, 4)

    fn = torch.compile(call, backend="inductor", fullgraph=True, dynamic=False, options=options)
    gen = torch.Generator().manual_seed(55)
    first = random_case(gen)
    _, (code, *_) = run_and_get_code(fn, *first)
    assert "torch.ops.fdecode.prepare_tree_draft" not in code  # compiled in, not an extern call of the reference
    for trial in range(10):
        args = first if trial == 0 else random_case(gen)
        got, want = fn(*args), prepare_tree_draft_reference(*args, BS, 4)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), (trial, g, w)
