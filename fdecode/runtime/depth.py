"""`DepthController`: how many drafts each launch of an `Engine` verifies (`DecodeConfig.adaptive_depth`)
(docs/design.md, "Prompt lookup: n-gram drafts").

A step of depth d verifies d of the window's K drafts and proposes max(d, 1) for the next window
(`fdecode.step.proposals`). The controller keeps, per lane, decayed counts of the verified drafts that
were accepted and of verified runs that ended at a rejection (read one step behind, as the Engine reads
outputs; starting from `prior`), so a lane's acceptance rate a gives 1 + a + ... + a^d expected tokens
at depth d; each launch takes the depth with the most expected tokens per unit of cost, summed over the
running lanes, and keeps the last depth unless another scores `hysteresis` better. The costs
(`step_costs`) are each depth's step time where `Step.warmup(depths=...)` timed them, else the model
`depth_costs` (bytes of weights read), with which a run's schedule depends only on its outputs.

Lossless whatever it chooses: every depth commits the target's tokens (greedy) or its distribution
(random lanes); a random lane's draws depend on the schedule and so on its batch, as with `DraftGate`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def expected_tokens(rate: float, drafts: int) -> float:
    """Tokens a lane commits from `drafts` verified drafts, each accepted with probability `rate`."""
    return sum(rate**i for i in range(drafts + 1))


def forward_bytes(model: torch.nn.Module) -> int:
    """The bytes of weights one forward reads: every parameter once, less the embedding tables, of which
    a forward gathers a few rows (unless the table is also a linear layer's weight: a tied head)."""
    linears = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    gathered = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)} - linears
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in gathered)


def depth_costs(target, draft, cfg) -> list[float]:
    """costs[d] for d in 0 .. K: the weights a step of depth d reads (`forward_bytes`: the target once, the
    draft once per proposal), in GB. An n-gram draft reads none."""
    from fdecode.models.ngram import is_ngram
    from fdecode.step import proposals

    target_gb = forward_bytes(target) / 1e9
    draft_gb = 0.0 if is_ngram(draft) else forward_bytes(draft) / 1e9
    return [target_gb + proposals(draft, cfg, d) * draft_gb for d in range(cfg.K + 1)]


def step_costs(step, depths: Sequence[int]) -> list[float]:
    """costs[d] for d in 0 .. K: seconds of a step of depth d where `step.warmup` timed every one of
    `depths` (`Step.depth_seconds`), else the weights it reads (`depth_costs`). Depths outside `depths`
    are never launched; they get the cheapest cost so the list stays positive."""
    timed = step.depth_seconds
    if not all(d in timed for d in depths):
        return depth_costs(step.target, step.draft, step.config)
    return [timed.get(d, min(timed[e] for e in depths)) for d in range(step.config.K + 1)]


class DepthController:
    """Chooses the depth of each launch (`launch`) from what the verified steps accepted (`observe_output`),
    read one step behind; `admit` starts a lane afresh."""

    def __init__(self, num_draft_tokens: int, costs: Sequence[float], *, depths: Sequence[int] | None = None,
                 weight: float = 0.15, prior: float = 0.8, hysteresis: float = 0.05):
        k = num_draft_tokens
        if len(costs) != k + 1 or min(costs) <= 0:
            raise ValueError(f"DepthController needs K + 1 = {k + 1} positive costs, got {list(costs)!r}")
        if not 0 < weight <= 1:
            raise ValueError(f"DepthController weight must be in (0, 1], got {weight!r}")
        if not 0 <= prior <= 1:
            raise ValueError(f"DepthController prior must be in [0, 1], got {prior!r}")
        if not hysteresis >= 0:
            raise ValueError(f"DepthController hysteresis must be >= 0, got {hysteresis!r}")
        self.hysteresis = hysteresis
        self.depth: int | None = None  # the last launch's depth (None: none since the batch was empty)
        self.num_draft_tokens, self.costs, self.weight, self.prior = k, list(costs), weight, prior
        self.depths = tuple(range(1, k + 1)) if depths is None else tuple(depths)
        self.lanes: dict[int, list[float]] = {}  # lane -> [accepted drafts, rejections] (decayed, prior included)
        self.carried: dict[int, int] = {}  # lane -> drafts its window carries now
        self.admissions: dict[int, int] = {}  # lane -> admissions so far (tells its requests apart)
        self.launches = {d: 0 for d in range(k + 1)}  # how many steps launched at each depth

    def admit(self, lane: int) -> None:
        """A request was primed into `lane`: its window carries K drafts, its rate starts at `prior`."""
        if not self.lanes:
            self.depth = None  # a fresh batch: its first depth comes from the priors alone
        self.lanes[lane] = [2 * self.prior, 2 * (1 - self.prior)]
        self.carried[lane] = self.num_draft_tokens
        self.admissions[lane] = self.admissions.get(lane, 0) + 1

    def rate(self, lane: int) -> float:
        accepted, rejected = self.lanes[lane]
        return accepted / (accepted + rejected) if accepted + rejected > 0 else self.prior

    def choose(self) -> int:
        """The depth with the most expected tokens per cost over the lanes running now (K with none)."""
        if not self.lanes:
            return self.num_draft_tokens

        def score(depth: int) -> float:  # in the steady state of that depth (its windows carry `depth` drafts)
            return sum(expected_tokens(self.rate(b), depth) for b in self.lanes) / self.costs[depth]

        scores = {d: score(d) for d in self.depths}
        best = max(sorted(self.depths, reverse=True), key=scores.__getitem__)  # ties: the deeper step
        if self.depth in scores and scores[best] < (1 + self.hysteresis) * scores[self.depth]:
            return self.depth  # a switch's first step verifies only the drafts carried: not worth a near tie
        return best

    def launch(self) -> tuple[int, dict[int, tuple[int, int]]]:
        """The next launch's depth, and per lane (drafts it verifies, admission) for `observe_output`."""
        depth = self.depth = self.choose()
        self.launches[depth] += 1
        verified = {b: (min(depth, self.carried[b]), self.admissions[b]) for b in self.lanes}
        from_step = max(depth, 1)  # what a step of this depth proposes (an LM draft or MTP head)
        for b in self.lanes:
            self.carried[b] = from_step
        return depth, verified

    def observe_output(self, packed: torch.Tensor, verified: dict[int, tuple[int, int]]) -> None:
        """A launched step's packed output (`StepOutput.packed`, on the host) and what `launch` said it verifies:
        each lane still running updates its rate; a finished lane leaves."""
        keep = 1 - self.weight
        for lane, (drafts, admission) in verified.items():
            if lane not in self.lanes or self.admissions[lane] != admission:
                continue  # the lane's request left, or another was admitted since the launch
            if int(packed[lane, -1]) != 0:  # finished (or overflowed): no longer weighs on the depth
                self.lanes.pop(lane)
                self.carried.pop(lane)
                continue
            accepted = int(packed[lane, -2]) - 1
            counts = self.lanes[lane]
            counts[0] = keep * counts[0] + max(accepted, 0)
            counts[1] = keep * counts[1] + (1 if accepted < drafts else 0)

    def __repr__(self) -> str:
        rates = ", ".join(f"{b}: {self.rate(b):.2f}" for b in sorted(self.lanes))
        return f"DepthController(K={self.num_draft_tokens}, rates={{{rates}}}, launches={self.launches})"
