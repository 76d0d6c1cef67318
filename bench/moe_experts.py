"""MoE step time against the number of experts E at a fixed top-k: the cost follows the used experts.

    taskset -c 1 env OMP_NUM_THREADS=1 python bench/moe_experts.py            # E = 8 vs 64, ~5 min on 1 core
    python bench/moe_experts.py --quick                                       # small sizes (smoke run)

Model: a random GLM-4.5-shaped `glm4_moe` target (4 layers, the first dense, hidden 256, GQA 4:2 heads
of 64, partial RoPE, vocabulary 4096) whose MoE layers have E routed experts of intermediate 256,
top-k 2 and one shared expert, with its MTP head (an MoE layer too) as the draft, K = 3. Every E has
the same active parameters per token (k routed + 1 shared expert); only the experts' total grows (E = 64:
8x the expert weights of E = 8). The router's logits are the one part that grows with E ([N, E]).

Each figure: the compiled step's median seconds per step over `--reps` runs of `--steps`
device-resident steps after a fresh (untimed) prefill, the E values measured interleaved in one process,
so their ratio is side by side. Greedy-only graph, inductor unless --backend says otherwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import fdecode
from fdecode.bench import fdecode_loop, synchronize
from fdecode.models.families.glm4_moe import Glm4MoeConfig, Glm4MoeModel, Glm4MoeMTPHead
from fdecode.models.moe_config import MoEConfig


def glm_shaped(num_experts: int, *, hidden: int, vocab: int, top_k: int, seed: int) -> Glm4MoeModel:
    cfg = Glm4MoeConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=hidden // 4,
        attention_bias=True,
        model_type="glm4_moe",
        first_k_dense_replace=1,
        moe=MoEConfig(num_experts=num_experts, top_k=top_k, moe_intermediate_size=hidden, n_shared_experts=1),
        mtp_num_layers=1,
    )
    model = Glm4MoeModel.random(cfg, seed=seed, std=0.05)
    model.mtp = Glm4MoeMTPHead.random(cfg, seed=seed + 1, std=0.05).bind(model)
    return model


def time_steps(step, prompts, new_tokens: int, steps: int) -> float:
    """Seconds per step over `steps` device-resident steps after a fresh prefill (not timed)."""
    state = step.prefill(prompts, max_new_tokens=new_tokens)
    synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        state, out = step(state)
    out.packed[0, 0].item()  # waits for the last step
    return (time.perf_counter() - start) / steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experts", type=int, nargs="+", default=[8, 64])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--backend", default="inductor")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    args = p.parse_args(argv)
    hidden, vocab, k = 256, 4096, 3
    if args.quick:
        hidden, vocab, args.steps, args.reps, args.batches = 64, 512, 3, 1, [1]
    gen = torch.Generator().manual_seed(0)
    rows = []
    for batch in args.batches:
        prompts = [torch.randint(0, vocab, (32,), generator=gen).tolist() for _ in range(batch)]
        new_tokens = (args.steps + 1) * (k + 1) + 1
        steps, compile_s = {}, {}
        for e in args.experts:
            cfg = fdecode.DecodeConfig(
                num_draft_tokens=k, max_batch=batch, max_seq_len=256, backend=args.backend, sampling=False
            )
            start = time.perf_counter()
            steps[e] = fdecode.compile(glm_shaped(e, hidden=hidden, vocab=vocab, top_k=args.top_k, seed=1), "mtp", cfg)
            fdecode_loop(steps[e], prompts, new_tokens, steps=1)  # compiles
            compile_s[e] = time.perf_counter() - start
        times: dict[int, list[float]] = {e: [] for e in args.experts}
        for _ in range(args.reps):  # interleaved: every rep measures every E
            for e in args.experts:
                times[e].append(time_steps(steps[e], prompts, new_tokens, args.steps))
        base = statistics.median(times[args.experts[0]])
        for e in args.experts:
            med = statistics.median(times[e])
            rows.append(
                {
                    "batch": batch,
                    "experts": e,
                    "top_k": args.top_k,
                    "pairs_per_moe_layer": batch * (k + 1) * args.top_k,
                    "ms_per_step": 1e3 * med,
                    "min_ms": 1e3 * min(times[e]),
                    "max_ms": 1e3 * max(times[e]),
                    "vs_first": med / base,
                    "compile_s": compile_s[e],
                }
            )
    print(
        f"| B | E | top-k | (token, expert) pairs per MoE layer | ms/step (min-max) | vs E = {args.experts[0]} | compile s |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['batch']} | {r['experts']} | {r['top_k']} | {r['pairs_per_moe_layer']} | {r['ms_per_step']:.1f} "
            f"({r['min_ms']:.1f}-{r['max_ms']:.1f}) | {r['vs_first']:.2f}x | {r['compile_s']:.0f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
