"""`fdecode bench --workloads moe-experts`: MoE step time against the number of experts E at a fixed top-k
(docs/design.md, "Mixture of experts").

A random GLM-4.5-shaped target (`fdecode.bench.models.glm4_moe`: 4 layers, the first dense, hidden 256,
vocabulary 4,096) whose MoE layers have E routed experts (E in `EXPERTS`), top-k 2 and one shared expert,
with its MTP head (an MoE layer too) as the draft, greedy-only graph, for each batch and K of the command.
Every E has the same active parameters per token (k routed + 1 shared expert); only the experts' total
grows, so the step should cost what the used experts cost, not E. Each figure: seconds per step over
`steps` device-resident steps from a fresh (untimed) prefill, the median (min-max) of `reps` rounds after a
warm-up round (which compiles), every E round-robin in one process (`fdecode.bench.timing.
interleaved_seconds`), with its ratio to the first E. `--quick`: hidden 64, vocabulary 512, E = 4 and 8.
"""

from __future__ import annotations

import sys

import torch

import fdecode
from fdecode.bench.host import timed_run
from fdecode.bench.models import glm4_moe
from fdecode.bench.registry import Options
from fdecode.bench.timing import interleaved_seconds

EXPERTS = (8, 64)
TOP_K = 2


def run(options: Options) -> list[dict]:
    hidden, vocab, steps, experts = (64, 512, 3, (4, 8)) if options.quick else (256, 4096, 10, EXPERTS)
    models = {e: glm4_moe(vocab, hidden, 4, seed=1, experts=e, top_k=TOP_K) for e in experts}
    gen = torch.Generator().manual_seed(0)
    rows = []
    for batch in options.batches:
        prompts = [torch.randint(0, vocab, (32,), generator=gen).tolist() for _ in range(batch)]
        for k in options.ks:
            print(f"... moe-experts B={batch} K={k} E={experts}", file=sys.stderr, flush=True)
            cfg = fdecode.DecodeConfig(
                num_draft_tokens=k,
                max_batch=batch,
                max_seq_len=32 + batch + (steps + 2) * (k + 1),
                sampling=False,
                device=options.device,
                dtype=options.dtype,
                backend=options.backend,
            )
            compiled = {e: fdecode.compile(model, "mtp", cfg, announce=False) for e, model in models.items()}
            timed = interleaved_seconds(
                {e: (lambda s=s: timed_run(s, prompts, steps)[0]) for e, s in compiled.items()}, options.reps
            )
            first = timed[experts[0]][0]
            for e, (med, lo, hi) in timed.items():
                rows.append(
                    {
                        "workload": "moe-experts",
                        "batch": batch,
                        "k": k,
                        "experts": e,
                        "top_k": TOP_K,
                        "pairs_per_moe_layer": batch * (k + 1) * TOP_K,  # (token, routed expert) pairs a verify
                        "backend": compiled[e].backend,
                        "step_ms": 1e3 * med,
                        "step_ms_min": 1e3 * lo,
                        "step_ms_max": 1e3 * hi,
                        "ratio": med / first,
                    }
                )
    return rows


def markdown(rows: list[dict]) -> str:
    first = rows[0]["experts"] if rows else ""
    lines = [
        f"| B | K | E | top-k | (token, expert) pairs per MoE layer | ms/step (min-max) | x E = {first} |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['k']} | {r['experts']} | {r['top_k']} | {r['pairs_per_moe_layer']} | "
            f"{r['step_ms']:.2f} ({r['step_ms_min']:.2f}-{r['step_ms_max']:.2f}) | {r['ratio']:.2f}x |"
        )
    return "\n".join(lines)
