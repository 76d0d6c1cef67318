"""`Chains`: the states a Step lets in and hands out, over its KV pools (docs/design.md, "KV pool ownership").

Every state a Step runs belongs to a chain over one of its KV pools (`fdecode.state.ownership.KVPools`): a
prefill or `empty_state` starts one (`start`), each step moves it on (`advance`: the input's ticket spent, the
new state's issued). Before a step runs, `check` refuses a state of another layout (`fdecode.state.checks`) or
one that may read overwritten KV; the state the Step returned last, whose layout its graph fixed, is only
checked for a spent ticket and skips its graph's guard check too (`fdecode.graphs.trusted.TrustedStates`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

import torch

from fdecode.config import DecodeConfig
from fdecode.graphs.trusted import TrustedStates
from fdecode.state import DecodeState, KVPools
from fdecode.state.checks import check_layout

T = TypeVar("T")


class Chains:
    """The KV pools of one Step (`allocate()` makes a fresh target + draft pair) and which states may use them.

    `trusted`: the Step's last returned state (`fdecode.graphs.trusted`), which its graph runs call unguarded."""

    def __init__(
        self, config: DecodeConfig, target, draft, drafter, allocate: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        self.config, self.target, self.draft, self.drafter = config, target, draft, drafter
        self.kv = KVPools(allocate)
        self.trusted = TrustedStates()

    @property
    def pools(self) -> list:
        """The KV pools (`fdecode.state.ownership.KVPool`), oldest first: a copy of the list."""
        return list(self.kv.pools)

    def start(self, build: Callable[[torch.Tensor, torch.Tensor], tuple[DecodeState, T]], *, take_over: bool):
        """The state `build(target_kv, draft_kv)` makes as the first of a new chain (`KVPools.start`), with what
        else `build` returns beside it (a prefill's `HostRecord`): (state, that)."""
        beside = []

        def first(*kv: torch.Tensor) -> DecodeState:
            state, extra = build(*kv)
            beside.append(extra)
            return state

        return self.kv.start(first, take_over=take_over), beside[0]

    def check(self, state: DecodeState) -> None:
        """Host-side shape/device checks (no device sync), so a wrong state fails before the graph runs."""
        check_layout(state, self.config, self.target, self.draft, self.drafter)
        # After the layout (a state of another config says so first): consumed, re-primed, over another
        # step's pool, or over a pool without a ticket of it: raises.
        self.kv.check(state)

    def let_in(self, state: DecodeState, check: Callable[[DecodeState], None]) -> None:
        """Raise unless a step may run `state`: `check` (the Step's `check_state`, which is `check`), or for the
        last state returned (or one derived from it keeping its chain and layout, `TrustedStates.maker`) only
        whether its ticket is spent since."""
        if self.trusted.maker(state) is None:
            check(state)
        else:  # its layout is its graph's; still, it may have been consumed
            self.kv.check_returned(state)

    def advance(self, state: DecodeState, new_state: DecodeState, graph: Hashable) -> None:
        """A step (the graph `graph`) made `new_state` from `state`: the KV moved on, `state` is spent and
        `new_state` holds the chain, as the Step's last returned state."""
        self.kv.advance(state, new_state)
        self.trusted.made(new_state, graph)
