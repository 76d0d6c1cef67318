"""The benchmark baselines give exactly the tokens fdecode gives (greedy)."""

from __future__ import annotations

import pytest

import fdecode
from conftest import fdecode_target, hf_greedy, independent_draft, mtp_head
from fdecode.baseline import BeforeLoop, TargetOnly

PROMPTS = [[5, 17, 33, 2, 9], [7, 3], [11, 12, 13, 14, 15, 80]]


@pytest.mark.parametrize(("draft_kind", "k"), [("model", 1), ("model", 3), ("mtp", 2)])
def test_before_loop_and_target_only_match_transformers(draft_kind, k):
    target = fdecode_target(2)
    draft = independent_draft("partial", target) if draft_kind == "model" else mtp_head("partial", target)
    cfg = fdecode.DecodeConfig(num_draft_tokens=k, max_batch=4, max_seq_len=48, block_size=4, backend="eager")
    step = fdecode.compile(target, draft, cfg)
    want = [hf_greedy(tuple(p), 16) for p in PROMPTS]
    before, iterations = BeforeLoop(step, backend="eager").generate(PROMPTS, max_new_tokens=16)
    assert before == want and iterations < 15  # speculation saved iterations
    only, _ = TargetOnly(step, backend="eager").generate(PROMPTS, max_new_tokens=16)
    assert only == want
