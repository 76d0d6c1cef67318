"""Record the graphs a Step runs, through its public `graph_set.run` (`fdecode.graphs.graph_set`)."""

from __future__ import annotations

from collections.abc import Callable


def record_runs(step, observe: Callable | None = None) -> list:
    """Wrap `step.graph_set.run` to append the `GraphKey` of every graph the step runs from then on, in order,
    to the returned list; `observe(state, blocks, key)` (optional) sees each call before it runs. For a step
    the test made itself: the wrapper stays on it."""
    keys: list = []
    run = step.graph_set.run

    def spy(state, blocks, key, **kw):
        if observe is not None:
            observe(state, blocks, key)
        keys.append(key)
        return run(state, blocks, key, **kw)

    step.graph_set.run = spy
    return keys
