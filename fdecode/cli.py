"""`fdecode` console script
(docs/design.md, "Benchmarks, assets and tools").

    fdecode demo                                   # the bundled model: stream Python code, then 3-way speeds
    fdecode demo --draft model                     # ... with its independent draft LM instead of the MTP head
    fdecode demo --model DIR --draft ngram         # a model without an MTP head: prompt-lookup drafts
    fdecode demo --model DIR [--draft DIR|mtp] --prompt "def f(x):"   # a local Hugging Face checkpoint
    torchrun --nproc-per-node 2 -m fdecode.cli demo --tp 2         # tensor-parallel: one process per rank
    fdecode bench [--quick] [--batch 1 4 16] [-k 1 2 3 4]              # before/after, side by side
    fdecode profile                                # timeline picture of the before loop and the step
    fdecode generate --model DIR --draft ngram "prompt"   # a model folder on a prompt (`fdecode generate -h`)
    fdecode serve [MODEL] [--port 8000]            # OpenAI-compatible server (`pip install -e ".[serve]"`)

The demo streams the compiled step's greedy continuation as it is produced (line
by line: it ends at the last complete line), then runs target-only decoding and the
host-round-trip "before" loop on the same prompt, checks that all three produced
the same tokens, and prints tokens/s of each, the mean accepted length and the
compile time (summed over the attention windows). With `--tp N` (under torchrun, one process per rank,
gloo on the CPU) every rank runs the sharded step; rank 0 streams, and the demo checks that every rank
committed the same tokens instead of timing the baselines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import fdecode
from fdecode.assets import TINY, TINY_DRAFT
from fdecode.baseline import BeforeLoop, TargetOnly
from fdecode.models import from_hf
from fdecode.ops.plan import GREEDY
from fdecode.tokenizer import load_tokenizer

# Timed runs of each system, interleaved; the verdict is the median of the rounds' paired ratios. Measured with
# `fdecode demo` on this project's 2-core AVX2 machine (2026-12-06): quiet, 1.03x and 1.06x target-only; beside a
# process multiplying matrices on both cores, 1.04-1.11x (three runs), where 3 rounds and the ratio of the medians
# had said 0.90x (rounds 0.76-1.30x) against 1.06x quiet. A run of the bundled model takes a tenth of a second.
REPS = 9
# Why the demo runs on one thread by default. Measured with `fdecode demo` on this project's 2-core AVX2 machine
# (2026-12-05). Busy with other jobs: one thread gave fdecode 1.13x target-only, one thread per core (torch's
# default) 0.23x, its rounds spread 0.20-0.65x. Nearly quiet: one thread 1.40x (339 tok/s; target-only 243),
# one per core 1.28x (99 tok/s; target-only 77). Oversubscribed cores measure the machine, not the step.
THREADS_WHY = "one thread: on a busy machine one per core oversubscribes it and decides the ratio; --threads N"
DEFAULT_PROMPT = '''class LRUCache:
    """A mapping that forgets its least recently used keys."""

    def __init__(self, maxsize=128):
'''


def _models(args: argparse.Namespace):
    folder = args.model or TINY
    target = from_hf(folder, dtype=torch.float32)
    if args.draft in (None, "mtp"):
        if target.mtp is None:
            raise SystemExit(
                f"error: {folder} has no MTP head; pass --draft ngram (prompt lookup: no second model) "
                "or --draft DIR (a draft checkpoint folder)"
            )
        return folder, target, "mtp", "its MTP head"
    if args.draft == "ngram":
        return folder, target, "ngram", "n-gram prompt lookup"
    if args.draft == "model":
        if args.model is not None:
            raise SystemExit("error: --draft model means the bundled draft; with --model pass --draft DIR")
        return folder, target, from_hf(TINY_DRAFT, dtype=torch.float32), "the bundled 2-layer draft LM"
    return folder, target, from_hf(args.draft, dtype=torch.float32), str(args.draft)


def _tp_group(size: int):
    """The torchrun process group of a `--tp` demo (None for one process); refuses to run outside torchrun."""
    if size == 1:
        return None
    import os

    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) != size:
        raise SystemExit(
            f"error: --tp {size} runs one process per rank under torchrun: "
            f"torchrun --nproc-per-node {size} -m fdecode.cli demo --tp {size}"
        )
    dist.init_process_group("gloo")
    return dist.group.WORLD


def demo(args: argparse.Namespace) -> int:
    if args.threads < 0:
        raise SystemExit(f"--threads must be >= 0, got {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)
    group = _tp_group(args.tp)
    rank0 = group is None or group.rank() == 0
    folder, target, draft, draft_name = _models(args)
    tokenizer = load_tokenizer(folder)
    prompt = tokenizer(args.prompt)["input_ids"]
    eos = tokenizer.eos_token_id
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=args.k,
        max_batch=1,
        max_seq_len=len(prompt) + args.max_new_tokens + 2 * args.k + 2,
        backend=args.backend,  # the default config: its greedy lanes run the greedy plan's graph
        tp_size=args.tp,
    )
    step = fdecode.compile(target, draft, cfg, tp_group=group)
    if group is not None:
        return _tp_demo(args, step, tokenizer, prompt, eos, group, rank0, f"{folder} (draft: {draft_name})")
    print(f"model: {folder} (draft: {draft_name})\nstep:  {step}", file=sys.stderr)
    threads = f"{torch.get_num_threads()} torch thread{'s' * (torch.get_num_threads() > 1)}"
    print(f"threads: {threads} ({THREADS_WHY if args.threads == 1 else 'as --threads asked'})", file=sys.stderr)
    windows = len(cfg.bucket_blocks)
    print(f"compiling ({windows} attention window{'s' * (windows > 1)}) ...", file=sys.stderr, flush=True)
    compile_s = sum(step.warmup(plans=(GREEDY,)).values())  # the demo decodes greedily: the only plan it runs

    print(args.prompt, end="", flush=True)
    engine = fdecode.Engine(step)
    engine.add_request(prompt, max_new_tokens=args.max_new_tokens, eos_token_id=eos)
    tokens: list[int] = []
    shown, steps = 0, 0
    for event in engine.stream():
        tokens += event.new_tokens
        steps += bool(event.new_tokens)  # the prefill's first token, then one event per decode step
        # Whole lines only: the text ends at a clean boundary, and never mid character (a byte-level
        # tokenizer can stop inside one; no line end is inside one).
        text = tokenizer.decode(tokens)
        done = text.rfind("\n") + 1
        print(text[shown:done], end="", flush=True)
        shown = max(shown, done)
    held = text[shown:].rstrip("\ufffd")  # the unfinished last line: not shown, unless it is all there is
    if not shown:
        print(held)

    # Target-only, before and after, measured the same way (no printing), interleaved, median of REPS runs.
    new = args.max_new_tokens
    target_only, before = TargetOnly(step, backend=step.backend), BeforeLoop(step, backend=step.backend)
    systems = {
        "target-only": lambda: target_only.generate([prompt], max_new_tokens=new)[0][0],
        "before": lambda: before.generate([prompt], max_new_tokens=new)[0][0],
        "fdecode": lambda: fdecode.generate(step, [prompt], max_new_tokens=new, eos_token_id=eos)[0],
    }
    # Warm-up over the same generation: compiles the baselines' forwards for every attention window they cross;
    # then the graphs of the depths the Engine chooses among, made in the background (`fdecode.graphs.background`).
    for run in systems.values():
        run()
    step.graph_set.background.wait()
    times: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(REPS):
        for name, run in systems.items():
            start = time.perf_counter()
            out = run()
            times[name].append(time.perf_counter() - start)
            if eos is not None and eos in out:  # the baselines run their whole budget
                out = out[: out.index(eos) + 1]
            if out != tokens:
                print(f"error: {name} and the streamed step produced different tokens", file=sys.stderr)
                return 1
    seconds = {name: statistics.median(t) for name, t in times.items()}

    n = len(tokens)
    accepted = (n - 1) / max(steps - 1, 1)  # decode steps only: the first token comes from the prefill
    base, loop, ours = (n / seconds[name] for name in ("target-only", "before", "fdecode"))
    cut = " (the text above stops at its last line end)" if shown and held else ""
    # Each round ran the three systems back to back: per-round ratios do not move with a machine whose speed drifts,
    # and their median is the verdict (a busy machine's time slices spread single runs by +-30 %).
    rounds = [times["target-only"][i] / times["fdecode"][i] for i in range(REPS)]
    vs_before = statistics.median(times["before"][i] / times["fdecode"][i] for i in range(REPS))
    spread = {name: f"{n / max(t):.1f}-{n / min(t):.1f}" for name, t in times.items()}
    print(
        f"\n-- {n} tokens{cut}, greedy, K = {args.k}, draft: {draft_name}; tok/s, median (min-max) of {REPS} "
        "interleaved rounds"
    )
    print(f"{'target-only (one target forward per token):':46}{base:8.1f} tok/s   ({spread['target-only']})")
    print(
        f"{'before loop (host round trip each step):':46}{loop:8.1f} tok/s   ({spread['before']}; "
        f"{loop / base:.2f}x target-only)"
    )
    print(
        f"{f'fdecode step ({step.backend}, one graph):':46}{ours:8.1f} tok/s   ({spread['fdecode']}; "
        f"{statistics.median(rounds):.2f}x target-only, {vs_before:.2f}x before: medians of the rounds' ratios, "
        f"target-only's {min(rounds):.2f}-{max(rounds):.2f}x)"
    )
    print(
        f"mean accepted length: {accepted:.2f} tokens per step (of {args.k + 1}); compile: {compile_s:.1f} s "
        f"(summed over {windows} attention window{'s' * (windows > 1)})"
    )
    return 0


def _tp_demo(args, step, tokenizer, prompt, eos, group, rank0: bool, name: str) -> int:
    """Every rank decodes; rank 0 prints the text, the step time, and whether every rank agreed."""
    import torch.distributed as dist

    from fdecode.models import group_exit

    if rank0:
        print(f"model: {name}, TP = {args.tp}\nstep:  {step}", file=sys.stderr)
    step.warmup(plans=(GREEDY,))
    start = time.perf_counter()
    done = fdecode.generate(
        step, [prompt], max_new_tokens=args.max_new_tokens, eos_token_id=eos, details=True, progress=False
    )[0]
    seconds = time.perf_counter() - start
    everyone: list[list[int] | None] = [None] * args.tp
    dist.all_gather_object(everyone, done.tokens, group=group)
    agree = all(tokens == done.tokens for tokens in everyone)
    if rank0:
        print(args.prompt + tokenizer.decode(done.tokens))
        m = done.metrics
        print(
            f"\n-- {len(done.tokens)} tokens, greedy, K = {args.k}, TP = {args.tp} ({step.backend}): "
            f"{len(done.tokens) / seconds:.1f} tok/s, {m.mean_accepted_length:.2f} tokens per verified step; "
            f"every rank committed {'the same' if agree else 'DIFFERENT'} tokens"
        )
    group_exit.destroy_process_group()
    return 0 if agree else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fdecode", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "demo", help="stream text from the bundled model, then compare with target-only and the before loop"
    )
    p.add_argument(
        "--model",
        type=Path,
        help="local Hugging Face checkpoint folder with its tokenizer (default: the bundled model)",
    )
    p.add_argument(
        "--draft",
        help="'mtp', 'ngram' (prompt lookup), 'model' (the bundled draft LM) or a draft "
        "checkpoint folder (default: mtp)",
    )
    p.add_argument(
        "--prompt", default=DEFAULT_PROMPT, help="prompt text (default: the first 4 lines of a Python class LRUCache)"
    )
    p.add_argument("-k", type=int, default=3, help="draft tokens per step (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate (default: %(default)s)")
    p.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "inductor", "aot_eager", "dynamo", "eager"],
        help="what compiles the step (default: %(default)s: inductor on a CPU)",
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks, under torchrun (default: %(default)s)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads every system runs with (default: %(default)s, see THREADS_WHY; 0: torch's own choice)",
    )
    sub.add_parser("bench", help="before/after benchmark (see `fdecode bench --help`)", add_help=False)
    argv = sys.argv[1:] if argv is None else argv
    sub.add_parser("profile", help="timeline picture of the before loop and the step", add_help=False)
    if argv[:1] == ["bench"]:
        from fdecode.bench import main as bench_main

        return bench_main(argv[1:])
    sub.add_parser("generate", help="run a model folder on a prompt, streaming its text", add_help=False)
    sub.add_parser("serve", help="OpenAI-compatible HTTP server (see `fdecode serve --help`)", add_help=False)
    if argv[:1] == ["generate"]:
        from fdecode.generate_cli import main as generate_main

        return generate_main(argv[1:])
    if argv[:1] == ["serve"]:
        from fdecode.serve.cli import main as serve_main

        return serve_main(argv[1:])
    if argv[:1] == ["profile"]:
        from fdecode.profile import main as profile_main

        return profile_main(argv[1:])
    args = parser.parse_args(argv)
    return demo(args)


if __name__ == "__main__":
    raise SystemExit(main())
