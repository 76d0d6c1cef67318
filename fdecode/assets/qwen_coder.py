"""A real draft/target pair: Qwen2.5-Coder-1.5B-Instruct (target) and Qwen2.5-Coder-0.5B-Instruct (draft)
(docs/design.md, "Benchmarks, assets and tools").

Both come as Q4_K_M GGUF files that `../shared/models/qwen-coder-pair` (in this project's workspace)
downloads and checks; it prints their folder, by default `~/.cache/fdecode-models/qwen-coder-pair`
(`FDECODE_MODELS` moves the cache root). transformers dequantizes a GGUF to float32 with the `gguf`
package, which takes minutes, so `safetensors_folders()` does it once and keeps a Hugging Face folder
(config, safetensors, tokenizer) of each model beside the GGUF files; later loads read those folders.

    python -m fdecode.assets.qwen_coder       # convert once, print the two folders
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SCRIPT = "../shared/models/qwen-coder-pair"
TARGET_GGUF = "qwen2.5-coder-1.5b-instruct.gguf"
DRAFT_GGUF = "qwen2.5-coder-0.5b-instruct.gguf"


def gguf_folder() -> Path:
    """Where the script keeps the GGUF files (it may not have run yet)."""
    root = os.environ.get("FDECODE_MODELS") or Path.home() / ".cache" / "fdecode-models"
    return Path(root) / "qwen-coder-pair"


def missing_reason() -> str | None:
    """Why the pair cannot be used here, naming the script that fetches it, or None."""
    folder = gguf_folder()
    for name in (TARGET_GGUF, DRAFT_GGUF):
        if not (folder / name).is_file() and not (folder / Path(name).stem / "config.json").is_file():
            return f"{folder / name} is missing: run {SCRIPT} (downloads and checks the Qwen2.5-Coder pair)"
    return None


def safetensors_folders() -> tuple[Path, Path]:
    """(target folder, draft folder): Hugging Face folders in float32, converted from the GGUF files on
    first use (minutes, with a line on stderr), then reused."""
    reason = missing_reason()
    if reason is not None:
        raise FileNotFoundError(reason)
    return tuple(_converted(gguf_folder(), name) for name in (TARGET_GGUF, DRAFT_GGUF))


def _converted(folder: Path, gguf: str) -> Path:
    out = folder / Path(gguf).stem
    if (out / "config.json").is_file():
        return out
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"converting {folder / gguf} to safetensors in {out} (once; transformers dequantizes it)", file=sys.stderr)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    partial = out.with_name(out.name + ".partial")
    partial.mkdir(exist_ok=True)
    # transformers refuses save_pretrained of a model loaded from a GGUF: write the dequantized weights
    # (one copy of tied embeddings) and a config without the GGUF quantization entry.
    save_model(model, str(partial / "model.safetensors"), metadata={"format": "pt"})
    model.config.__dict__.pop("quantization_config", None)
    model.config.save_pretrained(partial)
    model.generation_config.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(out)  # a folder with a config.json is a whole one
    return out


if __name__ == "__main__":
    for path in safetensors_folders():
        print(path)
