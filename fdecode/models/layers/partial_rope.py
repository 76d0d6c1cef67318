"""Partial RoPE: only the first `rotary_dim` channels of each head rotate, the rest pass through
(docs/design.md, "Hybrid models: Qwen3.5, Qwen3-Next, Qwen3.5-MoE and the recurrent state").

The rotated part follows `fdecode.models.layers.rope` exactly (rotate_half convention, every scaling type),
over a head of `rotary_dim` channels: inv_freq[i] = theta ** (-2i / rotary_dim). Qwen3.5's
multimodal RoPE (mrope) equals this for text, where the temporal, height and width positions coincide.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from fdecode.models.config import ModelConfig
from fdecode.models.layers.rope import RotaryEmbedding


def rotary_config(cfg: ModelConfig, rotary_dim: int) -> ModelConfig:
    """A plain `ModelConfig` whose heads are the rotated channels: what `RotaryEmbedding` reads."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(ModelConfig)}
    return ModelConfig(**{**fields, "head_dim": rotary_dim, "model_type": "llama"})


class PartialRotaryEmbedding(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary_dim: int) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim
        self.rope = RotaryEmbedding(rotary_config(cfg, rotary_dim))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [B, Q, heads, D]; positions: [B, Q] int64 -> [B, Q, heads, D]."""
        rot = self.rotary_dim
        return torch.cat([self.rope(x[..., :rot], positions), x[..., rot:]], dim=-1)
