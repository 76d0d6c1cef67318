"""How an `Engine` chooses the depth of each launch: one interface, three policies
(docs/design.md, "Adaptive depth and the idle draft").

A policy answers `launch(ready)` with (depth, ticket), gets the ticket back with that step's output, read one
step behind (`observe_output(packed, ticket)`), learns what a launch took (`observe_cost`) and hears of every
admission (`admit`). Each also says the depth of its last launch (`depth`) and how many it launched at each (`launches`), for
metrics. The drafter decides which policy its kind uses (`Drafter.gated`, `Drafter.adapts`):

- `DepthController`: by cost and acceptance, among the depths whose graphs are made (draft LMs, MTP heads,
  n-gram trees);
- `DraftGate`: the on/off case, K or 0 (n-gram chains, `DecodeConfig.draft_gate`);
- `FixedDepth`: always K (`adaptive_depth=False`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

import torch

from fdecode.runtime.depth import DepthController, depth_costs, step_costs
from fdecode.runtime.gate import DraftGate


class DepthPolicy(Protocol):
    reads_ready: bool  # whether `launch` chooses among the depths whose graphs are made (`Schedule.ready_depths`)
    depth: int | None  # the depth of the last launch (None: none yet)
    launches: dict[int, int]  # how many steps were launched at each depth

    def launch(self, ready: Collection[int] | None = None) -> tuple[int, object]: ...

    def observe_output(self, packed: torch.Tensor, ticket: object) -> None: ...

    def observe_cost(self, depth: int, seconds: float) -> None: ...

    def admit(self, lane: int) -> None: ...


class FixedDepth:
    """Every launch verifies all K drafts."""

    reads_ready = False

    def __init__(self, num_draft_tokens: int):
        self.num_draft_tokens = num_draft_tokens
        self.depth: int | None = None
        self.launches = {num_draft_tokens: 0}

    def launch(self, ready: Collection[int] | None = None) -> tuple[int, None]:
        self.depth = self.num_draft_tokens
        self.launches[self.depth] += 1
        return self.depth, None

    def observe_output(self, packed: torch.Tensor, ticket: object) -> None:
        pass

    def observe_cost(self, depth: int, seconds: float) -> None:
        pass

    def admit(self, lane: int) -> None:
        pass

    def __repr__(self) -> str:
        return f"FixedDepth(K={self.num_draft_tokens})"


def depth_policy(step) -> DepthPolicy:
    """The policy of an Engine on `step` (a `Step`): the gate where its drafter is gated, the controller where it
    adapts, else K at every launch."""
    cfg, drafter = step.config, step.drafter
    if drafter.gated(cfg):
        return DraftGate(cfg.K)
    if not drafter.adapts(cfg):
        return FixedDepth(cfg.K)
    allowed = step.depths if 1 in step.depths else (cfg.K,)  # a recurrent chain runs 0 or K: K alone
    catch_up = cfg.draft_catch_up if step.idles_draft else 0  # `fdecode.ops.catch_up`
    tree = dict(tree_levels=cfg.levels) if cfg.tree and len(allowed) > 1 else {}  # 0, chains 1 .. S, the tree
    common = dict(depths=allowed, catch_up=catch_up, first=step.first_depth, **tree)  # first: where none is made
    if getattr(step.target, "tp", None) is None:
        return DepthController(cfg.K, step_costs(step, allowed), **common)
    # every rank must launch the same depths: costs from the weights alone, never from timings
    costs = depth_costs(step.target, step.draft, cfg, drafter)
    return DepthController(cfg.K, costs, learn_costs=False, **common)
