"""Timing for the benchmarks: wall-clock runs of whole systems, compared side by side
(docs/design.md, "Benchmarks, assets and tools").

`synchronize` waits for the accelerator (if any), so that a timed interval holds the work it
launched. `interleaved_runs` times several systems in one process: one untimed warm-up call of each
(which compiles; none for systems compiled beforehand), then the timed repetitions round-robin, every
system once per round, so that a slow drift of a shared machine's speed lands on every system alike
instead of on whichever ran during it; each system's figure is the median with min and max. `median_run` is the same for a single function.
`interleaved_seconds` is the same round-robin for functions that time themselves (steps after an untimed
prefill).
The ratios between systems timed together are what a benchmark here reports: absolute times depend on
the machine and its load.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from fdecode.graphs import background


def synchronize() -> None:
    """Wait for the accelerator (if any), so a timed run includes the work it launched."""
    accelerator = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
    if accelerator is not None and torch.accelerator.is_available():
        torch.accelerator.synchronize()


def median_run(fn, reps: int) -> tuple[float, float, float, object]:
    """(median, min, max seconds, last result) of `fn` over `reps` runs after one warm-up call."""
    return interleaved_runs({"fn": fn}, reps)["fn"]


def interleaved_runs(
    fns: dict, reps: int, *, warm_up: bool = True, announce: str | None = None, rounds: dict | None = None
) -> dict[str, tuple[float, float, float, object]]:
    """name -> (median, min, max seconds, last result) of each fn, after one warm-up call each (compiles;
    warm_up=False: none, for systems compiled beforehand whose runs take minutes). announce: a prefix for
    a line on stderr before each timed run (None: silent). rounds: filled with name -> seconds of each
    round, in order, so that two systems' ratio can be taken round by round (`paired_ratio`).

    The repetitions go round-robin (every fn once, then every fn again ..), so a slow drift of a shared
    machine's speed (its other core, memory bandwidth) lands on every system alike instead of on whichever
    ran during it: the ratios between rows are what a benchmark here reports."""
    results = {name: fn() for name, fn in fns.items()} if warm_up else {}
    background.wait_all()  # the graphs an Engine's warm-up asked for, made before any round is timed
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            if announce is not None:
                print(f"{announce}{name}", file=sys.stderr, flush=True)
            synchronize()
            start = time.perf_counter()
            results[name] = fn()
            synchronize()
            times[name].append(time.perf_counter() - start)
    if rounds is not None:
        rounds.update(times)
    return {name: (statistics.median(t), min(t), max(t), results[name]) for name, t in times.items()}


def interleaved_seconds(fns: dict, reps: int) -> dict[str, tuple[float, float, float]]:
    """name -> (median, min, max) of the seconds each fn returns (it times its own part: steps after an untimed
    prefill, say), after one untimed warm-up call each, the `reps` calls round-robin as in `interleaved_runs`."""
    for fn in fns.values():
        fn()
    background.wait_all()
    seconds: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            seconds[name].append(fn())
    return {name: (statistics.median(s), min(s), max(s)) for name, s in seconds.items()}


def paired_ratio(seconds: list[float], baseline: list[float]) -> float:
    """The median over rounds of baseline / seconds (a speed ratio, > 1: faster than the baseline), each
    round's two runs minutes apart at most: a drift of the machine between rounds cancels."""
    if len(seconds) != len(baseline) or not seconds:
        raise ValueError(f"paired_ratio needs the same rounds of both, got {len(seconds)} and {len(baseline)}")
    return statistics.median(b / s for s, b in zip(seconds, baseline))
