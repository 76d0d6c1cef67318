"""Rotary position embedding (RoPE), computed from positions on the fly
(docs/design.md, "Model families and the registry").

Each pair of channels (i, i + D/2) of a head is rotated by `position * inv_freq[i]` (HF Llama's
"rotate_half" convention: the two halves are the real and imaginary parts, not interleaved pairs).
Scaled variants only change `inv_freq`, plus, for YaRN, a factor `attention_scaling` on cos and sin:
linear (position interpolation) inv_freq / factor; llama3 (Llama 3.1) divides wavelengths longer
than original_ctx / low_freq_factor by `factor`, keeps those shorter than original_ctx /
high_freq_factor, and blends the band between linearly in `original_ctx / wavelength`; yarn (Peng et
al. 2023, arXiv:2309.00071) blends per dimension between inv_freq / factor and the original frequency
with a ramp over the dimensions that make between `beta_slow` and `beta_fast` rotations in the
original context, attention_scaling = 0.1 * ln(factor) + 1 ("mscale"). cos/sin are never tabulated
but computed from `positions` at every call, so any position (even past max_position_embeddings)
works and shapes stay fixed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from fdecode.models.config import ModelConfig

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_inv_freq(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies `[head_dim // 2]` float32 (on the CPU) and the cos/sin scaling factor."""
    params = cfg.rope_scaling_dict or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"unsupported RoPE type {rope_type!r}; fdecode implements {SUPPORTED_ROPE_TYPES}")
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported")
    dim = cfg.head_dim
    # Explicit device: the model may be built under a `torch.device("meta")` context by the loader.
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim  # [D/2]
    inv_freq = 1.0 / (cfg.rope_theta**exponents)  # [D/2] float32
    if rope_type == "default":
        return inv_freq, 1.0
    original_ctx = int(params.get("original_max_position_embeddings") or cfg.max_position_embeddings)
    if rope_type == "linear":
        return inv_freq / float(params["factor"]), 1.0
    if rope_type == "llama3":
        return _llama3(inv_freq, params, original_ctx), 1.0
    return _yarn(inv_freq, params, original_ctx, dim, cfg)


def _llama3(inv_freq: torch.Tensor, params: dict[str, object], original_ctx: int) -> torch.Tensor:
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    wavelen = 2 * math.pi / inv_freq  # [D/2]
    # smooth = 1 keeps the frequency, 0 divides it by `factor`; clamping covers the two outer bands.
    smooth = ((original_ctx / wavelen - low) / (high - low)).clamp(0.0, 1.0)  # [D/2]
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def _yarn(
    inv_freq: torch.Tensor, params: dict[str, object], original_ctx: int, dim: int, cfg: ModelConfig
) -> tuple[torch.Tensor, float]:
    factor = params.get("factor")
    # DeepSeek-style configs leave `factor` out and state it as the ratio of the two context lengths.
    factor = float(factor) if factor is not None else cfg.max_position_embeddings / original_ctx

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention_factor = mscale(factor, float(m)) / mscale(factor, float(m_all)) if m and m_all else mscale(factor)
    beta_fast = float(params.get("beta_fast") or 32)
    beta_slow = float(params.get("beta_slow") or 1)
    base = cfg.rope_theta

    def dim_for_rotations(rotations: float) -> float:
        # Dimension index whose wavelength fits `rotations` times in the original context.
        return dim * math.log(original_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_for_rotations(beta_fast), dim_for_rotations(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid 0 / 0 in the ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)  # [D/2]
    # ramp = 0 (fast-rotating dims) keeps the original frequency; ramp = 1 interpolates.
    inv_freq = inv_freq * (1 - ramp) + (inv_freq / factor) * ramp
    return inv_freq, float(attention_factor)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float) -> torch.Tensor:
    """Rotate `x` by its positions.

    x: [B, Q, heads, D]; positions: [B, Q] int64; inv_freq: [D/2] float32. Returns [B, Q, heads, D], x.dtype.
    """
    angles = positions.to(torch.float32)[..., None] * inv_freq.to(torch.float32)  # [B, Q, D/2]
    angles = torch.cat((angles, angles), dim=-1)[:, :, None, :]  # [B, Q, 1, D]
    cos, sin = angles.cos() * scaling, angles.sin() * scaling  # [B, Q, 1, D]
    x32 = x.to(torch.float32)  # [B, Q, heads, D]
    return (x32 * cos + _rotate_half(x32) * sin).to(x.dtype)


class RotaryEmbedding(torch.nn.Module):
    """Holds `inv_freq` as a non-persistent buffer that follows the model's device but stays float32."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        inv_freq, self.scaling = rope_inv_freq(cfg)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [D/2] float32

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> RotaryEmbedding:
        super()._apply(fn, recurse)
        # `model.to(torch.bfloat16)` would round the frequencies; recompute them in float32 on the new device.
        self.inv_freq = rope_inv_freq(self.config)[0].to(self.inv_freq.device)
        return self

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [B, Q, heads, D]; positions: [B, Q] int64 -> [B, Q, heads, D]."""
        return apply_rope(x, positions, self.inv_freq, self.scaling)
