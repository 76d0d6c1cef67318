"""Reprs a notebook user reads (issue 18, item 9): what a step committed, one word for one thing, and no
repr that looks like a constructor call it is not."""

from __future__ import annotations

import torch
from support.llama_models import fdecode_target, independent_draft
from torch.utils import _pytree as pytree

import fdecode
from fdecode.state import StepOutput

CFG = dict(num_draft_tokens=2, max_batch=3, max_seq_len=32, block_size=4, backend="eager")


def make_step():
    target = fdecode_target(2)
    return fdecode.compile(target, independent_draft("partial", target), fdecode.DecodeConfig(**CFG))


def test_step_output_shows_the_committed_tokens_of_each_lane():
    out = StepOutput.pack(
        torch.tensor([[12, 7, -1], [3, -1, -1], [-1, -1, -1]]), torch.tensor([2, 1, 0]), torch.tensor([0, 1, 1])
    )
    assert repr(out) == (
        "<StepOutput lanes=3 K+1=3 device=cpu\n  lane 0: [12, 7]\n  lane 1: [3] finished\n  lane 2: [] finished>"
    )
    step = make_step()
    state = step.prefill([[1, 2, 3], [4, 5]], max_new_tokens=6)
    state, out = step(state)
    text = repr(out)
    for lane, tokens in enumerate(out.tokens.tolist()[:2]):
        assert f"lane {lane}: {[t for t in tokens if t >= 0]}" in text


def test_step_output_of_a_large_batch_or_on_a_device_reads_no_value():
    big = StepOutput(torch.zeros(32, 6, dtype=torch.int64))
    assert repr(big) == "<StepOutput lanes=32 K+1=3 device=cpu (out.tokens.tolist() reads the tokens)>"
    meta = StepOutput(torch.zeros(2, 6, dtype=torch.int64, device="meta"))  # reading a value would raise
    assert repr(meta) == "<StepOutput lanes=2 K+1=3 device=meta (out.tokens.tolist() reads the tokens)>"


def test_a_state_says_k_plus_1_not_window():
    """README's "window" is the attention window (context buckets); the K + 1 tokens a step verifies are K+1."""
    step = make_step()
    state = step.prefill([[1, 2, 3]], max_new_tokens=6)
    text = repr(state)
    assert text.startswith("<DecodeState lanes=3 K+1=3 device=") and text.endswith(">")
    assert "window" not in text
    meta = pytree.tree_map(lambda t: torch.empty_like(t, device="meta"), state)
    assert "device=meta" in repr(meta)


def test_graph_report_repr_is_not_a_constructor_call():
    step = make_step()
    report = fdecode.inspect(step, step.prefill([[1, 2, 3]], max_new_tokens=6))
    text = repr(report)
    assert text.startswith("<GraphReport ") and text.endswith(">")  # not GraphReport(aten_ops=...): no such field
    assert f"aten_ops={report.aten_ops}" in text and f"graph_count={report.graph_count}" in text
