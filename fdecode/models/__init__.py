"""Target models (Llama family; hybrid Qwen3.5, Qwen3.5-MoE, Qwen3-Next; DeepSeek-V3; GLM-4.5), the MTP draft
heads, and HF checkpoint loading (`loading.family_of` names the module of each model_type)."""

from __future__ import annotations

from fdecode.models.config import ModelConfig
from fdecode.models.hybrid import HybridModel
from fdecode.models.hybrid_config import HybridConfig
from fdecode.models.hybrid_mtp import HybridMTPHead
from fdecode.models.llama import LlamaModel
from fdecode.models.loading import from_hf, save_hf
from fdecode.models.mtp import MTPHead
from fdecode.models.ngram import NgramDraft

__all__ = ["HybridConfig", "HybridMTPHead", "HybridModel", "LlamaModel", "MTPHead", "ModelConfig", "NgramDraft", "from_hf", "save_hf"]
