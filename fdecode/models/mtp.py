"""Multi-token-prediction (MTP) head, DeepSeek-V3 / Qwen3-Next style.

One step predicts the token after `tokens` from that token and the hidden state
the previous model (the target, or the previous MTP step) produced for the
token before it:

    h      = layer(eh_proj(cat([enorm(embed(tokens)), hnorm(hidden_in)], -1)))
    logits = lm_head(norm(h))

The head has one decoder layer (so a 1-layer paged KV cache, `kv_config`) and
borrows the target's embedding and LM head: `bind(target)` keeps references,
outside the module tree, so they are neither copied nor saved twice. Its KV
entry at position p pairs the token at p with the hidden from p - 1.
"""

from __future__ import annotations

import torch
from torch import nn

from fdecode.models.config import ModelConfig
from fdecode.models.layers import DecoderLayer, RMSNorm, init_random_
from fdecode.models.llama import LlamaModel
from fdecode.models.rope import RotaryEmbedding
from fdecode.ops.attention import paged_context


class MTPHead(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.kv_config = cfg.replace(num_layers=1)
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.layer = DecoderLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg)
        # (embed_tokens, lm_head) of the bound target. A plain tuple is not registered by nn.Module,
        # so the target's weights are neither owned, moved nor saved by this head.
        self._shared: tuple[nn.Embedding, nn.Linear] | None = None
        self.requires_grad_(False)

    def bind(self, target: LlamaModel) -> MTPHead:
        if target.config.hidden_size != self.config.hidden_size or target.config.vocab_size != self.config.vocab_size:
            raise ValueError("MTP head and target disagree on hidden_size or vocab_size")
        self._shared = (target.embed_tokens, target.lm_head)
        return self

    # The hidden a draft forward hands the next one: the layer output (False) or its final norm (True).
    chains_normed = False
    num_mtp_layers = 1  # decoder layers; draft forward j runs layer j mod num_mtp_layers (`HybridMTPHead`)

    @classmethod
    def random(cls, cfg: ModelConfig, *, seed: int, std: float = 0.02, dtype: torch.dtype = torch.float32) -> MTPHead:
        head = cls(cfg).to(dtype)
        head.init_random_(seed=seed, std=std)
        return head

    def init_random_(self, *, seed: int, std: float) -> None:
        init_random_(self, seed=seed, std=std)

    def forward(
        self,
        tokens: torch.Tensor,  # [B, Q] int64
        positions: torch.Tensor,  # [B, Q] int64
        slots: torch.Tensor,  # [B, Q] int64, flat KV slot each row's k/v goes to (0 = scratch)
        kv: torch.Tensor,  # [1, 2, num_slots, Hkv, D], written in place
        block_tables: torch.Tensor,  # [B, max_blocks] int64, -1 = unallocated
        *,
        block_size: int,
        hidden_in: torch.Tensor | None = None,  # [B, Q, H], hidden of the previous position
        attention: str = "torch",  # paged-attention kernel (`fdecode.ops.attention.KERNELS`)
        depth: int = 0,  # which draft forward of the step this is (0 = the one after the target)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns logits [B, Q, V] float32 and the hidden [B, Q, H] the next draft forward takes: the
        layer output before the final norm, or after it where `chains_normed`."""
        if self._shared is None:
            raise RuntimeError("MTPHead.bind(target) must be called before forward")
        if hidden_in is None:
            raise ValueError("MTPHead needs hidden_in [B, Q, H]")
        embed_tokens, lm_head = self._shared
        x = torch.cat([self.enorm(embed_tokens(tokens)), self.hnorm(hidden_in)], dim=-1)  # [B, Q, 2H]
        ctx = paged_context(block_tables, positions, block_size, kernel=attention)
        h = self.run_layers(self.eh_proj(x), positions, slots, kv, ctx, depth)  # [B, Q, H]
        out = self.norm(h)
        return lm_head(out).float(), out if self.chains_normed else h

    def run_layers(
        self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, kv: torch.Tensor, ctx, depth: int
    ) -> torch.Tensor:
        """The decoder layer over the projected rows x [B, Q, H] (one layer: `depth` does not matter)."""
        return self.layer(x, positions, slots, kv, 0, ctx, self.rotary)


def mtp_layer(draft: nn.Module, j: int) -> int:
    """The MTP layer draft forward j runs: j mod the head's layers (0 for a draft LM)."""
    return j % draft.num_mtp_layers if isinstance(draft, MTPHead) else 0


def depth_kwargs(draft: nn.Module, j: int) -> dict[str, int]:
    """The keyword that tells draft forward j which MTP layer runs (`depth`, reduced to `mtp_layer`, so
    a captured forward specialises on at most that many values); {} for a draft LM."""
    return {"depth": mtp_layer(draft, j)} if isinstance(draft, MTPHead) else {}
