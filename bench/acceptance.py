"""Mean accepted length of the bundled model, K = 1..4, greedy, both draft kinds, held-out prompts.

    python bench/acceptance.py            # the table in BENCHMARKS.md (eager: acceptance does not
                                          # depend on the backend, and eager needs no compiles)

Prompts: the first PROMPT_BYTES bytes of each held-out window shipped with the model
(`fdecode.assets.TINY_HELDOUT`, files the model never trained on); NEW_TOKENS greedy tokens each.
"""

from __future__ import annotations

import json
import sys

import torch

import fdecode
from fdecode.assets import TINY, TINY_DRAFT, heldout_windows
from fdecode.bench import mean_accepted_length
from fdecode.models import from_hf

PROMPTS = 16
PROMPT_BYTES = 64
NEW_TOKENS = 96


def main() -> int:
    windows = heldout_windows()
    stride = len(windows) // PROMPTS
    prompts = [windows[i * stride, :PROMPT_BYTES].tolist() for i in range(PROMPTS)]
    target = from_hf(TINY, dtype=torch.float32)
    drafts = {"mtp": "mtp", "draft model": from_hf(TINY_DRAFT, dtype=torch.float32)}
    table = {}
    for name, draft in drafts.items():
        for k in (1, 2, 3, 4):
            cfg = fdecode.DecodeConfig(
                num_draft_tokens=k,
                max_batch=PROMPTS,
                max_seq_len=PROMPT_BYTES + NEW_TOKENS + 2 * k + 2,
                backend="eager",
                sampling=False,
            )
            step = fdecode.compile(target, draft, cfg)
            table[(name, k)] = mean_accepted_length(step, prompts, NEW_TOKENS)
            print(f"... {name} K={k}: {table[(name, k)]:.2f}", file=sys.stderr, flush=True)
    print("| draft | K=1 | K=2 | K=3 | K=4 |\n|---|---|---|---|---|")
    for name in drafts:
        print(f"| {name} | " + " | ".join(f"{table[(name, k)]:.2f}" for k in (1, 2, 3, 4)) + " |")
    with open("bench/results/acceptance.json", "w") as f:
        json.dump({f"{name} K={k}": v for (name, k), v in table.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
