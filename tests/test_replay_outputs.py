"""`fdecode.graphs.replay_outputs`: a CUDA graph replay's outputs copied out of the graph pool before the next
step reads them. CUDA graph trees need a GPU (tests/test_cuda.py runs the real thing); here the copy itself is
checked on the CPU, on a real step's state."""

from __future__ import annotations

import torch
from support.llama_models import fdecode_target, independent_draft

import fdecode
from fdecode.graphs import graph_set
from fdecode.graphs.replay_outputs import owned_outputs, owning_outputs
from fdecode.state import DecodeState, StepOutput

PROMPTS = [[5, 17, 33, 2, 9], [7, 3]]


def eager_step():
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=64, block_size=16, backend="eager")
    return fdecode.compile(target, independent_draft("partial", target), cfg)


def test_leaves_written_in_place_are_kept_and_the_rest_copied_once():
    kv, fresh = torch.zeros(4), torch.arange(3.0)
    out = owned_outputs((kv,), (kv, fresh, StepOutput(fresh, None), torch.empty(0)))
    assert out[0] is kv  # an input the graph wrote in place (a static address) comes back as itself
    assert out[1] is not fresh and out[1].data_ptr() != fresh.data_ptr() and torch.equal(out[1], fresh)
    assert out[2].packed is out[1]  # one tensor reached twice: one copy
    assert out[3].shape == (0,)


def test_a_step_whose_outputs_are_copied_every_call_commits_the_same_tokens(monkeypatch):
    want = fdecode.generate(eager_step(), PROMPTS, max_new_tokens=12)
    copies = []

    def capture(backend, fn, cfg, **kwargs):  # what `capture` does for "cudagraphs", around the eager step
        def counted(*args):
            copies.append(1)
            return fn(*args)

        return owning_outputs(counted)

    monkeypatch.setattr(graph_set, "capture", capture)  # where a Step captures its graphs
    step = eager_step()
    state = step.prefill(PROMPTS, max_new_tokens=12)
    kv = state.target_kv
    new_state, _ = step(state)
    assert isinstance(new_state, DecodeState) and new_state.target_kv is kv
    assert new_state.tokens.data_ptr() not in {t.data_ptr() for t in (state.tokens,)}
    assert fdecode.generate(step, PROMPTS, max_new_tokens=12) == want
    assert len(copies) > 2
