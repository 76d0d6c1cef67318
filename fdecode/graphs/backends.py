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
