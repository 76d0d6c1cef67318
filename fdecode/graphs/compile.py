"""`fdecode.compile`: bind models and config into a `Step`, captured by the chosen backend
(docs/design.md, "Backends and kernels")."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import statistics
import time
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

import torch

from fdecode.backends import cpu
from fdecode.config import DecodeConfig
from fdecode.drafts import Drafter
from fdecode.drafts.resolve import resolve_draft
from fdecode.graphs.backends import (
    DYNAMIC_WINDOW,
    STATIC_KV,
    capture,
    choose_attention,
    device_reason,
    latent_reason,
    resolve_backend,
)
from fdecode.graphs.stored import StoredGraph, cache_dir, graph_key, serializable_guards
from fdecode.graphs.trusted import TrustedStates
from fdecode.models.parallel import check_group
from fdecode.models.regions import resolve_regions, shares_parameters
from fdecode.models.resolve import config_of, resolve_config, resolve_target
from fdecode.models.sharding import check_divides, parallelize_pair
from fdecode.ops.plan import SamplingPlan, all_plans, covering, exact, plan_for, rank
from fdecode.params import PerPrompt, SamplingParams
from fdecode.prefill import Prompts, empty_state, new_kv, prefill, prime
from fdecode.progress import bar, notice
from fdecode.seeds import SeedSource
from fdecode.state import DecodeState, KVPools, StepOutput
from fdecode.state.recurrent import check_leaves, is_hybrid
from fdecode.step import CATCH_UP, decode_step, general_plan
from fdecode.tree.shape import check_tree

MADE_MEMO = 256  # `Step._made_plans` answers kept (window, depth, lanes' sampling, graphs made)
TIMED_RUNS = 5  # `Step.warmup` times each depth's step this many times, in rounds (the median is its cost)


def fresh_code(fn: Callable, name: str) -> Callable:
    """`fn` with a code object of its own. Dynamo caches compiled graphs (and counts recompiles,
    up to `cache_size_limit`) per code object; giving every Step its own means two steps with
    different configs never evict each other or count as each other's recompiles."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, name, fn.__defaults__, fn.__closure__)


def pure_step(
    target, draft, config: DecodeConfig, blocks: int | None, plan: SamplingPlan, depth: int | None = None
) -> Callable:
    """The pure step for a window of `blocks` blocks, or (None) for any window: then it takes the window
    as a second argument, a [blocks, 0] tensor (`window_width`) whose length the graph reads as a symbolic
    size. A code object of its own (`fresh_code`) per window, plan and depth (see `decode_step`; None: K)."""
    depth = config.K if depth is None else depth
    config = plan_config(config, plan)
    draft_regions = config.layer_regions and not shares_parameters(target, draft)  # once, not in every trace
    name = "".join(c if c.isalnum() else "_" for c in plan.name) + depth_suffix(config, depth)
    if blocks is None:

        def any_window(state: DecodeState, width: torch.Tensor) -> tuple[DecodeState, StepOutput]:
            return decode_step(
                target, draft, config, state, context_blocks=width, plan=plan, depth=depth, draft_regions=draft_regions
            )

        return fresh_code(any_window, f"fdecode_step_any_window_{name}")

    def step(state: DecodeState) -> tuple[DecodeState, StepOutput]:
        return decode_step(
            target, draft, config, state, context_blocks=blocks, plan=plan, depth=depth, draft_regions=draft_regions
        )

    return fresh_code(step, f"fdecode_step_ctx{blocks * config.block_size}_{name}")


def plan_config(config: DecodeConfig, plan: SamplingPlan) -> DecodeConfig:
    """The config a plan's graph is traced with: without the logit processors where the plan leaves them out
    (no lane uses one; their state leaves pass through untouched)."""
    if not plan.unprocessed:
        return config
    return dataclasses.replace(config, penalties=False, min_tokens=False, max_logit_bias=0)


def depth_suffix(config: DecodeConfig, depth: int) -> str:
    if depth == CATCH_UP:
        return "_catch_up"
    return "" if depth == config.K else "_first_row" if depth == 0 else f"_depth{depth}"


def graph_name(plan: SamplingPlan, depth: int, k: int) -> str:
    """A step graph's name in messages and `Step.plan_compile_seconds`: the plan's, marked for first-row
    graphs (depth 0), the catch-up graph (`CATCH_UP`) and graphs that verify fewer than the K drafts."""
    if depth == k:
        return plan.name
    if depth == CATCH_UP:
        return f"{plan.name} (first row, draft catch-up)"
    return f"{plan.name} (first row only)" if depth == 0 else f"{plan.name} (depth {depth})"


def requested_depth(speculate: bool, depth: int | None, k: int) -> int | None:
    """The depth `Step.__call__` and `fdecode.inspect` were asked for: `depth`, or K (0 with speculate=False)."""
    if not isinstance(speculate, bool):
        raise TypeError(f"speculate must be True or False, got {speculate!r}")
    if depth is None:
        return k if speculate else 0
    if not speculate and depth != 0:
        raise ValueError(f"speculate=False is depth 0; got depth={depth} with it")
    return depth


def window_width(config: DecodeConfig, blocks: int) -> torch.Tensor:
    """The window argument of the graph of every window: [blocks, 0] (no memory) on the step's device,
    its length marked dynamic from 2 blocks to the whole lane, so one compile serves every window."""
    width = torch.empty((blocks, 0), dtype=torch.int8, device=config.device)
    torch._dynamo.mark_dynamic(width, 0, min=2, max=config.blocks_per_lane)
    return width


class Step:
    """A compiled decode step: `state, out = step(state)`; `state = step.prefill(prompts)`.

    Attributes: `target`, `draft` (fdecode models, or an `NgramDraft`), `drafter` (what the step asks of its
    draft kind, `fdecode.drafts`), `draft_kind` ("mtp", "ngram" or "model"), `config`, `backend` (what runs), `fallback_reason` (why that is
    not the requested backend, else None), `config.attention` (the paged-attention
    kernel) and `attention_reason` (why not a device kernel / the requested one), `buckets` (attention
    windows in tokens), `plans` (sampling plans), `compile_seconds` (per window: first calls of its
    graphs, compile included, summed over plans), `plan_compile_seconds` ((window, plan name) ->
    seconds), `depth_seconds` (depth -> seconds of one step at the widest window, timed by `warmup`:
    what an adaptive `Engine` weighs each depth by), `seeds` (default seeds), `fn` (the uncompiled pure function, whole-lane window,
    exact for any lanes).

    Context buckets and sampling plans: a step attends over the smallest window that holds every
    position it can touch, chosen on the host from `state.max_position` (an upper bound the host
    tracks without reading the device), and runs the cheapest sampling plan exact for its lanes whose
    graph is made, else the cheapest exact one (`plan_for`, from the host's record of their parameters,
    `state.lane_sampling`). Each plan is a graph of its own, compiled on first use (or by `warmup()`: the
    greedy and the general plan, exact for any lanes); switching plans picks another graph and never
    recompiles one. Where `dynamic_window` is True (`DecodeConfig.dynamic_window`
    and a backend in `DYNAMIC_WINDOW`), one graph per plan serves every window of 2 blocks or more: its
    window width is a symbolic size, so a stream crossing into a wider window compiles nothing (a
    window of 1 block has a graph of its own: Dynamo specializes sizes 0 and 1). Elsewhere each
    (window, plan) is a graph. `announce` (default True): each compile says so on stderr in one line,
    and `warmup()` shows a progress bar.
    """

    # Where `fdecode.compile` packed the large linear weights (`fdecode.backends.cpu.onednn_linear.Packing`:
    # bytes in place of checkpoint files' weights, and beside others), None where it packed none.
    packing = None

    def __init__(
        self,
        target,
        draft,
        config: DecodeConfig,
        *,
        drafter: Drafter,
        backend: str,
        fallback_reason: str | None,
        attention_reason: str | None = None,
        announce: bool = True,
    ):
        self.target = target
        self.draft = draft
        self.config = config
        self.drafter = drafter
        self.draft_kind = drafter.kind
        self.backend = backend
        self.fallback_reason = fallback_reason
        self.attention_reason = attention_reason
        # Default seeds of requests that give none, the same on every tensor-parallel rank.
        self.seeds = SeedSource(getattr(target, "tp", None), config.device)
        self.compile_seconds: dict[int, float] = {}
        self.plan_compile_seconds: dict[tuple[int, str], float] = {}
        self.depth_seconds: dict[int, float] = {}
        self.announce = announce
        # The draft sits out depth-0 steps (`fdecode.ops.catch_up`); a tree step has none.
        self.idles_draft = drafter.idles(draft, config) and not config.tree
        # One graph per plan for every window of 2+ blocks, where the backend can and two such windows exist.
        self.dynamic_window = (
            config.dynamic_window and backend in DYNAMIC_WINDOW and sum(n >= 2 for n in config.bucket_blocks) >= 2
        )
        # (window in blocks, or None: the graph of every window of 2+ blocks; plan; depth) -> what runs
        self._graphs: dict[tuple[int | None, SamplingPlan, int], Callable] = {}
        self._widths: dict[int, torch.Tensor] = {}  # blocks -> [blocks, 0], the dynamic graph's window argument
        self._kv = KVPools(self._new_kv)  # the step's KV pools and who may use them (`fdecode.state.ownership`)
        self._trusted = TrustedStates()  # the last state returned, whose layout its graph fixed (no re-checks)
        self._made: dict[tuple, tuple[SamplingPlan, ...]] = {}  # `_made_plans` answers, read at every step
        # The pure step function (what every backend captures), whole-lane window, exact for any lanes.
        self.fn = self._pure(config.blocks_per_lane, general_plan(config))

    @property
    def buckets(self) -> tuple[int, ...]:
        """Attention windows, in tokens, that this step can attend over (their graphs compiled lazily)."""
        return tuple(n * self.config.block_size for n in self.config.bucket_blocks)

    @property
    def plans(self) -> tuple[SamplingPlan, ...]:
        """The sampling plans this step can run, one graph per plan and window (`fdecode.ops.plan`)."""
        cfg = self.config
        return all_plans(cfg.sampling, cfg.top_k_candidates, cfg.logit_processors)

    @property
    def graphs(self) -> Mapping[tuple[int | None, SamplingPlan, int], Callable]:
        """The step graphs made so far, by (window in blocks, None for the graph of every window; plan; depth):
        a read-only view (a `StoredGraph` where one was loaded from or written to the disk store)."""
        return MappingProxyType(self._graphs)

    @property
    def kv_pools(self) -> list:
        """The KV pools this step owns (`fdecode.state.ownership.KVPool`), oldest first: a copy of the list."""
        return list(self._kv.pools)

    @property
    def covering_plans(self) -> tuple[SamplingPlan, ...]:
        """What `warmup()` makes by default: the greedy plan and the general one, exact for any lanes
        (`fdecode.ops.plan.covering`). With their graphs made, every batch runs one of them or a cheaper plan
        made too, and none compiles."""
        cfg = self.config
        return covering(cfg.sampling, cfg.logit_processors)

    def plan_for(self, state: DecodeState, depth: int | None = None) -> SamplingPlan:
        """The plan a step of `depth` (None: K) runs on `state`: the cheapest plan exact for its lanes that may be
        active (from host bookkeeping, `state.lane_sampling`; unknown lanes: exact for any parameters) whose
        graph for its window and depth is made. Where none is made: the greedy plan for a batch of greedy lanes,
        and for any random lane the general plan, exact for every setting the config allows, so the first
        random request makes one graph and no later sampling setting makes another (the cheaper specialised
        plans, `all_plans`, are made only by `warmup(plans=...)`). In a step compiled with logit processors,
        a batch none of whose lanes uses one can run its plan's twin without them."""
        cfg = self.config
        if state.lane_sampling is None:
            return general_plan(cfg)
        made = self._made_plans(state, cfg.K if depth is None else depth)
        if made:
            return made[0]
        # A step without sampling admits greedy lanes only (`request_params`), so their plan is greedy.
        plan = plan_for(self._lanes(state), candidates=cfg.top_k_candidates, processors=cfg.logit_processors)
        return general_plan(cfg) if plan.random else plan

    @staticmethod
    def _lanes(state: DecodeState) -> list[tuple]:
        return [lane for lane in state.lane_sampling if lane is not None]

    def _made_plans(self, state: DecodeState, depth: int) -> list[SamplingPlan]:
        """The plans exact for `state`'s lanes that may be active (unknown lanes: only the general plan) whose graph
        of its window and of `depth` is made, cheapest first."""
        key, at = self.graph_window(self.config.bucket_for(state.max_position)), self.graph_depth(state, depth)
        memo = (key, at, state.lane_sampling, len(self._graphs))  # graphs are only ever added
        found = self._made.get(memo)
        if found is None:
            found = self._made[memo] = self._find_made_plans(state, key, at)
            if len(self._made) > MADE_MEMO:  # a server's changing mixes of lanes: keep the newest
                del self._made[next(iter(self._made))]
        return list(found)

    def _find_made_plans(self, state: DecodeState, key: int | None, at: int) -> tuple[SamplingPlan, ...]:
        made = [plan for k, plan, d in self._graphs if k == key and d == at]
        if state.lane_sampling is None:
            return tuple(plan for plan in made if plan == general_plan(self.config))
        lanes = self._lanes(state)
        return tuple(sorted((plan for plan in made if exact(plan, lanes)), key=rank))

    def graph_window(self, blocks: int) -> int | None:
        """Which graph runs a window of `blocks` blocks: None for the graph of every window (`dynamic_window`),
        else `blocks` (a graph of its own)."""
        return None if self.dynamic_window and blocks >= 2 else blocks

    def _pure(self, blocks: int | None, plan: SamplingPlan, depth: int | None = None) -> Callable:
        return pure_step(self.target, self.draft, self.config, blocks, plan, depth)

    @property
    def gated(self) -> bool:
        """Whether an `Engine` on this step pauses verifying drafts that do not pay (`fdecode.runtime.gate`):
        `DecodeConfig.draft_gate` with an n-gram draft. Its first-row graphs compile too (`warmup` included)."""
        return self.drafter.gated(self.config)

    def window_width(self, blocks: int) -> torch.Tensor:
        """The dynamic graph's window argument for `blocks` blocks (`window_width`), made once."""
        width = self._widths.get(blocks)
        if width is None:
            width = self._widths[blocks] = window_width(self.config, blocks)
        return width

    def _graph(self, blocks: int, plan: SamplingPlan, depth: int) -> Callable:
        """The step for a window of `blocks` blocks, a sampling plan and a depth, captured on first use."""
        key = self.graph_window(blocks)
        graph = self._graphs.get((key, plan, depth))
        if graph is None:
            graph = self._graphs[key, plan, depth] = self._capture(self._pure(key, plan, depth))
        if key is not None:
            return graph
        width = self.window_width(blocks)
        return lambda state: graph(state, width)

    def _capture(self, fn: Callable) -> Callable:
        """`fn` as the backend runs it: kept on disk where it can be (`stored_path`), else captured as usual."""
        path = self.stored_path(fn)
        if path is None:
            return capture(self.backend, fn, self.config)
        models = {"target": self.target, "draft": self.draft}  # by their names in `pure_step`'s closure
        return StoredGraph(
            fn,
            path,
            models,
            ahead=capture(self.backend, fn, self.config, guard_filter=serializable_guards(models)),
            fallback=lambda: capture(self.backend, fn, self.config),
        )

    def stored_path(self, fn: Callable) -> Path | None:
        """The file `fn`'s compiled graph is kept in (`fdecode.graphs.stored`), or None where it is not kept:
        the cache is off (`FDECODE_CACHE_DIR=off`), the backend is not Inductor, or the step is tensor-parallel."""
        folder = cache_dir()
        if folder is None or self.backend != "inductor" or getattr(self.target, "tp", None) is not None:
            return None
        return folder / f"{fn.__name__}-{graph_key(fn, self.backend)}.step"

    def _announce_compile(self, blocks: int, plan: SamplingPlan, depth: int) -> None:
        """One line on stderr before a graph's first call (its compile, or its load from disk), so a pause is
        never silent. Called once the graph is made (`_graph`), before it runs."""
        if self.backend == "eager":
            return
        windows = (
            f"one graph for every window up to {self.config.max_seq_len} tokens"
            if self.graph_window(blocks) is None
            else f"the {blocks * self.config.block_size}-token window's graph"
        )
        what = f"({self.backend}, {graph_name(plan, depth, self.config.K)} sampling plan, {windows})"
        path = getattr(self._graphs[self.graph_window(blocks), plan, depth], "path", None)  # a `StoredGraph`'s file
        if path is not None and path.exists():
            notice(f"loading the compiled decode step {what} from {path}")
            return
        stored = "" if path is None else f", then kept in {path.parent} for later processes"
        notice(
            f"compiling the decode step {what}; the first call waits for it{stored} "
            "(step.warmup() compiles every graph up front)"
        )

    def __call__(
        self, state: DecodeState, *, speculate: bool = True, depth: int | None = None
    ) -> tuple[DecodeState, StepOutput]:
        """One step. depth: how many of the window's drafts to verify, 0 .. K (None: K, or 0 where
        speculate=False); the step then proposes as many for the next window (at least one; all K for
        n-gram and recurrent drafts), so a lane commits at most depth + 1 tokens and the target runs
        depth + 1 rows: cheaper where drafts are not being accepted (`decode_step`). Every depth reads
        and writes the same state and is exact; each is a graph of its own (compiled on first use, or
        by `warmup(depths=...)`). speculate=False is depth 0: every lane commits one token, as
        target-only decoding would."""
        depth = self.check_depth(requested_depth(speculate, depth, self.config.K))
        if self._trusted.maker(state) is None:
            self.check_state(state)
        else:  # the last state this step returned: its layout is its graph's; still, it may have been consumed
            self._kv.check_returned(state)
        blocks, plan = self.config.bucket_for(state.max_position), self.plan_for(state, depth)
        return self._run(state, blocks, plan, depth=self.graph_depth(state, depth))

    def graph_depth(self, state: DecodeState, depth: int) -> int:
        """The graph a step of `depth` runs on `state`: `depth`, except where the draft sits out depth-0 steps
        (`idles_draft`, `fdecode.ops.catch_up`): the catch-up graph (`CATCH_UP`: it verifies the first row,
        feeds the draft the tokens it missed, proposes one draft) for a step that drafts after depth-0 steps
        (`state.draft_lag` > 0, or unknown), or for a depth-0 step once the draft missed `draft_catch_up` steps."""
        if not self.idles_draft:
            return depth
        lag = state.draft_lag
        if depth == 0:
            return 0 if lag is not None and lag < self.config.draft_catch_up else CATCH_UP
        return depth if lag == 0 else CATCH_UP

    @functools.cached_property  # read at every step (`check_depth`); the models never change
    def depths(self) -> tuple[int, ...]:
        """The depths this step runs (`__call__`): 0 .. K; 0 and K for recurrent (linear-attention) models."""
        k = self.config.K
        if self.config.tree:  # a tree step verifies its N nodes (`fdecode.tree`)
            return (k,)
        return (0, k) if is_hybrid(self.target) or self.drafter.recurrent(self.draft) else tuple(range(k + 1))

    def ready_depths(self, state: DecodeState) -> tuple[int, ...]:
        """The depths with a graph made in this process for `state` (its window, and a sampling plan exact for its
        lanes): a step of one of them compiles and loads nothing (an adaptive `Engine` launches no other). Under
        eager too, so that a schedule does not depend on the backend."""
        return tuple(d for d in self.depths if self._made_plans(state, d))

    def check_depth(self, depth) -> int:
        """`depth` if this step runs it (one of `depths`), else raises."""
        k = self.config.K
        if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= k:
            raise ValueError(f"depth must be an int in 0 .. K = {k}, got {depth!r}")
        if depth not in self.depths:
            runs = (
                "a tree step runs depth K"
                if self.config.tree
                else "a step of recurrent (linear-attention) models runs depth 0 or K"
            )
            raise ValueError(
                f"{runs} = {k}, got {depth} "
                f"(step.depths lists the depths a step runs: warmup(depths=step.depths) warms them all)"
            )
        return depth

    def _run(
        self, state: DecodeState, blocks: int, plan: SamplingPlan, *, quiet: bool = False, depth: int | None = None
    ) -> tuple[DecodeState, StepOutput]:
        cfg = self.config
        depth = cfg.K if depth is None else depth
        window = blocks * cfg.block_size
        name = graph_name(plan, depth, cfg.K)
        first = (window, name) not in self.plan_compile_seconds
        key = (self.graph_window(blocks), plan, depth)
        made = key in self._graphs
        graph = self._graph(blocks, plan, depth)
        if self.announce and not quiet and not made:
            self._announce_compile(blocks, plan, depth)
        extra = () if key[0] is not None else (self.window_width(blocks),)
        start = time.perf_counter()
        # A graph's first call compiles or loads it: its CPU kernels are built a few to a library.
        with torch.no_grad(), cpu.compiling() if first else contextlib.nullcontext():
            unguarded = None if first else self._trusted.call(state, key, self._graphs[key], extra)  # under no_grad
            new_state, out = graph(state) if unguarded is None else unguarded(state, *extra)
        if first:
            seconds = self.plan_compile_seconds[window, name] = time.perf_counter() - start
            self.compile_seconds[window] = self.compile_seconds.get(window, 0.0) + seconds
        new_state.record_sampling(state.lane_sampling)
        lag = state.draft_lag  # depth 0 (the draft sat out where it idles: see `graph_depth`) counts one more
        new_state.record_lag((None if lag is None else lag + 1) if depth == 0 and self.idles_draft else 0)
        self._kv.advance(state, new_state)  # the KV moved on: `state` is spent, `new_state` holds the chain
        # Every lane advances by at most W positions per step.
        new_state.bound_positions(None if state.max_position is None else state.max_position + cfg.W)
        self._trusted.made(new_state, key)
        return new_state, out

    def warmup(
        self,
        plans: Sequence[SamplingPlan] | None = None,
        *,
        progress: bool | None = None,
        depths: Sequence[int] | None = None,
    ) -> dict[int, float]:
        """Capture every window's graph for each of `plans` and `depths` now, on a throwaway all-inactive state;
        returns `compile_seconds` (per window, summed over plans). plans: None is `covering_plans` (greedy and
        the general plan, exact for any lanes: after them no batch compiles anything; a batch whose cheapest plan
        is a specialised one, such as the candidate plan of top_k <= 128, runs the general plan instead);
        `step.plans` makes the specialised graphs too, which every batch then runs where they are exact.
        depths: None is K, and 0 too for a `gated` step (n-gram drafts: the first-row graphs its Engine runs).
        progress: a tqdm bar over the (plan, window) runs (None: `self.announce`; never for eager).

        Each depth's step is then timed at the widest window, in its first plan warmed (greedy where warmed: the
        cheapest, and with a real vocabulary each timed step of another plan costs as long as one of greedy's):
        the median of `TIMED_RUNS` rounds over the depths goes in `depth_seconds`, the costs an `Engine` with
        `adaptive_depth` weighs depths by (where a depth was timed before, the least).

        After it (with the general plan among `plans`), no mix of greedy and random requests compiles anything.
        The throwaway state's KV pool goes back to the step, so the next `prefill` runs in the very addresses the
        graphs were captured with (graph replay records nothing new). With `dynamic_window` a plan compiles at its
        first window and its other windows only run (CUDA graph trees record a replay for each).
        """
        cfg = self.config
        if depths is None:
            depths = (cfg.K, 0) if self.gated else (cfg.K,)
        depths = [self.check_depth(depth) for depth in depths]
        if self.idles_draft and 0 in depths:  # the graph that ends a run of depth-0 steps
            depths.append(CATCH_UP)
        runs = [
            (blocks, plan, depth)
            for plan in (self.covering_plans if plans is None else plans)
            for depth in depths
            for blocks in cfg.bucket_blocks
        ]
        show = (self.announce if progress is None else progress) and self.backend != "eager"
        state = self.empty_state()  # one KV pool for every graph: an all-inactive step stays all-inactive
        with bar(total=len(runs), desc="fdecode: compiling", unit="window", disable=not show) as shown:
            for blocks, plan, depth in runs:
                shown.set_postfix_str(f"{graph_name(plan, depth, cfg.K)}, {blocks * cfg.block_size}-token window")
                state, _ = self._run(state, blocks, plan, quiet=True, depth=depth)
                shown.update(1)
            warmed = list(dict.fromkeys(plan for _, plan, _ in runs))
            first = next((plan for plan in warmed if not plan.random), warmed[0] if warmed else None)
            timed = list(dict.fromkeys((first, depth) for _, _, depth in runs if depth != CATCH_UP))  # depths only
            times: dict[tuple[SamplingPlan, int], list[float]] = {run: [] for run in timed}
            for _ in range(TIMED_RUNS):  # round after round of every graph: a drift of the machine's speed is shared
                for plan, depth in timed:
                    start = time.perf_counter()
                    state, out = self._run(state, cfg.bucket_blocks[-1], plan, quiet=True, depth=depth)
                    out.packed.cpu()  # waits for the step (an accelerator runs it asynchronously)
                    times[plan, depth].append(time.perf_counter() - start)
            for (_plan, depth), seconds in times.items():
                seconds = statistics.median(seconds)
                self.depth_seconds[depth] = min(seconds, self.depth_seconds.get(depth, seconds))
        return dict(self.compile_seconds)

    def _new_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A fresh target + draft KV pool (`self._kv` hands pools out and takes them back)."""
        target_kv, draft_kv = new_kv(self.target, self.draft, self.config)
        if self.backend in STATIC_KV:  # graph replay (CUDA, ACL graphs) neither copies nor re-records for them
            torch._dynamo.mark_static_address(target_kv)
            torch._dynamo.mark_static_address(draft_kv)
        return target_kv, draft_kv

    def prefill(
        self,
        prompts: Prompts,
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        max_new_tokens: int | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        ignore_eos: bool = False,
        temperature: PerPrompt = None,
        top_k: PerPrompt = None,
        top_p: PerPrompt = None,
        min_p: PerPrompt = None,
        seed: PerPrompt = None,
        concurrent: bool = False,
    ) -> DecodeState:
        """Prime a fresh state: one lane per prompt; the first new token is in `state.step_output`.

        prompts: a list of token-id lists (or 1-D tensors / arrays), or a 2-D tensor / array.
        How each prompt is decoded: `params` (one `fdecode.SamplingParams` for the call, or one per
        prompt), or the shortcuts: temperature (0 = greedy, the default), top_k (0 = off), top_p (1 =
        off), min_p (0 = off), seed (a number for the call or one per prompt; a seed for the call
        gives each prompt its own stream), max_new_tokens (None: up to max_seq_len), eos_token_id
        (None: the model's EOS ids, `config.eos_token_id`), ignore_eos. See `fdecode.params`.

        KV pools (`fdecode.state.ownership`): one prefill chain at a time. A prefill reuses the pool of
        the previous prefill's chain, whose states are refused from then on (stepping one raises), so
        `for ...: state = step.prefill(...)` runs every generation in one pool. concurrent=True starts
        a chain that runs alongside the others instead: in a pool of its own while any of its states
        is alive, which no later prefill takes over.
        """

        def build(target_kv: torch.Tensor, draft_kv: torch.Tensor) -> DecodeState:
            return prefill(
                self.target,
                self.draft,
                self.config,
                prompts,
                params=params,
                max_new_tokens=max_new_tokens,
                eos_token_id=eos_token_id,
                ignore_eos=ignore_eos,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                min_p=min_p,
                seed=seed,
                kv=(target_kv, draft_kv),
                seeds=self.seeds,
            )

        return self._kv.start(build, take_over=not concurrent)

    def prime(self, state: DecodeState, lanes: list[int], prompts: list[list[int]], **requests) -> DecodeState:
        """Write new requests into `lanes` of `state` (an `Engine`'s admission; `fdecode.prefill.prime` takes
        the keywords: block_tables, budgets, params, uploads, grammars). Consumes `state`'s KV (in place)."""
        return prime(self.target, self.draft, self.config, state, lanes, prompts, **requests)

    def empty_state(self) -> DecodeState:
        """A state with every lane inactive, in a free KV pool: what an `Engine` starts from. Its chain
        keeps the pool while any of its states is alive (no prefill takes it over)."""
        return self._kv.start(
            lambda target_kv, draft_kv: empty_state(self.target, self.draft, self.config, (target_kv, draft_kv)),
            take_over=False,
        )

    def check_state(self, state: DecodeState) -> None:
        """Host-side shape/device checks (no device sync), so a wrong state fails before the graph runs."""
        if not isinstance(state, DecodeState):
            raise TypeError(f"expected a DecodeState, got {type(state).__name__}")
        cfg = self.config
        if tuple(state.tokens.shape) != (cfg.max_batch, cfg.W):
            raise ValueError(
                f"state.tokens is {tuple(state.tokens.shape)}, this step expects [max_batch, K+1] = "
                f"[{cfg.max_batch}, {cfg.W}]: was the state made by a step with another DecodeConfig?"
            )
        want = torch.device(cfg.device)
        have = state.tokens.device
        if have.type != want.type or (want.index is not None and have.index != want.index):
            raise ValueError(f"state is on {state.tokens.device}, the step runs on {cfg.device}")
        if state.target_kv.dtype != cfg.dtype:
            raise ValueError(f"state KV dtype {state.target_kv.dtype} differs from DecodeConfig.dtype {cfg.dtype}")
        check_leaves(state, self.target, self.draft, batch=cfg.max_batch, k=cfg.K)  # the recurrent-state layout
        widths = (("history", self.drafter.history_width(cfg)), ("missed", self.drafter.missed_width(self.draft, cfg)))
        for name, width in widths:
            shape = (cfg.max_batch, width)
            if tuple(getattr(state, name).shape) != shape:
                raise ValueError(
                    f"state.{name} is {tuple(getattr(state, name).shape)}, this step's {self.draft_kind} draft holds "
                    f"{shape}: was the state made by a step with another draft or DecodeConfig?"
                )
        # After the layout (a state of another config says so first): consumed, re-primed, over another
        # step's pool, or over a pool without a ticket of it: raises.
        self._kv.check(state)

    def __repr__(self) -> str:
        cfg, t = self.config, self.target.config
        fallback = f", fallback_reason={self.fallback_reason!r}" if self.fallback_reason else ""
        return (
            f"Step(backend={self.backend!r}{fallback}, target={t.model_type} {t.num_layers}L/{t.hidden_size}H, "
            f"draft={self.draft_kind}, attention={cfg.attention!r}, K={cfg.K}, max_batch={cfg.max_batch}, max_seq_len={cfg.max_seq_len}, "
            f"block_size={cfg.block_size}, dtype={cfg.dtype}, device={cfg.device}"
            f"{f', tp={cfg.tp_size}' if cfg.tp_size > 1 else ''}"
            f"{f', packed weights: {self.packing}' if self.packing is not None else ''})"
        )


def compile(
    target,
    draft,
    config: DecodeConfig,
    *,
    fallback: bool = False,
    tp_group: torch.distributed.ProcessGroup | None = None,
    warmup: bool = False,
    announce: bool = True,
) -> Step:
    """Bind `target` and `draft` to `config` and capture the decode step.

    target: a transformers causal LM, a local checkpoint folder, or an fdecode `LlamaModel`.
    draft:  the same kinds, an fdecode `MTPHead`, or `"mtp"` for the target's own MTP head.
    The models are left as they are: `config.dtype="auto"` / `config.device=None` take the target's
    own (`step.config` holds the resolved values); the step shares each parameter that already has
    its dtype and device and converts a copy of any other (`fdecode.models.resolve.owned`).
    warmup: capture every context window's graph now (`Step.warmup`, with a progress bar) instead of
        on first use.
    announce: say on stderr (one line) when a graph compiles, and show warm-up's progress bar.
    fallback: run the best eligible backend (and say why in `step.fallback_reason`) instead of
        raising when the requested backend cannot capture this configuration.
    tp_group: the process group of a tensor-parallel step (`config.tp_size` ranks, one step per
        rank); the models are loaded whole and each rank keeps its shards (`fdecode.models.parallel`).
    """
    if not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a fdecode.DecodeConfig, got {type(config).__name__}")
    config = resolve_config(target, config)  # dtype "auto" / device None: the target's own
    unusable = device_reason(config)
    if unusable is not None:
        raise ValueError(f"device {config.device!r} cannot be used here: {unusable}")
    tp = check_group(tp_group, config.tp_size, config.device)
    if tp is not None:  # a split that cannot be made is refused before any weight is read
        check_divides(config_of(target), tp.size, what="target")
    target_model = resolve_target(target, config)
    draft_model, drafter = resolve_draft(draft, target_model, config)
    if tp is not None:
        target_model, draft_model = parallelize_pair(target_model, draft_model, drafter, tp)
    shapes = tuple((c.num_heads, c.num_kv_heads, c.head_dim) for c in (target_model.config, draft_model.kv_config))
    latent = latent_reason(target_model, draft_model)  # an MLA latent cache: the reference reads it
    kernel, attention_reason = choose_attention(config, shapes, fallback=fallback, latent=latent)
    config = dataclasses.replace(config, attention=kernel)  # before the backend: torchair's GE mode depends on it
    check_tree(target_model, draft_model, drafter, config)  # a tree these models or features cannot run
    regions = resolve_regions(config.layer_regions, target_model, draft_model, config.K)
    config = dataclasses.replace(config, layer_regions=regions)  # "auto": by the layer copies of a step
    config, backend, reason = resolve_backend(config, target_model, draft_model, drafter, fallback=fallback)
    packing = cpu.pack_linears(target_model, draft_model) if cpu.packs_weights(config, backend) else None
    if announce and packing is not None and packing.beside:
        notice(
            f"kept oneDNN's layout of the large linear weights beside them: +{packing.beside / 2**30:.2f} GiB "
            "(weights that are no checkpoint file's bytes; DecodeConfig.pack_weights=False: none)"
        )
    if announce and packing is not None and packing.written:
        notice(
            f"stored oneDNN's layout of the checkpoint's large linear weights on disk, once: "
            f"{packing.written / 2**30:.2f} GiB in {cpu.packed_folder()} (a later start maps it)"
        )
    step = Step(
        target_model,
        draft_model,
        config,
        drafter=drafter,
        backend=backend,
        fallback_reason=reason,
        attention_reason=attention_reason,
        announce=announce,
    )
    step.packing = packing  # `repr(step)` shows it
    if warmup:
        step.warmup()
    return step
