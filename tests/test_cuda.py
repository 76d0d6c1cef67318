"""CUDA checks: skipped where no CUDA device is present (this project's CI has none).

Run them on a GPU machine with `bash bench/gpu_check.sh` (or `python -m pytest tests/test_cuda.py`).
"""

from __future__ import annotations

import pytest
import torch
from support.llama_models import fdecode_target, independent_draft
from support.probes import steps_without_host_syncs
from torch._dynamo.utils import counters

import fdecode

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present")

PROMPTS = [[5, 17, 33, 2, 9], [7, 3], [11, 12, 13, 14]]


def cuda_step(backend: str, k: int = 3, max_seq_len: int = 160):
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=k, max_batch=4, max_seq_len=max_seq_len, block_size=16, backend=backend, device="cuda"
    )
    return fdecode.compile(target, independent_draft("partial", target), cfg)


@pytest.fixture
def recordings(monkeypatch):
    """Counts CUDA graph recordings (a spy on the graph-tree manager; the recording itself runs unchanged)."""
    from torch._inductor.cudagraph_trees import CUDAGraphTreeManager

    calls = []
    original = CUDAGraphTreeManager.record_function

    def record_function(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CUDAGraphTreeManager, "record_function", record_function)
    counters["inductor"].clear()
    return calls


def test_auto_picks_cudagraphs():
    step = cuda_step("auto")
    assert (step.backend, step.fallback_reason) == ("cudagraphs", None)


def test_cudagraphs_greedy_equals_eager(recordings):
    eager = fdecode.generate(cuda_step("eager"), PROMPTS, max_new_tokens=40)
    graphs = cuda_step("cudagraphs")
    assert graphs.backend == "cudagraphs"
    assert fdecode.generate(graphs, PROMPTS, max_new_tokens=40) == eager
    assert recordings, "the step never ran as a CUDA graph"
    assert counters["inductor"]["cudagraph_skips"] == 0


def test_triton_kernel_equals_reference():
    from support.prepare_cases import compare

    from fdecode.ops.prepare_triton import prepare_next_draft_triton

    assert torch._C._dispatch_has_kernel_for_dispatch_key("fdecode::prepare_next_draft", "CUDA")
    assert compare("cuda", 300, prepare_next_draft_triton) == 300
    assert compare("cuda", 300) == 300  # through the op, as the compiled step calls it


def test_no_rerecording_after_warmup(recordings):
    step = cuda_step("cudagraphs")
    state = step.prefill(PROMPTS, max_new_tokens=100, temperature=[0.0, 0.8, 1.0], seed=[1, 2, 3])
    kv = (state.target_kv.data_ptr(), state.draft_kv.data_ptr())
    for _ in range(3):  # warm-up: compile, warm up, record
        state, out = step(state)
    recorded = len(recordings)
    assert recorded >= 1
    for _ in range(30):
        state, out = step(state)
    assert len(recordings) == recorded, "the step re-recorded its CUDA graph after warm-up"
    assert (state.target_kv.data_ptr(), state.draft_kv.data_ptr()) == kv  # the KV pools never moved
    assert counters["inductor"]["cudagraph_skips"] == 0


def test_a_second_generation_replays_without_recording(recordings):
    """The second prefill takes the first chain's KV pool (the step's pools), so the static KV
    addresses the graphs were recorded with still hold."""
    import gc

    step = cuda_step("cudagraphs")
    first = fdecode.generate(step, PROMPTS, max_new_tokens=40)
    gc.collect()
    recorded = len(recordings)
    assert recorded >= 1
    assert fdecode.generate(step, PROMPTS, max_new_tokens=40) == first
    assert len(recordings) == recorded, "a new generation re-recorded the step's CUDA graph"
    assert counters["inductor"]["cudagraph_skips"] == 0


def test_100_steps_without_a_device_to_host_sync(recordings):
    """The step alone, then the engine's loop (its reads are one step behind, through a pinned buffer);
    admissions and cancellations inside the region: the next test."""
    step = cuda_step("cudagraphs", max_seq_len=640)
    state = step.prefill(PROMPTS, max_new_tokens=500, temperature=[0.0, 0.8, 1.0], seed=[1, 2, 3])
    _, out = steps_without_host_syncs(step, state, 100, torch.cuda)
    assert out.tokens.shape == (4, 4)

    engine = fdecode.Engine(step)
    for prompt in PROMPTS:
        engine.add_request(prompt, max_new_tokens=500)
    for _ in range(3):  # admission (priming reads the prompts on the host) and warm-up
        engine.step()
    torch.cuda.synchronize()
    got = 0
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(100):
            got += sum(len(e.new_tokens) for e in engine.step())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert engine.host_waits >= 100 and got >= 100 * len(PROMPTS)
    assert counters["inductor"]["cudagraph_skips"] == 0


def test_admissions_and_cancellations_without_a_device_to_host_sync(recordings):
    """Continuous batching inside the sync-check region: requests keep arriving and are admitted (priming
    through the engine's pinned staging buffer), grow their block tables, finish and retire, and running
    and waiting ones are cancelled, all under set_sync_debug_mode("error"). The warm-up admits, steps and
    cancels first, so graph capture and lazy initialisation happen outside the region; every request
    samples with the same parameters, so the steps stay on one plan and one window."""
    step = cuda_step("cudagraphs", max_seq_len=640)
    engine = fdecode.Engine(step)
    arrived = 0

    def top_up():
        nonlocal arrived
        while engine.num_waiting < 2:
            engine.add_request([arrived % 90 + 1, 7, 3], max_new_tokens=6 + arrived % 7, temperature=0.8, seed=arrived)
            arrived += 1

    def cancel(running: bool) -> None:
        ids = [rid for rid, r in engine.requests.items() if (r.lane is not None) == running]
        engine.cancel(ids[-1])

    for i in range(12):  # warm-up
        top_up()
        if i in (6, 7):
            cancel(running=i == 6)
        engine.step()
    torch.cuda.synchronize()
    admitted, finished = arrived, 0
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(100):
            top_up()
            if i % 10 in (3, 7):
                cancel(running=i % 10 == 3)
            finished += sum(e.finished for e in engine.step())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert arrived - admitted >= 40 and finished >= 30  # requests came, were primed and retired in the region
    assert counters["inductor"]["cudagraph_skips"] == 0


def test_staging_is_pinned_and_never_syncs() -> None:
    """fdecode.staging on a real accelerator: the staging and read buffers are page-locked, an upload
    and a read-back through a Fence raise nothing under set_sync_debug_mode("error"), values round-trip."""
    from fdecode.staging import Fence, Uploads, accelerated, host_buffer

    assert accelerated("cuda") and not accelerated("cpu")
    uploads, fence = Uploads("cuda", capacity=64), Fence("cuda")
    read = host_buffer(6, torch.int64, "cuda")
    assert uploads.buffer.is_pinned() and read.is_pinned()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(20):  # outgrows 64 bytes at once, then reuses the grown buffer
            ints, floats = uploads(torch.arange(6) + i, torch.full((3,), 0.5 * i))
            read.copy_(ints * 2 + floats.sum().long(), non_blocking=True)
            fence.record()
            fence.wait()
            assert read.tolist() == [2 * (j + i) + int(1.5 * i) for j in range(6)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert uploads.buffer.numel() == 128


def test_flash_attn_matches_the_reference_on_paged_kv() -> None:
    """The flash-attn path reads the same keys as the torch reference: consecutive query rows ending at
    each lane's last position, a block table with unallocated (-1) tail blocks."""
    pytest.importorskip("flash_attn", reason="flash-attn is not installed on this CUDA machine: pip install flash-attn")
    from fdecode.ops.attention import paged_attention, paged_context

    torch.manual_seed(0)
    bs, heads, kv_heads, d, blocks = 256, 8, 2, 64, 12
    kv = torch.randn(1, 2, blocks * bs, kv_heads, d, device="cuda", dtype=torch.bfloat16)
    tables = torch.tensor([[3, 7, -1, -1], [5, 1, 9, -1], [2, -1, -1, -1]], device="cuda")
    for q_len, last in ((4, [300, 700, 3]), (2, [256, 511, 1]), (1, [10, 600, 200])):
        positions = torch.tensor(last, device="cuda")[:, None] - torch.arange(q_len - 1, -1, -1, device="cuda")
        q = torch.randn(3, q_len, heads, d, device="cuda", dtype=torch.bfloat16)
        ref = paged_attention(q, kv, 0, paged_context(tables, positions, bs, kernel="torch"))
        got = paged_attention(q, kv, 0, paged_context(tables, positions, bs, kernel="flash_attn"))
        torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
