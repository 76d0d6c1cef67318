"""A real draft/target pair: Qwen2.5-Coder-1.5B-Instruct (target) and Qwen2.5-Coder-0.5B-Instruct (draft)
(docs/design.md, "Benchmarks, assets and tools"). Nothing is downloaded here: the pair is read from the
folder `FDECODE_QWEN_CODER` names (default `~/.cache/fdecode-models/qwen-coder-pair`), holding either

- the Hugging Face folders (safetensors, as published, bfloat16), one per model:
      huggingface-cli download Qwen/Qwen2.5-Coder-1.5B-Instruct --local-dir "$FDECODE_QWEN_CODER/Qwen2.5-Coder-1.5B-Instruct"
      huggingface-cli download Qwen/Qwen2.5-Coder-0.5B-Instruct --local-dir "$FDECODE_QWEN_CODER/Qwen2.5-Coder-0.5B-Instruct"
- or one GGUF file per model (the results page's figures: Q4_K_M, dequantized to float32), e.g.
      huggingface-cli download Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --local-dir "$FDECODE_QWEN_CODER"
  (and the 0.5B's); transformers dequantizes a GGUF with the `gguf` package (`pip install -e ".[real]"`),
  which takes minutes, so `safetensors_folders()` does it once into a Hugging Face folder beside the file.

    python -m fdecode.assets.qwen_coder       # find (convert once) and print the two folders
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV = "FDECODE_QWEN_CODER"
SIZES = ("1.5B", "0.5B")  # target, draft
HOW_TO_GET = (
    f'export {ENV}=DIR; huggingface-cli download Qwen/Qwen2.5-Coder-1.5B-Instruct --local-dir "${ENV}/'
    f'Qwen2.5-Coder-1.5B-Instruct"; the same for Qwen/Qwen2.5-Coder-0.5B-Instruct (or put the '
    "Qwen2.5-Coder-{1.5B,0.5B}-Instruct-GGUF files there); see fdecode/assets/qwen_coder.py"
)


def folder() -> Path:
    """The folder the pair is read from: `$FDECODE_QWEN_CODER`, else the default cache folder."""
    given = os.environ.get(ENV)
    return Path(given).expanduser() if given else Path.home() / ".cache" / "fdecode-models" / "qwen-coder-pair"


def _model(size: str) -> Path | None:
    """The model of `size` in `folder()`: a Hugging Face folder (one converted from a GGUF included), else
    its GGUF file, else None. Names are compared without case ("Qwen2.5-Coder-1.5B-Instruct", its GGUF
    "qwen2.5-coder-1.5b-instruct[-q4_k_m].gguf")."""
    root = folder()
    if not root.is_dir():
        return None
    stem = f"qwen2.5-coder-{size.lower()}-instruct"
    entries = sorted(root.iterdir())
    for entry in entries:
        if entry.name.lower() == stem and (entry / "config.json").is_file():
            return entry
    for entry in entries:
        name = entry.name.lower()
        if name.startswith(stem) and name.endswith(".gguf") and entry.is_file():
            converted = root / entry.name[: -len(".gguf")]
            return converted if (converted / "config.json").is_file() else entry
    return None


def missing_reason() -> str | None:
    """Why the pair cannot be used here, with the commands that get it, or None."""
    for size in SIZES:
        if _model(size) is None:
            return f"no Qwen2.5-Coder-{size}-Instruct in {folder()}: {HOW_TO_GET}"
    return None


def tokenizer_folder() -> Path | None:
    """A Hugging Face folder with the pair's tokenizer (the draft's), without converting anything, or None."""
    found = _model(SIZES[1])
    return found if found is not None and (found / "tokenizer.json").is_file() else None


def safetensors_folders() -> tuple[Path, Path]:
    """(target folder, draft folder): Hugging Face folders, converted from GGUF files to float32 on first
    use (minutes, with a line on stderr), then reused."""
    reason = missing_reason()
    if reason is not None:
        raise FileNotFoundError(reason)
    return tuple(_converted(_model(size)) for size in SIZES)


def _converted(found: Path) -> Path:
    if found.is_dir():
        return found
    out = found.with_suffix("")
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"converting {found} to safetensors in {out} (once; transformers dequantizes it)", file=sys.stderr)
    model = AutoModelForCausalLM.from_pretrained(found.parent, gguf_file=found.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(found.parent, gguf_file=found.name)
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
