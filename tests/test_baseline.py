"""The benchmark baselines give exactly the tokens fdecode gives (greedy)."""

from __future__ import annotations

import pytest
from support.llama_models import fdecode_target, hf_greedy, independent_draft, mtp_head

import fdecode
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


def test_before_loop_makes_one_packed_read_and_one_packed_upload_per_iteration():
    """The fair "before" loop: per iteration one non-blocking device -> host read of the argmax and the
    window (its one wait) and one non-blocking packed upload of every rebuilt input, and no blocking copy
    or host read of a device tensor anywhere (`tests/support/device_reads.py`), prefill included. Besides the
    iterations: the prefill's upload, one read of the prefilled state, the first validation's upload."""
    from support.device_reads import DeviceReads
    from torch.utils._pytree import tree_leaves

    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=4, max_seq_len=48, block_size=4, backend="eager")
    step = fdecode.compile(target, independent_draft("partial", target), cfg)
    loop = BeforeLoop(step, backend="eager")
    mode = DeviceReads().mark(*(t for m in (step.target, step.draft) for t in (*m.parameters(), *m.buffers())))
    mode.mark(*tree_leaves(step.empty_state()))  # the KV pool the prefill will take
    with mode:
        before, iterations = loop.generate(PROMPTS, max_new_tokens=16)
    assert before == [hf_greedy(tuple(p), 16) for p in PROMPTS]
    assert (mode.reads, mode.uploads) == (iterations + 1, iterations + 2)
