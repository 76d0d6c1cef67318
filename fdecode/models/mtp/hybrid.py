"""The MTP head of a hybrid model (Qwen3.5, Qwen3.5-MoE, Qwen3-Next): `MTPHead` from the hybrid blocks
(docs/design.md, "Hybrid models: Qwen3.5, Qwen3-Next, Qwen3.5-MoE and the recurrent state").

    x      = fc([enorm(embed(token)); hnorm(hidden_in)])                    (embedding first)
    h      = layers[j mod n](x)          draft forward j of a step, n = `mtp_num_hidden_layers`
    out    = norm(h)
    logits = lm_head(out)

n gated full-attention layers (`hybrid.AttentionBlock`, MoE MLPs where the family has them), each with
its own layer of the head's paged KV; `fc`, the norms, and the target's embedding and LM head
(borrowed, `MTPHead.bind`) are shared by all n. Forward j >= 1 gets the normed `out` of forward j - 1
as `hidden_in`. Every row of every forward writes the keys and values of all n layers, each from the
row's `x`; only layer j mod n attends and proposes. Checkpoint keys `mtp.fc`, `mtp.pre_fc_norm_*`,
`mtp.layers.N.*`, `mtp.norm` are renamed by the family.
"""

from __future__ import annotations

import torch
from torch import nn

from fdecode.models.hybrid import AttentionBlock, init_hybrid_
from fdecode.models.hybrid_config import FULL, HybridConfig
from fdecode.models.layers.norms import OffsetRMSNorm
from fdecode.models.layers.partial_rope import PartialRotaryEmbedding
from fdecode.models.mtp.head import MTPHead, mtp_input, run_one_layer_writing_all


class HybridMTPHead(MTPHead):
    chains_normed = True  # vLLM's Qwen3-Next / Qwen3.5 MTP: the normed output is the next hidden

    def __init__(self, cfg: HybridConfig) -> None:
        nn.Module.__init__(self)  # MTPHead's parts are Llama blocks; these are the hybrid family's
        n = max(cfg.mtp_num_layers, 1)
        self.config = cfg
        self.num_mtp_layers = n
        self.kv_config = cfg.replace(num_layers=n, layer_types=(FULL,) * n)
        self.enorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.layers = nn.ModuleList(AttentionBlock(cfg, i) for i in range(n))
        self.norm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = PartialRotaryEmbedding(cfg, cfg.rotary_dim)
        self._shared = None
        self.requires_grad_(False)

    def init_random_(self, *, seed: int, std: float) -> None:
        init_hybrid_(self, seed=seed, std=std)

    def run_layers(
        self,
        embedded: torch.Tensor,
        hidden_in: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv: torch.Tensor,
        ctx,
        depth: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer depth mod n over the shared fc's x [B, Q, H]; the other layers only write their keys and values."""
        x = mtp_input(self, embedded, hidden_in)
        _, h = run_one_layer_writing_all(self.layers, lambda _: x, depth, positions, slots, kv, ctx, self.rotary)
        return h, self.norm(h)
