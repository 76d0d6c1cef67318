"""Step time against max_seq_len and against the real context: what context buckets buy.

    python bench/context.py                      # the issue-9 table, ~10 min on 2 CPU cores
    python bench/context.py --quick              # small sizes (smoke run)

Part 1, real context ~100 tokens, max_seq_len 256 / 1024 / 4096 / 16384, batch 1 and 8:
the compiled step with context buckets (the default) and, side by side in the same
process, the same step attending over the whole lane (`context_buckets=(max_seq_len,)`,
what fdecode did before buckets).
Part 2, max_seq_len fixed, real context growing from 100 to ~4000 tokens: the step
time should grow roughly with the context, not sit at the maximum.

Model: the issue's configuration, a random 4-layer Llama (hidden 256, vocabulary 4096)
with a random 1-layer draft, K = 3 (4 query tokens), greedy-only graph, inductor.
Each figure: median of `--reps` runs of `--steps` device-resident steps (min-max shown),
each run from a fresh prefill at the stated context; compile time reported per window.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import fdecode
from fdecode.bench import llama


def time_steps(step, prompts, steps: int, reps: int) -> tuple[float, float, float]:
    """Median, min, max seconds per step over `reps` runs of `steps` steps from a fresh prefill."""
    times = []
    for _ in range(reps + 1):  # the first run compiles (and warms up)
        state = step.prefill(prompts, max_new_tokens=steps * step.config.W + 1)
        start = time.perf_counter()
        for _ in range(steps):
            state, out = step(state)
        out.packed[0, 0].item()  # wait for the last step (a no-op wait on CPU, a sync on a device)
        times.append((time.perf_counter() - start) / steps)
    times = times[1:]
    return statistics.median(times), min(times), max(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--backend", default="inductor")
    p.add_argument("--json", default="bench/results/context.json")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths, batches, growth, growth_max = [256, 1024, 4096, 16384], [1, 8], [100, 500, 1000, 2000, 4000], 4096
    hidden, vocab = 256, 4096
    if args.quick:
        lengths, batches, growth, growth_max, hidden, vocab = [256, 1024], [1], [100, 400], 1024, 64, 256
        args.steps, args.reps = 3, 1
    target = llama(vocab, hidden, 4, seed=1)
    draft = llama(vocab, hidden, 1, seed=2)
    k = 3
    gen = torch.Generator().manual_seed(0)

    def prompts(batch: int, context: int) -> list[list[int]]:
        return [torch.randint(0, vocab, (context,), generator=gen).tolist() for _ in range(batch)]

    def step_for(max_seq_len: int, batch: int, buckets) -> fdecode.Step:
        cfg = fdecode.DecodeConfig(
            num_draft_tokens=k,
            max_batch=batch,
            max_seq_len=max_seq_len,
            backend=args.backend,
            sampling=False,
            context_buckets=buckets,
        )
        return fdecode.compile(target, draft, cfg)

    rows, results = [], {"part1": [], "part2": []}
    for batch in batches:
        for max_seq_len in lengths:
            line = {"batch": batch, "max_seq_len": max_seq_len, "context": 100}
            for label, buckets in (("buckets", None), ("whole lane", (max_seq_len,))):
                print(f"... B={batch} max_seq_len={max_seq_len} {label}", file=sys.stderr, flush=True)
                step = step_for(max_seq_len, batch, buckets)
                med, lo, hi = time_steps(step, prompts(batch, 100), args.steps, args.reps)
                line[label] = {"ms": med * 1e3, "min": lo * 1e3, "max": hi * 1e3, "compile_s": step.compile_seconds}
            results["part1"].append(line)
    base = {b: next(r for r in results["part1"] if r["batch"] == b)["buckets"]["ms"] for b in batches}
    rows.append(
        "| B | max_seq_len | buckets ms/step (min-max) | vs 256 | whole lane ms/step (min-max) | whole/buckets |"
    )
    rows.append("|---|---|---|---|---|---|")
    for r in results["part1"]:
        b, w = r["buckets"], r["whole lane"]
        rows.append(
            f"| {r['batch']} | {r['max_seq_len']} | {b['ms']:.2f} ({b['min']:.2f}-{b['max']:.2f}) | "
            f"{b['ms'] / base[r['batch']]:.2f}x | {w['ms']:.2f} ({w['min']:.2f}-{w['max']:.2f}) | {w['ms'] / b['ms']:.2f}x |"
        )
    rows.append("")
    rows.append(f"| B | context (max_seq_len {growth_max}) | window | ms/step (min-max) |")
    rows.append("|---|---|---|---|")
    for batch in batches:
        step = step_for(growth_max, batch, None)
        for context in growth:
            print(f"... B={batch} context={context}", file=sys.stderr, flush=True)
            med, lo, hi = time_steps(step, prompts(batch, context), args.steps, args.reps)
            window = step.config.bucket_for(context + args.steps * step.config.W) * step.config.block_size
            results["part2"].append({"batch": batch, "context": context, "window_end": window, "ms": med * 1e3})
            rows.append(f"| {batch} | {context} | {window} | {med * 1e3:.2f} ({lo * 1e3:.2f}-{hi * 1e3:.2f}) |")
        results["part2_compile_s"] = step.compile_seconds
    print("\n".join(rows))
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "args": vars(args)}
    with open(args.json, "w") as f:
        json.dump({"meta": meta, **results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
