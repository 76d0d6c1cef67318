"""n-gram (prompt-lookup) steps over the tiny Llama target of support/llama_models.py.

`ngram_step` compiles the 2-layer target with n-gram drafts; `grounded_prompts` are prompts whose
histories hold matches of every kind (long ones, none, one running to the end of the history).
"""

from __future__ import annotations

import fdecode
from support.llama_models import fdecode_target, hf_greedy

NEW = 20
BASE = [(5, 17, 33, 2, 9, 41, 60), (7, 3), (11, 12, 13, 14, 15, 80, 81, 82, 83, 84, 85, 86, 87)]


def ngram_step(k=3, max_batch=4, backend="eager", draft="ngram", **changes):
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=k, max_batch=max_batch, max_seq_len=96, block_size=4, backend=backend, **changes
    )
    return fdecode.compile(fdecode_target(2), draft, cfg)


def grounded_prompts() -> list[tuple[int, ...]]:
    """Lane 0 holds its own greedy continuation (long matches), lane 1 is two tokens (no earlier
    occurrence of anything at first), lane 2 ends in a repeat whose match runs to the end of the history."""
    first = hf_greedy(BASE[0], NEW)
    return [BASE[0] + tuple(first[:12]) + BASE[0], BASE[1], BASE[2] + (80, 81, 82)]
