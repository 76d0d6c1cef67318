"""The adaptive depth replayed on the real pair's drafts: the controller against every fixed depth, offline.

    python bench/depth_policy.py --collect      # once: the pair's greedy tokens and the draft's matches (~10 min)
    python bench/depth_policy.py                # replay: a second, no noise
    python bench/depth_policy.py --costs 0.35,0.56,0.68,0.80,0.95 --catch-up 8 --catch-up-cost 0.45
    python bench/depth_policy.py --quick        # a smoke run: two of the recorded sequences

Greedy decoding makes a draft's acceptance a property of the position alone: at position i of the target's
tokens g, the draft proposes its own greedy continuation of prompt + g[:i], and it is accepted as far as
that continuation equals g. One forward of the draft over prompt + g gives, per position, whether its next
token matches (`match[i]`); a step at position i verifying v drafts commits min(run of matches from i, v) + 1
tokens, whatever schedule led there. `--collect` computes those sequences with transformers (the target's
greedy `generate`, then one draft forward) for the workload's prompts and a few more, into
`bench/results/qwen_coder_draft_matches.json`. The replay runs `DepthController` (the Engine's, unchanged: read one step
behind, costs learnt from the steps it launches, starting from warm-up-like costs `--bias` off, as
`step_costs` smooths them) over each
sequence, and each fixed depth, with per-depth step seconds `--costs` (the ms/step of the "fdecode depth d" rows of
`fdecode bench --workloads qwen-coder`), each
step's seconds jittered by `--noise`; plus sequences drawn at fixed rates, independent and in bursts. With
`--catch-up C` (`DecodeConfig.draft_catch_up`) the draft sits out depth-0 steps (which then cost what target-only
decoding does) and a catch-up step (`--catch-up-cost` seconds) commits one token and proposes one draft; with 0
it runs at depth 0 too. It prints, per sequence, the controller's tokens per second against the best fixed
depth and against depth 0.
What it leaves out: the host's own time, and costs that vary with the context length.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import torch

from fdecode.runtime.depth import DepthController, smoothed

RESULTS = Path(__file__).parent / "results" / "qwen_coder_draft_matches.json"
EXTRA = {  # beyond the workload's prompts (`fdecode.bench.pair`): other kinds of answer, 96 tokens each
    "story": "Write a four-sentence story about a lighthouse keeper.",
    "bash": "Write a bash script that counts the lines of every .py file under the current folder.",
    "explain": "Explain what a Python generator is, with a small example.",
    "fix": "Fix the bug in this function and reply with the function only.\n\ndef mean(xs):\n"
    "    return sum(xs) / len(xs) + 1\n",
    "list": "List five common HTTP status codes and what each one means.",
    "class": "Write a Python class Stack with push, pop and peek methods and type hints.",
    "email": "Write a polite email asking a colleague to review my pull request by Friday.",
    "regex": "Write a Python regular expression that matches an ISO 8601 date, and explain it briefly.",
}


def collect(path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fdecode.assets import qwen_coder
    from fdecode.bench.pair import BATCH, PROMPTS, chat_ids

    reason = qwen_coder.missing_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        return
    target_dir, draft_dir = qwen_coder.safetensors_folders()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    target.generation_config.eos_token_id = None
    prompts = {
        **{name: (text, 64) for name, text in PROMPTS.items()},
        "sql": (BATCH[3], 64),
        **{name: (text, 96) for name, text in EXTRA.items()},
    }
    out = {}
    with torch.no_grad():
        for name, (text, new) in prompts.items():
            prompt = chat_ids(tokenizer, text)
            tokens = target.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False)[0, len(prompt) :]
            predicted = draft(torch.tensor([prompt + tokens.tolist()])).logits[0].argmax(-1)
            # match[i]: the draft's next token after prompt + g[:i] is g[i]
            match = (predicted[len(prompt) - 1 : len(prompt) + new - 1] == tokens).int().tolist()
            out[name] = {"prompt_tokens": len(prompt), "tokens": tokens.tolist(), "match": match}
            print(f"{name:8} match rate {sum(match[1:]) / (new - 1):.2f}", flush=True)
    path.write_text(json.dumps(out))


def run_of_matches(match: list[int], i: int, most: int) -> int:
    n = 0
    while n < most and i + n < len(match) and match[i + n]:
        n += 1
    return n


def replay(
    match: list[int],
    costs: list[float],
    k: int,
    depth: int | None,
    *,
    start: list[float] | None = None,
    noise: float = 0.0,
    params: dict | None = None,
    catch_up: int = 0,
    catch_up_cost: float = 0.0,
) -> tuple[float, list[int | str]]:
    """Tokens per second decoding `match`'s tokens (the first comes from the prefill) at a fixed `depth`, or
    (None) with a `DepthController` reading one step behind as the Engine does. Returns it and the depths
    launched ("c" for a catch-up step, where the draft sits out depth 0: `catch_up` > 0)."""
    new, position, carried, seconds, launched = len(match), 1, k, 0.0, []
    jitter = random.Random(1)
    controller = None
    if depth is None:
        controller = DepthController(k, start or costs, depths=range(k + 1), catch_up=catch_up, **(params or {}))
        controller.admit(0)
    pending = None
    while position < new:
        if controller is not None:
            if pending is not None and new - position <= k + 1:  # the Engine reads the last step first
                controller.observe_output(*pending)
                pending = None
            d, verified = controller.launch()
        else:
            d = depth
        caught_up = controller is not None and controller.caught_up
        verifies = 0 if caught_up else min(d, carried)
        committed = min(run_of_matches(match, position, verifies) + 1, new - position)
        position = position + committed
        carried = 1 if caught_up else 0 if d == 0 and catch_up else max(d, 1)
        took = (catch_up_cost if caught_up else costs[d]) * (1 + jitter.uniform(-noise, noise))
        seconds += took
        launched.append("c" if caught_up else d)
        if controller is not None:
            if pending is not None:
                controller.observe_output(*pending)
            pending = (torch.tensor([[committed, int(position >= new)]]), verified)
            controller.observe_cost(d, took)
    return (new - 1) / seconds, launched


def drawn(rate: float, n: int, rng: random.Random, stay: float = 0.0) -> list[int]:
    """n matches at `rate`; with `stay` > 0 each keeps the last one with that probability (bursts)."""
    out, last = [], 1
    for _ in range(n):
        if rng.random() >= stay:
            last = int(rng.random() < rate)
        out.append(last)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--collect", action="store_true")
    p.add_argument("--matches", type=Path, default=RESULTS)
    p.add_argument("--costs", default="0.41,0.56,0.68,0.80,0.95", help="seconds of a step at depth 0 .. K")
    p.add_argument(
        "--bias",
        default="1.05,0.9,1.05,1.14,0.9",
        help="the controller's starting costs (warm-up timings) over --costs, before `smoothed`",
    )
    p.add_argument("--noise", type=float, default=0.1)
    p.add_argument("--param", action="append", default=[], help="a DepthController keyword, name=value")
    p.add_argument("--catch-up", type=int, default=0, help="DecodeConfig.draft_catch_up (0: the draft runs at depth 0)")
    p.add_argument("--catch-up-cost", type=float, default=0.45, help="seconds of a catch-up step")
    p.add_argument("--quick", action="store_true", help="a smoke run: the first two recorded sequences only")
    p.add_argument("--json", type=Path, help="also write each sequence's row and the settings here")
    args = p.parse_args(argv)
    if args.collect:
        collect(args.matches)
        return 0
    if not args.matches.exists():
        from fdecode.assets import qwen_coder

        print(f"skipped: no {args.matches}; run with --collect (needs the real pair: {qwen_coder.HOW_TO_GET})")
        return 0
    costs = [float(c) for c in args.costs.split(",")]
    start = [c * float(b) for c, b in zip(costs, args.bias.split(","))]
    start = list(smoothed(dict(enumerate(start))).values())  # as `step_costs` hands warm-up timings to the Engine
    k = len(costs) - 1
    params = {name: float(value) if "." in value else int(value) for name, value in (p.split("=") for p in args.param)}
    sequences = {name: rec["match"] for name, rec in json.loads(args.matches.read_text()).items()}
    if args.quick:
        sequences = dict(list(sequences.items())[:2])
    rng = random.Random(0)
    for rate in () if args.quick else (0.2, 0.4, 0.6, 0.8):
        sequences[f"iid {rate}"] = drawn(rate, 96, rng)
        sequences[f"bursts {rate}"] = drawn(rate, 96, rng, stay=0.8)
    ratios, alone, rows = [], [], []
    print(f"costs {costs}, controller starts at {[round(c, 3) for c in start]}, noise {args.noise}, params {params}")
    for name, match in sequences.items():
        fixed = [replay(match, costs, k, d, catch_up=args.catch_up)[0] for d in range(k + 1)]
        tok_s, launched = replay(
            match,
            costs,
            k,
            None,
            start=start,
            noise=args.noise,
            params=params,
            catch_up=args.catch_up,
            catch_up_cost=args.catch_up_cost,
        )
        best = max(range(1, k + 1), key=fixed.__getitem__)
        ratios.append(tok_s / fixed[best])
        alone.append(tok_s / fixed[0])
        rows.append(
            {
                "sequence": name,
                "tokens_per_s": tok_s,
                "fixed_tokens_per_s": fixed,
                "best_depth": best,
                "launched": "".join(map(str, launched)),
            }
        )
        print(
            f"{name:10} {tok_s:.2f} tok/s  {tok_s / fixed[best]:.3f}x the best depth ({best})  "
            f"{tok_s / fixed[0]:.2f}x depth 0  {''.join(map(str, launched))}"
        )
    print(
        f"against the best fixed depth: geometric mean {statistics.geometric_mean(ratios):.3f}, worst {min(ratios):.3f}"
    )
    print(f"against depth 0: geometric mean {statistics.geometric_mean(alone):.3f}, worst {min(alone):.3f}")
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "matches", "collect")}
        args.json.write_text(json.dumps({"settings": settings, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
