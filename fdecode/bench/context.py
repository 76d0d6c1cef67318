"""`fdecode bench --workloads context`: step time against the lane's capacity and the real context, and what
context buckets buy (docs/design.md, "Context buckets").

A random Llama target (hidden 256, 4 layers, vocabulary 4,096) and a 1-layer draft, greedy-only graph
(`sampling=False`), for each batch and K of the command. Points: a ~100-token context at max_seq_len 256,
1,024, 4,096 and 16,384 (the step should not grow with the capacity), then contexts of 500 to 4,000 tokens
at max_seq_len 4,096 (it should grow with the context). At each point two steps side by side: the default
context buckets (a step attends over the smallest window holding its positions) and `context_buckets=
(max_seq_len,)`, every step attending over the whole lane. Each figure: seconds per step over `steps`
device-resident steps from a fresh (untimed) prefill, the median (min-max) of `reps` rounds after a warm-up
round, the two steps round-robin (`fdecode.bench.timing.interleaved_seconds`). `--quick`: hidden 64, 2
layers, vocabulary 256, two capacities and one longer context, 3 steps.
"""

from __future__ import annotations

import sys

import torch

import fdecode
from fdecode.bench.host import timed_run
from fdecode.bench.models import llama
from fdecode.bench.registry import Options
from fdecode.bench.timing import interleaved_seconds

# (max_seq_len, context tokens) of each point; `--quick`'s
POINTS = ((256, 100), (1024, 100), (4096, 100), (16384, 100), (4096, 500), (4096, 1000), (4096, 2000), (4096, 4000))
QUICK_POINTS = ((256, 100), (1024, 100), (1024, 400))


def run(options: Options) -> list[dict]:
    hidden, layers, vocab, steps, points = (
        (64, 2, 256, 3, QUICK_POINTS) if options.quick else (256, 4, 4096, 10, POINTS)
    )
    target, draft = llama(vocab, hidden, layers, seed=1), llama(vocab, hidden, 1, seed=2)
    gen = torch.Generator().manual_seed(0)
    compiled: dict[tuple, fdecode.Step] = {}  # (max_seq_len, batch, K, whole lane) -> its step, reused across points

    def step_for(max_seq_len: int, batch: int, k: int, whole: bool):
        key = (max_seq_len, batch, k, whole)
        if key not in compiled:
            cfg = fdecode.DecodeConfig(
                num_draft_tokens=k,
                max_batch=batch,
                max_seq_len=max_seq_len,
                sampling=False,
                context_buckets=(max_seq_len,) if whole else None,
                device=options.device,
                dtype=options.dtype,
                backend=options.backend,
            )
            compiled[key] = fdecode.compile(target, draft, cfg, announce=False)
        return compiled[key]

    rows = []
    for batch in options.batches:
        for k in options.ks:
            for max_seq_len, context in points:
                print(f"... context B={batch} K={k} max_seq_len={max_seq_len} context={context}", file=sys.stderr)
                prompts = [torch.randint(0, vocab, (context,), generator=gen).tolist() for _ in range(batch)]
                buckets, whole = step_for(max_seq_len, batch, k, False), step_for(max_seq_len, batch, k, True)
                timed = interleaved_seconds(
                    {
                        "buckets": lambda: timed_run(buckets, prompts, steps)[0],
                        "whole lane": lambda: timed_run(whole, prompts, steps)[0],
                    },
                    options.reps,
                )
                (b, b_lo, b_hi), (w, w_lo, w_hi) = timed["buckets"], timed["whole lane"]
                window = buckets.config.bucket_for(context + batch + steps * buckets.config.W)
                rows.append(
                    {
                        "workload": "context",
                        "batch": batch,
                        "k": k,
                        "max_seq_len": max_seq_len,
                        "context": context,
                        "window": window * buckets.config.block_size,
                        "backend": buckets.backend,
                        "buckets_ms": 1e3 * b,
                        "buckets_ms_min": 1e3 * b_lo,
                        "buckets_ms_max": 1e3 * b_hi,
                        "whole_lane_ms": 1e3 * w,
                        "whole_lane_ms_min": 1e3 * w_lo,
                        "whole_lane_ms_max": 1e3 * w_hi,
                    }
                )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| B | K | max_seq_len | context | window | buckets ms/step (min-max) | whole lane ms/step (min-max) "
        "| whole lane / buckets |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['k']} | {r['max_seq_len']} | {r['context']} | {r['window']} | "
            f"{r['buckets_ms']:.2f} ({r['buckets_ms_min']:.2f}-{r['buckets_ms_max']:.2f}) | "
            f"{r['whole_lane_ms']:.2f} ({r['whole_lane_ms_min']:.2f}-{r['whole_lane_ms_max']:.2f}) | "
            f"{r['whole_lane_ms'] / r['buckets_ms']:.2f}x |"
        )
    return "\n".join(lines)
