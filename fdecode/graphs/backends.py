"""Backend eligibility, in one place.

Each backend has one function that, given the config, says `None` (it can
capture this step) or returns the reason it cannot. `choose_backend` is the only
caller: `"auto"` takes the best eligible backend, an explicit request that is
ineligible raises with the reason, or falls back to eager when `fallback=True`.

| backend     | device     | what it is                                               |
|-------------|------------|----------------------------------------------------------|
| `eager`     | any        | the reference: the same pure function, no compilation   |
| `aot_eager` | any        | Dynamo + AOTAutograd capture, eager kernels (capture checks) |
| `inductor`  | CPU, CUDA  | `torch.compile(fullgraph=True, dynamic=False)`           |
| `cudagraphs`| CUDA       | inductor + CUDA graph replay (`mode="reduce-overhead"`); KV leaves are marked static |

`auto` prefers cudagraphs on a CUDA device, then inductor, then eager.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable

import torch

from fdecode.config import DecodeConfig

# "auto" tries these in order.
PREFERENCE = ("cudagraphs", "inductor", "eager")


def _eager(cfg: DecodeConfig) -> str | None:
    return None


def _aot_eager(cfg: DecodeConfig) -> str | None:
    return None


def _inductor(cfg: DecodeConfig) -> str | None:
    device = torch.device(cfg.device)
    if device.type not in ("cpu", "cuda"):
        return f"inductor generates code for CPU and CUDA only, not {device.type!r}"
    if device.type == "cuda" and not torch.cuda.is_available():
        return "device is cuda but torch.cuda.is_available() is False"
    if device.type == "cpu" and not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return "inductor on CPU needs a C++ compiler (g++, c++ or clang++) on PATH"
    return None


def _cudagraphs(cfg: DecodeConfig) -> str | None:
    device = torch.device(cfg.device)
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, the step runs on {device.type!r}"
    if not torch.cuda.is_available():
        return "device is cuda but torch.cuda.is_available() is False"
    return _inductor(cfg)


ELIGIBILITY: dict[str, Callable[[DecodeConfig], str | None]] = {
    "eager": _eager,
    "aot_eager": _aot_eager,
    "inductor": _inductor,
    "cudagraphs": _cudagraphs,
}


def choose_backend(cfg: DecodeConfig, *, fallback: bool = False) -> tuple[str, str | None]:
    """Returns (backend that will run, why it is not the requested one or None)."""
    if cfg.backend == "auto":
        reasons = []
        for name in PREFERENCE:
            if name == "cudagraphs" and torch.device(cfg.device).type != "cuda":
                continue  # not a fallback: CUDA graphs are simply not a candidate off CUDA
            reason = ELIGIBILITY[name](cfg)
            if reason is None:
                return name, ("; ".join(reasons) or None)
            reasons.append(f"{name}: {reason}")
        raise AssertionError("eager is always eligible")
    reason = ELIGIBILITY[cfg.backend](cfg)
    if reason is None:
        return cfg.backend, None
    if not fallback:
        raise ValueError(f"backend {cfg.backend!r} cannot capture this step: {reason} (pass fallback=True to run eager)")
    return "eager", f"{cfg.backend}: {reason}"


def _flash_attn(cfg: DecodeConfig, head_dims: tuple[int, ...]) -> str | None:
    if torch.device(cfg.device).type != "cuda":
        return f"flash-attn runs on CUDA, the step runs on {torch.device(cfg.device).type!r}"
    if importlib.util.find_spec("flash_attn") is None:
        return "the flash-attn package is not installed (pip install flash-attn)"
    if cfg.dtype not in (torch.float16, torch.bfloat16):
        return f"flash-attn needs float16 or bfloat16, DecodeConfig.dtype is {cfg.dtype}"
    if cfg.block_size % 256:
        return f"flash-attn's paged KV needs block_size % 256 == 0, got {cfg.block_size}"
    if any(d % 8 or d > 256 for d in head_dims):
        return f"flash-attn needs head sizes that are multiples of 8 and <= 256, got {head_dims}"
    return None


ATTENTION_ELIGIBILITY: dict[str, Callable[[DecodeConfig, tuple[int, ...]], str | None]] = {
    "torch": lambda cfg, head_dims: None,  # the reference runs everywhere
    "flash_attn": _flash_attn,
}


def choose_attention(cfg: DecodeConfig, head_dims: tuple[int, ...], *, fallback: bool = False) -> tuple[str, str | None]:
    """Paged-attention kernel for the target and draft with these head sizes: (kernel, why not the
    requested / a device kernel, or None). "auto" takes flash_attn where eligible, else the reference."""
    if cfg.attention == "auto":
        reason = _flash_attn(cfg, head_dims)
        if reason is None:
            return "flash_attn", None
        # On CPU the reference *is* the kernel; on an accelerator say why no device kernel runs.
        return "torch", (None if torch.device(cfg.device).type == "cpu" else f"flash_attn: {reason}")
    reason = ATTENTION_ELIGIBILITY[cfg.attention](cfg, head_dims)
    if reason is None:
        return cfg.attention, None
    if not fallback:
        raise ValueError(f"attention {cfg.attention!r} cannot run this step: {reason} (pass fallback=True to use 'torch')")
    return "torch", f"{cfg.attention}: {reason}"
