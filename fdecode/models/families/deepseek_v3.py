"""The DeepSeek-V3 family: config mapping, checkpoint key mapping and layer pattern (`loading.Family`)
(docs/design.md, "Multi-head latent attention: DeepSeek-V3 and the latent cache").

- Config: `model_type` "deepseek_v3" (`DeepseekV3ForCausalLM`): the MLA shapes (`DeepseekV3Config`),
  RoPE from `rope_parameters` / `rope_scaling` (DeepSeek's YaRN with `mscale` / `mscale_all_dim`),
  `rope_interleave` (default True), the sigmoid-routed MoE (`moe_config.sigmoid_moe_from_hf`:
  noaux_tc or greedy, group-limited top-k, shared experts) from layer `first_k_dense_replace` on,
  `num_nextn_predict_layers` MTP modules.
- Layers: `DecoderLayer` (pre-norm residual, Llama RMSNorms) with `MLAttention` over the latent
  cache and, by index, the SwiGLU `MLP` (dense) or `DeepseekMoE`; the model is `LlamaModel`'s forward
  over these layers (`RotaryEmbedding` over the `qk_rope_head_dim` channels).
- Keys: `model.*` -> `*`; MTP module k at `model.layers.{num_hidden_layers + k}.*` (layout (b) of
  `loading`, `rename_nextn`) -> module k of `NextNMTPHead`, around decoder layer
  `num_hidden_layers + k` (MLA + MoE); per-expert `mlp.experts.N.*` are stacked by the loader.
"""

from __future__ import annotations

from fdecode.models.deepseek_config import DeepseekV3Config
from fdecode.models.families.family import Family
from fdecode.models.families.hf_config import check_silu, rope_from_hf
from fdecode.models.families.keys import rename_nextn
from fdecode.models.layers.decoder_layer import DecoderLayer
from fdecode.models.layers.mla import MLAttention
from fdecode.models.layers.moe import feed_forward
from fdecode.models.layers.rope import RotaryEmbedding, rope_inv_freq
from fdecode.models.llama import LlamaModel
from fdecode.models.moe_config import sigmoid_moe_from_hf
from fdecode.models.mtp.nextn import NextNMTPHead

# transformers' DeepseekV3Config defaults for the MoE fields a config.json may leave out.
_MOE_DEFAULTS = {
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048,
    "n_group": 8,
    "topk_group": 4,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "n_shared_experts": 1,
}


def decoder_layer(cfg: DeepseekV3Config, index: int) -> DecoderLayer:
    """Layer `index` (the MTP layer is index `num_layers`): MLA, then the dense MLP or the MoE."""
    mlp = feed_forward(cfg, cfg.moe, index, first_dense=cfg.first_k_dense_replace)
    return DecoderLayer(cfg, attention=MLAttention(cfg), mlp=mlp)


class DeepseekV3Model(LlamaModel):
    """`LlamaModel`'s forward (embed, layers, norm, LM head) over DeepSeek-V3 layers; its RoPE is
    `RotaryEmbedding(cfg)` (head_dim = qk_rope_head_dim: the rotated channels only)."""

    def __init__(self, cfg: DeepseekV3Config) -> None:
        super().__init__(cfg, layer=decoder_layer)


def config_from_hf(hf: dict[str, object]) -> DeepseekV3Config:
    """DeepseekV3Config from a config.json dict of a DeepSeek-V3 checkpoint (transformers 4 or 5 names)."""
    check_silu(hf)
    quant = hf.get("quantization_config")
    if quant:  # DeepSeek-V3's own release: fp8 weights with per-block weight_scale_inv tensors
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        raise ValueError(
            f"quantized checkpoints are not supported (quantization_config {method!r}): fdecode reads float "
            "weights; dequantize the checkpoint to bf16 first"
        )
    num_layers, heads = int(hf["num_hidden_layers"]), int(hf["num_attention_heads"])
    first_dense = int(hf.get("first_k_dense_replace") if hf.get("first_k_dense_replace") is not None else 3)
    rope_theta, rope_scaling = rope_from_hf(hf)
    q_lora = hf.get("q_lora_rank", 1536)  # transformers' default; an explicit null means a plain q_proj
    rope_dim = int(hf.get("qk_rope_head_dim") or 64)
    cfg = DeepseekV3Config(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=rope_dim,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=bool(hf.get("attention_bias", False)),
        max_position_embeddings=int(hf.get("max_position_embeddings") or 4096),
        model_type="deepseek_v3",
        q_lora_rank=None if q_lora is None else int(q_lora),
        kv_lora_rank=int(hf.get("kv_lora_rank") or 512),
        qk_nope_head_dim=int(hf.get("qk_nope_head_dim") or 128),
        qk_rope_head_dim=rope_dim,
        v_head_dim=int(hf.get("v_head_dim") or 128),
        rope_interleave=bool(hf.get("rope_interleave", True)),
        moe=sigmoid_moe_from_hf(hf, defaults=_MOE_DEFAULTS),  # also the MTP layer's (index num_layers)
        first_k_dense_replace=first_dense,
        mtp_num_layers=int(hf.get("num_nextn_predict_layers") or hf.get("num_mtp_layers") or 0),
    )
    rope_inv_freq(cfg)  # refuse unsupported RoPE types now rather than at the first forward
    return cfg


def mtp_head(cfg: DeepseekV3Config) -> NextNMTPHead:
    """The MTP head of DeepSeek's layout: `mtp_num_layers` modules, module k's decoder layer is layer
    `num_layers + k` (MLA, and the MoE where the config has one), its RoPE the target's."""
    return NextNMTPHead(cfg, layer=decoder_layer, rotary=RotaryEmbedding(cfg))


DEEPSEEK_V3 = Family(config_from_hf, rename_nextn, DeepseekV3Model, mtp_head)
