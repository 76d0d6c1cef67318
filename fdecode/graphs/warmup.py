"""`warm`: run a list of step graphs once each (compiling them), then time some in rounds (`Step.warmup`,
docs/design.md, "Adaptive depth").

The graphs run on one throwaway all-inactive state (an all-inactive step stays all-inactive, so every graph
runs in one KV pool). The timed graphs then run round after round, every graph once per round, so a drift of
the machine's speed is shared by all; the median of a graph's rounds is its cost.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from fdecode.graphs.graph_key import GraphKey
from fdecode.progress import bar
from fdecode.state import DecodeState, StepOutput

TIMED_RUNS = 5  # `Step.warmup` times each depth's step this many times, in rounds (the median is its cost)

Run = Callable[..., tuple[DecodeState, StepOutput]]  # `Step._run`: (state, blocks, key, quiet=) -> (state, out)


def warm(
    run: Run,
    state: DecodeState,
    runs: Sequence[tuple[int, GraphKey]],
    timed: Sequence[GraphKey],
    *,
    blocks: int,
    block_size: int,
    k: int,
    show: bool,
) -> dict[GraphKey, float]:
    """Run each (window in blocks, key) of `runs` once on `state` (with a progress bar where `show`), then each
    of `timed` `TIMED_RUNS` times over a window of `blocks` blocks, in rounds; returns each timed key's median
    seconds (a step's output read back, so an accelerator's asynchronous run is waited for)."""
    with bar(total=len(runs), desc="fdecode: compiling", unit="window", disable=not show) as shown:
        for window, key in runs:
            shown.set_postfix_str(f"{key.name(k)}, {window * block_size}-token window")
            state, _ = run(state, window, key, quiet=True)
            shown.update(1)
        times: dict[GraphKey, list[float]] = {key: [] for key in timed}
        for _ in range(TIMED_RUNS):  # round after round of every graph: a drift of the machine's speed is shared
            for key in timed:
                start = time.perf_counter()
                state, out = run(state, blocks, key, quiet=True)
                out.packed.cpu()  # waits for the step (an accelerator runs it asynchronously)
                times[key].append(time.perf_counter() - start)
    return {key: statistics.median(seconds) for key, seconds in times.items()}
