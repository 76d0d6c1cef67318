"""The Engine's last step: reading it before launching past a stream's end, side by side in one process.

    python bench/engine_tail.py --json bench/results/engine_tail.json

The real pair (Qwen2.5-Coder-1.5B-Instruct + the 0.5B draft, fp32, greedy, B = 1, K = 4, one compiled
step; skipped, naming the script that fetches them, when missing), each prompt of the qwen-coder workload
decoded for `--new` tokens three ways at depth K, interleaved over `--rounds` rounds:
- loop: `step(state)` in a loop, each output read at once (no step past the end, no overlap);
- engine: `fdecode.Engine`, which reads one step behind except where every lane may finish in the
  pending step (`Engine._ending`): then it reads that step before launching;
- engine-behind: the same Engine with `_ending` always False (what it did before): its last launch runs
  only lanes the unread output had already finished.
Reported: tok/s (median over rounds), the steps launched, tokens equal across the three (asserted).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from unittest import mock

import torch

K = 4


def engine(step, prompt: list[int], new: int, *, behind: bool) -> tuple[list[int], int]:
    """`fdecode.bench.pair.engine_run` at depth K; behind: with the early read of the last step off."""
    import fdecode
    from fdecode.bench.pair import engine_run

    with mock.patch.object(fdecode.Engine, "_ending", lambda self: False) if behind else contextlib.nullcontext():
        (tokens,), steps, _ = engine_run(step, [prompt], new, adaptive=False)
    return tokens, steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", nargs="+", default=["write", "text"])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from fdecode.bench.pair import PROMPTS, chat_ids, compiled_pair, fixed_depth

    pair = compiled_pair(K)
    if pair is None:
        return 0
    step, tokenizer = pair
    systems = {
        "loop": lambda p: fixed_depth(step, p, K, args.new),
        "engine": lambda p: engine(step, p, args.new, behind=False),
        "engine-behind": lambda p: engine(step, p, args.new, behind=True),
    }
    rows = []
    with torch.no_grad():
        for name in args.prompts:
            prompt = chat_ids(tokenizer, PROMPTS[name])
            fixed_depth(step, prompt, K, 8)  # compiles the step
            speeds, steps, tokens = {s: [] for s in systems}, {}, {}
            for _ in range(args.rounds):
                for system, run in systems.items():
                    start = time.perf_counter()
                    tokens[system], steps[system] = run(prompt)
                    speeds[system].append(args.new / (time.perf_counter() - start))
            assert len({tuple(t) for t in tokens.values()}) == 1, f"{name}: the three disagree on tokens"
            for system in systems:
                row = {
                    "prompt": name,
                    "system": system,
                    "tok_s": round(statistics.median(speeds[system]), 3),
                    "tok_s_rounds": [round(v, 3) for v in speeds[system]],
                    "steps": steps[system],
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench_engine_tail_py": rows, "new_tokens": args.new, "rounds": args.rounds}, f, indent=1)
    print("| prompt | system | tok/s (median) | rounds | steps |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['prompt']} | {r['system']} | {r['tok_s']} | {r['tok_s_rounds']} | {r['steps']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
