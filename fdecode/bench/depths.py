"""`fdecode bench --workloads depths`: every depth of one step, fixed and chosen, side by side in one process.

The bundled model (`fdecode.assets.TINY`) with its MTP head and with its 2-layer draft LM, greedy, held-out
prompts (the first 64 bytes of every third window, as long as `fdecode.bench.acceptance`'s), for each batch and
K of the command. One step is compiled per draft, batch and K with the default config (`adaptive_depth=True`), and every depth's
graph made before anything is timed (`step.warmup(depths=0 .. K)`, which also times them: the costs the
Engine starts from). Systems: "depth d", every step at depth d = 0 .. K (`step(state, depth=d)`, each output
read at once; depth 0 is the target alone), "Engine depth K" (an `Engine`, reading one step behind, every
launch at K) and "Engine" (an `Engine` choosing each launch's depth, as the default config runs,
`fdecode.runtime.depth`). Every system decodes `new_tokens` tokens a lane (no EOS stop), timed round-robin
(`fdecode.bench.timing.interleaved_runs`); each must commit depth 0's tokens, else nothing is reported. The
rows are `fdecode.bench.results.Result`s; the Engine rows say which depths it launched. `--quick`: a random
1-layer, 32-wide Llama drafting for itself (every draft accepted: depth d commits d + 1 tokens a step), 24-token
prompts. The real pair's depths are in the qwen-coder workload (`fdecode.bench.pair`).
"""

from __future__ import annotations

import sys
from dataclasses import asdict

import torch

import fdecode
from fdecode.bench.acceptance import PROMPT_BYTES
from fdecode.bench.loops import engine_run, fixed_depth
from fdecode.bench.models import llama
from fdecode.bench.registry import Options
from fdecode.bench.results import Result, timed_result
from fdecode.bench.results import markdown as results_markdown
from fdecode.bench.timing import interleaved_runs
from fdecode.ops.plan import GREEDY


def run(options: Options) -> list[dict]:
    from fdecode.assets import TINY, TINY_DRAFT, heldout_windows
    from fdecode.models import from_hf

    if options.quick:
        target = llama(64, 32, 1, seed=1)
        drafts, windows = {"draft=target": target}, torch.arange(64 * 24).reshape(64, 24) % 64
    else:
        target, windows = from_hf(TINY, dtype=options.dtype), heldout_windows()[:, :PROMPT_BYTES]
        drafts = {"bundled-mtp": "mtp", "bundled-draft": from_hf(TINY_DRAFT, dtype=options.dtype)}
    rows = []
    for name, draft in drafts.items():
        for batch in options.batches:
            prompts = [windows[i * 3].tolist() for i in range(batch)]
            for k in options.ks:
                print(f"... depths {name} B={batch} K={k}", file=sys.stderr, flush=True)
                rows += [asdict(r) for r in _rows(f"depths {name}", target, draft, prompts, k, options)]
    return rows


def _rows(workload: str, target, draft, prompts: list[list[int]], k: int, options: Options) -> list[Result]:
    new_tokens, batch = options.new_tokens, len(prompts)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=k,
        max_batch=batch,
        max_seq_len=max(map(len, prompts)) + new_tokens + 2 * (k + 1),
        device=options.device,
        dtype=options.dtype,
        backend=options.backend,
    )
    step = fdecode.compile(target, draft, cfg, announce=False)
    step.warmup(plans=[GREEDY], depths=list(range(k + 1)))
    systems = {f"depth {d}": (lambda d=d: (*fixed_depth(step, prompts, d, new_tokens), {})) for d in range(k + 1)}
    systems[f"Engine depth {k}"] = lambda: engine_run(step, prompts, new_tokens, adaptive=False)
    systems["Engine"] = lambda: engine_run(step, prompts, new_tokens, adaptive=True)
    with torch.no_grad():
        timed = interleaved_runs(systems, options.reps)
    reference = timed["depth 0"][3][0]
    wrong = [s for s, (*_, (tokens, _, _)) in timed.items() if tokens != reference]
    if wrong:
        raise RuntimeError(f"{workload} B={batch} K={k}: {wrong} disagree with depth 0's tokens; no numbers reported")
    rows = []
    for system, (med, fastest, slowest, (_tokens, steps, info)) in timed.items():
        seconds = (med, fastest, slowest)
        extra = {"backend": step.backend, **info}
        rows.append(timed_result(workload, system, batch, k, new_tokens, seconds, steps, extra))
    return rows


def markdown(rows: list[dict]) -> str:
    lines = results_markdown([Result(**r) for r in rows]).splitlines()
    lines[0] += " depths launched |"
    lines[1] += "---|"
    for i, r in enumerate(rows, start=2):
        launched = r["extra"].get("depths_launched", {})
        lines[i] += " " + ", ".join(f"{d} x {n}" for d, n in sorted(launched.items())) + " |"
    return "\n".join(lines)
