"""Context buckets: a step attends over the smallest window holding every position it can touch.

The window is picked on the host from the step's record of `max_position`, an upper bound it
tracks without reading the device. These tests pin that the choice is never
too small (an attention read cut short would silently change the output), that
outputs equal transformers' greedy output across windows and across a switch in
the middle of a generation, that one graph serves every window (nothing compiles
after the first token) or, with `dynamic_window=False`, that each window is one
graph that never recompiles, and that every compile is announced.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.graph_runs import record_runs
from support.llama_models import fdecode_target, hf_greedy, independent_draft, mtp_head
from torch._dynamo.utils import counters

import fdecode

BUCKETS = (16, 32, 48)  # tokens; max_seq_len 100 adds the whole lane (100) as the last window
PROMPTS = [(5, 17, 33, 2, 9, 41, 60), (7, 3), (11, 12, 13, 14, 15, 80, 81, 82, 83, 84, 85, 86, 87)]


def config(k: int = 2, backend: str = "eager", **overrides) -> fdecode.DecodeConfig:
    base = dict(
        num_draft_tokens=k, max_batch=4, max_seq_len=100, block_size=4, context_buckets=BUCKETS, backend=backend
    )
    return fdecode.DecodeConfig(**{**base, **overrides})


def recording(step) -> list[tuple[int, int]]:
    """Wrap `step`'s graphs to record (true max base_pos of the active lanes, window tokens) per call.

    Reading base_pos syncs, which is fine here: the test checks the host's bound against the truth."""
    calls: list[tuple[int, int]] = []

    def observe(state, blocks, _key) -> None:
        active = state.base_pos[state.active]
        calls.append((int(active.max()) if active.numel() else -1, blocks * step.config.block_size))

    record_runs(step, observe)
    return calls


def mask_key_columns(report) -> set[str]:
    """Key columns of the attention masks [B, 1, Q, S] in the inspected graphs (Q = W rows of the verify,
    2 of the first draft forward, 1 after), as strings: a number, or a symbolic size."""
    return {
        str(n.meta["val"].shape[-1])
        for g in report.graphs
        for n in g.graph.nodes
        if n.op == "call_function"
        and "val" in n.meta
        and getattr(n.meta["val"], "dtype", None) == torch.bool
        and n.meta["val"].dim() == 4
        and n.meta["val"].shape[2] in (3, 2, 1)
    }


def test_default_buckets_are_powers_of_two_up_to_the_lane() -> None:
    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=1, max_seq_len=5000)
    assert cfg.bucket_blocks == (16, 32, 64, 128, 256, 313)
    assert fdecode.DecodeConfig(num_draft_tokens=3, max_batch=1, max_seq_len=100).bucket_blocks == (7,)
    with pytest.raises(ValueError, match="context_buckets"):
        fdecode.DecodeConfig(num_draft_tokens=3, max_batch=1, max_seq_len=100, context_buckets=[64])


@settings(max_examples=200, deadline=None)
@given(
    k=st.integers(1, 6),
    block_size=st.sampled_from([1, 4, 16]),
    buckets=st.lists(st.integers(1, 300), max_size=5),
    max_position=st.integers(0, 400),
)
def test_bucket_for_holds_every_key_the_step_reads(k, block_size, buckets, max_position) -> None:
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=k, max_batch=1, max_seq_len=300, block_size=block_size, context_buckets=tuple(buckets)
    )
    blocks = cfg.bucket_for(max_position)
    assert blocks in cfg.bucket_blocks
    furthest = max_position + 2 * k  # the last draft's position; it reads keys 0 .. furthest
    assert blocks * block_size > furthest or blocks == cfg.blocks_per_lane
    smaller = [n for n in cfg.bucket_blocks if n < blocks]
    assert all(n * block_size <= furthest for n in smaller)  # and it is the smallest such window
    assert cfg.bucket_for(None) == cfg.blocks_per_lane


@pytest.mark.parametrize("draft_kind", ["model", "mtp"])
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_output_is_unchanged_across_windows(draft_kind, k) -> None:
    target = fdecode_target(2)
    draft = mtp_head("partial", target) if draft_kind == "mtp" else independent_draft("partial", target)
    step = fdecode.compile(target, draft, config(k))
    calls = recording(step)
    outs = fdecode.generate(step, [list(p) for p in PROMPTS], max_new_tokens=60)
    for prompt, got in zip(PROMPTS, outs):
        assert got == hf_greedy(prompt, 60)
    windows = [w for _, w in calls]
    assert windows == sorted(windows) and len(set(windows)) >= 3, windows  # it switched mid-generation
    assert all(pos + 2 * k < w for pos, w in calls)


def test_bound_never_underestimates_under_continuous_batching() -> None:
    """Random lanes (random draft: mixed acceptance) under an Engine, which knows positions one step
    late; requests of different lengths come and go, so the window also shrinks again."""
    target = fdecode_target(2)
    step = fdecode.compile(target, independent_draft("random", target), config(3, max_batch=3))
    calls = recording(step)
    engine = fdecode.Engine(step)
    gen = torch.Generator().manual_seed(0)
    # One long greedy request next to a stream of short random ones that outlives it.
    engine.add_request(torch.randint(0, 96, (20,), generator=gen).tolist(), max_new_tokens=24)
    for i in range(16):
        prompt = torch.randint(0, 96, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen).tolist()
        engine.add_request(prompt, max_new_tokens=12, temperature=[1.0, 0.7][i % 2], seed=i)
    engine.run()
    assert all(pos + 2 * 3 < w for pos, w in calls if pos >= 0)
    windows = [w for _, w in calls]
    assert any(b < a for a, b in zip(windows, windows[1:])), windows  # tightened after long lanes left


def test_unknown_bound_uses_the_whole_lane() -> None:
    target = fdecode_target(2)
    step = fdecode.compile(target, independent_draft("partial", target), config())
    state = step.prefill([[1, 2, 3]], max_new_tokens=10)
    assert step.schedule.record(state).max_position == 3
    calls = recording(step)
    state, _ = step(state, host=dataclasses.replace(step.schedule.record(state), max_position=None))
    assert calls[-1][1] == 100 and step.schedule.record(state).max_position is None


@pytest.mark.slow
def test_each_window_is_one_graph_without_recompiles() -> None:
    target = fdecode_target(2)
    draft = independent_draft("partial", target)
    # Greedy-only: one plan, so one graph per window (each sampling plan adds a graph per window). Three
    # windows (16, 48 and the whole lane) are enough for a stream to cross two of them.
    cfg = config(2, backend="dynamo", sampling=False, dynamic_window=False, context_buckets=(16, 48))
    step = fdecode.compile(target, draft, cfg, warmup=True)
    assert not step.dynamic_window and len(step.graphs) == 3
    times = step.compile_seconds
    assert set(times) == set(step.buckets) == {16, 48, 100}
    state = step.prefill([list(PROMPTS[0])], max_new_tokens=80)
    for context in (step.buckets[0], step.buckets[-1]):  # the narrowest and the whole lane (a capture each)
        report = fdecode.inspect(step, state, context=context)
        assert (report.graph_count, report.graph_break_count, report.host_syncs) == (1, 0, [])
        assert report.context == context and not report.dynamic_window
        assert report.op_counts["fdecode::prepare_next_draft"] == 1
        assert mask_key_columns(report) == {str(context)}  # exactly `context` key columns
    with pytest.raises(ValueError, match="not one of"):
        fdecode.inspect(step, state, context=20)
    calls = recording(step)
    outs = []
    with torch._dynamo.config.patch(error_on_recompile=True):
        while not bool(state.step_output.finished[0]):
            state, out = step(state)
            outs += out.tokens[0, : int(out.num_tokens[0])].tolist()
    assert len({w for _, w in calls}) == 3
    assert len(step.graphs) == 3  # the warmed window graphs only: a run of the stream made none
    assert state.step_output.finished[0]
    prompt_out = hf_greedy(PROMPTS[0], 80)
    assert outs == prompt_out[1:]  # the first token came with the prefill


def test_windows_follow_the_block_size_and_cap_at_the_lane() -> None:
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=2, max_batch=1, max_seq_len=50, block_size=16, context_buckets=(10, 33, 999)
    )
    assert cfg.bucket_blocks == (1, 3, 4)  # 10 -> 1 block, 33 -> 3 blocks, 999 -> capped at ceil(50/16)
    assert [cfg.bucket_for(p) for p in (0, 11, 12, 43, 1000)] == [1, 1, 3, 3, 4]
    assert math.ceil(50 / 16) == cfg.blocks_per_lane


def test_prefill_attends_over_the_prompts_window_not_the_lane(monkeypatch) -> None:
    """Priming reads the smallest window holding the prompts and its first draft forwards (here 16 of
    the lane's 100 tokens) and gives what attending over the whole lane gives: the same tokens, the
    same KV. An Engine's admission of a short prompt next to a long one reads the short one's window."""
    import fdecode.models.llama as llama

    widths = []
    original = llama.paged_context

    def spy(block_tables, *args, **kwargs):
        widths.append(block_tables.shape[1] * 4)
        return original(block_tables, *args, **kwargs)

    monkeypatch.setattr(llama, "paged_context", spy)
    target = fdecode_target(2)
    draft = independent_draft("partial", target)
    prompts = [list(PROMPTS[0]), list(PROMPTS[1])]  # 7 and 2 tokens: keys up to 6 + 2K, one 16-token window
    states = {}
    for buckets in (BUCKETS, (100,)):  # (100,): a single window, the whole lane (what prefill did before)
        step = fdecode.compile(target, draft, config(2, context_buckets=buckets))
        widths.clear()
        states[buckets] = step.prefill(prompts, max_new_tokens=40, temperature=[0.0, 1.0], seed=[0, 5])
        assert set(widths) == {16 if buckets == BUCKETS else 100}, widths
    bucketed, whole = states[BUCKETS], states[(100,)]
    for name in ("tokens", "base_pos", "output", "block_tables", "counter", "active"):
        assert torch.equal(getattr(bucketed, name), getattr(whole, name)), name
    torch.testing.assert_close(bucketed.target_kv, whole.target_kv, rtol=0, atol=1e-6)
    torch.testing.assert_close(bucketed.draft_kv, whole.draft_kv, rtol=0, atol=1e-6)
    torch.testing.assert_close(bucketed.draft_probs, whole.draft_probs, rtol=0, atol=1e-6)

    engine = fdecode.Engine(fdecode.compile(target, draft, config(2)))
    engine.add_request(list(range(1, 40)), max_new_tokens=8)  # 39 tokens: the 48-token window
    engine.step()
    widths.clear()
    engine.add_request([3, 4], max_new_tokens=8)
    engine.step()  # the step (48) and the admission of [3, 4] (16)
    assert 16 in widths and 100 not in widths, widths


def compiles() -> int:
    """Dynamo graphs compiled in this process so far (a recompile counts as one more)."""
    return counters["stats"]["unique_graphs"]


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [True, False])
def test_nothing_compiles_after_the_first_token_when_the_stream_crosses_windows(dynamic) -> None:
    """One graph for every window: the stream's first token waits for its one compile, and crossing
    into the 48- and 100-token windows compiles nothing. With a graph per window (dynamic_window=False,
    what every backend did before) each crossing compiles, which this count sees."""
    target = fdecode_target(2)
    step = fdecode.compile(
        target,
        independent_draft("partial", target),
        config(2, backend="dynamo", sampling=False, dynamic_window=dynamic),
    )
    assert step.dynamic_window is dynamic
    calls = recording(step)
    engine = fdecode.Engine(step)
    engine.add_request(list(PROMPTS[2]), max_new_tokens=40)
    before, first, tokens = compiles(), None, []
    for event in engine.stream():
        tokens += event.new_tokens
        if first is None and tokens:
            first = compiles()  # the count when the first token arrives
    assert tokens == hf_greedy(PROMPTS[2], 40)
    windows = sorted({w for _, w in calls})
    assert windows == [32, 48, 100], windows  # it crossed two windows after its first
    assert first - before == 1
    if dynamic:
        assert compiles() == first and len(step.graphs) == 1
        state = step.prefill([list(PROMPTS[0])], max_new_tokens=80)
        for context in (16, 100):  # the smallest window and the whole lane: the same graph
            report = fdecode.inspect(step, state, context=context)
            assert (report.graph_count, report.graph_break_count, report.host_syncs) == (1, 0, [])
            assert report.dynamic_window and report.recompiles == 0
            assert report.op_counts["fdecode::prepare_next_draft"] == 1
            key_columns = mask_key_columns(report)  # a symbol: block_size times the window's blocks
            assert len(key_columns) == 1 and not key_columns.pop().isdigit()
    else:
        assert compiles() - first == 2 and len(step.graphs) == 3


def test_a_window_of_one_block_has_a_graph_of_its_own() -> None:
    """Dynamo specializes sizes 0 and 1, so a 1-block window cannot share the symbolic graph; a step with
    fewer than two windows of 2+ blocks has nothing to share."""
    target = fdecode_target(2)
    draft = independent_draft("partial", target)
    step = fdecode.compile(target, draft, config(backend="aot_eager", block_size=16, context_buckets=(16, 32, 64)))
    assert step.dynamic_window and [step.graph_set.window_of(n) for n in step.config.bucket_blocks] == [
        1,
        None,
        None,
        None,
    ]
    one = fdecode.compile(target, draft, config(backend="aot_eager", block_size=16, context_buckets=(16,)))
    assert one.config.bucket_blocks == (1, 7) and not one.dynamic_window
    assert not fdecode.compile(target, draft, config(backend="eager")).dynamic_window  # eager compiles nothing
    with pytest.raises(ValueError, match="dynamic_window"):
        config(dynamic_window="yes")


def test_every_compile_is_announced_in_one_line(capsys) -> None:
    """A graph's first call says it compiles (stderr, one line); running it in another window says
    nothing more; announce=False is silent; warm-up shows a progress bar over the windows."""
    target = fdecode_target(2)
    draft = independent_draft("partial", target)
    step = fdecode.compile(target, draft, config(backend="dynamo", sampling=False))
    state = step.prefill([list(PROMPTS[2])], max_new_tokens=40)
    state, _ = step(state)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "fdecode: compiling the decode step (dynamo, greedy sampling plan, one graph for every window up to 100 "
        "tokens); the first call waits for it (step.warmup() compiles every graph up front)"
    ]
    while (
        step.config.bucket_for(step.schedule.record(state).max_position) * 4 == 32
    ):  # on into the next window: nothing compiles
        state, _ = step(state)
    state, _ = step(state)
    assert len(step.compile_seconds) == 2 and capsys.readouterr().err == ""
    step.warmup()  # the other windows only run: a bar over the 4 windows, no compile line
    err = capsys.readouterr().err
    assert "fdecode: compiling" in err and "4/4" in err and "the first call waits" not in err
    quiet = fdecode.compile(target, draft, config(backend="dynamo", sampling=False), announce=False)
    quiet.warmup()
    assert capsys.readouterr().err == ""
