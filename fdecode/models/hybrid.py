"""Hybrid decoder LM (Qwen3.5): Gated DeltaNet and gated full-attention layers, by `layer_types`
(docs/design.md, "Hybrid models: Qwen3.5, Qwen3-Next, Qwen3.5-MoE and the recurrent state").

Every layer is pre-norm residual, `x + mixer(norm(x))` then `+ mlp(norm(.))`, with `OffsetRMSNorm`s
and the SwiGLU `MLP`, or the MoE block (`fdecode.models.layers.moe`) where `HybridConfig.sparse_mlp` says; the mixer is `GatedAttention` over the paged KV (full-attention layers, KV
layer = its rank among them) or `GatedDeltaNet` over the recurrent state (linear-attention layers).

The module owns weights only. The paged KV is an argument written in place, as for `LlamaModel`;
the recurrent state comes in as `recurrent = (conv, rec)`, the state of every linear layer before
the first row (`[B, L_lin, conv_dim, k-1]`, `[B, L_lin, Hv, dk, dv]` float32, lane first), and the
states after the rows go out (`[B, L_lin, Q, ...]` with `snapshots`, else `[B, L_lin, ...]`), so the caller (`fdecode.state.recurrent`) decides which one is committed. Without
`recurrent` the forward starts from zeros and returns (logits, hidden) like every fdecode model
(a whole sequence from scratch: `fdecode.models.dense`). With `tree` and `parents` the rows are draft-tree
nodes: attention sees each node's ancestors, and each node's recurrent state continues its parent's
(`fdecode.ops.delta_rule`). Names mirror transformers' `model.*`.
"""

from __future__ import annotations

import torch
from torch import nn

from fdecode.models.decoder_lm import DecoderLM
from fdecode.models.hybrid_config import FULL, HybridConfig
from fdecode.models.layers.decoder_layer import MLP, init_random_
from fdecode.models.layers.deltanet import FusedGatedDeltaNet, GatedDeltaNet
from fdecode.models.layers.gated_attention import GatedAttention
from fdecode.models.layers.moe import moe_block
from fdecode.models.layers.norms import OffsetRMSNorm
from fdecode.models.layers.partial_rope import PartialRotaryEmbedding
from fdecode.models.regions import call_layer, layer_indices
from fdecode.ops.attention import PagedContext, TreeRows, paged_context


class _Block(nn.Module):
    def __init__(self, cfg: HybridConfig, index: int) -> None:
        super().__init__()
        self.mlp = moe_block(cfg, cfg.moe) if cfg.sparse_mlp(index) else MLP(cfg)  # index: the layer's number
        self.input_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def _finish(self, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        x = x + mixed
        return x + self.mlp(self.post_attention_layernorm(x))


class AttentionBlock(_Block):
    """Full-attention layer; the call signature of `layers.DecoderLayer` (so `MTPHead` can hold one)."""

    def __init__(self, cfg: HybridConfig, index: int) -> None:
        super().__init__(cfg, index)
        self.self_attn = GatedAttention(cfg)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv: torch.Tensor,
        layer: int,
        ctx: PagedContext,
        rotary: nn.Module,
    ) -> torch.Tensor:
        return self._finish(x, self.self_attn(self.input_layernorm(x), positions, slots, kv, layer, ctx, rotary))

    def write_kv(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv: torch.Tensor,
        layer: int,
        ctx: PagedContext,
        rotary: nn.Module,
    ) -> None:
        """Write the keys and values `forward` would write, and nothing else (`HybridMTPHead`)."""
        self.self_attn.write(self.input_layernorm(x), positions, slots, kv, layer, ctx, rotary)


class DeltaNetBlock(_Block):
    """Linear-attention layer: returns the output and its states after the rows (see `GatedDeltaNet`)."""

    def __init__(self, cfg: HybridConfig, index: int) -> None:
        super().__init__(cfg, index)
        self.linear_attn = (FusedGatedDeltaNet if cfg.fused_qkvz else GatedDeltaNet)(cfg)

    def forward(
        self,
        x: torch.Tensor,
        conv: torch.Tensor,
        rec: torch.Tensor,
        valid: torch.Tensor | None,
        *,
        snapshots: bool,
        parents: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mixed, conv, rec = self.linear_attn(
            self.input_layernorm(x), conv, rec, valid, snapshots=snapshots, parents=parents
        )
        return self._finish(x, mixed), conv, rec


def init_hybrid_(module: nn.Module, *, seed: int, std: float) -> None:
    """`init_random_`, then the values the hybrid parameters need: offset-norm weights near 0 (they
    scale by 1 + w), A = exp(A_log) in [0.05, 1] (slow decay: the state remembers many tokens)."""
    init_random_(module, seed=seed, std=std)
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, OffsetRMSNorm):
                sub.weight.sub_(1.0)
            elif isinstance(sub, GatedDeltaNet):
                a = torch.empty(sub.A_log.shape).uniform_(0.05, 1.0, generator=gen)
                sub.A_log.copy_(a.log())
                sub.dt_bias.add_(1.0)


class HybridModel(DecoderLM):
    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            (AttentionBlock if t == FULL else DeltaNetBlock)(cfg, i) for i, t in enumerate(cfg.layer_types)
        )
        self.norm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = PartialRotaryEmbedding(cfg, cfg.rotary_dim)
        # Each layer's rank among the layers of its kind: its KV layer, or its recurrent-state layer.
        self.mixer_index = tuple(cfg.layer_types[:i].count(t) for i, t in enumerate(cfg.layer_types))
        self.tie_weights_()
        self.mtp: nn.Module | None = None  # set by the loader when the checkpoint has mtp.* weights
        self.requires_grad_(False)

    def init_random_(self, *, seed: int, std: float) -> None:
        init_hybrid_(self, seed=seed, std=std)

    def new_recurrent(
        self, batch: int, copies: int, *, dtype: torch.dtype, device: torch.device | str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero (conv, rec) leaves, `copies` per lane: `[B, L_lin, copies, ...]` (conv in `dtype`, rec float32);
        a tensor-parallel rank's hold its share of the heads (`kv_config`)."""
        cfg = self.kv_config
        return (
            torch.zeros(cfg.conv_shape(batch, copies), dtype=dtype, device=device),
            torch.zeros(cfg.rec_shape(batch, copies), dtype=torch.float32, device=device),
        )

    def forward(
        self,
        tokens: torch.Tensor,  # [B, Q] int64
        positions: torch.Tensor,  # [B, Q] int64
        slots: torch.Tensor,  # [B, Q] int64, KV slot of each row (0 = scratch)
        kv: torch.Tensor,  # [L_full, 2, num_slots, Hkv, D], written in place
        block_tables: torch.Tensor,  # [B, max_blocks] int64, -1 = unallocated
        *,
        block_size: int,
        hidden_in: torch.Tensor | None = None,  # unused: the signature of MTPHead
        attention: str = "torch",
        recurrent: tuple[torch.Tensor, torch.Tensor] | None = None,  # (conv, rec) before row 0, see the docstring
        valid: torch.Tensor | None = None,  # [B, Q] bool: rows that advance the recurrent state, None: all
        snapshots: bool = False,  # return the states after every row ([B, L_lin, Q, ...]) instead of the last
        regions: bool = False,  # compile each layer kind once (`fdecode.models.regions`)
        last_logits: bool = False,  # the LM head over the last row only: logits [B, 1, V]
        tree: TreeRows | None = None,  # the rows are draft-tree nodes (`fdecode.ops.attention.TreeRows`)
        parents: torch.Tensor | None = None,  # [B, Q] int64 with `tree`: each node's parent row (-1: the root)
    ):
        """(logits [B, Q, V] float32 ([B, 1, V] with `last_logits`), final-norm hidden [B, Q, H]), plus, when
        `recurrent` is given, the (conv, rec) states after the rows."""
        batch = tokens.shape[0]
        given = recurrent is not None
        if not given:
            conv, rec = self.new_recurrent(batch, 1, dtype=self.embed_tokens.weight.dtype, device=tokens.device)
            recurrent = (conv[:, :, 0], rec[:, :, 0])  # [B, L_lin, ...]
        ctx = paged_context(block_tables, positions, block_size, kernel=attention, regions=regions, tree=tree)
        x = self.embed_tokens(tokens)  # [B, Q, H]
        convs, recs = [], []
        kv_indices = layer_indices(
            sum(isinstance(layer, AttentionBlock) for layer in self.layers), ctx.regions, x.device
        )
        for layer, index in zip(self.layers, self.mixer_index):  # index: rank among layers of its kind
            if isinstance(layer, AttentionBlock):
                x = call_layer(layer, ctx.regions, x, positions, slots, kv, kv_indices[index], ctx, self.rotary)
            else:
                x, conv, rec = call_layer(
                    layer,
                    ctx.regions,
                    x,
                    recurrent[0][:, index],
                    recurrent[1][:, index],
                    valid,
                    snapshots=snapshots,
                    parents=parents,
                )
                convs.append(conv)
                recs.append(rec)
        hidden = self.norm(x)
        logits = self.lm_head(hidden[:, -1:] if last_logits else hidden).float()
        if not given:
            return logits, hidden
        if not convs:  # no linear-attention layer: the (empty) states pass through, one per row if asked
            rows = tokens.shape[1]
            return (
                logits,
                hidden,
                tuple(t.unsqueeze(2).expand(-1, -1, rows, *t.shape[2:]) if snapshots else t for t in recurrent),
            )
        return logits, hidden, (torch.stack(convs, dim=1), torch.stack(recs, dim=1))
