"""The MTP head of a hybrid model (Qwen3.5): `MTPHead` built from the hybrid family's blocks.

    h      = AttentionBlock(fc([enorm(embed(token)); hnorm(hidden_in)]))     (embedding first)
    out    = norm(h)
    logits = lm_head(out)

One gated full-attention layer (`hybrid.AttentionBlock`, its own 1-layer paged KV), `OffsetRMSNorm`s,
the target's embedding and LM head borrowed (`MTPHead.bind`). As in vLLM's Qwen3-Next / Qwen3.5 MTP,
the head chains its *normed* output: draft forward j >= 1 gets `out` of forward j - 1 as `hidden_in`.
Checkpoint keys (`mtp.fc`, `mtp.pre_fc_norm_*`, `mtp.layers.0.*`, `mtp.norm`) are renamed by the loader.
"""

from __future__ import annotations

import torch
from torch import nn

from fdecode.models.hybrid import AttentionBlock, init_hybrid_
from fdecode.models.hybrid_config import FULL, HybridConfig
from fdecode.models.mtp import MTPHead
from fdecode.models.norms import OffsetRMSNorm
from fdecode.models.partial_rope import PartialRotaryEmbedding
from fdecode.ops.attention import paged_context


class HybridMTPHead(MTPHead):
    def __init__(self, cfg: HybridConfig) -> None:
        nn.Module.__init__(self)  # MTPHead's parts are Llama blocks; these are the hybrid family's
        self.config = cfg
        self.kv_config = cfg.replace(num_layers=1, layer_types=(FULL,))
        self.enorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.layer = AttentionBlock(cfg)
        self.norm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = PartialRotaryEmbedding(cfg, cfg.rotary_dim)
        self._shared = None
        self.requires_grad_(False)

    @classmethod
    def random(cls, cfg: HybridConfig, *, seed: int, std: float = 0.02, dtype: torch.dtype = torch.float32) -> HybridMTPHead:
        head = cls(cfg).to(dtype)
        init_hybrid_(head, seed=seed, std=std)
        return head

    def forward(
        self,
        tokens: torch.Tensor,  # [B, Q] int64
        positions: torch.Tensor,  # [B, Q] int64
        slots: torch.Tensor,  # [B, Q] int64
        kv: torch.Tensor,  # [1, 2, num_slots, Hkv, D], written in place
        block_tables: torch.Tensor,  # [B, max_blocks] int64
        *,
        block_size: int,
        hidden_in: torch.Tensor | None = None,  # [B, Q, H]
        attention: str = "torch",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns logits [B, Q, V] float32 and the normed output [B, Q, H] (what the next draft forward takes)."""
        if self._shared is None:
            raise RuntimeError("MTPHead.bind(target) must be called before forward")
        if hidden_in is None:
            raise ValueError("MTPHead needs hidden_in [B, Q, H]")
        embed_tokens, lm_head = self._shared
        x = torch.cat([self.enorm(embed_tokens(tokens)), self.hnorm(hidden_in)], dim=-1)  # [B, Q, 2H]
        ctx = paged_context(block_tables, positions, block_size, kernel=attention)
        out = self.norm(self.layer(self.eh_proj(x), positions, slots, kv, 0, ctx, self.rotary))  # [B, Q, H]
        return lm_head(out).float(), out
