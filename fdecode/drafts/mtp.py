"""`MTPDrafter`: a multi-token-prediction head, dense (DeepSeek-V3's NextN, GLM-4.5) or hybrid (Qwen3.5)
(docs/design.md, "MTP heads").

It proposes as a draft LM does (`fdecode.drafts.lm.forward_proposals`), from the target's hidden states
of the step: draft forward j runs the head's layer j mod its layers. It never sits a step out, since its
rows read the hidden states of the step they follow. Every head drafts trees (`fdecode.tree.draft`: level j
runs layer j - 1 mod its layers over the frontier), a hybrid target's too.
"""

from __future__ import annotations

from fdecode.drafts.lm import LMDrafter


class MTPDrafter(LMDrafter):
    kind = "mtp"
    shares_target = True

    def idles(self, draft, cfg) -> bool:
        return False

    def layers_per_forward(self, draft) -> int:
        return 1  # draft forward j runs layer j mod `num_mtp_layers`

    def layer_of(self, draft, j: int) -> int:
        return j % draft.num_mtp_layers

    def forward_kwargs(self, draft, j: int) -> dict:
        """`depth`, reduced to the layer it runs, so a captured forward specialises on at most that many values."""
        return {"depth": self.layer_of(draft, j)}
