"""Step time of the one graph for every window (`DecodeConfig.dynamic_window=True`, the default) against
a graph per window (`dynamic_window=False`), side by side in one process.

    python bench/dynamic_window.py            # B = 1 and 4, 3 reps, inductor
    python bench/dynamic_window.py --quick    # a smoke run

Model: a random 4-layer Llama (hidden 256, vocabulary 4096) with a random 1-layer draft, K = 3, greedy,
float32, max_seq_len 512 (windows of 256 and 512 tokens). Both steps are compiled and warmed through
every window first (`warmup()`, not timed); then each rep decodes `--new-tokens` tokens from a 24-token
prompt per lane with each step in turn, so a stream crosses from the 256- to the 512-token window and a
change in the machine's load hits both alike. The figure is the median (min-max) ms per step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import fdecode
from fdecode.bench import fdecode_loop, llama, synchronize


def decode(step, prompts, new_tokens: int, steps: int) -> tuple[float, list]:
    """Seconds per step of one greedy run of `steps` steps from a fresh prefill (device-resident, outputs
    read at the end: `fdecode.bench.loops.fdecode_loop`), and the tokens."""
    synchronize()
    start = time.perf_counter()
    outs, _ = fdecode_loop(step, prompts, new_tokens, steps)
    synchronize()
    return (time.perf_counter() - start) / steps, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--new-tokens", type=int, default=400)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.batch, args.new_tokens, args.reps, args.backend = [1], 64, 1, "aot_eager"
    target, draft = llama(4096, 256, 4, seed=1), llama(4096, 128, 1, seed=2)
    gen = torch.Generator().manual_seed(0)
    print("| B | graphs | ms/step (min-max) | x graph per window | steps | graphs compiled |")
    print("|---|---|---|---|---|---|")
    for batch in args.batch:
        prompts = [torch.randint(0, 4096, (24,), generator=gen).tolist() for _ in range(batch)]
        steps = {}
        for dynamic in (False, True):
            cfg = fdecode.DecodeConfig(
                num_draft_tokens=3,
                max_batch=batch,
                max_seq_len=512,
                sampling=False,
                backend=args.backend,
                dynamic_window=dynamic,
            )
            step = fdecode.compile(target, draft, cfg, announce=False)
            step.warmup()
            steps[dynamic] = step
        _, needed = fdecode_loop(steps[False], prompts, args.new_tokens)  # steps until every lane finished
        times, tokens = {False: [], True: []}, {}
        for _ in range(args.reps):
            for dynamic, step in steps.items():
                seconds, tokens[dynamic] = decode(step, prompts, args.new_tokens, needed)
                times[dynamic].append(seconds)
        assert tokens[False] == tokens[True], "the two steps gave different tokens"
        base = statistics.median(times[False])
        for dynamic in (False, True):
            ts = times[dynamic]
            label = "one for every window" if dynamic else "one per window"
            print(
                f"| {batch} | {label} | {statistics.median(ts) * 1e3:.2f} ({min(ts) * 1e3:.2f}-{max(ts) * 1e3:.2f}) | "
                f"{statistics.median(ts) / base:.2f} | {needed} | {len(steps[dynamic].graphs)} |",
                flush=True,
            )
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, backend {args.backend}", file=sys.stderr)


if __name__ == "__main__":
    main()
