"""Random inputs of the fused op `prepare_next_draft` and their comparison with its reference.

The inputs cover what the reference handles specially: inactive lanes (L = 0),
L = 1 (placeholder repair row), L = K + 1 (repair row writes P - 1), positions
before 0 and past a lane's blocks, negative block ids, a window of one (K = 0),
hidden sizes that are not powers of two or exceed one column chunk, three float
dtypes and a strided hidden tensor: every dtype x hidden width x block size in 60 trials.

`compare` runs them through the registered op or a kernel and the reference: the Triton kernel
on CUDA (tests/test_cuda.py) and in Triton's CPU interpreter (`interpreted_main`, run in a
subprocess by tests/test_prepare_triton.py).
"""

from __future__ import annotations

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
WIDTHS = (1, 3, 64, 130, 257)
BLOCK_SIZES = (1, 2, 4, 16)
COMBINATIONS = len(DTYPES) * len(WIDTHS) * len(BLOCK_SIZES)  # trial i takes combination i mod 60


def random_case(gen: torch.Generator, device: str, trial: int = 0):
    """One random input set for `prepare_next_draft` (see the module docstring for what it covers): the
    dtype, hidden width and block size of combination `trial` (every one in 60 trials), the rest random."""

    def randint(lo: int, hi: int, shape=()) -> torch.Tensor:  # inclusive bounds
        return torch.randint(lo, hi + 1, shape, generator=gen)

    batch, k = int(randint(1, 9)), int(randint(0, 5))
    dtype = DTYPES[trial % len(DTYPES)]
    width = WIDTHS[trial // len(DTYPES) % len(WIDTHS)]
    block_size = BLOCK_SIZES[trial // (len(DTYPES) * len(WIDTHS)) % len(BLOCK_SIZES)]
    shape = dict(batch=batch, k=k, dtype=dtype, width=width, block_size=block_size, max_blocks=int(randint(1, 6)))
    return case_of(gen, device, **shape)


def case_of(gen: torch.Generator, device: str, *, batch, k, dtype, width, block_size, max_blocks):
    """Random values of `prepare_next_draft`'s inputs of one shape (a compiled kernel's: see `random_case`)."""

    def randint(lo: int, hi: int, shape=()) -> torch.Tensor:  # inclusive bounds
        return torch.randint(lo, hi + 1, shape, generator=gen)

    window = k + 1
    lengths = randint(0, window, (batch,))
    lengths[0] = window  # every case has a fully accepted lane and (below) an L = 1 and an inactive lane
    if batch > 1:
        lengths[1] = 1
    if batch > 2:
        lengths[2] = 0
    tokens = randint(0, 1000, (batch, window))
    accepted = torch.where(torch.arange(window)[None] < lengths[:, None], tokens, torch.full_like(tokens, -1))
    base_pos = randint(-3, max_blocks * block_size + 2, (batch,))
    tables = randint(-2, 40, (batch, max_blocks))
    big = torch.randn(batch, window + 1, width + 5, generator=gen).to(dtype)
    hidden = big[:, 1:, 2 : 2 + width]  # strided: not contiguous
    placeholder = torch.randn(width, generator=gen).to(dtype)
    args = (accepted, hidden, placeholder, base_pos, base_pos + 1, tables)
    return tuple(a.to(device) for a in args) + (block_size,)


def compare(device: str, trials: int, fn=None) -> int:
    """Run `trials` random cases through `fn` (default: the registered op) and the reference; returns the count."""
    from fdecode.ops.prepare import prepare_next_draft_reference

    fn = fn or torch.ops.fdecode.prepare_next_draft
    gen = torch.Generator().manual_seed(1234)
    for trial in range(trials):
        args = random_case(gen, device, trial)
        got, want = fn(*args), prepare_next_draft_reference(*args)
        for name, g, w in zip(("tokens", "hidden", "positions", "kv_lens", "slots"), got, want):
            assert g.dtype == w.dtype and g.shape == w.shape, (trial, name, g.dtype, w.dtype, g.shape, w.shape)
            assert torch.equal(g.cpu(), w.cpu()), (trial, name, g.cpu(), w.cpu(), [a for a in args])
    return trials


def interpreted_main() -> None:  # run in a subprocess with TRITON_INTERPRET=1
    from fdecode.ops.prepare_triton import prepare_next_draft_triton

    print("compared", compare("cpu", COMBINATIONS, prepare_next_draft_triton))
