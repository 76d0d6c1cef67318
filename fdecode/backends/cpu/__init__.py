"""The CPU backend's tuning of Inductor, behind one switch (docs/design.md, "The CPU backend").

Everything here patches or extends Inductor internals for CPU steps, so it is the one place a torch
upgrade can break:

    matmul.py           an Inductor pass running a step's linears by oneDNN from the weight as it lies
    onednn_linear.py    the oneDNN linear op, and eager prefill linears that match the graphs' (`eager_linears`)
    onednn_packed.py    oneDNN's packed layout of a large weight, in place of a checkpoint file's (`pack_linears`)
    file_pages.py       a weight that is a mapped checkpoint file's bytes, and giving its pages back
    packed_store.py     packed layouts of checkpoint weights kept on disk, mapped by later processes
    onednn_blob.py      a packed layout as bytes, and a packed weight over bytes fdecode maps
    kernel_batches.py   a graph's C++ kernels built as a few shared libraries, not one each
    codegen_rules.py    Inductor's dtype rules bound once per compile, not once per generated op
    prepare.py          an Inductor pass compiling `fdecode::prepare_next_draft` into the step's C++ kernels
    vec_isa.py          the CPU's vector ISA trusted from its flags, without Inductor's probe builds

The rest of fdecode asks this package only (`inductor_options`, `compiling`, `loading`, `packs_weights`,
`pack_linears`, `packed_folder`, `eager_linears`). `FDECODE_CPU_TUNING=0` in the environment turns all of it off: CPU steps
then compile with Inductor's defaults, prefill runs plain linears and nothing is packed (slower, never
wrong: the tests pin the same tokens either way).
"""

from __future__ import annotations

import contextlib
import os

ENABLED = os.environ.get("FDECODE_CPU_TUNING", "1") != "0"  # the one switch


def enabled(cfg, backend: str) -> bool:
    """Whether a step of `cfg` compiled by `backend` gets the CPU tuning: Inductor on the CPU, switch on."""
    return ENABLED and backend == "inductor" and cfg.device_type == "cpu"


def inductor_options(cfg, backend: str) -> dict[str, object]:
    """Inductor options of a tuned CPU step: the oneDNN linears pass, the fused op compiled in place of its
    Python reference, the trusted vector ISA; {} otherwise."""
    if not enabled(cfg, backend):
        return {}
    from fdecode.backends.cpu.matmul import weight_stationary
    from fdecode.backends.cpu.prepare import inline_prepare
    from fdecode.backends.cpu.vec_isa import isa_options

    return {
        "post_grad_custom_pre_pass": weight_stationary,
        "post_grad_custom_post_pass": inline_prepare,
        **isa_options(),
    }


def compiling():
    """The context a CPU step's first compile of a graph runs in: its kernels built in a few batches, the
    code generator's dtype rules bound once."""
    return contextlib.nullcontext() if not ENABLED else _tuned_compile()


@contextlib.contextmanager
def _tuned_compile():
    from fdecode.backends.cpu.codegen_rules import rules_once
    from fdecode.backends.cpu.kernel_batches import batched_cpu_kernels

    with batched_cpu_kernels(), rules_once():
        yield


def loading():
    """The context a stored CPU graph loads in: the vector ISA trusted as at compile time."""
    if not ENABLED:
        return contextlib.nullcontext()
    from fdecode.backends.cpu.vec_isa import trusted_isa

    return trusted_isa()


def packs_weights(cfg, backend: str) -> bool:
    """Whether `fdecode.compile` keeps oneDNN's layout of the large linear weights (`DecodeConfig.pack_weights`):
    where a tuned step's graphs run them by oneDNN."""
    from fdecode.backends.cpu.onednn_linear import available

    return cfg.pack_weights and enabled(cfg, backend) and available()


def pack_linears(*models):
    """Pack the models' large linear weights (`onednn_linear.pack_linears`): a `Packing`, bytes by where."""
    from fdecode.backends.cpu.onednn_linear import pack_linears as pack

    return pack(*models)


def packed_folder():
    """Where packed layouts of checkpoint weights are stored (`packed_store.folder`), None where nowhere."""
    from fdecode.backends.cpu.packed_store import folder

    return folder()


def eager_linears(device_type: str):
    """The context prefill's eager forwards run in: large CPU linears by oneDNN, as the tuned graphs run them."""
    if not ENABLED:
        return contextlib.nullcontext()
    from fdecode.backends.cpu.onednn_linear import eager_linears as linears

    return linears(device_type)
