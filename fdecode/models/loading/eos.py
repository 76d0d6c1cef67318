"""The model's EOS ids: what transformers' `generate` and vLLM stop on when a request names none
(docs/design.md, "Priming").

transformers stops at `generation_config.eos_token_id`. A model built from a config gets a
generation config copied from it (`GenerationConfig.from_model_config`); `from_pretrained` reads a
checkpoint's generation_config.json, or config.json's `eos_token_id` where there is none. Either may
be an id, a list of ids or null. `from_hf` records the ids of what it loads on the fdecode model
(`LlamaModel.eos_token_ids`), so a model loaded first and compiled later keeps them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from fdecode.scalars import token_ids


def _ids(value: object) -> tuple[int, ...]:
    ids = [] if value is None else token_ids(value)
    if ids is None:
        raise ValueError(f"the model's eos_token_id must be an id or a list of ids, got {value!r}")
    return tuple(dict.fromkeys(ids))  # in order, once each


def _read(file: Path) -> dict:
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError):
        return {}


def eos_token_ids(source: object) -> tuple[int, ...]:
    """The EOS ids of `source`: a transformers model, a checkpoint folder, or an fdecode model (the ids
    `from_hf` recorded on it; none for a model built otherwise). () where it names none."""
    if isinstance(source, (str, os.PathLike)):
        folder = Path(source)
        generation = folder / "generation_config.json"
        config = _read(generation) if generation.is_file() else _read(folder / "config.json")
        return _ids(config.get("eos_token_id"))
    if isinstance(source, torch.nn.Module):
        recorded = source.__dict__.get("eos_token_ids")
        if recorded is not None:
            return tuple(recorded)
        generation = getattr(source, "generation_config", None)
        config = generation if generation is not None else getattr(source, "config", None)
        return _ids(getattr(config, "eos_token_id", None))
    return ()
