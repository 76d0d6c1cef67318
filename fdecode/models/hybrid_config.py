"""Static description of a hybrid decoder: which layer is which mixer, and the mixers' shapes
(docs/design.md, "Hybrid models: Qwen3.5, Qwen3-Next, Qwen3.5-MoE and the recurrent state").

A hybrid decoder (Qwen3.5, Qwen3-Next) interleaves *linear attention* layers (Gated DeltaNet: a
recurrent state per lane, no KV) with *full attention* layers (paged KV, as every fdecode model).
`HybridConfig` is a `ModelConfig` (frozen, hashable, baked into graphs) with the layer pattern, the
DeltaNet shapes and which layers' feed-forward is an MoE (`sparse_mlp`, Qwen3-Next / Qwen3.5-MoE); `kv_shape` counts only the full-attention layers, so the paged KV leaf holds
exactly those, numbered in order (`kv_layer`).

Recurrent state of one lane, per linear-attention layer (`fdecode.state.recurrent` holds B lanes):

    conv: [conv_dim, conv_kernel - 1]  model dtype  the last inputs of the q|k|v channels
    rec:  [Hv, dk, dv]                 float32      the delta-rule matrix S of each value head
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fdecode.models.config import ModelConfig
from fdecode.models.moe_config import MoEConfig

LINEAR, FULL = "linear_attention", "full_attention"


@dataclass(frozen=True)
class HybridConfig(ModelConfig):
    layer_types: tuple[str, ...] = ()  # one of LINEAR / FULL per layer
    linear_num_key_heads: int = 1  # Hk: DeltaNet query/key heads
    linear_num_value_heads: int = 1  # Hv: DeltaNet value heads (each key head serves Hv / Hk of them)
    linear_key_head_dim: int = 1  # dk
    linear_value_head_dim: int = 1  # dv
    linear_conv_kernel: int = 4
    partial_rotary_factor: float = 1.0  # only the first head_dim * factor dims of q and k rotate
    fused_qkvz: bool = False  # Qwen3-Next: DeltaNet projections in_proj_qkvz / in_proj_ba, per key head
    mtp_num_layers: int = 0  # MTP decoder layers in the checkpoint (0: none); draft forward j runs layer j mod n
    moe: MoEConfig | None = None  # the MoE feed-forward of the sparse layers (None: every MLP is dense)
    mlp_only_layers: tuple[int, ...] = ()  # Qwen3-Next: layers that keep the dense MLP
    decoder_sparse_step: int = 1  # Qwen3-Next: every decoder_sparse_step-th layer is sparse

    families: ClassVar[tuple[str, ...]] = ("qwen3_5", "qwen3_next")
    recurrent: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self.check_model_type()
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types names {len(self.layer_types)} layers, the model has {self.num_layers}")
        unknown = sorted(set(self.layer_types) - {LINEAR, FULL})
        if unknown:
            raise ValueError(f"unsupported layer type(s) {unknown}; fdecode implements {(LINEAR, FULL)}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.linear_num_key_heads})"
            )
        if self.moe is None and self.intermediate_size <= 0:
            raise ValueError("a hybrid model without MoE layers needs intermediate_size > 0")
        if self.decoder_sparse_step < 1 or self.mtp_num_layers < 0:
            raise ValueError(
                f"decoder_sparse_step ({self.decoder_sparse_step}) must be >= 1 and mtp_num_hidden_layers "
                f"({self.mtp_num_layers}) >= 0"
            )
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(
                f"partial_rotary_factor {self.partial_rotary_factor} gives an unusable rotary dim {self.rotary_dim}"
            )

    def sparse_mlp(self, layer: int) -> bool:
        """Whether layer `layer` (of the decoder, or of the MTP head: vLLM numbers those from 0 too) has
        the MoE feed-forward: transformers' Qwen3-Next rule, every layer for Qwen3.5-MoE."""
        return (
            self.moe is not None and layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0
        )

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: q | k | v."""
        return (
            2 * self.linear_num_key_heads * self.linear_key_head_dim
            + self.linear_num_value_heads * self.linear_value_head_dim
        )

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    def kv_shape(self, num_slots: int) -> tuple[int, ...]:
        """Paged KV of the full-attention layers only."""
        return (len(self.full_layers), 2, num_slots, self.num_kv_heads, self.head_dim)

    def conv_shape(self, batch: int, copies: int) -> tuple[int, ...]:
        """Conv windows of `batch` lanes, `copies` per lane, of every linear-attention layer."""
        return (batch, len(self.linear_layers), copies, self.conv_dim, self.linear_conv_kernel - 1)

    def rec_shape(self, batch: int, copies: int) -> tuple[int, ...]:
        """Delta-rule states of `batch` lanes, `copies` per lane, of every linear-attention layer."""
        hv, dk, dv = self.linear_num_value_heads, self.linear_key_head_dim, self.linear_value_head_dim
        return (batch, len(self.linear_layers), copies, hv, dk, dv)
