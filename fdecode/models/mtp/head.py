"""Multi-token-prediction (MTP) head, DeepSeek-V3 / Qwen3-Next style (docs/design.md, "MTP head vs draft LM").

One step predicts the token after `tokens` from that token and the hidden state the previous model
(the target, or the previous MTP step) produced for the token before it:

    h      = layer(eh_proj(cat([enorm(embed(tokens)), hnorm(hidden_in)], -1)))
    logits = lm_head(norm(h))

One decoder layer (a 1-layer paged KV cache, `kv_config`); `bind(target)` borrows the target's
embedding and LM head, outside the module tree, so they are neither copied nor saved twice. Its KV
entry at position p pairs the token at p with the hidden from p - 1. Heads of n layers
(`HybridMTPHead`, `NextNMTPHead`) override `run_layers`: draft forward j (`depth`) runs layer j mod n,
and every other layer writes its keys and values of the rows (`run_one_layer_writing_all`).
"""

from __future__ import annotations

import torch
from torch import nn

from fdecode.models.config import ModelConfig
from fdecode.models.layers.decoder_layer import DecoderLayer, RMSNorm, init_random_
from fdecode.models.layers.rope import RotaryEmbedding
from fdecode.models.llama import LlamaModel
from fdecode.models.regions import call_layer, layer_indices
from fdecode.ops.attention import TreeRows, paged_context


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

    @property
    def shared(self) -> tuple[nn.Embedding, nn.Linear] | None:
        """(embed_tokens, lm_head) of the target this head is bound to (`bind`), None while unbound."""
        return self._shared

    def bind(self, target: LlamaModel) -> MTPHead:
        if target.config.hidden_size != self.config.hidden_size or target.config.vocab_size != self.config.vocab_size:
            raise ValueError("MTP head and target disagree on hidden_size or vocab_size")
        self._shared = (target.embed_tokens, target.lm_head)
        return self

    # The hidden a draft forward hands the next one: the layer output (False) or its final norm (True).
    chains_normed = False
    num_mtp_layers = 1  # decoder layers; draft forward j runs layer j mod this (`HybridMTPHead`, `NextNMTPHead`)

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
        regions: bool = False,  # compile each layer kind once (`fdecode.models.regions`)
        last_logits: bool = False,  # the LM head over the last row only: logits [B, 1, V]
        tree: TreeRows | None = None,  # the rows are draft-tree nodes (`fdecode.ops.attention.TreeRows`)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns logits [B, Q, V] float32 ([B, 1, V] with `last_logits`) and the hidden [B, Q, H] the next
        draft forward takes: the layer output before the final norm, or after it where `chains_normed`."""
        if self._shared is None:
            raise RuntimeError("MTPHead.bind(target) must be called before forward")
        if hidden_in is None:
            raise ValueError("MTPHead needs hidden_in [B, Q, H]")
        embed_tokens, lm_head = self._shared
        ctx = paged_context(block_tables, positions, block_size, kernel=attention, regions=regions, tree=tree)
        h, out = self.run_layers(embed_tokens(tokens), hidden_in, positions, slots, kv, ctx, depth)  # [B, Q, H] each
        return lm_head(out[:, -1:] if last_logits else out).float(), out if self.chains_normed else h

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
        """(layer output h, final norm of h) [B, Q, H] of the rows (embedded tokens, hidden_in); one
        layer, so `depth` does not matter."""
        index = layer_indices(1, ctx.regions, embedded.device)[0]
        h = call_layer(
            self.layer, ctx.regions, mtp_input(self, embedded, hidden_in), positions, slots, kv, index, ctx, self.rotary
        )
        return h, self.norm(h)


def mtp_input(parts: nn.Module, embedded: torch.Tensor, hidden_in: torch.Tensor) -> torch.Tensor:
    """eh_proj([enorm(embedded); hnorm(hidden_in)]) [B, Q, H] with the `enorm`, `hnorm`, `eh_proj` of
    `parts` (a head, or one module of a head that has several)."""
    return parts.eh_proj(torch.cat([parts.enorm(embedded), parts.hnorm(hidden_in)], dim=-1))


def run_one_layer_writing_all(
    layers, inputs, depth: int, positions: torch.Tensor, slots: torch.Tensor, kv: torch.Tensor, ctx, rotary
) -> tuple[int, torch.Tensor]:
    """(a, output of layers[a] over inputs(a)), a = depth mod n: the layer draft forward `depth` runs.
    Every other layer i only writes its keys and values of inputs(i) into KV layer i (`write_kv`), so
    each layer's KV holds an entry at every row any draft forward saw (`HybridMTPHead`, `NextNMTPHead`)."""
    active = depth % len(layers)
    for i, layer in enumerate(layers):
        if i != active:
            layer.write_kv(inputs(i), positions, slots, kv, i, ctx, rotary)
    index = layer_indices(len(layers), ctx.regions, positions.device)[active]
    return active, call_layer(layers[active], ctx.regions, inputs(active), positions, slots, kv, index, ctx, rotary)
