"""`GraphSet`: a Step's compiled graphs, one per `GraphKey`, captured on first use (docs/design.md, "Backends
and kernels").

It owns what making a graph takes: the capture by the chosen backend (`fdecode.graphs.backends.capture`), the
disk store of compiled Inductor graphs (`fdecode.graphs.stored`), the one line on stderr that says a graph
compiles or loads, and the seconds each first call took (compile included). Where one graph serves every
window of 2 blocks or more (`dynamic_window`), its key's window is None and it takes the window as a
[blocks, 0] argument (`fdecode.graphs.pure.window_width`). Which key a step runs is the schedule's choice
(`fdecode.graphs.schedule`); a run of a key's graph is `run`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

import torch

from fdecode.backends import cpu
from fdecode.config import DecodeConfig
from fdecode.graphs.backends import DYNAMIC_WINDOW, STATIC_KV, capture
from fdecode.graphs.background import BackgroundGraphs
from fdecode.graphs.graph_key import GraphKey
from fdecode.graphs.pure import pure_step, window_width
from fdecode.graphs.stored import StoredGraph, cache_dir, graph_key, serializable_guards
from fdecode.graphs.trusted import TrustedStates
from fdecode.prefill import new_kv
from fdecode.progress import notice
from fdecode.state import DecodeState, StepOutput


def compile_lock():
    """The lock a graph's first call holds: Dynamo's own around every frame it compiles, so that a graph made on
    another thread (`fdecode.graphs.background`) never overlaps any other compile in the process (Inductor's
    compile keeps class-level state: two at once fail), whoever started it; a lock of fdecode's where Dynamo is
    not loaded (the eager backend: nothing compiles) or has none."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    return getattr(convert_frame, "compile_lock", None) or _OWN_LOCK


_OWN_LOCK = threading.RLock()


class GraphSet:
    """The step graphs of one Step, by `GraphKey`; each captured (or loaded from disk) on first use.

    Attributes: `dynamic_window` (one graph per plan and depth serves every window of 2+ blocks),
    `compile_seconds` (per window in tokens: first calls of its graphs, compile included, summed),
    `plan_compile_seconds` ((window in tokens, graph name) -> seconds), `announce` (say on stderr when a
    graph compiles), `background` (graphs made on a thread of their own, `fdecode.graphs.background`)."""

    def __init__(self, target, draft, config: DecodeConfig, *, backend: str, announce: bool = True):
        self.target = target
        self.draft = draft
        self.config = config
        self.backend = backend
        self.announce = announce
        # One graph per plan for every window of 2+ blocks, where the backend can and two such windows exist.
        self.dynamic_window = (
            config.dynamic_window and backend in DYNAMIC_WINDOW and sum(n >= 2 for n in config.bucket_blocks) >= 2
        )
        self.compile_seconds: dict[int, float] = {}
        self.plan_compile_seconds: dict[tuple[int, str], float] = {}
        self._graphs: dict[GraphKey, Callable] = {}  # replaced, never changed in place (`run`)
        self.background = BackgroundGraphs(self)  # graphs made on a thread of their own (an adaptive Engine's)
        self._widths: dict[int, torch.Tensor] = {}  # blocks -> [blocks, 0], the dynamic graph's window argument
        self._keys: dict[tuple, GraphKey] = {}  # each key made once: a step asks for one at every call

    @property
    def graphs(self) -> Mapping[GraphKey, Callable]:
        """The graphs made so far, by key: a read-only view (a `StoredGraph` where one was loaded from or
        written to the disk store)."""
        return MappingProxyType(self._graphs)

    def window_of(self, blocks: int) -> int | None:
        """Which graph runs a window of `blocks` blocks: None for the graph of every window (`dynamic_window`),
        else `blocks` (a graph of its own)."""
        return None if self.dynamic_window and blocks >= 2 else blocks

    def key(self, blocks: int, plan, depth: int, catch_up: bool = False) -> GraphKey:
        """The key of the graph that runs a window of `blocks` blocks in `plan` at `depth`."""
        fields = (self.window_of(blocks), plan, depth, catch_up)
        key = self._keys.get(fields)
        if key is None:
            key = self._keys[fields] = GraphKey(*fields)
        return key

    def window_width(self, blocks: int) -> torch.Tensor:
        """The dynamic graph's window argument for `blocks` blocks (`window_width`), made once."""
        width = self._widths.get(blocks)
        if width is None:
            width = self._widths[blocks] = window_width(self.config, blocks)
        return width

    def run(
        self, state: DecodeState, blocks: int, key: GraphKey, *, trusted: TrustedStates, quiet: bool = False
    ) -> tuple[DecodeState, StepOutput]:
        """Run `key`'s graph (captured on first use) on `state` over a window of `blocks` blocks. A state
        `trusted` knows skips the graph's guard check (`fdecode.graphs.trusted`). quiet: no announcement."""
        window = blocks * self.config.block_size
        name = key.name(self.config.K)
        first = (window, name) not in self.plan_compile_seconds
        graph = self._graphs.get(key)
        extra = () if key.window is not None else (self.window_width(blocks),)
        if graph is not None and first:  # a made graph's first call at another window: timed, nothing made
            start = time.perf_counter()
            with torch.no_grad(), cpu.compiling():
                new_state, out = graph(state, *extra)
            self._first_call(window, name, time.perf_counter() - start)
            return new_state, out
        if graph is not None:  # no_grad's effect without its context manager's Python layers
            grad = torch.is_grad_enabled()
            torch._C._set_grad_enabled(False)
            try:
                unguarded = trusted.call(state, key, graph, extra)  # (its first call checks guards: no grad)
                return graph(state, *extra) if unguarded is None else unguarded(state, *extra)
            finally:
                torch._C._set_grad_enabled(grad)
        # A graph's first call compiles or loads it: one at a time in the process, whichever thread asks
        # (`fdecode.graphs.background` makes some on a thread of its own); its CPU kernels are built a few to a
        # library. The graph joins `graphs` once that call is done, so no other thread runs it before.
        with compile_lock(), torch.no_grad(), cpu.compiling():
            graph = self._graphs.get(key)
            if graph is not None:  # made by another thread while this one waited
                return self.run(state, blocks, key, trusted=trusted, quiet=quiet)
            graph = self._capture(pure_step(self.target, self.draft, self.config, key))
            if self.announce and not quiet:
                self._announce(blocks, key, graph)
            start = time.perf_counter()
            new_state, out = graph(state, *extra)
            self._first_call(window, name, time.perf_counter() - start)
            self._graphs = {**self._graphs, key: graph}  # a new dict: another thread may be reading the old
        return new_state, out

    def make(self, state: DecodeState, blocks: int, key: GraphKey) -> DecodeState | None:
        """Make `key`'s graph by its first call on `state` (all-inactive: a throwaway), unless it is made; the
        state after, or None where it was made already (`fdecode.graphs.background`: never a made graph's run,
        whose flat call the Engine's thread may be learning)."""
        with compile_lock():
            if key in self._graphs:
                return None
            return self.run(state, blocks, key, trusted=TrustedStates(), quiet=True)[0]

    def _first_call(self, window: int, name: str, seconds: float) -> None:
        self.plan_compile_seconds[window, name] = seconds
        self.compile_seconds[window] = self.compile_seconds.get(window, 0.0) + seconds

    def new_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A fresh target + draft KV pool (the Step's `KVPools` hands pools out and takes them back), at
        addresses graph replay keeps (`STATIC_KV` backends)."""
        target_kv, draft_kv = new_kv(self.target, self.draft, self.config)
        if self.backend in STATIC_KV:  # graph replay (CUDA, ACL graphs) neither copies nor re-records for them
            torch._dynamo.mark_static_address(target_kv)
            torch._dynamo.mark_static_address(draft_kv)
        return target_kv, draft_kv

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

    def _announce(self, blocks: int, key: GraphKey, graph: Callable) -> None:
        """One line on stderr before a graph's first call (its compile, or its load from disk), so a pause is
        never silent. Called once the graph is made, before it runs."""
        if self.backend == "eager":
            return
        windows = (
            f"one graph for every window up to {self.config.max_seq_len} tokens"
            if key.window is None
            else f"the {blocks * self.config.block_size}-token window's graph"
        )
        what = f"({self.backend}, {key.name(self.config.K)} sampling plan, {windows})"
        path = getattr(graph, "path", None)  # a `StoredGraph`'s file
        if path is not None and path.exists():
            notice(f"loading the compiled decode step {what} from {path}")
            return
        stored = "" if path is None else f", then kept in {path.parent} for later processes"
        notice(
            f"compiling the decode step {what}; the first call waits for it{stored} "
            "(step.warmup() compiles every graph up front)"
        )
