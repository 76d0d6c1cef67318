"""`GraphKey`: which step graph runs, by window, sampling plan and depth (docs/design.md, "Backends and kernels").

A `Step` has a graph per key (`fdecode.graphs.graph_set.GraphSet`), each a code object of its own
(`fdecode.graphs.pure.pure_step`). The window is in blocks, or None for the one graph of every window of 2
blocks or more (`DecodeConfig.dynamic_window`). The depth is how many of the window's drafts the step
verifies, 0 .. K; `catch_up` marks the depth-0 graph that ends a run of depth-0 steps of a draft that sat
them out (`fdecode.ops.catch_up`: it feeds the draft what it missed, then proposes one draft).
"""

from __future__ import annotations

from dataclasses import dataclass

from fdecode.ops.plan import SamplingPlan


@dataclass(frozen=True)
class GraphKey:
    """One step graph: window (blocks, None: every window of 2+ blocks), plan and depth."""

    window: int | None  # attention window in blocks; None: the graph of every window of 2 blocks or more
    plan: SamplingPlan  # the sampling code it runs (`fdecode.ops.plan`)
    depth: int  # drafts verified, 0 .. K
    catch_up: bool = False  # depth 0 whose draft first takes the tokens it sat out (`fdecode.ops.catch_up`)

    def __post_init__(self) -> None:
        if self.catch_up and self.depth != 0:
            raise ValueError(f"a catch-up graph verifies no draft (depth 0), got depth {self.depth}")

    def suffix(self, k: int) -> str:
        """What the depth adds to the graph's function name (`pure_step`): nothing at depth K."""
        if self.catch_up:
            return "_catch_up"
        return "" if self.depth == k else "_first_row" if self.depth == 0 else f"_depth{self.depth}"

    def name(self, k: int) -> str:
        """The graph's name in messages and `Step.plan_compile_seconds`: the plan's, marked for first-row
        graphs (depth 0), the catch-up graph and graphs that verify fewer than the K drafts."""
        plan = self.plan.name
        if self.depth == k and not self.catch_up:
            return plan
        if self.catch_up:
            return f"{plan} (first row, draft catch-up)"
        return f"{plan} (first row only)" if self.depth == 0 else f"{plan} (depth {self.depth})"
