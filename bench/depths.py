"""Each depth of the real pair's step, fixed and adaptive, side by side in one process.

    python bench/depths.py --json bench/results/depths.json      # Qwen2.5-Coder 1.5B + 0.5B, fp32, B = 1, K = 4

One step is compiled (inductor, greedy graph, one 256-token window, `adaptive_depth=True`); each depth's
graph is compiled before anything is timed (`warmup(depths=...)`). For every prompt the script decodes
`--new` tokens at each fixed depth 1 .. K (`step(state, depth=d)`, read at once), then through an
`Engine` at depth K and with the Engine choosing the depth (`fdecode.runtime.depth`); an Engine reads
one step behind, except at a request's end (`Engine._ending`): compare the two Engine rows. It reports tokens per second, the mean tokens per step, the median
step time of each depth (what `depth_costs` models by the weights each depth reads), and the depths
the controller launched. The tokens of every run of a prompt must be equal (greedy is lossless); the
script asserts it. Skipped, naming the script that fetches the pair, when the models are missing.
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
from fdecode.bench.pair import PROMPTS as PAIR_PROMPTS, chat_ids
from fdecode.ops.plan import GREEDY
from fdecode.runtime.depth import depth_costs

PROMPTS = {name: PAIR_PROMPTS[name] for name in ("write", "edit")}  # the workload's first two


def fixed(step, prompt: list[int], depth: int, new: int) -> dict:
    state = step.prefill([prompt], max_new_tokens=new)
    tokens, times = state.step_output.tokens[0, :1].tolist(), []
    start = time.perf_counter()
    while not bool(state.step_output.finished[0]):
        t = time.perf_counter()
        state, out = step(state, depth=depth)
        n = int(out.num_tokens[0])  # reads the output: the step has run (CPU)
        times.append(time.perf_counter() - t)
        tokens += out.tokens[0, :n].tolist()
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "tok_s": (len(tokens) - 1) / seconds, "steps": len(times),
            "per_step": (len(tokens) - 1) / len(times), "step_ms": 1000 * statistics.median(times)}


def adaptive(step, prompt: list[int], new: int, depths: tuple[int, ...] | None = None) -> dict:
    """Through an `Engine` (reads one step behind, and the last output before launching past the end), choosing among
    `depths` (None: every depth 1 .. K; one depth: the fixed-depth row this one compares with)."""
    engine = fdecode.Engine(step)
    if depths is not None:
        engine.depths.depths = depths
    rid = engine.add_request(prompt, max_new_tokens=new)
    engine.step()  # admits and primes: the first token, as the prefill of `fixed`
    start = time.perf_counter()
    tokens = engine.run()[rid]
    seconds = time.perf_counter() - start
    first = engine.depths.launches
    return {"tokens": tokens, "tok_s": (len(tokens) - 1) / seconds, "steps": engine.steps,
            "per_step": (len(tokens) - 1) / max(engine.steps, 1), "launches": dict(first)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--new", type=int, default=48)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    reason = qwen_coder.missing_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0
    from transformers import AutoTokenizer

    target_dir, draft_dir = qwen_coder.safetensors_folders()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    cfg = fdecode.DecodeConfig(num_draft_tokens=args.k, max_batch=1, max_seq_len=256, context_buckets=(256,),
                               backend="inductor", sampling=False, adaptive_depth=True, dtype=torch.float32)
    step = fdecode.compile(str(target_dir), str(draft_dir), cfg)
    start = time.perf_counter()
    step.warmup(plans=[GREEDY], depths=list(range(1, args.k + 1)))
    print(f"compiled {args.k} depths in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    costs = depth_costs(step.target, step.draft, step.config)
    results = {"k": args.k, "new": args.new, "costs_gb": costs, "prompts": {}}
    for name, text in PROMPTS.items():
        prompt = chat_ids(tokenizer, text)
        rows = {f"depth {d}": fixed(step, prompt, d, args.new) for d in range(1, args.k + 1)}
        rows[f"engine, depth {args.k}"] = adaptive(step, prompt, args.new, (args.k,))
        rows["engine, adaptive"] = adaptive(step, prompt, args.new)
        want = rows[f"depth {args.k}"]["tokens"]
        for row, got in rows.items():
            assert got["tokens"] == want, (name, row)
        results["prompts"][name] = {row: {k: v for k, v in r.items() if k != "tokens"} for row, r in rows.items()}
        for row, r in results["prompts"][name].items():
            extra = f"  step {r['step_ms']:.0f} ms" if "step_ms" in r else f"  launches {r['launches']}"
            print(f"{name:6} {row:16} {r['tok_s']:.2f} tok/s  {r['per_step']:.2f} tok/step{extra}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
