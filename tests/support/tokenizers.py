"""Two tiny tokenizers built here, so grammar tests run both kinds without downloads: a byte-level BPE
(GPT-2's `Ġ` bytes, 256 byte tokens and a few merges) and a SentencePiece-style BPE (`▁` spaces,
`<0x00>`..`<0xFF>` byte fallback, a few pieces)."""

from __future__ import annotations

import functools

import transformers


@functools.cache
def byte_bpe():
    """Byte-level BPE: the 256 GPT-2 byte characters (`Ġ` is the space), a few merges (`Ġa`, and `é` as
    `Ã©`), specials `<eos>` and `<pad>`, and `<tool>`, an added token that is text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = [
        ("a", "b"),
        ("ab", "c"),
        ("b", "a"),
        ("1", "2"),
        ("1", "."),
        (".", "2"),
        ("t", "r"),
        ("u", "e"),
        ("tr", "ue"),
        ("Ġ", "a"),
        ("Ã", "©"),
    ]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", name_or_path="tiny-byte-bpe"
    )
    fast.add_tokens(["<tool>"])
    return fast


@functools.cache
def sentencepiece():
    """SentencePiece-style BPE: `<unk>`, `<s>`, `</s>`, the byte tokens `<0x00>`..`<0xFF>`, then pieces
    (`▁` for the space, `é` whole); spaces become `▁` and no `▁` is prepended (add_dummy_prefix off)."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ("▁", "a", "b", "c", "1", "2", ".", "t", "r", "u", "e", "é"):
        vocab[piece] = len(vocab)
    merges = [
        ("a", "b"),
        ("ab", "c"),
        ("b", "a"),
        ("1", "2"),
        ("1", "."),
        (".", "2"),
        ("▁", "a"),
        ("▁a", "b"),
        ("t", "r"),
        ("u", "e"),
        ("tr", "ue"),
    ]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", name_or_path="tiny-sentencepiece"
    )
