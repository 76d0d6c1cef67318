"""Turn the `draft` argument of `fdecode.compile` into the draft module the step owns and its drafter
(docs/design.md, "Draft kinds"): "ngram" or an `NgramDraft`, "mtp" (the target's own head) or an `MTPHead`,
else a draft LM (a transformers model, a checkpoint folder or a fdecode model, `resolve_target`)."""

from __future__ import annotations

import torch

from fdecode.config import DecodeConfig
from fdecode.drafts import MTP, NGRAM, Drafter, NgramDraft, drafter_for
from fdecode.models.mtp.head import MTPHead
from fdecode.models.resolve import owned, resolve_target
from fdecode.models.vocab import check_same_tokenizer, fit_vocab


def resolve_draft(obj: object, target, cfg: DecodeConfig) -> tuple[torch.nn.Module, Drafter]:
    """Returns (draft module, its drafter)."""
    if isinstance(obj, str) and obj == "ngram":
        obj = NgramDraft()
    if isinstance(obj, NgramDraft):
        return obj.bound(target), NGRAM
    if isinstance(obj, str) and obj == "mtp":
        if target.mtp is None:
            raise ValueError(
                "draft='mtp' but the target has no MTP head (no mtp.* weights in its checkpoint): pass "
                "draft='ngram' (prompt lookup, no second model) or a draft model"
            )
        return target.mtp, MTP
    if isinstance(obj, MTPHead):
        if obj.config.hidden_size != target.config.hidden_size or obj.config.vocab_size != target.config.vocab_size:
            raise ValueError("the MTP head was built for another target (hidden size or vocabulary differs)")
        return owned(obj, cfg).bind(target), MTP  # the step's copy borrows the step's target
    draft = resolve_target(obj, cfg, role="draft")
    check_same_tokenizer(target, draft)
    # The same tokenizer, padded differently: the draft proposes over the target's ids only.
    draft = fit_vocab(draft, target.config.vocab_size)
    return draft, drafter_for(draft)
