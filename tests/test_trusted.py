"""What a stored Inductor step skips on the states it returned itself, and only on those: Dynamo's guard check
(`fdecode.graphs.trusted`), then the pytree and bytecode work of the call (`fdecode.graphs.flat`: Inductor's graph
called with the leaves in the order Dynamo's bytecode read them on a probe, once the first trusted call, watched,
agreed with that map).

One Inductor compile of a 1-layer, 32-wide pair (the host-time micro model), kept in a folder of this module's
(`stored_steps`): the first test compiles it, the other loads it. Over a chain of steps the guards run once per
(graph that made the state, graph that runs it), not once per step; the flat calls' tokens equal the eager step's
across two windows (the graph of every window: its window size is a graph input too); a fresh prefill is checked
again (once, for it alone: then it runs as a trusted state does); a state of another layout is still refused with check_state's error before anything runs, whether derived
from a trusted state or made by a step of another config, and the chain runs on; a watched call that disagrees
with the map leaves the graph on its usual call, with the same tokens.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.aot_compile import AOTCompiledFunction

import fdecode
from fdecode.bench import llama
from fdecode.graphs import flat

PROMPTS = [list(range(1, 17)), list(range(5, 25))]
LONG_PROMPTS = [[(7 * i) % 64 for i in range(236)], [(5 * i + 3) % 64 for i in range(240)]]  # near a window's end
STEPS = 16


def compile_pair(backend: str, batch: int = 2):
    target = llama(64, 32, 1, seed=1)
    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=batch, max_seq_len=320, backend=backend)
    return fdecode.compile(target, llama(64, 32, 1, seed=2), cfg, announce=False)


def tokens(step, steps: int) -> list:
    state = step.prefill(PROMPTS, max_new_tokens=80, eos_token_id=[])
    packed = []
    for _ in range(steps):
        state, out = step(state)
        packed.append(out.packed.tolist())
    return packed, state


@pytest.fixture(scope="module")
def stored_steps(tmp_path_factory):
    """The folder this module's Inductor step is kept in: one compile for the module's tests."""
    return tmp_path_factory.mktemp("steps")


@pytest.mark.slow
def test_guards_run_once_per_pair_of_graphs_and_other_layouts_are_refused(stored_steps, monkeypatch):
    monkeypatch.setenv("FDECODE_CACHE_DIR", str(stored_steps))
    checks = []
    guard_check = AOTCompiledFunction.guard_check
    monkeypatch.setattr(
        AOTCompiledFunction, "guard_check", lambda self, *a, **k: checks.append(1) or guard_check(self, *a, **k)
    )
    step = compile_pair("inductor")
    assert all(type(g).__name__ == "StoredGraph" for g in step.graphs.values())
    compiled, state = tokens(step, 12)
    # The first call (the prefilled state) compiles and runs through the guards; the second checks them once,
    # explicitly, on the state the first returned and trusts the pair (greedy graph -> greedy graph); the ten
    # after check nothing.
    assert len(checks) == 2, checks
    reference, _ = tokens(compile_pair("eager"), 12)
    assert compiled == reference

    # A new prefill's state is not trusted: its first step checks the guards again, for it alone, then calls the
    # graph as a trusted state's (not through Dynamo's bytecode and AOTAutograd's wrappers).
    guarded = []
    call = AOTCompiledFunction.__call__
    monkeypatch.setattr(AOTCompiledFunction, "__call__", lambda self, *a, **k: guarded.append(1) or call(self, *a, **k))
    stale = state
    _, state = tokens(step, 2)
    assert len(checks) == 3 and not guarded, (checks, guarded)
    with pytest.raises(ValueError, match="taken over by a later step.prefill"):
        step(stale)  # the chain before that prefill: its KV is the new chain's

    # Other layouts are refused before anything runs, even from the trusted state.
    with pytest.raises(ValueError, match=r"state.tokens is \(2, 5\)"):
        step(state.replace(tokens=torch.zeros(2, 5, dtype=torch.long)))
    other = compile_pair("eager", batch=3).prefill([PROMPTS[0]] * 3, max_new_tokens=8)
    with pytest.raises(ValueError, match="this step expects"):
        step(other)
    state, _ = step(state)  # the trusted chain still runs, unguarded
    assert len(checks) == 3, checks


def test_the_last_state_is_still_refused_once_its_pool_is_taken_over():
    """The state a step returned last skips the layout checks, not its chain's: once a prefill takes its pool over,
    stepping it raises (eager: the trust is the Step's, whatever runs the graph)."""
    step = compile_pair("eager")
    state, _ = step(step.prefill(PROMPTS, max_new_tokens=8, eos_token_id=[]))
    step.prefill(PROMPTS, max_new_tokens=8, eos_token_id=[])
    with pytest.raises(ValueError, match="taken over by a later step.prefill"):
        step(state)


def test_a_replace_of_the_last_state_with_leaves_of_its_layout_stays_trusted(monkeypatch):
    """What an Engine steps after growing a block table (`state.replace(block_tables=...)`) skips the checks as the
    last state does; a leaf of another layout, a copy of the KV or a state built without the chain's ticket is
    checked (eager: the trust is the Step's, whatever runs the graph)."""
    from torch.utils import _pytree as pytree

    step = compile_pair("eager")
    checked = []
    check_state = step.check_state
    monkeypatch.setattr(step, "check_state", lambda s: checked.append(1) or check_state(s))
    state, _ = step(step.prefill(PROMPTS, max_new_tokens=40, eos_token_id=[]))
    assert len(checked) == 1  # the prefilled state
    state, _ = step(state.replace(block_tables=state.block_tables.clone()))
    assert len(checked) == 1
    strided = torch.zeros(state.tokens.shape[1], state.tokens.shape[0], dtype=state.tokens.dtype).t()
    state, _ = step(state.replace(tokens=strided.copy_(state.tokens)))  # same shape, other strides
    assert len(checked) == 2
    kept = state
    copy = pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, state)
    step(copy)  # a copy of the KV: a chain of its own, checked; the original chain is not consumed by it
    assert len(checked) == 3 and not kept.consumed


def run(step, steps: int, state=None):
    state = step.prefill(LONG_PROMPTS, max_new_tokens=72, eos_token_id=[]) if state is None else state
    packed = []
    for _ in range(steps):
        state, out = step(state)
        packed.append(out.packed.tolist())
    return packed, state


def flat_calls(step) -> list:
    return [getattr(graph, "flat_call", None) for graph in step.graphs.values()]


@pytest.mark.slow
def test_flat_calls_equal_the_eager_step_and_other_layouts_are_still_refused(stored_steps, monkeypatch):
    monkeypatch.setenv("FDECODE_CACHE_DIR", str(stored_steps))
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
    other = compile_pair("eager", batch=3).prefill([LONG_PROMPTS[0]] * 3, max_new_tokens=8)
    with pytest.raises(ValueError, match="this step expects"):
        step(other)
    rest, _ = run(step, STEPS, state)  # the chain runs on, flat
    assert compiled + rest == reference
    assert [call.watched for call in calls] == [1]

    # A watched call that disagrees with the probe's map: the graph keeps Dynamo's bytecode, tokens unchanged.
    monkeypatch.setattr(flat, "agrees", lambda *args: False)
    for call in calls:
        call.flat = None  # to be watched again
    again, _ = run(step, STEPS)
    assert again == reference[:STEPS]
    assert all(call.flat is False for call in calls)
    assert [call.watched for call in calls] == [2]
