"""Prefill time at max_seq_len 4096: attending over the prompts' context bucket against the whole lane.

    python bench/prefill.py            # B = 1, 4; prompts of 100 and 1000 tokens; 3 reps, 1 thread (~2 min)
    python bench/prefill.py --quick    # a smoke run

Priming attends over `DecodeConfig.bucket_for(longest prompt - 1)` blocks (the default buckets 256, 512,
1024, 2048 tokens, then the whole lane). "whole lane" is the same step built with
`context_buckets=(max_seq_len,)`, whose only window is the lane: what prefill did before it used buckets
(every layer gathered max_seq_len keys and built [n, 1, T, max_seq_len] masks). Both run in one process
on the same prompts, alternating rep by rep, so a change in the machine's load hits both alike.

Model: the one of `bench/context.py`, a random 4-layer Llama (hidden 256, vocabulary 4096) with a random
1-layer draft, K = 3, greedy, float32, eager (prefill is never compiled). Each figure: the median (min-max)
of `--reps` timed prefills after one untimed one, each `step.prefill(prompts, max_new_tokens=16)` until
its first token is on the device; "attention" is the median time inside the reference attention
(`paged_attention_reference`, wrapped with a timer here) of those prefills. One torch thread by default:
on a shared 2-core machine more threads thrash, and the figures then swing by 2x between runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import fdecode
import fdecode.ops.attention as attention
from fdecode.bench import llama, synchronize

_in_attention = [0.0]  # seconds spent in the reference attention since the last reset


def _timed(reference):
    def call(*args, **kwargs):
        start = time.perf_counter()
        out = reference(*args, **kwargs)
        _in_attention[0] += time.perf_counter() - start
        return out

    return call


def time_prefill(step, prompts) -> tuple[float, float]:
    """Seconds of one prefill, and of its attention."""
    _in_attention[0] = 0.0
    start = time.perf_counter()
    state = step.prefill(prompts, max_new_tokens=16)
    synchronize()
    seconds = time.perf_counter() - start
    del state
    return seconds, _in_attention[0]


def summary(runs: list[tuple[float, float]]) -> dict[str, float]:
    total = [t for t, _ in runs]
    return {
        "ms": statistics.median(total) * 1e3,
        "min": min(total) * 1e3,
        "max": max(total) * 1e3,
        "attention_ms": statistics.median(a for _, a in runs) * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--max-seq-len", type=int, default=4096)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default="bench/results/prefill.json")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, see above)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    attention.paged_attention_reference = _timed(attention.paged_attention_reference)
    batches, contexts, hidden, vocab = [1, 4], [100, 1000], 256, 4096
    if args.quick:
        batches, contexts, hidden, vocab, args.reps = [1], [100], 64, 256, 1
    target = llama(vocab, hidden, 4, seed=1).to(args.device)
    draft = llama(vocab, hidden, 1, seed=2).to(args.device)
    gen = torch.Generator().manual_seed(0)
    rows = [
        "| B | prompt tokens | window | bucketed ms (min-max) | attention | whole lane ms (min-max) | attention "
        "| whole / bucketed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    results = []
    for batch in batches:
        steps = {
            label: fdecode.compile(
                target,
                draft,
                fdecode.DecodeConfig(
                    num_draft_tokens=3,
                    max_batch=batch,
                    max_seq_len=args.max_seq_len,
                    backend="eager",
                    sampling=False,
                    context_buckets=buckets,
                ),
            )
            for label, buckets in (("bucketed", None), ("whole lane", (args.max_seq_len,)))
        }
        for context in contexts:
            prompts = [torch.randint(0, vocab, (context,), generator=gen).tolist() for _ in range(batch)]
            line = {"batch": batch, "context": context}
            line["window"] = steps["bucketed"].config.bucket_for(context - 1) * steps["bucketed"].config.block_size
            print(f"... B={batch} prompt={context}", file=sys.stderr, flush=True)
            runs = {label: [] for label in steps}
            for rep in range(args.reps + 1):  # rep 0 warms up the allocator and kernels, untimed
                for label, step in steps.items():
                    timed = time_prefill(step, prompts)
                    if rep:
                        runs[label].append(timed)
            line.update({label: summary(r) for label, r in runs.items()})
            results.append(line)
            b, w = line["bucketed"], line["whole lane"]
            rows.append(
                f"| {batch} | {context} | {line['window']} | {b['ms']:.0f} ({b['min']:.0f}-{b['max']:.0f}) | "
                f"{b['attention_ms']:.0f} | {w['ms']:.0f} ({w['min']:.0f}-{w['max']:.0f}) | {w['attention_ms']:.0f} | "
                f"{w['ms'] / b['ms']:.2f}x |"
            )
    print("\n".join(rows))
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "args": vars(args)}
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
