"""Static description of a Llama-family decoder (Llama, Qwen2, Qwen3) and its KV layout
(docs/design.md, "Model families and the registry").

`ModelConfig` is frozen and hashable: it is baked into compiled graphs, so it
holds only Python scalars that never change for a given set of weights.

Paged KV cache layout, shared by every model in fdecode:

    kv: Tensor  # [num_layers, 2, num_blocks * block_size, num_kv_heads, head_dim]
                # kv[l, 0] = keys, kv[l, 1] = values of layer l; slot s = block * block_size + offset

(An MLA model, DeepSeek-V3, caches one latent per token instead, in the same paged layout with one
kind and one head: `DeepseekV3Config.kv_shape`, `fdecode.ops.latent_kv`.)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from fdecode.models.registry import model_types


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # Hashable RoPE scaling spec: sorted (key, value) pairs, e.g. (("factor", 8.0), ("rope_type", "llama3"), ...).
    rope_scaling: tuple[tuple[str, object], ...] | None = None
    tie_word_embeddings: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before RoPE
    attention_bias: bool = False  # Qwen2: bias on the q/k/v projections
    max_position_embeddings: int = 4096
    model_type: str = "llama"

    # The family modules (`fdecode.models.registry`) whose model types this config class describes.
    families: ClassVar[tuple[str, ...]] = ("llama",)
    # What the rest of fdecode asks of a model instead of its config class:
    latent_kv: ClassVar[bool] = False  # the KV cache holds one latent per token (MLA), not keys and values
    recurrent: ClassVar[bool] = False  # some layers carry a recurrent state (linear attention)

    def __post_init__(self) -> None:
        self.check_model_type()
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")

    def check_model_type(self) -> None:
        """Refuse a model_type that none of this class's families loads (`fdecode.models.registry`)."""
        allowed = model_types(*self.families)
        if self.model_type not in allowed:
            raise ValueError(
                f"unsupported model_type {self.model_type!r} for {type(self).__name__}; fdecode implements {allowed}"
            )

    @property
    def rope_scaling_dict(self) -> dict[str, object] | None:
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    def replace(self, **changes: object) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def kv_shape(self, num_slots: int) -> tuple[int, ...]:
        """Shape of this model's paged KV cache holding `num_slots` = num_blocks * block_size tokens."""
        return (self.num_layers, 2, num_slots, self.num_kv_heads, self.head_dim)

    def new_kv(self, num_slots: int, *, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        return torch.zeros(self.kv_shape(num_slots), dtype=dtype, device=device)
