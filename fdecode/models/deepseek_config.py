"""Static description of a DeepSeek-V3 decoder: multi-head latent attention (MLA) shapes, dense layers
(docs/design.md, "Multi-head latent attention: DeepSeek-V3 and the latent cache").

A `DeepseekV3Config` is a `ModelConfig` (frozen, hashable, baked into graphs). As in transformers,
`head_dim` is the rotary width `qk_rope_head_dim` and `num_kv_heads` equals `num_heads`; the attention
shapes are the MLA fields `q_lora_rank` (Rq; None: one q_proj), `kv_lora_rank` (R), `qk_nope_head_dim`
(Dn), `qk_rope_head_dim` (Dr) and `v_head_dim` (Dv). Layers `first_k_dense_replace` .. have the
sigmoid-routed MoE `moe` (`fdecode.models.layers.moe`), the others (all of them when `moe` is None) the
dense SwiGLU MLP of `intermediate_size`. `mtp_num_layers` (`num_nextn_predict_layers`) = n MTP modules
follow at layer indices `num_layers` .. `num_layers + n - 1` (`fdecode.models.mtp.nextn`). The paged
cache holds the latent, `R + Dr` values per token and layer: `kv_shape` is `[L, 1, num_slots, 1, R + Dr]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from fdecode.models.config import ModelConfig
from fdecode.models.moe_config import MoEConfig
from fdecode.ops.latent_kv import latent_kv_shape


@dataclass(frozen=True)
class DeepseekV3Config(ModelConfig):
    q_lora_rank: int | None = None
    kv_lora_rank: int = 1
    qk_nope_head_dim: int = 1
    qk_rope_head_dim: int = 2
    v_head_dim: int = 1
    rope_interleave: bool = True  # the rope channels come as interleaved pairs (x0, x1), (x2, x3), ...
    moe: MoEConfig | None = None  # the routed experts of the MoE layers; None: every layer dense
    first_k_dense_replace: int = 0  # layers before this one have a dense MLP, the others `moe`
    mtp_num_layers: int = 0  # MTP modules in the checkpoint (`num_nextn_predict_layers`; 0: none)

    families: ClassVar[tuple[str, ...]] = ("deepseek_v3",)
    latent_kv: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self.check_model_type()
        if self.head_dim != self.qk_rope_head_dim or self.num_kv_heads != self.num_heads:
            raise ValueError(
                f"a DeepseekV3Config has head_dim = qk_rope_head_dim ({self.qk_rope_head_dim}) and num_kv_heads = "
                f"num_heads ({self.num_heads}), got head_dim={self.head_dim}, num_kv_heads={self.num_kv_heads}"
            )
        sizes = {
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "v_head_dim": self.v_head_dim,
        }
        if self.q_lora_rank is not None:
            sizes["q_lora_rank"] = self.q_lora_rank
        bad = {k: v for k, v in sizes.items() if v < 1}
        if bad or self.qk_rope_head_dim < 2 or self.qk_rope_head_dim % 2:
            raise ValueError(
                f"MLA sizes must be positive and qk_rope_head_dim even, got {bad or sizes} and {self.qk_rope_head_dim}"
            )

    @property
    def latent_width(self) -> int:
        """Cached values per token and layer: the compressed kv and the shared rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """1 / sqrt(Dn + Dr), times mscale(factor, mscale_all_dim)^2 under DeepSeek's YaRN (as transformers)."""
        scale = self.qk_head_dim**-0.5
        rope = self.rope_scaling_dict or {}
        all_dim = rope.get("mscale_all_dim")
        if rope.get("rope_type", "default") != "default" and all_dim:
            factor = float(rope["factor"])
            mscale = 1.0 if factor <= 1 else 0.1 * float(all_dim) * math.log(factor) + 1.0
            scale *= mscale * mscale
        return scale

    def kv_shape(self, num_slots: int) -> tuple[int, ...]:
        """The latent cache (`fdecode.ops.latent_kv`): one kind, one head of R + Dr values per token."""
        return latent_kv_shape(self.num_layers, num_slots, self.latent_width)
