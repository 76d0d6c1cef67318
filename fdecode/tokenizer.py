"""Byte-level tokenizer: token i < 256 is the byte i; three special tokens follow
(docs/design.md, "Benchmarks, assets and tools").

    BOS = 256, EOS = 257, PAD = 258; vocab_size = 259.

Every string round-trips (UTF-8 bytes in, bytes out); decoding replaces a
split multi-byte character with U+FFFD only at a cut, so streamed text is
decoded from whole sequences, not token by token. Saved as `tokenizer_config.json`
with `"tokenizer_class": "FdecodeByteTokenizer"`; `load_tokenizer` reads that
file and hands any other checkpoint folder to `transformers.AutoTokenizer`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

TOKENIZER_CLASS = "FdecodeByteTokenizer"


class ByteTokenizer:
    bos_token_id = 256
    eos_token_id = 257
    pad_token_id = 258
    vocab_size = 259

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        for i in ids:
            if not 0 <= int(i) < self.vocab_size:
                raise ValueError(f"token id {int(i)} is outside the byte vocabulary [0, {self.vocab_size})")
        data = bytes(int(i) for i in ids if int(i) < 256)
        if not skip_special_tokens and any(int(i) >= 256 for i in ids):
            raise ValueError("special tokens have no text; decode with skip_special_tokens=True")
        return data.decode("utf-8", errors="replace")

    def __len__(self) -> int:
        return self.vocab_size

    def token_bytes(self) -> tuple[bytes | None, ...]:
        """Each id's bytes, for grammars (`fdecode.grammar.vocabulary`): byte i for i < 256, none for specials."""
        return tuple(bytes([i]) for i in range(256)) + (None,) * (self.vocab_size - 256)

    def __call__(self, text: str) -> dict[str, list[int]]:
        """transformers-style call: `tok(text)["input_ids"]`."""
        return {"input_ids": self.encode(text)}

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = {
            "tokenizer_class": TOKENIZER_CLASS,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "vocab_size": self.vocab_size,
        }
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size}, bos={self.bos_token_id}, eos={self.eos_token_id})"


def load_tokenizer(folder: str | os.PathLike):
    """The tokenizer saved in a checkpoint folder: fdecode's byte tokenizer or any transformers one."""
    config_file = Path(folder) / "tokenizer_config.json"
    if config_file.is_file() and json.loads(config_file.read_text()).get("tokenizer_class") == TOKENIZER_CLASS:
        return ByteTokenizer()
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise ImportError(f'{folder} holds a transformers tokenizer; pip install -e ".[hf]" to load it') from err
    return AutoTokenizer.from_pretrained(str(folder))
