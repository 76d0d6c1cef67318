"""Cold and warm start: time from `fdecode.compile` to the first decode step's tokens, in fresh processes.

    python bench/cold_start.py                                  # every workload below
    python bench/cold_start.py --workloads bundled depth        # skip the real pair
    python bench/cold_start.py --workloads qwen-coder --modes regions
    python bench/cold_start.py --workloads qwen-coder --modes regions --warmup   # step.warmup(), cold and warm
    python bench/cold_start.py --workloads qwen-coder --modes regions --warmup --all-plans   # every plan's graph
    python bench/cold_start.py --quick                          # a smoke run: the bundled model, eager

Each measurement is a fresh Python process. "cold" runs with an empty Inductor cache (a new
TORCHINDUCTOR_CACHE_DIR); "warm" is a second process on that same cache, as a user's second start
is. The time counted is `fdecode.compile` + prefill of one prompt + the first `step(state)` (where the
greedy graph compiles, or loads), i.e. the wait before the stream decodes, with each of the three
reported too (compile_call_s, prefill_s, first_call_s); model loading is reported apart.
The process also reports its CPU seconds (with the C++ compiler children), which load on the machine
does not stretch, the FX graph cache hits and misses, and the median time of 20 steps after that.

Modes: "regions" (`DecodeConfig.layer_regions=True`: each layer kind compiled once, and the compiled graph
kept on disk, `fdecode.graphs.stored`, which a warm start loads without tracing: the default on the real
pair), "plain" (regions, with `FDECODE_CACHE_DIR=off`: a warm start traces the step again, what fdecode did
before the stored graphs) and "unrolled" (`layer_regions=False`: every layer copy compiled). The step
graphs' folder lives beside the Inductor cache, so "cold" has both empty and "warm" both filled.

--compare-isa runs each workload and mode twice: with Inductor's vector-ISA probes (what fdecode did before
`fdecode.backends.cpu.vec_isa`: six C++ probe builds on an empty cache, six probe processes on every start) and
without them (the default), cold and warm each.

--compare-batches runs each workload and mode twice: with the graph's C++ kernels built one library each
(Inductor's own way, what fdecode did before `fdecode.backends.cpu.kernel_batches`) and a few to a library (the
default), cold and warm each.

--compare-rules runs each workload and mode twice: with Inductor binding its dtype rules at every op it generates
(its own way, what fdecode did before `fdecode.backends.cpu.codegen_rules`) and once per compile (the default),
cold and warm each.

--phases adds where the compile's time goes (`bench/compile_phases.py`: Dynamo's trace, Inductor's lowering,
code generation, the wait for C++ builds...), per sampling plan with --warmup.

--warmup times `step.warmup()` instead (the greedy and the general sampling plan at each window: after it no batch
of the default config compiles anything; the config keeps its sampling plans), right after `fdecode.compile`,
cold then warm. With --all-plans, `step.warmup(plans=step.plans)`: every plan's graph, the specialised ones too.

Workloads:
- bundled: the bundled 4-layer model with its MTP head, K = 3, the demo's config;
- qwen-coder: Qwen2.5-Coder-1.5B-Instruct with the 0.5B draft, fp32, K = 4, B = 1, max_seq_len 512
  (`fdecode.assets.qwen_coder`; skipped with the script's name when the models are missing);
- depth: a random Llama target of hidden 256 at 7, 14 and 28 layers (the same layer shapes), a 2-layer
  draft, K = 4: compile time against depth.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from child_process import run_json_child  # bench/child_process.py, beside this script


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def models(workload: str, layers: int):
    import torch

    import fdecode
    from fdecode.models import from_hf

    if workload == "bundled":
        from fdecode.assets import TINY

        target = from_hf(TINY, dtype=torch.float32)
        prompt = list(b"def fibonacci(n):\n    ")
        return target, "mtp", fdecode.DecodeConfig(num_draft_tokens=3, max_batch=1, max_seq_len=160), prompt
    if workload == "qwen-coder":
        from fdecode.assets.qwen_coder import safetensors_folders

        target_dir, draft_dir = safetensors_folders()
        target, draft = from_hf(target_dir, dtype=torch.float32), from_hf(draft_dir, dtype=torch.float32)
        prompt = list(range(1000, 1060))  # 60 tokens; the ids matter not to the compile
        return target, draft, fdecode.DecodeConfig(num_draft_tokens=4, max_batch=1, max_seq_len=512), prompt
    from fdecode.bench import llama

    target, draft = llama(4096, 256, layers, seed=0), llama(4096, 256, 2, seed=1)
    prompt = list(range(10, 70))
    return target, draft, fdecode.DecodeConfig(num_draft_tokens=4, max_batch=1, max_seq_len=256), prompt


def tune_compiles(batched: bool, rules_once: bool) -> None:
    """What this process's first compile of a graph runs in (`fdecode.backends.cpu.compiling`): C++ kernels a few
    to a library (`kernel_batches`, the default) or one library each (Inductor's way, what fdecode did before);
    Inductor's dtype rules bound once per compile (`codegen_rules`, the default) or at every generated op (its
    own way, what fdecode did before)."""
    import contextlib

    from fdecode.backends import cpu
    from fdecode.backends.cpu.codegen_rules import rules_once as once
    from fdecode.backends.cpu.kernel_batches import batched_cpu_kernels

    @contextlib.contextmanager
    def compiling():
        with (
            batched_cpu_kernels() if batched else contextlib.nullcontext(),
            once() if rules_once else contextlib.nullcontext(),
        ):
            yield

    cpu.compiling = compiling


def child(spec: dict) -> dict:
    import dataclasses

    import torch
    from torch._dynamo.utils import counters

    import fdecode

    if spec.get("isa") == "probed":  # Inductor tests each vector ISA by compiling and loading a probe
        import contextlib

        import fdecode.graphs.backends
        import fdecode.graphs.stored

        fdecode.graphs.backends.isa_options = dict
        fdecode.graphs.stored.trusted_isa = contextlib.nullcontext
    tune_compiles(spec.get("kernels") != "single", spec.get("rules") != "per-op")
    phases = None
    if spec.get("phases"):
        from compile_phases import CompilePhases

        phases = CompilePhases()
    start = time.perf_counter()
    target, draft, cfg, prompt = models(spec["workload"], spec.get("layers", 0))
    load_s = time.perf_counter() - start
    if spec.get("warmup"):  # the default config's every plan and window
        cfg = dataclasses.replace(cfg, layer_regions=spec["mode"] != "unrolled")
        step = fdecode.compile(target, draft, cfg, announce=False)
        start, start_cpu = time.perf_counter(), cpu_seconds()
        plans = step.plans if spec.get("all_plans") else step.covering_plans
        if phases is None:
            graphs = step.warmup(plans, progress=False)
        else:  # one plan at a time, the same work as one call
            per_plan = {}
            for plan in plans:
                before, plan_start = phases.seconds(), time.perf_counter()
                graphs = step.warmup([plan], progress=False)
                per_plan[plan.name] = {"warmup_s": round(time.perf_counter() - plan_start, 2), **phases.since(before)}
        return {
            **spec,
            "load_s": round(load_s, 2),
            "warmup_s": round(time.perf_counter() - start, 2),
            "warmup_cpu_s": round(cpu_seconds() - start_cpu, 2),
            "graphs": len(step.graphs),
            "graph_seconds": {str(k): round(v, 2) for k, v in graphs.items()},
            "loaded": sum(getattr(graph, "loaded", False) for graph in step.graphs.values()),
            **({"phases": per_plan} if phases else {}),
        }
    cfg = dataclasses.replace(cfg, layer_regions=spec["mode"] != "unrolled", sampling=False)
    if spec.get("backend"):
        cfg = dataclasses.replace(cfg, backend=spec["backend"])
    start, start_cpu = time.perf_counter(), cpu_seconds()
    step = fdecode.compile(target, draft, cfg, announce=False)
    compiled = time.perf_counter()
    state = step.prefill([prompt], max_new_tokens=100)
    prefilled = time.perf_counter()
    state, out = step(state)
    first = out.tokens.tolist()
    first_step_s, first_step_cpu = time.perf_counter() - start, cpu_seconds() - start_cpu
    parts = {
        "compile_call_s": compiled - start,
        "prefill_s": prefilled - compiled,
        "first_call_s": start + first_step_s - prefilled,
    }
    times = []
    with torch.no_grad():
        for _ in range(spec.get("steps", 20)):
            t = time.perf_counter()
            state, out = step(state)
            times.append(time.perf_counter() - t)
    return {
        **spec,
        "load_s": round(load_s, 2),
        "first_step_s": round(first_step_s, 2),
        "first_step_cpu_s": round(first_step_cpu, 2),
        **{name: round(seconds, 2) for name, seconds in parts.items()},
        "fx_cache_hits": counters["inductor"]["fxgraph_cache_hit"],
        "fx_cache_misses": counters["inductor"]["fxgraph_cache_miss"],
        "step_ms": round(1000 * statistics.median(times), 2),
        "first_tokens": first,
        "loaded": sum(getattr(graph, "loaded", False) for graph in step.graphs.values()),
        "backend": step.backend,
        **({"phases": phases.seconds()} if phases else {}),
    }


def run_child(spec: dict, cache: str) -> dict:
    steps = "off" if spec["mode"] == "plain" else os.path.join(cache, "fdecode-steps")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "FDECODE_CACHE_DIR": steps}
    return run_json_child([__file__, "--child", json.dumps(spec)], env, str(spec))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["bundled", "depth", "qwen-coder"])
    modes = ["regions", "plain", "unrolled"]
    parser.add_argument("--modes", nargs="+", default=modes, choices=modes)
    parser.add_argument("--depths", nargs="+", type=int, default=[7, 14, 28])
    parser.add_argument("--warmup", action="store_true", help="time step.warmup() instead of the first step")
    parser.add_argument("--all-plans", action="store_true", help="with --warmup: every sampling plan's graph")
    parser.add_argument("--phases", action="store_true", help="where the compile's time goes (per plan with --warmup)")
    parser.add_argument("--compare-isa", action="store_true", help="each mode with and without Inductor's ISA probes")
    parser.add_argument(
        "--compare-batches",
        action="store_true",
        help="each mode with the C++ kernels built one library each and a few to a library",
    )
    parser.add_argument(
        "--compare-rules", action="store_true", help="each mode with Inductor's dtype rules bound per op and once"
    )
    parser.add_argument("--backend", default=None, help="DecodeConfig.backend (default: the config's, inductor)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: bundled, regions, eager, cold only, 2 steps")
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if args.quick:
        args.workloads, args.modes, args.backend = ["bundled"], ["regions"], args.backend or "eager"
    rows = []
    for workload in args.workloads:
        if workload == "qwen-coder":
            from fdecode.assets.qwen_coder import missing_reason

            reason = missing_reason()
            if reason is not None:
                print(f"skipping qwen-coder: {reason}", file=sys.stderr)
                continue
        for layers in args.depths if workload == "depth" else [0]:
            isas = ("probed", "trusted") if args.compare_isa else ("trusted",)
            kernels = ("single", "batched") if args.compare_batches else ("batched",)
            rules = ("per-op", "once") if args.compare_rules else ("once",)
            runs = [(m, i, b, r) for m in args.modes for i in isas for b in kernels for r in rules]
            for mode, isa, built, bound in runs:
                with tempfile.TemporaryDirectory(prefix="fdecode-cold-") as cache:
                    for start in ("cold",) if args.quick else ("cold", "warm"):
                        spec = {
                            "workload": workload,
                            "layers": layers,
                            "mode": mode,
                            "start": start,
                            "warmup": args.warmup,
                            "all_plans": args.all_plans,
                            "isa": isa,
                            "kernels": built,
                            "rules": bound,
                            "phases": args.phases,
                            "backend": args.backend,
                            "steps": 2 if args.quick else 20,
                        }
                        row = run_child(spec, cache)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    if args.warmup:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"bench_cold_start_py_warmup": rows, "load": os.getloadavg()}, f, indent=1)
        for r in rows:
            print(
                f"{r['workload']} {r['mode']} {r['kernels']} kernels {r['start']}: warmup {r['warmup_s']} s ({r['warmup_cpu_s']} CPU s), "
                f"{r['graphs']} graphs, {r['loaded']} loaded"
            )
            for plan, seconds in (r.get("phases") or {}).items():  # the spec's False without --phases
                print(f"    {plan}: {seconds}")
        return 0
    for a in rows:  # the two modes and starts of a workload commit the same first tokens
        same = [b for b in rows if (b["workload"], b["layers"]) == (a["workload"], a["layers"])]
        assert all(b["first_tokens"] == a["first_tokens"] for b in same), "modes disagree on tokens"
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench_cold_start_py_run": rows, "load": os.getloadavg()}, f, indent=1)
    print(
        "| workload | layers | mode | ISA | C++ kernels | dtype rules | start | first step s | prefill s | first call s | CPU s | "
        "FX cache hit/miss | graphs loaded | step ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['workload']} | {r['layers'] or ''} | {r['mode']} | {r['isa']} | {r['kernels']} | {r.get('rules', 'once')} | {r['start']} | "
            f"{r['first_step_s']} | {r['prefill_s']} | {r['first_call_s']} | "
            f"{r['first_step_cpu_s']} | {r['fx_cache_hits']}/{r['fx_cache_misses']} | {r['loaded']} | "
            f"{r['step_ms']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
