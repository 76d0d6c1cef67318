"""A draft LM whose vocabulary is larger or smaller than the target's (the same tokenizer, padded differently)
(docs/design.md, "MTP head vs draft LM").

Speculative decoding compares the draft's distribution q with the target's p over the target's V ids,
so the draft is fitted to them at its two ends, and nowhere else:

  - output (`TargetVocabHead`): logits over exactly the target's V ids. A larger draft's ids >= V are
    cut off (never proposed: the same as masking them to -inf, the draft's softmax is over the rest);
    a smaller draft's missing ids get logit -inf, q = 0, so they are never drafted and the residual
    max(0, p - q) of rejection sampling gives them their full target probability (still exact).
  - input (`ClampedEmbedding`): a target id the smaller draft lacks (in a prompt, or committed by the
    target) is read as the draft's last id. Only how well the draft guesses changes, never what is committed.

Both keep the draft's own weight tensor (`.weight`), so nothing is copied. Where both checkpoint folders
have a `tokenizer.json`, an id the two vocabularies share must be the same token (`check_same_tokenizer`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


class TargetVocabHead(nn.Module):
    """The draft's LM head with logits over the target's `vocab` ids: [..., H] -> [..., vocab]."""

    def __init__(self, weight: nn.Parameter, vocab: int) -> None:  # weight: [V_draft, H], the draft's own
        super().__init__()
        self.weight = weight
        self.vocab = vocab

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight[: self.vocab])  # a larger draft: only the rows the target has
        return F.pad(logits, (0, self.vocab - logits.shape[-1]), value=float("-inf"))  # a smaller one: q = 0


class ClampedEmbedding(nn.Module):
    """The draft's embedding, reading ids past its table (target ids it lacks) as its last id."""

    def __init__(self, weight: nn.Parameter) -> None:  # [V_draft, H]
        super().__init__()
        self.weight = weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids.clamp(max=self.weight.shape[0] - 1), self.weight)


def fit_vocab(draft: nn.Module, vocab: int) -> nn.Module:
    """`draft` (a step-owned draft LM, changed in place) proposing over the target's `vocab` ids only."""
    own = draft.config.vocab_size
    if own != vocab:
        draft.lm_head = TargetVocabHead(draft.lm_head.weight, vocab)
        if own < vocab:
            draft.embed_tokens = ClampedEmbedding(draft.embed_tokens.weight)
    return draft


def _tokenizer_bytes(folder: Path | None) -> bytes | None:
    """The bytes of `folder`'s tokenizer.json, None without one."""
    file = None if folder is None else folder / "tokenizer.json"
    return file.read_bytes() if file is not None and file.is_file() else None


def _token_ids(text: bytes) -> dict[int, str]:
    """id -> token of a tokenizer.json's text (its model vocabulary and added tokens)."""
    data = json.loads(text)
    ids = {int(i): token for token, i in (data.get("model", {}).get("vocab") or {}).items()}
    ids.update({int(t["id"]): t["content"] for t in data.get("added_tokens", [])})
    return ids


def check_same_tokenizer(target: nn.Module, draft: nn.Module) -> None:
    """Refuse a draft whose tokenizer really differs from the target's: one id, two tokens. Checked where
    both came from folders with a tokenizer.json (`from_hf` records the folder); padding is no difference.
    Two files of the same bytes are one tokenizer (no parse: a 150k-token file takes ~0.5 s)."""
    texts = [_tokenizer_bytes(getattr(m, "checkpoint", None)) for m in (target, draft)]
    if None in texts or texts[0] == texts[1]:
        return
    a, b = (_token_ids(text) for text in texts)
    differ = sorted(i for i in a.keys() & b.keys() if a[i] != b[i])
    if differ:
        i = differ[0]
        raise ValueError(
            f"the draft's tokenizer differs from the target's ({len(differ)} shared ids are other tokens, e.g. id {i}: "
            f"{b[i]!r} in the draft, {a[i]!r} in the target): speculative decoding needs one tokenizer"
        )
