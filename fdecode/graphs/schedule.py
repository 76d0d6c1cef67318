"""`Schedule`: the host-side choice of the graph a step runs: its window, sampling plan and depth
(docs/design.md, "Context buckets and sampling plans").

From what the host knows of the state (its `HostRecord`, `fdecode.host_record`), never a device read: the window
is the smallest that holds every position the step can touch (`DecodeConfig.bucket_for` of `max_position`), the
plan the cheapest exact for the lanes that may be active whose graph is made (`plan_for`), and the depth the one
asked for, or the catch-up graph where a draft that sits out depth-0 steps must first take the tokens it missed
(`graph_depth`, `fdecode.ops.catch_up`). The result is a `GraphKey` of the Step's `GraphSet`. The schedule keeps
the record of each state the Step made (`records`); a caller that knows better passes its own (`host=`).
"""

from __future__ import annotations

from collections.abc import Sequence

from fdecode.config import DecodeConfig
from fdecode.graphs.graph_key import GraphKey
from fdecode.graphs.graph_set import GraphSet
from fdecode.graphs.warmup import Run, warm
from fdecode.host_record import HostRecord, HostRecords, read_record
from fdecode.ops.plan import SamplingPlan, exact, plan_for, rank
from fdecode.state import DecodeState
from fdecode.step import general_plan

MADE_MEMO = 256  # `Schedule.made_plans` and `key` answers kept (window, depth, lanes' sampling, graphs made)


def requested_depth(speculate: bool, depth: int | None, k: int) -> int | None:
    """The depth `Step.__call__` and `fdecode.inspect` were asked for: `depth`, or K (0 with speculate=False)."""
    if not isinstance(speculate, bool):
        raise TypeError(f"speculate must be True or False, got {speculate!r}")
    if depth is None:
        return k if speculate else 0
    if not speculate and depth != 0:
        raise ValueError(f"speculate=False is depth 0; got depth={depth} with it")
    return depth


class Schedule:
    """Which graph of `graph_set` a step of a given depth runs on a state.

    depths: the depths the step runs (0 .. K; 0 and K for recurrent models); idles_draft: the draft sits out
    depth-0 steps and catches up later (`fdecode.ops.catch_up`). Each method that takes a state takes `host`, what
    the host knows of it (None: `record(state)`)."""

    def __init__(self, config: DecodeConfig, graph_set: GraphSet, *, depths: tuple[int, ...], idles_draft: bool):
        self.config = config
        self.graph_set = graph_set
        self.depths = depths
        self.idles_draft = idles_draft
        self._made: dict[tuple, tuple[SamplingPlan, ...]] = {}  # `made_plans` answers, read at every step
        self._windows: dict[int | None, int] = {}  # `window` answers
        self._keys: dict[tuple, object] = {}  # `key` answers for the chosen plan, `ready_depths` answers (depth None)
        self.records = HostRecords()  # what the host knows of the states the Step made
        self.depth_seconds: dict[int, float] = {}  # depth -> seconds of one step at the widest window (`warm`)

    @classmethod
    def for_models(cls, config: DecodeConfig, graph_set: GraphSet, target, draft, drafter) -> Schedule:
        """The schedule of a step of these models: the depths the drafter runs beside `target` (`Drafter.depths`:
        0 .. S and the trees past S in a tree step, 0 or K with a recurrent model, else 0 .. K); a draft LM may sit
        depth-0 steps out (`Drafter.idles`), in a chain or a tree step."""
        depths = drafter.depths(draft, config, target=target)
        return cls(config, graph_set, depths=depths, idles_draft=drafter.idles(draft, config))

    def record(self, state: DecodeState) -> HostRecord:
        """What the host knows of `state` (`HostRecords.of`); a fact no record of a state the Step made holds
        is read from `state`'s tensors (`read_record`: a device read, for a state built by hand or copied)."""
        return self.records.of(state, lambda: read_record(state))

    def key(
        self,
        state: DecodeState,
        depth: int,
        *,
        blocks: int | None = None,
        plan: SamplingPlan | None = None,
        host: HostRecord | None = None,
    ) -> tuple[int, GraphKey]:
        """(window in blocks, graph key) of a step of `depth` (checked: `check_depth`) on `state`; `blocks` and
        `plan` where given (`fdecode.inspect`), else the window and plan chosen for `state`."""
        host = self.record(state) if host is None else host
        blocks = self.window(host.max_position) if blocks is None else blocks
        if plan is not None:
            return blocks, self.graph_set.key(blocks, plan, *self.graph_depth(host, depth))
        # What the choice reads, graphs made included (they are only added): asked again at every step.
        memo = (blocks, depth, host.lane_sampling, host.draft_lag, len(self.graph_set.graphs))
        key = self._keys.get(memo)
        if key is None:
            plan = self.plan_for(state, depth, host=host)
            key = self._remember(memo, self.graph_set.key(blocks, plan, *self.graph_depth(host, depth)))
        return blocks, key

    def window(self, max_position: int | None) -> int:
        """`DecodeConfig.bucket_for(max_position)`, remembered (one entry per position a lane reaches)."""
        blocks = self._windows.get(max_position)
        if blocks is None:
            blocks = self._windows[max_position] = self.config.bucket_for(max_position)
        return blocks

    def _remember(self, memo: tuple, answer):
        self._keys[memo] = answer
        if len(self._keys) > MADE_MEMO:  # a server's changing mixes of lanes: keep the newest
            del self._keys[next(iter(self._keys))]
        return answer

    def plan_for(self, state: DecodeState, depth: int | None = None, *, host: HostRecord | None = None) -> SamplingPlan:
        """The plan a step of `depth` (None: K) runs on `state`: the cheapest plan exact for its lanes that may be
        active (from what the host knows, `HostRecord.lane_sampling`; unknown lanes: exact for any parameters) whose
        graph for its window and depth is made. Where none is made: the greedy plan for a batch of greedy lanes,
        and for any random lane the general plan, exact for every setting the config allows, so the first
        random request makes one graph and no later sampling setting makes another (the cheaper specialised
        plans, `all_plans`, are made only by `warmup(plans=...)`). In a step compiled with logit processors,
        a batch none of whose lanes uses one can run its plan's twin without them."""
        cfg = self.config
        host = self.record(state) if host is None else host
        if host.lane_sampling is None:
            return general_plan(cfg)
        made = self.made_plans(host, cfg.K if depth is None else depth)
        if made:
            return made[0]
        # A step without sampling admits greedy lanes only (`request_params`), so their plan is greedy.
        plan = plan_for(_lanes(host), candidates=cfg.top_k_candidates, processors=cfg.logit_processors)
        return general_plan(cfg) if plan.random else plan

    def made_plans(self, host: HostRecord, depth: int) -> list[SamplingPlan]:
        """The plans exact for the lanes that may be active (`host.lane_sampling`; unknown lanes: only the general
        plan) whose graph of the window of `host.max_position` and of `depth` is made, cheapest first."""
        window = self.graph_set.window_of(self.window(host.max_position))
        at, catch_up = self.graph_depth(host, depth)
        memo = (window, at, catch_up, host.lane_sampling, len(self.graph_set.graphs))  # graphs are only added
        found = self._made.get(memo)
        if found is None:
            found = self._made[memo] = self._find_made_plans(host, window, at, catch_up)
            if len(self._made) > MADE_MEMO:  # a server's changing mixes of lanes: keep the newest
                del self._made[next(iter(self._made))]
        return list(found)

    def _find_made_plans(self, host: HostRecord, window, at: int, catch_up: bool) -> tuple[SamplingPlan, ...]:
        made = [k.plan for k in self.graph_set.graphs if (k.window, k.depth, k.catch_up) == (window, at, catch_up)]
        if host.lane_sampling is None:
            return tuple(plan for plan in made if plan == general_plan(self.config))
        lanes = _lanes(host)
        return tuple(sorted((plan for plan in made if exact(plan, lanes)), key=rank))

    def graph_depth(self, host: HostRecord, depth: int) -> tuple[int, bool]:
        """(depth, catch_up) of the graph a step of `depth` runs on a state of record `host`: `depth`, except where
        the draft sits out depth-0 steps (`idles_draft`, `fdecode.ops.catch_up`): the catch-up graph (depth 0,
        catch_up: it verifies the first row, feeds the draft the tokens it missed, proposes one draft) for a step
        that drafts after depth-0 steps (`host.draft_lag` > 0, or unknown), or for a depth-0 step once the draft
        missed `draft_catch_up` steps."""
        if not self.idles_draft:
            return depth, False
        lag = host.draft_lag
        if depth == 0:
            return (0, False) if lag is not None and lag < self.config.draft_catch_up else (0, True)
        return (depth, False) if lag == 0 else (0, True)

    def stepped(self, state: DecodeState, host: HostRecord, key: GraphKey, new_state: DecodeState) -> None:
        """Record what the host knows of `new_state`, which the graph `key` made from `state` (of record `host`):
        each lane advanced by at most W positions, the lanes' sampling is unchanged, and the draft sat the step
        out where it idles at depth 0 (a catch-up step ran it)."""
        idle = key.depth == 0 and not key.catch_up and self.idles_draft
        self.records.note(new_state, host.stepped(self.config.W, idle), spent=state)

    def ready_depths(self, state: DecodeState, host: HostRecord | None = None) -> tuple[int, ...]:
        """The depths with a graph made in this process for `state` (its window, and a sampling plan exact for its
        lanes): a step of one of them compiles and loads nothing (an adaptive `Engine` launches no other). Under
        eager too, so that a schedule does not depend on the backend."""
        host = self.record(state) if host is None else host
        blocks = self.window(host.max_position)
        memo = (blocks, None, host.lane_sampling, host.draft_lag, len(self.graph_set.graphs))  # `key`'s memo
        ready = self._keys.get(memo)
        if ready is None:
            ready = self._remember(memo, tuple(d for d in self.depths if self.made_plans(host, d)))
        return ready

    def warmup_runs(
        self, plans: Sequence[SamplingPlan], depths: Sequence[int]
    ) -> tuple[list[tuple[int, GraphKey]], list[GraphKey]]:
        """What `Step.warmup` runs: (window in blocks, key) of every window for each of `plans` and `depths`
        (checked), with the catch-up graph that ends a run of depth-0 steps where the draft idles; and the keys it
        times: each depth's at the widest window, in the first plan warmed that is greedy (else the first: greedy is
        the cheapest, and with a real vocabulary a timed step of another plan costs as long as one of greedy's)."""
        steps = [(self.check_depth(depth), False) for depth in depths]
        if self.idles_draft and (0, False) in steps:  # the graph that ends a run of depth-0 steps
            steps.append((0, True))
        runs = [
            (blocks, self.graph_set.key(blocks, plan, depth, catch_up=catch_up))
            for plan in plans
            for depth, catch_up in steps
            for blocks in self.config.bucket_blocks
        ]
        warmed = list(dict.fromkeys(key.plan for _, key in runs))
        first = next((plan for plan in warmed if not plan.random), warmed[0] if warmed else None)
        widest = self.config.bucket_blocks[-1]
        timed = list(dict.fromkeys(self.graph_set.key(widest, first, k.depth) for _, k in runs if not k.catch_up))
        return runs, timed

    def warm(self, run: Run, state: DecodeState, plans: Sequence[SamplingPlan], depths: Sequence[int], *, show: bool):
        """`Step.warmup`: run every graph `warmup_runs` lists once on `state` (`run` is `Step._run`), then time each
        depth's at the widest window (`fdecode.graphs.warmup.warm`) into `depth_seconds` (the least where timed
        before), what an adaptive `Engine` weighs depths by."""
        cfg = self.config
        runs, timed = self.warmup_runs(plans, depths)
        blocks = cfg.bucket_blocks[-1]
        seconds = warm(run, state, runs, timed, blocks=blocks, block_size=cfg.block_size, k=cfg.K, show=show)
        for key, cost in seconds.items():
            self.depth_seconds[key.depth] = min(cost, self.depth_seconds.get(key.depth, cost))

    def check_depth(self, depth) -> int:
        """`depth` if the step runs it (one of `depths`), else raises."""
        k = self.config.K
        if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= k:
            raise ValueError(f"depth must be an int in 0 .. K = {k}, got {depth!r}")
        if depth not in self.depths:
            runs = (
                f"a tree step runs depths {', '.join(map(str, self.depths))} "
                f"(the target alone, chains of 1 .. S, trees of the nodes past S, the config's at K = {k})"
                if self.config.tree and len(self.depths) > 1
                else f"a step of recurrent (linear-attention) models runs depth 0 or K = {k}"
            )
            raise ValueError(
                f"{runs}, got {depth} "
                f"(step.depths lists the depths a step runs: warmup(depths=step.depths) warms them all)"
            )
        return depth


def _lanes(host: HostRecord) -> list[tuple]:
    return [lane for lane in host.lane_sampling if lane is not None]
