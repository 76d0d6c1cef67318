"""RMSNorm variants of the Qwen3.5 family (the Llama-style `RMSNorm` lives in `layers.py`)
(docs/design.md, "Hybrid models: Qwen3.5, Qwen3-Next, Qwen3.5-MoE and the recurrent state").

- `OffsetRMSNorm`: `x * rsqrt(mean(x^2) + eps) * (1 + w)`, w initialised at 0, scaled in float32 and
  cast back once (Gemma / Qwen3-Next / Qwen3.5: every norm of the decoder, q/k norms included).
- `GatedRMSNorm`: `w * rmsnorm(o) * silu(z)` with a plain w, the DeltaNet output norm (per value head).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _normalised(x: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.to(torch.float32)
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


class OffsetRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (_normalised(x, self.eps) * (1.0 + self.weight.float())).to(x.dtype)


class GatedRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x, gate: [..., dim] -> [..., dim] in x's dtype."""
        normed = self.weight * _normalised(x, self.eps).to(x.dtype)
        return (normed * F.silu(gate.to(torch.float32))).to(x.dtype)
