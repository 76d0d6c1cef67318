"""A stored Inductor step calls its compiled graph flat on the states it trusts (`fdecode.graphs.flat`): Inductor's
graph with the leaves in the order Dynamo's bytecode read them on a probe, once the first trusted call, watched,
agreed with that map.

One compile of a 1-layer, 32-wide pair (the host-time micro model) across two windows (the graph of every window:
its window size is a graph input too) serves every check: the flat calls' tokens equal the eager
step's; a state of another layout is still refused with check_state's error after flat calls, and the chain runs
on; a watched call that disagrees with the map leaves the graph on its usual call, with the same tokens.
"""

from __future__ import annotations

import pytest
import torch

import fdecode
from fdecode.bench import llama
from fdecode.graphs import flat

PROMPTS = [[(7 * i) % 64 for i in range(236)], [(5 * i + 3) % 64 for i in range(240)]]  # near the first window's end
STEPS = 16


def compile_pair(backend: str, batch: int = 2):
    target = llama(64, 32, 1, seed=1)
    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=batch, max_seq_len=320, backend=backend)
    return fdecode.compile(target, llama(64, 32, 1, seed=2), cfg, announce=False)


def run(step, steps: int, state=None):
    state = step.prefill(PROMPTS, max_new_tokens=72, eos_token_id=[]) if state is None else state
    packed = []
    for _ in range(steps):
        state, out = step(state)
        packed.append(out.packed.tolist())
    return packed, state


def flat_calls(step) -> list:
    return [getattr(graph, "flat_call", None) for graph in step.graphs.values()]


@pytest.mark.slow
def test_flat_calls_equal_the_eager_step_and_other_layouts_are_still_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("FDECODE_CACHE_DIR", str(tmp_path))
    step = compile_pair("inductor")
    eager = compile_pair("eager")
    reference, _ = run(eager, 2 * STEPS)
    compiled, state = run(step, STEPS)
    assert step.dynamic_window and [key.window for key in step.graphs] == [None]  # the window size is an input
    assert (
        step.schedule.record(state).max_position > 256
    )  # the run crossed from the 16-block window to the 20-block one
    assert compiled == reference[:STEPS]
    calls = flat_calls(step)
    assert all(isinstance(call, flat.FlatCall) and call.flat for call in calls), calls
    assert [call.watched for call in calls] == [1]  # the first trusted call, then flat calls only

    with pytest.raises(ValueError, match=r"state.tokens is \(2, 5\)"):
        step(state.replace(tokens=torch.zeros(2, 5, dtype=torch.long)))
    other = compile_pair("eager", batch=3).prefill([PROMPTS[0]] * 3, max_new_tokens=8)
    with pytest.raises(ValueError, match="this step expects"):
        step(other)
    rest, _ = run(step, STEPS, state)  # the chain runs on, flat
    assert compiled + rest == reference
    assert [call.watched for call in calls] == [1]

    # A watched call that disagrees with the probe's map: the graph keeps Dynamo's bytecode, tokens unchanged.
    monkeypatch.setattr(flat, "_agrees", lambda *args: False)
    for call in calls:
        call.flat = None  # to be watched again
    again, _ = run(step, STEPS)
    assert again == reference[:STEPS]
    assert all(call.flat is False for call in calls)
    assert [call.watched for call in calls] == [2]
