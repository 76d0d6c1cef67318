"""The DeepSeek-V3 / GLM-4.5 MTP head ("nextn"): `MTPHead` of n modules around the family's decoder layer
(docs/design.md, "Mixture of experts: the MoE block, GLM-4.5, the DeepSeek-style MTP head").

    x_m    = eh_proj_m(cat([enorm_m(embed(token)), hnorm_m(hidden_in)], -1))   (embedding first)
    h      = layer_a(x_a)          draft forward j runs module a = j mod n, n = `num_nextn_predict_layers`
    logits = lm_head(norm_a(h))    (norm_m: module m's `shared_head.norm`)

Module k is checkpoint layer `model.layers.{num_hidden_layers + k}.*`, loaded as
`mtp.layers.k.{enorm, hnorm, eh_proj, norm, layer.*}` (`families.keys.rename_nextn`); the embedding
and LM head are the target's (`MTPHead.bind`). Each module has its own layer of the head's paged KV,
every row writes all n modules' keys and values (`mtp.run_one_layer_writing_all`), and the layer
output before the norm chains to the next forward. `layer(cfg, index)` builds the family's decoder
layer `index` (GLM-4.5: GQA + MoE; DeepSeek-V3: MLA + MoE), any module with `layers.DecoderLayer`'s
call signature and its `write_kv`; `rotary` is the family's RoPE; `norm` the RMSNorm class of the norms.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fdecode.models.config import ModelConfig
from fdecode.models.layers.decoder_layer import RMSNorm
from fdecode.models.mtp.head import MTPHead, mtp_input, run_one_layer_writing_all


class NextNModule(nn.Module):
    """One MTP module of the checkpoint: enorm, hnorm, eh_proj, its decoder layer, norm (shared_head.norm)."""

    def __init__(self, cfg: ModelConfig, layer: nn.Module, norm: Callable[[int, float], nn.Module]) -> None:
        super().__init__()
        self.enorm = norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.layer = layer
        self.norm = norm(cfg.hidden_size, cfg.rms_norm_eps)


class NextNMTPHead(MTPHead):
    def __init__(
        self,
        cfg: ModelConfig,
        *,
        layer: Callable[[ModelConfig, int], nn.Module],
        rotary: nn.Module,
        norm: Callable[[int, float], nn.Module] = RMSNorm,
    ) -> None:
        nn.Module.__init__(self)  # MTPHead builds Llama blocks; this head takes the family's
        n = max(cfg.mtp_num_layers, 1)
        self.config = cfg
        self.num_mtp_layers = n
        self.kv_config = cfg.replace(num_layers=n)
        self.layers = nn.ModuleList(NextNModule(cfg, layer(cfg, cfg.num_layers + k), norm) for k in range(n))
        self.rotary = rotary
        self._shared = None
        self.requires_grad_(False)

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
        """Module depth mod n over its x; every other module writes its keys and values of its own x."""
        active, h = run_one_layer_writing_all(
            [m.layer for m in self.layers],
            lambda i: mtp_input(self.layers[i], embedded, hidden_in),
            depth,
            positions,
            slots,
            kv,
            ctx,
            self.rotary,
        )
        return h, self.layers[active].norm(h)
