"""Who may use a step's KV pools: host-side tickets, checked by storage, never lost by pytree use
(docs/design.md, "KV pool ownership").

A `Step` owns its KV pools (`KVPools`); every state over a pool belongs to one *chain*: the states a
prefill (or `empty_state`) starts and the states its steps return. The step finds a state's pool from
the storage of its KV leaves (`pool_of`); a state carries a `KVTicket`, a tensor-free host token for
"the transition that made me", which `state.replace`, `clone`, `tree_map` (the ticket is in the pytree
context) and `copy` pass on. `KVPools.check` refuses on the host, before a graph runs, a state that
may read overwritten KV: one carrying a ticket a step spent (donation) or a later plain `prefill`
spent taking over its chain's pool, and one over a pool without a ticket of that pool
(`dataclasses.replace`, `DecodeState(...)` of a pool's KV, a `replace` mixing two pools' KV), and
one over another step's pool (stepping it would write KV that step's chains read).
`Step.empty_state()` and `prefill(..., concurrent=True)` start side-by-side chains no prefill
takes over. A state whose KV is no pool's (a `clone`, a `deepcopy`) is its own chain.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch._subclasses.fake_tensor import FakeTensor

if TYPE_CHECKING:
    from fdecode.state.decode_state import DecodeState

CONSUMED = (
    "this DecodeState was already passed to a step (or a state sharing its KV was: a replace or "
    "pytree copy of it), which updated the KV in place (donation contract): step the state that "
    "call returned, or keep a copy with state.clone() beforehand"
)
REPRIMED = (
    "this DecodeState's KV pool was taken over by a later step.prefill (one prefill chain at a time: "
    "a prefill reuses the previous prefill's pool, so its KV is overwritten); to run chains side by "
    "side use step.prefill(..., concurrent=True) or an fdecode.Engine"
)

OTHER_STEP = (
    "this DecodeState is over another step's KV pool (it came from another compiled step's prefill, "
    "empty_state or calls): step it with the step that made it, or take state.clone() to move a copy "
    "of it off that pool"
)


class KVTicket:
    """Host-side token of the transition that made a state: shared by the states over the same KV
    content (its `replace`d and pytree-rebuilt copies), spent when one of them is stepped or its
    pool is re-primed. `pool` is the step's pool the state is over (None: KV of its own)."""

    __slots__ = ("pool", "spent", "__weakref__")

    def __init__(self, pool: KVPool | None = None, spent: str | None = None) -> None:
        self.pool = pool
        self.spent = spent  # why states carrying this ticket may no longer be stepped, None: live

    def detached(self) -> KVTicket:
        """A ticket for a copy of the KV (same content, other storage): not the pool's, equally spent."""
        return KVTicket(None, self.spent)

    def __copy__(self) -> KVTicket:
        return self  # a shallow copy of a state shares its KV: and so its ticket

    def __deepcopy__(self, memo) -> KVTicket:
        return self.detached()  # a deep copy of a state copies its KV: a chain of its own

    def __reduce__(self):
        return KVTicket, (None, self.spent)

    def __repr__(self) -> str:
        where = "pool" if self.pool is not None else "own KV"
        return f"KVTicket({where}{', spent' if self.spent else ''})"


TICKET = "_kv_ticket"  # where a state holds its ticket: not a field, so not a pytree leaf, never seen by a graph


def set_ticket(state: DecodeState, ticket: KVTicket | None) -> None:
    """Make `ticket` `state`'s `kv_ticket`. Ownership is the one host-side thing a state holds, and only this
    package sets it: the pools (a state they hand out or step), `replace`, `clone` and pytree rebuilds."""
    object.__setattr__(state, TICKET, ticket)


def storage_of(t: object) -> int | None:
    """The address of `t`'s storage, which every view of it shares; None where there is none to compare
    (not a tensor, a meta or fake tensor)."""
    if not isinstance(t, torch.Tensor) or isinstance(t, FakeTensor) or t.device.type == "meta":
        return None
    return t.untyped_storage().data_ptr()


class KVPool:
    """A target + draft KV pair and the chain that currently owns it (by its live ticket)."""

    def __init__(self, target_kv: torch.Tensor, draft_kv: torch.Tensor) -> None:
        self.target_kv, self.draft_kv = target_kv, draft_kv
        self.storages = (storage_of(target_kv), storage_of(draft_kv))
        self.pinned = False  # the owning chain came from empty_state / a concurrent prefill
        self._current: weakref.ref[KVTicket] | None = None

    @property
    def holder(self) -> KVTicket | None:
        """The owning chain's current ticket, None when no live state carries it (the pool is free)."""
        ticket = None if self._current is None else self._current()
        return None if ticket is None or ticket.spent else ticket

    @property
    def free(self) -> bool:
        return self.holder is None

    def issue(self) -> KVTicket:
        """A ticket for the next state of the owning chain; it becomes the pool's current one."""
        ticket = KVTicket(self)
        self._current = weakref.ref(ticket)
        return ticket


class KVPools:
    """The KV pools of one step and the rules above. `allocate()` makes a fresh (target, draft) pair."""

    def __init__(self, allocate: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._allocate = allocate
        self.pools: list[KVPool] = []

    def start(self, build: Callable[[torch.Tensor, torch.Tensor], DecodeState], *, take_over: bool) -> DecodeState:
        """The state `build(target_kv, draft_kv)` makes over a pool, as the first of a new chain.

        take_over (a plain prefill): the pool of the live chain the previous plain prefill started, if
        any, whose states are refused from then on; else (and for empty_state / concurrent prefills,
        whose chains are never taken over) a free pool, else a new one.
        """
        victim = next((p for p in self.pools if not p.pinned and not p.free), None) if take_over else None
        stale = None if victim is None else victim.holder  # held: the chain's states may go meanwhile
        pool = victim if victim is not None else self._free_pool()
        try:
            state = build(pool.target_kv, pool.draft_kv)
        finally:  # even when `build` failed part-way: the old chain's KV may be overwritten
            if stale is not None:
                stale.spent = REPRIMED
        pool.pinned = not take_over
        set_ticket(state, pool.issue())
        return state

    def _free_pool(self) -> KVPool:
        free = [pool for pool in self.pools if pool.free]
        if free:  # keep the oldest free pool, drop the others
            self.pools = [pool for pool in self.pools if pool is free[0] or not pool.free]
            return free[0]
        pool = KVPool(*self._allocate())
        self.pools.append(pool)
        return pool

    def pool_of(self, state: DecodeState) -> KVPool | None:
        """The pool `state`'s KV leaves are in (by storage), None when they are no pool's; raises when
        its target and draft KV are in different pools."""
        target, draft = storage_of(state.target_kv), storage_of(state.draft_kv)
        hit = [p for p in self.pools if target == p.storages[0] or draft == p.storages[1]]
        if not hit:  # (a pool's storages are addresses, never None)
            return None
        pool = hit[0]
        if len(hit) > 1 or (target, draft) != pool.storages:
            raise ValueError(
                "this DecodeState's target and draft KV are not one pool's (a replace swapped one of them?): "
                "build states over a pool with state.replace(...) of a state of that pool, or clone() the state"
            )
        return pool

    def check(self, state: DecodeState) -> None:
        """Raise unless `state` may be stepped: its chain is current and nothing wrote its pool since."""
        pool, ticket = self.pool_of(state), state.kv_ticket
        if pool is None:
            if ticket is not None and ticket.pool is not None:
                if (storage_of(state.target_kv), storage_of(state.draft_kv)) == ticket.pool.storages:
                    raise ValueError(OTHER_STEP)
                ticket = ticket.detached()  # a copy of a pool state's KV: a chain of its own
                set_ticket(state, ticket)
        elif ticket is None or ticket.pool is not pool:
            raise ValueError(
                "this DecodeState is over the step's KV pool but carries no ticket of it (made by "
                "dataclasses.replace or DecodeState(...)?), so nothing says which chain's KV it sees: "
                "build states from a state with state.replace(...) (or a pytree map), which keeps it"
            )
        if ticket is not None and ticket.spent:
            raise ValueError(ticket.spent)

    @staticmethod
    def check_returned(state: DecodeState) -> None:
        """`check` for the state the step returned last (`fdecode.graphs.trusted`): its KV leaves are the ones its
        graph wrote, over its predecessor's KV (checked then), under the ticket `advance` issued; only that
        ticket can have gone stale since (a later prefill took the pool over), so only it is read."""
        ticket = state.kv_ticket
        if ticket is not None and ticket.spent:
            raise ValueError(ticket.spent)

    def advance(self, state: DecodeState, new_state: DecodeState) -> None:
        """After a step: `state`'s ticket is spent, `new_state` (over the same KV) carries the next one."""
        ticket = state.kv_ticket
        pool = None if ticket is None else ticket.pool
        if ticket is None:
            ticket = KVTicket()
            set_ticket(state, ticket)
        ticket.spent = CONSUMED
        set_ticket(new_state, KVTicket() if pool is None else pool.issue())
