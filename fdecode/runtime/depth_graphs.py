"""The depth graphs an adaptive Engine asks for without being asked itself (docs/design.md, "Adaptive depth and
the idle draft").

An adaptive Engine launches only depths whose graphs are made (`Schedule.ready_depths`). On the plain path
(`fdecode.compile`, then `fdecode.generate` or an Engine, no `warmup(depths=...)` call) the first launch of a
window and plan makes the graph of the step's `first_depth` alone (K, or an adaptive tree step's chain of depth
S); right after it, `DepthGraphs.after_launch` asks for the graphs of the step's other depths of that window
and plan, made on a thread of their own (`fdecode.graphs.background`), so no stream waits for them: the steps
run at that first depth until another depth's graph joins, and the controller may choose it from the next
launch. Order: the catch-up graph and depth 0 first (depth 0 is the target alone, what a stream whose drafts
fail runs best at; the catch-up graph before it, which every other depth runs once a lane's draft lags), then
the middle depths from K / 2 outwards, K last where the first launch did not make it.

Random plans are left at the first depth: a seeded random lane's draws depend on the depths its steps verify, so
random lanes run the step's `first_depth` (K, or an adaptive tree step's chain of depth S) unless
`warmup(depths=...)` made others (the guarantee `SamplingParams.seed` states). Not under CUDA or ACL graphs either
(`STATIC_KV` backends: a graph replays at the KV addresses it was captured at, and the steps own the pools), nor
where the steps' graphs are Dynamo-wrapped functions (the disk store turned off, `aot_eager`, `dynamo`: one called
during a background trace would run as plain PyTorch), nor on tensor-parallel ranks (each would make its graphs at
its own pace, and the ranks must launch the same depths): there `warmup(depths=...)` makes them. Nor with
`FDECODE_BACKGROUND_GRAPHS=0`."""

from __future__ import annotations

from fdecode.graphs import background
from fdecode.graphs.backends import STATIC_KV
from fdecode.graphs.graph_key import GraphKey
from fdecode.graphs.stored import cache_dir
from fdecode.host_record import HostRecord
from fdecode.progress import notice


def depth_order(depths, k: int) -> list[int]:
    """The depths in the order they are made: 0 first, then from k / 2 outwards (the deeper of two equally near
    first), k last (where the first launch did not make it). `DepthGraphs` puts the catch-up graph before them."""
    return sorted(depths, key=lambda d: (d == k, d != 0, abs(2 * d - k), -d))


class DepthGraphs:
    """Asks for an adaptive Engine's depth graphs (`after_launch`); `asked` lists the keys asked for so far."""

    def __init__(self, step, policy) -> None:
        self.step = step
        # Not on tensor-parallel ranks: each would make its graphs at its own pace, and ranks must launch alike.
        alone = step.config.tp_size == 1
        # Only where the Engine's steps call no Dynamo-wrapped function: eager (nothing is traced), or Inductor's
        # graphs kept on disk (called directly, `fdecode.graphs.stored`); a Dynamo-wrapped step called during a
        # background trace would run as plain PyTorch (`background._tolerate_traces_elsewhere`).
        direct = step.backend == "eager" or (step.backend == "inductor" and cache_dir() is not None)
        self.on = policy.reads_ready and background.enabled() and step.backend not in STATIC_KV and alone and direct
        self.asked: list[GraphKey] = []
        self._seen: set[tuple] = set()  # (window in blocks, lanes' sampling) already looked at

    def after_launch(self, host: HostRecord) -> tuple[GraphKey, ...]:
        """After a launch on a state of record `host`: ask for the graphs of the depths of its window and plan
        that are not made (`BackgroundGraphs.request` leaves those made out), unless its plan is random. Returns
        the keys asked for now."""
        if not self.on:
            return ()
        schedule, graph_set, k = self.step.schedule, self.step.graph_set, self.step.config.K
        blocks = schedule.window(host.max_position)
        seen = (blocks, host.lane_sampling)
        if seen in self._seen:
            return ()
        if len(self._seen) >= 1024:  # a server's changing mixes of lanes: looked at again, nothing made twice
            self._seen.clear()
        self._seen.add(seen)
        plan = schedule.plan_for(None, k, host=host)  # (with `host` given, no state is read)
        if plan.random:
            return ()
        runs = [(blocks, graph_set.key(blocks, plan, depth)) for depth in depth_order(schedule.depths, k)]
        if schedule.idles_draft and 0 in schedule.depths:  # the graph that ends a run of depth-0 steps, made
            # before depth 0's: once a lane lags, every depth but 0 runs it, and none would be ready without it
            runs.insert(0, (blocks, graph_set.key(blocks, plan, 0, catch_up=True)))
        try:
            asked = graph_set.background.request(runs, self.step.empty_state)
        except Exception as error:  # (the throwaway state's KV pool, say): the steps go on at the depths made
            self.on = False
            notice(f"no step graphs will be made in the background ({type(error).__name__}: {error})")
            return ()
        self.asked += asked
        return asked

    def __repr__(self) -> str:
        names = ", ".join(key.name(self.step.config.K) for key in self.asked)
        return f"DepthGraphs(on={self.on}, asked=[{names}])"
