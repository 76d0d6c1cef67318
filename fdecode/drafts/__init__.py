"""Draft kinds, one module each, behind one small protocol (`Drafter`; docs/design.md, "Draft kinds").

- `lm`: a draft language model with KV of its own, which may sit depth-0 steps out (the idle draft);
- `mtp`: a multi-token-prediction head (dense or hybrid), proposing from the target's hidden states;
- `ngram`: prompt lookup over the committed tokens, with no weights and no KV.

`drafter_for(draft)` is the one place that asks which kind a draft module is; the step, the prefill, the
backends, tensor parallelism and the Engine ask the drafter. A new kind is one module here (a `Drafter`
subclass), its case in `drafter_for` and `resolve_draft`, and its tests; a kind with leaves of its own also
adds them to the `Draft` part (`fdecode.state.parts`), `fdecode.prefill.draft_leaves` and
`fdecode.state.checks`.
"""

from __future__ import annotations

from fdecode.drafts.base import Drafter
from fdecode.drafts.lm import LMDrafter
from fdecode.drafts.mtp import MTPDrafter
from fdecode.drafts.ngram import NgramDraft, NgramDrafter
from fdecode.models.mtp.head import MTPHead

LM, MTP, NGRAM = LMDrafter(), MTPDrafter(), NgramDrafter()


def drafter_for(draft) -> Drafter:
    """The drafter of a draft module a step owns: an `NgramDraft`, an `MTPHead`, else a draft LM."""
    if isinstance(draft, NgramDraft):
        return NGRAM
    if isinstance(draft, MTPHead):
        return MTP
    return LM


__all__ = ["LM", "MTP", "NGRAM", "Drafter", "LMDrafter", "MTPDrafter", "NgramDraft", "NgramDrafter", "drafter_for"]
