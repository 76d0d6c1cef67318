"""The real-vocabulary sampling workload of `fdecode bench` (`--workloads real-vocab`)
(docs/design.md, "Benchmarks, assets and tools").

At V = 151,936 (Qwen's vocabulary) with a small random target and draft, the
step time of the greedy-only graph (`DecodeConfig(sampling=False)`) against the
default `DecodeConfig` with greedy lanes (which runs the greedy plan), with
random lanes T = 0.7, top_p = 0.8, top_k = 20 (the candidate plan) and with
random lanes T = 1, top_p = 0.95 (the full-vocabulary plan with top-p), side by
side in one process. Steps are timed from a prefilled state, device-resident
(outputs read once at the end), interleaved over `reps` rounds; the ratio is
each median step time over the greedy-only graph's. The compile time of each
plan's graph is reported too (cold only where the inductor caches are off,
e.g. TORCHINDUCTOR_FORCE_DISABLE_CACHES=1).
"""

from __future__ import annotations

import statistics
import time

import torch

import fdecode
from fdecode.bench.timing import synchronize
from fdecode.ops.plan import plan_for

VOCAB = 151_936
# system: (DecodeConfig changes, SamplingParams of every lane)
SYSTEMS = {
    "greedy-only graph": (dict(sampling=False), {}),
    "default, greedy lanes": ({}, {}),
    "default, T=0.7 top_p=0.8 top_k=20": ({}, dict(temperature=0.7, top_p=0.8, top_k=20)),
    "default, T=1 top_p=0.95": ({}, dict(temperature=1.0, top_p=0.95)),
}


def run_sampling_workload(
    target,
    draft,
    batch: int,
    k: int,
    steps: int,
    reps: int,
    *,
    device="cpu",
    dtype=torch.float32,
    backend="auto",
    systems: dict[str, tuple[dict, dict]] = SYSTEMS,
    workload: str = "real-vocab",
) -> list[dict]:
    """Rows {system, batch, k, step_ms, min/max, ratio, plan, compile_s, tokens_per_step} for each system;
    the ratio is over the first system's median."""
    prompts = [list(range(1 + lane, 17 + lane)) for lane in range(batch)]
    budget = steps * (k + 1) + 1  # no lane finishes within the timed steps
    base = dict(
        num_draft_tokens=k,
        max_batch=batch,
        max_seq_len=16 + batch + budget + 2 * (k + 1),
        device=device,
        dtype=dtype,
        backend=backend,
    )
    configs = {tuple(sorted(changes.items())) for changes, _ in systems.values()}
    steps_by_config = {c: fdecode.compile(target, draft, fdecode.DecodeConfig(**base, **dict(c))) for c in configs}

    def run(system: str) -> tuple[float, float, str, int]:
        changes, params = systems[system]
        step = steps_by_config[tuple(sorted(changes.items()))]
        lanes = [
            fdecode.SamplingParams(**params, seed=lane, max_new_tokens=budget, eos_token_id=[]) for lane in range(batch)
        ]
        state = step.prefill(prompts, params=lanes)
        plan = step.plan_for(state).name
        window = step.config.bucket_for(step.schedule.record(state).max_position) * step.config.block_size
        outs = []
        synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            state, out = step(state)
            outs.append(out.num_tokens)
        synchronize()
        seconds = time.perf_counter() - start
        committed = float(torch.stack(outs).float().mean())
        return seconds / steps, committed, plan, window

    for system in systems:  # warm-up: makes the graph of the plan exact for each system's lanes (the cheapest one,
        changes, params = systems[system]  # not the general plan a step makes unasked: `Step.plan_for`)
        step = steps_by_config[tuple(sorted(changes.items()))]
        lanes = [fdecode.SamplingParams(**params).plan_inputs] * batch
        step.warmup(
            plans=[plan_for(lanes, candidates=step.config.top_k_candidates, processors=step.config.logit_processors)]
        )
        run(system)
    times: dict[str, list[float]] = {s: [] for s in systems}
    info = {}
    for _ in range(reps):
        for system in systems:
            seconds, committed, plan, window = run(system)
            times[system].append(seconds)
            info[system] = (committed, plan, window)
    greedy = statistics.median(times[next(iter(systems))])
    rows = []
    for system, ts in times.items():
        committed, plan, window = info[system]
        step = steps_by_config[tuple(sorted(systems[system][0].items()))]
        rows.append(
            dict(
                workload=workload,
                system=system,
                batch=batch,
                k=k,
                step_ms=statistics.median(ts) * 1e3,
                step_ms_min=min(ts) * 1e3,
                step_ms_max=max(ts) * 1e3,
                ratio=statistics.median(ts) / greedy,
                plan=plan,
                tokens_per_step=committed,
                compile_s=step.plan_compile_seconds.get((window, plan)),
            )
        )
    return rows


def markdown(rows: list[dict], baseline: str = "greedy-only") -> str:
    lines = [
        f"| B | K | system | plan | ms/step (min-max) | x {baseline} | tok/lane-step | compile s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        compile_s = f"{r['compile_s']:.1f}" if r["compile_s"] is not None else ""
        lines.append(
            f"| {r['batch']} | {r['k']} | {r['system']} | {r['plan']} | {r['step_ms']:.2f} ({r['step_ms_min']:.2f}-"
            f"{r['step_ms_max']:.2f}) | {r['ratio']:.2f} | {r['tokens_per_step']:.2f} | {compile_s} |"
        )
    return "\n".join(lines)
