"""The paged-attention interface: kernel eligibility (CPU-checkable), and the reference's window semantics."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import fdecode
from fdecode.graphs.backends import choose_attention
from fdecode.ops.attention import paged_attention, paged_context


def cfg(**overrides) -> fdecode.DecodeConfig:
    return fdecode.DecodeConfig(**{"num_draft_tokens": 2, "max_batch": 1, "max_seq_len": 512, **overrides})


@pytest.fixture
def flash_attn_installed(monkeypatch):
    """Pretend only that the package is importable: the eligibility boundary, never a result."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else real(name, *a))


def test_cpu_runs_the_reference_without_complaint() -> None:
    assert choose_attention(cfg(), (64, 64)) == ("torch", None)
    with pytest.raises(ValueError, match="flash-attn runs on CUDA"):
        choose_attention(cfg(attention="flash_attn"), (64, 64))
    kernel, reason = choose_attention(cfg(attention="flash_attn"), (64, 64), fallback=True)
    assert kernel == "torch" and "flash_attn: flash-attn runs on CUDA" in reason


def test_flash_attn_eligibility_on_cuda(flash_attn_installed) -> None:
    good = dict(device="cuda", dtype=torch.bfloat16, block_size=256)
    assert choose_attention(cfg(**good), (64, 128)) == ("flash_attn", None)
    for change, words in (
        (dict(dtype=torch.float32), "float16 or bfloat16"),
        (dict(block_size=16), "block_size % 256"),
    ):
        kernel, reason = choose_attention(cfg(**{**good, **change}), (64, 128))
        assert kernel == "torch" and words in reason
    kernel, reason = choose_attention(cfg(**good), (64, 100))
    assert kernel == "torch" and "multiples of 8" in reason


def test_flash_attn_missing_is_stated_on_cuda() -> None:
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here")
    kernel, reason = choose_attention(cfg(device="cuda", dtype=torch.float16, block_size=256), (64,))
    assert kernel == "torch" and "not installed" in reason


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
