"""Ascend NPU checks (torch_npu + torchair): skipped where no NPU is present (this project's CI has none).

Written against torch_npu's and torchair's documented API; not yet run on an NPU.
"""

from __future__ import annotations

import pytest
import torch
from support.llama_models import fdecode_target, independent_draft, mtp_head
from support.probes import steps_without_host_syncs

import fdecode
from fdecode.graphs import torchair as npu

UNAVAILABLE = npu.availability_reason()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"needs an Ascend NPU: {UNAVAILABLE}")

PROMPTS = [[5, 17, 33, 2, 9], [7, 3], [11, 12, 13, 14]]


def npu_step(backend: str, draft_kind: str = "model", **changes):
    target = fdecode_target(2)
    draft = independent_draft("partial", target) if draft_kind == "model" else mtp_head("partial", target)
    cfg = fdecode.DecodeConfig(
        **{
            "num_draft_tokens": 3,
            "max_batch": 4,
            "max_seq_len": 160,
            "block_size": 16,
            "backend": backend,
            "device": "npu",
            "dtype": torch.float16,
            **changes,
        }
    )
    return fdecode.compile(target, draft, cfg)


def test_auto_picks_torchair():
    step = npu_step("auto")
    assert (step.backend, step.fallback_reason) == ("torchair", None)


@pytest.mark.parametrize("draft_kind", ["model", "mtp"])
def test_acl_graph_greedy_equals_eager(draft_kind):
    eager = fdecode.generate(npu_step("eager", draft_kind), PROMPTS, max_new_tokens=40)
    graph = npu_step("torchair", draft_kind)
    assert graph.backend == "torchair"
    assert fdecode.generate(graph, PROMPTS, max_new_tokens=40) == eager


def test_100_acl_graph_steps_without_a_device_to_host_sync():
    import torch_npu

    step = npu_step("torchair")
    state = step.prefill(PROMPTS, max_new_tokens=150, temperature=[0.0, 0.8, 1.0], seed=[1, 2, 3])
    _, out = steps_without_host_syncs(step, state, 100, torch_npu.npu)
    assert out.tokens.shape == (4, 4)


def test_ge_mode_without_the_kernel_is_refused_or_runs_the_acl_graph():
    if npu.installed_kernel() is not None:
        pytest.skip("the MtpPrepareNextDraft kernel is installed here: GE mode is eligible")
    with pytest.raises(ValueError, match="MtpPrepareNextDraft"):  # with the NPU attention kernel, only that is missing
        npu_step("torchair", torchair_mode="max-autotune", block_size=128, max_seq_len=512)
    step = fdecode.compile(
        fdecode_target(2),
        independent_draft("random", fdecode_target(2)),
        fdecode.DecodeConfig(
            num_draft_tokens=2,
            max_batch=2,
            max_seq_len=32,
            block_size=16,
            backend="torchair",
            device="npu",
            dtype=torch.float16,
            torchair_mode="max-autotune",
        ),
        fallback=True,
    )
    assert (step.backend, step.config.torchair_mode) == ("torchair", "reduce-overhead")
    assert step.fallback_reason.startswith("torchair GE graph: ")
    assert len(fdecode.generate(step, PROMPTS[:2], max_new_tokens=8)[0]) == 8


def test_ge_converter_registers_with_torchair():
    tng = npu.import_torchair()
    npu.register_ge_converters(tng)
    npu.register_ge_converters(tng)  # idempotent
    assert callable(tng.get_npu_backend)
    # fdecode's converter replaces torchair's (which raises NotImplementedError for aten.view.dtype): a GE graph
    # holding the filters' float-bits view compiles and runs.
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=1,
        max_batch=1,
        max_seq_len=128,
        block_size=128,
        device="npu",
        dtype=torch.float16,
        backend="torchair",
        torchair_mode="max-autotune",
    )

    def bits(x):
        return x.view(torch.int32) + 1

    x = torch.rand(4, 8).npu()
    assert torch.equal(torch.compile(bits, backend=npu.backend(cfg), fullgraph=True)(x), bits(x))


def test_fused_infer_attention_matches_the_reference_on_paged_kv():
    """torch_npu's kernel reads the same keys as the torch reference (tests/test_attention.py checks the
    arguments on CPU against the documented semantics; this checks the kernel)."""
    from fdecode.ops.attention import paged_attention, paged_context

    torch.manual_seed(0)
    bs, heads, kv_heads, d, blocks = 128, 8, 2, 64, 12
    kv = torch.randn(2, 2, blocks * bs, kv_heads, d, dtype=torch.float16).npu()
    tables = torch.tensor([[3, 7, -1, -1], [5, 1, 9, 4], [2, -1, -1, -1]]).npu()
    for q_len, last in ((4, [200, 500, 3]), (2, [128, 511, 1]), (1, [10, 300, 100])):
        positions = (torch.tensor(last)[:, None] - torch.arange(q_len - 1, -1, -1)).npu()
        q = torch.randn(3, q_len, heads, d, dtype=torch.float16).npu()
        ref = paged_attention(q, kv, 1, paged_context(tables, positions, bs, kernel="torch"))
        got = paged_attention(q, kv, 1, paged_context(tables, positions, bs, kernel="npu_fused_infer_attention"))
        torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("draft_kind", ["model", "mtp"])
def test_npu_attention_kernel_greedy_equals_the_reference(draft_kind):
    kernel = npu_step("torchair", draft_kind, block_size=128, max_seq_len=512)
    assert kernel.config.attention == "npu_fused_infer_attention", kernel.attention_reason
    reference = npu_step("torchair", draft_kind, block_size=128, max_seq_len=512, attention="torch")
    # fp16 through two different kernels: the first tokens (before any near-tie can flip) must agree.
    got = fdecode.generate(kernel, PROMPTS, max_new_tokens=8)
    assert got == fdecode.generate(reference, PROMPTS, max_new_tokens=8)


@pytest.mark.parametrize("sampling", [False, True])
def test_ge_graph_greedy_equals_eager(sampling):
    if npu.installed_kernel() is None:
        pytest.skip("GE mode needs the AscendC MtpPrepareNextDraft kernel package, not installed on this NPU machine")
    sizes = dict(block_size=128, max_seq_len=512, sampling=sampling)  # the NPU attention kernel's block sizes
    eager = fdecode.generate(npu_step("eager", **sizes), PROMPTS, max_new_tokens=40)
    ge = npu_step("torchair", torchair_mode="max-autotune", **sizes)
    assert (ge.backend, ge.fallback_reason) == ("torchair", None)
    assert fdecode.generate(ge, PROMPTS, max_new_tokens=40) == eager
