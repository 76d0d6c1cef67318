"""Backend eligibility and capture, in one place (docs/design.md, "Backends and kernels").

Each backend has one function that, given the config, the resolved models and
the draft kind, says `None` (it can capture this step) or returns the reason it
cannot. `choose_backend` is the only caller: `"auto"` takes the best eligible
backend, an explicit request that is ineligible raises with the reason, or, with
`fallback=True`, runs the next eligible backend in `PREFERENCE` order (eager at
worst) and says why. `capture` turns the step function into what runs.

Backends: `eager`, `aot_eager`, `dynamo` (any device), `inductor` (CPU, CUDA),
`cudagraphs` (CUDA; KV leaves marked static), `torchair` (Ascend NPU). `auto`
prefers cudagraphs on a CUDA device, torchair on an NPU, then inductor, then
eager. What each backend is: the cited section.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
from collections.abc import Callable

import torch

from fdecode.backends import cpu
from fdecode.config import BACKENDS, DecodeConfig
from fdecode.drafts import Drafter
from fdecode.graphs import torchair as npu
from fdecode.graphs.replay_outputs import owning_outputs
from fdecode.state.recurrent import is_hybrid

# "auto" tries these in order; `fallback=True` tries the ones after the requested backend.
PREFERENCE = ("cudagraphs", "torchair", "inductor", "eager")
# Backends that are candidates for "auto" only on their own device type (elsewhere they are not a fallback).
DEVICE_BOUND = {"cudagraphs": "cuda", "torchair": "npu"}
# Backends that replay captured graphs: their KV leaves keep one address (marked static: no copy, no re-record).
STATIC_KV = frozenset({"cudagraphs", "torchair"})
# Backends that compile one graph for every attention window (`DecodeConfig.dynamic_window`): the window's
# width is a symbolic size (`torch._dynamo.mark_dynamic`), so crossing into a wider window compiles nothing;
# CUDA graph trees record one replay per window width. torchair keeps a graph per window: GE graphs need
# static shapes, and the NPU attention kernel takes the window's length as a host integer.
DYNAMIC_WINDOW = frozenset({"dynamo", "aot_eager", "inductor", "cudagraphs"})

Check = Callable[[DecodeConfig, torch.nn.Module, torch.nn.Module, str], "str | None"]


def device_reason(cfg: DecodeConfig) -> str | None:
    """Why the step's device cannot be used at all on this machine (no backend can help), or None."""
    if cfg.device_type == "cuda" and not torch.cuda.is_available():
        return "device is cuda but torch.cuda.is_available() is False"
    if cfg.device_type == "npu":
        return npu.torch_npu_reason()  # eager runs without torchair; the torchair backend checks for it
    return None


def parameters_reason(models: tuple[torch.nn.Module, ...], device_type: str) -> str | None:
    """Every weight is a graph input: a weight on another device or with a strided layout breaks capture."""
    for model in models:
        for name, param in model.named_parameters():
            if param.device.type != device_type:
                return (
                    f"parameter {name} of {type(model).__name__} is on {param.device}, the step runs on {device_type}"
                )
            if not param.is_contiguous():
                return f"parameter {name} of {type(model).__name__} is not contiguous (stride {param.stride()})"
    return None


def _eager(cfg: DecodeConfig, target, draft, drafter: Drafter) -> str | None:
    return None


def _aot_eager(cfg: DecodeConfig, target, draft, drafter: Drafter) -> str | None:
    return None


def _dynamo(cfg: DecodeConfig, target, draft, drafter: Drafter) -> str | None:
    return None


def _inductor(cfg: DecodeConfig, target, draft, drafter: Drafter) -> str | None:
    if cfg.device_type not in ("cpu", "cuda"):
        return f"inductor generates code for CPU and CUDA only, not {cfg.device_type!r}"
    if cfg.device_type == "cuda":
        if not torch.cuda.is_available():
            return "device is cuda but torch.cuda.is_available() is False"
        from torch.utils._triton import has_triton

        if not has_triton():
            return "inductor on CUDA generates Triton kernels, and triton is not importable"
    if cfg.device_type == "cpu" and not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return "inductor on CPU needs a C++ compiler (g++, c++ or clang++) on PATH"
    return parameters_reason((target, draft), cfg.device_type)


def recurrent_reason(target, draft, drafter: Drafter) -> str | None:
    """Why graph replay cannot hold a hybrid model's recurrent state (`fdecode.state.recurrent`), or None."""
    if is_hybrid(target) or drafter.recurrent(draft):
        return (
            "the recurrent-state leaves of a hybrid model (Gated DeltaNet layers) are not yet held at static "
            "addresses (priming rebuilds them), so graph replay would copy or re-record them every step"
        )
    return None


def _cudagraphs(cfg: DecodeConfig, target, draft, drafter: Drafter) -> str | None:
    if cfg.device_type != "cuda":
        return f"CUDA graphs need a CUDA device, the step runs on {cfg.device_type!r}"
    reason = recurrent_reason(target, draft, drafter) or drafter.backend_reason("cudagraphs")
    if reason is not None:
        return reason
    # CUDA availability and triton are checked by _inductor, which CUDA graphs build on. A CPU tensor anywhere in the graph makes CUDA graph trees skip it ("skipping cudagraphs due to cpu
    # device"); `parameters_reason` (through _inductor) refuses weights left on another device.
    return _inductor(cfg, target, draft, drafter)


def _torchair(cfg: DecodeConfig, target, draft, drafter: Drafter) -> str | None:
    if cfg.device_type != "npu":
        return f"torchair captures on an Ascend NPU, the step runs on {cfg.device_type!r}"
    reason = recurrent_reason(target, draft, drafter) or drafter.backend_reason("torchair") or npu.availability_reason()
    if reason is not None:
        return reason
    if cfg.dtype not in npu.DTYPES:
        return f"dtype {cfg.dtype} is not supported by the NPU kernels (use one of {npu.DTYPES})"
    reason = parameters_reason((target, draft), cfg.device_type)
    if reason is not None or cfg.torchair_mode == "reduce-overhead":
        return reason
    return npu.ge_reason(cfg, hidden_size=target.config.hidden_size)


ELIGIBILITY: dict[str, Check] = {
    "eager": _eager,
    "aot_eager": _aot_eager,
    "dynamo": _dynamo,
    "inductor": _inductor,
    "cudagraphs": _cudagraphs,
    "torchair": _torchair,
}


def choose_backend(
    cfg: DecodeConfig, target, draft, drafter: Drafter, *, fallback: bool = False
) -> tuple[str, str | None]:
    """Returns (backend that will run, why it is not the requested one or None)."""
    device_type = cfg.device_type

    def first_eligible(names, reasons: list[str]) -> str:
        for name in names:
            if DEVICE_BOUND.get(name, device_type) != device_type:
                continue  # not a fallback: a device-bound backend is simply not a candidate elsewhere
            reason = ELIGIBILITY[name](cfg, target, draft, drafter)
            if reason is None:
                return name
            reasons.append(f"{name}: {reason}")
        raise AssertionError("eager is always eligible")

    if cfg.backend == "auto":
        reasons: list[str] = []
        name = first_eligible(PREFERENCE, reasons)
        return name, ("; ".join(reasons) or None)
    reason = ELIGIBILITY[cfg.backend](cfg, target, draft, drafter)
    if reason is None:
        return cfg.backend, None
    if not fallback:
        raise ValueError(
            f"backend {cfg.backend!r} cannot capture this step: {reason} "
            "(pass fallback=True to run the best eligible backend instead)"
        )
    reasons = [f"{cfg.backend}: {reason}"]
    later = PREFERENCE[PREFERENCE.index(cfg.backend) + 1 :] if cfg.backend in PREFERENCE else ("eager",)
    name = first_eligible(later, reasons)
    return name, "; ".join(reasons)


def auto_override() -> str | None:
    """The backend `FDECODE_BACKEND` names, which `backend="auto"` resolves to in this process (None: unset):
    a notebook or a script runs under `aot_eager` or `eager` without an edit (the notebook test does)."""
    name = os.environ.get("FDECODE_BACKEND") or None
    if name is not None and name not in BACKENDS:
        raise ValueError(f"FDECODE_BACKEND must be one of {BACKENDS}, got {name!r}")
    return name


def resolve_backend(
    cfg: DecodeConfig, target, draft, drafter: Drafter, *, fallback: bool = False
) -> tuple[DecodeConfig, str, str | None]:
    """`choose_backend`, plus the one fallback inside a backend: a torchair GE-graph request that GE
    cannot capture runs torchair's ACL graph mode (still one captured graph) rather than the next
    backend, with `fallback=True` or under "auto". Returns (the config that runs, backend, reason or None).
    `cfg.attention` must be resolved (`choose_attention`): the GE mode depends on it.
    A config asking for "auto" in a process with `FDECODE_BACKEND` set asks for that backend instead
    (`auto_override`)."""
    override = auto_override()
    if cfg.backend == "auto" and override is not None:
        cfg = dataclasses.replace(cfg, backend=override)
    asks_ge = cfg.torchair_mode == "max-autotune" and (
        (cfg.backend == "torchair" and fallback) or (cfg.backend == "auto" and cfg.device_type == "npu")
    )
    if asks_ge:
        reason = _torchair(cfg, target, draft, drafter)
        acl = dataclasses.replace(cfg, torchair_mode="reduce-overhead")
        if reason is not None and _torchair(acl, target, draft, drafter) is None:
            why = f"torchair GE graph: {reason}; running torchair's ACL graph mode instead"
            return without_regions(acl), "torchair", why
    name, reason = choose_backend(cfg, target, draft, drafter, fallback=fallback)
    return (without_regions(cfg) if name == "torchair" else cfg), name, reason


def without_regions(cfg: DecodeConfig) -> DecodeConfig:
    """`cfg` with layers unrolled: torchair's graph modes are not known to take nested compile regions
    (`invoke_subgraph`), so a torchair step runs every layer copy inline (`DecodeConfig.layer_regions`)."""
    return dataclasses.replace(cfg, layer_regions=False)


def capture(backend: str, fn: Callable, cfg: DecodeConfig, *, guard_filter: Callable | None = None) -> Callable:
    """What runs for `backend`: `fn` itself (eager) or its one-graph compilation. guard_filter: Dynamo's
    `guard_filter_fn` (Inductor only: `fdecode.graphs.stored` keeps the guards a file can hold)."""
    if backend == "eager":
        return fn
    if backend == "dynamo":  # torch's "eager" compile backend: Dynamo's graph, no AOTAutograd, no codegen
        return torch.compile(fn, backend="eager", fullgraph=True, dynamic=False)
    if backend == "cudagraphs":  # Inductor with CUDA graph replay; the outputs copied out of the graph pool
        return owning_outputs(torch.compile(fn, mode="reduce-overhead", fullgraph=True, dynamic=False))
    if backend == "torchair":
        return torch.compile(fn, backend=npu.backend(cfg), fullgraph=True, dynamic=False)
    options = {} if guard_filter is None else {"guard_filter_fn": guard_filter}
    options.update(cpu.inductor_options(cfg, backend))  # a tuned CPU step's passes (`fdecode.backends.cpu`)
    return torch.compile(fn, backend=backend, fullgraph=True, dynamic=False, options=options or None)


# (num_heads, num_kv_heads, head_dim) of each model whose attention a step runs (target, draft).
HeadShapes = tuple[tuple[int, int, int], ...]


def _flash_attn(cfg: DecodeConfig, shapes: HeadShapes) -> str | None:
    # Every unmet requirement at once, so one read of `step.attention_reason` says what to change. The
    # block size is the one a CUDA user meets first: at DecodeConfig's default (16), "auto" never picks it.
    if cfg.device_type != "cuda":
        return f"flash-attn runs on CUDA, the step runs on {cfg.device_type!r}"
    unmet = []
    if importlib.util.find_spec("flash_attn") is None:
        unmet.append("the flash-attn package is not installed (pip install flash-attn)")
    if cfg.dtype not in (torch.float16, torch.bfloat16):
        unmet.append(f"flash-attn needs float16 or bfloat16, DecodeConfig.dtype is {cfg.dtype}")
    if cfg.block_size % 256:
        default = DecodeConfig.__dataclass_fields__["block_size"].default
        which = " (the default)" if cfg.block_size == default else ""
        unmet.append(
            f"flash-attn's paged KV needs block_size % 256 == 0, got block_size={cfg.block_size}{which}: "
            "pass DecodeConfig(block_size=256) to run it"
        )
    head_dims = tuple(d for _, _, d in shapes)
    if any(d % 8 or d > 256 for d in head_dims):
        unmet.append(f"flash-attn needs head sizes that are multiples of 8 and <= 256, got {head_dims}")
    return "; ".join(unmet) or None


def _npu_fused_infer_attention(cfg: DecodeConfig, shapes: HeadShapes) -> str | None:
    # Constraints from torch_npu's documentation of npu_fused_infer_attention_score, for paged KV with
    # several query rows per lane (the verify): fp16/bf16 KV, block_size a multiple of 128 in 128..512,
    # query heads a multiple (at most 64x) of the KV heads.
    if cfg.device_type != "npu":
        return f"npu_fused_infer_attention_score runs on an Ascend NPU, the step runs on {cfg.device_type!r}"
    reason = npu.torch_npu_reason()
    if reason is not None:
        return reason
    if cfg.dtype not in (torch.float16, torch.bfloat16):
        return f"the NPU's paged attention with several query rows needs float16 or bfloat16, DecodeConfig.dtype is {cfg.dtype}"
    if cfg.block_size % 128 or not 128 <= cfg.block_size <= 512:
        return f"the NPU's paged attention with several query rows needs block_size in 128, 256, 384, 512, got {cfg.block_size}"
    for heads, kv_heads, _ in shapes:
        if heads % kv_heads or heads // kv_heads > 64:
            return f"the NPU's attention needs query heads a multiple (at most 64x) of KV heads, got {heads} and {kv_heads}"
    return None


ATTENTION_ELIGIBILITY: dict[str, Callable[[DecodeConfig, HeadShapes], str | None]] = {
    "torch": lambda cfg, shapes: None,  # the reference runs everywhere
    "flash_attn": _flash_attn,
    "npu_fused_infer_attention": _npu_fused_infer_attention,
}
# The device kernel "auto" takes where it is eligible (elsewhere, and otherwise, the reference).
DEVICE_ATTENTION = {"cuda": "flash_attn", "npu": "npu_fused_infer_attention"}


def latent_reason(target, draft) -> str | None:
    """Why the device attention kernels cannot read a model's cache: an MLA model's latent cache
    (`fdecode.ops.latent_kv`) is one shared head read with absorbed queries, not per-head K/V. None otherwise."""
    if any(getattr(getattr(m, "kv_config", None), "latent_kv", False) for m in (target, draft)):
        return (
            "the MLA latent cache (kv_lora_rank + qk_rope_head_dim values per token, read with kv_b_proj absorbed "
            "into the queries) is read by the torch reference only; flash_attn and npu_fused_infer_attention read "
            "per-head keys and values (a FlashMLA kernel is not wired in)"
        )
    return None


def choose_attention(
    cfg: DecodeConfig, shapes: HeadShapes, *, fallback: bool = False, latent: str | None = None
) -> tuple[str, str | None]:
    """Paged-attention kernel for models with these head shapes: (kernel, why not the requested one /
    not the device's kernel, or None). "auto" takes the device's kernel where eligible, else the reference.
    A reason names every requirement the kernel misses (e.g. on CUDA at DecodeConfig's default
    block_size=16, flash-attn's block_size % 256), so `step.attention_reason` says what to change.
    latent: `latent_reason` of the models; where set, only the reference can read their cache. A draft tree
    (`DecodeConfig.draft_topk` > 1) takes the kernel chosen here for the chains of its step and the reference
    for its trees' forwards, whose tree mask only the reference takes (`fdecode.ops.attention.paged_context`)."""

    def why(kernel: str) -> str | None:
        unmet = [ATTENTION_ELIGIBILITY[kernel](cfg, shapes)] + ([] if kernel == "torch" else [latent])
        return "; ".join(r for r in unmet if r) or None

    if cfg.attention == "auto":
        device_kernel = DEVICE_ATTENTION.get(cfg.device_type)
        if device_kernel is None:
            return "torch", None  # on CPU the reference *is* the kernel
        reason = why(device_kernel)
        if reason is None:
            return device_kernel, None
        return "torch", f"{device_kernel}: {reason}"
    reason = why(cfg.attention)
    if reason is None:
        return cfg.attention, None
    if not fallback:
        raise ValueError(
            f"attention {cfg.attention!r} cannot run this step: {reason} (pass fallback=True to use 'torch')"
        )
    return "torch", f"{cfg.attention}: {reason}"
