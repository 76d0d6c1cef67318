"""Static description of a Llama-family decoder (Llama, Qwen2, Qwen3) and its KV layout.

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

import torch

# Model types whose layers fdecode implements; everything else is refused by the loader.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


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

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {self.model_type!r}; fdecode implements {SUPPORTED_MODEL_TYPES}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")

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
