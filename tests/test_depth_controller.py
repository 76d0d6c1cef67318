"""`DecodeConfig(adaptive_depth=True)`: an Engine chooses each launch's depth (`fdecode.runtime.depth`).

The controller alone, on packed outputs written here: deep where drafts are accepted, shallow where they
are not, per lane, starting afresh at each admission. Then the Engine with it: greedy == transformers,
random lanes follow the filtered target, and the depths it launched follow how good the draft is.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.llama_models import fdecode_target, hf_greedy, independent_draft
from support.stats import ALPHA, chi2_pvalue
from support.tiny_vocab import PROMPT, V, exact_distribution, tiny_draft, tiny_target

import fdecode
from fdecode.drafts import NGRAM, drafter_for
from fdecode.models.cost import forward_bytes
from fdecode.runtime.depth import DepthController, depth_costs, expected_tokens, smoothed, step_costs
from fdecode.runtime.gate import DraftGate

K = 4
COSTS = [1.0 + 0.3 * max(d, 1) for d in range(K + 1)]  # a target, and a draft of 0.3 its bytes per proposal


def packed(counts: list[int], status: list[int] | None = None) -> torch.Tensor:
    """A StepOutput.packed of len(counts) lanes: tokens (unread here), then count and status."""
    out = torch.zeros(len(counts), K + 3, dtype=torch.int64)
    out[:, -2] = torch.tensor(counts)
    out[:, -1] = torch.tensor(status or [0] * len(counts))
    return out


def run(controller: DepthController, accepts, steps: int) -> list[int]:
    """Launch `steps` steps; lane b accepts min(accepts(b, verified), verified) drafts of each. Returns depths."""
    depths = []
    for _ in range(steps):
        depth, verified = controller.launch()
        depths.append(depth)
        counts = [min(accepts(b, verified[b][0]), verified[b][0]) + 1 for b in sorted(verified)]
        controller.observe_output(packed(counts), verified)
    return depths


def test_the_depth_follows_what_the_lanes_accept():
    deep = DepthController(K, COSTS)
    deep.admit(0)
    assert run(deep, lambda b, n: n, 12)[-4:] == [K] * 4  # every draft accepted: verify all K
    shallow = DepthController(K, COSTS)
    shallow.admit(0)
    assert run(shallow, lambda b, n: 0, 12)[-4:] == [1] * 4  # none accepted: one draft (it costs nothing more)
    # The expected-tokens model: 1 + a + ... + a^d; a depth is worth its cost only where a is high enough.
    assert expected_tokens(0.5, 2) == 1.75 and expected_tokens(0.0, 3) == 1.0


def test_lanes_that_disagree_are_weighed_by_what_each_would_commit():
    controller = DepthController(K, COSTS, hysteresis=0.0)  # the scores alone
    for lane in range(4):
        controller.admit(lane)
    depths = run(controller, lambda b, n: n if b == 0 else 0, 16)  # one lane copies, three never accept
    alone = DepthController(K, COSTS)
    alone.admit(0)
    assert run(alone, lambda b, n: n, 16)[-1] == K
    # Depth 1: 2 + 3 tokens for 1.3; depth K: 5 + 3 tokens for 2.2. The three poor lanes pull it down.
    assert depths[-1] == 1
    assert controller.rate(0) > 0.8 and controller.rate(1) < 0.2


def test_near_ties_keep_the_last_depth():
    """A depth must score `hysteresis` better than the last one to replace it (a switch's first step finds
    fewer drafts carried); without hysteresis the same rates flip the depth."""
    costs = [1.0, 1.0, 1.3, 1.436, 1.7]
    scores = {}
    for hysteresis in (0.0, 0.05):
        controller = DepthController(K, costs, hysteresis=hysteresis)
        controller.admit(0)
        controller.lanes[0] = [0.64, 0.36]  # rate 0.64: depth 1 scores 1.64, depth 3 1.61 (1.8 % below)
        controller.depth = 3
        scores[hysteresis] = controller.choose()
    assert scores == {0.0: 1, 0.05: 3}
    with pytest.raises(ValueError, match="hysteresis"):
        DepthController(K, costs, hysteresis=-0.1)


def test_an_admission_starts_its_lane_afresh_and_late_outputs_are_not_its():
    controller = DepthController(K, COSTS)
    controller.admit(0)
    run(controller, lambda b, n: 0, 40)
    assert controller.rate(0) < 0.1
    depth, verified = controller.launch()
    controller.admit(0)  # the lane's request finished; another was primed into it before the output was read
    controller.observe_output(packed([1]), verified)  # the old request's output: not the new one's
    assert controller.rate(0) == controller.prior and controller.carried[0] == K
    controller.observe_output(packed([1], [1]), controller.launch()[1])  # the new request finishes: it leaves
    assert controller.lanes == {} and controller.choose() == K
    with pytest.raises(ValueError, match="K \\+ 1 = 5 positive costs"):
        DepthController(K, COSTS[:-1])


def test_each_verified_draft_weighs_the_same_whatever_the_depth():
    """Four steps of depth 1 and one of depth 4, each accepting every draft, leave the same rate."""
    shallow, deep = DepthController(K, COSTS, prior=0.5), DepthController(K, COSTS, prior=0.5)
    for controller in (shallow, deep):
        controller.admit(0)
    for _ in range(4):
        shallow.observe_output(packed([2]), {0: (1, 1)})
    deep.observe_output(packed([5]), {0: (4, 1)})
    assert shallow.lanes[0] == pytest.approx(deep.lanes[0]) and shallow.rate(0) > 0.5
    rejected = DepthController(K, COSTS, prior=0.5)
    rejected.admit(0)
    rejected.observe_output(packed([1]), {0: (4, 1)})  # the first of four drafts rejected: one trial, failed
    keep, strength = 1 - rejected.weight, rejected.strength
    assert rejected.lanes[0] == pytest.approx([keep * strength / 2, keep * strength / 2 + 1])


def test_warm_up_timings_of_the_drafting_depths_are_put_on_a_line():
    """Depth 3 timed dearer than depth 4 (a noisy warm-up): depths 1 .. 4 go on their least-squares line, depth 0
    stays; fewer than three such depths stay as timed."""
    timed = {0: 0.44, 1: 0.50, 2: 0.66, 3: 0.86, 4: 0.85}
    line = smoothed(timed)
    assert line[0] == 0.44 and line == pytest.approx({0: 0.44, 1: 0.53, 2: 0.655, 3: 0.78, 4: 0.905})
    assert smoothed({0: 0.4, 1: 0.6, 2: 0.5}) == {0: 0.4, 1: 0.6, 2: 0.5}


def test_costs_follow_the_steps_launched():
    controller = DepthController(K, [1.0, 1.0, 2.0, 3.0, 4.0])
    for seconds in (3.0, 3.0, 3.0):  # depth 2 runs 1.5x its starting cost
        controller.observe_cost(2, seconds)
    assert controller.costs[2] == pytest.approx(3.0)
    assert controller.costs[4] == pytest.approx(6.0) and controller.costs[1] == pytest.approx(1.5)  # not launched yet
    controller.observe_cost(2, 7.0)
    assert controller.costs[2] == pytest.approx(0.75 * 3.0 + 0.25 * 7.0)  # a running mean (`cost_weight`)
    # A depth's first step moves its estimate (starting cost x the ratio measured, now 2) by `cost_weight`; one
    # slow step used to set it alone (a depth-0 step of 0.30 s against 0.21 s timed: drafting looked better).
    assert controller.costs[0] == pytest.approx(2.0)
    controller.observe_cost(0, 3.0)
    assert controller.costs[0] == pytest.approx(0.75 * 2.0 + 0.25 * 3.0)
    frozen = DepthController(K, COSTS, learn_costs=False)
    frozen.observe_cost(2, 9.0)
    assert frozen.costs == COSTS
    controller.costs = COSTS  # costs given anew: the measurements go
    assert controller.costs == COSTS
    with pytest.raises(ValueError, match="horizon"):
        DepthController(K, COSTS, horizon=0)


def test_a_switch_to_a_deeper_step_counts_its_first_step_short():
    """From depth 1 (one draft carried), a step of depth 4 verifies one draft: over `horizon` steps that matters
    less; at horizon 1 it is all that counts, and the controller stays."""
    chosen = {}
    for horizon in (1, 16):
        controller = DepthController(K, [1.0, 1.0, 1.2, 1.4, 1.6], horizon=horizon)
        controller.admit(0)
        controller.launch()
        controller.depth, controller.carried[0] = 1, 1
        controller.lanes[0] = [0.95, 0.05]
        chosen[horizon] = controller.choose()
    assert chosen == {1: 1, 16: K}


def test_the_engine_times_each_launch_but_not_a_compile():
    engine = fdecode.Engine(adaptive("partial", warm=False))
    launched, timed = [], []
    controller = engine.policy
    launch, observe = controller.launch, controller.observe_cost
    controller.launch = lambda *ready: (lambda r: (launched.append(r[0]), r)[1])(launch(*ready))
    # (launch index, depth, seconds): observed in the `Engine.step` that launched it
    controller.observe_cost = lambda depth, seconds: (
        timed.append((len(launched) - 1, depth, seconds)),
        observe(depth, seconds),
    )
    for p in PROMPTS:
        engine.add_request(list(p), max_new_tokens=30)
    engine.run()
    firsts = {launched.index(d) for d in set(launched)}  # each depth's first launch ran its graph for the first time
    assert timed and all(seconds > 0 and launched[i] == d for i, d, seconds in timed)
    assert not firsts & {i for i, _, _ in timed}
    assert set(controller.measured) == {d for _, d, _ in timed}


def test_depth_zero_runs_the_target_alone_and_tries_the_drafts_again():
    """Drafts never accepted, a step of depth 1 dearer than the target alone: depth 0, and after `probe`
    launches of it one trial of the draft carried, which fails again, so the next comes twice as late, up to
    `max_probe`; a fresh admission tries again after `probe`."""
    costs = [1.0, 1.5, 1.8, 2.1, 2.4]
    controller = DepthController(K, costs, depths=range(K + 1), probe=4, max_probe=4)
    controller.admit(0)
    schedule = "".join(map(str, run(controller, lambda b, n: 0, 40)))
    paused = schedule[schedule.index("0") :]  # once depth 0 is reached
    assert "00001" * 4 in paused and "00000" not in paused and set(paused) == {"0", "1"}, schedule
    controller = DepthController(K, costs, depths=range(K + 1), probe=4, max_probe=16)
    controller.admit(0)
    schedule = "".join(map(str, run(controller, lambda b, n: 0, 60)))
    paused = schedule[schedule.index("0") :]
    assert paused.startswith("0" * 4 + "1" + "0" * 8 + "1" + "0" * 16 + "1" + "0" * 16 + "1"), schedule
    controller.admit(1)  # a new prompt: its lane starts at the prior, then trials every 4 again
    later = "".join(map(str, run(controller, lambda b, n: 0, 30)))
    assert "00001" in later[later.index("0") :], later
    for bad in (dict(probe=0), dict(probe=8, max_probe=4), dict(catch_up=-1)):
        with pytest.raises(ValueError, match="probe|catch_up"):
            DepthController(K, COSTS, **bad)


def test_trials_wait_for_the_catch_up_the_step_runs_anyway():
    """A draft LM sitting out depth 0 (`catch_up` = 3): the step catches it up after every 3 depth-0 launches, and
    a trial due (every 5 depth-0 launches) waits for that catch-up instead of running one of its own: launches
    come in runs of three idle steps, each run ended by a catch-up (forced, "0c"; or the trial's, "1c", then the
    launch verifying its draft) or by a trial verifying the forced catch-up's draft ("0c 1")."""
    costs = [1.0, 1.5, 1.8, 2.1, 2.4]
    controller = DepthController(K, costs, depths=range(K + 1), probe=5, max_probe=5, catch_up=3)
    controller.admit(0)
    schedule = []
    for _ in range(60):
        lag = controller.lag
        depth, verified = controller.launch()
        schedule.append(f"{depth}{'c' if controller.caught_up else ''}")
        assert not controller.caught_up or depth == 0 and lag >= 3 or depth > 0 and lag > 0, schedule
        if controller.caught_up and depth > 0:
            assert lag == 3, schedule  # a trial's own catch-up only where the step would force one
        counts = [1 for _ in verified]  # nothing accepted
        controller.observe_output(packed(counts), verified)
    paused = " ".join(schedule[schedule.index("0") :]) + " "
    catch_ups = paused.count("c ")
    assert catch_ups >= 8 and paused.count("0 0 0 ") >= catch_ups - 1, paused
    assert paused.count("1 ") >= 5, paused  # the trials still run, one every few runs
    assert "0 1c" not in paused.replace("0 0 0 1c", ""), paused


def test_only_depths_whose_graphs_are_made_are_launched():
    controller = DepthController(K, COSTS)
    controller.admit(0)
    run(controller, lambda b, n: 0, 12)  # nothing accepted: depth 1 earns the most
    assert controller.choose() == 1 and controller.choose(ready={K}) == K and controller.choose(ready={2, K}) == 2
    assert controller.choose(ready=()) == K  # none made yet: the depth `warmup` compiles by default
    assert controller.launch(ready={3})[0] == 3
    # a tree step on a CPU starts at its chain (`Step.first_depth`); the first depth must be one it launches
    assert DepthController(K, COSTS, first=2).choose(ready=()) == 2
    with pytest.raises(ValueError, match="first must be one of its depths"):
        DepthController(K, COSTS, depths=(1, K), first=2)


def test_an_engine_waits_for_no_compile_and_runs_the_depths_warmup_made():
    """The adaptive Engine launches depth K only (the graph its first launch made) until `warmup(depths=...)`
    has made the others; then the poor draft's depth. Eager makes its graphs the same way (no schedule
    depends on the backend)."""
    step = adaptive("random", warm=False, num_draft_tokens=2, sampling=False)
    for warm in (None, (1, 2)):
        if warm is not None:
            step.warmup(depths=warm, progress=False)
        engine = fdecode.Engine(step)
        engine.policy.costs, engine.policy.learn_costs = COSTS[:3], False
        ids = [engine.add_request(list(p), max_new_tokens=12) for p in PROMPTS]
        got = engine.run()
        assert [got[i] for i in ids] == [hf_greedy(p, 12) for p in PROMPTS]
        launched = {d for d, n in engine.policy.launches.items() if n}
        assert launched == ({2} if warm is None else {1, 2}), engine.policy
    assert step.schedule.ready_depths(engine.state) == (1, 2) and step.depths == (0, 1, 2)


def test_costs_count_the_weights_each_depth_reads():
    target = fdecode_target(2)
    draft = independent_draft("partial", target)
    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=1, max_seq_len=32)
    costs = depth_costs(target, draft, cfg, drafter_for(draft))

    def gb(model, *, embedding: bool) -> float:  # all weights, less the (untied) embedding table unless asked
        return (
            sum(
                p.numel() * p.element_size()
                for n, p in model.named_parameters()
                if embedding or not n.startswith("embed_tokens")
            )
            / 1e9
        )

    assert target.lm_head.weight is not target.embed_tokens.weight  # untied: a forward gathers a few rows
    # depth d reads the draft d times (0: it sits the step out, `DecodeConfig.draft_catch_up`), else at least once
    assert costs == pytest.approx([gb(target, embedding=False) + d * gb(draft, embedding=False) for d in range(4)])
    always = depth_costs(target, draft, dataclasses.replace(cfg, draft_catch_up=0), drafter_for(draft))
    assert always == pytest.approx(
        [gb(target, embedding=False) + max(d, 1) * gb(draft, embedding=False) for d in range(4)]
    )
    assert depth_costs(target, fdecode.NgramDraft(), cfg, NGRAM) == pytest.approx([gb(target, embedding=False)] * 4)
    tied = fdecode_target(2)
    tied.lm_head.weight = tied.embed_tokens.weight  # a tied head reads the whole table
    assert forward_bytes(tied) / 1e9 == pytest.approx(gb(tied, embedding=True))


def test_warmup_times_each_depth_and_the_engine_weighs_depths_by_those_times():
    step = adaptive("partial", warm=False, num_draft_tokens=2)
    byte_model = depth_costs(step.target, step.draft, step.config, step.drafter)
    assert step_costs(step, [1, 2]) == byte_model  # nothing timed yet: the bytes each depth reads
    step.warmup(depths=[1])
    timed = step.depth_seconds
    assert set(timed) == {1}  # depth 2 untimed: its bytes at depth 1's seconds per GB
    assert step_costs(step, [1, 2]) == pytest.approx([b * timed[1] / byte_model[1] for b in byte_model])
    step.warmup(depths=[0, 1, 2])
    assert set(timed) == {0, 1, 2} and min(timed.values()) > 0
    assert step_costs(step, [0, 1, 2]) == [timed[0], timed[1], timed[2]]
    assert fdecode.Engine(step).policy.costs == step_costs(step, [0, 1, 2])


def test_tensor_parallel_ranks_cost_depths_by_their_weights_alone(monkeypatch):
    """Every rank must launch the same depths: no timing (warm-up or launch) may enter the choice."""
    step = adaptive("partial")  # every depth warmed up, and so timed
    assert step.depth_seconds
    monkeypatch.setattr(step.target, "tp", "a process group", raising=False)
    controller = fdecode.Engine(step).policy
    assert (
        controller.costs == depth_costs(step.target, step.draft, step.config, step.drafter)
        and not controller.learn_costs
    )


def adaptive(kind: str, *, warm: bool = True, **changes):
    """A step whose Engine chooses depths (the default), every depth's graph made (`warm`) so it may launch any."""
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(
        **{"num_draft_tokens": K, "max_batch": 4, "max_seq_len": 64, "block_size": 4, "backend": "eager", **changes}
    )
    step = fdecode.compile(target, independent_draft(kind, target), cfg)
    if warm:
        step.warmup(depths=step.depths, progress=False)
    return step


PROMPTS = [(5, 17, 33, 2, 9, 41, 60), (7, 3), (11, 12, 13, 14, 15, 80, 81, 82, 83, 84, 85, 86, 87)]


@pytest.mark.parametrize(("kind", "depths"), [("self", {K}), ("partial", None), ("random", {1})])
def test_the_engine_launches_the_depth_the_draft_earns_and_stays_lossless(kind, depths):
    engine = fdecode.Engine(adaptive(kind))
    assert engine.policy.depths == tuple(range(K + 1))  # the target alone (0) up to every draft
    # The tiny draft reads as many bytes as the tiny target (embedding and head dominate), which never pays
    # (`depth_costs`); cost it as a real draft, 0.3 of its target's bytes per proposal.
    engine.policy.costs, engine.policy.learn_costs = COSTS, False
    ids = [engine.add_request(list(p), max_new_tokens=30) for p in PROMPTS]
    got = engine.run()
    assert [got[i] for i in ids] == [hf_greedy(p, 30) for p in PROMPTS]
    launched = {d for d, n in engine.policy.launches.items() if n}
    if depths is None:  # a draft that agrees at times: more than one depth
        assert len(launched) >= 2, engine.policy
    else:  # after the first steps (the prior), the depth its acceptance earns
        late = run_tail(engine)
        assert late <= depths, engine.policy


def test_a_draft_not_worth_running_sits_out_and_catches_up_with_requests_admitted_meanwhile():
    """A draft that never agrees, costed as a real one: the Engine runs the target alone (depth 0, the draft LM
    sitting out: `fdecode.ops.catch_up`), and every few launches a catch-up step then one that verifies its
    draft. Requests admitted while the draft sits out (two lanes, six requests of different lengths) decode
    exactly what transformers does; the controller counts the draft's lag as the step does."""
    engine = fdecode.Engine(adaptive("random", max_batch=2, draft_catch_up=3))
    engine.policy.costs, engine.policy.learn_costs = [1.0 + 0.3 * d for d in range(K + 1)], False
    prompts = PROMPTS * 2
    budgets = [30, 12, 21, 9, 26, 15]
    ids = [engine.add_request(list(p), max_new_tokens=n) for p, n in zip(prompts, budgets)]
    got, schedule = {}, []
    while engine.has_work():
        launches = engine.steps
        for event in engine.step():
            got.setdefault(event.request_id, []).extend(event.new_tokens)
        assert engine.step_fn.schedule.record(engine.state).draft_lag == engine.policy.lag <= 3
        if engine.steps > launches:  # c: a catch-up step (it verified nothing and proposed one draft)
            schedule.append(f"{engine.policy.depth}{'c' if engine.policy.caught_up else ''}")
    assert [got[i] for i in ids] == [hf_greedy(p, n) for p, n in zip(prompts, budgets)]
    # Runs of three depth-0 steps that the fourth catches up (its own draft unverified), a trial every 8 depth-0
    # launches (verifying a catch-up's draft), and deeper steps after each admission (a fresh lane's prior).
    joined = " ".join(schedule) + " "
    assert joined.count("0 0 0 0c ") >= 3 and "0c 1 " in joined, schedule
    assert engine.policy.launches[0] > engine.policy.launches[1], schedule


def run_tail(engine) -> set[int]:
    """Depths launched more than 3 times by a second round of requests, the controller having learnt from the
    first (a fresh batch starts from the prior: a few launches at the depth a rate of 0.8 earns, kept a step
    longer by the hysteresis, before the rate has risen)."""
    before = dict(engine.policy.launches)
    for p in PROMPTS:
        engine.add_request(list(p), max_new_tokens=30)
    engine.run()
    return {d for d, n in engine.policy.launches.items() if n > before[d] + 3}


@pytest.mark.parametrize("draft_kind", ["self", "adversarial"])
def test_random_lanes_follow_the_filtered_target_with_adaptive_depths(draft_kind):
    target = tiny_target()
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=3, max_batch=64, max_seq_len=12, block_size=4, backend="eager", adaptive_depth=True
    )
    step = fdecode.compile(target, tiny_draft(draft_kind, target), cfg)
    step.warmup(depths=step.depths, progress=False)  # every depth's graph made: the Engine may launch any
    params = dict(temperature=0.9, top_k=0, top_p=0.95, min_p=0.0)
    samples = torch.cat(
        [
            torch.tensor(
                fdecode.generate(
                    step,
                    [PROMPT] * 64,
                    max_new_tokens=3,
                    seed=[1000 * b + i for i in range(64)],
                    progress=False,
                    **params,
                )
            )
            for b in range(40)
        ]
    )
    cells = samples[:, 0] * V * V + samples[:, 1] * V + samples[:, 2]
    counts, expected = torch.bincount(cells, minlength=V**3), exact_distribution(target, params)
    assert chi2_pvalue(counts, expected) > ALPHA
    assert expected[counts > 0].min() > 0


def test_adaptive_depth_is_a_bool_and_leaves_n_gram_drafts_to_the_gate():
    with pytest.raises(ValueError, match="adaptive_depth must be True or False"):
        fdecode.DecodeConfig(num_draft_tokens=2, max_batch=1, max_seq_len=16, adaptive_depth="yes")
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=1, max_seq_len=32, backend="eager", adaptive_depth=True)
    engine = fdecode.Engine(fdecode.compile(target, "ngram", cfg))
    assert isinstance(engine.policy, DraftGate)


def test_a_tree_step_chooses_the_tree_or_a_chain_by_cost_and_what_trees_commit():
    """In a tree step (N = 8 nodes, S = 4 levels) depths 1 .. 4 are chains and 8 the tree. At the cost of the
    chain of depth 4 the tree wins on its prior gain (lanes accepting 90 %); where it costs 1.5x that chain (a
    CPU charging for rows) the chain is kept; and where trees commit 5 tokens per verify while the chain's
    drafts are accepted half the time (the tree's gain, learned), the tree wins even at 1.5x."""
    n, levels = 8, 4
    chain_costs = [1.0 + 0.3 * max(d, 1) for d in range(n)]

    def controller(tree_cost: float, prior: float) -> DepthController:
        costs = chain_costs + [tree_cost * chain_costs[levels]]
        made = DepthController(
            n, costs, depths=(1, 2, 3, 4, n), tree_levels=levels, learn_costs=False, prior=prior, hysteresis=0.0
        )
        made.admit(0)
        return made

    assert controller(1.0, prior=0.9).launch()[0] == n
    assert controller(1.5, prior=0.9).launch()[0] == levels
    learns = controller(1.5, prior=0.5)
    assert learns.launch()[0] == 1
    for _ in range(40):
        learns.observe_output(packed([5]), {0: (n, learns.admissions[0])})  # a verified tree: 4 levels + 1
    assert learns.gains[0][n] > 2 and learns.rate(0) == 0.5  # a tree teaches the gain, not the chain's rate
    assert learns.launch()[0] == n
    with pytest.raises(ValueError, match="tree_levels must be in 1 .. K - 1"):
        DepthController(n, chain_costs + [1.0], tree_levels=n)


def test_a_measured_tree_does_not_price_the_chains():
    """Without warm-up timings the tree starts at its chain's cost (the weights it reads). Its first steps take
    1.5x what the chain of depth S takes (a CPU charging for rows): its measured cost is its own, not a unit for
    the chains, the controller prices that chain once, and keeps it. Before, the tree's first step set the unit,
    every chain was priced 1.5x too, and the tree won every launch."""
    n, levels = 8, 4
    costs = [1.0 + 0.3 * max(d, 1) for d in range(n)] + [2.2]  # the tree at its chain's starting cost
    made = DepthController(n, costs, depths=(1, 2, 3, 4, n), tree_levels=levels, prior=0.9, hysteresis=0.0)
    made.admit(0)
    launched = []
    for _ in range(6):
        depth, ticket = made.launch()
        launched.append(depth)
        made.observe_cost(depth, 1.5 * 2.2 if depth == n else costs[depth])
        made.observe_output(packed([levels + 1 if depth == n else depth + 1]), ticket)  # every draft accepted
    assert launched[:2] == [n, levels] and launched[2:] == [levels] * 4, launched


def test_a_tree_step_chooses_the_smaller_tree_where_the_large_one_costs_too_much():
    """Depths 1 .. 4 chains, 6 and 8 trees (`tree_sizes`): the 6-node tree's prior gain is half the 8-node one's
    margin (1.05); at the chain's cost it wins where the 8-node tree costs 1.5x; trees of 6 that commit no more
    than the chain (gain learned down to 1) give the chain back, and the 8-node tree's gain stays its prior."""
    n, levels = 8, 4
    chain = [1.0 + 0.3 * max(d, 1) for d in range(levels + 1)]
    costs = chain + [99.0, chain[levels], 99.0, 1.5 * chain[levels]]  # depths 5 and 7 run no graph
    made = DepthController(
        n, costs, depths=(1, 2, 3, 4, 6, n), tree_levels=levels, learn_costs=False, prior=0.9, hysteresis=0.0
    )
    made.admit(0)
    assert made.gain(0, 6) == pytest.approx(1.05) and made.gain(0, n) == pytest.approx(1.1)
    assert made.launch()[0] == 6
    for _ in range(80):  # trees of 6 that commit 4 tokens, less than the chain of depth 4 is expected to (4.1)
        made.observe_output(packed([4]), {0: (6, made.admissions[0])})
    assert made.gain(0, 6) < 1.0 and made.gain(0, n) == pytest.approx(1.1)
    assert made.launch()[0] == levels
