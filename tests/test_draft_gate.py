"""First-row steps and the Engine's draft gate (`fdecode.runtime.gate`): n-gram drafts stop being verified
while they are not accepted, losslessly. transformers' greedy `generate` is the oracle for the tokens."""

from __future__ import annotations

import pytest
import torch
from support.llama_models import hf_greedy
from support.ngram_steps import NEW, grounded_prompts, ngram_step
from support.tiny_vocab import LANES, check_follows_the_target, tiny_target

import fdecode
from fdecode.runtime.gate import DraftGate


def test_first_row_steps_commit_the_target_only_tokens():
    """Steps alternating verified / first row: one token per lane in a first-row step, whole runs in
    verified ones (lane 0 copies out of its prompt), transformers' tokens in every lane."""
    prompts = grounded_prompts()
    step = ngram_step()
    state = step.prefill(prompts, max_new_tokens=NEW)
    outs = [state.step_output.tokens[b, : state.step_output.num_tokens[b]].tolist() for b in range(3)]
    longest = {True: 0, False: 0}
    for i in range(40):
        if bool(state.step_output.finished[:3].all()):
            break
        speculate = i % 2 == 1
        state, out = step(state, speculate=speculate)
        counts = out.num_tokens[:3].tolist()
        longest[speculate] = max(longest[speculate], *counts)
        for b in range(3):
            outs[b] += out.tokens[b, : counts[b]].tolist()
    assert outs == [hf_greedy(p, NEW) for p in prompts]
    assert longest == {True: step.config.W, False: 1}


@pytest.mark.parametrize("draft_kind", ["mtp", "model"])
def test_first_row_steps_with_a_model_draft_stay_lossless(draft_kind):
    """`speculate=False` is any step's, not only an n-gram one's: a first-row step commits one token and
    the next window is drafted from it (as after a step that rejected every draft). A draft LM sits first-row
    steps out, so the first verified step after them catches it up and the second verifies its draft."""
    from support.runs import PROMPTS, build

    step, layers = build("self", draft_kind, 3)
    state = step.prefill(list(PROMPTS), max_new_tokens=NEW)
    outs = [state.step_output.tokens[b, : state.step_output.num_tokens[b]].tolist() for b in range(3)]
    longest = 0
    for i in range(40):
        if bool(state.step_output.finished[:3].all()):
            break
        speculate = i % 4 >= 2  # two first-row steps, two verified ones
        state, out = step(state, speculate=speculate)
        counts = out.num_tokens[:3].tolist()
        if not speculate or (i % 4 == 2 and step.idles_draft):  # the target alone, or the draft's catch-up
            assert max(counts) <= 1
        longest = max(longest, *counts)
        for b in range(3):
            outs[b] += out.tokens[b, : counts[b]].tolist()
    assert outs == [hf_greedy(p, NEW, None, layers) for p in PROMPTS]
    assert longest > 1  # the verified steps still accept drafts made after first-row steps


def test_a_lane_without_a_proposal_commits_the_same_token_either_way():
    """Random lanes over one state copied: where nothing was proposed, the verified step's rejection draws
    from p with the noise the first-row step draws with, so both commit the same token."""
    step = ngram_step(max_batch=3)
    state = step.prefill(grounded_prompts(), max_new_tokens=8, temperature=0.05, seed=[1, 2, 3])
    none = (state.tokens[:, 1] < 0).tolist()
    assert any(none) and not all(none)
    _, verified = step(state.clone())
    _, first = step(state, speculate=False)
    assert first.num_tokens.tolist() == [1, 1, 1]
    for lane in range(3):
        if none[lane]:
            assert verified.num_tokens[lane] == 1
            assert verified.tokens[lane, 0] == first.tokens[lane, 0]
    with pytest.raises(TypeError, match="speculate must be True or False"):
        step(state, speculate=1)


class Alternating:
    """A step whose every other call verifies the first row only, for the distribution test."""

    def __init__(self, step):
        self.step, self.calls = step, 0
        self.config, self.target, self.draft, self.seeds = step.config, step.target, step.draft, step.seeds

    def __getattr__(self, name):
        return getattr(self.step, name)

    def __call__(self, state, depth=None, host=None):
        self.calls += 1
        return self.step(state, depth=depth if self.calls % 2 == 0 else 0, host=host)


@pytest.mark.slow
def test_random_lanes_with_first_row_steps_follow_the_filtered_target():
    params = dict(temperature=0.8, top_k=4, top_p=0.9, min_p=0.0)
    target = tiny_target()
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=2, max_batch=LANES, max_seq_len=12, block_size=4, backend="eager", draft_gate=False
    )
    step = Alternating(fdecode.compile(target, fdecode.NgramDraft(max_n=2, min_n=1), cfg))
    check_follows_the_target(step, target, params)
    assert step.calls > 0


def test_the_gate_pauses_doubling_and_resets():
    gate = DraftGate(3, threshold=0.5, weight=0.5, max_pause=4)
    assert [gate.speculate() for _ in range(3)] == [True] * 3  # trusted at first
    schedule = []
    for _ in range(30):
        speculate = gate.speculate()
        schedule.append(speculate)
        if speculate:
            gate.observe(0)  # nothing accepted, ever
    # The first observation replaces the prior K (mean 0 < 0.5): pauses of 1, 2, 4, 4, ... first-row steps, one
    # trial between.
    pauses = [len(run) for run in "".join("v" if s else "." for s in schedule).split("v") if run]
    assert pauses[:5] == [1, 2, 4, 4, 4], schedule
    assert (gate.verified, gate.first_row) == (3 + schedule.count(True), schedule.count(False))
    assert schedule[:2] == [True, False]  # the first verified step observed pauses the next
    gate.observe(3)  # a trial that pays ends the pausing
    gate.left = 0
    assert gate.rate >= 0.5 and gate.pause == 1 and gate.speculate()
    gate.observe(0)
    gate.reset()
    assert gate.rate == 3 and gate.speculate()
    assert "DraftGate(rate=3.00" in repr(gate)
    with pytest.raises(ValueError, match="weight"):
        DraftGate(3, weight=0)


def launches(gate: DraftGate, accepted: list[int], n: int) -> str:
    """The Engine's schedule of `n` launches ("v" verified, "." first row): each verified launch's output is
    read one launch later, after the next launch is decided; `accepted` are what the verified ones accept."""
    schedule, pending, results = [], None, iter(accepted)
    for _ in range(n):
        speculate = gate.speculate()
        if pending is not None:
            gate.observe(pending)
        pending = next(results) if speculate else None
        schedule.append("v" if speculate else ".")
    return "".join(schedule)


def test_a_trial_costs_one_verified_step_and_a_good_one_ends_the_pause():
    """Observed one launch late, as in the Engine: after a pause one trial is verified and first-row steps run
    until its output is read (not a second verified step); a verified step that accepts every draft ends
    the pause it is read in."""
    never = launches(DraftGate(3, threshold=0.5, weight=0.5, max_pause=4), [0] * 40, 40)
    # The first two launches are decided before any output is read (the second is read in the first pause and
    # starts the next: 1 + 2 first-row steps); then each trial stands alone, followed by one first-row step
    # that waits for its output, then the pause of 4.
    assert never.startswith("vv") and "vv" not in never[2:], never
    assert [len(p) for p in never[2:].split("v")][:5] == [3, 5, 5, 5, 5], never
    # A verified step that accepts every draft, read during a pause of 2, ends it.
    gate = DraftGate(3, threshold=0.5, weight=0.5)
    gate.observe(0)
    assert not gate.speculate()
    gate.observe(0)
    assert gate.left == 2
    gate.observe(3)
    assert gate.speculate(), gate


def test_the_gate_averages_its_first_steps_then_weights_the_recent_ones():
    gate = DraftGate(3, weight=0.25)
    for accepted, mean in ((2, 2.0), (0, 1.0), (1, 1.0), (3, 1.5), (3, 1.875)):  # plain mean of 4, then 1/4
        gate.observe(accepted)
        assert gate.rate == pytest.approx(mean)
    gate.reset()
    gate.observe(0)
    assert gate.rate == 0 and not gate.speculate()  # one wasted verify, then a pause


def test_the_engine_pauses_drafts_that_do_not_pay_and_stays_lossless():
    """One lane of fresh random tokens (its drafts are seldom right at first) with the gate: first-row steps,
    transformers' tokens. A lane copying out of its prompt keeps its drafts verified (one pause at most, after
    its first verified step, which starts the answer and accepted nothing: the gate believes what it saw
    first). draft_gate=False
    verifies every step."""
    gen = torch.Generator().manual_seed(5)
    fresh = tuple(torch.randint(0, 100, (6,), generator=gen).tolist())
    copying = grounded_prompts()[0]
    step = ngram_step(max_batch=1, backend="dynamo")  # one step, its two graphs captured once, two engines
    for prompts, paused in (([fresh], True), ([copying], False)):
        engine = fdecode.Engine(step)
        rid = engine.add_request(list(prompts[0]), max_new_tokens=48)
        assert engine.run()[rid] == hf_greedy(prompts[0], 48)
        gate = engine.policy
        assert gate.verified + gate.first_row == engine.steps
        if paused:  # (the random model falls into loops later, which the drafts then copy)
            assert gate.first_row >= 5, gate
        else:
            assert gate.first_row <= 1 and gate.rate > 1, gate
    off = fdecode.Engine(ngram_step(max_batch=1, backend="dynamo", draft_gate=False))
    assert not isinstance(off.policy, DraftGate) and not off.step_fn.gated
    assert "draft_gate" in str(
        pytest.raises(
            ValueError, fdecode.DecodeConfig, num_draft_tokens=1, max_batch=1, max_seq_len=8, draft_gate=1
        ).value
    )


def test_the_first_row_graph_is_one_graph_without_host_syncs():
    step = ngram_step()
    state = step.prefill(grounded_prompts(), max_new_tokens=NEW)
    for plan in (None, step.plans[1]):
        report = fdecode.inspect(step, state, plan=plan, speculate=False)
        assert report.graph_count == 1 and report.graph_break_count == 0, report
        assert not report.host_syncs, report.host_syncs
        assert report.plan.endswith("(first row only)")
