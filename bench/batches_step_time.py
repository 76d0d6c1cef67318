"""Step time with the C++ kernels built one library each against a few to a library, interleaved in one process.

    python bench/batches_step_time.py --workload bundled --layers unrolled
    python bench/batches_step_time.py --workload qwen-coder --layers regions --rounds 4 --steps 8

Compiles the same greedy step twice in one process (the stored graphs off, so each is a compile of its own):
once with Inductor's one library per kernel (`fdecode.backends.cpu.kernel_batches` switched off), once with the
kernel batches (the default), then runs them in alternating order for `--rounds` rounds of `--steps` steps
from a fresh prefill each, and prints the median step time of each, their ratio and whether their tokens
are equal. The kernels' code is the same either way; this checks that loading them from one library
changes nothing in a step. Workloads as in `bench/cold_start.py`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

os.environ["FDECODE_CACHE_DIR"] = "off"  # before fdecode reads it: both steps compile in this process


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="bundled", choices=["bundled", "qwen-coder"])
    parser.add_argument("--layers", default="unrolled", choices=["unrolled", "regions"])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=120)
    args = parser.parse_args()

    import cold_start
    import torch

    import fdecode

    target, draft, cfg, prompt = cold_start.models(args.workload, 0)
    cfg = dataclasses.replace(cfg, sampling=False, layer_regions=args.layers == "regions")
    steps, first = {}, {}
    for name in ("single", "batched"):
        cold_start.use_kernel_batches(name == "batched")
        step = fdecode.compile(target, draft, cfg, announce=False)
        state = step.prefill([prompt], max_new_tokens=args.new_tokens)
        start = time.perf_counter()
        step(state)
        first[name] = round(time.perf_counter() - start, 2)
        steps[name] = step
    cold_start.use_kernel_batches(True)
    times: dict[str, list[float]] = {name: [] for name in steps}
    tokens: dict[str, list] = {}
    for r in range(args.rounds):
        order = list(steps.items()) if r % 2 == 0 else list(steps.items())[::-1]
        for name, step in order:
            state = step.prefill([prompt], max_new_tokens=args.new_tokens)
            seen = []
            with torch.no_grad():
                for _ in range(args.steps):
                    start = time.perf_counter()
                    state, out = step(state)
                    seen.append(out.tokens.tolist())  # waits for the step
                    times[name].append(time.perf_counter() - start)
            tokens.setdefault(name, seen)
    ms = {name: round(1000 * statistics.median(values), 3) for name, values in times.items()}
    print(
        json.dumps(
            {
                "workload": args.workload,
                "layers": args.layers,
                "rounds": args.rounds,
                "steps": args.steps,
                "first_call_s": first,
                "step_ms": ms,
                "batched_over_single": round(ms["batched"] / ms["single"], 4),
                "tokens_equal": tokens["single"] == tokens["batched"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
