"""Tiny DeepSeek-V3 models for the MLA tests: transformers' DeepseekV3ForCausalLM is the oracle.

`hf_deepseek` draws every weight afresh (and a nonzero `e_score_correction_bias`) at a scale where a
swapped rope layout, a wrong softmax scale, a norm eps or a routing slip moves the logits far past
1e-4. The shapes are all different (R = 16, Dr = 8, Dn = 12, Dv = 10, Rq = 12, H = 4) so a
transposed or mis-split projection cannot go unnoticed; DeepSeek's YaRN with mscale / mscale_all_dim;
a dense first layer, then MoE layers routed within the 2 best of 4 groups.
"""

from __future__ import annotations

import functools
import json

import torch
import transformers
from safetensors.torch import load_file, save_file

import fdecode
from fdecode.models import from_hf
from fdecode.models.deepseek_config import DeepseekV3Config
from fdecode.models.moe_config import MoEConfig

VOCAB = 97
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "mscale": 0.7,
    "mscale_all_dim": 0.9,
    "beta_fast": 32,
    "beta_slow": 1,
}


def hf_config(**overrides) -> transformers.DeepseekV3Config:
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=4,
        topk_group=2,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        kv_lora_rank=16,
        q_lora_rank=12,
        qk_rope_head_dim=8,
        qk_nope_head_dim=12,
        v_head_dim=10,
        max_position_embeddings=512,
        rope_parameters=YARN,
        tie_word_embeddings=False,
        num_nextn_predict_layers=0,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    base.update(overrides)
    return transformers.DeepseekV3Config(**base)


def _freeze(overrides: dict) -> tuple:
    return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in overrides.items()))


@functools.cache
def _hf(seed: int, frozen: tuple) -> transformers.DeepseekV3ForCausalLM:
    overrides = {k: json.loads(v) for k, v in frozen}
    torch.manual_seed(seed)
    model = transformers.DeepseekV3ForCausalLM(hf_config(**overrides)).eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
    return model


def hf_deepseek(seed: int = 0, **overrides) -> transformers.DeepseekV3ForCausalLM:
    """A random tiny DeepSeek-V3 (cached per arguments: do not modify it)."""
    return _hf(seed, _freeze(overrides))


def prompts(lengths=(7, 11, 4), seed=1) -> list[tuple[int, ...]]:
    gen = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(0, VOCAB, (n,), generator=gen).tolist()) for n in lengths]


PROMPTS = prompts()
NEW = 10


@functools.cache
def hf_greedy(prompt: tuple[int, ...], new: int = NEW, seed: int = 0) -> list[int]:
    out = hf_deepseek(seed).generate(
        torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


def compiled(target, draft, k: int, backend: str = "eager", **changes):
    cfg = fdecode.DecodeConfig(
        **{
            "num_draft_tokens": k,
            "max_batch": 4,
            "max_seq_len": 64,
            "block_size": 4,
            "backend": backend,
            "dtype": torch.float32,
            **changes,
        }
    )
    return fdecode.compile(target, draft, cfg)


def generate(step, prompts=PROMPTS, new: int = NEW) -> list[list[int]]:
    return fdecode.generate(step, [list(p) for p in prompts], max_new_tokens=new, progress=False)


# fdecode MTP-module names -> DeepSeek's names under model.layers.{num_hidden_layers + k}.
_DEEPSEEK_MTP = {
    "enorm.": "enorm.",
    "hnorm.": "hnorm.",
    "eh_proj.": "eh_proj.",
    "norm.": "shared_head.norm.",
    "layer.": "",
}


def deepseek_checkpoint_names(head_state: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """A `NextNMTPHead`'s tensors (`layers.k.*`) under DeepSeek's (and GLM's) names, module k at
    `model.layers.{num_layers + k}.*`, with the routed experts written one by one
    (`mlp.experts.N.{gate,up,down}_proj.weight`) as real checkpoints are."""
    out = {}
    for name, tensor in head_state.items():
        _, k, rest = name.split(".", 2)
        prefix = next(p for p in _DEEPSEEK_MTP if rest.startswith(p))
        key = f"model.layers.{num_layers + int(k)}." + _DEEPSEEK_MTP[prefix] + rest[len(prefix) :]
        if key.endswith("mlp.experts.gate_up_proj"):
            for n, fused in enumerate(tensor):
                gate, up = fused.chunk(2)
                out[key.replace("gate_up_proj", f"{n}.gate_proj.weight")] = gate.contiguous()
                out[key.replace("gate_up_proj", f"{n}.up_proj.weight")] = up.contiguous()
        elif key.endswith("mlp.experts.down_proj"):
            for n, down in enumerate(tensor):
                out[key.replace("down_proj", f"{n}.down_proj.weight")] = down.contiguous()
        else:
            out[key] = tensor.contiguous()
    return out


def save_with_mtp(folder, head_state: dict[str, torch.Tensor], *, seed: int = 0, declared: int | None = None) -> None:
    """transformers' save_pretrained of the target, plus the MTP modules of `head_state` in DeepSeek's
    layout in a second shard (`model.safetensors.index.json` names both): module k at
    `model.layers.{N + k}.{enorm, hnorm, eh_proj, shared_head.norm, <decoder layer>}` with the
    embed_tokens / shared_head.head copies real checkpoints carry; `num_nextn_predict_layers` in
    config.json = `declared`, default the number of modules."""
    hf = hf_deepseek(seed)
    hf.save_pretrained(folder)
    n = hf.config.num_hidden_layers
    target = load_file(str(folder / "model.safetensors"))
    mtp = deepseek_checkpoint_names(head_state, n)
    modules = len({name.split(".")[1] for name in head_state})
    for k in range(modules):
        mtp[f"model.layers.{n + k}.embed_tokens.weight"] = target["model.embed_tokens.weight"].clone()
        mtp[f"model.layers.{n + k}.shared_head.head.weight"] = target["lm_head.weight"].clone()
    save_file(mtp, str(folder / "model-mtp.safetensors"), metadata={"format": "pt"})
    weight_map = {**dict.fromkeys(target, "model.safetensors"), **dict.fromkeys(mtp, "model-mtp.safetensors")}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": declared or modules}))


def random_mtp_state(seed: int = 3, std: float = 0.3, layers: int = 1, **overrides) -> dict[str, torch.Tensor]:
    """A random DeepSeek MTP head of `layers` modules (fdecode names) for the target `hf_deepseek(**overrides)`."""
    from fdecode.models.families.deepseek_v3 import mtp_head

    head = mtp_head(from_hf(hf_deepseek(**overrides)).config.replace(mtp_num_layers=layers))
    head.init_random_(seed=seed, std=std)
    return head.state_dict()


# A DeepSeek-V3 at the 5-token vocabulary of `support.tiny_vocab`: its sampling tests' exact distributions.
TINY_MLA_VOCAB = 5
TINY_MLA = DeepseekV3Config(
    vocab_size=TINY_MLA_VOCAB,
    hidden_size=16,
    intermediate_size=24,
    num_layers=2,
    num_heads=2,
    num_kv_heads=2,
    head_dim=4,
    model_type="deepseek_v3",
    q_lora_rank=6,
    kv_lora_rank=8,
    qk_nope_head_dim=4,
    qk_rope_head_dim=4,
    v_head_dim=4,
    first_k_dense_replace=1,
    moe=MoEConfig(num_experts=4, top_k=2, moe_intermediate_size=8, n_group=2, topk_group=1, routed_scaling_factor=1.5),
)


def deepseek_target(seed: int = 0, **overrides):
    return from_hf(hf_deepseek(seed, **overrides))


@functools.cache
def agreeing_pair() -> tuple[transformers.DeepseekV3ForCausalLM, object]:
    """A one-layer DeepSeek-V3 (all MoE) with unit-RMS embedding rows, and a NextN head that agrees with it:
    module 0's decoder layer, final norm and `eh_proj = [I | 0]` copy the target's, so its x is
    enorm(embed(token)) = embed(token) and it proposes the target's own greedy token (drafts accepted deep).
    Returns (the transformers model, its fdecode target with the head as `target.mtp`); do not modify them."""
    import copy

    from fdecode.models.families.deepseek_v3 import mtp_head

    hf = copy.deepcopy(hf_deepseek(0, num_hidden_layers=1, first_k_dense_replace=0))
    with torch.no_grad():
        rows = hf.model.embed_tokens.weight
        rows.copy_(rows / rows.pow(2).mean(-1, keepdim=True).sqrt())
    target = from_hf(hf)
    head = mtp_head(target.config.replace(mtp_num_layers=1))
    head.init_random_(seed=3, std=0.1)
    width, module = target.config.hidden_size, head.layers[0]
    with torch.no_grad():
        module.enorm.weight.fill_(1.0)
        module.eh_proj.weight.zero_()
        module.eh_proj.weight[:, :width] = torch.eye(width)
        module.layer.load_state_dict(target.layers[0].state_dict())
        module.norm.load_state_dict(target.norm.state_dict())
    target.mtp = head.bind(target)
    return hf, target


def greedy_of(hf, prompt, new: int = NEW) -> list[int]:
    """transformers' greedy continuation of `prompt` by `hf`."""
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt) :].tolist()
