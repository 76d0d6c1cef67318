"""An adaptive Engine on the plain path (no `warmup(depths=...)` call) reaches the other depths: their graphs
are made on a thread of their own (`fdecode.runtime.depth_graphs`, `fdecode.graphs.background`) while the
steps run at depth K, and nothing compiles on the Engine's thread once its first launch is done.

Eager first (making a graph is cheap there; the schedule is the same), then Inductor on the host-time micro
pair (a 1-layer, 32-wide target and draft), whose tokens are checked against the eager step's.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading

import pytest
import torch
from support.llama_models import fdecode_target, hf_greedy, independent_draft

import fdecode
from fdecode.bench import llama
from fdecode.graphs import background
from fdecode.graphs.graph_set import GraphSet
from fdecode.runtime.depth_graphs import depth_order

PROMPTS = [(5, 17, 33, 2, 9, 41, 60), (7, 3), (11, 12, 13, 14, 15, 80, 81, 82, 83, 84, 85, 86, 87)]


def test_depth_zero_first_then_the_middle_depths_from_half_k_outwards():
    assert depth_order(range(5), 4) == [0, 2, 3, 1, 4]  # K last (made by the first launch but in a CPU's tree step)
    assert depth_order(range(4), 3) == [0, 2, 1, 3]
    assert depth_order((0, 4), 4) == [0, 4]  # a recurrent model's: 0 or K
    assert depth_order((0, 1, 2, 3, 4, 6), 6) == [0, 3, 4, 2, 1, 6]  # a tree step's


def launched(engine) -> set[int]:
    return {d for d, n in engine.policy.launches.items() if n}


def test_an_engine_without_a_warmup_call_reaches_the_depth_its_draft_earns(monkeypatch):
    monkeypatch.setenv(background.ENV, "1")
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=4, max_seq_len=64, block_size=4, backend="eager")
    step = fdecode.compile(target, independent_draft("random", target), cfg)  # drafts that are never accepted
    assert set(step.graphs) == set()
    for _ in range(2):
        engine = fdecode.Engine(step)
        engine.policy.costs, engine.policy.learn_costs = [1.0, 1.3, 1.6], False  # a draft 0.3 of the target
        ids = [engine.add_request(list(p), max_new_tokens=12) for p in PROMPTS]
        got = engine.run()
        assert [got[i] for i in ids] == [hf_greedy(p, 12) for p in PROMPTS]
        assert step.graph_set.background.wait(timeout=60)
    made = {(key.depth, key.catch_up) for key in step.graph_set.background.made}
    assert made == {(0, False), (0, True), (1, False)}, step.graph_set.background
    # The catch-up graph first: once a lane's draft lags every depth but 0 runs it (none ready without it).
    first_two = [(key.depth, key.catch_up) for key in step.graph_set.background.made[:2]]
    assert first_two == [(0, True), (0, False)], step.graph_set.background
    assert launched(engine) - {2}, engine.policy  # the second round launched a shallower depth than K


def test_graphs_made_in_the_background_run_their_compilers_at_the_threads_lowest_priority(monkeypatch):
    """The thread runs at nice 19 (Linux), and while it makes a graph Inductor builds kernels in that thread (one
    compile thread), not in its worker pool, whose processes carry the priority of the thread that first compiled
    (often the Engine's): else a background compile takes a core from the steps at their priority. The Engine's
    thread keeps its own setting."""
    monkeypatch.setenv(background.ENV, "1")
    seen = []
    make = GraphSet.make

    def recorded(self, *args):
        thread = threading.current_thread()
        nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) if hasattr(os, "getpriority") else None
        seen.append((thread.name, torch._inductor.config.compile_threads, nice))
        return make(self, *args)

    monkeypatch.setattr(GraphSet, "make", recorded)
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=64, block_size=4, backend="eager")
    step = fdecode.compile(target, independent_draft("random", target), cfg)
    with torch._inductor.config.patch(compile_threads=2):  # this thread's (the suite's conftest sets 1)
        engine = fdecode.Engine(step)
        engine.add_request(list(PROMPTS[0]), max_new_tokens=8)
        engine.run()
        assert step.graph_set.background.wait(timeout=60) and len(step.graph_set.background.made) == 3
        assert torch._inductor.config.compile_threads == 2
    assert {(name, threads) for name, threads, _ in seen} == {("fdecode-graphs", 1)}, seen
    if sys.platform == "linux":
        assert {nice for _, _, nice in seen} == {19}, seen


def test_no_graph_is_made_in_the_background_when_it_is_turned_off_or_the_depth_is_fixed(monkeypatch):
    target = fdecode_target(2)
    for env, adaptive in (("0", True), ("1", False)):
        monkeypatch.setenv(background.ENV, env)
        cfg = fdecode.DecodeConfig(
            num_draft_tokens=2, max_batch=2, max_seq_len=64, block_size=4, backend="eager", adaptive_depth=adaptive
        )
        step = fdecode.compile(target, independent_draft("random", target), cfg)
        engine = fdecode.Engine(step)
        engine.add_request(list(PROMPTS[0]), max_new_tokens=8)
        engine.run()
        assert engine.depth_graphs.asked == [] and launched(engine) == {2}, (env, adaptive)
        assert {key.depth for key in step.graphs} == {2}
    # Nor where the steps' graphs are Dynamo-wrapped functions (one called during a background trace would run
    # as plain PyTorch): aot_eager, or Inductor with the disk store off.
    monkeypatch.setenv(background.ENV, "1")
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=64, block_size=4, backend="aot_eager")
    assert not fdecode.Engine(fdecode.compile(target, independent_draft("random", target), cfg)).depth_graphs.on
    monkeypatch.setenv("FDECODE_CACHE_DIR", "off")
    cfg = dataclasses.replace(cfg, backend="inductor")
    assert not fdecode.Engine(fdecode.compile(target, independent_draft("random", target), cfg)).depth_graphs.on


@pytest.mark.slow
def test_inductor_graphs_of_the_other_depths_are_made_off_the_engines_thread(monkeypatch):
    monkeypatch.setenv(background.ENV, "1")
    target, draft = llama(64, 32, 1, seed=1), llama(64, 32, 1, seed=2)
    prompts = [[(7 * i + 3) % 64 for i in range(20)], [(5 * i + 1) % 64 for i in range(9)]]

    def compiled(backend: str):
        cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=96, backend=backend)
        return fdecode.compile(target, draft, cfg, announce=False)

    step = compiled("inductor")
    threads = []
    capture = type(step.graph_set)._capture
    monkeypatch.setattr(
        type(step.graph_set),
        "_capture",
        lambda self, fn: threads.append(threading.current_thread().name) or capture(self, fn),
    )
    outputs = []
    for _ in range(2):
        engine = fdecode.Engine(step)
        engine.policy.costs, engine.policy.learn_costs = [1.0, 1.3, 1.6], False
        ids = [engine.add_request(p, max_new_tokens=24, eos_token_id=[]) for p in prompts]
        got = engine.run()
        outputs.append([got[i] for i in ids])
        if not outputs[1:]:  # another compile in the process meanwhile waits for the graph in progress, no clash
            assert step.graph_set.background.busy
            x = torch.randn(8)
            torch.testing.assert_close(torch.compile(lambda v: torch.sin(v) * 2 + 1)(x), torch.sin(x) * 2 + 1)
        assert step.graph_set.background.wait(timeout=600)
    # The Engine's thread made depth K's graph at its first launch; every other graph was made in the background.
    assert threads[0] == threading.main_thread().name and set(threads[1:]) == {"fdecode-graphs"}, threads
    assert {(key.depth, key.catch_up) for key in step.graph_set.background.made} == {(0, False), (0, True), (1, False)}
    assert launched(engine) - {2}, engine.policy  # the second round launched a shallower depth than K
    reference = fdecode.generate(compiled("eager"), prompts, max_new_tokens=24, eos_token_id=[])
    assert outputs[0] == outputs[1] == reference, (outputs, reference)
