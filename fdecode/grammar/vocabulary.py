"""Each token id's text as bytes, read from a transformers tokenizer (docs/design.md, "Structured output").

A grammar is a language of bytes, so the compiler needs the exact bytes each token adds to the output:
- byte-level BPE (GPT-2, Qwen, SmolLM2): a token string spells bytes through GPT-2's byte-to-unicode table
  (`Ġ` is the space byte, `Ċ` the newline);
- SentencePiece-style (Llama, Mistral): `▁` is a space, and byte-fallback tokens `<0x0A>` are one byte each.
The scheme is read from the tokenizer's own decoder (its `tokenizers` JSON), never guessed from names.
Special tokens (and tokens with no text) have no bytes: they are not part of any language. Added tokens
that are not special (Qwen's `<tool_call>`) are their literal text. A tokenizer with a `token_bytes()`
method (fdecode's byte tokenizer) spells its ids itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import weakref

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_METASPACE = "\u2581"  # ▁


@dataclasses.dataclass(frozen=True, eq=False)
class TokenBytes:
    """The text of every id of one tokenizer."""

    name: str  # the tokenizer's name_or_path
    tokens: tuple[bytes | None, ...]  # [len(tokenizer)] each id's bytes; None: special or empty (no text)
    digest: str  # sha256 of `tokens`: the vocabulary's identity in cache keys

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        text = sum(t is not None for t in self.tokens)
        return f"TokenBytes({self.name!r}, {len(self)} ids, {text} with text, {self.digest[:12]})"


_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_bytes(tokenizer) -> TokenBytes:
    """`tokenizer`'s TokenBytes, computed once per tokenizer object (and again if tokens are added)."""
    memo = _MEMO.get(tokenizer)
    if memo is None or len(memo) != len(tokenizer):
        memo = _MEMO[tokenizer] = _read(tokenizer)
    return memo


def _read(tokenizer) -> TokenBytes:
    name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    own = getattr(tokenizer, "token_bytes", None)  # a tokenizer that spells its ids itself (fdecode's byte one)
    return _digested(name, list(own())) if callable(own) else _digested(name, _spelled(tokenizer, name))


def _spelled(tokenizer, name: str) -> list[bytes | None]:
    """Each id's bytes, read from a transformers tokenizer's vocabulary and decoder."""
    n = len(tokenizer)
    special = set(tokenizer.all_special_ids)
    added = {}
    for i, token in tokenizer.added_tokens_decoder.items():
        if token.special:
            special.add(i)
        else:
            added[i] = token.content.encode("utf-8")
    spell = _speller(tokenizer, name)
    strings = tokenizer.convert_ids_to_tokens(list(range(n)))
    tokens = []
    for i, s in enumerate(strings):
        text = None if i in special or s is None else added[i] if i in added else spell(s)
        tokens.append(text or None)  # an empty token would loop in every state: no text
    return tokens


def _digested(name: str, tokens: list[bytes | None]) -> TokenBytes:
    digest = hashlib.sha256()
    for text in tokens:
        digest.update(b"\xff" if text is None else len(text).to_bytes(4, "little") + text)
    return TokenBytes(name, tuple(tokens), digest.hexdigest())


def _speller(tokenizer, name: str):
    """The function from a token string of `tokenizer`'s vocabulary to its bytes."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(
            f"tokenizer {name!r} ({type(tokenizer).__name__}) has no `tokenizers` backend: "
            "grammars read a fast tokenizer's decoder to know each token's bytes"
        )
    decoders = _decoder_types(json.loads(backend.to_str()).get("decoder"))
    if "ByteLevel" in decoders:
        table = {c: b for b, c in _bytes_to_unicode().items()}
        return lambda s: bytes(b for c in s for b in ((table[c],) if c in table else c.encode("utf-8")))
    if "Metaspace" in decoders or "Replace" in decoders:
        fallback = "ByteFallback" in decoders

        def spell(s: str) -> bytes:
            m = _BYTE_FALLBACK.fullmatch(s) if fallback else None
            return bytes([int(m.group(1), 16)]) if m else s.replace(_METASPACE, " ").encode("utf-8")

        return spell
    raise ValueError(
        f"tokenizer {name!r}: its decoder ({', '.join(decoders) or 'none'}) is neither byte-level "
        "BPE nor SentencePiece-style (▁ and <0xNN>), the two vocabularies grammars read"
    )


def _decoder_types(decoder: dict | None) -> list[str]:
    if decoder is None:
        return []
    if decoder["type"] == "Sequence":
        return [t for d in decoder["decoders"] for t in _decoder_types(d)]
    if decoder["type"] == "Replace" and decoder.get("pattern", {}).get("String") != _METASPACE:
        return []  # a Replace of anything but ▁ says nothing about spaces
    return [decoder["type"]]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: printable bytes stand for themselves, the others for the characters from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in table):
        table[b] = chr(256 + n)
    return table
