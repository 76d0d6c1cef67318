"""Which drafts sit out depth-0 steps (`DecodeConfig.draft_catch_up`, `fdecode.ops.catch_up`)."""

from __future__ import annotations

from fdecode.models.mtp.head import MTPHead
from fdecode.models.ngram import is_ngram
from fdecode.state.recurrent import is_hybrid


def idles_draft(draft, config) -> bool:
    """Whether `draft` sits out depth-0 steps under `config` (a `DecodeConfig`): a draft LM, not an MTP head
    (whose rows read the target's hidden states of their step), an n-gram draft (nothing to skip) or a
    recurrent draft (its ring of states), with `draft_catch_up` > 0."""
    return config.draft_catch_up > 0 and not is_ngram(draft) and not is_hybrid(draft) and not isinstance(draft, MTPHead)


def missed_width(draft, config) -> int:
    """Columns of `DecodeState.missed`: `draft_catch_up` where the draft sits out depth-0 steps, else 0."""
    return config.draft_catch_up if idles_draft(draft, config) else 0
