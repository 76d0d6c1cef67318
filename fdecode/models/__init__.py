"""Llama-family and Qwen3.5 (hybrid) target models, the MTP draft heads, and HF checkpoint loading."""

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
