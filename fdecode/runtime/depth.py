"""`DepthController`: how many drafts each launch of an `Engine` verifies (`DecodeConfig.adaptive_depth`)
(docs/design.md, "Prompt lookup: n-gram drafts": "An Engine chooses each launch's depth").

A step of depth d verifies d of the window's K drafts and proposes max(d, 1) for the next window
(`Drafter.proposals`). The controller keeps, per lane, a decayed Beta estimate of how often a verified
draft is accepted (read one step behind, as the Engine reads outputs; every verified draft weighs the
same, whatever the depth of its step), so a lane's rate a gives 1 + a + ... + a^d expected tokens at
depth d; each launch takes the depth with the most expected tokens per second, summed over the running
lanes. A depth's seconds start from `step_costs` (each depth's step time where `Step.warmup(depths=...)`
timed it, `smoothed`, else the bytes of weights it reads, `depth_costs`) and then follow what the Engine's
launches of that depth took (`observe_cost`): warm-up timings are a few steps on an idle state, and a
machine's speed drifts, so the steps themselves are the better measure.

Lossless whatever it chooses: every depth commits the target's tokens (greedy) or its distribution
(random lanes); a random lane's draws depend on the schedule and so on its batch, as with `DraftGate`.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Sequence

import torch

from fdecode.models.cost import forward_bytes


def expected_tokens(rate: float, drafts: int) -> float:
    """Tokens a lane commits from `drafts` verified drafts, each accepted with probability `rate`."""
    return sum(rate**i for i in range(drafts + 1))


def depth_costs(target, draft, cfg, drafter) -> list[float]:
    """costs[d] for d in 0 .. K: the weights a step of depth d reads (`forward_bytes`: the target once, the
    draft once per proposal, as `drafter` (`fdecode.drafts.Drafter`) counts both; an n-gram draft reads none;
    a tree step's trees (depths past S) once per level), in GB. Bytes do not see rows: a tree costs what the
    chain of depth S does until its steps are timed (an accelerator at small batch; a CPU charges for rows,
    which the Engine's measured costs then show)."""
    target_gb = forward_bytes(target) / 1e9
    draft_gb = drafter.forward_bytes(draft) / 1e9
    forwards = [drafter.proposals(draft, cfg, d) for d in range(cfg.K + 1)]
    if cfg.tree:  # a tree step's trees run the draft once a level: S forwards of k rows, read as one row's
        forwards[cfg.levels + 1 :] = [cfg.levels] * (cfg.K - cfg.levels)
    return [target_gb + n * draft_gb for n in forwards]


def smoothed(timed: dict[int, float]) -> dict[int, float]:
    """Step seconds per depth with those of depths >= 1 put on their least-squares line, where three or more
    were timed: each depth adds about one draft forward and one target row, and a few timed steps swing by
    10-20 % on a busy CPU (depth 3 timed dearer than depth 4). Depth 0 (no verified row) as timed."""
    deep = {d: seconds for d, seconds in timed.items() if d >= 1}
    if len(deep) < 3:
        return dict(timed)
    mean_d, mean_s = statistics.mean(deep), statistics.mean(deep.values())
    slope = sum((d - mean_d) * (s - mean_s) for d, s in deep.items()) / sum((d - mean_d) ** 2 for d in deep)
    line = {d: mean_s + slope * (d - mean_d) for d in deep}
    return {**timed, **line} if min(line.values()) > 0 else dict(timed)


def step_costs(step, depths: Sequence[int]) -> list[float]:
    """costs[d] for d in 0 .. K: seconds of a step of depth d where `step.warmup` timed it (`Step.depth_seconds`,
    `smoothed`), else the weights it reads (`depth_costs`) times the median seconds per GB of the depths timed
    (only the weights where none of `depths` was timed). A tree step's trees (depths past S) are off the
    chains' line: as timed."""
    cfg = step.config
    model = depth_costs(step.target, step.draft, cfg, step.drafter)
    timed = {d: seconds for d, seconds in step.depth_seconds.items() if d in depths}
    tree = {d: timed.pop(d) for d in list(timed) if d > cfg.levels} if cfg.tree else {}
    timed = {**smoothed(timed), **tree}
    if not timed:
        return model
    per_gb = statistics.median(timed[d] / model[d] for d in timed)
    return [timed.get(d, model[d] * per_gb) for d in range(cfg.K + 1)]


class DepthController:
    """Chooses the depth of each launch (`launch`) from what the verified steps accepted (`observe_output`),
    read one step behind, and from what each depth's steps took (`observe_cost`); `admit` starts a lane afresh.

    A lane's rate is a Beta estimate: `strength` pseudo-drafts at `prior`, then every verified draft (an
    accepted one, or the rejection that ends a run) weighs 1 and every earlier one decays by 1 - `weight`, so
    a step of depth 4 teaches as much as four of depth 1. The costs start from `costs` (warm-up timings or
    bytes read) and follow the steps: a depth not launched yet costs its starting cost times the ratio measured
    on the others (the first step measured sets that ratio; in a tree step, the chains' steps: a tree's rows may
    cost what its weights do not, so a measured tree sets its own cost alone, and the chain of depth S is timed
    once after it where no chain was), and each step launched moves its depth's cost by
    `cost_weight` towards what it took (a running mean from that estimate). A deeper depth than
    the drafts a lane carries verifies only those at its first step: its score amortises that step over
    `horizon` steps. A depth must score `hysteresis` better than the last one to replace it. Depth 0 (the
    target alone, where `depths` has it) verifies nothing and so teaches nothing: after `probe` launches of it
    in a row the next one verifies the one draft carried (the shallowest other depth), and the rates decide again;
    each trial after which they choose depth 0 again doubles the launches to the next, up to `max_probe`
    (an admission, or a depth the rates choose, starts again from `probe`).
    Where the step's draft LM sits depth-0 steps out (`catch_up` = `DecodeConfig.draft_catch_up`, `Drafter.idles`),
    the first launch that drafts after them is a catch-up step (`fdecode.ops.catch_up`: it verifies nothing and
    proposes one draft), so a trial's next launch verifies that draft; the step also catches up after `catch_up`
    depth-0 launches in a row, and the controller counts them as the step does (`Schedule.graph_depth`). A trial due
    waits for such a catch-up (at most `catch_up` launches), so that trials add no catch-up of their own.
    In a tree step (`tree_levels` = S), depth 0 is the target alone, 1 .. S chains and the depths past S trees of
    that many nodes (`fdecode.tree.shape.tree_depths`): a tree verified is worth the lane's gain for its size times
    the chain of depth S it holds, the gain of the K-node tree starting at `tree_gain` (1.1: the trees of 8-12
    nodes at S = 4 committed 1.14x the chain's tokens per verify on the real pair), a smaller tree's in
    proportion to its nodes past S, and each following its verified trees' tokens over that chain's (a tree
    teaches its gain, not the rate). A launch where no depth's graph is made (a window and plan's first, whose
    graph it makes) takes `first`: K by default, an adaptive tree step's chain of depth S (`Step.first_depth`)."""

    reads_ready = True  # `launch` chooses among the depths whose graphs are made

    def __init__(
        self,
        num_draft_tokens: int,
        costs: Sequence[float],
        *,
        depths: Sequence[int] | None = None,
        weight: float = 0.05,
        prior: float = 0.9,
        strength: float = 2.0,
        hysteresis: float = 0.05,
        horizon: int = 8,
        probe: int = 8,
        max_probe: int = 64,
        cost_weight: float = 0.25,
        learn_costs: bool = True,
        catch_up: int = 0,
        tree_levels: int | None = None,
        tree_gain: float = 1.1,
        first: int | None = None,
    ):
        k = num_draft_tokens
        if len(costs) != k + 1 or min(costs) <= 0:
            raise ValueError(f"DepthController needs K + 1 = {k + 1} positive costs, got {list(costs)!r}")
        for name, value in (("weight", weight), ("cost_weight", cost_weight)):
            if not 0 < value <= 1:
                raise ValueError(f"DepthController {name} must be in (0, 1], got {value!r}")
        if not 0 <= prior <= 1:
            raise ValueError(f"DepthController prior must be in [0, 1], got {prior!r}")
        if not strength > 0:
            raise ValueError(f"DepthController strength must be > 0, got {strength!r}")
        if not hysteresis >= 0:
            raise ValueError(f"DepthController hysteresis must be >= 0, got {hysteresis!r}")
        if tree_levels is not None and not 1 <= tree_levels < k:
            raise ValueError(f"DepthController tree_levels must be in 1 .. K - 1 = {k - 1}, got {tree_levels!r}")
        depths = tuple(range(1, k + 1)) if depths is None else tuple(depths)
        first = k if first is None else first
        if first not in depths:
            raise ValueError(f"DepthController first must be one of its depths {depths}, got {first!r}")
        if not tree_gain > 0:
            raise ValueError(f"DepthController tree_gain must be > 0, got {tree_gain!r}")
        for name, value, least in (
            ("horizon", horizon, 1),
            ("probe", probe, 1),
            ("max_probe", max_probe, probe),
            ("catch_up", catch_up, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"DepthController {name} must be an int >= {least}, got {value!r}")
        self.hysteresis, self.horizon, self.strength, self.probe = hysteresis, horizon, strength, probe
        self.paused = 0  # depth-0 launches in a row
        self.max_probe, self.probe_every = max_probe, probe  # depth-0 launches before the next trial
        self.trying = self.on_trial = False  # the launch chosen is a trial's; one is under way
        self.judge_at: int | None = None  # the launch by which a trial's verified output has been read
        self.catch_up, self.lag = catch_up, 0  # the draft sits out up to `catch_up` depth-0 steps; how many it has
        self.caught_up = False  # the last launch was a catch-up step: the next one verifies its draft
        self.depth: int | None = None  # the last launch's depth (None: none since the batch was empty)
        self.num_draft_tokens, self.weight, self.prior = k, weight, prior
        self.cost_weight, self.learn_costs = cost_weight, learn_costs
        self.costs = costs
        self.depths, self.first = depths, first
        self.lanes: dict[int, list[float]] = {}  # lane -> [accepted drafts, rejections] (decayed, prior included)
        self.carried: dict[int, int] = {}  # lane -> drafts its window carries now
        self.admissions: dict[int, int] = {}  # lane -> admissions so far (tells its requests apart)
        self.launches = {d: 0 for d in range(k + 1)}  # how many steps launched at each depth
        self.tree_levels, self.tree_gain = tree_levels, tree_gain  # a tree step's S (depth K is its tree)
        self.gains: dict[int, dict[int, float]] = {}  # lane -> tree size -> its tokens per verify over chain S

    @property
    def costs(self) -> list[float]:
        """costs[d] for d in 0 .. K: what a step of depth d costs now (measured where launched, see the class)."""
        return [self.measured.get(d, c * self.scale) for d, c in enumerate(self.start_costs)]

    @costs.setter
    def costs(self, costs: Sequence[float]) -> None:
        self.start_costs = list(costs)
        self.measured: dict[int, float] = {}  # depth -> running mean of its steps' seconds
        self.scale = 1.0  # measured / starting cost, a running mean over every step measured

    def observe_cost(self, depth: int, seconds: float) -> None:
        """What a launched step of `depth` took (an Engine's launch to its read of the step before, which on the
        CPU runs the step). Ignored where `learn_costs` is False."""
        if not self.learn_costs or not seconds > 0 or self.caught_up:  # a catch-up costs what no depth does
            return
        w, ratio = self.cost_weight, seconds / self.start_costs[depth]
        tree = self.is_tree(depth)  # a tree's cost is its own: its rows may cost what its chain's weights do not
        if not self.measured or not tree and not self.chain_measured():
            self.scale = ratio  # the first step sets the unit (warm-up seconds, or the bytes model's GB); a chain's
        # A depth's first step moves its estimate (starting cost x scale) as any later one does: one slow step
        # (+50 % on the real pair, once in a run) set a depth's cost alone, and the controller never went back.
        known = self.measured.get(depth, self.start_costs[depth] * self.scale)
        self.measured[depth] = (1 - w) * known + w * seconds
        if not tree:
            self.scale = (1 - w) * self.scale + w * ratio  # the first step's ratio blended with itself: unchanged

    def chain_measured(self) -> bool:
        """Whether a step of a chain depth (not a tree) has been measured: the unit of the chains' costs."""
        return any(not self.is_tree(d) for d in self.measured)

    def admit(self, lane: int) -> None:
        """A request was primed into `lane`: its window carries K drafts, its rate starts at `prior`."""
        if not self.lanes:
            self.depth = None  # a fresh batch: its first depth comes from the priors alone
        self.lanes[lane] = [self.strength * self.prior, self.strength * (1 - self.prior)]
        self.probe_every = self.probe  # a new prompt may be worth drafting from
        self.carried[lane] = self.num_draft_tokens
        self.gains[lane] = {}
        self.admissions[lane] = self.admissions.get(lane, 0) + 1

    def rate(self, lane: int) -> float:
        accepted, rejected = self.lanes[lane]
        return accepted / (accepted + rejected) if accepted + rejected > 0 else self.prior

    def is_tree(self, drafts: int) -> bool:
        """Whether verifying `drafts` drafts verifies a tree (a tree step's depths past S)."""
        return self.tree_levels is not None and drafts > self.tree_levels

    def gain(self, lane: int, size: int) -> float:
        """The lane's gain for trees of `size` nodes: what it measured, else the prior (`tree_gain` at K, in
        proportion to the nodes past S below it)."""
        s, k = self.tree_levels, self.num_draft_tokens
        return self.gains[lane].get(size, 1 + (self.tree_gain - 1) * (size - s) / (k - s))

    def lane_tokens(self, lane: int, rate: float, drafts: int) -> float:
        """Tokens lane commits verifying `drafts` drafts: a chain's `expected_tokens`; in a tree step more than S
        drafts are a tree, worth the lane's gain for its size times the chain of depth S (which it holds first)."""
        if self.is_tree(drafts):
            return self.gain(lane, drafts) * expected_tokens(rate, self.tree_levels)
        return expected_tokens(rate, drafts)

    def choose(self, ready: Collection[int] | None = None) -> int:
        """The depth with the most expected tokens per cost over the lanes running now (the deepest ready with
        none), among those `ready` (None: all); `first` where none is (the launch makes its graph)."""
        depths = [d for d in self.depths if ready is None or d in ready]
        if not depths:
            return self.first
        if not self.lanes:
            return max(depths)
        s = self.tree_levels
        if self.learn_costs and s in depths and not self.chain_measured() and any(map(self.is_tree, self.measured)):
            self.trying = False
            return s  # a tree's measured cost prices no chain: time the chain it holds once
        costs, rates = self.costs, {b: self.rate(b) for b in self.lanes}

        def score(depth: int) -> float:  # over `horizon` steps of that depth, the first verifying what is carried
            tokens = 0.0
            for b, rate in rates.items():
                first = self.lane_tokens(b, rate, min(depth, self.carried[b]))
                tokens += (first + (self.horizon - 1) * self.lane_tokens(b, rate, depth)) / self.horizon
            return tokens / costs[depth]

        scores = {d: score(d) for d in depths}
        best = max(sorted(depths, reverse=True), key=scores.__getitem__)  # ties: the deeper step
        if self.depth in scores and scores[best] < (1 + self.hysteresis) * scores[self.depth]:
            best = self.depth
        drafting = [d for d in depths if d > 0]
        # Where the draft sits out depth 0, a trial waits for a catch-up the step runs anyway: the one it forces
        # once the draft missed `catch_up` steps (this launch), or the one just run, whose draft it verifies.
        aligned = self.catch_up == 0 or self.lag >= self.catch_up or self.caught_up
        self.trying = (
            best == 0
            and bool(drafting)
            and (self.caught_up and self.on_trial or self.paused >= self.probe_every and aligned)
        )
        return min(drafting) if self.trying else best  # a trial: what the drafts are worth now

    def launch(self, ready: Collection[int] | None = None) -> tuple[int, dict[int, tuple[int, int]]]:
        """The next launch's depth, and per lane (drafts it verifies, admission) for `observe_output`. ready: the
        depths whose graphs are made (`Schedule.ready_depths`; None: all), so that no launch waits for a compile."""
        depth = self.depth = self.choose(ready)
        launch = sum(self.launches.values())
        if depth > 0 and not self.trying:  # the rates chose to draft
            self.probe_every, self.judge_at = self.probe, None
        elif launch == self.judge_at:  # a trial's output read, and the rates chose depth 0: wait twice as long
            self.probe_every, self.judge_at = min(2 * self.probe_every, self.max_probe), None
        self.launches[depth] += 1
        self.paused = self.paused + 1 if depth == 0 else 0
        # As the step decides (`Schedule.graph_depth`): a catch-up verifies nothing and proposes one draft.
        self.caught_up = self.catch_up > 0 and (self.lag > 0 if depth > 0 else self.lag >= self.catch_up)
        idle = depth == 0 and self.catch_up > 0 and not self.caught_up
        self.lag = self.lag + 1 if idle else 0
        self.on_trial = self.trying and self.caught_up  # a trial's catch-up: the next launch verifies its draft
        if self.trying and not self.caught_up:  # a trial's verifying launch: read one launch later
            self.judge_at = launch + 2
        verified = {b: (0 if self.caught_up else min(depth, self.carried[b]), self.admissions[b]) for b in self.lanes}
        from_step = 0 if idle else 1 if self.caught_up else max(depth, 1)  # what the step proposes
        for b in self.lanes:
            self.carried[b] = from_step
        return depth, verified

    def observe_output(self, packed: torch.Tensor, verified: dict[int, tuple[int, int]]) -> None:
        """A launched step's packed output (`StepOutput.packed`, on the host) and what `launch` said it verifies:
        each lane still running updates its rate; a finished lane leaves."""
        for lane, (drafts, admission) in verified.items():
            if lane not in self.lanes or self.admissions[lane] != admission:
                continue  # the lane's request left, or another was admitted since the launch
            if int(packed[lane, -1]) != 0:  # finished (or overflowed): no longer weighs on the depth
                self.lanes.pop(lane)
                self.carried.pop(lane)
                self.gains.pop(lane)
                continue
            accepted = max(int(packed[lane, -2]) - 1, 0)
            if self.is_tree(drafts):  # a tree: the gain of its size learns
                chain = expected_tokens(self.rate(lane), self.tree_levels)
                gain = (1 - self.weight) * self.gain(lane, drafts) + self.weight * (accepted + 1) / chain
                self.gains[lane][drafts] = gain
                continue
            rejected = 1 if accepted < drafts else 0
            counts = self.lanes[lane]
            for hit in [1] * accepted + [0] * rejected:  # in the order verified: each draft weighs 1, the older less
                counts[0] = (1 - self.weight) * counts[0] + hit
                counts[1] = (1 - self.weight) * counts[1] + 1 - hit

    def __repr__(self) -> str:
        rates = ", ".join(f"{b}: {self.rate(b):.2f}" for b in sorted(self.lanes))
        costs = ", ".join(f"{c:.3g}" for c in self.costs)
        return (
            f"DepthController(K={self.num_draft_tokens}, rates={{{rates}}}, costs=[{costs}], launches={self.launches})"
        )
