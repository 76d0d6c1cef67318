"""The Llama family (`llama`, `qwen2`, `qwen3`): config mapping and architectures (docs/design.md, "Model
families and the registry").

- Config: `ModelConfig` from config.json (`shape_fields`, RoPE with its scaling, tied embeddings, Qwen3's
  per-head q/k norms, Qwen2's q/k/v biases, transformers' defaults for fields a config.json leaves out).
- Keys: the Llama layout and its MTP head layouts (`keys.rename`).
- Modules: `LlamaModel` and `MTPHead`. `ARCHITECTURES` names the transformers class `save_hf` writes.
"""

from __future__ import annotations

from fdecode.models.config import ModelConfig
from fdecode.models.families.family import Family
from fdecode.models.families.hf_config import check_silu, rope_from_hf, shape_fields
from fdecode.models.families.keys import rename
from fdecode.models.layers.rope import rope_inv_freq
from fdecode.models.llama import LlamaModel
from fdecode.models.mtp.head import MTPHead

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# transformers' defaults for fields a config.json may leave out.
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "qwen2": 32768, "qwen3": 32768}
_QWEN3_DEFAULT_HEAD_DIM = 128  # Qwen3Config's default; the other types derive head_dim from the hidden size


def config_from_hf(hf: dict[str, object]) -> ModelConfig:
    """Build a ModelConfig from a config.json dict (transformers 4 or 5 field names)."""
    model_type = hf.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ValueError(f"unsupported model_type {model_type!r} for the Llama family {tuple(ARCHITECTURES)}")
    check_silu(hf)
    if hf.get("mlp_bias") or hf.get("use_sliding_window"):
        raise ValueError("mlp_bias and sliding-window attention are not supported")
    rope_theta, rope_scaling = rope_from_hf(hf)
    cfg = ModelConfig(
        **shape_fields(hf, default_head_dim=_QWEN3_DEFAULT_HEAD_DIM if model_type == "qwen3" else None),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qk_norm=model_type == "qwen3",
        # Qwen2 always biases q/k/v (its HF config has no switch for it).
        attention_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
        max_position_embeddings=int(hf.get("max_position_embeddings") or _DEFAULT_MAX_POSITIONS[model_type]),
        model_type=model_type,
    )
    rope_inv_freq(cfg)  # refuse unsupported RoPE types now rather than at the first forward
    return cfg


LLAMA = Family(config_from_hf, rename, LlamaModel, MTPHead)
