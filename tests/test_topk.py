"""`fdecode.ops.topk.topk` returns torch.topk's values and ids at real vocabularies, eager and compiled."""

from __future__ import annotations

import pytest
import torch

from fdecode.ops.topk import BLOCK, topk


def distinct_rows(*shape: int, seed: int = 0) -> torch.Tensor:
    """Rows of a random permutation's values: no two entries tie, so torch.topk's ids are the only answer."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(shape[-1], generator=g).float() for _ in range(int(torch.tensor(shape[:-1]).prod()))]
    return torch.stack(rows).reshape(shape) / 7


@pytest.mark.parametrize("vocab", [151_936, 49_152, 4_096])
@pytest.mark.parametrize("k", [1, 5, 128])
def test_equals_torch_topk(vocab, k):
    x = distinct_rows(2, 3, vocab, seed=vocab + k)
    want = torch.topk(x, k, dim=-1)
    got = topk(x, k)
    assert torch.equal(got[0], want.values) and torch.equal(got[1], want.indices)


def test_the_largest_entries_crowded_into_one_block_and_spread_over_many():
    x = distinct_rows(4, 151_936, seed=1)
    x[0, 3 * BLOCK : 4 * BLOCK] += 1e6  # row 0: every large entry in one block
    x[1, ::BLOCK] += 1e6  # row 1: the largest entry of each block is the first
    x[2, :] = -float("inf")
    x[2, 7] = 1.0  # row 2: one finite entry; the rest tie at -inf
    for k in (5, 64):
        values, ids = topk(x, k)
        want = torch.topk(x, k, dim=-1)
        assert torch.equal(values, want.values)
        assert torch.equal(ids[[0, 1, 3]], want.indices[[0, 1, 3]])
        assert ids[2, 0] == 7 and torch.equal(x[2].gather(0, ids[2]), values[2])


def test_shapes_it_does_not_block_are_torch_topk():
    x = distinct_rows(2, 151_937)  # not a multiple of the block
    assert torch.equal(topk(x, 5)[1], torch.topk(x, 5, dim=-1).indices)
    x = distinct_rows(2, 40 * BLOCK)
    assert torch.equal(topk(x, 64)[1], torch.topk(x, 64, dim=-1).indices)  # more than the blocks
    assert topk(x, 0)[0].shape == (2, 0)


@pytest.mark.slow  # compiles with Inductor: ~2 s on a warm cache, 20-50 s on a cold one (fresh clone, edited op)
def test_compiled_equals_eager():
    x = distinct_rows(8, 5, 49_152, seed=3)
    compiled = torch.compile(lambda t: topk(t, 16), backend="inductor", fullgraph=True, dynamic=False)
    assert all(torch.equal(a, b) for a, b in zip(compiled(x), topk(x, 16)))
