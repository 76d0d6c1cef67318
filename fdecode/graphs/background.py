"""Step graphs made on a thread of their own while the steps run (docs/design.md, "Adaptive depth and the idle
draft").

An adaptive `Engine` launches only depths whose graphs are made (`Schedule.ready_depths`), so a stream never waits for
a compile once it has begun. Without a `Step.warmup(depths=...)` call only one depth's graph exists
(`Step.first_depth`'s), so the Engine asks for the others here (`fdecode.runtime.depth_graphs`):
`BackgroundGraphs.request` queues graph runs on an all-inactive state, and one daemon thread makes them in order
(compiled, or loaded from the disk store: `GraphSet.run`'s first call), each joining the step's graphs once its first
call is done. The steps go on meanwhile at the depths already made and use each new depth from the launch after it
joins. All are made on one throwaway state, which holds a KV pool of the step's until the queue is done (a second pool
where an Engine holds one: the KV cache's memory once more, for that long).

The thread runs at the lowest CPU priority the system grants it (nice 19 on Linux), and builds its graphs' C++ kernels
itself rather than in Inductor's worker pool (`_compilers_at_this_priority`), so the compiler processes inherit that
priority too; on a machine whose cores the steps keep busy it compiles mostly between requests. A step still waits
where the compile holds the interpreter lock, now and then for seconds (docs/design.md gives the cost measured). A
graph's first call holds Dynamo's compile lock (`GraphSet.run`), so a graph the main thread itself must make (a new
sampling plan or window), or any other compile, waits for the one being made here to finish; and in the thread that
asks for graphs a `torch.compile`d function called while one is being traced here runs as plain PyTorch
(`_tolerate_traces_elsewhere`): another thread calling one then would meet Dynamo's error.

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
    """This thread (and compiler processes it starts itself) at the lowest CPU priority, where the system allows."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # Linux: a thread's own nice value
    except (AttributeError, OSError):
        pass


def _compilers_at_this_priority():
    """While a graph is made here: Inductor builds its C++ kernels in this thread, one compiler process at a time,
    not in its worker pool, so the compiler processes inherit this thread's lowest priority. The pool's threads
    (and the processes they start) run at the priority of the thread that first compiled, often the Engine's,
    where a compile for the background would take a core from the steps at their own priority. Inductor's settings
    are the thread's own in torch 2.13 (context variables); where a torch keeps them for the process, a graph's
    first call holds Dynamo's compile lock (`GraphSet.run`), so no other compile of fdecode's runs meanwhile.
    `compile_threads` is no part of Inductor's cache keys."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch(compile_threads=1)


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
    """Makes a `GraphSet`'s graphs on one daemon thread, in the order asked (`request`), all on one throwaway
    state (so one KV pool at most, for as long as the thread has graphs to make).

    made: the keys made here, in order; failed: key -> why its first call failed (the graph is then left to the
    main thread, which meets the same error only where it runs that graph)."""

    def __init__(self, graph_set) -> None:
        self.graph_set = graph_set
        self.made: list[GraphKey] = []
        self.failed: dict[GraphKey, str] = {}
        self._pending: deque[tuple[int, GraphKey]] = deque()  # (window in blocks, key) still to make
        self._state = None  # the throwaway state they are made on, while there are any
        self._asked: set[GraphKey] = set()
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None
        _SETS.add(self)

    def request(self, runs: Sequence[tuple[int, GraphKey]], make_state: Callable[[], object]) -> tuple[GraphKey, ...]:
        """Queue `runs` ((window in blocks, key) each) not made nor asked for yet, to be made in that order on the
        state `make_state()` returns (called here, in the asking thread, where the thread has none: all-inactive,
        so its steps stay so; its KV pool goes back to the step once the queue is done: `Step.empty_state`).
        Returns the keys queued."""
        graphs = self.graph_set.graphs
        runs = [(blocks, key) for blocks, key in runs if key not in graphs and key not in self._asked]
        if not runs:
            return ()
        _tolerate_traces_elsewhere()
        with self._idle:
            if self._state is None:
                self._state = make_state()
            self._asked.update(key for _, key in runs)
            self._pending.extend(runs)
            if self._thread is None or not self._thread.is_alive():
                _hook_exit()
                self._thread = threading.Thread(target=self._work, name="fdecode-graphs", daemon=True)
                self._thread.start()
        return tuple(key for _, key in runs)

    @property
    def busy(self) -> bool:
        """Whether graphs asked for are still being made."""
        with self._idle:
            return not self._done()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every graph asked for is made (or failed); False where `timeout` seconds passed first."""
        with self._idle:
            return self._idle.wait_for(self._done, timeout)

    def _done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def _work(self) -> None:
        try:
            _lowest_priority()
            while True:
                with self._idle:
                    if not self._pending or _EXITING.is_set():
                        return
                    blocks, key = self._pending.popleft()
                    state = self._state
                state = self._make(state, blocks, key)
                with self._idle:
                    self._state = state
        finally:  # (however it ends: an error its own handling let through too)
            with self._idle:
                self._pending.clear()
                self._thread = self._state = None
                self._idle.notify_all()

    def _make(self, state, blocks: int, key: GraphKey):
        """The state after `key`'s graph's first call on `state` (unless another thread made it meanwhile)."""
        try:
            with _compilers_at_this_priority():
                after = self.graph_set.make(state, blocks, key)
        except Exception as error:  # left to the main thread, which meets it only where it runs the graph
            self.failed[key] = f"{type(error).__name__}: {error}"  # (not the error: its frames hold the state)
            if not _EXITING.is_set():  # (at exit a compile may find its pools shut: nothing to say)
                notice(
                    f"could not make the step graph {key.name(self.graph_set.config.K)} in the background "
                    f"({self.failed[key]}); an Engine goes on without it"
                )
            return state
        if after is None:
            return state
        self.made.append(key)
        return after

    def __repr__(self) -> str:
        names = ", ".join(key.name(self.graph_set.config.K) for key in self.made)
        with self._idle:
            queued = len(self._pending)
        return f"BackgroundGraphs(made=[{names}], queued={queued}, failed={len(self.failed)})"
