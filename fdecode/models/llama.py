"""Llama-family decoder LM (Llama, Qwen2, Qwen3) over a caller-owned paged KV cache
(docs/design.md, "Model families and the registry").

The module owns weights only. The KV cache is an argument written in place
(a state leaf under the donation contract, see docs/design.md), so one forward is a
pure function of (weights, tokens, positions, slots, kv, block_tables) plus
that write, with fixed shapes, ready for `torch.compile(fullgraph=True)`.
Submodule names mirror HF's `model.*` / `lm_head` so checkpoints map 1:1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from fdecode.models.config import ModelConfig
from fdecode.models.decoder_lm import DecoderLM
from fdecode.models.layers.decoder_layer import DecoderLayer, RMSNorm
from fdecode.models.layers.rope import RotaryEmbedding
from fdecode.models.regions import call_layer, layer_indices
from fdecode.ops.attention import TreeRows, paged_context

if TYPE_CHECKING:
    from fdecode.models.mtp.head import MTPHead


class LlamaModel(DecoderLM):
    """`layer(cfg, i)` / `rotary`: the decoder layer i and the RoPE of a family built on this forward
    (DeepSeek-V3: MLA + MoE layers; default the Llama `DecoderLayer` and `RotaryEmbedding(cfg)`)."""

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        layer: Callable[[ModelConfig, int], nn.Module] | None = None,
        rotary: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        make = (lambda c, _: DecoderLayer(c)) if layer is None else layer
        self.layers = nn.ModuleList(make(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(cfg) if rotary is None else rotary
        self.tie_weights_()
        # Set by the loader when the checkpoint carries a multi-token-prediction head.
        self.mtp: MTPHead | None = None
        self.requires_grad_(False)  # inference only: no autograd graph in eager or compiled calls

    def forward(
        self,
        tokens: torch.Tensor,  # [B, Q] int64
        positions: torch.Tensor,  # [B, Q] int64, position of each query token
        slots: torch.Tensor,  # [B, Q] int64, flat KV slot each token's k/v goes to (0 = scratch)
        kv: torch.Tensor,  # [num_layers, 2, num_slots, Hkv, D], written in place
        block_tables: torch.Tensor,  # [B, max_blocks] int64, -1 = unallocated
        *,
        block_size: int,
        hidden_in: torch.Tensor | None = None,  # unused: keeps the signature of MTPHead
        attention: str = "torch",  # paged-attention kernel (`fdecode.ops.attention.KERNELS`)
        regions: bool = False,  # compile each layer kind once (`fdecode.models.regions`)
        last_logits: bool = False,  # the LM head over the last row only: logits [B, 1, V]
        tree: TreeRows | None = None,  # the rows are draft-tree nodes (`fdecode.ops.attention.TreeRows`)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns logits [B, Q, V] float32 (or [B, 1, V], `last_logits`) and the final-norm hidden state
        [B, Q, H] (model dtype)."""
        ctx = paged_context(block_tables, positions, block_size, kernel=attention, regions=regions, tree=tree)
        x = self.embed_tokens(tokens)  # [B, Q, H]
        indices = layer_indices(len(self.layers), ctx.regions, x.device)
        for i, layer in enumerate(self.layers):
            x = call_layer(layer, ctx.regions, x, positions, slots, kv, indices[i], ctx, self.rotary)
        hidden = self.norm(x)  # [B, Q, H]
        return self.lm_head(hidden[:, -1:] if last_logits else hidden).float(), hidden
