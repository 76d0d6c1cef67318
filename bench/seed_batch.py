"""Does a seeded random request decode the same tokens alone and inside a batch?

    python bench/seed_batch.py                                  # 8 requests, the three configurations
    python bench/seed_batch.py --requests 8 --repeat --json /tmp/seed_batch.json
    python bench/seed_batch.py --configs fixed-window --temperature 0.8 --dtype float32
    python bench/seed_batch.py --quick     # a smoke run: 2 requests of 8 tokens, fixed-window, batch 2

On the bundled pair (target `tiny-stdlib`, draft LM `tiny-stdlib-draft`, eager backend), N seeded random
requests (distinct seeds, `--new-tokens` tokens, ignore_eos, prompts cut from the held-out windows at
different lengths) are decoded (a) each alone in an `Engine` and (b) `max_batch` at a time in one `Engine`
with the others. For each request it reports whether the two token lists differ and at which new-token index
they first do. Configurations, which separate the candidate causes:

- default       `adaptive_depth=True`, with `step.warmup(depths=0..K)` so the Engine may launch every depth
                (without those graphs `Schedule.ready_depths` holds an adaptive Engine at depth K);
- fixed-depth   `adaptive_depth=False`: every step verifies K drafts (the same schedule alone and batched),
                attention windows still chosen per launch from the batch's longest lane (`context_buckets`);
- fixed-window  `adaptive_depth=False` and `context_buckets=(max_seq_len,)`: one window for every step.

Per request it also shows where the lane's schedule (the depth of each step, the attention window) first
differs between the two runs, and compares the target's logits bit for bit: the row at each position that
chose a new token (the prefill's last row, then verify rows whose input is the committed token), up to and
including the first diverging one, and the prefill's rows of the prompt (which write the KV every later
row reads). The logits are recorded by wrapping `forward_rows` in `fdecode.step` / `fdecode.prefill`
(eager only: a compiled step would not call the wrapper). `--repeat` decodes each request alone twice,
to tell a batch effect from run-to-run variation (the adaptive controller learns step costs from wall time).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass, field

import torch

import fdecode
import fdecode.prefill
import fdecode.step
from fdecode.assets import TINY, TINY_DRAFT, heldout_windows
from fdecode.models import from_hf

CONFIGS = {
    "default": dict(adaptive_depth=True),
    "fixed-depth": dict(adaptive_depth=False),
    "fixed-window": dict(adaptive_depth=False, context_buckets="whole"),
}


@dataclass
class Record:
    """What one Engine run did: the target's logits per (lane, position, input token), the latest row
    computed there winning (a row first computed after a rejected draft is computed again once its prefix is
    committed), and per step each lane's first verified position, the rows verified and the window in blocks."""

    rows: dict[tuple[int, int, int], torch.Tensor] = field(default_factory=dict)
    steps: list[tuple[list[int], int, int]] = field(default_factory=list)
    priming: tuple[list[int], list[int]] | None = None  # (lanes, prompt lengths) while `prime` runs


@contextlib.contextmanager
def recording(step):
    """Record the target's forwards (`Record`) in every Engine run of `step` inside the block."""
    record = Record()
    target = step.target
    saved = fdecode.step.forward_rows, fdecode.prefill.forward_rows, step.prime

    def forward(model, *args, **kwargs):
        out = saved[0](model, *args, **kwargs)
        if model is target:
            observe(args, out[0])
        return out

    def observe(args, logits):
        tokens, positions, context = args[0].tolist(), args[1].tolist(), args[4]
        logits = logits.float()
        if record.priming is None:  # a step: every lane
            lanes, lengths = range(len(tokens)), None
            record.steps.append(([row[0] for row in positions], len(tokens[0]), context.shape[1]))
        else:  # priming: the admitted lanes, their prompts' rows
            lanes, lengths = record.priming
        for i, lane in enumerate(lanes):
            for r, (pos, tok) in enumerate(zip(positions[i], tokens[i])):
                if lengths is None or r < lengths[i]:
                    record.rows[lane, pos, tok] = logits[i, r].clone()

    def prime(state, lanes, prompts, **kwargs):  # `Step.prime`, which an Engine's admissions call
        record.priming = (list(lanes), [len(p) for p in prompts])
        try:
            return saved[2](state, lanes, prompts, **kwargs)
        finally:
            record.priming = None

    fdecode.step.forward_rows = fdecode.prefill.forward_rows = forward
    step.prime = prime
    try:
        yield record
    finally:
        fdecode.step.forward_rows, fdecode.prefill.forward_rows = saved[:2]
        del step.prime  # the method again


def run_engine(step, requests) -> list[dict]:
    """Decode `requests` ((prompt, params) pairs) in one Engine; per request its tokens, lane and record."""
    with recording(step) as record:
        engine = fdecode.Engine(step)
        ids = [engine.add_request(prompt, params) for prompt, params in requests]
        lanes = {}
        tokens = {rid: [] for rid in ids}
        for event in engine.stream():
            tokens[event.request_id] += event.new_tokens
            request = engine.requests.get(event.request_id)  # which lane it runs in
            if request is not None and request.lane is not None:
                lanes[event.request_id] = request.lane
    return [dict(tokens=tokens[rid], lane=lanes[rid], record=record) for rid in ids]


def schedule(run: dict, prompt_len: int, budget: int) -> list[tuple[int, int, int]]:
    """The lane's steps while it ran: (tokens committed before the step, rows verified, window in blocks)."""
    lane, out = run["lane"], []
    for starts, rows, window in run["record"].steps:
        committed = starts[lane] - (prompt_len - 1)
        if 0 < committed < budget and (not out or committed > out[-1][0]):
            out.append((committed, rows, window))
    return out


def first_difference(a: list, b: list) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def compare(prompt: list[int], alone: dict, batched: dict, budget: int) -> dict:
    """Alone against batched for one request: first diverging token, first schedule difference, logits."""
    diverge = first_difference(alone["tokens"], batched["tokens"])
    sched_a, sched_b = schedule(alone, len(prompt), budget), schedule(batched, len(prompt), budget)
    at = first_difference([x[:2] for x in sched_a], [x[:2] for x in sched_b])
    schedule_differs_at = None if at is None else (sched_a + [(budget,)])[at][0]
    windows_differ = {c: w for c, _, w in sched_a} != {c: w for c, _, w in sched_b}
    # The rows that chose new tokens 0 .. diverge (all of them where none diverges), and the prompt's rows.
    seq = prompt + alone["tokens"]
    last = budget - 1 if diverge is None else diverge
    chosen = [len(prompt) - 1 + j for j in range(last + 1)]
    same, worst, first_bad, missing = 0, 0.0, None, 0
    for j, pos in enumerate(chosen):
        ra = alone["record"].rows.get((alone["lane"], pos, seq[pos]))
        rb = batched["record"].rows.get((batched["lane"], pos, seq[pos]))
        if ra is None or rb is None:
            missing += 1
            continue
        if torch.equal(ra, rb):
            same += 1
        else:
            first_bad = j if first_bad is None else first_bad
            worst = max(worst, (ra - rb).abs().max().item())
    prompt_same = sum(
        torch.equal(alone["record"].rows[alone["lane"], p, seq[p]], batched["record"].rows[batched["lane"], p, seq[p]])
        for p in range(len(prompt) - 1)
    )
    at_divergence = None
    if diverge is not None:
        pos = chosen[-1]
        ra = alone["record"].rows.get((alone["lane"], pos, seq[pos]))
        rb = batched["record"].rows.get((batched["lane"], pos, seq[pos]))
        at_divergence = None if ra is None or rb is None else bool(torch.equal(ra, rb))
    return dict(
        diverge=diverge,
        schedule_differs_at=schedule_differs_at,
        windows_differ=windows_differ,
        depths_alone="".join(str(r - 1) for _, r, _ in sched_a),
        depths_batched="".join(str(r - 1) for _, r, _ in sched_b),
        logit_rows=len(chosen) - missing,
        logit_rows_identical=same,
        first_logit_difference=first_bad,
        max_logit_difference=worst,
        divergence_row_identical=at_divergence,
        prompt_rows=len(prompt) - 1,
        prompt_rows_identical=prompt_same,
    )


def build(name: str, args, target, draft):
    changes = dict(CONFIGS[name])
    if changes.get("context_buckets") == "whole":
        changes["context_buckets"] = (args.max_seq_len,)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=args.k, max_batch=args.batch, max_seq_len=args.max_seq_len, backend=args.backend, **changes
    )
    step = fdecode.compile(target, draft, cfg, announce=False)
    step.warmup(depths=range(args.k + 1) if cfg.adaptive_depth else None)
    return step


def requests(args) -> list[tuple[list[int], fdecode.SamplingParams]]:
    windows, rng = heldout_windows(), random.Random(args.seed)
    room = min(windows.shape[1], args.max_seq_len - args.new_tokens)
    out = []
    for i in range(args.requests):
        length = rng.randint(args.min_prompt, room)
        params = fdecode.SamplingParams(
            temperature=args.temperature, seed=args.seed * 1000 + i + 1, max_new_tokens=args.new_tokens, ignore_eos=True
        )
        out.append((windows[(7 * i) % windows.shape[0], :length].tolist(), params))
    return out


def run_config(name: str, args, target, draft, reqs) -> dict:
    start = time.perf_counter()
    step = build(name, args, target, draft)
    alone = [run_engine(step, [r])[0] for r in reqs]
    again = [run_engine(step, [r])[0] for r in reqs] if args.repeat else None
    batched = []
    for i in range(0, len(reqs), args.batch):
        batched += run_engine(step, reqs[i : i + args.batch])
    rows = []
    for i, ((prompt, params), a, b) in enumerate(zip(reqs, alone, batched)):
        row = dict(request=i, seed=params.seed, prompt_len=len(prompt), **compare(prompt, a, b, args.new_tokens))
        if again is not None:
            row["alone_again_diverge"] = first_difference(a["tokens"], again[i]["tokens"])
        rows.append(row)
    return dict(config=name, seconds=round(time.perf_counter() - start, 1), requests=rows)


def dash(value) -> str:
    return "-" if value is None else str(value)


def show(result: dict, repeat: bool) -> None:
    rows = result["requests"]
    diverged = [r["diverge"] for r in rows if r["diverge"] is not None]
    span = f", first at token {min(diverged)}..{max(diverged)}" if diverged else ""
    print(f"\n== {result['config']}: {len(diverged)}/{len(rows)} requests diverge{span} ({result['seconds']} s)")
    head = (
        f"{'req':>3} {'seed':>5} {'prompt':>6} {'diverge':>7} {'sched@':>6} {'win!=':>5} "
        f"{'logits same':>11} {'div row':>7} {'max |dl|':>9} {'prompt same':>11}"
    )
    print(head + ("  again" if repeat else "") + "  depths alone / batched")
    for r in rows:
        line = (
            f"{r['request']:>3} {r['seed']:>5} {r['prompt_len']:>6} {dash(r['diverge']):>7} "
            f"{dash(r['schedule_differs_at']):>6} {'yes' if r['windows_differ'] else 'no':>5} "
            f"{r['logit_rows_identical']:>5}/{r['logit_rows']:<5} {dash(r['divergence_row_identical']):>7} "
            f"{r['max_logit_difference']:>9.2g} {r['prompt_rows_identical']:>5}/{r['prompt_rows']:<5}"
        )
        if repeat:
            line += f"  {dash(r.get('alone_again_diverge')):>5}"
        print(line + f"  {r['depths_alone']} / {r['depths_batched']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.5)
    p.add_argument("--k", type=int, default=3, help="num_draft_tokens")
    p.add_argument("--batch", type=int, default=4, help="max_batch (also the batched runs' group size)")
    p.add_argument("--max-seq-len", type=int, default=512, help="512: default windows of 256 and 512 tokens")
    p.add_argument("--min-prompt", type=int, default=16)
    p.add_argument(
        "--dtype", default="auto", choices=("auto", "float32", "bfloat16"), help="auto: the checkpoint's own (bf16)"
    )
    p.add_argument("--backend", default="eager", help="eager records logits; others record nothing (tokens only)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=0, help="prompt lengths and the requests' seeds")
    p.add_argument("--repeat", action="store_true", help="decode each request alone twice")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 requests, 8 tokens, fixed-window, batch 2")
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.new_tokens, args.configs, args.batch = 2, 8, "fixed-window", 2
    torch.set_num_threads(args.threads)
    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    target, draft = from_hf(TINY, dtype=dtype), from_hf(TINY_DRAFT, dtype=dtype)
    reqs = requests(args)
    print(
        f"{len(reqs)} requests, temperature {args.temperature}, {args.new_tokens} new tokens, K={args.k}, "
        f"max_batch {args.batch}, max_seq_len {args.max_seq_len}, {args.backend}, dtype {args.dtype}; "
        "sched@: tokens committed when the depths first differ; div row: the diverging row's logits identical"
    )
    results = []
    for name in args.configs.split(","):
        results.append(run_config(name, args, target, draft, reqs))
        show(results[-1], args.repeat)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
