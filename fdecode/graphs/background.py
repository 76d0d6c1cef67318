"""Step graphs made on a thread of their own while the steps run (docs/design.md, "Adaptive depth and the idle
draft").

An adaptive `Engine` launches only depths whose graphs are made (`Schedule.ready_depths`), so a stream never
waits for a compile once it has begun. Without a `Step.warmup(depths=...)` call only depth K's graph exists, so
the Engine asks for the others here (`fdecode.runtime.depth_graphs`): `BackgroundGraphs.request` queues graph
runs on an all-inactive state, and one daemon thread makes them in order (compiled, or loaded from the disk
store: `GraphSet.run`'s first call), each joining the step's graphs once its first call is done. The steps go
on meanwhile at the depths already made and use each new depth from the launch after it joins. The throwaway
state holds a KV pool of the step's until its graphs are made (a second pool where an Engine holds one: its
memory is the KV cache's once more, for that long).

The thread runs at the lowest CPU priority the system grants it (nice 19 on Linux, its compiler processes
too), so on a machine whose cores the steps keep busy it compiles mostly between requests rather than
slowing the stream; a step's Python still waits for the interpreter lock at most a switch interval (5 ms).
A graph's first call holds Dynamo's compile lock (`GraphSet.run`), so a graph the main thread itself must make
(a new sampling plan or window), or any other compile, waits for the one being made here to finish; and in the
thread that asks for graphs a `torch.compile`d function called while one is being traced here runs as plain
PyTorch (`_tolerate_traces_elsewhere`): another thread calling one then would meet Dynamo's error.

`FDECODE_BACKGROUND_GRAPHS=0` turns it off (the test suite does, but for its tests of it): an adaptive Engine
then chooses among the depths made by `warmup` alone.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence

from fdecode.graphs.graph_key import GraphKey
from fdecode.graphs.trusted import TrustedStates
from fdecode.progress import notice

ENV = "FDECODE_BACKGROUND_GRAPHS"


_SETS: weakref.WeakSet = weakref.WeakSet()  # every `BackgroundGraphs` alive (`wait_all`)
_EXITING = threading.Event()


def _finish_at_exit() -> None:
    """At the interpreter's exit: no graph starts any more, and the one being made is finished first. A daemon
    thread left inside a compile while the interpreter tears down can abort the process ("terminate called
    without an active exception"); waiting costs the exit at most one graph's compile. Run among the
    interpreter's thread-exit calls where it has them, registered after (so run before) the shutdown of the
    compile's worker pools (`concurrent.futures`), else at `atexit`."""
    _EXITING.set()
    for graphs in list(_SETS):
        thread = graphs._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join()


def wait_all(timeout: float | None = None) -> bool:
    """Wait until no `BackgroundGraphs` of the process has graphs to make: before timing anything (a benchmark's
    rounds after its warm-up), so no compile runs beside them. False where `timeout` seconds passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for graphs in list(_SETS):
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        if not graphs.wait(left):
            return False
    return True


_HOOKED: list[bool] = []


def _hook_exit() -> None:
    """Register `_finish_at_exit` once, when the first thread starts (torch has set its pools' exit calls up)."""
    if not _HOOKED:
        _HOOKED.append(True)
        register = getattr(threading, "_register_atexit", None)
        try:
            register(_finish_at_exit) if register is not None else atexit.register(_finish_at_exit)
        except RuntimeError:  # the interpreter is already exiting
            pass


def enabled() -> bool:
    """Whether graphs may be made in the background (`FDECODE_BACKGROUND_GRAPHS`, on unless "0")."""
    return os.environ.get(ENV, "1") != "0"


def _lowest_priority() -> None:
    """This thread (and the compiler processes it starts) at the lowest CPU priority, where the system allows."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # Linux: a thread's own nice value
    except (AttributeError, OSError):
        pass


def _tolerate_traces_elsewhere() -> None:
    """In the calling thread (the one that asks for graphs, and runs the steps): Dynamo's flag that an FX trace
    is under way is the process's, not the thread's, so a function compiled with `torch.compile` called here
    while the background thread traces a graph (the caller's own model, a baseline) would raise "using FX to
    symbolically trace a dynamo-optimized function". Dynamo's documented alternative, set for this thread
    (its config overrides are per thread), runs such a call as plain PyTorch instead: right, only not compiled,
    for that call. Other threads keep Dynamo's default."""
    import torch._dynamo.config as dynamo_config

    dynamo_config.error_on_nested_fx_trace = False


class BackgroundGraphs:
    """Makes a `GraphSet`'s graphs on one daemon thread, in the order asked (`request`).

    made: the keys made here, in order; failed: key -> the error its first call raised (the graph is then left
    to the main thread, which meets the same error only where it runs that graph)."""

    def __init__(self, graph_set) -> None:
        self.graph_set = graph_set
        self.made: list[GraphKey] = []
        self.failed: dict[GraphKey, BaseException] = {}
        self._queue: deque = deque()  # (state, [(blocks, key), ...]) still to make
        self._asked: set[GraphKey] = set()
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None
        _SETS.add(self)

    def request(self, runs: Sequence[tuple[int, GraphKey]], make_state: Callable[[], object]) -> tuple[GraphKey, ...]:
        """Queue `runs` ((window in blocks, key) each) not made nor asked for yet, to be made in that order on the
        state `make_state()` returns (called here, only where something is queued: all-inactive, so its steps
        stay so; its KV pool goes back to the step once they are done: `Step.empty_state`). Returns the keys
        queued."""
        graphs = self.graph_set.graphs
        runs = [(blocks, key) for blocks, key in runs if key not in graphs and key not in self._asked]
        if not runs:
            return ()
        state = make_state()
        _tolerate_traces_elsewhere()
        with self._idle:
            self._asked.update(key for _, key in runs)
            self._queue.append((state, runs))
            if self._thread is None or not self._thread.is_alive():
                _hook_exit()
                self._thread = threading.Thread(target=self._work, name="fdecode-graphs", daemon=True)
                self._thread.start()
        return tuple(key for _, key in runs)

    @property
    def busy(self) -> bool:
        """Whether graphs asked for are still being made."""
        with self._idle:
            return bool(self._queue) or (self._thread is not None and self._thread.is_alive())

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every graph asked for is made (or failed); False where `timeout` seconds passed first."""
        with self._idle:  # (a thread that died of an error the graphs' own handling let through counts as done)
            return self._idle.wait_for(self._done, timeout)

    def _done(self) -> bool:
        return not self._queue or self._thread is None or not self._thread.is_alive()

    def _work(self) -> None:
        _lowest_priority()
        while True:
            with self._idle:
                if not self._queue:
                    self._thread = None
                    self._idle.notify_all()
                    return
                state, runs = self._queue[0]
            try:
                self._make(state, runs)
            finally:
                with self._idle:
                    self._queue.popleft()

    def _make(self, state, runs) -> None:
        for blocks, key in runs:
            if key in self.graph_set.graphs or _EXITING.is_set():
                continue
            try:  # a fresh trust: the throwaway state is no chain of the Step's
                state, _ = self.graph_set.run(state, blocks, key, trusted=TrustedStates(), quiet=True)
                self.made.append(key)
            except Exception as error:  # left to the main thread, which meets it only where it runs the graph
                self.failed[key] = error
                if not _EXITING.is_set():  # (at exit a compile may find its pools shut: nothing to say)
                    notice(
                        f"could not make the step graph {key.name(self.graph_set.config.K)} in the background "
                        f"({type(error).__name__}: {error}); an Engine goes on without it"
                    )

    def __repr__(self) -> str:
        names = ", ".join(key.name(self.graph_set.config.K) for key in self.made)
        return (
            f"BackgroundGraphs(made=[{names}], queued={sum(len(r) for _, r in self._queue)}, failed={len(self.failed)})"
        )
