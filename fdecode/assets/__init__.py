"""The bundled model, trained by `examples/train_tiny.py` (its figures: BENCHMARKS.md, "The bundled model")
(docs/design.md, "Benchmarks, assets and tools").

- `TINY`: a 4-layer byte-level Llama (2.8 M parameters) with a jointly trained MTP head (`mtp.*`),
  trained on the Python standard library's sources; Hugging Face layout, bfloat16 weights.
- `TINY_DRAFT`: an independent 2-layer draft LM trained on the same data.
- `TINY_HELDOUT`: the held-out windows its reported loss is measured on (`training.json`).

Load them the way users load any checkpoint: `fdecode.models.from_hf(TINY)`.
"""

from __future__ import annotations

from pathlib import Path

import torch

ASSETS = Path(__file__).resolve().parent
TINY = ASSETS / "tiny-stdlib"
TINY_DRAFT = ASSETS / "tiny-stdlib-draft"
TINY_HELDOUT = ASSETS / "tiny-stdlib-heldout.safetensors"


def heldout_windows() -> torch.Tensor:
    """The shipped held-out windows: [64, 256] int64 byte ids (`training.json` says how they were cut)."""
    from safetensors.torch import load_file

    return load_file(str(TINY_HELDOUT))["windows"].long()
