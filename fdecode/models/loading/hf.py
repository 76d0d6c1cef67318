"""Load and save fdecode models in the Hugging Face layout
(docs/design.md, "Model families and the registry").

`from_hf` accepts a transformers model instance or a local checkpoint folder (config.json +
safetensors, sharded with `model.safetensors.index.json` or not; read without transformers and
never through pickle, one tensor at a time, so the checkpoint is never in memory twice). `save_hf`
writes a folder both fdecode and `transformers.AutoModelForCausalLM.from_pretrained` can read.
MoE experts load from per-expert keys or fused tensors alike (`fdecode.models.loading.expert_weights`).

Which family loads a checkpoint: `fdecode.models.registry` (by config.json's `model_type`); its
`Family` maps the config and the key names (`fdecode.models.families.keys`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from fdecode.models.config import ModelConfig
from fdecode.models.families.family import Family
from fdecode.models.families.llama import ARCHITECTURES
from fdecode.models.layers.float32 import float32_names
from fdecode.models.llama import LlamaModel
from fdecode.models.loading.checkpoint import CheckpointTensors
from fdecode.models.loading.eos import eos_token_ids
from fdecode.models.loading.expert_weights import expert_parts, stack
from fdecode.models.registry import family_of


def config_to_hf(cfg: ModelConfig, *, dtype: torch.dtype) -> dict[str, object]:
    """config.json fields (transformers 5 layout) describing `cfg`."""
    rope = {"rope_type": "default"} if cfg.rope_scaling is None else dict(cfg.rope_scaling)
    rope["rope_theta"] = cfg.rope_theta
    return {
        "architectures": [ARCHITECTURES[cfg.model_type]],
        "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": cfg.attention_bias,
        "rope_parameters": rope,
        "dtype": str(dtype).removeprefix("torch."),
    }


def _few(keys: set[str]) -> str:
    return ", ".join(sorted(keys)[:5]) + (" ..." if len(keys) > 5 else "")


def _build(
    cfg: ModelConfig,
    weights: Mapping[str, torch.Tensor],
    *,
    dtype: torch.dtype | None,
    device: torch.device | str | None,
    family: Family,
) -> LlamaModel:
    """The family's model from checkpoint `weights` (a dict, or a `CheckpointTensors` read lazily): every
    name checked before a tensor is read, then one tensor at a time read, converted and kept."""
    sources = {}  # fdecode name -> checkpoint key
    for key in weights:
        name = family.rename(key, cfg.num_layers)
        if name is not None:
            sources[name] = key
    if cfg.tie_word_embeddings:
        sources.pop("lm_head.weight", None)  # a redundant copy of the embedding in some checkpoints
    has_mtp = any(k.startswith("mtp.") for k in sources)
    # Meta-device construction: no memory for weights that are about to be replaced.
    with torch.device("meta"):
        model = family.model(cfg)
        if has_mtp:
            model.mtp = family.mtp(cfg)
    shapes = {k: t.shape for k, t in model.state_dict().items()}
    float32 = float32_names(model)  # the MoE routers' weights and bias (`Float32Module`)
    expected = set(shapes) - ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
    # Per-expert checkpoint tensors make the stacked ones the MoE block holds (`expert_weights`).
    stacked = expert_parts(sources.keys(), shapes)
    used = {n for parts in stacked.values() for p in parts for n in p}
    given = (set(sources) - used) | set(stacked)
    missing, unexpected = expected - given, given - expected
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not match {cfg.model_type}: missing [{_few(missing)}], unexpected [{_few(unexpected)}]"
        )

    def read(name: str) -> torch.Tensor:
        return weights[sources[name]]

    # A tensor that already has the wanted device and dtype is shared, not copied (a live transformers
    # model's weights stay in one place); the others are converted copies.
    state = {}
    for name in sorted(expected):
        if name in stacked:
            state[name] = stack(stacked[name], read, shapes[name], dtype=dtype, device=device)
        else:
            t = read(name)
            if t.shape != shapes[name]:
                whose = (
                    " (the MTP layer must have the target's decoder-layer shapes)" if name.startswith("mtp.") else ""
                )
                raise ValueError(
                    f"{sources[name]} ({name}): shape {tuple(t.shape)} in the checkpoint, the model "
                    f"expects {tuple(shapes[name])}{whose}"
                )
            # The routers stay float32, as in transformers (`_keep_in_fp32_modules_strict`): they pick experts.
            want = torch.float32 if name in float32 and t.is_floating_point() else dtype or t.dtype
            state[name] = t.to(device=device or t.device, dtype=want)
    try:
        model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as err:  # shape mismatches
        raise ValueError(str(err)) from err
    model.tie_weights_()  # assign=True replaced embed_tokens.weight, breaking the tie
    if model.mtp is not None:
        model.mtp.bind(model)
    model.requires_grad_(False)
    # Moves the CPU-built RoPE buffers next to the weights.
    return model.to(device=model.embed_tokens.weight.device)


def read_config(obj: object) -> tuple[object, ModelConfig]:
    """(family, fdecode config) of a transformers model or a checkpoint folder, from its config alone: no
    weight is read (`fdecode.compile` checks a tensor-parallel split against it first)."""
    if isinstance(obj, (str, os.PathLike)):
        folder = Path(obj)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder} has no config.json")
        hf = json.loads((folder / "config.json").read_text())
    elif isinstance(obj, nn.Module) and hasattr(getattr(obj, "config", None), "to_dict"):
        hf = obj.config.to_dict()
    else:
        raise TypeError(f"from_hf expects a transformers PreTrainedModel or a folder path, got {type(obj).__name__}")
    family = family_of(hf.get("model_type"))
    return family, family.config_from_hf(hf)


def from_hf(obj: object, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> LlamaModel:
    """LlamaModel (with `.mtp` when the checkpoint has an MTP head) from a transformers model or a folder.

    dtype / device default to those of the source weights. A transformers model's weights that already
    have them are shared with it (same storage, no second copy); the others are converted copies.
    """
    family, cfg = read_config(obj)  # checked before any weight is read
    weights = CheckpointTensors(Path(obj)) if isinstance(obj, (str, os.PathLike)) else obj.state_dict()
    model = _build(cfg, weights, dtype=dtype, device=device, family=family)
    model.eos_token_ids = eos_token_ids(obj)  # the stop ids of requests that name none, once compiled
    source = Path(obj) if isinstance(obj, (str, os.PathLike)) else Path(getattr(obj, "name_or_path", "") or "")
    model.checkpoint = source if str(source) not in ("", ".") and source.is_dir() else None  # its tokenizer files
    return model


def save_hf(model: LlamaModel, folder: str | os.PathLike, *, mtp: bool = True) -> None:
    """Write config.json + model.safetensors in the HF layout (MTP head, if any, in layout (c); left out
    with mtp=False, for a transformers model that would only report its keys as unexpected)."""
    from safetensors.torch import save_file

    cfg = model.config
    if cfg.model_type not in ARCHITECTURES:
        raise ValueError(
            f"save_hf writes Llama-family checkpoints ({sorted(ARCHITECTURES)}), not {cfg.model_type!r}: save it "
            "with transformers (e.g. Qwen3_5ForCausalLM / Glm4MoeForCausalLM.save_pretrained), which from_hf reads back"
        )
    if cfg.model_type == "qwen2" and not cfg.attention_bias:
        raise ValueError("a qwen2 checkpoint always has q/k/v biases; this model has none")
    tensors = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # safetensors refuses shared storage; the tie is in config.json
        if name.startswith("mtp.") and not mtp:
            continue
        hf_name = name if name.startswith(("lm_head.", "mtp.")) else "model." + name
        tensors[hf_name] = tensor.detach().to("cpu").contiguous()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = config_to_hf(cfg, dtype=model.embed_tokens.weight.dtype)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    # transformers rejects safetensors files without the "format" metadata.
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
