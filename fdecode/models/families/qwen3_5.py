"""The Qwen3.5 and Qwen3.5-MoE families: config mapping, checkpoint key mapping and layer pattern (`loading.Family`)
(docs/design.md, "Hybrid models: Qwen3.5, Qwen3-Next, Qwen3.5-MoE and the recurrent state").

- Config: `model_type` "qwen3_5_text" (Qwen3_5ForCausalLM), or "qwen3_5" (the multimodal checkpoint,
  whose text part sits under `text_config`). Which layer is which: `layer_types`, else every
  `full_attention_interval`-th layer (default 4) is full attention, the others Gated DeltaNet.
  RoPE: `rope_parameters` (theta, `partial_rotary_factor` default 0.25); text-only mrope is 1-D RoPE.
- Keys: `model.language_model.*` (multimodal) or `model.*` -> `*`; `model.visual.*` ignored; the MTP
  head's `mtp.fc`, `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.layers.N.*` (N <
  `mtp_num_hidden_layers`), `mtp.norm` -> `HybridMTPHead`.
- Qwen3.5-MoE (`qwen3_5_moe_text`, `qwen3_5_moe`): the same, every feed-forward the Qwen MoE
  (`moe.QwenMoE`, the MTP head's too), per-expert checkpoint keys stacked by the loader.
- Modules: `HybridModel` and `HybridMTPHead`.
"""

from __future__ import annotations

from fdecode.models.families.family import Family
from fdecode.models.families.hf_config import check_silu
from fdecode.models.hybrid import HybridModel
from fdecode.models.hybrid_config import FULL, LINEAR, HybridConfig
from fdecode.models.moe_config import softmax_moe_from_hf
from fdecode.models.mtp.hybrid import HybridMTPHead

_DEFAULT_PARTIAL_ROTARY = 0.25  # Qwen3_5TextConfig's default
# The MTP head's shared parts; its layers keep their names (mtp.layers.N.*), like mtp.norm.
_MTP_NAMES = {
    "mtp.fc.": "mtp.eh_proj.",
    "mtp.pre_fc_norm_embedding.": "mtp.enorm.",
    "mtp.pre_fc_norm_hidden.": "mtp.hnorm.",
}
_IGNORED_ROPE_KEYS = ("mrope_section", "mrope_interleaved", "partial_rotary_factor", "rope_theta", "rope_type", "type")


def layer_pattern(hf: dict[str, object], num_layers: int) -> tuple[str, ...]:
    """Each layer's mixer: `layer_types` when given, else full attention every `full_attention_interval`."""
    types = hf.get("layer_types")
    if types is not None:
        return tuple(str(t) for t in types)
    interval = int(hf.get("full_attention_interval") or 4)
    return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers))


def text_part(hf: dict[str, object], text_type: str) -> dict[str, object]:
    """The text model's config of a multimodal checkpoint (`text_config`, of model_type `text_type`), else `hf`."""
    if "text_config" not in hf:
        return hf
    text = dict(hf.get("text_config") or {})
    if text.get("model_type", text_type) != text_type:
        raise ValueError(f"{hf.get('model_type')} checkpoint with text_config of model_type {text['model_type']!r}")
    text.setdefault("tie_word_embeddings", hf.get("tie_word_embeddings", False))
    return text


def hybrid_fields(hf: dict[str, object]) -> dict[str, object]:
    """The `HybridConfig` fields the Qwen3.5 / Qwen3.5-MoE / Qwen3-Next text configs share (everything but
    model_type, the DeltaNet projection layout and the MLPs)."""
    check_silu(hf)
    if hf.get("attn_output_gate", True) is False:
        raise ValueError("attn_output_gate=False is not supported: Qwen3.5 / Qwen3-Next attention is gated")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    extra = sorted(set(rope) - set(_IGNORED_ROPE_KEYS))
    if rope_type != "default" or extra:
        raise ValueError(
            f"unsupported Qwen3.5 RoPE parameters (type {rope_type!r}, {extra}); fdecode implements default RoPE"
        )
    num_layers = int(hf["num_hidden_layers"])
    # Qwen3.5 names its MTP depth mtp_num_hidden_layers, Qwen3-Next checkpoints num_nextn_predict_layers.
    mtp_layers = int(hf.get("mtp_num_hidden_layers") or hf.get("num_nextn_predict_layers") or 0)
    heads = int(hf["num_attention_heads"])
    return dict(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf.get("intermediate_size") or 0),  # 0: every layer's MLP is an MoE (Qwen3.5-MoE)
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta") or hf.get("rope_theta") or 10000.0),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qk_norm=True,
        attention_bias=bool(hf.get("attention_bias", False)),
        max_position_embeddings=int(hf.get("max_position_embeddings") or 32768),
        layer_types=layer_pattern(hf, num_layers),
        linear_num_key_heads=int(hf["linear_num_key_heads"]),
        linear_num_value_heads=int(hf["linear_num_value_heads"]),
        linear_key_head_dim=int(hf["linear_key_head_dim"]),
        linear_value_head_dim=int(hf["linear_value_head_dim"]),
        linear_conv_kernel=int(hf.get("linear_conv_kernel_dim") or 4),
        partial_rotary_factor=float(
            rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", _DEFAULT_PARTIAL_ROTARY))
        ),
        mtp_num_layers=mtp_layers,
    )


def config_from_hf(hf: dict[str, object]) -> HybridConfig:
    """HybridConfig from a config.json dict of a Qwen3.5 text or multimodal checkpoint."""
    return HybridConfig(**hybrid_fields(text_part(hf, "qwen3_5_text")), model_type="qwen3_5_text")


def moe_config_from_hf(hf: dict[str, object]) -> HybridConfig:
    """HybridConfig of a Qwen3.5-MoE text or multimodal checkpoint: Qwen3.5 with the Qwen MoE as every
    layer's feed-forward (its router always renormalises the top-k weights; the config has no switch)."""
    text = text_part(hf, "qwen3_5_moe_text")
    return HybridConfig(
        **hybrid_fields(text), model_type="qwen3_5_moe_text", moe=softmax_moe_from_hf(text, norm_topk_prob=True)
    )


def rename(hf_key: str, num_layers: int) -> str | None:
    """fdecode name of a Qwen3.5 checkpoint key, None for keys deliberately ignored."""
    if hf_key.startswith(("model.visual.", "visual.")) or hf_key.endswith("rotary_emb.inv_freq"):
        return None
    for old, new in _MTP_NAMES.items():
        if hf_key.startswith(old):
            return new + hf_key[len(old) :]
    for prefix in ("model.language_model.", "model."):
        if hf_key.startswith(prefix):
            return hf_key[len(prefix) :]
    return hf_key  # lm_head.*, mtp.norm.*, mtp.layers.N.*


QWEN3_5 = Family(config_from_hf, rename, HybridModel, HybridMTPHead)
QWEN3_5_MOE = Family(moe_config_from_hf, rename, HybridModel, HybridMTPHead)
