"""The random models `fdecode bench` and the scripts in bench/ measure on, built from a size and a seed
(docs/design.md, "Benchmarks, assets and tools").

`llama`: a random Llama (hidden / 64 heads, at least 2, half as many KV heads), the random-draft
and draft=target workloads' target and draft. `qwen3_5`: a random Qwen3.5-shaped hybrid (Gated DeltaNet
and gated attention) with a random MTP head. `deepseek_v3`: a random DeepSeek-V3-shaped model (MLA
over the latent cache, a dense first layer, then MoE) with a random MTP head. `glm4_moe`: a random
GLM-4.5-shaped MoE model with a given number of experts and its random MTP head. Each takes the
vocabulary, the hidden size and the layers, so one figure (`--target HIDDENxLAYERS`) scales every
shape. `hf_pair`: the same weights of a target and a draft as transformers models, for the
transformers systems. Random weights accept few drafts: acceptance is measured on the bundled and
real models (`fdecode.bench.workloads`).
"""

from __future__ import annotations

from fdecode.models import LlamaModel, ModelConfig


def llama(vocab: int, hidden: int, layers: int, seed: int) -> LlamaModel:
    heads = max(hidden // 64, 2)
    cfg = ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=max(heads // 2, 1),
        head_dim=hidden // heads,
    )
    return LlamaModel.random(cfg, seed=seed, std=0.05)


def qwen3_5(vocab: int, hidden: int, layers: int, seed: int):
    """A random Qwen3.5-shaped hybrid (every 4th layer gated attention, the others Gated DeltaNet) with a
    random MTP head: Qwen3.5's head shapes scaled to `hidden` (head_dim 64, partial RoPE 0.25)."""
    from fdecode.models.hybrid import HybridModel
    from fdecode.models.hybrid_config import FULL, LINEAR, HybridConfig
    from fdecode.models.mtp.hybrid import HybridMTPHead

    heads = max(hidden // 64, 2)
    cfg = HybridConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=max(heads // 2, 1),
        head_dim=64,
        model_type="qwen3_5_text",
        partial_rotary_factor=0.25,
        layer_types=tuple(FULL if (i + 1) % 4 == 0 else LINEAR for i in range(layers)),
        linear_num_key_heads=heads,
        linear_num_value_heads=2 * heads,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
    )
    target = HybridModel.random(cfg, seed=seed, std=0.05)
    target.mtp = HybridMTPHead.random(cfg, seed=seed + 1, std=0.05).bind(target)
    return target


def deepseek_v3(vocab: int, hidden: int, layers: int, seed: int):
    """A random DeepSeek-V3-shaped model with a random MTP head: MLA over the latent cache with DeepSeek's
    ratios scaled to `hidden` (heads of 64: Dn = v = 64, Dr = 32, kv_lora_rank = hidden / 2, q_lora_rank =
    3 hidden / 4), a dense first layer, then MoE layers (16 experts of hidden / 4, top 4 within 2 of 4
    groups, one shared expert)."""
    from fdecode.models.deepseek_config import DeepseekV3Config
    from fdecode.models.families.deepseek_v3 import DeepseekV3Model, mtp_head
    from fdecode.models.moe_config import MoEConfig

    heads = max(hidden // 64, 2)
    cfg = DeepseekV3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=32,
        model_type="deepseek_v3",
        q_lora_rank=hidden * 3 // 4,
        kv_lora_rank=hidden // 2,
        qk_nope_head_dim=64,
        qk_rope_head_dim=32,
        v_head_dim=64,
        first_k_dense_replace=1,
        moe=MoEConfig(
            num_experts=16,
            top_k=4,
            moe_intermediate_size=hidden // 4,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
        ),
    )
    target = DeepseekV3Model.random(cfg, seed=seed, std=0.05)
    head = mtp_head(cfg)
    head.init_random_(seed=seed + 1, std=0.05)
    target.mtp = head.bind(target)
    return target


def glm4_moe(vocab: int, hidden: int, layers: int, seed: int, *, experts: int, top_k: int = 2):
    """A random GLM-4.5-shaped MoE model with a random MTP head (an MoE layer too): the first layer dense, then
    MoE layers of `experts` routed experts of intermediate `hidden`, `top_k` of them a token, and one shared
    expert; GQA 4:2 heads of hidden / 4, partial RoPE, q/k/v biases."""
    from fdecode.models.families.glm4_moe import Glm4MoeConfig, Glm4MoeModel, Glm4MoeMTPHead
    from fdecode.models.moe_config import MoEConfig

    cfg = Glm4MoeConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_layers=layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=hidden // 4,
        attention_bias=True,
        model_type="glm4_moe",
        first_k_dense_replace=1,
        moe=MoEConfig(num_experts=experts, top_k=top_k, moe_intermediate_size=hidden, n_shared_experts=1),
        mtp_num_layers=1,
    )
    model = Glm4MoeModel.random(cfg, seed=seed, std=0.05)
    model.mtp = Glm4MoeMTPHead.random(cfg, seed=seed + 1, std=0.05).bind(model)
    return model


def hf_pair(target: LlamaModel, draft: LlamaModel):
    """The same weights as transformers models (saved and loaded through the HF layout)."""
    import tempfile

    from transformers import AutoModelForCausalLM

    from fdecode.models import save_hf

    models = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, model in enumerate((target, draft)):
            save_hf(model, f"{tmp}/{i}", mtp=False)  # transformers has no MTP head: it would report its keys
            models.append(AutoModelForCausalLM.from_pretrained(f"{tmp}/{i}").eval())
    return models[0], models[1]
