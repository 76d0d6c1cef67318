"""Tiny GLM-4.5 (`glm4_moe`) models for the GLM tests: transformers' Glm4MoeForCausalLM is the oracle.

`hf_glm` draws every weight and the routers' e_score_correction_bias afresh (transformers' init zeroes
the bias and sets the norms to 1) at a scale where a dropped bias, a wrong rotary width or a wrong
expert choice moves the logits far past 1e-4. `save_glm` writes transformers' save_pretrained in
shards with an index (per-expert keys) plus an MTP layer in GLM's own layout (`model.layers.{N}.*`).
"""

from __future__ import annotations

import functools
import json

import torch
import transformers
from safetensors.torch import save_file

from fdecode.models import from_hf
from fdecode.models.families.glm4_moe import Glm4MoeMTPHead
from support.deepseek_models import deepseek_checkpoint_names

VOCAB = 97
VARIANTS = {
    # q/k/v bias + q/k norm, grouped routing (1 of 2 groups), a dense first layer
    "bias-qknorm-grouped": dict(attention_bias=True, use_qk_norm=True, n_group=2, topk_group=1),
    # no bias, no q/k norm, one group, no renormalisation, two dense layers
    "plain": dict(
        attention_bias=False, use_qk_norm=False, n_group=1, topk_group=1, norm_topk_prob=False, first_k_dense_replace=2
    ),
}


def hf_config(**overrides) -> transformers.Glm4MoeConfig:
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,  # GQA 2:1; partial_rotary_factor 0.5 (GLM's default): 8 of 16 rotate
        moe_intermediate_size=8,
        n_routed_experts=8,
        num_experts_per_tok=3,
        n_shared_experts=1,
        first_k_dense_replace=1,
        routed_scaling_factor=1.5,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    base.update(overrides)
    return transformers.Glm4MoeConfig(**base)


@functools.cache
def hf_glm(variant: str = "bias-qknorm-grouped", seed: int = 0, **overrides) -> transformers.Glm4MoeForCausalLM:
    torch.manual_seed(seed)
    config = hf_config(**{**VARIANTS[variant], **overrides})
    model = transformers.Glm4MoeForCausalLM(config).eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if "inv_freq" not in name:
            t.copy_(0.3 * torch.randn(t.shape, generator=gen) + (1.0 if name.endswith("norm.weight") else 0.0))
    return model


def prompts(lengths=(7, 11, 4), seed=1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen) for n in lengths]


PROMPTS = [tuple(p.tolist()) for p in prompts()]
NEW = 10


@functools.cache
def hf_greedy(prompt: tuple[int, ...], variant: str = "bias-qknorm-grouped", new: int = NEW) -> list[int]:
    out = hf_glm(variant).generate(
        torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


def mtp_tensors(num_layers: int, *, seed: int = 3, layers: int = 1) -> dict[str, torch.Tensor]:
    """A random GLM MTP head of `layers` modules under GLM's checkpoint names: module k at
    model.layers.{N + k}.{enorm, hnorm, eh_proj, shared_head.norm, shared_head.head, embed_tokens,
    <decoder layer with per-expert keys>}."""
    cfg = from_hf(hf_glm()).config.replace(mtp_num_layers=layers)
    out = deepseek_checkpoint_names(Glm4MoeMTPHead.random(cfg, seed=seed, std=0.3).state_dict(), num_layers)
    for k in range(layers):  # copies GLM checkpoints carry; never loaded
        out[f"model.layers.{num_layers + k}.embed_tokens.weight"] = torch.zeros(VOCAB, 32)
        out[f"model.layers.{num_layers + k}.shared_head.head.weight"] = torch.zeros(VOCAB, 32)
    return out


def save_glm(folder, *, mtp: bool = True, change=None, layers: int = 1, declared: int | None = None) -> dict[str, str]:
    """save_pretrained in ~3 shards with model.safetensors.index.json, an MTP head of `layers` modules in
    one more shard (listed in the index; `num_nextn_predict_layers` = `declared`, default `layers`);
    `change(tensors)` may edit the MTP shard's tensors. Returns the weight map."""
    hf = hf_glm()
    hf.save_pretrained(folder, max_shard_size="20KB")
    index_file = folder / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    if mtp:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": declared or layers}))
        extra = mtp_tensors(hf.config.num_hidden_layers, layers=layers)
        if change is not None:
            change(extra)
        save_file(extra, str(folder / "model-mtp.safetensors"), metadata={"format": "pt"})
        index["weight_map"].update(dict.fromkeys(extra, "model-mtp.safetensors"))
        index_file.write_text(json.dumps(index))
    return index["weight_map"]
