"""`SamplingPlan`: which sampling code a step graph contains, chosen on the host per step
(docs/design.md, "Invariants").

The host knows every lane's sampling parameters, so it picks, without reading the device, the
cheapest graph that is exact for the lanes that may be active:

- no random lane: the greedy-only graph (argmax verification, no filters, no PRNG);
- every random lane has 1 <= top_k <= `candidates` (`DecodeConfig.top_k_candidates`):
  the candidate graph, which filters and samples within `torch.topk`'s candidates;
- otherwise the full-vocabulary graph, with the exact top-k and top-p threshold
  searches only where some random lane uses them (min-p costs one max, always in).

In a step compiled with logit processors (penalties, min_tokens, logit bias), each plan also has a
twin without them (`unprocessed`), which runs while no lane that may be active uses one: their
passes over the logits are skipped, which is exact because they would change nothing.

Each plan is a graph of its own (`fdecode.graphs.compile.Step`); switching plans picks a
graph and never recompiles one. A plan is exact for more lanes than those it is cheapest for (`exact`):
the general plan (every filter on) for any. A step runs the cheapest exact plan whose graph is made, so
once `Step.warmup()` made the two `covering` plans (greedy and the general one) no batch compiles anything;
the cheaper specialised plans run where their graphs were made too (`warmup(plans=step.plans)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class SamplingPlan:
    random: bool = False  # some lane samples; False: the greedy-only graph
    candidates: int = 0  # > 0: every random lane has 1 <= top_k <= candidates (filter within torch.topk)
    top_k: bool = False  # full vocabulary: some random lane has top_k > 0 (exact radix select by count)
    top_p: bool = False  # full vocabulary: some random lane has top_p < 1 (exact radix select by mass)
    unprocessed: bool = False  # no lane uses a logit processor: the graph leaves the config's out

    @property
    def name(self) -> str:
        return self._sampling_name + (", no processors" if self.unprocessed else "")

    @property
    def _sampling_name(self) -> str:
        if not self.random:
            return "greedy"
        if self.candidates:
            return f"top_k<={self.candidates}"
        return "+".join(["full"] + [f for f in ("top_k", "top_p") if getattr(self, f)])

    def __repr__(self) -> str:
        return f"SamplingPlan({self.name})"


GREEDY = SamplingPlan()


def rank(plan: SamplingPlan) -> tuple:
    """Orders plans by cost, cheapest first: greedy, the candidate plan, full, full with one threshold search,
    with both; at the same sampling, the twin without logit processors first."""
    return plan.random, plan.random and not plan.candidates, plan.top_k + plan.top_p, not plan.unprocessed


def exact(plan: SamplingPlan, lanes: Sequence[tuple]) -> bool:
    """Whether `plan`'s graph decodes lanes with these host-side (temperature, top_k, top_p[, processed])
    exactly (`plan_for`'s lanes): greedy lanes run in any plan; random ones need a random plan whose filters
    cover theirs; a lane using a logit processor needs a plan that keeps them."""
    if plan.unprocessed and any(len(lane) > 3 and lane[3] for lane in lanes):
        return False
    random = [(k, p) for t, k, p, *_ in lanes if t > 0]
    if not random:
        return True
    if not plan.random:
        return False
    if plan.candidates:
        return all(1 <= k <= plan.candidates for k, _ in random)
    return (plan.top_k or all(k <= 0 for k, _ in random)) and (plan.top_p or all(p >= 1 for _, p in random))


def plan_for(lanes: Sequence[tuple], *, candidates: int, processors: bool = False) -> SamplingPlan:
    """The plan for lanes with these host-side (temperature, top_k, top_p[, processed]), one per lane that may
    be active (`SamplingParams.plan_inputs`; a lane without `processed` uses no logit processor);
    `processors`: the step is compiled with logit processors."""
    unprocessed = processors and not any(len(lane) > 3 and lane[3] for lane in lanes)
    random = [(k, p) for t, k, p, *_ in lanes if t > 0]
    if not random:
        return SamplingPlan(unprocessed=True) if unprocessed else GREEDY
    if candidates and all(1 <= k <= candidates for k, _ in random):
        return SamplingPlan(random=True, candidates=candidates, unprocessed=unprocessed)
    return SamplingPlan(
        random=True, top_k=any(k > 0 for k, _ in random), top_p=any(p < 1 for _, p in random), unprocessed=unprocessed
    )


def general(sampling: bool) -> SamplingPlan:
    """The plan exact for any lanes a step allows: every filter on (and the step's logit processors), or
    greedy-only in a step that does not sample."""
    return SamplingPlan(random=True, top_k=True, top_p=True) if sampling else GREEDY


def covering(sampling: bool, processors: bool = False) -> tuple[SamplingPlan, ...]:
    """The plans `Step.warmup()` makes by default: the greedy plan (without the logit processors where the step
    has them: a batch none of whose lanes uses one) and the general plan, exact for any lanes."""
    greedy = SamplingPlan(unprocessed=True) if processors else GREEDY
    return tuple(dict.fromkeys((greedy, general(sampling))))


def all_plans(sampling: bool, candidates: int, processors: bool = False) -> tuple[SamplingPlan, ...]:
    """Every plan a step can run (`Step.warmup` captures them all): with `processors`, each twice."""
    full = tuple(SamplingPlan(random=True, top_k=k, top_p=p) for k in (False, True) for p in (False, True))
    plans = (GREEDY, *((SamplingPlan(random=True, candidates=candidates),) if candidates else ()), *full)
    plans = plans if sampling else (GREEDY,)
    return plans + tuple(replace(plan, unprocessed=True) for plan in plans) if processors else plans
