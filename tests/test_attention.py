"""The paged-attention interface: kernel eligibility (CPU-checkable), and the reference's window semantics."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from support import kernel_semantics

import fdecode
from fdecode.graphs.backends import choose_attention
from fdecode.graphs.pure import fresh_code
from fdecode.ops.attention import TreeRows, paged_attention, paged_context

SHAPES = ((8, 2, 64), (8, 2, 64))  # (num_heads, num_kv_heads, head_dim) of target and draft


def cfg(**overrides) -> fdecode.DecodeConfig:
    return fdecode.DecodeConfig(**{"num_draft_tokens": 2, "max_batch": 1, "max_seq_len": 512, **overrides})


@pytest.fixture
def flash_attn_installed(monkeypatch):
    """Pretend only that the package is importable: the eligibility boundary, never a result."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else real(name, *a)
    )


def test_cpu_runs_the_reference_without_complaint() -> None:
    assert choose_attention(cfg(), SHAPES) == ("torch", None)
    with pytest.raises(ValueError, match="flash-attn runs on CUDA"):
        choose_attention(cfg(attention="flash_attn"), SHAPES)
    kernel, reason = choose_attention(cfg(attention="flash_attn"), SHAPES, fallback=True)
    assert kernel == "torch" and "flash_attn: flash-attn runs on CUDA" in reason


def test_flash_attn_eligibility_on_cuda(flash_attn_installed) -> None:
    good = dict(device="cuda", dtype=torch.bfloat16, block_size=256)
    assert choose_attention(cfg(**good), ((8, 2, 64), (4, 4, 128))) == ("flash_attn", None)
    for change, words in (
        (dict(dtype=torch.float32), "float16 or bfloat16"),
        (dict(block_size=16), "block_size % 256"),
    ):
        kernel, reason = choose_attention(cfg(**{**good, **change}), ((8, 2, 64), (4, 4, 128)))
        assert kernel == "torch" and words in reason
    kernel, reason = choose_attention(cfg(**good), ((8, 2, 64), (4, 4, 100)))
    assert kernel == "torch" and "multiples of 8" in reason


def test_a_draft_tree_takes_the_device_kernel_and_its_trees_the_reference(flash_attn_installed) -> None:
    """A tree config's step runs its chains on the device kernel; a forward over tree nodes (a tree mask)
    reads its keys with the reference, whatever the step's kernel."""
    good = dict(device="cuda", dtype=torch.bfloat16, block_size=256)
    tree = dict(num_draft_tokens=6, draft_topk=2, draft_depth=3)
    assert choose_attention(cfg(**good, **tree), SHAPES) == ("flash_attn", None)
    assert choose_attention(cfg(**good, **tree, attention="flash_attn"), SHAPES) == ("flash_attn", None)
    tables, positions = torch.tensor([[1, 2]]), torch.tensor([[5, 6, 6]])
    nodes = TreeRows(torch.tensor([[5, 6, 7]]), torch.eye(3, dtype=torch.bool)[None], torch.tensor([5]))
    assert paged_context(tables, positions, 4, kernel="flash_attn").kernel == "flash_attn"
    assert paged_context(tables, positions, 4, kernel="flash_attn", tree=nodes).kernel == "torch"


def test_flash_attn_missing_is_stated_on_cuda() -> None:
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here")
    kernel, reason = choose_attention(cfg(device="cuda", dtype=torch.float16, block_size=256), SHAPES)
    assert kernel == "torch" and "not installed" in reason


def test_npu_kernel_eligibility(monkeypatch) -> None:
    good = dict(device="npu", dtype=torch.bfloat16, block_size=128)
    missing = 'torch_npu is not installed (pip install -e ".[npu]")'
    monkeypatch.setattr("fdecode.graphs.torchair.torch_npu_reason", lambda: missing)  # whatever this machine has
    kernel, reason = choose_attention(cfg(**good), SHAPES)  # stated, and the reference runs
    assert kernel == "torch" and reason == f"npu_fused_infer_attention: {missing}"
    with pytest.raises(ValueError, match="torch_npu is not installed"):
        choose_attention(cfg(**good, attention="npu_fused_infer_attention"), SHAPES)
    # Pretend only that torch_npu sees an NPU (the eligibility boundary); the rest is fdecode's own rule.
    monkeypatch.setattr("fdecode.graphs.torchair.torch_npu_reason", lambda: None)
    assert choose_attention(cfg(**good), SHAPES) == ("npu_fused_infer_attention", None)
    assert choose_attention(cfg(**{**good, "block_size": 512}), SHAPES) == ("npu_fused_infer_attention", None)
    for change, words in (
        (dict(dtype=torch.float32), "float16 or bfloat16"),
        (dict(block_size=64), "block_size in 128, 256, 384, 512"),
        (dict(block_size=1024), "block_size in 128, 256, 384, 512"),
    ):
        kernel, reason = choose_attention(cfg(**{**good, **change}), SHAPES)
        assert kernel == "torch" and words in reason
    kernel, reason = choose_attention(cfg(**good), ((128, 1, 64), (8, 2, 64)))
    assert kernel == "torch" and "at most 64x" in reason
    assert choose_attention(cfg(**good, attention="torch"), SHAPES) == ("torch", None)


def test_reference_reads_exactly_the_window() -> None:
    """A query at position p sees keys 0..p of its own lane, nothing past the window's blocks."""
    torch.manual_seed(0)
    bs, heads, d = 4, 2, 8
    kv = torch.randn(1, 2, 10 * bs, heads, d)
    tables = torch.tensor([[3, 1, 7, -1], [5, 2, -1, -1]])
    positions = torch.tensor([[6], [5]])
    q = torch.randn(2, 1, heads, d)
    out = paged_attention(q, kv, 0, paged_context(tables, positions, bs))
    narrow = paged_attention(q, kv, 0, paged_context(tables[:, :2], positions, bs))  # an 8-token window
    torch.testing.assert_close(out, narrow)  # positions <= 6 lie in the first 2 blocks
    for lane in range(2):
        slots = [int(tables[lane, j // bs]) * bs + j % bs for j in range(int(positions[lane, 0]) + 1)]
        keys, values = kv[0, 0, slots], kv[0, 1, slots]  # [n, H, D]
        scores = torch.einsum("hd,nhd->hn", q[lane, 0], keys) / d**0.5
        expect = torch.einsum("hn,nhd->hd", scores.softmax(-1), values)
        torch.testing.assert_close(out[lane, 0], expect)


# ------------------------------------------------------------------ device kernels' argument mapping, on CPU
# (against the kernels' documented semantics: tests/support/kernel_semantics.py)


def step_rows(last: list[int], q_len: int) -> torch.Tensor:
    """Query positions as the step lays them out: q_len consecutive rows per lane ending at `last`."""
    return torch.tensor(last)[:, None] - torch.arange(q_len - 1, -1, -1)


@pytest.mark.parametrize("kernel", ["flash_attn", "npu_fused_infer_attention"])
def test_device_adapter_passes_what_the_kernel_documents(kernel, monkeypatch) -> None:
    kernel_semantics.install(monkeypatch, kernel)
    torch.manual_seed(0)
    bs, heads, kv_heads, d = 8, 4, 2, 16
    kv = torch.randn(2, 2, 12 * bs, kv_heads, d)
    tables = torch.tensor([[3, 7, -1, -1], [5, 1, 9, 4], [2, -1, -1, -1]])
    # verify (K + 1 rows), the first draft forward (repair + current), later draft forwards (one row);
    # positions across block boundaries, a lane at its first positions (fewer keys than rows).
    for q_len, last in ((4, [12, 31, 3]), (2, [8, 17, 1]), (1, [10, 25, 0])):
        positions = step_rows(last, q_len)
        q = torch.randn(3, q_len, heads, d)
        for layer in (0, 1):
            ref = paged_attention(q, kv, layer, paged_context(tables, positions, bs, kernel="torch"))
            got = paged_attention(q, kv, layer, paged_context(tables, positions, bs, kernel=kernel))
            valid = positions >= 0  # rows at negative positions are padding: their output is never read
            torch.testing.assert_close(got[valid], ref[valid])


# ------------------------------------------------------------------ flash-attn under capture (CPU, the stand-in)


def flash_case():
    """Lanes as the step meets them after the Engine shrank the window to 4 blocks of 8 (32 tokens): two
    live lanes inside it, and an inactive lane whose stale base_pos (58) lies past it."""
    torch.manual_seed(0)
    bs, heads, kv_heads, d, q_len = 8, 4, 2, 16, 4
    kv = torch.randn(1, 2, 12 * bs, kv_heads, d)
    tables = torch.tensor([[3, 7, -1, -1], [5, 1, 9, 4], [2, 6, 8, 10]])
    positions = step_rows([12, 31, 61], q_len)
    q = torch.randn(3, q_len, heads, d)
    return q, kv, tables, positions, bs


def flash_attention(q, kv, tables, positions, bs):
    return paged_attention(q, kv, 0, paged_context(tables, positions, bs, kernel="flash_attn"))


# Slow with Inductor: ~2 s on a warm Inductor cache, 20-50 s on a cold one (a fresh clone, an edited op).
@pytest.mark.parametrize("backend", ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_flash_attn_captures_in_one_graph_and_stays_in_the_window(backend, monkeypatch) -> None:
    """fullgraph capture holds the kernel (one registered op node), and a stale position past the window
    reads the window, as the reference does, instead of past the block table."""
    kernel_semantics.install(monkeypatch, "flash_attn")
    q, kv, tables, positions, bs = flash_case()
    window = tables.shape[1] * bs
    ref = paged_attention(q, kv, 0, paged_context(tables, positions, bs, kernel="torch"))
    if backend == "eager":
        got = flash_attention(q, kv, tables, positions, bs)
    else:
        graphs = []

        def seen(gm, example_inputs):
            graphs.append(gm)
            return (torch._dynamo.lookup_backend(backend))(gm, example_inputs)

        fn = fresh_code(flash_attention, f"flash_attention_{backend}")  # a Dynamo cache entry of its own
        got = torch.compile(fn, backend=seen, fullgraph=True, dynamic=False)(q, kv, tables, positions, bs)
        targets = [node.target for gm in graphs for node in gm.graph.nodes]
        assert len(graphs) == 1 and targets.count(torch.ops.fdecode.flash_attn_paged.default) == 1
    # Rows inside the window are the reference's; the stale lane's last row sees the whole window in both.
    rows = (positions >= 0) & (positions < window)
    rows[:, -1] = True
    torch.testing.assert_close(got[rows], ref[rows])
    assert torch.isfinite(got).all()


def test_flash_attn_op_fake_matches_the_kernel(monkeypatch) -> None:
    """The registered op's fake (shapes, dtype, strides) agrees with what the kernel returns."""
    kernel_semantics.install(monkeypatch, "flash_attn")
    q, kv, tables, positions, bs = flash_case()
    pages = (kv.shape[2] // bs, bs, *kv.shape[3:])
    lengths = (positions[:, -1] + 1).clamp(max=tables.shape[1] * bs).to(torch.int32)
    args = (q, kv[0, 0].view(pages), kv[0, 1].view(pages), lengths, tables.clamp_min(0).to(torch.int32), 0.25)
    torch.library.opcheck(
        torch.ops.fdecode.flash_attn_paged.default, args, test_utils=("test_schema", "test_faketensor")
    )


def test_auto_says_why_flash_attn_is_not_picked_at_the_default_block_size(flash_attn_installed) -> None:
    """Every unmet requirement is named at once, the default block size with what to set instead."""
    default = cfg().block_size  # DecodeConfig's own default
    kernel, reason = choose_attention(cfg(device="cuda", dtype=torch.bfloat16), SHAPES)
    assert kernel == "torch" and f"block_size={default}" in reason and "block_size=256" in reason
    kernel, reason = choose_attention(cfg(device="cuda"), SHAPES)  # float32 and block_size 16: both said
    assert kernel == "torch" and "float16 or bfloat16" in reason and "block_size=256" in reason
