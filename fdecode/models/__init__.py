"""fdecode's models (docs/design.md, "Model families and the registry"). Where things go:

- `layers/`: shared blocks with no model-type strings (attention, MLPs, norms, RoPE, DeltaNet, MLA, MoE);
- `families/`: one declaration per checkpoint family, listed by `registry.py` (the supported model types);
- `mtp/`: the multi-token-prediction heads;
- `loading/`: Hugging Face loading and saving, checkpoint reads, expert weights, EOS ids;
- here: configs, the decoder skeletons (`llama.LlamaModel`, `hybrid.HybridModel`), the draft kinds
  (`ngram`), compile regions, whole-sequence forwards (`dense`), tensor parallelism, model resolution.
"""

from __future__ import annotations

from fdecode.models.config import ModelConfig
from fdecode.models.hybrid import HybridModel
from fdecode.models.hybrid_config import HybridConfig
from fdecode.models.llama import LlamaModel
from fdecode.models.loading.hf import from_hf, save_hf
from fdecode.models.mtp.head import MTPHead
from fdecode.models.mtp.hybrid import HybridMTPHead

__all__ = [
    "HybridConfig",
    "HybridMTPHead",
    "HybridModel",
    "LlamaModel",
    "MTPHead",
    "ModelConfig",
    "NgramDraft",
    "from_hf",
    "save_hf",
]
