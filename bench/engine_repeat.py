"""The adaptive Engine on one real-pair prompt, run again and again, each run against target-only right after it.

    python bench/engine_repeat.py                       # the text prompt, 4 runs
    python bench/engine_repeat.py --prompt write --reps 6 --json bench/results/engine_repeat.json

`fdecode bench --workloads qwen-coder-...` times each system a few times; this repeats the one adaptive system
to show how far its schedule, and its speed, move between runs of the same prompt and tokens (greedy), and
logs every launch: its depth, the seconds the controller measured (`DepthController.observe_cost`) and
whether it was a catch-up or a trial. Each run is followed by the same prompt decoded at depth 0 (the step's
own graph of the target alone) and by `fdecode bench`'s target-only system, each timed with its prefill as
the Engine's run is, for ratios taken a minute apart at most. The step: the workload's
(`fdecode.bench.pair`, K = 4, B = 1, fp32), its greedy depths 0 .. K warmed up first. Skipped, naming the
script that fetches the pair, where the models are missing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import fdecode
from fdecode.baseline import TargetOnly
from fdecode.bench.pair import PROMPTS, chat_ids, compiled_pair, fixed_depth
from fdecode.ops.plan import GREEDY


def engine_run(step, prompt: list[int], new_tokens: int) -> dict:
    engine = fdecode.Engine(step)
    controller, log = engine.policy, []
    observe = controller.observe_cost

    def logged(depth: int, seconds: float) -> None:
        log.append((depth, round(seconds, 4), controller.caught_up, controller.trying))
        observe(depth, seconds)

    controller.observe_cost = logged
    engine.add_request(prompt, max_new_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    engine.run()
    seconds = time.perf_counter() - start
    return {
        "engine_tok_s": round(new_tokens / seconds, 3),
        "launches": {d: n for d, n in controller.launches.items() if n},
        "costs": [round(c, 4) for c in controller.costs],
        "log": log,
    }


def tokens_per_second(run, new_tokens: int) -> float:
    """`new_tokens` over the seconds `run()` takes (its prefill counted, as the Engine's run counts its own)."""
    start = time.perf_counter()
    run()
    return round(new_tokens / (time.perf_counter() - start), 3)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", choices=sorted(PROMPTS), default="text")
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    pair = compiled_pair(4)
    if pair is None:
        return 0
    step, tokenizer = pair
    step.warmup(plans=[GREEDY], depths=range(step.config.K + 1), progress=False)
    print(f"warm-up timings (s): { {d: round(s, 4) for d, s in step.depth_seconds.items()} }", flush=True)
    prompt = chat_ids(tokenizer, PROMPTS[args.prompt])
    baseline, new = TargetOnly(step, backend=step.backend), args.new_tokens
    baseline.generate([prompt], max_new_tokens=2)  # compiles its graph
    runs = []
    for rep in range(args.reps):
        run = {
            "rep": rep,
            **engine_run(step, prompt, new),
            # `fdecode bench`'s "fdecode depth d" loop at depth 0, and its target-only system
            "depth0_tok_s": tokens_per_second(lambda: fixed_depth(step, prompt, 0, new), new),
            "target_only_tok_s": tokens_per_second(lambda: baseline.generate([prompt], max_new_tokens=new), new),
        }
        for name in ("depth0", "target_only"):
            run[f"against_{name}"] = round(run["engine_tok_s"] / run[f"{name}_tok_s"], 3)
        runs.append(run)
        print(json.dumps({k: v for k, v in run.items() if k != "log"}), flush=True)
    for name in ("depth0", "target_only"):
        ratios = [r[f"against_{name}"] for r in runs]
        print(f"Engine / {name}: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"prompt": args.prompt, "warmup_s": step.depth_seconds, "runs": runs}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
