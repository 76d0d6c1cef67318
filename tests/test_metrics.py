"""Acceptance metrics (`fdecode.runtime.metrics`): each finished `Event` carries its request's counts and
`Engine.metrics` their sums, counted from the rows the Engine reads anyway.

The oracle is what the events show: a draft LM proposes K drafts every step, so after a request's first
event (priming's token) each event is one verified step of L tokens, L - 1 of them accepted drafts. The
n-gram test works the counts out from the window each launch is given instead."""

from __future__ import annotations

import functools

from support.device_reads import DeviceReads
from support.llama_models import fdecode_target, independent_draft
from support.ngram_steps import grounded_prompts
from torch.utils._pytree import tree_leaves

import fdecode
from fdecode.runtime.metrics import RequestMetrics

K = 3


@functools.cache
def step_with(draft_kind: str, max_batch: int = 4) -> fdecode.Step:
    """The 2-layer target with a draft LM ("self", "partial", "random") or n-gram drafts ("ngram")."""
    target = fdecode_target(2)
    draft = draft_kind if draft_kind == "ngram" else independent_draft(draft_kind, target)
    cfg = fdecode.DecodeConfig(num_draft_tokens=K, max_batch=max_batch, max_seq_len=64, block_size=4, backend="eager")
    return fdecode.compile(target, draft, cfg)


def by_request(events: list[fdecode.Event]) -> dict[int, list[fdecode.Event]]:
    requests: dict[int, list[fdecode.Event]] = {}
    for event in events:
        requests.setdefault(event.request_id, []).append(event)
    return requests


def step_lengths(events: list[fdecode.Event]) -> list[int]:
    """L of each step read for one request: its events after priming's, less a cancelled one's last (no row)."""
    return [len(e.new_tokens) for e in events[1:] if e.reason != "cancelled"]


def counted(events: list[fdecode.Event]) -> RequestMetrics:
    """A draft LM request's counts as its events show them: K drafts and L - 1 accepted per verified step."""
    lengths = step_lengths(events)
    return RequestMetrics(K * len(lengths), sum(n - 1 for n in lengths), len(lengths), 0)


def summed(metrics: list[RequestMetrics]) -> RequestMetrics:
    return RequestMetrics(
        *(
            sum(column)
            for column in zip(
                *((m.drafts_proposed, m.drafts_accepted, m.verified_steps, m.first_row_steps) for m in metrics)
            )
        )
    )


def test_a_self_draft_accepts_every_draft():
    """The target's own weights as the draft: six requests over four lanes, 13 tokens each = priming's
    + 3 verified steps of 4 (3 drafts and the bonus); counted with no device read, one wait per step."""
    engine = fdecode.Engine(step_with("self"))
    models = (engine.step_fn.target, engine.step_fn.draft)
    mode = DeviceReads().mark(*tree_leaves(engine.state), *(t for m in models for t in (*m.parameters(), *m.buffers())))
    ids = [engine.add_request([1 + i, 2, 3], max_new_tokens=13, eos_token_id=[]) for i in range(6)]
    with mode:
        events = list(engine.stream())
        metrics = engine.metrics
    finals = {e.request_id: e.metrics for e in events if e.finished}
    assert finals == {rid: RequestMetrics(9, 9, 3, 0) for rid in ids}
    assert all(e.metrics is None for e in events if not e.finished)
    assert metrics.totals == RequestMetrics(54, 54, 18, 0)
    assert metrics.acceptance_by_position == [1.0, 1.0, 1.0]
    assert metrics.mean_accepted_length == 4.0 and metrics.totals.acceptance_rate == 1.0
    # Two waves of 3 verified steps, none past the end (`Engine._ending`); one read per step, plus each wave's
    # priming read: the second wave is primed after the first's last output was read, with no step pending.
    assert engine.steps == 6 and engine.host_waits == engine.steps + 2
    assert "drafts=54/54 accepted (1.00), mean_accepted_length=4.00, by_position=[1.00, 1.00, 1.00]" in repr(metrics)


def test_a_random_draft_accepts_few():
    """Unrelated random weights: almost every verified step commits the target's correction alone."""
    engine = fdecode.Engine(step_with("random"))
    engine.add_request([5, 6, 7], max_new_tokens=20, eos_token_id=[])
    events = list(engine.stream())
    metrics = events[-1].metrics
    assert metrics == counted(events) == engine.metrics.totals
    assert metrics.verified_steps >= 10 and metrics.first_row_steps == 0
    assert metrics.acceptance_rate < 0.2 and metrics.mean_accepted_length < 1.5
    assert metrics.mean_accepted_length == 1 + metrics.drafts_accepted / metrics.verified_steps


def test_requests_admitted_mid_flight_count_their_own_steps():
    """Seven requests over four lanes, three added while others run and one cancelled while it runs: each
    finished event has its own events' counts (the cancelled one's so far), the Engine their sums, and
    per draft position i the share of verified steps that accepted more than i drafts."""
    engine = fdecode.Engine(step_with("partial"))
    budgets = [5, 30, 9, 12, 3, 20, 8]
    add = lambda i: engine.add_request([1 + i, 2 + i, 3], max_new_tokens=budgets[i], eos_token_id=[])
    ids = [add(i) for i in range(4)]
    events = engine.step() + engine.step() + engine.step()
    ids += [add(i) for i in range(4, 7)]
    events += engine.step() + engine.step()
    engine.cancel(ids[1])
    events += list(engine.stream())
    requests = by_request(events)
    assert sorted(requests) == sorted(ids)
    for rid, budget in zip(ids, budgets):
        *running, final = requests[rid]
        assert final.finished and not any(e.finished or e.metrics for e in running)
        assert final.metrics == counted(requests[rid]), rid
        if rid != ids[1]:  # ran to its budget: priming's token, then L = accepted + 1 per step
            m = final.metrics
            assert budget == sum(len(e.new_tokens) for e in requests[rid]) == 1 + m.drafts_accepted + m.verified_steps
    cancelled = requests[ids[1]][-1]
    assert cancelled.reason == "cancelled" and cancelled.metrics.verified_steps > 0
    totals = summed([requests[rid][-1].metrics for rid in ids])
    assert engine.metrics.totals == totals and 0 < totals.drafts_accepted < totals.drafts_proposed
    lengths = [n for rid in ids for n in step_lengths(requests[rid])]
    assert engine.metrics.acceptance_by_position == [sum(n - 1 > i for n in lengths) / len(lengths) for i in range(K)]


class Recording:
    """A one-lane step that works out what each launch verifies from the window it is handed: the drafts
    proposed (not -1) in its first `depth` rows after t, none in a first-row step; it keeps (D, L) per launch."""

    def __init__(self, step: fdecode.Step) -> None:
        self.step, self.rows = step, []

    def __getattr__(self, name: str):
        return getattr(self.step, name)

    def __call__(self, state, *, speculate: bool = True, depth: int | None = None, host=None):
        rows = (K if depth is None else depth) if speculate else 0
        drafts = int((state.tokens[0, 1 : 1 + rows] >= 0).sum()) if bool(state.active[0]) else 0
        state, out = self.step(state, speculate=speculate, depth=depth, host=host)
        self.rows.append((drafts, int(out.num_tokens[0])))
        return state, out


def check_against_launches(step: Recording, engine: fdecode.Engine, events: list[fdecode.Event], budget: int) -> None:
    """The Engine's counts are those of the launches' (D, L), and the requests' add up to them; each request
    (run to its budget) committed 1 + accepted + verified + first-row tokens."""
    rows = [(d, n) for d, n in step.rows if n]  # a launch after a request's end commits nothing
    want = RequestMetrics(
        sum(d for d, _ in rows),
        sum(n - 1 for d, n in rows if d),
        sum(1 for d, _ in rows if d),
        sum(1 for d, _ in rows if not d),
    )
    requests = by_request(events)
    assert engine.metrics.totals == want == summed([events[-1].metrics for events in requests.values()])
    carried = [sum(d > i for d, _ in rows) for i in range(K)]
    accepted = [sum(d > 0 and n - 1 > i for d, n in rows) for i in range(K)]
    assert engine.metrics.acceptance_by_position == [a / c if c else None for a, c in zip(accepted, carried)]
    for events in requests.values():
        m = events[-1].metrics
        assert sum(len(e.new_tokens) for e in events) == budget
        assert budget == 1 + m.drafts_accepted + m.verified_steps + m.first_row_steps


def test_ngram_drafts_under_the_gate_count_first_row_steps():
    """n-gram drafts, one lane, a prompt full of matches then one with none at first: the gate pauses
    verification (first-row steps: one token, no draft), and a verified window without a match is one too."""
    step = Recording(step_with("ngram", max_batch=1))
    engine = fdecode.Engine(step)
    for prompt in grounded_prompts()[:2]:
        engine.add_request(list(prompt), max_new_tokens=24, eos_token_id=[])
    events = list(engine.stream())
    check_against_launches(step, engine, events, 24)
    totals = engine.metrics.totals
    assert totals.first_row_steps > engine.policy.first_row > 0 and totals.verified_steps > 0


def test_adaptive_depths_count_the_drafts_each_launch_verified():
    """A draft LM under `DecodeConfig(adaptive_depth=True)`: a launch of depth d verifies d drafts, so later
    draft positions are carried by fewer steps than the first."""
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=K, max_batch=1, max_seq_len=64, block_size=4, backend="eager", adaptive_depth=True
    )
    compiled = fdecode.compile(target, independent_draft("partial", target), cfg)
    compiled.warmup(depths=compiled.depths, progress=False)  # every depth's graph made: the Engine may launch any
    step = Recording(compiled)
    engine = fdecode.Engine(step)
    engine.policy.costs = [1.0 + 0.3 * max(d, 1) for d in range(K + 1)]  # a draft 0.3 of its target's bytes
    engine.policy.learn_costs = False
    for prompt in ([5, 17, 33], [7, 3]):
        engine.add_request(prompt, max_new_tokens=30, eos_token_id=[])
    events = list(engine.stream())
    check_against_launches(step, engine, events, 30)
    assert len({d for d, _ in step.rows if d}) >= 2, step.rows
