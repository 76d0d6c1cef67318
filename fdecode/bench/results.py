"""The rows `fdecode bench` reports, and their markdown table
(docs/design.md, "Benchmarks, assets and tools").

A `Result` is one system on one workload at one batch size and K: tokens per second (the median
of the timed runs, with the min and max), milliseconds per step, mean tokens per lane-step, and for
the compiled fdecode step the compute floor and the overhead fraction 1 - floor / step. `extra` holds
what a workload adds (the backend that ran, the prompt, the depths launched ..). `--json` writes the
rows as they are (`dataclasses.asdict`), so the fields here are the JSON's fields. `markdown` renders
rows as the table the CLI prints and BENCHMARKS.md quotes. The real-vocabulary sampling workload has
rows of its own (`fdecode.bench.sampling`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Result:
    workload: str
    system: str
    batch: int
    k: int
    tokens_per_s: float
    tokens_per_s_min: float
    tokens_per_s_max: float
    step_ms: float
    tokens_per_step: float
    floor_ms: float | None = None
    overhead: float | None = None
    extra: dict = field(default_factory=dict)


def timed_result(workload, system, batch, k, new_tokens, seconds, steps, extra) -> Result:
    """A `Result` of `batch` lanes of `new_tokens` each over `steps` steps (0: one token a step); seconds:
    (median, min, max) of the repetitions."""
    total = new_tokens * batch
    med, fastest, slowest = seconds
    steps = steps or new_tokens
    return Result(
        workload,
        system,
        batch,
        k,
        total / med,
        total / slowest,
        total / fastest,
        med / steps * 1e3,
        total / (steps * batch),
        extra=extra,
    )


def rate(tokens_per_s: float) -> str:
    """Three significant figures or whole tokens: 2.42, 31.6, 213."""
    return f"{tokens_per_s:.{2 if tokens_per_s < 10 else 1 if tokens_per_s < 100 else 0}f}"


def markdown(results: list[Result]) -> str:
    lines = [
        "| workload | B | K | system | tok/s (min-max) | ms/step | tok/lane-step | floor ms | overhead |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        floor = f"{r.floor_ms:.2f}" if r.floor_ms is not None else ""
        over = f"{r.overhead:.0%}" if r.overhead is not None else ""
        lines.append(
            f"| {r.workload} | {r.batch} | {r.k} | {r.system} | {rate(r.tokens_per_s)} ({rate(r.tokens_per_s_min)}-"
            f"{rate(r.tokens_per_s_max)}) | {r.step_ms:.2f} | {r.tokens_per_step:.2f} | {floor} | {over} |"
        )
    return "\n".join(lines)
