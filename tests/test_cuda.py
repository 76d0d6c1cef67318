"""CUDA checks: skipped where no CUDA device is present (this project's CI has none).

Run them on a GPU machine with `python -m pytest tests/test_cuda.py`.
"""

from __future__ import annotations

import pytest
import torch

import fdecode
from conftest import fdecode_target, independent_draft

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present")

PROMPTS = [[5, 17, 33, 2, 9], [7, 3], [11, 12, 13, 14]]


def cuda_step(backend: str, k: int = 3):
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=k, max_batch=4, max_seq_len=160, block_size=16, backend=backend, device="cuda"
    )
    return fdecode.compile(target, independent_draft("partial", target), cfg)


def test_cudagraphs_greedy_equals_eager():
    eager = fdecode.generate(cuda_step("eager"), PROMPTS, max_new_tokens=40)
    graphs = cuda_step("cudagraphs")
    assert graphs.backend == "cudagraphs"
    assert fdecode.generate(graphs, PROMPTS, max_new_tokens=40) == eager


def test_100_steps_without_a_device_to_host_sync():
    step = cuda_step("cudagraphs")
    state = step.prefill(PROMPTS, max_new_tokens=150, temperature=[0.0, 0.8, 1.0], seed=[1, 2, 3])
    for _ in range(3):  # warm-up: compile and record the graph
        state, out = step(state)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(100):
            state, out = step(state)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert out.tokens.shape == (4, 4)
