"""The one list of supported checkpoints: `model_type` -> the family that loads it (docs/design.md, "Model
families and the registry").

Family modules are imported lazily, on the first `family_of` of one of their types, and never import
this module. To add a family:
1. write `fdecode/models/families/<name>.py`: its config (a `ModelConfig` subclass whose `families`
   names the module), `config_from_hf`, the checkpoint key mapping (`families.keys` has the Llama and
   DeepSeek-style ones), the model class (shared blocks from `fdecode.models.layers`), its MTP head
   (`fdecode.models.mtp`), and one `Family(...)`;
2. add its `model_type`s below;
3. add its tests: logits and greedy tokens against transformers, loading a saved checkpoint, the step.
"""

from __future__ import annotations

import importlib

# config.json `model_type` -> (module in fdecode/models/families/, the name of its `Family` there)
FAMILIES: dict[str, tuple[str, str]] = {
    "llama": ("llama", "LLAMA"),
    "qwen2": ("llama", "LLAMA"),
    "qwen3": ("llama", "LLAMA"),
    "qwen3_5_text": ("qwen3_5", "QWEN3_5"),
    "qwen3_5": ("qwen3_5", "QWEN3_5"),  # the multimodal checkpoint: its text model
    "qwen3_5_moe_text": ("qwen3_5", "QWEN3_5_MOE"),
    "qwen3_5_moe": ("qwen3_5", "QWEN3_5_MOE"),
    "qwen3_next": ("qwen3_next", "QWEN3_NEXT"),
    "deepseek_v3": ("deepseek_v3", "DEEPSEEK_V3"),
    "glm4_moe": ("glm4_moe", "GLM4_MOE"),
}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


def model_types(*modules: str) -> tuple[str, ...]:
    """The model types the family modules `modules` load (what their configs accept)."""
    return tuple(t for t, (module, _) in FAMILIES.items() if module in modules)


def family_of(model_type: object):
    """The `Family` that loads `model_type`; raises for a type fdecode does not implement."""
    if model_type not in FAMILIES:
        raise ValueError(f"unsupported model_type {model_type!r}; fdecode supports {SUPPORTED_MODEL_TYPES}")
    module, name = FAMILIES[model_type]
    return getattr(importlib.import_module(f"fdecode.models.families.{module}"), name)
