"""Load and save fdecode models in the Hugging Face layout.

`from_hf` accepts a transformers model instance or a local checkpoint folder
(config.json + safetensors, sharded with `model.safetensors.index.json` or not; read
without transformers and never through pickle). A folder is read one tensor at a time
(`fdecode.models.checkpoint.CheckpointTensors`, `safetensors.safe_open`): every key is
checked first, then each tensor is read, converted and kept, so the checkpoint is never
in memory twice. `save_hf` writes a folder both fdecode and
`transformers.AutoModelForCausalLM.from_pretrained` can read.

MoE experts: per-expert keys `...mlp.experts.N.{gate,up,down}_proj.weight` (checkpoints,
`save_pretrained`) or transformers' fused `experts.gate_up_proj` / `experts.down_proj` (a live
model) both load into the stacked layout (`fdecode.models.expert_weights`).

Key names: HF `model.<name>` is fdecode `<name>`, `lm_head.weight` is the same.
A multi-token-prediction head is recognised in three layouts and loaded as `model.mtp`:
  (a) Qwen3-Next: mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.layers.0.*, mtp.norm
  (b) DeepSeek-V3: model.layers.<num_layers>.{enorm,hnorm,eh_proj,shared_head.norm,<decoder layer>}
      (the DeepSeek-V3 / GLM-4.5 families: module k at model.layers.<num_layers + k>.*, `nextn_mtp.rename`)
  (c) fdecode (what save_hf writes): mtp.enorm, mtp.hnorm, mtp.eh_proj, mtp.layer.*, mtp.norm
Only the key names are translated: the MTP layer must have this model's decoder-layer shapes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from fdecode.models.config import SUPPORTED_MODEL_TYPES, ModelConfig
from fdecode.models.checkpoint import CheckpointTensors
from fdecode.models.eos import eos_token_ids
from fdecode.models.expert_weights import expert_parts, stack
from fdecode.models.float32 import float32_names
from fdecode.models.llama import LlamaModel
from fdecode.models.mtp import MTPHead
from fdecode.models.rope import rope_inv_freq

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# transformers' defaults for fields a config.json may leave out.
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "qwen2": 32768, "qwen3": 32768}
_QWEN3_DEFAULT_HEAD_DIM = 128  # Qwen3Config's default; the other types derive head_dim from the hidden size
_QWEN3_NEXT_NAMES = {
    "mtp.fc.": "mtp.eh_proj.",
    "mtp.pre_fc_norm_embedding.": "mtp.enorm.",
    "mtp.pre_fc_norm_hidden.": "mtp.hnorm.",
    "mtp.layers.0.": "mtp.layer.",
}


def config_from_hf(hf: dict[str, object]) -> ModelConfig:
    """Build a ModelConfig from a config.json dict (transformers 4 or 5 field names)."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"unsupported model_type {model_type!r}; fdecode supports {SUPPORTED_MODEL_TYPES}")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r}; fdecode implements silu")
    if hf.get("mlp_bias") or hf.get("use_sliding_window"):
        raise ValueError("mlp_bias and sliding-window attention are not supported")
    rope_theta, rope_scaling = _rope_from_hf(hf)
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


def shape_fields(hf: dict[str, object], *, default_head_dim: int | None = None) -> dict[str, int]:
    """The ModelConfig sizes every decoder family reads alike from config.json: vocabulary, hidden and MLP
    sizes, layers, heads (KV heads default to the query heads), head_dim (`default_head_dim`, else
    hidden_size / heads, where config.json has none)."""
    heads = int(hf["num_attention_heads"])
    return dict(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or default_head_dim or int(hf["hidden_size"]) // heads),
    )


def _rope_from_hf(hf: dict[str, object]) -> tuple[float, tuple[tuple[str, object], ...] | None]:
    params: dict[str, object] = {}
    # transformers 4 writes `rope_scaling`, transformers 5 `rope_parameters` (which also holds rope_theta).
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(hf.get(key), dict):
            params.update(hf[key])
    theta = float(params.pop("rope_theta", None) or hf.get("rope_theta") or 10000.0)
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if rope_type == "default":
        return theta, None
    if "original_max_position_embeddings" in hf and rope_type in ("llama3", "yarn"):
        # As in transformers: a top-level value (Phi-3 style) wins over the one inside the rope dict.
        params["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
    params["rope_type"] = rope_type
    hashable = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}
    return theta, tuple(sorted(hashable.items()))


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


def _rename(hf_key: str, num_layers: int) -> str | None:
    """fdecode name of a checkpoint key, or None for keys that are deliberately ignored."""
    if hf_key.endswith("rotary_emb.inv_freq"):
        return None  # older checkpoints saved the RoPE table; fdecode recomputes it
    mtp_prefix = f"model.layers.{num_layers}."
    if hf_key.startswith(mtp_prefix):  # (b) DeepSeek-V3
        part = nextn_part(hf_key[len(mtp_prefix) :])
        return None if part is None else "mtp." + part
    for old, new in _QWEN3_NEXT_NAMES.items():  # (a) Qwen3-Next
        if hf_key.startswith(old):
            return new + hf_key[len(old) :]
    if hf_key.startswith("model."):
        return hf_key[len("model.") :]
    return hf_key  # lm_head.*, and mtp.* of layouts (a) norm and (c)


def nextn_part(rest: str) -> str | None:
    """The fdecode name, within one MTP module, of the key `model.layers.{N}.<rest>` of layout (b) (`enorm.*`,
    `hnorm.*`, `eh_proj.*`, `norm.*`, `layer.*`); None for its copies of the target's embedding / LM head,
    which the head shares (`nextn_mtp.rename`: the modules of a head of several)."""
    if rest.startswith(("embed_tokens.", "shared_head.head.")):
        return None
    if rest.startswith(("enorm.", "hnorm.", "eh_proj.")):
        return rest
    if rest.startswith("shared_head.norm."):
        return "norm." + rest[len("shared_head.norm.") :]
    return "layer." + rest


def _few(keys: set[str]) -> str:
    return ", ".join(sorted(keys)[:5]) + (" ..." if len(keys) > 5 else "")


class Family(NamedTuple):
    """How a model family loads: its config mapping, checkpoint key mapping and module classes."""

    config_from_hf: Callable[[dict[str, object]], ModelConfig]
    rename: Callable[[str, int], str | None]  # (checkpoint key, num_layers) -> fdecode name, None = ignored
    model: Callable[[ModelConfig], nn.Module]
    mtp: Callable[[ModelConfig], nn.Module]


def family_of(model_type: object) -> Family:
    """The family that loads `model_type`: Llama / Qwen2 / Qwen3 here, Qwen3.5 in `fdecode.models.qwen3_5`,
    DeepSeek-V3 in `fdecode.models.deepseek_v3`, GLM-4.5 in `fdecode.models.glm4_moe`."""
    from fdecode.models.deepseek_v3 import DEEPSEEK_V3  # local: these modules build on this one
    from fdecode.models.glm4_moe import GLM4_MOE, GLM4_MOE_TYPES
    from fdecode.models.qwen3_5 import QWEN3_5, QWEN3_5_MOE, QWEN3_5_MOE_TYPES, QWEN3_5_TYPES
    from fdecode.models.qwen3_next import QWEN3_NEXT

    qwen = {**dict.fromkeys(QWEN3_5_TYPES, QWEN3_5), **dict.fromkeys(QWEN3_5_MOE_TYPES, QWEN3_5_MOE), "qwen3_next": QWEN3_NEXT}
    families = {**qwen, "deepseek_v3": DEEPSEEK_V3,
                **dict.fromkeys(GLM4_MOE_TYPES, GLM4_MOE)}
    return families.get(model_type, LLAMA)


def _build(
    cfg: ModelConfig,
    weights: Mapping[str, torch.Tensor],
    *,
    dtype: torch.dtype | None,
    device: torch.device | str | None,
    family: Family | None = None,
) -> LlamaModel:
    """The family's model from checkpoint `weights` (a dict, or a `CheckpointTensors` read lazily): every
    name checked before a tensor is read, then one tensor at a time read, converted and kept."""
    family = LLAMA if family is None else family
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
        raise ValueError(f"checkpoint does not match {cfg.model_type}: missing [{_few(missing)}], unexpected [{_few(unexpected)}]")

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
                whose = " (the MTP layer must have the target's decoder-layer shapes)" if name.startswith("mtp.") else ""
                raise ValueError(f"{sources[name]} ({name}): shape {tuple(t.shape)} in the checkpoint, the model "
                                 f"expects {tuple(shapes[name])}{whose}")
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


LLAMA = Family(config_from_hf, _rename, LlamaModel, MTPHead)


def from_hf(obj: object, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> LlamaModel:
    """LlamaModel (with `.mtp` when the checkpoint has an MTP head) from a transformers model or a folder.

    dtype / device default to those of the source weights. A transformers model's weights that already
    have them are shared with it (same storage, no second copy); the others are converted copies.
    """
    if isinstance(obj, (str, os.PathLike)):
        folder = Path(obj)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder} has no config.json")
        # The config is checked before any weight is read.
        hf = json.loads((folder / "config.json").read_text())
        family = family_of(hf.get("model_type"))
        cfg, weights = family.config_from_hf(hf), CheckpointTensors(folder)
    elif isinstance(obj, nn.Module) and hasattr(getattr(obj, "config", None), "to_dict"):
        hf = obj.config.to_dict()
        family = family_of(hf.get("model_type"))
        cfg, weights = family.config_from_hf(hf), obj.state_dict()
    else:
        raise TypeError(f"from_hf expects a transformers PreTrainedModel or a folder path, got {type(obj).__name__}")
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
