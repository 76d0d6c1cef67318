"""`fdecode bench --workloads prefill`: prefill time, attending over the prompts' context bucket against the
whole lane (docs/design.md, "Priming").

The context workload's random Llama target (hidden 256, 4 layers, vocabulary 4,096) and 1-layer draft
(`fdecode.bench.context`), greedy, max_seq_len 4,096, for each batch and K of the command: prompts of 100 and
1,000 tokens. Priming attends over `DecodeConfig.bucket_for(longest prompt - 1)` (the default buckets 256,
512, ... then the whole lane); "whole lane" is the same step built with `context_buckets=(max_seq_len,)`,
whose only window is the lane. Prefill runs eagerly whatever the backend. Each figure: seconds of one
`step.prefill(prompts)` until its first tokens are on the device, the median (min-max) of `reps` rounds
after a warm-up round, the two steps round-robin on the same prompts (`fdecode.bench.timing.
interleaved_seconds`). `--quick`: hidden 64, vocabulary 256, max_seq_len 1,024, prompts of 100 tokens.
"""

from __future__ import annotations

import sys
import time

import torch

import fdecode
from fdecode.bench.models import llama
from fdecode.bench.registry import Options
from fdecode.bench.timing import interleaved_seconds, synchronize

PROMPT_TOKENS = (100, 1000)


def prefill_seconds(step, prompts: list[list[int]]) -> float:
    """Seconds of one prefill of `prompts`, its first tokens on the device."""
    synchronize()
    start = time.perf_counter()
    state = step.prefill(prompts, max_new_tokens=16)
    synchronize()
    seconds = time.perf_counter() - start
    del state
    return seconds


def run(options: Options) -> list[dict]:
    hidden, vocab, max_seq_len, lengths = (64, 256, 1024, (100,)) if options.quick else (256, 4096, 4096, PROMPT_TOKENS)
    target, draft = llama(vocab, hidden, 4, seed=1), llama(vocab, hidden, 1, seed=2)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for batch in options.batches:
        for k in options.ks:
            base = dict(num_draft_tokens=k, max_batch=batch, max_seq_len=max_seq_len, sampling=False)
            base.update(device=options.device, dtype=options.dtype, backend=options.backend)
            bucketed = fdecode.compile(target, draft, fdecode.DecodeConfig(**base), announce=False)
            whole = fdecode.compile(
                target, draft, fdecode.DecodeConfig(**base, context_buckets=(max_seq_len,)), announce=False
            )
            for length in lengths:
                print(f"... prefill B={batch} K={k} prompts of {length} tokens", file=sys.stderr, flush=True)
                prompts = [torch.randint(0, vocab, (length,), generator=gen).tolist() for _ in range(batch)]
                timed = interleaved_seconds(
                    {
                        "bucketed": lambda: prefill_seconds(bucketed, prompts),
                        "whole": lambda: prefill_seconds(whole, prompts),
                    },
                    options.reps,
                )
                (b, b_lo, b_hi), (w, w_lo, w_hi) = timed["bucketed"], timed["whole"]
                rows.append(
                    {
                        "workload": "prefill",
                        "batch": batch,
                        "k": k,
                        "max_seq_len": max_seq_len,
                        "prompt_tokens": length,
                        "window": bucketed.config.bucket_for(length - 1) * bucketed.config.block_size,
                        "bucketed_ms": 1e3 * b,
                        "bucketed_ms_min": 1e3 * b_lo,
                        "bucketed_ms_max": 1e3 * b_hi,
                        "whole_lane_ms": 1e3 * w,
                        "whole_lane_ms_min": 1e3 * w_lo,
                        "whole_lane_ms_max": 1e3 * w_hi,
                        "threads": torch.get_num_threads(),
                    }
                )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| B | K | max_seq_len | prompt tokens | window | bucketed ms (min-max) | whole lane ms (min-max) "
        "| whole lane / bucketed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['k']} | {r['max_seq_len']} | {r['prompt_tokens']} | {r['window']} | "
            f"{r['bucketed_ms']:.1f} ({r['bucketed_ms_min']:.1f}-{r['bucketed_ms_max']:.1f}) | "
            f"{r['whole_lane_ms']:.1f} ({r['whole_lane_ms_min']:.1f}-{r['whole_lane_ms_max']:.1f}) | "
            f"{r['whole_lane_ms'] / r['bucketed_ms']:.2f}x |"
        )
    return "\n".join(lines)
