"""Each depth of the real pair's step, fixed and adaptive, side by side in one process.

    python bench/depths.py --rounds 2 --json bench/results/depths.json   # Qwen2.5-Coder 1.5B + 0.5B, fp32, B = 1, K = 4

One step is compiled (inductor, greedy graph, one 256-token window, `adaptive_depth=True`); each depth's
graph is compiled before anything is timed (`warmup(depths=0 .. K)`, which also times them: the controller's
starting costs). For every prompt (`--prompts`, default the qwen-coder workload's three) the script decodes
`--new` tokens (no EOS stop) at each fixed depth 0 .. K (`step(state, depth=d)`, read at once; depth 0 is
target-only), then through an `Engine` at depth K and with the Engine choosing the depth
(`fdecode.runtime.depth`); an Engine reads one step behind, except at a request's end (`Engine._ending`):
compare the two Engine rows. Every row runs once per round, rounds back to back (`--rounds`), and the median
is reported, with its ratio to the best fixed depth >= 1, the mean tokens per step, the median step time of
each depth and the depths the controller launched. The tokens of every run of a prompt must be equal
(greedy is lossless); the script asserts it. Skipped, naming the script that fetches the pair, when the
models are missing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import fdecode
from fdecode.assets import qwen_coder
from fdecode.bench.pair import PROMPTS as PAIR_PROMPTS
from fdecode.bench.pair import chat_ids
from fdecode.ops.plan import GREEDY
from fdecode.runtime.depth import depth_costs


def fixed(step, prompt: list[int], depth: int, new: int) -> dict:
    state = step.prefill([prompt], max_new_tokens=new, ignore_eos=True)
    tokens, times = state.step_output.tokens[0, :1].tolist(), []
    start = time.perf_counter()
    while not bool(state.step_output.finished[0]):
        t = time.perf_counter()
        state, out = step(state, depth=depth)
        n = int(out.num_tokens[0])  # reads the output: the step has run (CPU)
        times.append(time.perf_counter() - t)
        tokens += out.tokens[0, :n].tolist()
    seconds = time.perf_counter() - start
    return {
        "tokens": tokens,
        "tok_s": (len(tokens) - 1) / seconds,
        "steps": len(times),
        "per_step": (len(tokens) - 1) / len(times),
        "step_ms": 1000 * statistics.median(times),
    }


def adaptive(step, prompt: list[int], new: int, depths: tuple[int, ...] | None = None) -> dict:
    """Through an `Engine` (reads one step behind, and the last output before launching past the end), choosing among
    `depths` (None: every depth 0 .. K, as the default config; one depth: the fixed-depth row this one compares with)."""
    engine = fdecode.Engine(step)
    if depths is not None:
        engine.policy.depths = depths
    rid = engine.add_request(prompt, max_new_tokens=new, ignore_eos=True)
    engine.step()  # admits and primes: the first token, as the prefill of `fixed`
    start = time.perf_counter()
    tokens = engine.run()[rid]
    seconds = time.perf_counter() - start
    return {
        "tokens": tokens,
        "tok_s": (len(tokens) - 1) / seconds,
        "steps": engine.steps,
        "per_step": (len(tokens) - 1) / max(engine.steps, 1),
        "launches": dict(engine.policy.launches),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1, help="runs of every row, interleaved; the median is reported")
    p.add_argument("--prompts", nargs="+", default=["write", "edit", "text"], choices=sorted(PAIR_PROMPTS))
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    reason = qwen_coder.missing_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0
    from transformers import AutoTokenizer

    target_dir, draft_dir = qwen_coder.safetensors_folders()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=args.k,
        max_batch=1,
        max_seq_len=256,
        context_buckets=(256,),
        backend="inductor",
        sampling=False,
        adaptive_depth=True,
        dtype=torch.float32,
    )
    step = fdecode.compile(str(target_dir), str(draft_dir), cfg)
    start = time.perf_counter()
    step.warmup(plans=[GREEDY], depths=list(range(args.k + 1)))
    print(
        f"compiled depths 0 .. {args.k} in {time.perf_counter() - start:.0f} s; warm-up timings {step.depth_seconds}",
        file=sys.stderr,
    )
    costs = depth_costs(step.target, step.draft, step.config, step.drafter)
    results = {
        "k": args.k,
        "new": args.new,
        "rounds": args.rounds,
        "costs_gb": costs,
        "warmup_seconds": dict(step.depth_seconds),
        "prompts": {},
    }
    for name in args.prompts:
        prompt = chat_ids(tokenizer, PAIR_PROMPTS[name])
        runs: dict[str, list[dict]] = {}
        for _ in range(args.rounds):  # every row once per round, rounds back to back: the rows interleaved
            for d in range(args.k + 1):
                runs.setdefault(f"depth {d}", []).append(fixed(step, prompt, d, args.new))
            runs.setdefault(f"engine, depth {args.k}", []).append(adaptive(step, prompt, args.new, (args.k,)))
            runs.setdefault("engine, adaptive", []).append(adaptive(step, prompt, args.new))
        want = runs[f"depth {args.k}"][0]["tokens"]
        for row, got in runs.items():
            assert all(r["tokens"] == want for r in got), (name, row)
        rows = results["prompts"][name] = {
            row: {
                **{k: v for k, v in got[0].items() if k not in ("tokens", "tok_s")},
                "tok_s": [round(r["tok_s"], 3) for r in got],
                "median_tok_s": statistics.median(r["tok_s"] for r in got),
                **({"launches": [r["launches"] for r in got]} if "launches" in got[0] else {}),
            }
            for row, got in runs.items()
        }
        best = max(r["median_tok_s"] for row, r in rows.items() if row.startswith("depth") and row != "depth 0")
        for row, r in rows.items():
            extra = f"  step {r['step_ms']:.0f} ms" if "step_ms" in r else f"  launches {r['launches']}"
            print(
                f"{name:6} {row:16} {r['median_tok_s']:.2f} tok/s ({r['median_tok_s'] / best:.3f}x the best depth) "
                f"{r['tok_s']}  {r['per_step']:.2f} tok/step{extra}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
