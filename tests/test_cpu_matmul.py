"""The CPU Inductor pass that runs few-row matmuls as weight @ rows^T (`fdecode.graphs.cpu_matmul`)."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fdecode.graphs.cpu_matmul import MAX_ROWS, weight_stationary

aten = torch.ops.aten


def linears(x, w, b):
    return torch.nn.functional.linear(x, w, b) * 2 + torch.nn.functional.linear(x, w)


def weight_first_mms(gm: torch.fx.GraphModule, w_name: str) -> int:
    """mm nodes whose left operand is the weight placeholder itself."""
    return sum(n.target is aten.mm.default and n.args[0].name == w_name for n in gm.graph.nodes)


def test_few_row_linears_are_rewritten_and_compute_the_same():
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(7, 5, generator=gen), torch.randn(7, generator=gen)
    for rows, rewritten in ((1, 0), (2, 2), (4, 2), (MAX_ROWS, 2), (MAX_ROWS + 1, 0)):
        x = torch.randn(rows, 5, generator=gen)
        gm = make_fx(linears, tracing_mode="fake")(x, w, b)
        weight_stationary(gm.graph)
        gm.recompile()
        w_name = [n.name for n in gm.graph.nodes if n.op == "placeholder"][1]
        assert weight_first_mms(gm, w_name) == rewritten, gm.code
        assert not any(n.target is aten.addmm.default for n in gm.graph.nodes) or not rewritten
        torch.testing.assert_close(gm(x, w, b), linears(x, w, b), rtol=1e-5, atol=1e-5)


def test_a_compiled_cpu_forward_matches_eager():
    """Through Inductor as `capture` passes it (rows of a verify, a bias, a 3-D input, and a one-output
    linear, whose transposed product is already row-major)."""
    for lin in (torch.nn.Linear(16, 24), torch.nn.Linear(16, 1, bias=False)):
        x = torch.randn(1, 4, 16)
        compiled = torch.compile(lin, backend="inductor", fullgraph=True, dynamic=False,
                                 options={"post_grad_custom_pre_pass": weight_stationary})
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
        return step.target(tokens, positions, torch.zeros_like(positions), kv, tables, block_size=bs,
                           attention="torch")[0]

    with torch.no_grad():
        want = forward(state.target_kv.clone())
        got = capture("inductor", forward, step.config)(state.target_kv.clone())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

