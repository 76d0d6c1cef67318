"""Turn what users pass to `fdecode.compile` into fdecode models on the step's device and dtype
(docs/design.md, "Backends and kernels").

The caller's models are never changed: the step gets module trees of its own (`owned`) whose
parameters are the caller's very objects where they already have the step's device and dtype
(no second copy of the weights) and converted copies where they do not.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path

import torch

from fdecode.config import DecodeConfig
from fdecode.models.config import ModelConfig
from fdecode.models.hybrid import HybridModel
from fdecode.models.layers.float32 import dtype_in
from fdecode.models.llama import LlamaModel
from fdecode.models.loading.eos import eos_token_ids
from fdecode.models.loading.hf import from_hf, read_config
from fdecode.models.mtp.head import MTPHead


def _is_hf_model(obj: object) -> bool:
    return isinstance(obj, torch.nn.Module) and hasattr(obj, "config") and hasattr(obj.config, "model_type")


def _checkpoint_dtype(folder: Path) -> torch.dtype:
    """The dtype a checkpoint folder's config.json names (`dtype`, or the older `torch_dtype`); float32 where
    it names none (vLLM's choice). A missing or unreadable config.json is left to `from_hf` to report."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return torch.float32
    name = config.get("dtype") or config.get("torch_dtype")
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def _own_device_dtype(target: object) -> tuple[str, torch.dtype]:
    """Where and in what dtype `target` (a model or a checkpoint folder) holds its weights."""
    if isinstance(target, torch.nn.Module):
        weight = next((p for p in target.parameters() if p.is_floating_point()), None)
        if weight is not None:
            return str(weight.device), weight.dtype
    elif isinstance(target, (str, os.PathLike)):
        return "cpu", _checkpoint_dtype(Path(target))
    return "cpu", torch.float32


def resolve_config(target: object, cfg: DecodeConfig) -> DecodeConfig:
    """`cfg` with `dtype="auto"` and `device=None` replaced by the target's own dtype and device, and
    `eos_token_id="auto"` by the target's EOS ids (`fdecode.models.loading.eos`)."""
    if cfg.eos_token_id == "auto":
        ids = eos_token_ids(target)
        if len(ids) > cfg.max_stop_ids:
            raise ValueError(
                f"the model's generation config has {len(ids)} EOS ids {list(ids)} but DecodeConfig.max_stop_ids "
                f"is {cfg.max_stop_ids}: raise max_stop_ids, or pass DecodeConfig(eos_token_id=...)"
            )
        cfg = dataclasses.replace(cfg, eos_token_id=ids)
    if cfg.dtype != "auto" and cfg.device is not None:
        return cfg
    device, dtype = _own_device_dtype(target)
    return dataclasses.replace(
        cfg, device=device if cfg.device is None else cfg.device, dtype=dtype if cfg.dtype == "auto" else cfg.dtype
    )


def owned(model: torch.nn.Module, cfg: DecodeConfig) -> torch.nn.Module:
    """A module tree of the step's own, equal to `model` on `cfg.device` in `cfg.dtype`; `model` is untouched.

    Every module is a shallow copy (in eval mode); each parameter is the caller's very object when it
    already has the step's device and dtype and needs no gradient, else a converted copy (tied
    weights stay tied: one tensor, one replacement). Buffers (the float32 RoPE frequencies) keep
    their dtype and only move device; a `Float32Module`'s parameters (the MoE routers) are float32.
    An MTP head's borrowed embedding / LM head point at the copies."""
    device, dtype = torch.device(cfg.device), cfg.dtype
    tensors: dict[int, torch.Tensor] = {}
    modules: dict[int, torch.nn.Module] = {}

    def parameter(p: torch.nn.Parameter, dtype: torch.dtype) -> torch.nn.Parameter:
        if id(p) not in tensors:
            moved = p.to(device=device, dtype=dtype if p.is_floating_point() else p.dtype)
            keep = moved is p and not p.requires_grad
            tensors[id(p)] = p if keep else torch.nn.Parameter(moved.detach(), requires_grad=False)
        return tensors[id(p)]

    def buffer(b: torch.Tensor) -> torch.Tensor:
        if id(b) not in tensors:
            tensors[id(b)] = b.to(device=device)
        return tensors[id(b)]

    def tree(m: torch.nn.Module) -> torch.nn.Module:
        if id(m) not in modules:
            new = copy.copy(m)  # shares m's attribute dicts: replace the ones holding tensors and submodules
            modules[id(m)] = new
            own = dtype_in(m, dtype)  # float32 for the MoE routers (`Float32Module`)
            new.__dict__["_parameters"] = {
                k: None if p is None else parameter(p, own) for k, p in m._parameters.items()
            }
            new.__dict__["_buffers"] = {k: None if b is None else buffer(b) for k, b in m._buffers.items()}
            new.__dict__["_non_persistent_buffers_set"] = set(m._non_persistent_buffers_set)
            new.__dict__["_modules"] = {k: None if c is None else tree(c) for k, c in m._modules.items()}
            new.__dict__["training"] = False  # inference-mode layers
        return modules[id(m)]

    result = tree(model)
    for new in modules.values():  # MTP heads keep (embed_tokens, lm_head) outside the module tree
        shared = new.__dict__.get("_shared")
        if shared is not None:
            new.__dict__["_shared"] = tuple(modules.get(id(part), part) for part in shared)
    return result


# What each argument of `fdecode.compile` may be, for its messages.
KINDS = {
    "target": "a transformers causal LM, a checkpoint folder or a fdecode LlamaModel",
    "draft": "a transformers causal LM, a checkpoint folder, a fdecode LlamaModel, an MTPHead, 'mtp' (the "
    "target's own MTP head), 'ngram' or an NgramDraft (prompt lookup)",
}


def config_of(obj: object) -> ModelConfig:
    """The fdecode config of a target argument (an fdecode model, a transformers model, a checkpoint folder),
    read without loading any weight (raises as `resolve_target` would where it is none of them)."""
    if isinstance(obj, (LlamaModel, HybridModel)):
        return obj.config
    if isinstance(obj, (str, os.PathLike)) or _is_hf_model(obj):
        _check_folder(obj, "target")
        return read_config(obj)[1]
    raise TypeError(f"target must be {KINDS['target']}, got {type(obj).__name__}")


def _check_folder(obj: object, role: str) -> None:
    if isinstance(obj, (str, os.PathLike)) and not (Path(obj) / "config.json").is_file():
        where = "no such folder" if not Path(obj).is_dir() else "it has no config.json"
        raise FileNotFoundError(
            f"{role} {str(obj)!r} is not a checkpoint folder ({where}); the {role} must be {KINDS[role]}"
        )


def resolve_target(obj: object, cfg: DecodeConfig, role: str = "target") -> LlamaModel:
    """`obj` as an fdecode model the step owns (see `owned`); `cfg` is resolved (`resolve_config`).
    role: "target" or "draft" (a draft LM goes through here too), the argument messages name."""
    if isinstance(obj, MTPHead) and role == "target":
        raise TypeError("an MTPHead cannot be the target; pass it (or 'mtp') as the draft")
    _check_folder(obj, role)
    if isinstance(obj, (LlamaModel, HybridModel)):
        model = obj
    elif isinstance(obj, (str, os.PathLike)) or _is_hf_model(obj):
        model = from_hf(obj, dtype=cfg.dtype, device=cfg.device)  # a fresh model, loaded where it runs
    else:
        raise TypeError(f"{role} must be {KINDS[role]}, got {type(obj).__name__}")
    return owned(model, cfg)  # its MTP head (a submodule), if any, comes along
