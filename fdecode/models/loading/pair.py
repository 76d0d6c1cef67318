"""`load_pair`: a checkpoint folder and the draft named for it, as `fdecode.compile` takes them (the
`fdecode serve` and `fdecode generate` commands).

draft: None (the target's MTP head where it has one, else n-gram prompt lookup), "mtp", "ngram", or a
draft checkpoint folder (loaded in the target's dtype). The bundled model loads in float32 (its
bfloat16 weights run slowly on a CPU); other folders in their own dtype.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from fdecode.models.loading.hf import from_hf


def load_pair(folder: str | os.PathLike | None, draft: str | os.PathLike | None = None):
    """(target, draft, folder): folder None is the bundled model (`fdecode.assets.TINY`)."""
    from fdecode.assets import TINY

    path = Path(folder) if folder is not None else TINY
    target = from_hf(path, dtype=torch.float32) if folder is None else from_hf(path)
    if draft is None:
        return target, ("mtp" if target.mtp is not None else "ngram"), path
    if draft == "mtp" and target.mtp is None:
        raise ValueError(f"{path} has no MTP head: pass draft 'ngram' (prompt lookup) or a draft checkpoint folder")
    if draft in ("mtp", "ngram"):
        return target, draft, path
    return target, from_hf(Path(draft), dtype=target.embed_tokens.weight.dtype), path
