"""The GLM-4.5 / 4.6 family (`glm4_moe`, transformers' `Glm4MoeForCausalLM`): config, keys, layers
(docs/design.md, "Mixture of experts: the MoE block, GLM-4.5, the DeepSeek-style MTP head").

- Layers: Llama-style pre-norm `DecoderLayer`s (plain RMSNorm) whose attention is GQA with biases on
  q/k/v only (o_proj has none), optional per-head RMSNorm of q and k (`use_qk_norm`) before a partial
  RoPE (`partial_rotary_factor`, default 0.5: the first half of each head rotates); the feed-forward
  is the dense SwiGLU for the first `first_k_dense_replace` layers, the DeepSeek-style MoE after
  (`fdecode.models.layers.moe`: sigmoid router with e_score_correction_bias, group-limited top-k, shared experts).
- MTP: `num_nextn_predict_layers` = n DeepSeek-style modules at `model.layers.{num_hidden_layers + k}.*`
  (`NextNMTPHead`, module k around MoE decoder layer `num_hidden_layers + k`; GLM-4.5 / 4.6 ship n = 1).
- Keys: the Llama mapping (`model.*` -> `*`), MTP module k -> `mtp.layers.k.*` (`rename_nextn`);
  per-expert `mlp.experts.N.*_proj.weight` keys are stacked by the loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from fdecode.models.config import ModelConfig
from fdecode.models.families.family import Family
from fdecode.models.families.hf_config import check_silu, rope_from_hf, shape_fields
from fdecode.models.families.keys import rename_nextn
from fdecode.models.layers.decoder_layer import DecoderLayer
from fdecode.models.layers.moe import feed_forward
from fdecode.models.layers.partial_rope import PartialRotaryEmbedding
from fdecode.models.layers.rope import rope_inv_freq
from fdecode.models.llama import LlamaModel
from fdecode.models.moe_config import MoEConfig, sigmoid_moe_from_hf
from fdecode.models.mtp.nextn import NextNMTPHead

# Glm4MoeConfig's defaults for the fields a config.json may leave out.
_MOE_DEFAULTS = {
    "n_routed_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 1408,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "n_shared_experts": 1,
}
_DEFAULT_PARTIAL_ROTARY = 0.5


@dataclass(frozen=True)
class Glm4MoeConfig(ModelConfig):
    moe: MoEConfig | None = None  # the routed layers' MoE
    first_k_dense_replace: int = 1  # layers 0 .. k-1 have the dense MLP
    partial_rotary_factor: float = _DEFAULT_PARTIAL_ROTARY  # only the first head_dim * factor dims rotate
    mtp_num_layers: int = 0  # num_nextn_predict_layers: MTP modules the checkpoint may carry

    families: ClassVar[tuple[str, ...]] = ("glm4_moe",)

    def __post_init__(self) -> None:
        self.check_model_type()
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(
                f"partial_rotary_factor {self.partial_rotary_factor} gives an unusable rotary dim {self.rotary_dim}"
            )

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)


def config_from_hf(hf: dict[str, object]) -> Glm4MoeConfig:
    """Glm4MoeConfig from a config.json dict (transformers 5 or GLM's own field names)."""
    check_silu(hf)
    rope = dict(hf.get("rope_parameters") or {})
    partial = float(
        rope.pop("partial_rotary_factor", None) or hf.get("partial_rotary_factor") or _DEFAULT_PARTIAL_ROTARY
    )
    rope_theta, rope_scaling = rope_from_hf({**hf, "rope_parameters": rope})
    cfg = Glm4MoeConfig(
        **shape_fields(hf),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qk_norm=bool(hf.get("use_qk_norm", False)),
        attention_bias=bool(hf.get("attention_bias", False)),
        max_position_embeddings=int(hf.get("max_position_embeddings") or 131072),
        model_type="glm4_moe",
        moe=sigmoid_moe_from_hf(hf, defaults=_MOE_DEFAULTS),
        first_k_dense_replace=int(hf.get("first_k_dense_replace", 1)),
        partial_rotary_factor=partial,
        mtp_num_layers=int(hf.get("num_nextn_predict_layers", hf.get("num_mtp_layers", 0)) or 0),
    )
    rope_inv_freq(cfg)  # refuse unsupported RoPE types now rather than at the first forward
    return cfg


def glm_layer(cfg: Glm4MoeConfig, index: int) -> DecoderLayer:
    """Decoder layer `index` (the MTP layer is index num_layers): GQA, dense MLP or MoE by index."""
    layer = DecoderLayer(cfg, mlp=feed_forward(cfg, cfg.moe, index, first_dense=cfg.first_k_dense_replace))
    if cfg.attention_bias:  # GLM biases q/k/v only
        attn = layer.self_attn
        attn.o_proj = nn.Linear(attn.o_proj.in_features, attn.o_proj.out_features, bias=False)
    return layer


class Glm4MoeModel(LlamaModel):
    """`LlamaModel` over GLM's layers (`glm_layer`) and partial RoPE."""

    def __init__(self, cfg: Glm4MoeConfig) -> None:
        super().__init__(cfg, layer=glm_layer, rotary=PartialRotaryEmbedding(cfg, cfg.rotary_dim))


class Glm4MoeMTPHead(NextNMTPHead):
    def __init__(self, cfg: Glm4MoeConfig) -> None:
        super().__init__(cfg, layer=glm_layer, rotary=PartialRotaryEmbedding(cfg, cfg.rotary_dim))


GLM4_MOE = Family(config_from_hf, rename_nextn, Glm4MoeModel, Glm4MoeMTPHead)
