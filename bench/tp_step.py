"""The seed's shape at TP = 1 and TP = 2 on this machine, side by side: a random Qwen3.5 dense
hybrid (the small Qwen3.5 models' layer pattern: three Gated DeltaNet layers, then one gated attention) with
its MTP head, K = 3, greedy, the default backend.

    python bench/tp_step.py [--hidden 1024 --layers 8 --vocab 32768 --new-tokens 64 --reps 3] [--json PATH]
    python bench/tp_step.py --quick     # a smoke run: a small model (hidden 256), eager, 4 tokens, one rep

Each configuration runs in its own processes (TP = 1: this one; TP = 2: two gloo ranks, spawned), builds the same seeded
model, warms the step up, then times `fdecode.generate` over the same prompt `--reps` times; it reports
the median step time (wall time / decode steps), tokens per step, and the tokens, which must be identical
in the two runs. On a CPU of a few cores the two ranks share the cores: the figure shows what the
collectives cost, not TP's speed-up.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

import fdecode
from fdecode.bench.models import qwen3_5
from fdecode.models import group_exit


def run(rank: int, port: int, out: str, size: int, args: dict) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    group = None
    if size > 1:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=size,
            timeout=datetime.timedelta(seconds=600),
        )
        group = dist.group.WORLD
    target = qwen3_5(args["vocab"], args["hidden"], args["layers"], seed=0)
    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=1, max_seq_len=256, backend=args["backend"], tp_size=size)
    step = fdecode.compile(target, "mtp", cfg, tp_group=group)
    prompt = [(7 * i) % args["vocab"] for i in range(1, 33)]
    warm_start = time.perf_counter()
    fdecode.generate(step, [prompt], max_new_tokens=args["new_tokens"], eos_token_id=[], progress=False)
    warm = time.perf_counter() - warm_start
    seconds, steps, tokens = [], None, None
    for _ in range(args["reps"]):
        start = time.perf_counter()
        done = fdecode.generate(
            step, [prompt], max_new_tokens=args["new_tokens"], eos_token_id=[], details=True, progress=False
        )[0]
        seconds.append(time.perf_counter() - start)
        steps = done.metrics.verified_steps + done.metrics.first_row_steps
        tokens = done.tokens
    if rank == 0:
        result = {
            "tp": size,
            "backend": step.backend,
            "warmup_s": warm,
            "seconds": seconds,
            "steps": steps,
            "step_ms": 1000 * statistics.median(seconds) / steps,
            "tokens_per_step": len(tokens) / steps,
            "tokens": tokens,
        }
        with open(os.path.join(out, f"tp{size}.json"), "w") as f:
            json.dump(result, f)
    if group is not None:
        group_exit.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--json", help="write both rows here")
    parser.add_argument("--quick", action="store_true", help="a smoke run: hidden 256, 4 layers, V 512, eager")
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.layers, args.vocab, args.new_tokens, args.reps, args.backend = 256, 4, 512, 4, 1, "eager"
    settings = {k: getattr(args, k) for k in ("hidden", "layers", "vocab", "new_tokens", "reps", "backend")}
    out = tempfile.mkdtemp()
    rows = []
    for size in (1, 2):
        if size == 1:  # one rank needs no process group: this process runs it
            run(0, 0, out, 1, settings)
        else:
            torch.multiprocessing.start_processes(
                run, args=(_free_port(), out, size, settings), nprocs=size, start_method="spawn"
            )
        with open(os.path.join(out, f"tp{size}.json")) as f:
            rows.append(json.load(f))
    same = rows[0]["tokens"] == rows[1]["tokens"]
    for row in rows:
        print(
            f"TP = {row['tp']} ({row['backend']}): {row['step_ms']:.1f} ms per step, {row['tokens_per_step']:.2f} "
            f"tokens per step, {row['steps']} steps (warm-up {row['warmup_s']:.1f} s)"
        )
    print(f"TP = 2 / TP = 1 step time: {rows[1]['step_ms'] / rows[0]['step_ms']:.2f}x; tokens identical: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": settings, "rows": rows, "tokens_identical": same}, f, indent=1)
    if not same:
        raise SystemExit("error: TP = 1 and TP = 2 committed different tokens")


if __name__ == "__main__":
    main()
