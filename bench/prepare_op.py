"""Micro-benchmark: `fdecode::prepare_next_draft` against the unfused small ops it replaces.

    python bench/prepare_op.py [--batch 1 4 16 64] [--hidden 1024]
    python bench/prepare_op.py --quick     # a smoke run: B = 1, H = 64, few calls, aot_eager

Three ways to compute the next draft's rows for B lanes, on the same inputs:
- unfused: the reference written as ~30 small torch ops, run eagerly (what a step
  without the fused op would launch one by one);
- op: the registered custom op (on CPU its implementation is that same reference, so
  this measures only the dispatch cost of making it one graph node);
- compiled: the reference compiled by Inductor into one fused kernel, which is what the
  op buys inside a compiled step (and what a device kernel gives on GPU / NPU).
Reports the median microseconds per call of each, side by side in one run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import fdecode  # noqa: F401 - registers the op
from fdecode.ops.prepare import prepare_next_draft_reference


def inputs(batch: int, hidden: int, k: int = 3, block_size: int = 16):
    gen = torch.Generator().manual_seed(0)
    window = k + 1
    length = torch.randint(0, window + 1, (batch,), generator=gen)
    accepted = torch.where(
        torch.arange(window) < length[:, None], torch.randint(0, 1000, (batch, window), generator=gen), -1
    )
    base_pos = torch.randint(0, 500, (batch,), generator=gen)
    tables = torch.randperm(batch * 40, generator=gen).view(batch, 40) + 1
    return (
        accepted,
        torch.randn(batch, window, hidden, generator=gen),
        torch.zeros(hidden),
        base_pos,
        base_pos + 1,
        tables,
        block_size,
    )


def per_call_us(fn, args, reps: int = 300) -> float:
    for _ in range(min(reps, 20)):
        fn(*args)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            fn(*args)
        times.append((time.perf_counter() - start) / reps * 1e6)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--quick", action="store_true", help="a smoke run: B = 1, H = 64, 5 calls a timing")
    args = p.parse_args()
    reps = 5 if args.quick else 300
    if args.quick:
        args.batch, args.hidden = [1], 64
    backend = "aot_eager" if args.quick else "inductor"  # the smoke run skips Inductor's code generation
    compiled = torch.compile(prepare_next_draft_reference, fullgraph=True, dynamic=False, backend=backend)
    print(
        f"| B | unfused eager (us) | custom op (us) | compiled fused (us) | unfused / fused |  (H = {args.hidden}, K = 3)"
    )
    print("|---|---|---|---|---|")
    for batch in args.batch:
        a = inputs(batch, args.hidden)
        unfused = per_call_us(prepare_next_draft_reference, a, reps)
        op = per_call_us(torch.ops.fdecode.prepare_next_draft, a, reps)
        fused = per_call_us(compiled, a, reps)
        print(f"| {batch} | {unfused:.1f} | {op:.1f} | {fused:.1f} | {unfused / fused:.1f}x |")


if __name__ == "__main__":
    main()
