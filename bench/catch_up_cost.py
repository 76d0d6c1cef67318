"""What the idle draft's steps cost on the real pair: depth 0 (the draft sits out), the catch-up step at each
width `draft_catch_up` = C, depth 1 and depth K, against target-only decoding, interleaved in one process.

    python bench/catch_up_cost.py --catch-up 8 32 --json bench/results/catch_up_cost.json

One step per C (Qwen2.5-Coder 1.5B + 0.5B, fp32, B = 1, K = 4, inductor, greedy graph, one 512-token window),
each graph compiled before anything is timed. A round runs `--steps` steps of each graph back to back from a
primed state (the graph chosen directly, whatever the state's lag: each reads and writes the same state) and
TargetOnly's loop for as many tokens; the median step of each graph over `--rounds` rounds is reported, with
the catch-up's extra seconds over depth 0 spread over the C + 1 tokens of the C depth-0 steps and the catch-up
that ends them (what a stream the controller keeps at depth 0 pays per token for the draft's KV). Skipped,
naming the script that fetches the pair, when the models are missing.
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
from fdecode.baseline import TargetOnly
from fdecode.bench.pair import PROMPTS, chat_ids, load_pair
from fdecode.ops.plan import GREEDY
from fdecode.step import CATCH_UP

SEQ_LEN = 512


def timed(step, state, depth: int, steps: int) -> tuple[object, list[float]]:
    blocks = step.config.bucket_blocks[-1]
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, out = step._run(state, blocks, GREEDY, quiet=True, depth=depth)
        out.packed.cpu()
        times.append(time.perf_counter() - start)
    return state, times


def target_only(baseline: TargetOnly, prompt: list[int], steps: int) -> list[float]:
    """Seconds of each of `steps` forwards of TargetOnly's loop (`TargetOnly.generate`'s, its prefill untimed)."""
    state = baseline.step.prefill([prompt], max_new_tokens=steps + 1)
    token, position, times = state.tokens[:, :1], state.base_pos[:, None], []
    for _ in range(steps):
        start = time.perf_counter()
        token, _ = baseline._next(token, position, state.target_kv, state.block_tables, None)
        token.cpu()
        times.append(time.perf_counter() - start)
        position = position + 1
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--catch-up", nargs="+", type=int, default=[8, 32])
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    reason = qwen_coder.missing_reason()
    if reason is not None:
        print(f"skipped: {reason}", file=sys.stderr)
        return 0
    target, draft, tokenizer, _, _ = load_pair(hf=False)
    prompt = chat_ids(tokenizer, PROMPTS["text"])
    steps = {}
    for c in args.catch_up:
        cfg = fdecode.DecodeConfig(
            num_draft_tokens=args.k,
            max_batch=1,
            max_seq_len=SEQ_LEN,
            context_buckets=(SEQ_LEN,),
            dtype=torch.float32,
            draft_catch_up=c,
        )
        steps[c] = fdecode.compile(target, draft, cfg)
        steps[c].warmup(plans=[GREEDY], depths=[0, 1, args.k], progress=False)  # and the catch-up graph
    baseline = TargetOnly(steps[args.catch_up[0]])
    budget = args.rounds * args.steps * (args.k + 1) * 4 + 8
    baseline.generate([prompt], max_new_tokens=4)
    graphs = {"depth 0": 0, "catch-up": CATCH_UP, "depth 1": 1, f"depth {args.k}": args.k}
    times: dict[str, list[float]] = {}
    with torch.no_grad():
        for _ in range(args.rounds):
            times.setdefault("target-only", []).extend(target_only(baseline, prompt, args.steps))
            for c, step in steps.items():
                state = step.prefill([prompt], max_new_tokens=budget, ignore_eos=True)
                for name, depth in graphs.items():
                    state, seconds = timed(step, state, depth, args.steps)
                    times.setdefault(f"C={c} {name}", []).extend(seconds)
    rows = {name: 1000 * statistics.median(seconds) for name, seconds in times.items()}
    print("| graph | ms (median) | time x target-only's |")
    print("|---|---|---|")
    for name, ms in rows.items():
        print(f"| {name} | {ms:.1f} | {ms / rows['target-only']:.3f} |")
    for c in steps:
        # held at depth 0: C steps the draft sits out, then the catch-up the step forces; C + 1 tokens
        extra = rows[f"C={c} catch-up"] - rows[f"C={c} depth 0"]
        per_token = rows[f"C={c} depth 0"] + extra / (c + 1)
        print(
            f"C = {c}: a catch-up costs {extra:.1f} ms over depth 0; a stream held at depth 0 pays "
            f"{per_token:.1f} ms a token, {rows['target-only'] / per_token:.3f}x target-only's speed"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "bench_catch_up_cost_py": {
                        "ms": rows,
                        "catch_up": args.catch_up,
                        "k": args.k,
                        "steps": args.steps,
                        "rounds": args.rounds,
                    }
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
