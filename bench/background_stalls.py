"""What a stream pays while an Engine makes its other depths' graphs in the background
(`fdecode.graphs.background`, docs/design.md "Adaptive depth and the idle draft").

    python bench/background_stalls.py --cache /tmp/bg-cache        # cold: an empty cache, Inductor
    python bench/background_stalls.py --cache /tmp/bg-cache2 --switch-interval 0.5
    python bench/background_stalls.py --pair --cache /tmp/bg-pair --new-tokens 200 --after 40   # the real pair
    python bench/background_stalls.py --quick                      # a smoke run: eager, a few steps

The bundled model with its draft LM (K = 4; --pair: the real Qwen2.5-Coder 1.5B / 0.5B pair, fp32), one Engine, no
warmup call, requests of --new-tokens greedy tokens one after another; every launch is held at depth K (the
controller's depths narrowed to K), so each step is the same graph whether the background thread is making the others
or not. Steps are timed on the Engine's thread and split by whether graphs were being made at their launch: median,
mean, the longest and how many took over 100 ms, until --after steps have run with every graph made (or --limit
seconds passed). --cache points the Inductor cache and fdecode's stored step graphs at one folder (empty: every graph
is compiled); --switch-interval sets Python's (`sys.setswitchinterval`, in ms).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from child_process import cache_env  # bench/child_process.py, beside this script


def summary(seconds: list[float]) -> str:
    ms = [1e3 * s for s in seconds]
    return (
        f"{len(ms)} steps, median {statistics.median(ms):.2f} ms, mean {statistics.mean(ms):.2f} ms, "
        f"longest {max(ms):.0f} ms, {sum(m > 100 for m in ms)} over 100 ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", help="the Inductor cache and stored step graphs' folder (default: the user's)")
    parser.add_argument("--switch-interval", type=float, default=5.0, help="Python's switch interval, ms")
    parser.add_argument("--new-tokens", type=int, default=1000)
    parser.add_argument("--after", type=int, default=400, help="steps timed once every graph is made")
    parser.add_argument("--limit", type=float, default=900.0, help="seconds at most")
    parser.add_argument("--pair", action="store_true", help="the real Qwen2.5-Coder pair, not the bundled model")
    parser.add_argument("--quick", action="store_true", help="eager, short requests: a smoke run")
    args = parser.parse_args()
    if args.cache:  # before torch reads them
        os.environ.update(cache_env(args.cache))
    if not args.quick:  # (a smoke run keeps the environment's: the test suite's runs in one process, off)
        os.environ["FDECODE_BACKGROUND_GRAPHS"] = "1"
    sys.setswitchinterval(args.switch_interval / 1e3)
    import torch

    import fdecode
    from fdecode.assets import TINY_DRAFT
    from fdecode.models.loading.pair import load_pair

    backend, new_tokens, after = ("eager", 16, 8) if args.quick else ("inductor", args.new_tokens, args.after)
    if args.pair:
        from fdecode.assets import qwen_coder

        reason = qwen_coder.missing_reason()
        if reason is not None:
            print(f"background_stalls: {reason}", file=sys.stderr)
            sys.exit(0 if args.quick else 1)
        target, draft = (str(folder) for folder in qwen_coder.safetensors_folders())
    else:
        target, draft, _ = load_pair(None, str(TINY_DRAFT))
    cfg = fdecode.DecodeConfig(num_draft_tokens=4, max_batch=1, max_seq_len=2048, backend=backend, dtype=torch.float32)
    step = fdecode.compile(target, draft, cfg, announce=False)
    engine = fdecode.Engine(step)
    engine.policy.depths = (cfg.K,)  # every launch the same graph, compiling or not
    timed: dict[bool, list[float]] = {True: [], False: []}
    start = busy_until = time.perf_counter()
    while len(timed[False]) < after and time.perf_counter() - start < args.limit:
        if not engine.has_work():
            engine.add_request(list(range(1, 40)), max_new_tokens=new_tokens, ignore_eos=True)
        busy = step.graph_set.background.busy
        began = time.perf_counter()
        engine.step()
        timed[busy].append(time.perf_counter() - began)
        busy_until = time.perf_counter() if busy else busy_until
    made = ", ".join(key.name(cfg.K) for key in step.graph_set.background.made)
    print(f"switch interval {args.switch_interval} ms, {backend}; made in the background: {made or 'none'}")
    print(f"graphs were being made for the first {busy_until - start:.0f} s of the steps")
    for busy, label in ((True, "while graphs were made"), (False, "with every graph made")):
        seconds = timed[busy][3:]  # (the first step, before any graph is asked for, compiles the first graph)
        print(f"{label}: {summary(seconds) if seconds else 'no steps'}")


if __name__ == "__main__":
    main()
