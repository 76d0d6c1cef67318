"""Inductor's CPU vector ISA taken from the CPU's own flags, without its compile-and-load probes.

Before a process's first CPU kernel, Inductor picks the vector ISA its C++ uses (AVX-512 with VNNI,
AVX-512, AVX2, ...) from the ones /proc/cpuinfo lists, and tests each of them: it compiles a probe
against ATen's vector headers with that ISA's flags and loads it in a child process. On an empty cache
that is six C++ builds, ~9 s on a 2-core CPU before anything of the step compiles; on every later
process it is still the six child processes, ~1 s of a warm start (`python bench/cold_start.py --compare-isa`
measures it).

`config.cpp.vec_isa_ok = True` is Inductor's own switch for this ("force usage as specified, without
testing"): the pick stays the best ISA the CPU lists, only the base probes go. The small probes of ISA
extensions (VNNI, AVX-512 BF16, AMX) still run. fdecode sets it for its own CPU graphs, at compile and
at load, unless the user has chosen (`TORCHINDUCTOR_VEC_ISA_OK`, or the config set before). Inductor
caches the pick for the process, so a process that compiled another CPU graph first keeps its pick.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def isa_options() -> dict[str, object]:
    """The Inductor options that trust the CPU's ISA flags: none where the user has set `vec_isa_ok`."""
    from torch._inductor import config

    return {} if config.cpp.vec_isa_ok is not None else {"cpp.vec_isa_ok": True}


@contextlib.contextmanager
def trusted_isa() -> Iterator[None]:
    """Inductor's config with `isa_options()` applied, for loading a compiled graph outside `torch.compile`."""
    from torch._inductor import config

    with config.patch(isa_options()):
        yield
