"""Packed copies of CPU linear weights for oneDNN (`fdecode.backends.cpu.onednn_packed`): the same products as the
weight as it lies, at every row count, never stale, dropped with their weight."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

from fdecode.backends.cpu import onednn_packed
from fdecode.backends.cpu.onednn_linear import available, dtypes, onednn_linear

pytestmark = pytest.mark.skipif(not available(), reason="this torch build has no oneDNN")


def weight(n=96, k=64, seed=0, dtype=torch.float32):
    return (torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) / 8).to(dtype)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_a_packed_weight_computes_the_plain_product_at_every_row_count(dtype, tol):
    if dtype not in dtypes():
        pytest.skip(f"oneDNN does not run {dtype} on this CPU (no AVX-512 BF16, AMX or AVX-NE-CONVERT)")
    w, b = weight(dtype=dtype), weight(96, 1, seed=1, dtype=dtype)[:, 0].contiguous()
    done = onednn_packed.pack(w)
    if dtype == torch.bfloat16 and done is None:  # oneDNN packs bfloat16 only with AVX-512 or AVX-NE-CONVERT
        assert onednn_packed.packed(w) is None
    else:
        assert done.nbytes == w.numel() * w.element_size() and not done.in_place  # no file's bytes: beside
        assert onednn_packed.packed(w) is not None
        assert onednn_packed.pack(w) is None  # kept already
    gen = torch.Generator().manual_seed(2)
    for rows in (1, 2, 3, onednn_packed.MIN_ROWS, 5, 8, 33):
        x = torch.randn(rows, 64, generator=gen).to(dtype)
        for bias in (None, b):
            torch.testing.assert_close(onednn_linear(x, w, bias), F.linear(x, w, bias), rtol=tol, atol=tol)
    x = torch.randn(2, 3, 64, generator=gen).to(dtype)  # a prefill's [B, T, H]
    torch.testing.assert_close(onednn_linear(x, w, b), F.linear(x, w, b), rtol=tol, atol=tol)
    torch.testing.assert_close(onednn_linear(x[:1, :1], w, b), F.linear(x[:1, :1], w, b), rtol=tol, atol=tol)


def test_a_weight_changed_in_place_is_packed_again():
    layer, x = torch.nn.Linear(64, 96), torch.randn(2, 64)
    onednn_packed.pack(layer.weight)
    before = onednn_linear(x, layer.weight, layer.bias)
    with torch.no_grad():
        layer.weight.mul_(-2)
    torch.testing.assert_close(onednn_linear(x, layer.weight, None), -2 * (before - layer.bias))
    layer.load_state_dict({"weight": weight(seed=4), "bias": layer.bias.detach()})  # copies in place
    assert onednn_packed.packed(layer.weight) is not None
    torch.testing.assert_close(onednn_linear(x, layer.weight, layer.bias), layer(x), rtol=1e-5, atol=1e-5)
    layer.weight.data.copy_(weight(seed=5))  # through .data: no version moves; repack says so
    onednn_packed.repack(layer)
    torch.testing.assert_close(onednn_linear(x, layer.weight, layer.bias), layer(x), rtol=1e-5, atol=1e-5)


def test_a_copy_is_dropped_with_its_weight_and_never_reaches_a_new_one():
    gc.collect()  # other tests' weights: gone before counting
    w = weight(seed=5)
    onednn_packed.pack(w)
    kept = onednn_packed.kept_bytes()
    key = (w.data_ptr(), w.shape, w.dtype)
    del w
    gc.collect()
    assert onednn_packed.kept_bytes() == kept - 96 * 64 * 4
    fresh = weight(seed=6)  # may lie at the freed weight's address: it has no copy
    if (fresh.data_ptr(), fresh.shape, fresh.dtype) == key:
        assert onednn_packed.packed(fresh) is None
    x = torch.randn(3, 64)
    torch.testing.assert_close(onednn_linear(x, fresh, None), F.linear(x, fresh), rtol=1e-5, atol=1e-5)


def test_weights_not_packed_run_as_they_lie():
    w, x = weight(seed=7), torch.randn(5, 64)
    assert onednn_packed.packed(w) is None
    torch.testing.assert_close(onednn_linear(x, w, None), F.linear(x, w), rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        frozen = weight(seed=8)
    assert onednn_packed.pack(frozen) is None and onednn_packed.packed(frozen) is None


def test_a_compiled_forward_reads_the_packed_weight_and_follows_its_edits(monkeypatch):
    """Inductor calls the op with the weight its graph takes as an input: the packed copy is found, and an
    in-place edit between calls reaches the compiled forward (the same graph, no recompile)."""
    from fdecode.backends.cpu.matmul import weight_stationary

    lin = torch.nn.Linear(512, 600)  # 1.2 MB: oneDNN's
    onednn_packed.pack(lin.weight)
    compiled = torch.compile(
        lin, backend="inductor", fullgraph=True, dynamic=False, options={"post_grad_custom_pre_pass": weight_stationary}
    )
    calls, real = [], onednn_packed.linear
    monkeypatch.setattr(onednn_packed, "linear", lambda x, w, b: calls.append(x.shape) or real(x, w, b))
    with torch.no_grad():
        for rows in (1, 4):
            x = torch.randn(rows, 512)
            torch.testing.assert_close(compiled(x), lin(x), rtol=1e-5, atol=1e-5)
        lin.weight.mul_(0.5)
        torch.testing.assert_close(compiled(x), lin(x), rtol=1e-5, atol=1e-5)
    assert calls == [(4, 512)] * 2  # one row reads the weight as it lies


def test_compile_packs_a_cpu_inductor_steps_large_linears_only():
    import fdecode
    from fdecode.models import LlamaModel, ModelConfig

    cfg = ModelConfig(
        vocab_size=4096, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16
    )
    model = LlamaModel.random(cfg, seed=0)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears[-1] is model.lm_head  # 4096 x 64 float32: 1 MiB, the only weight oneDNN takes
    for backend, pack_weights, packs in (("eager", True, False), ("inductor", False, False), ("inductor", True, True)):
        step = fdecode.compile(
            model,
            model,
            fdecode.DecodeConfig(
                num_draft_tokens=2, max_batch=1, max_seq_len=32, backend=backend, pack_weights=pack_weights
            ),
            announce=False,
        )
        assert step.target.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()  # shared
        assert (onednn_packed.packed(model.lm_head.weight) is not None) == packs, (backend, pack_weights)
        assert not any(onednn_packed.packed(m.weight) is not None for m in linears[:-1])


def test_views_of_one_weight_share_a_copy_kept_while_any_lives():
    """Two steps over one model hold views of its parameters: freeing one view keeps the other's copy."""
    gc.collect()
    before = onednn_packed.kept_bytes()
    base = weight(seed=9)
    first, second = base.view_as(base), base.view_as(base)
    assert onednn_packed.pack(first).nbytes == base.numel() * 4 and onednn_packed.pack(second) is None
    del first
    gc.collect()
    assert onednn_packed.packed(second) is not None
    del second, base
    gc.collect()
    assert onednn_packed.kept_bytes() == before
