"""Turn what users pass to `fdecode.compile` into fdecode models on the step's device and dtype."""

from __future__ import annotations

from pathlib import Path

import torch

from fdecode.config import DecodeConfig
from fdecode.models.llama import LlamaModel
from fdecode.models.loading import from_hf
from fdecode.models.mtp import MTPHead


def _prepare(model: torch.nn.Module, cfg: DecodeConfig) -> torch.nn.Module:
    # Weights are read-only inputs of the graph: no autograd state, inference-mode layers.
    return model.to(device=cfg.device, dtype=cfg.dtype).requires_grad_(False).eval()


def _is_hf_model(obj: object) -> bool:
    return isinstance(obj, torch.nn.Module) and hasattr(obj, "config") and hasattr(obj.config, "model_type")


def resolve_target(obj: object, cfg: DecodeConfig) -> LlamaModel:
    if isinstance(obj, MTPHead):
        raise TypeError("an MTPHead cannot be the target; pass it (or 'mtp') as the draft")
    if isinstance(obj, LlamaModel):
        model = obj
    elif isinstance(obj, (str, Path)) or _is_hf_model(obj):
        model = from_hf(obj)
    else:
        raise TypeError(
            f"target must be a transformers causal LM, a checkpoint folder or a fdecode LlamaModel, "
            f"got {type(obj).__name__}"
        )
    model = _prepare(model, cfg)
    if model.mtp is not None:
        _prepare(model.mtp, cfg)
    return model


def resolve_draft(obj: object, target: LlamaModel, cfg: DecodeConfig) -> tuple[torch.nn.Module, str]:
    """Returns (draft model, kind) with kind "mtp" or "model"."""
    if isinstance(obj, str) and obj == "mtp":
        if target.mtp is None:
            raise ValueError("draft='mtp' but the target has no MTP head (no mtp.* weights in its checkpoint)")
        return target.mtp, "mtp"
    if isinstance(obj, MTPHead):
        if obj.config.hidden_size != target.config.hidden_size or obj.config.vocab_size != target.config.vocab_size:
            raise ValueError("the MTP head was built for another target (hidden size or vocabulary differs)")
        obj.bind(target)
        return _prepare(obj, cfg), "mtp"
    draft = resolve_target(obj, cfg)
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft vocabulary ({draft.config.vocab_size}) differs from the target's ({target.config.vocab_size}); "
            "speculative decoding needs a shared tokenizer"
        )
    return draft, "model"
