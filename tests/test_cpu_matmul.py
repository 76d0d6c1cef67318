"""The CPU Inductor pass that runs large linears by oneDNN, few-row matmuls of mid-sized weights as weight @ rows^T
and those of tiny weights as a fused reduction (`fdecode.backends.cpu.matmul`)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fdecode.backends.cpu.matmul import FUSED_BYTES, FUSED_WORK, MAX_ROWS, STATIONARY_BYTES, weight_stationary
from fdecode.backends.cpu.onednn_linear import MIN_BYTES as ONEDNN_BYTES
from fdecode.backends.cpu.onednn_linear import dtypes as onednn_dtypes
from fdecode.backends.cpu.onednn_linear import onednn_linear

aten = torch.ops.aten


def linears(x, w, b):
    return torch.nn.functional.linear(x, w, b) * 2 + torch.nn.functional.linear(x, w)


def weight_first_mms(gm: torch.fx.GraphModule, w_name: str) -> int:
    """mm nodes whose left operand is the weight placeholder itself."""
    return sum(n.target is aten.mm.default and n.args[0].name == w_name for n in gm.graph.nodes)


def mms(gm: torch.fx.GraphModule) -> int:
    return sum(n.target in (aten.mm.default, aten.addmm.default) for n in gm.graph.nodes)


def test_few_row_linears_are_rewritten_and_compute_the_same():
    """A weight of STATIONARY_BYTES: 2 to MAX_ROWS rows run as weight @ rows^T."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(STATIONARY_BYTES // 4 // 64, 64, generator=gen) / 8
    b = torch.randn(w.shape[0], generator=gen)
    for rows, rewritten in ((1, 0), (2, 2), (4, 2), (MAX_ROWS, 2), (MAX_ROWS + 1, 0)):
        x = torch.randn(rows, 64, generator=gen)
        gm = make_fx(linears, tracing_mode="fake")(x, w, b)
        weight_stationary(gm.graph)
        gm.recompile()
        w_name = [n.name for n in gm.graph.nodes if n.op == "placeholder"][1]
        assert weight_first_mms(gm, w_name) == rewritten, gm.code
        assert not any(n.target is aten.addmm.default for n in gm.graph.nodes) or not rewritten
        torch.testing.assert_close(gm(x, w, b), linears(x, w, b), rtol=1e-5, atol=1e-5)


def test_tiny_and_mid_weights():
    """A weight under FUSED_BYTES over rows x bytes up to FUSED_WORK becomes a reduction (no BLAS call left); more
    rows stay mm, and so does a weight from FUSED_BYTES to under STATIONARY_BYTES at any rows. The values are
    F.linear's."""
    gen = torch.Generator().manual_seed(0)
    tiny = torch.randn(FUSED_BYTES // 4 // 32 - 1, 32, generator=gen)
    mid = torch.randn(STATIONARY_BYTES // 4 // 32 - 1, 32, generator=gen)
    most = FUSED_WORK // (tiny.numel() * 4)  # the most rows fused with the tiny weight
    assert 2 <= most < MAX_ROWS
    small = torch.randn(8, 32, generator=gen)  # 1 KiB: fused up to MAX_ROWS rows
    for w, cases in (
        (tiny, ((1, 0), (most, 0), (most + 1, 2))),
        (small, ((1, 0), (MAX_ROWS, 0), (MAX_ROWS + 1, 2))),
        (mid, ((1, 2), (4, 2), (MAX_ROWS, 2))),
    ):
        b = torch.randn(w.shape[0], generator=gen)
        for rows, left in cases:
            x = torch.randn(rows, 32, generator=gen)
            gm = make_fx(linears, tracing_mode="fake")(x, w, b)
            weight_stationary(gm.graph)
            gm.recompile()
            assert mms(gm) == left, (w.shape, rows, gm.code)
            torch.testing.assert_close(gm(x, w, b), linears(x, w, b), rtol=1e-5, atol=1e-5)


def onednn_calls(gm: torch.fx.GraphModule) -> int:
    return sum(n.target is onednn_linear for n in gm.graph.nodes)


def test_large_weights_go_to_onednn_at_any_row_count():
    """A weight of ONEDNN_BYTES or more: one oneDNN call per linear, with or without a bias, 1 to 200 rows,
    float32 and (where this CPU's oneDNN runs it) bfloat16; no BLAS mm is left."""
    gen = torch.Generator().manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        if dtype not in onednn_dtypes():
            continue
        n = ONEDNN_BYTES // dtype.itemsize // 256  # [n, 256]: ONEDNN_BYTES exactly
        w = (torch.randn(n, 256, generator=gen) / 16).to(dtype)
        b = torch.randn(w.shape[0], generator=gen).to(dtype)
        for rows in (1, 5, 200):
            x = torch.randn(rows, 256, generator=gen).to(dtype)
            gm = make_fx(linears, tracing_mode="fake")(x, w, b)
            weight_stationary(gm.graph)
            gm.recompile()
            assert onednn_calls(gm) == 2, gm.code
            assert not any(n.target in (aten.mm.default, aten.addmm.default) for n in gm.graph.nodes), gm.code
            torch.testing.assert_close(gm(x, w, b), linears(x, w, b), rtol=tol, atol=tol)


def test_what_onednn_does_not_take():
    """A weight under ONEDNN_BYTES, a transposed (non-contiguous) weight, a bias of more than one value per
    output and (on a CPU whose oneDNN cannot run it) a bfloat16 weight stay with the BLAS call."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 256, generator=gen)
    small = torch.randn(ONEDNN_BYTES // 4 // 256 - 1, 256, generator=gen)
    big = torch.randn(ONEDNN_BYTES // 4 // 256, 256, generator=gen)

    def transposed(x, w):
        return torch.nn.functional.linear(x, w.t().contiguous().t())  # the weight as a transposed view

    def full_bias(x, w):
        return torch.addmm(torch.ones(3, w.shape[0]), x, w.t())

    for fn, args in (
        (lambda x, w: torch.nn.functional.linear(x, w), (x, small)),
        (full_bias, (x, big)),
        (transposed, (torch.randn(3, big.shape[0], generator=gen), big.t().contiguous())),
        *(
            []
            if torch.bfloat16 in onednn_dtypes()
            else [(lambda x, w: torch.nn.functional.linear(x, w), (x.bfloat16(), big.bfloat16()))]
        ),
    ):
        gm = make_fx(fn, tracing_mode="fake")(*args)
        weight_stationary(gm.graph)
        gm.recompile()
        assert onednn_calls(gm) == 0, gm.code
        tol = 2e-2 if args[1].dtype == torch.bfloat16 else 1e-4
        torch.testing.assert_close(gm(*args), fn(*args), rtol=tol, atol=tol)


@pytest.mark.slow  # compiles with Inductor: ~2 s on a warm cache, 20-50 s on a cold one (fresh clone, edited op)
def test_a_compiled_cpu_forward_matches_eager():
    """Through Inductor as `capture` passes it (rows of a verify, a bias, a 3-D input, a one-output linear,
    whose transposed product is already row-major; tiny weights in a fused reduction, a weight-stationary one
    and a oneDNN one)."""
    for lin in (
        torch.nn.Linear(16, 24),
        torch.nn.Linear(16, 1, bias=False),
        torch.nn.Linear(128, STATIONARY_BYTES // 4 // 128),
        torch.nn.Linear(512, 600),
    ):
        x = torch.randn(1, 4, lin.in_features)
        compiled = torch.compile(
            lin,
            backend="inductor",
            fullgraph=True,
            dynamic=False,
            options={"post_grad_custom_pre_pass": weight_stationary},
        )
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), lin(x), rtol=1e-5, atol=1e-5)


def test_a_compiled_moe_mla_verify_forward_matches_eager():
    """A DeepSeek-shaped target (MLA, a dense layer then MoE) over 3 verify rows, through `capture`: Inductor
    once fused the transposed products into vectorized kernels that read them wrongly (logits off by ~1.7)."""
    import fdecode
    from fdecode.bench import deepseek_v3
    from fdecode.graphs.backends import capture

    target = deepseek_v3(1024, 256, 2, seed=1)
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=1, max_seq_len=62, backend="eager")
    step = fdecode.compile(target, target, cfg)
    state = step.prefill([list(range(3, 27))], max_new_tokens=8)
    tables, bs = state.block_tables, cfg.block_size
    tokens = state.tokens.clamp_min(0)
    positions = state.base_pos[:, None] + torch.arange(3)

    def forward(kv):
        return step.target(
            tokens, positions, torch.zeros_like(positions), kv, tables, block_size=bs, attention="torch"
        )[0]

    with torch.no_grad():
        want = forward(state.target_kv.clone())
        got = capture("inductor", forward, step.config)(state.target_kv.clone())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_eager_linears_take_large_cpu_weights_only():
    """`OneDNNLinears` sends nn.Linear / F.linear of a large weight to oneDNN, 2-D and 3-D inputs alike, and
    leaves small weights and anything autograd must see to F.linear; the values are F.linear's."""
    from unittest import mock

    from fdecode.backends.cpu import onednn_linear as module

    calls = []

    def counted(x, w, b):
        calls.append(tuple(x.shape))
        return onednn_linear(x, w, b)

    big = torch.nn.Linear(256, ONEDNN_BYTES // 4 // 256)
    small = torch.nn.Linear(256, 8)
    x = torch.randn(2, 7, 256)
    with torch.no_grad():
        want_big, want_small = big(x), small(x[0])
    with mock.patch.object(module, "onednn_linear", counted):
        with torch.no_grad(), module.eager_linears("cpu"):
            got_big, got_small = big(x), small(x[0])
        assert calls == [(2, 7, 256)]
        with module.eager_linears("cpu"):  # grad on: autograd must see the product
            trained = big(x)
        assert calls == [(2, 7, 256)] and trained.requires_grad
    torch.testing.assert_close(got_big, want_big, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_small, want_small)
