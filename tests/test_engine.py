"""The runtime: continuous batching by priming, one-step-behind reads, paged allocation."""

from __future__ import annotations

import functools
import gc
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.llama_models import VOCAB, fdecode_target, independent_draft

import fdecode
from fdecode.runtime.metrics import RequestMetrics

K = 2


@functools.cache
def models():
    target = fdecode_target(2)
    return target, independent_draft("partial", target)


def make_step(max_batch=3, num_blocks=None, max_seq_len=48, backend="eager"):
    target, draft = models()
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=K,
        max_batch=max_batch,
        max_seq_len=max_seq_len,
        block_size=4,
        num_blocks=num_blocks,
        backend=backend,
    )
    return fdecode.compile(target, draft, cfg)


@functools.cache
def alone(prompt: tuple[int, ...], max_new_tokens: int, eos: int | None) -> list[int]:
    """One-request-at-a-time greedy decoding: the reference for every schedule."""
    return fdecode.generate(make_step(max_batch=1), [list(prompt)], max_new_tokens=max_new_tokens, eos_token_id=eos)[0]


requests = st.lists(
    st.tuples(
        st.integers(0, 6),  # arrival step
        st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10).map(tuple),  # prompt
        st.integers(1, 14),  # budget
        st.one_of(st.none(), st.integers(0, VOCAB - 1)),  # eos id
    ),
    min_size=1,
    max_size=7,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=requests, max_batch=st.integers(1, 3), pool=st.integers(8, 30))
def test_any_arrival_schedule_gives_each_request_its_solo_tokens(schedule, max_batch, pool):
    engine = fdecode.Engine(make_step(max_batch=max_batch, num_blocks=pool))
    pending = sorted(schedule, key=lambda r: r[0])
    want, got, tick = {}, {}, 0
    while pending or engine.has_work():
        while pending and pending[0][0] <= tick:
            _, prompt, budget, eos = pending.pop(0)
            rid = engine.add_request(list(prompt), max_new_tokens=budget, eos_token_id=eos)
            want[rid] = alone(prompt, budget, eos)
        for event in engine.step():
            assert not got.get(event.request_id, (None, False))[1], "event after finish"
            tokens, _ = got.get(event.request_id, ([], False))
            got[event.request_id] = (tokens + event.new_tokens, event.finished)
        tick += 1
        assert tick < 500
    assert {rid: tokens for rid, (tokens, _) in got.items()} == want
    assert all(finished for _, finished in got.values())
    assert engine.allocator.num_free == engine.allocator.capacity  # every block came back


def test_seeded_random_requests_do_not_depend_on_the_batch():
    solo = fdecode.Engine(make_step(max_batch=1))
    rid = solo.add_request([5, 6, 7], max_new_tokens=12, temperature=0.9, top_k=10, seed=77)
    want = solo.run()[rid]
    busy = fdecode.Engine(make_step(max_batch=3))
    busy.add_request([1, 2], max_new_tokens=5)
    busy.step()
    busy.step()
    rid = busy.add_request([5, 6, 7], max_new_tokens=12, temperature=0.9, top_k=10, seed=77)
    busy.add_request([9, 9, 9, 9], max_new_tokens=20, temperature=1.0, seed=3)
    assert busy.run()[rid] == want


def test_one_host_read_per_step_and_streaming_callbacks():
    seen = []
    engine = fdecode.Engine(make_step(), callbacks=[seen.append])
    ids = [engine.add_request([3, 1, 4], max_new_tokens=9), engine.add_request([1, 5], max_new_tokens=4)]
    results = engine.run()
    assert engine.host_waits == engine.steps + 1  # one read per step, plus the very first priming read
    assert sorted(results) == ids
    assert [e for e in seen if e.finished] and all(isinstance(e, fdecode.Event) for e in seen)
    assert sum(len(e.new_tokens) for e in seen) == 13


@pytest.mark.parametrize("budgets", [[11], [5, 11]])
def test_no_step_runs_past_the_end_of_the_requests(budgets):
    """The Engine reads one step behind, except where every running lane may finish in the pending step:
    it reads that one before launching, so it runs the steps a loop reading each output at once runs."""
    prompts = [[3, 1, 4], [1, 5]][: len(budgets)]
    step = make_step()
    state = step.prefill(prompts, params=[fdecode.SamplingParams(max_new_tokens=b, ignore_eos=True) for b in budgets])
    loop = 0
    while not bool(state.step_output.finished.all()):
        state, _ = step(state)
        loop += 1
    engine = fdecode.Engine(make_step())
    ids = [engine.add_request(p, max_new_tokens=b, ignore_eos=True) for p, b in zip(prompts, budgets)]
    got = engine.run()
    assert [len(got[i]) for i in ids] == budgets
    assert engine.steps == loop  # one more before: a last launch that ran finished lanes only
    assert engine.host_waits == engine.steps + 1


@pytest.mark.parametrize("max_batch", [1, 3])
def test_no_recompile_over_admissions_and_retirements(max_batch):
    step = make_step(max_batch=max_batch, backend="dynamo")
    engine = fdecode.Engine(step)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i in range(8):
            engine.add_request([i + 1, 2, 3], max_new_tokens=3 + i, temperature=0.5 * (i % 2), seed=i)
            engine.step()
        engine.run()
    # No recompile, and no graph per admission either: the greedy plan's and the general plan's, one window.
    assert sorted(name for _, name in step.plan_compile_seconds) == ["full+top_k+top_p", "greedy"]
    assert len(step.graphs) == 2


@pytest.mark.slow
def test_memory_stays_flat_over_400_steps_of_admissions():
    """Python objects alive after 150 warm-up steps: no trend over 400 more. Counted as pymalloc blocks
    (`sys.getallocatedblocks`, free to read, unlike tracemalloc, which made each step 2.5x slower): lazy
    caches add ~0.2 blocks a step; an object leaked per step adds 1 (200 over the last 200 steps)."""
    engine = fdecode.Engine(make_step(max_batch=4, num_blocks=40))
    kv_ptrs = (engine.state.target_kv.data_ptr(), engine.state.draft_kv.data_ptr())
    n = 0

    def top_up():
        nonlocal n
        while engine.num_waiting < 2:
            engine.add_request([n % 90 + 1, 7], max_new_tokens=5 + n % 9, temperature=0.7 * (n % 2), seed=n)
            n += 1

    for _ in range(150):  # warm-up: allocator, caches, lazy imports
        top_up()
        engine.step()
    gc.collect()
    base = sys.getallocatedblocks()
    counts = []
    for i in range(400):
        top_up()
        engine.step()
        if i % 100 == 99:
            gc.collect()
            counts.append(sys.getallocatedblocks() - base)
    assert n > 200  # requests really came and went
    assert max(counts) < 2_000, counts  # no per-step growth
    assert counts[-1] - counts[1] < 120, counts  # ... nor a slow one
    assert (engine.state.target_kv.data_ptr(), engine.state.draft_kv.data_ptr()) == kv_ptrs  # KV never reallocated


def test_pool_exhaustion_waits_and_impossible_requests_fail():
    engine = fdecode.Engine(make_step(max_batch=3, num_blocks=9))  # 8 usable blocks
    big = engine.add_request([1] * 10, max_new_tokens=18)  # 7 blocks
    small = engine.add_request([2, 3], max_new_tokens=6)  # 2 blocks: must wait for `big`
    engine.step()
    assert engine.num_active == 1 and engine.num_waiting == 1
    results = engine.run()
    assert results[big] == alone(tuple([1] * 10), 18, None) and results[small] == alone((2, 3), 6, None)
    with pytest.raises(ValueError, match="could never be admitted"):
        fdecode.Engine(make_step(max_batch=3, num_blocks=4)).add_request([1] * 10, max_new_tokens=8)
    with pytest.raises(ValueError, match="max_seq_len"):
        engine.add_request([1] * 40, max_new_tokens=9)


def test_overcommitted_pool_stops_the_lanes_that_run_dry_and_spares_the_others():
    # 12 usable blocks; two requests may each grow to 8 (4 prompt + 28 budget), a short one needs 2.
    engine = fdecode.Engine(make_step(max_batch=3, num_blocks=13), overcommit=True)
    requests = {(1, 2, 3, 4): 28, (9, 8, 7, 6): 28, (5, 5): 3}
    ids = {engine.add_request(list(p), max_new_tokens=n): (p, n) for p, n in requests.items()}
    events = list(engine.stream())
    errors = {e.request_id for e in events if e.error}
    assert errors and all("KV blocks" in e.error and e.finished for e in events if e.error)
    for rid, (prompt, budget) in ids.items():
        tokens = [t for e in events if e.request_id == rid for t in e.new_tokens]
        solo = alone(prompt, budget, None)
        if rid in errors:
            assert len(tokens) < budget and tokens == solo[: len(tokens)]  # cut short, never wrong
        else:
            assert tokens == solo
    assert ids and max(ids) not in errors  # the short request finished normally
    assert engine.allocator.num_free == engine.allocator.capacity


@pytest.mark.parametrize("newcomer", [(4, 6), (6, 6)])
def test_a_newcomer_never_takes_the_blocks_a_running_request_needs_next(newcomer):
    """8 usable blocks: the running request grows to 6 (4 + 20 tokens); the newcomer's first 3 fit beside
    it only while it is small. Arriving at every step in turn, the newcomer never makes the running
    request run dry (before the fix, arriving at step 8 it took the block the running one needed next and
    that request, tokens already streamed, was cut); the newcomer waits, and both equal their solo runs."""
    step = make_step(max_batch=2, num_blocks=9)
    prompt, budget = tuple(range(10, 10 + newcomer[0])), newcomer[1]
    for arrival in range(12):
        engine = fdecode.Engine(step, overcommit=True)
        running = engine.add_request([1, 2, 3, 4], max_new_tokens=20)
        events = [e for _ in range(arrival) for e in engine.step()]
        late = engine.add_request(list(prompt), max_new_tokens=budget)
        events += list(engine.stream())
        assert not any(e.error for e in events), arrival
        tokens = lambda rid: [t for e in events if e.request_id == rid for t in e.new_tokens]
        assert tokens(running) == alone((1, 2, 3, 4), 20, None) and tokens(late) == alone(prompt, budget, None)


def test_step_stops_a_lane_whose_blocks_are_missing():
    step = make_step(max_batch=2)
    state = step.prefill([[1, 2, 3], [4, 5, 6]], max_new_tokens=30)
    table = state.block_tables.clone()
    table[0, 2:] = -1  # lane 0 owns positions 0..7 only; its budget would take it to 32
    state = state.replace(block_tables=table)
    tokens = [[int(state.tokens[0, 0])], [int(state.tokens[1, 0])]]
    errors = []
    for _ in range(12):
        state, out = step(state)
        for lane in (0, 1):
            tokens[lane] += out.tokens[lane, : int(out.num_tokens[lane])].tolist()
        errors.append(out.error.tolist())
    assert [True, False] in errors and not any(e[1] for e in errors)
    # Positions 0..7 have KV; the token at 8 may be committed (its KV is written by the next
    # validate, which is where the lane stops), nothing after it.
    assert 3 + len(tokens[0]) <= 9
    assert tokens[0] == alone((1, 2, 3), 30, None)[: len(tokens[0])]  # cut short, never wrong
    assert tokens[1] == alone((4, 5, 6), 30, None)[: len(tokens[1])] and len(tokens[1]) > 8


def test_cancel_and_unknown_ids():
    engine = fdecode.Engine(make_step(max_batch=1))
    first = engine.add_request([1, 2], max_new_tokens=30)
    second = engine.add_request([3, 4], max_new_tokens=4)
    engine.step()
    engine.step()
    engine.cancel(first)  # frees the lane: the waiting request is admitted
    assert engine.run() == {first: [], second: alone((3, 4), 4, None)}  # first: its final event, no tokens
    with pytest.raises(KeyError, match="unknown request id"):
        engine.cancel(first)
    with pytest.raises(KeyError, match="unknown request id"):
        engine.cancel(12345)


def device_tensors(step, state) -> list[torch.Tensor]:
    """What lives on the device before any request: the state's leaves and the models' weights."""
    from torch.utils._pytree import tree_leaves

    models = (step.target, step.draft)
    return [*tree_leaves(state), *(t for m in models for t in (*m.parameters(), *m.buffers()))]


def test_admission_and_cancellation_never_wait_for_the_device():
    """Every engine.step() (launch, read, admissions of greedy and random requests, block-table growth)
    and cancel() of running and waiting requests, under a mode that raises on any host read of a device
    tensor and on any blocking host <-> device copy (`tests/support/device_reads.py`); the tokens are those
    of the same schedule run without the mode."""
    from support.device_reads import DeviceReads

    def schedule(engine):
        events = []
        ids = [engine.add_request([1, 2, 3], max_new_tokens=20)]
        for i in range(10):
            ids.append(engine.add_request([i + 1, 4], max_new_tokens=3 + i % 4, temperature=0.7 * (i % 2), seed=i))
            if i == 4:
                engine.cancel(ids[0])  # running
            if i == 6:
                engine.cancel(ids[-1])  # still waiting
            events += engine.step()
        events += engine.stream()
        return events, {ids[0], ids[7]}

    want, _ = schedule(fdecode.Engine(make_step(max_batch=2)))
    engine = fdecode.Engine(make_step(max_batch=2))
    mode = DeviceReads().mark(*device_tensors(engine.step_fn, engine.state))
    with mode:
        got, cancelled = schedule(engine)
    assert got == want and mode.calls > 1000
    assert {e.request_id for e in got if e.finished} == set(range(11))  # cancelled ones too: a final event
    assert {e.request_id for e in got if e.reason == "cancelled"} == cancelled
    assert engine.allocator.num_free == engine.allocator.capacity


def test_a_cancelled_request_gets_a_final_event():
    """cancel() of a running and of a waiting request: each gets one last event, finished with the reason,
    through stream() and the callbacks; requests that end by themselves say why (stop id or length)."""
    seen = []
    engine = fdecode.Engine(make_step(max_batch=1), callbacks=[seen.append])
    running = engine.add_request([1, 2], max_new_tokens=30)
    waiting = engine.add_request([3, 4], max_new_tokens=30)
    last = engine.add_request([5, 6], max_new_tokens=3)
    engine.step()
    engine.step()
    engine.cancel(running)
    engine.cancel(waiting)
    events = list(engine.stream())
    final = {e.request_id: e for e in events if e.finished}
    none = RequestMetrics()  # its counts so far: priming's token is no step, and no step of it was read
    assert final[running] == fdecode.Event(running, [], True, reason="cancelled", metrics=none)
    assert final[waiting] == fdecode.Event(waiting, [], True, reason="cancelled", metrics=none)
    assert final[last].reason == "length" and [e for e in seen if e.finished] == list(final.values())
    assert all(e.reason is None for e in events if not e.finished)
    stop = alone((5, 6), 8, None)[2]
    rid = engine.add_request([5, 6], max_new_tokens=8, eos_token_id=stop)
    (end,) = [e for e in engine.stream() if e.finished]
    assert end.request_id == rid and end.reason == "stop" and end.new_tokens[-1] == stop
