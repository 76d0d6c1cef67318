"""The host's share of a step: `fdecode bench --workloads host-time` (docs/host-time.md).

Per model (`micro`: a 1-layer, 32-wide Llama target and draft at V = 64, one thread; `bundled`: the bundled
model with its MTP head) and batch, with the default `DecodeConfig` (greedy lanes, K = 3):
- step_ms: wall time of `step(state)`, the median over `reps` runs of `steps` steps after the first step from a
  fresh prefill, one device read at each run's end (no profiler); cpu_ms: the process's CPU time over the same
  runs (on a machine shared with other jobs, the figure their load disturbs least); first_step_ms: that first
  step's wall time (a state the Step did not make: its checks and one guard check, once per prefill; every
  other figure is of the steps after it);
- inside / outside: from one run under `torch.profiler`, each step in a `fdecode/host-step` range: time in the
  compiled code (Inductor's `## Call CompiledFxGraph` ranges) and the rest of the step (the Step's checks and
  choices, Dynamo's guards and bytecode, AOTAutograd's wrappers), medians over the steps; outside is less what
  entering and leaving the two ranges costs (profiler_ms: the median outside of empty steps ranged alike);
- cpu_outside / cpu_outside_share: the same split without the profiler, in CPU time of the thread (Inductor's
  compiled graphs timed as they run, median over `reps` runs): the figure to read on a shared machine;
- device_idle: on a GPU, the device's idle time between consecutive steps (from the last kernel of step n to
  the first of step n + 1, the steps' ranges as the device ran them) as a share of the step; None on a CPU;
- engine_ms: an `Engine`'s time per step, and engine_own_ms the part outside the step's calls (reading one step
  behind, admissions, events); engine_cpu_ms / engine_own_cpu_ms: the same in CPU time of the thread.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import fdecode
from fdecode.bench.models import llama
from fdecode.bench.timing import synchronize
from fdecode.graphs import background

STEP = "fdecode/host-step"
EMPTY_STEP, EMPTY_CALL = "fdecode/empty-step", "fdecode/empty-call"  # `profiler_cost`'s ranges
COMPILED = "## Call CompiledFxGraph"  # Inductor's range around a compiled graph's call (output_code.py)
MODELS = ("micro", "bundled")
PROMPT_LEN = 16


def load(name: str):
    """(target, draft, threads) of a host-time model; threads: None keeps the process's."""
    if name == "micro":
        return llama(64, 32, 1, seed=1), llama(64, 32, 1, seed=2), 1
    if name == "bundled":
        from fdecode.assets import TINY
        from fdecode.models import from_hf

        return from_hf(TINY, dtype=torch.float32), "mtp", None
    raise ValueError(f"host-time models are {MODELS}, got {name!r}")


def compile_step(target, draft, *, batch: int, k: int, steps: int, device: str, backend: str):
    """The default config's step for `steps` steps of `batch` lanes of PROMPT_LEN-token prompts, warmed."""
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=k,
        max_batch=batch,
        max_seq_len=PROMPT_LEN + batch + steps * (k + 1) + 2 * (k + 1),
        device=device,
        backend=backend,
    )
    return fdecode.compile(target, draft, cfg, announce=False)


def prompts_of(step, batch: int) -> list[list[int]]:
    vocab = step.target.config.vocab_size
    return [[(7 * lane + i) % vocab for i in range(PROMPT_LEN + lane)] for lane in range(batch)]


def timed_run(step, prompts, steps: int) -> tuple[float, float, float]:
    """(wall, process CPU) seconds per step of the `steps` steps that follow the first step from a fresh prefill
    (device-resident, one read at the end), and the wall seconds of that first step (`first_step`)."""
    state, first = first_step(step, prompts, steps)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        state, out = step(state)
    out.packed.cpu()
    return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps, first


def first_step(step, prompts, steps: int):
    """(the state after, wall seconds) of the first step from a fresh prefill for `steps` more steps: a state the
    Step did not make, so it pays for `Step.check_state` and one guard check; a decode loop pays it once per
    prefill, an `Engine` once per admission. The other figures are of the steps after it."""
    state = step.prefill(prompts, max_new_tokens=(steps + 1) * step.config.W, eos_token_id=[])
    synchronize()
    start = time.perf_counter()
    state, out = step(state)
    synchronize()
    return state, time.perf_counter() - start


def _ranges(prof, name: str, device: bool = False) -> list[tuple[float, float]]:
    """(start, end) us of the events named (or, for COMPILED, starting with) `name`, on the host or the device."""
    from torch.autograd import DeviceType

    want = DeviceType.CUDA if device else DeviceType.CPU
    return sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if (e.name.startswith(name) if name == COMPILED else e.name == name) and e.device_type == want
    )


def _split(steps: list[tuple[float, float]], inner: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """(inside, outside) us of each outer range: its time in the `inner` ranges, and the rest."""
    inside = [sum(min(e, end) - max(s, start) for s, e in inner if s < end and e > start) for start, end in steps]
    return inside, [(end - start) - i for (start, end), i in zip(steps, inside)]


def profiler_cost(n: int) -> None:
    """`n` empty steps as the profiled run ranges its steps: an outer `STEP`-like range around an inner one of the
    kind Inductor puts around a compiled graph (`_RecordFunctionFast`). Their split's outside is what the
    ranges themselves add to a step's outside time (entering and leaving them), which `shares` takes off."""
    for _ in range(n):
        with record_function(EMPTY_STEP), torch._C._profiler._RecordFunctionFast(EMPTY_CALL):
            pass


def shares(prof) -> dict[str, float | None]:
    """inside_us / outside_us (medians over the steps; outside less the profiler's own cost, `profiler_cost`,
    given as profiler_us) and device_idle (share of the step period, None where the device ran nothing apart
    from the host) from a profile of steps in `STEP` ranges."""
    inside, outside = _split(_ranges(prof, STEP), _ranges(prof, COMPILED))
    _, cost = _split(_ranges(prof, EMPTY_STEP), _ranges(prof, EMPTY_CALL))
    cost = statistics.median(cost) if cost else 0.0
    device = _ranges(prof, STEP, device=True)  # the same ranges as the device ran their kernels
    idle = None
    if len(device) >= 2:
        gaps = [max(b[0] - a[1], 0.0) for a, b in zip(device, device[1:])]
        periods = [b[0] - a[0] for a, b in zip(device, device[1:])]
        idle = statistics.median(g / p for g, p in zip(gaps, periods) if p > 0)
    return {
        "inside_us": statistics.median(inside),
        "outside_us": statistics.median(outside) - cost,
        "profiler_us": cost,
        "device_idle": idle,
    }


def profiled_run(step, prompts, steps: int) -> dict[str, float | None]:
    """`shares` of one run of `steps` steps under the profiler (CUDA activity where the step runs there)."""
    from fdecode.profile import quiet_stderr

    activities = [ProfilerActivity.CPU]
    if step.config.device_type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    state, _ = first_step(step, prompts, steps)
    prof = profile(activities=activities)
    with quiet_stderr():
        prof.start()
    try:
        for _ in range(steps):
            with record_function(STEP):
                state, out = step(state)
        out.packed.cpu()
        profiler_cost(steps)
    finally:
        with quiet_stderr():
            prof.stop()
    return shares(prof)


def cpu_split(step, prompts, steps: int) -> tuple[float, float]:
    """(CPU seconds of the thread per step, of which inside Inductor's compiled graphs) over `steps` steps: the
    profiler-free split (`CompiledFxGraph.__call__` timed while it runs; wall-clock profiler ranges are mostly
    other jobs' time on a shared machine). CPU-only: a GPU step's kernels are not the thread's time."""
    from torch._inductor.output_code import CompiledFxGraph

    inside, original = [0.0], CompiledFxGraph.__call__

    def timed(self, inputs):
        start = time.thread_time()
        try:
            return original(self, inputs)
        finally:
            inside[0] += time.thread_time() - start

    state, _ = first_step(step, prompts, steps)
    CompiledFxGraph.__call__ = timed
    try:
        start = time.thread_time()
        for _ in range(steps):
            state, out = step(state)
        total = time.thread_time() - start
    finally:
        CompiledFxGraph.__call__ = original
    out.packed.cpu()
    return total / steps, inside[0] / steps


class _TimedStep:
    """The step as an Engine sees it, with the wall and thread CPU seconds spent in its calls summed (`engine_run`)."""

    def __init__(self, step):
        self._step, self.seconds, self.cpu = step, 0.0, 0.0

    def __getattr__(self, name):
        return getattr(self._step, name)

    def __call__(self, state, **kwargs):
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return self._step(state, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self.cpu += time.thread_time() - cpu


def engine_run(step, prompts, steps: int) -> tuple[float, float, float, float]:
    """(seconds per Engine step, of which outside the step's calls; the same in CPU time of the thread) over
    `steps` steps of an Engine serving `prompts` (their admission included, as a server's would be). The CPU
    figures are the ones a machine shared with other jobs disturbs least."""
    warm = fdecode.Engine(step)  # a first run: its launches ask for the other depths' graphs (`DepthGraphs`)
    for prompt in prompts:
        warm.add_request(prompt, max_new_tokens=2 * step.config.W, eos_token_id=[])
    warm.run()
    background.wait_all()  # made before the timed run, as after any warm-up
    timed = _TimedStep(step)
    engine = fdecode.Engine(timed)
    for prompt in prompts:
        engine.add_request(prompt, max_new_tokens=steps * step.config.W, eos_token_id=[])
    engine.step()  # admits the requests (priming), launches nothing yet
    timed.seconds = timed.cpu = 0.0
    start, cpu = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        engine.step()
    synchronize()
    wall, cpu = (time.perf_counter() - start) / steps, (time.thread_time() - cpu) / steps
    return wall, wall - timed.seconds / steps, cpu, cpu - timed.cpu / steps


def run_host_workload(
    model: str, batches, *, k: int = 3, steps: int = 40, reps: int = 5, device: str = "cpu", backend: str = "auto"
) -> list[dict]:
    """One row per batch of `model` (see the module docstring for the figures)."""
    target, draft, threads = load(model)
    saved = torch.get_num_threads()
    if threads is not None and device == "cpu":
        torch.set_num_threads(threads)
    rows = []
    try:
        for batch in batches:
            print(f"... host-time {model} B={batch} K={k}", file=sys.stderr, flush=True)
            step = compile_step(target, draft, batch=batch, k=k, steps=steps, device=device, backend=backend)
            prompts = prompts_of(step, batch)
            timed_run(step, prompts, steps)  # compiles (or loads) the graph, fills the caches
            runs = [timed_run(step, prompts, steps) for _ in range(reps)]
            seconds, cpu, first = (statistics.median(r[i] for r in runs) for i in (0, 1, 2))
            split = profiled_run(step, prompts, steps)
            cpu_splits = [cpu_split(step, prompts, steps) for _ in range(reps)]
            cpu_total, cpu_inside = (statistics.median(r[i] for r in cpu_splits) for i in (0, 1))
            engine, engine_own, engine_cpu, engine_own_cpu = engine_run(step, prompts, steps)
            inside, outside = split["inside_us"], split["outside_us"]
            rows.append(
                {
                    "workload": "host-time",
                    "model": model,
                    "batch": batch,
                    "k": k,
                    "backend": step.backend,
                    "threads": torch.get_num_threads(),
                    "step_ms": seconds * 1e3,
                    "cpu_ms": cpu * 1e3,
                    "first_step_ms": first * 1e3,
                    "inside_ms": inside / 1e3,
                    "outside_ms": outside / 1e3,
                    "outside_share": outside / max(inside + outside, 1e-9),
                    "profiler_ms": split["profiler_us"] / 1e3,
                    "device_idle": split["device_idle"],
                    "cpu_outside_ms": (cpu_total - cpu_inside) * 1e3,
                    "cpu_outside_share": (cpu_total - cpu_inside) / max(cpu_total, 1e-9),
                    "engine_ms": engine * 1e3,
                    "engine_own_ms": engine_own * 1e3,
                    "engine_cpu_ms": engine_cpu * 1e3,
                    "engine_own_cpu_ms": engine_own_cpu * 1e3,
                }
            )
    finally:
        torch.set_num_threads(saved)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | B | backend | threads | ms/step | CPU ms/step | first step ms | inside ms | outside ms | outside share "
        "| CPU outside ms "
        "| CPU outside share | device idle "
        "| Engine ms/step | Engine's own ms | Engine CPU ms/step | Engine's own CPU ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        idle = "-" if r["device_idle"] is None else f"{100 * r['device_idle']:.1f} %"
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['backend']} | {r['threads']} | {r['step_ms']:.3f} | {r['cpu_ms']:.3f} | "
            f"{r['first_step_ms']:.3f} | "
            f"{r['inside_ms']:.3f} | {r['outside_ms']:.3f} | {100 * r['outside_share']:.1f} % | "
            f"{r['cpu_outside_ms']:.3f} | {100 * r['cpu_outside_share']:.1f} % | {idle} | "
            f"{r['engine_ms']:.3f} | {r['engine_own_ms']:.3f} | {r['engine_cpu_ms']:.3f} | {r['engine_own_cpu_ms']:.3f} |"
        )
    return "\n".join(lines)
