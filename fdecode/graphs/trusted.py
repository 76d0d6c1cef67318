"""Step graphs called without Dynamo's guard check where the Step already knows it passes (docs/host-time.md).

A stored Inductor graph (`fdecode.graphs.stored`, an `aot_compile`d function) checks its guards at every call:
the shapes, strides, dtypes and devices of every leaf of the state, a fresh object each step. The Step knows
more than the guards need: a state it returned itself has the layout of the graph that made it, the same at
every step. So the guards of graph H on a state made by graph G are checked once (explicitly, before the
call); where they pass, every later state made by G runs H's compiled function directly (`TrustedStates`).

Only the state the Step returned last is trusted, and for as long as no other is returned. Any other state
(prefilled, primed, `state.replace`d, built by hand, an older one) goes through `Step.check_state` and the
guards as before, so a state of another layout is still refused before anything runs. A graph that is not
stored (the cache off, other backends, CUDA graphs) keeps its guards.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable

from fdecode.state import DecodeState


class TrustedStates:
    """Which graph made the Step's last state, and the unguarded calls whose guards passed once.

    A graph is named by the Step's key of it (window, plan, depth)."""

    def __init__(self) -> None:
        self._last: tuple[weakref.ref[DecodeState], Hashable] | None = None
        self._calls: dict[tuple[Hashable, Hashable], Callable] = {}  # (made by, runs) -> unguarded call

    def maker(self, state: DecodeState) -> Hashable | None:
        """The graph that made `state` if it is the Step's last returned state, else None (untrusted)."""
        last = self._last
        return last[1] if last is not None and last[0]() is state else None

    def made(self, state: DecodeState, graph: Hashable) -> None:
        """`state` is the Step's new last state, made by `graph`."""
        self._last = (weakref.ref(state), graph)

    def call(self, state: DecodeState, key: Hashable, graph: Callable, extra: tuple) -> Callable | None:
        """The call of `graph` (the Step's graph `key`) that skips its guards for `state`, or None: `state` is
        untrusted, or `graph` has no unguarded form (`StoredGraph.unguarded`), or its guards refuse `state`."""
        maker = self.maker(state)
        if maker is None:
            return None
        fast = self._calls.get((maker, key))
        if fast is None:
            unguarded = getattr(graph, "unguarded", None)
            fast = None if unguarded is None else unguarded(state, *extra)
            if fast is None:
                return None
            self._calls[maker, key] = fast
        return fast
