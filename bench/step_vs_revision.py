"""The default config's step time, this tree against another revision, interleaved in fresh processes.

    python bench/step_vs_revision.py --before HEAD~20 --rounds 5       # any revision git knows
    python bench/step_vs_revision.py --before HEAD~20 --model micro    # the host-time micro model (docs/host-time.md)
    python bench/step_vs_revision.py --quick                          # a smoke run: micro, eager, 1 round, vs HEAD

Each round runs one child process per tree (the revision is checked out into a temporary git worktree),
alternating; a child compiles the request-features workload's models (V = 151,936, target 256x4, draft
128x1, random weights) with the default `DecodeConfig` (inductor, B = 8, K = 4, greedy lanes), warms
up, and times `--steps` steps from a prefilled state (one device read at the end). Both trees share one
Inductor cache, so every child after a tree's first loads its graph. Reported: each tree's median
ms/step over the rounds and the ratio now / before.

`--model qwen-coder`: the real Qwen2.5-Coder pair (`$FDECODE_QWEN_CODER`, fp32, K = 4, B = 1, the free-text chat
prompt), `--steps` steps from a fresh prefill, 3 timed runs after one that compiles or loads the graphs; the
process's CPU time (the pair runs on every thread). The two trees' committed tokens are compared too.

`--model micro`: instead, the 1-layer, 32-wide target and draft at V = 64 (`fdecode.bench.host`), B = 1,
K = 3, one thread (`--model bundled`: the bundled model with its MTP head, the process's threads); each child times `--steps` steps from a fresh prefill, 7 times, and reports the median
wall time and the median CPU time of its thread (`time.thread_time`: on a machine shared with other jobs,
the figure their load disturbs least; a one-thread step on the CPU is all the thread's own work).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from child_process import run_json_child  # bench/child_process.py, beside this script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small_child(steps: int, model: str) -> dict:
    import torch

    import fdecode

    k, prompt = 3, list(range(1, 17))
    if model == "micro":
        from fdecode.bench import llama

        torch.set_num_threads(1)
        target, draft = llama(64, 32, 1, seed=1), llama(64, 32, 1, seed=2)
    else:
        from fdecode.assets import TINY
        from fdecode.models import from_hf

        target, draft = from_hf(TINY, dtype=torch.float32), "mtp"
    cfg = fdecode.DecodeConfig(num_draft_tokens=k, max_batch=1, max_seq_len=len(prompt) + (steps + 2) * (k + 1))
    step = fdecode.compile(target, draft, cfg, announce=False)
    runs, cpu = [], []
    for _ in range(8):  # the first run compiles or loads the graph
        state = step.prefill([prompt], max_new_tokens=steps * (k + 1), eos_token_id=[])
        start, start_cpu = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            state, out = step(state)
        out.packed.tolist()
        runs.append((time.perf_counter() - start) / steps)
        cpu.append((time.thread_time() - start_cpu) / steps)
    return {
        "ms": 1e3 * statistics.median(runs[1:]),
        "cpu_ms": 1e3 * statistics.median(cpu[1:]),
        "torch_threads": torch.get_num_threads(),
    }


# The real pair's free-text prompt (`fdecode.bench.pair`'s "text"), spelled here: a child imports the other tree.
PAIR_TEXT = "In a short paragraph, explain to a new programmer why version control matters."


def pair_child(steps: int) -> dict:
    """The real Qwen2.5-Coder pair (`$FDECODE_QWEN_CODER`), fp32, the default config at K = 4, B = 1, greedy: the
    median of 3 timed runs of `steps` steps from a fresh prefill of the free-text chat prompt, after one run that
    compiles or loads the graphs. Both trees commit the same tokens (greedy, lossless), so ms/step compares the
    same work."""
    import torch
    from transformers import AutoTokenizer

    import fdecode
    from fdecode.assets.qwen_coder import safetensors_folders

    target, draft = safetensors_folders()
    tokenizer = AutoTokenizer.from_pretrained(draft)
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": PAIR_TEXT}], add_generation_prompt=True, tokenize=False
    )
    prompt, k = tokenizer(chat)["input_ids"], 4
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=k, max_batch=1, max_seq_len=len(prompt) + (steps + 2) * (k + 1), dtype=torch.float32
    )
    step = fdecode.compile(str(target), str(draft), cfg, announce=False)
    runs, cpu, tokens = [], [], None
    for _ in range(4):  # the first run compiles or loads the graphs
        state = step.prefill([prompt], max_new_tokens=steps * (k + 1), eos_token_id=[])
        start, start_cpu = time.perf_counter(), time.process_time()
        committed = []
        for _ in range(steps):
            state, out = step(state)
            committed.append(out.packed)
        committed = [row.tolist() for row in committed]  # one device read at the end
        runs.append((time.perf_counter() - start) / steps)
        cpu.append((time.process_time() - start_cpu) / steps)
        tokens = committed
    return {
        "ms": 1e3 * statistics.median(runs[1:]),
        "cpu_ms": 1e3 * statistics.median(cpu[1:]),
        "torch_threads": torch.get_num_threads(),
        "tokens": tokens,
    }


def child(steps: int) -> dict:
    import torch

    import fdecode
    from fdecode.bench import llama
    from fdecode.bench.sampling import VOCAB

    batch, k = 8, 4
    target, draft = llama(VOCAB, 256, 4, seed=1), llama(VOCAB, 128, 1, seed=2)
    budget = 2 * steps * (k + 1) + 1
    cfg = fdecode.DecodeConfig(num_draft_tokens=k, max_batch=batch, max_seq_len=16 + batch + budget + 2 * (k + 1))
    step = fdecode.compile(target, draft, cfg, announce=False)
    prompts = [list(range(1 + lane, 17 + lane)) for lane in range(batch)]
    state = step.prefill(prompts, max_new_tokens=budget, eos_token_id=[])
    for _ in range(steps):  # warm-up: the graph compiles or loads, caches fill
        state, out = step(state)
    out.packed.tolist()
    start = time.perf_counter()
    for _ in range(steps):
        state, out = step(state)
    out.packed.tolist()
    return {"ms": 1e3 * (time.perf_counter() - start) / steps, "torch_threads": torch.get_num_threads()}


def run_child(tree: str, steps: int, model: str, backend: str | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": tree, **({"FDECODE_BACKEND": backend} if backend else {})}
    args = [os.path.abspath(__file__), "--child", str(steps), "--model", model]
    return run_json_child(args, env, f"in {tree}", cwd=tree)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=False, help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", default=None)
    parser.add_argument("--model", choices=("default", "micro", "bundled", "qwen-coder"), default="default")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: the micro model run eagerly, 1 round of 3 steps, against HEAD",
    )
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.model, args.rounds, args.steps, args.before = "micro", 1, 3, args.before or "HEAD"
    if args.child is not None:
        children = {"default": child, "qwen-coder": pair_child}
        run = children.get(args.model, lambda steps: small_child(steps, args.model))
        print(json.dumps(run(args.child)))
        return 0
    if args.before is None:
        parser.error("--before REV is required")
    with tempfile.TemporaryDirectory(prefix="fdecode-before-") as tmp:
        before = os.path.join(tmp, "tree")
        added = subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", before, args.before])
        if added.returncode != 0:
            print(f"step_vs_revision: cannot check out {args.before!r} here (not a git clone?); nothing measured")
            return 0
        try:
            runs, tokens = {"before": [], "now": []}, []
            for round_ in range(args.rounds):
                for name, tree in (("before", before), ("now", ROOT)):
                    # The smoke run checks that both trees run, not Inductor's code: eager (FDECODE_BACKEND).
                    runs[name].append(run_child(tree, args.steps, args.model, "eager" if args.quick else None))
                    if "tokens" in runs[name][-1]:  # the real pair's committed tokens, compared below
                        tokens.append(runs[name][-1].pop("tokens"))
                    print(f"round {round_}: {name} {runs[name][-1]}", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", before], check=False)
    figures = {"ms": "wall ms/step", "cpu_ms": "CPU ms/step (thread)"}
    report = {"before": args.before, "model": args.model, "rounds": runs}
    for field, title in figures.items():
        if any(field not in run for run in runs["now"] + runs["before"]):
            continue
        times = {name: [run[field] for run in rs] for name, rs in runs.items()}
        medians = {name: statistics.median(ts) for name, ts in times.items()}
        print(f"| tree | {title} (median, min-max) |\n|---|---|")
        for name, ts in times.items():
            label = args.before if name == "before" else "this tree"
            print(f"| {label} | {medians[name]:.3f} ({min(ts):.3f}-{max(ts):.3f}) |")
        # Round by round: each round's two children ran back to back, so a drift of the machine cancels.
        paired = statistics.median(n / b for n, b in zip(times["now"], times["before"]))
        print(
            f"\nnow / before ({title}): {medians['now'] / medians['before']:.3f} of the medians, "
            f"{paired:.3f} median of the rounds' ratios\n"
        )
        report[f"ratio_{field}"] = paired
    if tokens:
        report["same_tokens"] = all(t == tokens[0] for t in tokens)
        print(f"committed tokens equal in every child of both trees: {report['same_tokens']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
