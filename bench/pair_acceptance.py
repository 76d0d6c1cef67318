"""How the real pair's drafts are accepted, position by position: the input of an adaptive depth's model.

    python bench/pair_acceptance.py --json bench/results/pair_acceptance.json

Qwen2.5-Coder-1.5B-Instruct with the 0.5B draft (`fdecode.assets.qwen_coder`; skipped, naming the script
that fetches them, when missing), fp32, greedy, B = 1: each prompt of `fdecode bench --workloads qwen-coder`
decoded for `--new` tokens at depth K, recording the drafts each step accepted. Reported per prompt: the
conditional rate r_i = P(draft i accepted | drafts 1..i-1 were) for each position, and the single rate a
that `fdecode.runtime.depth.DepthController` estimates (accepted drafts / (accepted drafts + rejections)),
with which it predicts 1 + a + ... + a^d tokens a step at depth d. Where r_i is flat in i the one rate
describes the lane; where it is not, the prediction errs at depths the controller does not run.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def rates(accepted: list[int], k: int) -> tuple[list[float | None], float]:
    """(r_i for i = 1..k, the controller's single rate) from each step's accepted drafts (of k verified)."""
    reached = [sum(1 for n in accepted if n >= i) for i in range(k)]
    taken = [sum(1 for n in accepted if n >= i + 1) for i in range(k)]
    conditional = [round(t / r, 3) if r else None for t, r in zip(taken, reached)]
    rejections = sum(1 for n in accepted if n < k)
    return conditional, round(sum(accepted) / max(sum(accepted) + rejections, 1), 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--new", type=int, default=160, help="new tokens per prompt")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from fdecode.bench.pair import PROMPTS, chat_ids, compiled_pair

    pair = compiled_pair(args.k)
    if pair is None:
        return 0
    step, tokenizer = pair
    rows = {}
    with torch.no_grad():
        for name, text in PROMPTS.items():
            state = step.prefill([chat_ids(tokenizer, text)], max_new_tokens=args.new, ignore_eos=True)
            accepted = []
            while not bool(state.step_output.finished[0]):
                state, out = step(state, depth=args.k)
                accepted.append(int(out.num_tokens[0]) - 1)
            conditional, single = rates(accepted, args.k)
            rows[name] = {"steps": len(accepted), "accepted": accepted, "r_i": conditional, "single_rate": single}
            print(f"{name}: {len(accepted)} steps, r_i {conditional}, single rate {single}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench_pair_acceptance_py": rows, "k": args.k, "new_tokens": args.new}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
