"""Device attention kernels as their documentation describes them, in the plainest torch (CPU).

The device kernels cannot run here. What can be checked on CPU is fdecode's side of each call:
the layouts, lengths, block tables and masks it passes. Each function below implements one
kernel's *documented* semantics (nothing of fdecode's), and `as_modules` installs them where
fdecode imports the kernels from, so the adapters in `fdecode/ops/attention.py` run against them.
The kernels themselves are checked on their devices (tests/test_cuda.py, tests/test_npu.py).
"""

from __future__ import annotations

import sys
import types

import torch


def attend_lane(q, k_cache, v_cache, table, n: int, scale: float, masked) -> torch.Tensor:
    """One lane, as both kernels define it: q [Sq, Hq, D] over keys 0..n-1, key j read from
    cache[table[j // page], j % page] of a paged cache [blocks, page, Hk, D]; masked [Sq, n] True = not
    seen; query head h reads key head h // (Hq / Hk); softmax of scaled scores. Returns [Sq, Hq, D]."""
    page, hq, hk = k_cache.shape[1], q.shape[1], k_cache.shape[2]
    idx = [(int(table[j // page]), j % page) for j in range(n)]
    keys = torch.stack([k_cache[blk, off] for blk, off in idx])  # [n, Hk, D]
    values = torch.stack([v_cache[blk, off] for blk, off in idx])
    out = torch.empty_like(q)
    for h in range(hq):
        kh = h // (hq // hk)
        scores = q[:, h].float() @ keys[:, kh].float().T * scale  # [Sq, n]
        out[:, h] = (scores.masked_fill(masked, float("-inf")).softmax(-1) @ values[:, kh].float()).to(q.dtype)
    return out


def flash_attn_with_kvcache_as_documented(q, k_cache, v_cache, *, cache_seqlens, block_table, softmax_scale, causal):
    """flash-attn's documented semantics: q [B, Sq, Hq, D]; paged caches [num_blocks, page, Hk, D]; key j of
    lane b is k_cache[block_table[b, j // page], j % page]; lane b has cache_seqlens[b] keys; with causal,
    query row i sees keys j <= cache_seqlens[b] - Sq + i (the mask aligned to the bottom right); Hq / Hk
    query heads share a key head (head h reads key head h // (Hq / Hk))."""
    assert block_table.dtype == torch.int32 and cache_seqlens.dtype == torch.int32 and causal
    sq, page = q.shape[1], k_cache.shape[1]
    # The kernel trusts the lengths: one past the table's capacity reads past the block table (out of
    # bounds on the device; here, say so).
    capacity = block_table.shape[1] * page
    assert int(cache_seqlens.max()) <= capacity, (
        f"cache_seqlens {cache_seqlens.tolist()} read past a {capacity}-token block table"
    )
    out = torch.empty_like(q)
    for lane in range(q.shape[0]):
        n = int(cache_seqlens[lane])
        visible = torch.arange(n)[None, :] <= (n - sq + torch.arange(sq))[:, None]  # [Sq, n]
        out[lane] = attend_lane(q[lane], k_cache, v_cache, block_table[lane], n, softmax_scale, ~visible)
    return out


def npu_fused_infer_attention_score_as_documented(
    query,
    key,
    value,
    *,
    atten_mask,
    actual_seq_lengths,
    actual_seq_lengths_kv,
    block_table,
    block_size,
    num_heads,
    num_key_value_heads,
    scale,
    input_layout,
    sparse_mode,
):
    """torch_npu's documented semantics for paged KV: BSND query [B, S, N, D]; key/value caches in the BnBsH
    layout [num_blocks, block_size, Hkv * D]; key j of lane b is cache[block_table[b, j // bs], j % bs], for
    j < actual_seq_lengths_kv[b]; atten_mask [B, 1, S, KV_S] with True = masked (sparse_mode 0); query head h
    reads key head h // (N / Hkv); scores scaled by `scale`. Returns (attention_out, softmax_lse)."""
    assert input_layout == "BSND" and sparse_mode == 0 and block_table.dtype == torch.int32
    assert all(isinstance(n, int) for n in (*actual_seq_lengths, *actual_seq_lengths_kv))  # host integers
    b, sq, n_heads, d = query.shape
    assert list(actual_seq_lengths) == [sq] * b  # BSND: per-lane query lengths (not cumulative)
    assert n_heads == num_heads and key.shape[1] == block_size and key.shape[2] == num_key_value_heads * d
    assert atten_mask.dtype == torch.bool and tuple(atten_mask.shape) == (b, 1, sq, block_table.shape[1] * block_size)
    keys = key.view(key.shape[0], block_size, num_key_value_heads, d)
    values = value.view(keys.shape)
    out = torch.empty_like(query)
    for lane in range(b):
        n = actual_seq_lengths_kv[lane]
        out[lane] = attend_lane(query[lane], keys, values, block_table[lane], n, scale, atten_mask[lane, 0, :, :n])
    return out, torch.zeros(1)


def install(monkeypatch, kernel: str) -> None:
    """Make `import flash_attn` / `import torch_npu` inside the adapters find the documented semantics."""
    if kernel == "flash_attn":
        fake = types.SimpleNamespace(flash_attn_with_kvcache=flash_attn_with_kvcache_as_documented)
        monkeypatch.setitem(sys.modules, "flash_attn", fake)
    elif kernel == "npu_fused_infer_attention":
        fake = types.SimpleNamespace(npu_fused_infer_attention_score=npu_fused_infer_attention_score_as_documented)
        monkeypatch.setitem(sys.modules, "torch_npu", fake)
    else:
        raise ValueError(kernel)
