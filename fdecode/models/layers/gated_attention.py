"""Gated full attention (Qwen3-Next / Qwen3.5) over the paged KV cache
(docs/design.md, "Hybrid models: Qwen3.5, Qwen3-Next, Qwen3.5-MoE and the recurrent state").

Per layer and call, as `fdecode.models.layers.decoder_layer.Attention` (write keys before attending, attend over
the lane's context window through `fdecode.ops.attention`), with three differences:
1. `q_proj` yields `[query | gate]` per head: a view `[..., heads, 2 * head_dim]`, then chunked;
2. q and k heads are normalised with `OffsetRMSNorm`, then only their first `rotary_dim` channels
   rotate (`PartialRotaryEmbedding`, passed in by the model);
3. the attention output is multiplied by `sigmoid(gate)` before `o_proj`.
"""

from __future__ import annotations

import torch
from torch import nn

from fdecode.models.config import ModelConfig
from fdecode.models.layers.norms import OffsetRMSNorm
from fdecode.ops.attention import PagedContext, paged_attention
from fdecode.ops.kv import write_kv


class GatedAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, 2 * q_dim, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = OffsetRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def keys_values(
        self, x: torch.Tensor, positions: torch.Tensor, rotary: nn.Module
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' keys (normed, rotated) and values [B, Q, Hkv, D], as the cache holds them."""
        b, q_len, _ = x.shape
        k = rotary(self.k_norm(self.k_proj(x).view(b, q_len, self.num_kv_heads, self.head_dim)), positions)
        return k, self.v_proj(x).view(b, q_len, self.num_kv_heads, self.head_dim)

    def write(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv: torch.Tensor,
        layer: int,
        ctx: PagedContext,
        rotary: nn.Module,
    ) -> None:
        """Only write the rows' keys and values at `slots` (an MTP layer that does not run at these rows)."""
        write_kv(kv, layer, slots, *self.keys_values(x, positions, rotary), way=ctx.kv_write)

    def forward(
        self,
        x: torch.Tensor,  # [B, Q, H]
        positions: torch.Tensor,  # [B, Q] int64
        slots: torch.Tensor,  # [B, Q] int64, where each token's k/v is written
        kv: torch.Tensor,  # [num_full_layers, 2, num_slots, Hkv, D], written in place
        layer: int,  # which layer of `kv` this is
        ctx: PagedContext,
        rotary: nn.Module,  # positions -> rotated heads (`PartialRotaryEmbedding`)
    ) -> torch.Tensor:
        b, q_len, _ = x.shape
        query, gate = self.q_proj(x).view(b, q_len, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = rotary(self.q_norm(query), positions)  # [B, Q, Hq, D]
        self.write(x, positions, slots, kv, layer, ctx, rotary)  # before attending, as in layers.Attention
        out = paged_attention(q, kv, layer, ctx) * torch.sigmoid(gate)  # [B, Q, Hq, D]
        return self.o_proj(out.reshape(b, q_len, self.num_heads * self.head_dim))
