"""`step(state, depth=d)`: verify d of the window's K drafts and propose as many for the next window.

Every depth reads and writes the one state, so the depth may change at every step: the committed tokens stay
the target's (greedy == transformers; random lanes follow the filtered target exactly), a draft that agrees
with the target keeps being accepted after a shallow step (its KV is repaired where every proposal was
accepted), and each depth is one graph of its own that never recompiles.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from support.llama_models import draft_of, fdecode_target, hf_greedy
from support.stats import ALPHA, chi2_pvalue
from support.tiny_vocab import PROMPT, V, exact_distribution, tiny_draft, tiny_target

import fdecode

PROMPTS = [(5, 17, 33, 2, 9, 41, 60), (7, 3), (11, 12, 13, 14, 15, 80, 81, 82, 83, 84, 85, 86, 87)]
NEW = 20
SCHEDULE = (3, 1, 0, 2, 3, 3, 1, 1, 2, 0, 3)  # depths, cycled: rising, falling, first-row steps, K


def decode(step, prompts, schedule, max_new_tokens=NEW, **sampling):
    """Tokens per prompt and, per step, (depth, accepted length of each running lane)."""
    state = step.prefill([list(p) for p in prompts], max_new_tokens=max_new_tokens, **sampling)
    outs = [state.step_output.tokens[b, :1].tolist() for b in range(len(prompts))]
    steps = []
    for depth in itertools.cycle(schedule):
        if bool(state.step_output.finished[: len(prompts)].all()):
            return outs, steps
        running = ~state.step_output.finished[: len(prompts)]
        state, out = step(state, depth=depth)
        counts = out.num_tokens[: len(prompts)]
        for b in range(len(prompts)):
            outs[b] += out.tokens[b, : int(counts[b])].tolist()
        steps.append((depth, counts[running].tolist()))


def build(draft_kind: str, kind: str = "partial", k: int = 3, **changes):
    layers = 1 if (draft_kind == "mtp" and kind == "self") else 2
    target = fdecode_target(layers)
    draft = draft_of(draft_kind, kind, target)
    cfg = fdecode.DecodeConfig(
        **{"num_draft_tokens": k, "max_batch": 4, "max_seq_len": 64, "block_size": 4, "backend": "eager", **changes}
    )
    return fdecode.compile(target, draft, cfg), layers


@pytest.mark.parametrize("draft_kind", ["model", "mtp", "ngram"])
def test_greedy_equals_transformers_whatever_the_depth_of_each_step(draft_kind):
    step, layers = build(draft_kind)
    outs, steps = decode(step, PROMPTS, SCHEDULE)
    assert outs == [hf_greedy(p, NEW, None, layers) for p in PROMPTS]
    for depth, counts in steps:
        assert all(n <= depth + 1 for n in counts), (depth, counts)  # a step commits at most depth + 1 tokens
    if draft_kind != "ngram":  # these prompts repeat nothing to look up
        assert any(n > 1 for _, counts in steps for n in counts)


@pytest.mark.parametrize(("draft_kind", "catch_up"), [("model", 8), ("model", 2), ("model", 0), ("mtp", 8)])
def test_a_draft_that_agrees_is_accepted_as_far_as_it_was_asked(draft_kind, catch_up):
    """A draft equal to the target: each step accepts min(depth, drafts the previous step proposed) drafts, so
    the draft's KV and the window stay right across depth changes (a shallow step proposes max(depth, 1); the
    draft's KV of its last proposal is repaired when all of them are accepted). A draft LM sits depth-0 steps
    out: the next step that drafts (or the depth-0 step after `draft_catch_up` of them) verifies the first row,
    feeds the draft the tokens it missed and proposes one, which is then accepted: the draft's KV caught up."""
    step, _ = build(draft_kind, "self", k=4, max_seq_len=128, draft_catch_up=catch_up)
    assert step.idles_draft == (draft_kind == "model" and catch_up > 0)
    prompts = [(1, 2, 3), (4, 5)]
    schedule = (4, 2, 0, 1, 3, 0, 0, 0, 4, 4, 2, 0, 2, 4)
    state = step.prefill([list(p) for p in prompts], max_new_tokens=120)
    proposed, lag, catch_ups = 4, 0, 0  # after a prefill the window carries K drafts
    for depth in schedule * 2:
        state, out = step(state, depth=depth)
        if step.idles_draft and depth == 0 and lag < catch_up:  # the target alone; the draft sits it out
            committed, proposed, lag = 1, 0, lag + 1
        elif step.idles_draft and lag > 0:  # catch-up: the first row verified, one draft proposed
            committed, proposed, lag, catch_ups = 1, 1, 0, catch_ups + 1
        else:
            committed, proposed = min(depth, proposed) + 1, max(depth, 1)
        assert out.num_tokens.tolist()[:2] == [committed] * 2, (depth, proposed, lag)
        assert step.schedule.record(state).draft_lag == lag
    # Each catch-up's draft was accepted by the step after it (asserted above): the draft's KV caught up.
    assert catch_ups == (6 if step.idles_draft else 0)  # with catch_up=2 the third 0 of 0, 0, 0 is one


RANDOM_CASES = [  # (draft, sampling parameters): every proposal accepted, some, adversarial
    ("self", dict(temperature=0.8, top_k=4, top_p=0.9, min_p=0.0)),
    ("adversarial", dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)),
]


@pytest.mark.parametrize(("draft_kind", "params"), RANDOM_CASES)
def test_random_lanes_follow_the_filtered_target_as_the_depth_changes(draft_kind, params):
    """Three new tokens (125 outcomes, enumerated) over 64 x 40 seeded lanes, the depth changing at each step
    (a step of depth 2 after a first-row step finds one proposal and -1s): chi-square against the target."""
    target = tiny_target()
    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=64, max_seq_len=12, block_size=4, backend="eager")
    step = fdecode.compile(target, tiny_draft(draft_kind, target), cfg)
    samples = []
    for batch in range(40):
        seeds = [1000 * batch + lane for lane in range(64)]
        outs, _ = decode(step, [PROMPT] * 64, (1, 0, 2, 3), max_new_tokens=3, seed=seeds, **params)
        samples.append(torch.tensor(outs))
    samples = torch.cat(samples)
    cells = samples[:, 0] * V * V + samples[:, 1] * V + samples[:, 2]
    counts, expected = torch.bincount(cells, minlength=V**3), exact_distribution(target, params)
    assert chi2_pvalue(counts, expected) > ALPHA
    assert expected[counts > 0].min() > 0


def test_each_depth_is_one_graph_that_never_recompiles():
    step, _ = build("model", backend="dynamo", sampling=False)
    state = step.prefill([[1, 2, 3], [4, 5, 6, 7]], max_new_tokens=40)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for depth in (3, 1, 0, 1, 3, 0, 3):
            state, _ = step(state, depth=depth)
    # (0, True): the catch-up graph, which the first step that drafts after a depth-0 step runs (`fdecode.ops.catch_up`)
    assert sorted((key.depth, key.catch_up) for key in step.graphs) == [(0, False), (0, True), (1, False), (3, False)]
    # Depth 1: the target's 2 layers over 2 rows, one draft forward (its first, 2 rows, 2 layers).
    # (at depth K: 2 + K writes, tests/test_graph.py)
    shallow = fdecode.inspect(step, state, depth=1)
    assert (shallow.graph_count, shallow.graph_break_count, shallow.host_syncs) == (1, 0, [])
    assert shallow.op_counts["aten::index_put"] == 2 + 1 and "depth 1" in shallow.plan
    state, _ = step(state, depth=0)  # the draft sits out: the next step that drafts is the catch-up graph
    caught_up = fdecode.inspect(step, state, depth=1)
    assert (caught_up.graph_count, caught_up.graph_break_count, caught_up.host_syncs) == (1, 0, [])
    assert caught_up.op_counts["fdecode::prepare_next_draft"] == 1 and "catch-up" in caught_up.plan


def test_bad_depths_are_refused_before_anything_runs():
    step, _ = build("model")
    state = step.prefill([[1, 2, 3]], max_new_tokens=4)
    for depth in (-1, 4, 1.0, True):
        with pytest.raises(ValueError, match="depth must be an int in 0 .. K = 3"):
            step(state, depth=depth)
    with pytest.raises(ValueError, match="speculate=False is depth 0"):
        step(state, speculate=False, depth=2)
    assert not state.consumed
    with pytest.raises(ValueError, match="depth must be"):
        step.warmup(depths=[5])
