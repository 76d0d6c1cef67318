"""Cold time to first token, and the stalls after it, against max_seq_len.

    python bench/ttft.py                          # max_seq_len 512 / 2048 / 8192, both modes
    python bench/ttft.py --lengths 512 --backend aot_eager   # a smoke run

Each run is a fresh process with an empty Inductor cache (a temporary
TORCHINDUCTOR_CACHE_DIR), so every compile is cold. It times `fdecode.compile`
plus an `Engine` streaming one greedy request from a 100-token prompt up to
`max_seq_len` (ignore_eos), which crosses every attention window:
- ttft: from `fdecode.compile` to the first event carrying a token (wall, and the process's
  CPU time, which a loaded machine does not stretch; run with `taskset -c N`: one core, so
  Inductor compiles in this process);
- stall: the longest wait between two events after that one (a compile shows here);
- compiles after: Dynamo graphs compiled after the first token (a graph-per-window run that stops
  at its first token, the default, has one compile ahead per window it has not reached);
- step ms: the median time between launches in the smallest and in the largest window.

Two modes, side by side in one run: `dynamic_window=False`, a graph per window compiled
on first use (what fdecode did before: the 256-token window's compile is the
"one window" reference), and the default, one graph for every window. The tokens of
the two modes must be equal. Model: the issue's size, a random 2-layer Llama
(hidden 64, vocabulary 512) drafting for itself (every draft accepted, so the
stream reaches max_seq_len in max_seq_len / 4 steps), K = 3, batch 1, greedy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def cpu_seconds() -> float:
    """CPU time of this process and of its waited-for children (Inductor runs the C++ compiler as one)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def child(max_seq_len: int, dynamic: bool, backend: str, first_token_only: bool) -> dict:
    import torch
    from torch._dynamo.utils import counters

    import fdecode
    from fdecode.bench import llama

    target = llama(vocab=512, hidden=64, layers=2, seed=0)
    prompt = torch.randint(0, 512, (100,), generator=torch.Generator().manual_seed(0)).tolist()
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=3,
        max_batch=1,
        max_seq_len=max_seq_len,
        backend=backend,
        dtype=torch.float32,
        sampling=False,
        dynamic_window=dynamic,
    )
    start, start_cpu = time.perf_counter(), cpu_seconds()
    step = fdecode.compile(target, target, cfg, announce=False)
    launches: list[tuple[float, int]] = []  # (time, window tokens) of each step launch
    run = step._run

    def logged(state, blocks, plan, **kwargs):
        launches.append((time.perf_counter(), blocks * cfg.block_size))
        return run(state, blocks, plan, **kwargs)

    step._run = logged
    engine = fdecode.Engine(step)
    engine.add_request(prompt, max_new_tokens=max_seq_len - len(prompt), ignore_eos=True)
    events, tokens, first_compiles = [], [], None
    for event in engine.stream():
        if event.new_tokens:
            events.append(time.perf_counter())
            tokens += event.new_tokens
            if first_compiles is None:
                first_compiles, first_cpu = counters["stats"]["unique_graphs"], cpu_seconds()
                if first_token_only:
                    break
    gaps = [b - a for a, b in zip(events, events[1:])] or [float("nan")]
    per_window: dict[int, list[float]] = {}
    for (t0, w0), (t1, w1) in zip(launches, launches[1:]):
        if w0 == w1:
            per_window.setdefault(w0, []).append(t1 - t0)
    windows = sorted(per_window) or [0]
    per_window.setdefault(0, [float("nan")])
    return {
        "max_seq_len": max_seq_len,
        "dynamic_window": step.dynamic_window,
        "backend": step.backend,
        "ttft_s": events[0] - start,
        "ttft_cpu_s": first_cpu - start_cpu,  # CPU time, children included (a loaded machine stretches the wall time)
        "first_token_only": first_token_only,
        "windows_of_the_lane": len(cfg.bucket_blocks),
        "stall_s": max(gaps),
        "compiles_after_first_token": counters["stats"]["unique_graphs"] - first_compiles,
        "windows": sorted({w for _, w in launches}),
        "first_call_s": step.compile_seconds,
        "step_ms_smallest_window": 1e3 * statistics.median(per_window[windows[0]]),
        "step_ms_largest_window": 1e3 * statistics.median(per_window[windows[-1]]),
        "tokens": len(tokens),
        "tokens_sha1": hashlib.sha1(json.dumps(tokens).encode()).hexdigest(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    p.add_argument("--backend", default="inductor")
    p.add_argument("--json", default="bench/results/ttft.json")
    p.add_argument(
        "--full-static",
        action="store_true",
        help="stream every graph-per-window run to max_seq_len "
        "too (each later window compiles: minutes each); by default those stop at their first token",
    )
    p.add_argument("--child", nargs=3, metavar=("MAX_SEQ_LEN", "DYNAMIC", "FIRST_ONLY"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(int(args.child[0]), args.child[1] == "1", args.backend, args.child[2] == "1")))
        return 0
    rows = []
    for length in args.lengths:
        for dynamic in (False, True):
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
                first_only = not dynamic and not args.full_static
                cmd = [
                    sys.executable,
                    __file__,
                    "--backend",
                    args.backend,
                    "--child",
                    str(length),
                    str(int(dynamic)),
                    str(int(first_only)),
                ]
                out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(
        "\n| max_seq_len | graphs | windows | cold ttft s, wall (CPU) | / one window's compile, wall (CPU) | "
        "worst stall after s | compiles after | step ms, smallest / largest window |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for length in args.lengths:
        static, dynamic = (r for r in rows if r["max_seq_len"] == length)
        # One window's compile: the per-window run's first token waits for exactly one (its first window's).
        one, one_cpu = static["first_call_s"][str(static["windows"][0])], static["ttft_cpu_s"]
        if not static["first_token_only"]:
            assert static["tokens_sha1"] == dynamic["tokens_sha1"], "the two modes streamed different tokens"
        for row, name in ((static, "one per window (before)"), (dynamic, "one for every window")):
            if row["first_token_only"]:
                ahead = row["windows_of_the_lane"] - 1
                print(
                    f"| {length} | {name} | {row['windows_of_the_lane']} | {row['ttft_s']:.1f} ({row['ttft_cpu_s']:.1f}) "
                    f"| 1.00x (1.00x) | stopped at the first token | {ahead} ahead | |"
                )
                continue
            print(
                f"| {length} | {name} | {len(row['windows'])} | {row['ttft_s']:.1f} ({row['ttft_cpu_s']:.1f}) | "
                f"{row['ttft_s'] / one:.2f}x ({row['ttft_cpu_s'] / one_cpu:.2f}x) | "
                f"{row['stall_s']:.2f} | {row['compiles_after_first_token']} | "
                f"{row['step_ms_smallest_window']:.2f} / {row['step_ms_largest_window']:.2f} |"
            )
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
