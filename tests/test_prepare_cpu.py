"""The fused op compiled into a CPU step's kernels (`fdecode.backends.cpu.prepare`) equals the reference.

Inductor compiles a function calling `fdecode::prepare_next_draft` with the CPU step's pass: its generated
code no longer calls the op (the reference's ATen ops are fused into C++ kernels), and on random inputs of
each compiled shape, with a fully accepted lane, an L = 1 lane and an inactive lane in every case, positions
before 0 and past a lane's blocks, negative block ids and a strided hidden tensor (`support.prepare_cases`),
every output equals the reference bit for bit. Without the pass the op stays an extern call (so the check
of the generated code can fail). Graph captures still count the op as one node (tests/test_graph.py).
"""

from __future__ import annotations

import pytest
import torch
from support.prepare_cases import case_of
from torch._inductor.utils import run_and_get_code

import fdecode  # noqa: F401 - registers the op
from fdecode.backends.cpu.prepare import inline_prepare
from fdecode.backends.cpu.vec_isa import isa_options
from fdecode.ops.prepare import prepare_next_draft_reference

# Each shape is one compile; its trials vary the values. (K = 0: a window of one; bf16 and odd widths.)
SHAPES = (
    dict(batch=6, k=3, dtype=torch.float32, width=32, block_size=4, max_blocks=5),
    dict(batch=3, k=0, dtype=torch.bfloat16, width=3, block_size=1, max_blocks=2),
)
TRIALS = 20
NAMES = ("tokens", "hidden", "positions", "kv_lens", "slots")


def call_op(*args):
    return torch.ops.fdecode.prepare_next_draft(*args)


def compiled(passes: bool):
    options = {**isa_options(), **({"post_grad_custom_post_pass": inline_prepare} if passes else {})}
    return torch.compile(call_op, backend="inductor", fullgraph=True, dynamic=False, options=options)


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=["b6k3f32", "b3k0bf16"])
def test_compiled_cpu_op_equals_the_reference(shape):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(54)
    fn = compiled(passes=True)
    first = case_of(gen, "cpu", **shape)
    _, (code, *_) = run_and_get_code(fn, *first)
    assert "torch.ops.fdecode.prepare_next_draft" not in code  # compiled in, not an extern call of the reference
    for trial in range(TRIALS):
        args = first if trial == 0 else case_of(gen, "cpu", **shape)
        got, want = fn(*args), prepare_next_draft_reference(*args)
        for name, g, w in zip(NAMES, got, want):
            assert g.dtype == w.dtype and g.shape == w.shape, (trial, name)
            assert torch.equal(g, w), (trial, name, g, w, args)


@pytest.mark.slow
def test_without_the_pass_the_op_is_an_extern_call():
    torch._dynamo.reset()
    args = case_of(torch.Generator().manual_seed(0), "cpu", **SHAPES[0])
    _, (code, *_) = run_and_get_code(compiled(passes=False), *args)
    assert "torch.ops.fdecode.prepare_next_draft" in code
