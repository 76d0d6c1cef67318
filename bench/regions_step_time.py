"""Step time of two ways to compile one step, side by side in one process.

    python bench/regions_step_time.py                       # the bundled model (MTP, K = 3) and a 7-layer pair
    python bench/regions_step_time.py --workloads bundled --rounds 30
    python bench/regions_step_time.py --compare stored      # a stored (ahead-of-time) graph against torch.compile's

--compare regions (the default): each layer kind compiled once (`layer_regions=True`) against every copy
unrolled. --compare stored: the graph `fdecode.graphs.stored` keeps on disk (compiled with `aot_compile`,
run with its guards checked by the loaded function) against the plain `torch.compile` of the same step
(`FDECODE_CACHE_DIR=off`), both at the default `layer_regions`.

Both steps are compiled (Inductor) from the same models and config, run the same greedy stream from one
prompt, and are timed interleaved: each round times `--steps` steps of one, then of the other, from a
fresh prefill each (so both attend over the same windows). Reported: the median step time of each over
the rounds and their ratio (first / second; the issue's bound is 1.03), with the tokens of the two
checked equal.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from unittest import mock


def workload(name: str):
    import torch

    import fdecode
    from fdecode.models import from_hf

    if name == "bundled":
        from fdecode.assets import TINY

        cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=1, max_seq_len=160, sampling=False)
        return from_hf(TINY, dtype=torch.float32), "mtp", cfg, list(b"def fibonacci(n):\n    ")
    from fdecode.bench import llama

    cfg = fdecode.DecodeConfig(num_draft_tokens=4, max_batch=1, max_seq_len=256, sampling=False)
    return llama(4096, 256, 7, seed=0), llama(4096, 256, 2, seed=1), cfg, list(range(10, 70))


# --compare: the two ways, each (name, DecodeConfig fields, FDECODE_CACHE_DIR while it compiles or None: as set)
COMPARE = {
    "regions": (("regions", {"layer_regions": True}, None), ("unrolled", {"layer_regions": False}, None)),
    "stored": (("stored", {}, None), ("plain", {}, "off")),
}


def timed(step, prompt: list[int], steps: int) -> tuple[float, list[list[int]]]:
    state = step.prefill([prompt], max_new_tokens=steps * (step.config.K + 1) + 1)
    tokens, start = [], time.perf_counter()
    for _ in range(steps):
        state, out = step(state)
        tokens.append(out.tokens.tolist())
    return (time.perf_counter() - start) / steps, tokens


def main() -> int:
    import fdecode

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["bundled", "depth7"])
    parser.add_argument("--compare", choices=sorted(COMPARE), default="regions")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    (first, _, _), (second, _, _) = ways = COMPARE[args.compare]
    for name in args.workloads:
        target, draft, cfg, prompt = workload(name)
        steps = {}
        for mode, fields, cache in ways:
            steps[mode] = fdecode.compile(target, draft, dataclasses.replace(cfg, **fields), announce=False)
            with mock.patch.dict(os.environ, {} if cache is None else {"FDECODE_CACHE_DIR": cache}):
                timed(steps[mode], prompt, args.steps)  # compile, and warm the windows the stream crosses
        times = {mode: [] for mode in steps}
        for _ in range(args.rounds):
            seen = []
            for mode, step in steps.items():
                seconds, tokens = timed(step, prompt, args.steps)
                times[mode].append(seconds)
                seen.append(tokens)
            assert seen[0] == seen[1], f"{first} and {second} steps disagree"
        med = {mode: statistics.median(t) * 1000 for mode, t in times.items()}
        row = {
            "workload": name,
            f"{first}_ms": round(med[first], 3),
            f"{second}_ms": round(med[second], 3),
            "ratio": round(med[first] / med[second], 3),
            "rounds": args.rounds,
            "steps": args.steps,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench_regions_step_time_py_run": rows, "load": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
