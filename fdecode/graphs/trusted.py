"""Step graphs called without Dynamo's guard check where the Step already knows it passes (docs/host-time.md).

A stored Inductor graph (`fdecode.graphs.stored`, an `aot_compile`d function) checks its guards at every call:
the shapes, strides, dtypes and devices of every leaf of the state, a fresh object each step. The Step knows
more than the guards need: a state it returned itself has the layout of the graph that made it, the same at
every step. So the guards of graph H on a state made by graph G are checked once (explicitly, before the
call); where they pass, every later state made by G runs H's compiled function directly (`TrustedStates`).

Only the state the Step returned last is trusted, and for as long as no other is returned; and a state derived
from it that keeps its KV chain (the same `kv_ticket` and the very KV tensors: `state.replace` of other leaves)
and whose every other leaf is that state's own or one of the same layout (type, shape, strides, storage offset, dtype,
device, requires_grad): what an `Engine` steps after growing a lane's block table. Any other state (prefilled,
primed, built by hand, an older one, a leaf of another layout) goes through `Step.check_state`, so a state of
another layout is still refused before anything runs; then the graph's guards are checked for it alone and, where
they pass, the graph is called as for a trusted state (not through Dynamo's bytecode: the first step after each
prefill or admission costs one guard check more than a trusted one), else through Dynamo as before. A graph that
is not stored (the cache off, other backends, CUDA graphs) keeps its guards.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable

import torch

from fdecode.state import DecodeState
from fdecode.state.decode_state import LEAVES, leaves_of

KV = tuple(LEAVES.index(name) for name in ("target_kv", "draft_kv"))  # the pool's: the very tensors, not copies


def same_layout(a: object, b: object) -> bool:
    """Whether two leaves would pass the same tensor guards: the same object, or tensors of one layout."""
    if a is b:
        return True
    return (
        type(a) is type(b)
        and isinstance(a, torch.Tensor)
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.storage_offset() == b.storage_offset()
        and a.dtype == b.dtype
        and a.device == b.device
        and a.requires_grad == b.requires_grad
    )


class TrustedStates:
    """Which graph made the Step's last state, and the unguarded calls whose guards passed once.

    A graph is named by the Step's key of it (window, plan, depth)."""

    def __init__(self) -> None:
        self._last: tuple[weakref.ref[DecodeState], Hashable] | None = None
        self._leaves: tuple = ()  # the last state's leaves (held until the next state: one state's tensors)
        # Its KV chain's ticket, held weakly: a pool whose chain no state holds any more is free (`KVPool.free`).
        self._ticket: weakref.ref | None = None
        self._calls: dict[tuple[Hashable, Hashable], Callable] = {}  # (made by, runs) -> unguarded call

    def maker(self, state: DecodeState) -> Hashable | None:
        """The graph that made `state` if it is the Step's last returned state or derived from it keeping its KV
        chain and its leaves' layout (module docstring), else None (untrusted)."""
        last = self._last
        if last is None:
            return None
        if last[0]() is state:
            return last[1]
        ticket = None if self._ticket is None else self._ticket()
        if not isinstance(state, DecodeState) or ticket is None or state.kv_ticket is not ticket:
            return None
        leaves = leaves_of(state)
        if any(leaves[i] is not self._leaves[i] for i in KV):  # a copy of the KV is a chain of its own
            return None
        return last[1] if all(same_layout(new, old) for new, old in zip(leaves, self._leaves)) else None

    def made(self, state: DecodeState, graph: Hashable) -> None:
        """`state` is the Step's new last state, made by `graph`."""
        self._last = (weakref.ref(state), graph)
        self._leaves = leaves_of(state)
        self._ticket = None if state.kv_ticket is None else weakref.ref(state.kv_ticket)

    def call(self, state: DecodeState, key: Hashable, graph: Callable, extra: tuple) -> Callable | None:
        """The call of `graph` (the Step's graph `key`) that skips its guards for `state`, or None: `graph` has no
        unguarded form (`StoredGraph.unguarded`), or its guards refuse `state`. For an untrusted state the guards
        are checked now, for it alone; for a trusted one once per (graph that made it, `key`)."""
        maker = self.maker(state)
        if maker is None:  # a state of a layout not known yet: its guards checked now, for it alone
            unguarded = getattr(graph, "unguarded", None)
            return None if unguarded is None else unguarded(state, *extra)
        fast = self._calls.get((maker, key))
        if fast is None:
            unguarded = getattr(graph, "unguarded", None)
            fast = None if unguarded is None else unguarded(state, *extra)
            if fast is None:
                return None
            self._calls[maker, key] = fast
        return fast
