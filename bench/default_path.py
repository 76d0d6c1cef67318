"""The plain path on the real pair: `fdecode.compile` with the default config, then the Engine `fdecode.generate`
runs, no warmup call (docs/design.md, "Adaptive depth and the idle draft").

    flock /tmp/fdecode-realpair.lock python bench/default_path.py --cache /tmp/dp-cache   # cold: an empty cache
    flock /tmp/fdecode-realpair.lock python bench/default_path.py --cache /tmp/dp-cache   # warm: a second process
    flock /tmp/fdecode-realpair.lock python bench/default_path.py --cache /tmp/dp-cache --first-call-only
    python bench/default_path.py --quick   # a smoke run: the bundled model, eager, 8 tokens

One process. The first call: `fdecode.compile`, then an Engine's stream of the first prompt to its first token
and on to its last, timed (its steps run at depth K while the other depths' graphs are made on a thread of
their own, `fdecode.runtime.depth_graphs`); then the wait until those graphs are made (or loaded); the
seconds of each graph's first call (`Step.plan_compile_seconds`) and the process's peak resident memory
against the weights' bytes. Then, per prompt (the bench's three qwen-coder prompts, `fdecode.bench.pair`),
interleaved rounds of target-only decoding (`fdecode.baseline.TargetOnly`), the default Engine (what
`generate` runs, choosing among the depths now made), the same Engine held at depth K and, with --assisted,
transformers' assisted generation with the same pair (float32, its tokens compared but not required equal). Greedy, no EOS
stop, K = 4, B = 1, fp32; every system must decode target-only's tokens. --cache points both the Inductor
cache and fdecode's stored step graphs at one folder (empty: a cold start; filled by a run before: a warm one).
Times are given in seconds and in CPU seconds (C++ builds included), which a busy machine does not stretch.
Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

from child_process import cache_env  # bench/child_process.py, beside this script
from weights_memory import weights_bytes  # bench/weights_memory.py, beside this script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", help="the Inductor cache and stored step graphs' folder (default: the user's)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompts", nargs="*", default=["write", "text", "edit"])
    parser.add_argument("--out", default=None, help="JSON output (default: print only)")
    parser.add_argument("--no-warm-up", action="store_true", help="no untimed round first (every graph is made)")
    parser.add_argument("--quick", action="store_true", help="the bundled model, eager, 8 tokens: a smoke run")
    parser.add_argument("--first-call-only", action="store_true", help="stop after the first call (a warm start)")
    parser.add_argument("--assisted", action="store_true", help="transformers' assisted generation in the rounds too")
    args = parser.parse_args()
    if args.cache:  # before torch reads them
        os.environ.update(cache_env(args.cache))
    import torch

    import fdecode
    from fdecode.baseline import TargetOnly
    from fdecode.bench.loops import engine_run
    from fdecode.bench.pair import PROMPTS, SEQ_LEN, chat_ids
    from fdecode.bench.timing import interleaved_runs, paired_ratio

    k, new_tokens = 4, args.new_tokens
    start = time.perf_counter()
    if args.quick:
        from fdecode.assets import TINY, TINY_DRAFT
        from fdecode.models import from_hf

        target, draft = from_hf(TINY, dtype=torch.float32), from_hf(TINY_DRAFT, dtype=torch.float32)
        backend, new_tokens, prompts = "eager", 8, {"text": list(b"def main():\n    ")}
        args.reps, args.no_warm_up = 1, True
    else:
        from transformers import AutoTokenizer

        from fdecode.assets import qwen_coder

        reason = qwen_coder.missing_reason()
        if reason is not None:
            print(f"default_path: {reason}", file=sys.stderr)
            sys.exit(1)
        target, draft = (str(folder) for folder in qwen_coder.safetensors_folders())  # as the README passes them
        tokenizer = AutoTokenizer.from_pretrained(draft)
        backend, prompts = "auto", {name: chat_ids(tokenizer, PROMPTS[name]) for name in args.prompts}
    load_s = time.perf_counter() - start

    first_prompt = next(iter(prompts.values()))
    start, cpu_start = time.perf_counter(), cpu_seconds()
    cfg = fdecode.DecodeConfig(num_draft_tokens=k, max_batch=1, max_seq_len=SEQ_LEN, dtype=torch.float32)
    if backend != "auto":
        cfg = dataclasses.replace(cfg, backend=backend)
    step = fdecode.compile(target, draft, cfg)
    compile_call_s = time.perf_counter() - start
    engine = fdecode.Engine(step)
    engine.add_request(first_prompt, max_new_tokens=new_tokens, ignore_eos=True)
    first_token_s = second_token_s = None
    for event in engine.stream():
        if event.new_tokens and first_token_s is not None and second_token_s is None:
            second_token_s = time.perf_counter() - start  # after the first decode step: depth K's graph made
        if first_token_s is None and event.new_tokens:
            first_token_s, first_token_cpu_s = time.perf_counter() - start, cpu_seconds() - cpu_start
            print(f"... first token after {first_token_s:.1f} s, {first_token_cpu_s:.1f} CPU s", flush=True)
            first_stream_start = time.perf_counter()
    first_stream_s = time.perf_counter() - first_stream_start
    first_depths = {d: n for d, n in engine.policy.launches.items() if n}
    waited = time.perf_counter()
    step.graph_set.background.wait()
    background_wait_s = time.perf_counter() - waited
    first_call_cpu_s = cpu_seconds() - cpu_start
    graphs = {f"{name} @ {window}": round(s, 2) for (window, name), s in step.plan_compile_seconds.items()}
    print(
        f"... first token {first_token_s:.1f} s (compile call {compile_call_s:.1f} s), second {second_token_s:.1f} s; "
        f"the rest of the stream {first_stream_s:.1f} s at depths {first_depths}; then {background_wait_s:.1f} s "
        f"more for the background graphs {step.graph_set.background}; graphs {graphs}",
        flush=True,
    )
    first_call = {
        "load_s": round(load_s, 2),
        "compile_call_s": round(compile_call_s, 2),
        "first_token_s": round(first_token_s, 2),
        "first_token_cpu_s": round(first_token_cpu_s, 2),
        "second_token_s": round(second_token_s, 2),
        "first_stream_rest_s": round(first_stream_s, 2),
        "first_stream_depths": first_depths,
        "background_wait_s": round(background_wait_s, 2),
        "first_call_cpu_s": round(first_call_cpu_s, 2),
        "graph_first_call_s": graphs,
        "peak_gb": peak_gb(),
        "weights_gb": round(weights_bytes(step.target, step.draft) / 1e9, 2),
    }
    if args.first_call_only:
        print(json.dumps(first_call, indent=1))
        if args.out:
            Path(args.out).write_text(json.dumps(first_call, indent=1) + "\n")
        return
    hf = None
    if args.assisted and not args.quick:  # transformers' models from the same folders, float32, no EOS stop
        from transformers import AutoModelForCausalLM

        from fdecode.bench.pair import hf_generate

        hf = tuple(AutoModelForCausalLM.from_pretrained(f, dtype=torch.float32).eval() for f in (target, draft))
        for model in hf:
            model.generation_config.eos_token_id = None
    target_only = TargetOnly(step, backend=step.backend)
    start = time.perf_counter()
    target_only.generate([first_prompt], max_new_tokens=4)  # compiles its graph
    target_only_compile_s = time.perf_counter() - start

    rows = {}
    for name, prompt in prompts.items():
        systems = {
            "target-only": lambda: (target_only.generate([prompt], max_new_tokens=new_tokens)[0][0], None),
            "default": lambda: one(engine_run(step, [prompt], new_tokens, adaptive=True)),
            f"depth {k} only": lambda: one(engine_run(step, [prompt], new_tokens, adaptive=False)),
        }
        if hf is not None:
            systems["hf-assisted"] = lambda: (hf_generate(hf[0], [prompt], new_tokens, assistant=hf[1])[0], None)
        rounds: dict[str, list[float]] = {}
        with torch.no_grad():
            timed = interleaved_runs(
                systems, args.reps, warm_up=not args.no_warm_up, announce=f"... {name}: ", rounds=rounds
            )
        reference = timed["target-only"][3][0]
        wrong = [s for s, (*_, (tokens, _)) in timed.items() if tokens != reference and s != "hf-assisted"]
        if wrong:
            raise RuntimeError(f"{name}: {wrong} disagree with target-only's greedy tokens; no numbers")
        rows[name] = {
            system: {
                "tok_s": round(new_tokens / median, 3),
                "seconds": [round(s, 3) for s in rounds[system]],
                "vs_target_only": round(paired_ratio(rounds[system], rounds["target-only"]), 3),
                "same_tokens": tokens == reference,
                **({} if info is None else info),
            }
            for system, (median, _lo, _hi, (tokens, info)) in timed.items()
        }
        if hf is not None:
            rows[name]["default"]["vs_hf_assisted"] = round(paired_ratio(rounds["default"], rounds["hf-assisted"]), 3)
        print(f"... {name}: " + ", ".join(f"{s} {r['vs_target_only']:.2f}x" for s, r in rows[name].items()), flush=True)
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
        "k": k,
        "new_tokens": new_tokens,
        "reps": args.reps,
        "warm_up_round": not args.no_warm_up,
        "cache": args.cache,
        **first_call,
        "target_only_compile_s": round(target_only_compile_s, 2),
        "prompts": rows,
        "peak_gb_end": peak_gb(),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


def cpu_seconds() -> float:
    """This process's CPU seconds, its C++ compiler children's included (what a busy machine does not stretch)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def peak_gb() -> float:
    """The process's peak resident set so far, GB (mapped file pages it touched included)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9, 2)


def one(run):
    """(tokens, info) of a one-prompt `engine_run`."""
    tokens, _steps, info = run
    return tokens[0], info


if __name__ == "__main__":
    main()
