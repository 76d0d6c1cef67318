"""A CPU graph's C++ kernels built a few to a library (`fdecode.backends.cpu.kernel_batches`): the graph computes
what it computes with Inductor's one library per kernel, builds one library per compile worker, and falls
back to one per kernel, with a notice, where a batch does not build."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from support.kernel_files import ENTRY, kernel_files

from fdecode.backends.cpu import kernel_batches
from fdecode.backends.cpu.kernel_batches import batch_source, batched_cpu_kernels, groups


def several_kernels(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Three or more Inductor kernels, split by the matmuls (extern calls) between them."""
    a = torch.softmax(x * 1.5, dim=-1)
    b = torch.nn.functional.silu(a @ w) * a.sum(-1, keepdim=True)
    c = (b @ w.t()).cumsum(0)
    return torch.where(c > 0, c.tanh(), c.argmax(-1, keepdim=True).to(c.dtype))


def compile_fresh(batched: bool):
    """`several_kernels` compiled by Inductor in an empty cache; returns (output, the cache's C++ files)."""
    from torch._inductor.utils import fresh_cache

    torch.manual_seed(0)
    x, w = torch.randn(8, 32), torch.randn(32, 32)
    torch._dynamo.reset()
    with fresh_cache():
        fn = torch.compile(several_kernels, backend="inductor", fullgraph=True, dynamic=False)
        if batched:
            with batched_cpu_kernels():
                out = fn(x, w)
        else:
            out = fn(x, w)
        sources = kernel_files(Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]))
    torch._dynamo.reset()
    return out, sources, several_kernels(x, w)


def test_groups_balance_sizes_and_are_the_same_each_time() -> None:
    sizes = [50, 10, 40, 30, 20, 5]
    parts = groups(sizes, 2)
    assert sorted(i for part in parts for i in part) == list(range(6))
    totals = sorted(sum(sizes[i] for i in part) for part in parts)
    assert totals == [75, 80]  # largest first into the lighter group
    assert parts == groups(list(sizes), 2)
    assert groups(sizes, 1) == [list(range(6))]
    assert groups([7, 7], 8) == [[0], [1]]  # never an empty group


def test_a_batch_renames_each_kernel_and_binds_it() -> None:
    one = "#include <torch/csrc/inductor/cpp_prefix.h>\n" + ENTRY + "const float* in_ptr0, float* out_ptr0)\n{ }\n"
    two = one.replace("float* out_ptr0", "float* out_ptr0, const int64_t ks0")
    source = batch_source([(["const float*", "float*"], one), (["const float*", "float*", "const int64_t"], two)])
    assert source.count("#include <torch/csrc/inductor/cpp_prefix.h>") == 1
    assert ENTRY not in source
    assert 'extern "C" void kernel_0(' in source and 'extern "C" void kernel_1(' in source
    assert (
        "kernel_1(fdecode_arg<float*>(args, 0), fdecode_arg<float*>(args, 1), fdecode_arg<int64_t>(args, 2))" in source
    )
    assert '{"kernel_0", kernel_0_py' in source and "PyInit_kernel" in source


def test_a_graph_builds_one_library_and_computes_what_it_did() -> None:
    """One C++ file per compile worker (one under xdist: fdecode's tests compile in the process) instead of
    one per kernel, and the output of Inductor's own one-file-per-kernel build."""
    from torch._inductor.async_compile import get_compile_threads

    single, single_sources, eager = compile_fresh(batched=False)
    assert len(single_sources["single"]) >= 3 and not single_sources["batched"]
    batched, batched_sources, _ = compile_fresh(batched=True)
    assert not batched_sources["single"]
    assert len(batched_sources["batched"]) == min(get_compile_threads(), len(single_sources["single"]))
    assert torch.equal(batched, single)
    torch.testing.assert_close(batched, eager)


def test_a_batch_that_does_not_build_falls_back_to_one_library_a_kernel(monkeypatch, capsys) -> None:
    monkeypatch.setattr(kernel_batches, "batch_source", lambda kernels: "this is not C++;\n")
    out, sources, eager = compile_fresh(batched=True)
    torch.testing.assert_close(out, eager)
    assert len(sources["single"]) >= 3
    assert "could not build" in capsys.readouterr().err


def test_inductor_is_itself_again_after_the_context() -> None:
    from torch._inductor.async_compile import AsyncCompile

    before = (AsyncCompile.cpp_pybinding, AsyncCompile.wait)
    with batched_cpu_kernels(), batched_cpu_kernels():
        assert AsyncCompile.cpp_pybinding is not before[0]
    assert (AsyncCompile.cpp_pybinding, AsyncCompile.wait) == before
    with pytest.raises(RuntimeError), batched_cpu_kernels():
        raise RuntimeError("a compile that fails")
    assert (AsyncCompile.cpp_pybinding, AsyncCompile.wait) == before


def one_more_kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`several_kernels` with one more kernel after it, behind another matmul."""
    return torch.log1p((several_kernels(x, w) @ w).abs())


def kernels_in(paths) -> int:
    return sum(path.read_text().count('extern "C" void kernel_') for path in paths)


def test_a_second_graph_builds_only_the_kernels_no_library_holds() -> None:
    from torch._inductor import config
    from torch._inductor.utils import fresh_cache

    torch.manual_seed(0)
    x, w = torch.randn(8, 32), torch.randn(32, 32)
    torch._dynamo.reset()
    with fresh_cache(), config.patch(fx_graph_cache=False):
        folder = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        with batched_cpu_kernels():
            first = torch.compile(several_kernels, fullgraph=True, dynamic=False)(x, w)
        built = kernel_files(folder)["batched"]
        torch._dynamo.reset()
        with batched_cpu_kernels():
            second = torch.compile(one_more_kernel, fullgraph=True, dynamic=False)(x, w)
        new = [path for path in kernel_files(folder)["batched"] if path not in built]
        counts = kernels_in(built), kernels_in(new)
    torch._dynamo.reset()
    torch.testing.assert_close(first, several_kernels(x, w))
    torch.testing.assert_close(second, one_more_kernel(x, w))
    assert counts[0] >= 3 and 1 <= counts[1] < counts[0]  # the shared kernels come from the first library
