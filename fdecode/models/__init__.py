"""Llama-family target models, the MTP draft head, and HF checkpoint loading."""

from __future__ import annotations

from fdecode.models.config import ModelConfig
from fdecode.models.llama import LlamaModel
from fdecode.models.loading import from_hf, save_hf
from fdecode.models.mtp import MTPHead

__all__ = ["LlamaModel", "MTPHead", "ModelConfig", "from_hf", "save_hf"]
