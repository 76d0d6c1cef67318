"""Draft trees against the chain in tokens per second on the real Qwen2.5-Coder pair, and where a tree's step
time goes: can this machine pay for a tree's extra rows?

    flock /tmp/fdecode-realpair.lock python bench/tree_speed.py      # ~10 min on a 2-core CPU (compiles cached)
    python bench/tree_speed.py --model bundled-mtp --device cuda     # the bundled model and its MTP head on a GPU
    python bench/tree_speed.py --engine    # also through an adaptive Engine, which chooses among the shape's depths
    python bench/tree_speed.py --engine-only --batch 4 --shapes 4:1:4 8:3:4   # the Engines alone, four prompts at once
    python bench/tree_speed.py --engine-only --no-warmup --shapes 4:1:4 8:3:4 # the default path: no warmup call
    python bench/tree_speed.py --quick                               # a smoke run: tiny random models, eager

Each shape (`--shapes`, N:k:S; the chain is N:1:N) is compiled once with the default backend (Inductor on the
CPU), then `--rounds` rounds decode the bench's three chat prompts (`fdecode.bench.pair.PROMPTS`; with `--model
bundled-mtp` / `bundled-draft` the bundled model's first three held-out windows, `fdecode bench`'s), greedy, B = 1,
`--new-tokens` tokens without an EOS stop, every step at the shape's full depth, the shapes in a new order each
round. Per shape: the median step time, tokens per verify ((tokens - 1) / steps: the first token comes from the
prompt's forward), and tokens per second over the steps; every shape must commit the chain's tokens. The
breakdown then times, eagerly, one target forward over the rows a verify of each shape runs (N + 1) and one draft
forward over the rows a level runs (k): a chain of depth S runs the target on S + 1 rows and the draft S times on
1 row (2 rows first); a tree of N nodes runs the target on N + 1 rows and the draft S times on k rows (S + 1 rows
first). With --no-warmup the Engines run the default path: no warmup call, each step's first launch makes its
`first_depth`'s graph and the other depths' graphs are made in the background (`fdecode.runtime.depth_graphs`),
so the depths an Engine can choose grow over the rounds; a first round, which makes the first graphs, is not
timed (`--rounds` more follow).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import fdecode
from fdecode.bench.pair import pair_with_prompts
from fdecode.ops.paging import window_columns
from fdecode.ops.plan import GREEDY


def parse_shape(text: str) -> tuple[int, int, int]:
    n, k, s = (int(part) for part in text.split(":"))
    return n, k, s


def synchronize(device: str) -> None:
    if torch.device(device).type != "cpu":
        getattr(torch, torch.device(device).type).synchronize()


def decode(step, ids: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
    """Tokens (the prefill's first included) and each step's seconds, every step at the step's depth K."""
    state = step.prefill([ids], max_new_tokens=new_tokens, ignore_eos=True)
    tokens, seconds = state.step_output.tokens[0, :1].tolist(), []
    while not bool(state.step_output.finished[0]):
        start = time.perf_counter()
        state, out = step(state)
        count = int(out.num_tokens[0])  # reads the output: the step has run
        seconds.append(time.perf_counter() - start)
        tokens += out.tokens[0, :count].tolist()
    return tokens, seconds


def forward_seconds(model, rows: int, repeats: int, device: str) -> float:
    """The median seconds of one eager forward of `model` over `rows` new rows after a 256-token context."""
    cfg = fdecode.DecodeConfig(num_draft_tokens=rows, max_batch=1, max_seq_len=512, backend="eager", device=device)
    step = fdecode.compile(model, "ngram", cfg, announce=False)
    state = step.prefill([[1 + i % 50 for i in range(256)]], max_new_tokens=rows + 8)
    bs = cfg.block_size
    positions = 256 + torch.arange(rows, device=device)[None]
    slots = torch.zeros_like(positions)  # the scratch slot: timing only
    context = window_columns(state.block_tables, (256 + rows) // bs + 1)
    tokens = torch.ones(1, rows, dtype=torch.int64, device=device)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        step.target(tokens, positions, slots, state.target_kv, context, block_size=bs, attention=cfg.attention)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def engine_rounds(steps: dict, prompts: dict[str, list[int]], args) -> None:
    """Each shape through an adaptive `Engine` (the default config's choice of depth per launch; every depth's
    graph made first by `warmup`, or with --no-warmup the default path's graphs: the first depth's, then the
    others as the background thread makes them), `--rounds` rounds in alternating order: at `--batch` 1 each
    prompt alone, tok/s over its request (its prefill included) per prompt, with the geometric mean of the
    per-prompt ratios to the first shape; at a larger batch the prompts (cycled) at once, tok/s over the batch.
    And the depths each shape launched. Exits where a run's tokens differ from the first run's (greedy: every
    schedule is lossless)."""
    from fdecode.bench.loops import engine_run

    if args.no_warmup:
        firsts = ", ".join(f"{n}:{k}:{s} {step.first_depth}" for (n, k, s), step in steps.items())
        print(f"\nno warmup call; the first depth of each shape: {firsts}", flush=True)
    else:
        print("\n| N | k | S | warm-up step ms by depth (greedy) |\n|---|---|---|---|")
        for (n, k, s), step in steps.items():  # the greedy graphs the greedy requests run
            step.warmup(plans=(GREEDY,), depths=step.depths)
            timed = " / ".join(f"{d}: {1e3 * step.depth_seconds[d]:.0f}" for d in sorted(step.depth_seconds))
            print(f"| {n} | {k} | {s} | {timed} |", flush=True)
    if args.batch == 1:
        runs = {name: [ids] for name, ids in prompts.items()}
    else:
        cycled = [list(prompts.values())[i % len(prompts)] for i in range(args.batch)]
        runs = {f"B = {args.batch}": cycled}
    seconds = {shape: dict.fromkeys(runs, 0.0) for shape in steps}
    tokens = {shape: dict.fromkeys(runs, 0) for shape in steps}
    launched: dict = {shape: {} for shape in steps}
    expected: dict[str, list] = {}
    untimed = 1 if args.no_warmup else 0  # with --no-warmup, a round that makes the first graphs first
    for r in range(untimed + args.rounds):
        for shape in list(steps) if r % 2 == 0 else list(reversed(steps)):
            for name, batch in runs.items():
                start = time.perf_counter()
                outs, _, info = engine_run(steps[shape], batch, args.new_tokens, adaptive=True)
                elapsed = time.perf_counter() - start
                if outs != expected.setdefault(name, outs):  # greedy: every shape, every schedule, one text
                    sys.exit(f"{shape} on {name!r}: the tokens differ from the first run's (not lossless)")
                if r < untimed:
                    continue
                seconds[shape][name] += elapsed
                tokens[shape][name] += sum(len(out) for out in outs)
                for depth, count in info["depths_launched"].items():
                    launched[shape][depth] = launched[shape].get(depth, 0) + count
    rates = {shape: {name: tokens[shape][name] / seconds[shape][name] for name in runs} for shape in steps}
    first = rates[next(iter(steps))]
    names = " | ".join(f"{name} tok/s" for name in runs)
    print(f"\n| N | k | S | {names} | vs the first shape (geomean) | launches by depth |")
    print("|---|---|---|" + "---|" * len(runs) + "---|---|")
    for (n, k, s), rate in rates.items():
        ratios = [rate[name] / first[name] for name in runs]
        geomean = statistics.geometric_mean(ratios)
        each = " | ".join(f"{rate[name]:.2f} ({rate[name] / first[name]:.2f}x)" for name in runs)
        depths = ", ".join(f"{d}: {c}" for d, c in sorted(launched[n, k, s].items()))
        print(f"| {n} | {k} | {s} | {each} | {geomean:.2f}x | {depths} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", type=parse_shape, default=[(4, 1, 4), (8, 3, 4), (12, 3, 4)])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="timed forwards per row count in the breakdown")
    parser.add_argument("--model", default="pair", choices=["pair", "bundled-mtp", "bundled-draft"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="auto", help="DecodeConfig.backend (auto: Inductor on the CPU)")
    parser.add_argument("--engine", action="store_true", help="also each shape through an adaptive Engine")
    parser.add_argument("--engine-only", action="store_true", help="the Engine rounds alone (no fixed depth)")
    parser.add_argument("--batch", type=int, default=1, help="the Engine rounds' batch (max_batch of the steps)")
    parser.add_argument("--no-warmup", action="store_true", help="the Engines' default path: no warmup call")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny random models, eager, one round")
    args = parser.parse_args()
    if args.no_warmup and not args.engine_only:
        parser.error("--no-warmup needs --engine-only (the fixed-depth rounds make the graphs first)")
    torch.set_grad_enabled(False)
    backend = args.backend
    if args.model != "pair":
        from fdecode.bench.workloads import load_workload

        target, draft, windows = load_workload(args.model, 0, (0, 0), (0, 0))
        prompts = {f"window {i}": ids for i, ids in enumerate(windows[:3])}
    elif args.quick:
        from fdecode.bench import llama

        target, draft = llama(64, 32, 1, seed=1), llama(64, 32, 1, seed=2)
        prompts, args.new_tokens, args.rounds, backend = {"prompt 0": list(range(1, 17))}, 8, 1, "eager"
        args.shapes, args.repeats, args.engine = [(3, 1, 3), (6, 2, 3)], 1, True
    else:
        loaded = pair_with_prompts()
        if loaded is None:
            sys.exit(1)
        target, draft, prompts = loaded
    longest = max(len(ids) for ids in prompts.values())
    steps = {}
    for n, k, s in args.shapes:
        cfg = fdecode.DecodeConfig(
            num_draft_tokens=n,
            draft_topk=k,
            draft_depth=s,
            max_batch=args.batch,
            max_seq_len=longest + args.new_tokens + 32,
            dtype=torch.float32,
            backend=backend,
            device=args.device,
        )
        steps[n, k, s] = fdecode.compile(target, draft, cfg, announce=False)
        print(f"... N={n} k={k} S={s} compiled", file=sys.stderr, flush=True)
    if args.engine_only:
        engine_rounds(steps, prompts, args)
        return
    for step in steps.values():
        for ids in prompts.values():  # compiles (or loads) the shape's graphs: not timed
            decode(step, ids, 4)
    times = {shape: [] for shape in steps}
    verifies = {shape: {} for shape in steps}
    expected: dict[str, list[int]] = {}
    for r in range(args.rounds):
        order = list(steps) if r % 2 == 0 else list(reversed(steps))
        for shape in order:
            for name, ids in prompts.items():
                tokens, seconds = decode(steps[shape], ids, args.new_tokens)
                if tokens != expected.setdefault(name, tokens):
                    sys.exit(f"{shape} on {name!r}: the tokens differ from the first shape's (not lossless)")
                times[shape] += seconds
                verifies[shape][name] = (len(tokens) - 1) / len(seconds)
    chain_rate = None
    print(
        "| N | k | S | step ms (median) | tokens per verify | tok/s | vs the first shape |\n|---|---|---|---|---|---|---|"
    )
    for (n, k, s), seconds in times.items():
        per_verify = statistics.mean(verifies[n, k, s].values())
        rate = per_verify / statistics.median(seconds)
        chain_rate = chain_rate or rate
        print(
            f"| {n} | {k} | {s} | {1e3 * statistics.median(seconds):.1f} | {per_verify:.2f} | {rate:.2f} | "
            f"{rate / chain_rate:.2f}x |",
            flush=True,
        )
    if args.engine:
        engine_rounds(steps, prompts, args)
    rows = sorted({n + 1 for n, _, _ in steps} | {k for _, k, _ in steps} | {1, 2})
    print("\n| rows | target forward ms | draft forward ms |\n|---|---|---|")
    for count in rows:
        draft_ms = (
            "-" if isinstance(draft, str) else f"{1e3 * forward_seconds(draft, count, args.repeats, args.device):.1f}"
        )
        print(
            f"| {count} | {1e3 * forward_seconds(target, count, args.repeats, args.device):.1f} | {draft_ms} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
