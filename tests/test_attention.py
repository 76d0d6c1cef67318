"""The paged-attention interface: kernel eligibility (CPU-checkable), and the reference's window semantics."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import fdecode
from fdecode.graphs.backends import choose_attention
from fdecode.ops.attention import paged_attention, paged_context


SHAPES = ((8, 2, 64), (8, 2, 64))  # (num_heads, num_kv_heads, head_dim) of target and draft


def cfg(**overrides) -> fdecode.DecodeConfig:
    return fdecode.DecodeConfig(**{"num_draft_tokens": 2, "max_batch": 1, "max_seq_len": 512, **overrides})


@pytest.fixture
def flash_attn_installed(monkeypatch):
    """Pretend only that the package is importable: the eligibility boundary, never a result."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else real(name, *a))


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


def test_flash_attn_missing_is_stated_on_cuda() -> None:
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here")
    kernel, reason = choose_attention(cfg(device="cuda", dtype=torch.float16, block_size=256), SHAPES)
    assert kernel == "torch" and "not installed" in reason


def test_npu_kernel_eligibility(monkeypatch) -> None:
    good = dict(device="npu", dtype=torch.bfloat16, block_size=128)
    kernel, reason = choose_attention(cfg(**good), SHAPES)  # no torch_npu here: stated, the reference runs
    assert kernel == "torch" and reason == "npu_fused_infer_attention: torch_npu is not installed (pip install fdecode[npu])"
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
#
# The device kernels cannot run here. What can be checked on CPU is fdecode's side of the call: the
# layouts, lengths, block tables and masks it passes. Each emulation below implements the kernel's
# *documented* semantics (nothing of fdecode's) in the plainest torch, and the adapter's output through
# it must equal the reference. The kernels themselves are checked on their devices (tests/test_cuda.py,
# tests/test_npu.py).


def flash_attn_with_kvcache_as_documented(
    q, k_cache, v_cache, *, cache_seqlens, block_table, softmax_scale, causal
):
    """flash-attn's documented semantics: q [B, Sq, Hq, D]; paged caches [num_blocks, page, Hk, D]; key j of
    lane b is k_cache[block_table[b, j // page], j % page]; lane b has cache_seqlens[b] keys; with causal,
    query row i sees keys j <= cache_seqlens[b] - Sq + i (the mask aligned to the bottom right); Hq / Hk
    query heads share a key head (head h reads key head h // (Hq / Hk))."""
    assert block_table.dtype == torch.int32 and cache_seqlens.dtype == torch.int32 and causal
    b, sq, hq, d = q.shape
    page, hk = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    for lane in range(b):
        n = int(cache_seqlens[lane])
        idx = [(int(block_table[lane, j // page]), j % page) for j in range(n)]
        keys = torch.stack([k_cache[blk, off] for blk, off in idx])  # [n, Hk, D]
        values = torch.stack([v_cache[blk, off] for blk, off in idx])
        for h in range(hq):
            kh = h // (hq // hk)
            scores = q[lane, :, h].float() @ keys[:, kh].float().T * softmax_scale  # [Sq, n]
            visible = torch.arange(n)[None, :] <= (n - sq + torch.arange(sq))[:, None]
            probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
            out[lane, :, h] = (probs @ values[:, kh].float()).to(q.dtype)
    return out


def step_rows(last: list[int], q_len: int) -> torch.Tensor:
    """Query positions as the step lays them out: q_len consecutive rows per lane ending at `last`."""
    return torch.tensor(last)[:, None] - torch.arange(q_len - 1, -1, -1)


def test_flash_attn_adapter_passes_what_flash_attn_documents(monkeypatch) -> None:
    import sys
    import types

    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(flash_attn_with_kvcache=flash_attn_with_kvcache_as_documented))
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
            got = paged_attention(q, kv, layer, paged_context(tables, positions, bs, kernel="flash_attn"))
            valid = positions >= 0  # rows at negative positions are padding: their output is never read
            torch.testing.assert_close(got[valid], ref[valid])


def npu_fused_infer_attention_score_as_documented(
    query, key, value, *, atten_mask, actual_seq_lengths, actual_seq_lengths_kv, block_table, block_size,
    num_heads, num_key_value_heads, scale, input_layout, sparse_mode,
):
    """torch_npu's documented semantics for paged KV: BSND query [B, S, N, D]; key/value caches in the BnBsH
    layout [num_blocks, block_size, Hkv * D]; key j of lane b is cache[block_table[b, j // bs], j % bs], for
    j < actual_seq_lengths_kv[b]; atten_mask [B, 1, S, KV_S] with True = masked (sparse_mode 0); query head h
    reads key head h // (N / Hkv); scores scaled by `scale`. Returns (attention_out, softmax_lse)."""
    assert input_layout == "BSND" and sparse_mode == 0 and block_table.dtype == torch.int32
    assert all(isinstance(n, int) for n in (*actual_seq_lengths, *actual_seq_lengths_kv))  # host integers
    b, sq, n_heads, d = query.shape
    assert n_heads == num_heads and key.shape[1] == block_size and key.shape[2] == num_key_value_heads * d
    assert atten_mask.dtype == torch.bool and tuple(atten_mask.shape) == (b, 1, sq, block_table.shape[1] * block_size)
    keys = key.view(key.shape[0], block_size, num_key_value_heads, d)
    values = value.view(keys.shape)
    out = torch.empty_like(query)
    for lane in range(b):
        n = actual_seq_lengths_kv[lane]
        idx = [(int(block_table[lane, j // block_size]), j % block_size) for j in range(n)]
        k = torch.stack([keys[blk, off] for blk, off in idx])  # [n, Hkv, D]
        v = torch.stack([values[blk, off] for blk, off in idx])
        for h in range(n_heads):
            kh = h // (n_heads // num_key_value_heads)
            scores = query[lane, :, h].float() @ k[:, kh].float().T * scale  # [S, n]
            probs = scores.masked_fill(atten_mask[lane, 0, :, :n], float("-inf")).softmax(-1)
            out[lane, :, h] = (probs @ v[:, kh].float()).to(query.dtype)
    return out, torch.zeros(1)


def test_npu_adapter_passes_what_torch_npu_documents(monkeypatch) -> None:
    import sys
    import types

    fake = types.SimpleNamespace(npu_fused_infer_attention_score=npu_fused_infer_attention_score_as_documented)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    torch.manual_seed(0)
    bs, heads, kv_heads, d = 8, 4, 2, 16
    kv = torch.randn(2, 2, 12 * bs, kv_heads, d)
    tables = torch.tensor([[3, 7, -1, -1], [5, 1, 9, 4], [2, -1, -1, -1]])
    for q_len, last in ((4, [12, 31, 3]), (2, [8, 17, 1]), (1, [10, 25, 0])):
        positions = step_rows(last, q_len)
        q = torch.randn(3, q_len, heads, d)
        for layer in (0, 1):
            ref = paged_attention(q, kv, layer, paged_context(tables, positions, bs, kernel="torch"))
            got = paged_attention(q, kv, layer, paged_context(tables, positions, bs, kernel="npu_fused_infer_attention"))
            torch.testing.assert_close(got, ref)  # every row, padding included: the same mask as the reference
