"""`fdecode bench --workloads acceptance`: how many drafts each draft kind gets accepted, per K, on real weights.

The bundled model (`fdecode.assets.TINY`) with each of its drafts: its MTP head, its 2-layer draft LM
(`TINY_DRAFT`) and n-gram prompt lookup, greedy, on held-out prompts (the first `PROMPT_BYTES` bytes of
`PROMPTS` windows the model never trained on), `new_tokens` each, for every K of `-k`. An `Engine` runs them
all at once with every step at depth K (`adaptive_depth=False`, `draft_gate=False`: the figure is the draft's,
not a policy's) and counts from the outputs it reads (`Engine.metrics`, `fdecode.runtime.metrics`): tokens
per verified step (the mean accepted length, the bonus token included), the share of drafts accepted, and
per draft position the share of the steps carrying it that accepted it. Eager steps: acceptance does not
depend on the backend, and nothing is timed. Every draft must commit the same tokens (greedy is lossless),
else nothing is reported.
"""

from __future__ import annotations

import sys

import torch

import fdecode
from fdecode.bench.registry import Options

PROMPTS = 16
PROMPT_BYTES = 64


def run(options: Options) -> list[dict]:
    from fdecode.assets import TINY, TINY_DRAFT, heldout_windows
    from fdecode.models import from_hf

    count, length = (2, 32) if options.quick else (PROMPTS, PROMPT_BYTES)
    windows = heldout_windows()
    prompts = [windows[i * (len(windows) // count), :length].tolist() for i in range(count)]
    target = from_hf(TINY, dtype=torch.float32)
    drafts = {"MTP head": "mtp", "draft LM": from_hf(TINY_DRAFT, dtype=torch.float32), "n-gram": "ngram"}
    rows, reference = [], None
    for label, draft in drafts.items():
        for k in options.ks:
            print(f"... acceptance {label} K={k}", file=sys.stderr, flush=True)
            cfg = fdecode.DecodeConfig(
                num_draft_tokens=k,
                max_batch=len(prompts),
                max_seq_len=length + options.new_tokens + 2 * (k + 1),
                backend="eager",
                device=options.device,
                sampling=False,
                adaptive_depth=False,
                draft_gate=False,
            )
            engine = fdecode.Engine(fdecode.compile(target, draft, cfg, announce=False))
            ids = [engine.add_request(p, max_new_tokens=options.new_tokens, ignore_eos=True) for p in prompts]
            got = engine.run()
            tokens = [got[i] for i in ids]
            if reference is None:
                reference = tokens
            elif tokens != reference:
                raise RuntimeError(f"acceptance: {label} at K={k} commits other greedy tokens; no numbers reported")
            m = engine.metrics
            rows.append(
                {
                    "workload": "acceptance",
                    "model": "bundled",
                    "draft": label,
                    "k": k,
                    "prompts": len(prompts),
                    "new_tokens": options.new_tokens,
                    "verified_steps": m.totals.verified_steps,
                    "mean_accepted_length": m.mean_accepted_length,
                    "acceptance_rate": m.totals.acceptance_rate,
                    "by_position": m.acceptance_by_position,
                }
            )
    return rows


def markdown(rows: list[dict]) -> str:
    """One row per draft, one column per K: tokens per verified step (the share of steps accepting each draft
    position)."""
    ks = sorted({r["k"] for r in rows})
    cells: dict[str, dict[int, str]] = {}
    for r in rows:
        positions = ", ".join("-" if p is None else f"{p:.2f}" for p in r["by_position"])
        cells.setdefault(r["draft"], {})[r["k"]] = f"{r['mean_accepted_length']:.2f} ({positions})"
    lines = ["| draft | " + " | ".join(f"K = {k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    lines += [f"| {draft} | " + " | ".join(by_k.get(k, "") for k in ks) + " |" for draft, by_k in cells.items()]
    return "\n".join(lines)
