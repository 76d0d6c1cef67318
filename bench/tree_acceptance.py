"""Tokens committed per verify on the real Qwen2.5-Coder pair: chains against draft trees, greedy.

    flock /tmp/fdecode-realpair.lock python bench/tree_acceptance.py            # ~15-30 min on a 2-core CPU
    python bench/tree_acceptance.py --quick       # a smoke run: tiny random models, the chain and one tree
    python bench/tree_acceptance.py --smollm2                                   # n-gram drafts, ~5 min
    python bench/tree_acceptance.py --bundled    # the bundled model with its MTP head, its first 3 held-out windows
    python bench/tree_acceptance.py --shapes 4:1:4 8:3:4 12:3:4                 # some shapes (chains first)
    python bench/tree_acceptance.py --json bench/results/tree_acceptance_pair.json     # also write the rows

For each of the bench's three chat prompts (`fdecode.bench.pair.PROMPTS`), the chain at depths 3 and 4 and
trees of 6, 8 and 12 nodes at k = 2-4 (S = 3 and 4 levels, every shape `DecodeConfig` admits) decode the
same `--new-tokens` tokens (no EOS stop; every run must commit the chain's tokens, else it stops): the table
gives (tokens - 1) / verifies per prompt (the first token comes from the prompt's forward) and the mean over
prompts against the chain of the same depth. `--smollm2`: SmolLM2-135M-Instruct (`fdecode.assets.smollm2`, no
lock needed) with n-gram drafts (max_n 3) on its input-grounded prompts instead of the pair; `--bundled`: the bundled
model with its MTP head on `fdecode bench`'s first `--windows` (3) held-out windows. The step runs eagerly: acceptance does not depend on the backend,
and no time is measured here. `--json` writes the settings and every row (per prompt) for BENCHMARKS.md
(`fdecode.bench.report_tables.tree_acceptance`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import fdecode
from fdecode.bench.loops import fixed_depth
from fdecode.bench.pair import pair_with_prompts
from fdecode.tree.shape import candidates


def shapes(quick: bool) -> list[tuple[int, int, int]]:
    """(N, k, S) of the runs: the chains (k = 1) first, then every admitted tree (the smoke run: one of each)."""
    if quick:
        return [(3, 1, 3), (6, 2, 3)]
    levels = (3,) if quick else (3, 4)
    runs = [(s, 1, s) for s in levels]
    for n in (6, 8, 12):  # the smaller trees first: each row prints as it is measured
        for k in (2, 3, 4) if not quick else (2, 3):
            runs += [(n, k, s) for s in levels if n <= candidates(k, s)]
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: tiny random models, one prompt, 8 tokens, 2 shapes"
    )
    parser.add_argument("--smollm2", action="store_true", help="SmolLM2-135M with n-gram drafts")
    parser.add_argument("--bundled", action="store_true", help="the bundled model with its MTP head")
    parser.add_argument("--windows", type=int, default=3, help="--bundled: how many held-out windows")
    parser.add_argument(
        "--shapes", nargs="+", default=None, help="N:k:S of the runs, chains (N:1:N) first (default: every shape)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the settings and the rows here")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    if args.quick:  # checks that the script runs: random models accept little
        from fdecode.bench import llama

        target, draft = llama(64, 32, 1, seed=1), llama(64, 32, 1, seed=2)
        prompts, args.new_tokens = {"prompt 0": list(range(1, 17))}, 8
    elif args.smollm2:
        from fdecode.assets import smollm2
        from fdecode.models import from_hf

        model, tokenizer = smollm2.load()
        target, draft = from_hf(model), "ngram"
        prompts = {f"prompt {i}": ids for i, ids in enumerate(smollm2.chat_ids(tokenizer))}
    elif args.bundled:
        from fdecode.bench.workloads import load_workload

        target, draft, windows = load_workload("bundled-mtp", 0, (0, 0), (0, 0))
        prompts = {f"window {i}": ids for i, ids in enumerate(windows[: args.windows])}
    else:
        loaded = pair_with_prompts()
        if loaded is None:
            sys.exit(1)
        target, draft, prompts = loaded
    chain_tokens, rates, rows = {}, {}, []
    print("| N | k | S | " + " | ".join(prompts) + " | mean | vs chain |\n|---|---|---|" + "---|" * (len(prompts) + 2))
    runs = shapes(args.quick) if args.shapes is None else [tuple(int(x) for x in t.split(":")) for t in args.shapes]
    for n, k, s in runs:
        cfg = fdecode.DecodeConfig(
            num_draft_tokens=n,
            draft_topk=k,
            draft_depth=s,
            max_batch=1,
            max_seq_len=max(len(ids) for ids in prompts.values()) + args.new_tokens + 32,
            dtype=torch.float32,
            backend="eager",
        )
        step = fdecode.compile(target, draft, cfg, announce=False)
        per_prompt = []
        for name, ids in prompts.items():
            (tokens,), steps = fixed_depth(step, [ids], n, args.new_tokens)
            expected = chain_tokens.setdefault(name, tokens)
            if tokens != expected:
                sys.exit(f"N={n} k={k} S={s} on {name!r}: the tokens differ from the chain's (not lossless)")
            per_prompt.append((len(tokens) - 1) / steps)
        mean = sum(per_prompt) / len(per_prompt)
        rates[n, k, s] = mean
        rows.append({"n": n, "k": k, "s": s, "per_prompt": [round(r, 4) for r in per_prompt]})
        chain = rates.get((s, 1, s))
        cells = " | ".join(f"{r:.2f}" for r in per_prompt)
        print(f"| {n} | {k} | {s} | {cells} | {mean:.2f} | {mean / chain:.2f}x |", flush=True)
    if args.json is not None:
        model = "tiny" if args.quick else "smollm2" if args.smollm2 else "bundled-mtp" if args.bundled else "qwen-coder"
        settings = {"model": model, "new_tokens": args.new_tokens, "prompts": list(prompts), "greedy": True}
        args.json.write_text(json.dumps({"settings": settings, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
