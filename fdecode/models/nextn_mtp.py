"""The DeepSeek-V3 / GLM-4.5 MTP head ("nextn"): `MTPHead` around whatever decoder layer the family has.

    h      = layer(eh_proj(cat([enorm(embed(token)), hnorm(hidden_in)], -1)))   (embedding first)
    logits = lm_head(shared_head.norm(h))

The checkpoint puts it after the target's layers, at `model.layers.{num_hidden_layers}.*`: `enorm`,
`hnorm`, `eh_proj`, `shared_head.norm`, the decoder layer's own keys (`self_attn.*`, `mlp.*`, its two
norms), and optional copies of the target's `embed_tokens` / `shared_head.head`, which the head does
not load: it borrows the target's (`MTPHead.bind`). `loading._rename` maps the keys (layout (b)).
As in vLLM's DeepSeek MTP, the head chains the layer output *before* the norm to its next forward.

`layer` is the family's decoder layer for index `num_hidden_layers` (GLM-4.5: GQA + MoE; DeepSeek-V3:
MLA + MoE), any module with `layers.DecoderLayer`'s call signature; `rotary` the family's RoPE;
`norm` the RMSNorm class of enorm / hnorm / shared_head.norm. The head's paged KV is that one layer
(`kv_config`: the family config with num_layers = 1). `num_nextn_predict_layers` must be 1 (every
DeepSeek-V3 / GLM-4.5 / 4.6 checkpoint's value); the family config refuses more.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from fdecode.models.config import ModelConfig
from fdecode.models.layers import RMSNorm
from fdecode.models.mtp import MTPHead


class NextNMTPHead(MTPHead):
    def __init__(
        self, cfg: ModelConfig, *, layer: nn.Module, rotary: nn.Module, norm: Callable[[int, float], nn.Module] = RMSNorm
    ) -> None:
        nn.Module.__init__(self)  # MTPHead builds Llama blocks; this head takes the family's
        self.config = cfg
        self.kv_config = cfg.replace(num_layers=1)
        self.enorm = norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.layer = layer
        self.norm = norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = rotary
        self._shared = None
        self.requires_grad_(False)
