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

from torch import nn

from fdecode.models.hybrid import AttentionBlock, init_hybrid_
from fdecode.models.hybrid_config import FULL, HybridConfig
from fdecode.models.mtp import MTPHead
from fdecode.models.norms import OffsetRMSNorm
from fdecode.models.partial_rope import PartialRotaryEmbedding


class HybridMTPHead(MTPHead):
    chains_normed = True  # vLLM's Qwen3-Next / Qwen3.5 MTP: the normed output is the next hidden

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

    def init_random_(self, *, seed: int, std: float) -> None:
        init_hybrid_(self, seed=seed, std=std)
