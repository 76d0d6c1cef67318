"""Multi-head latent attention (MLA, DeepSeek-V2/V3) over the paged latent cache
(docs/design.md, "Multi-head latent attention: DeepSeek-V3 and the latent cache").

Per layer and call (names mirror transformers' `DeepseekV3Attention`; H heads, shapes in
`fdecode.models.deepseek_config`): queries `q_proj(x)` or `q_b_proj(q_a_layernorm(q_a_proj(x)))`, per
head `[q_nope (Dn) | q_pe (Dr)]`; `kv_a_proj_with_mqa(x) = [c (R) | k_pe (Dr)]`, `c` normed, `k_pe` one
key shared by every head; RoPE on q_pe and k_pe only (de-interleaved first under `rope_interleave`);
the latent `[c | k_pe]` of each row is written into the cache before attending, then attention reads
the latents with `kv_b_proj` absorbed (`fdecode.ops.latent_kv`); `o_proj` over the H * Dv outputs.

Every call (prefill, verify, draft) takes this absorbed path; no per-head key or value of a context
position is formed.
"""

from __future__ import annotations

import torch
from torch import nn

from fdecode.models.deepseek_config import DeepseekV3Config
from fdecode.models.layers.decoder_layer import RMSNorm
from fdecode.models.layers.rope import RotaryEmbedding
from fdecode.ops.attention import PagedContext
from fdecode.ops.latent_kv import latent_attention, write_latent

# transformers builds q_a_layernorm and kv_a_layernorm with DeepseekV3RMSNorm's default eps, not rms_norm_eps.
_LATENT_NORM_EPS = 1e-6


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """[..., D] with pairs (x0, x1), (x2, x3), ... -> [x0, x2, ..., x1, x3, ...]."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


class MLAttention(nn.Module):
    def __init__(self, cfg: DeepseekV3Config) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.nope, self.rope, self.v_dim, self.rank = (
            cfg.qk_nope_head_dim,
            cfg.qk_rope_head_dim,
            cfg.v_head_dim,
            cfg.kv_lora_rank,
        )
        self.interleaved = cfg.rope_interleave
        self.scale = cfg.softmax_scale
        q_dim = cfg.num_heads * cfg.qk_head_dim
        self.low_rank_q = cfg.q_lora_rank is not None
        if not self.low_rank_q:
            self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=cfg.attention_bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, _LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, q_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, cfg.latent_width, bias=cfg.attention_bias)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, _LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(
            cfg.kv_lora_rank, cfg.num_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False
        )
        self.o_proj = nn.Linear(cfg.num_heads * cfg.v_head_dim, cfg.hidden_size, bias=cfg.attention_bias)

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if self.low_rank_q:
            return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return self.q_proj(x)

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding) -> torch.Tensor:
        return rotary(deinterleave(x) if self.interleaved else x, positions)

    def write(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv: torch.Tensor,
        layer: int,
        ctx: PagedContext,
        rotary: RotaryEmbedding,
    ) -> None:
        """Write the rows' latents `[kv_a_layernorm(c) | rotated k_pe]` at `slots`, and nothing else."""
        c, k_pe = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope], dim=-1)  # [B, Q, R], [B, Q, Dr]
        k_pe = self._rotate(k_pe[:, :, None], positions, rotary)[:, :, 0]  # [B, Q, Dr]
        write_latent(kv, layer, slots, torch.cat([self.kv_a_layernorm(c), k_pe], dim=-1), way=ctx.kv_write)

    def forward(
        self,
        x: torch.Tensor,  # [B, Q, H_model]
        positions: torch.Tensor,  # [B, Q] int64
        slots: torch.Tensor,  # [B, Q] int64, where each row's latent is written
        kv: torch.Tensor,  # [num_layers, 1, num_slots, 1, R + Dr] the latent cache leaf, written in place
        layer: int,  # which layer of `kv` this is
        ctx: PagedContext,
        rotary: RotaryEmbedding,  # over Dr channels (the model's; `head_dim` = qk_rope_head_dim)
    ) -> torch.Tensor:
        b, q_len, _ = x.shape
        q = self._queries(x).view(b, q_len, self.num_heads, self.nope + self.rope)  # [B, Q, H, Dn + Dr]
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        self.write(x, positions, slots, kv, layer, ctx, rotary)

        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.rank)  # [H, Dn + Dv, R]
        w_uk, w_uv = w[:, : self.nope], w[:, self.nope :]  # [H, Dn, R], [H, Dv, R]
        q_latent = torch.einsum("bqhn,hnr->bqhr", q_nope, w_uk)  # [B, Q, H, R]
        query = torch.cat([q_latent, self._rotate(q_pe, positions, rotary)], dim=-1)  # [B, Q, H, R + Dr]
        out = latent_attention(query, kv, layer, ctx, rank=self.rank, scale=self.scale)  # [B, Q, H, R]
        out = torch.einsum("bqhr,hvr->bqhv", out, w_uv)  # [B, Q, H, Dv]
        return self.o_proj(out.reshape(b, q_len, self.num_heads * self.v_dim))
