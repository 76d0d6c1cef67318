"""`fdecode bench --workloads ttft`: time to first token of a request an `Engine` admits, alone or beside
running requests (docs/design.md, "The Engine").

The context workload's random Llama target (hidden 256, 4 layers, vocabulary 4,096) and 1-layer draft
(`fdecode.bench.context`), greedy, max_seq_len 2,048, the default config otherwise, for each batch B and K of
the command: a request of `PROMPT_TOKENS` tokens is added to an Engine whose other B - 1 lanes are decoding
(16-token prompts, admitted and stepped first; none at B = 1), and the time from `add_request` to its first
event carrying a token is taken, with the Engine's steps in between (its priming runs in the `step()` after
the next launch, its token is read with the following output). The step is warm: the warm-up round compiles
what the rounds run (the time from `fdecode.compile` to a first token, cold and warm, is
`bench/cold_start.py`'s). Each figure: the median (min-max) of `reps` rounds, the prompt lengths round-robin
(`fdecode.bench.timing.interleaved_seconds`). `--quick`: hidden 64, vocabulary 256, max_seq_len 256, prompts
of 16 and 64 tokens.
"""

from __future__ import annotations

import sys
import time

import torch

import fdecode
from fdecode.bench.models import llama
from fdecode.bench.registry import Options
from fdecode.bench.timing import interleaved_seconds

PROMPT_TOKENS = (16, 256, 1024)
BACKGROUND_TOKENS = 16  # the prompt of each request already decoding


def first_token(step, prompt: list[int], background: list[list[int]]) -> tuple[float, int]:
    """(seconds from `add_request` to the first event with a token of `prompt`, Engine steps in between) on a
    fresh Engine whose `background` requests were admitted and stepped first; every request is then cancelled."""
    engine = fdecode.Engine(step)
    budget = step.config.max_seq_len - BACKGROUND_TOKENS
    for other in background:
        engine.add_request(other, max_new_tokens=budget, ignore_eos=True)
    for _ in range(3 if background else 0):  # admitted, primed, decoding
        engine.step()
    start = time.perf_counter()
    rid = engine.add_request(prompt, max_new_tokens=4, ignore_eos=True)
    steps = 0
    while True:
        events = engine.step()
        steps += 1
        if any(e.request_id == rid and e.new_tokens for e in events):
            break
    seconds = time.perf_counter() - start
    for request in list(engine.requests):
        engine.cancel(request)
    engine.run()  # the cancellations' events: the Engine ends idle
    return seconds, steps


def run(options: Options) -> list[dict]:
    hidden, vocab, max_seq_len, lengths = (
        (64, 256, 256, (16, 64)) if options.quick else (256, 4096, 2048, PROMPT_TOKENS)
    )
    target, draft = llama(vocab, hidden, 4, seed=1), llama(vocab, hidden, 1, seed=2)
    gen = torch.Generator().manual_seed(0)
    prompts = {n: torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths}
    rows = []
    for batch in options.batches:
        background = [torch.randint(0, vocab, (BACKGROUND_TOKENS,), generator=gen).tolist() for _ in range(batch - 1)]
        for k in options.ks:
            print(f"... ttft B={batch} K={k} prompts of {lengths} tokens", file=sys.stderr, flush=True)
            cfg = fdecode.DecodeConfig(
                num_draft_tokens=k,
                max_batch=batch,
                max_seq_len=max_seq_len,
                device=options.device,
                dtype=options.dtype,
                backend=options.backend,
            )
            step = fdecode.compile(target, draft, cfg, announce=False)
            steps: dict[int, int] = {}

            def timed(n: int) -> float:
                seconds, steps[n] = first_token(step, prompts[n], background)
                return seconds

            figures = interleaved_seconds({n: (lambda n=n: timed(n)) for n in lengths}, options.reps)
            for n, (med, lo, hi) in figures.items():
                rows.append(
                    {
                        "workload": "ttft",
                        "batch": batch,
                        "k": k,
                        "running": len(background),
                        "prompt_tokens": n,
                        "backend": step.backend,
                        "ttft_ms": 1e3 * med,
                        "ttft_ms_min": 1e3 * lo,
                        "ttft_ms_max": 1e3 * hi,
                        "engine_steps": steps[n],
                    }
                )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| B | K | requests running | prompt tokens | time to first token ms (min-max) | Engine steps |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['k']} | {r['running']} | {r['prompt_tokens']} | {r['ttft_ms']:.1f} "
            f"({r['ttft_ms_min']:.1f}-{r['ttft_ms_max']:.1f}) | {r['engine_steps']} |"
        )
    return "\n".join(lines)
