"""`fdecode` console script.

    fdecode demo                                   # the bundled model: stream Python code, then before/after
    fdecode demo --draft model                     # ... with its independent draft LM instead of the MTP head
    fdecode demo --model DIR [--draft DIR|mtp] --prompt "def f(x):"   # a local Hugging Face checkpoint
    fdecode bench [--quick] [--batch 1 4 16] [-k 1 2 3 4]              # before/after, side by side
    fdecode profile                                # timeline picture of the before loop and the step

The demo streams the compiled step's greedy continuation as it is produced,
then runs the host-round-trip "before" loop on the same prompt, checks that
both produced the same tokens, and prints tokens/s of each, the mean accepted
length and the compile time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import fdecode
from fdecode.ops.plan import GREEDY
from fdecode.assets import TINY, TINY_DRAFT
from fdecode.baseline import BeforeLoop
from fdecode.models import from_hf
from fdecode.tokenizer import load_tokenizer

REPS = 3  # timed runs of each system
DEFAULT_PROMPT = '''class LRUCache:
    """A mapping that forgets its least recently used keys."""

    def __init__(self, maxsize=128):
'''


def _models(args: argparse.Namespace):
    folder = args.model or TINY
    target = from_hf(folder, dtype=torch.float32)
    if args.draft in (None, "mtp"):
        if target.mtp is None:
            raise SystemExit(f"error: {folder} has no MTP head; pass --draft DIR (a draft checkpoint folder)")
        return folder, target, "mtp", "its MTP head"
    if args.draft == "model":
        if args.model is not None:
            raise SystemExit("error: --draft model means the bundled draft; with --model pass --draft DIR")
        return folder, target, from_hf(TINY_DRAFT, dtype=torch.float32), "the bundled 2-layer draft LM"
    return folder, target, from_hf(args.draft, dtype=torch.float32), str(args.draft)


def demo(args: argparse.Namespace) -> int:
    folder, target, draft, draft_name = _models(args)
    tokenizer = load_tokenizer(folder)
    prompt = tokenizer(args.prompt)["input_ids"]
    eos = tokenizer.eos_token_id
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=args.k, max_batch=1, max_seq_len=len(prompt) + args.max_new_tokens + 2 * args.k + 2,
        backend=args.backend,  # the default config: its greedy lanes run the greedy plan's graph
    )
    step = fdecode.compile(target, draft, cfg)
    print(f"model: {folder} (draft: {draft_name})\nstep:  {step}", file=sys.stderr)
    print("compiling ...", file=sys.stderr, flush=True)
    compile_s = sum(step.warmup(plans=(GREEDY,)).values())  # the demo decodes greedily: the only plan it runs

    print(args.prompt, end="", flush=True)
    engine = fdecode.Engine(step)
    engine.add_request(prompt, max_new_tokens=args.max_new_tokens, eos_token_id=eos)
    tokens: list[int] = []
    shown = ""
    for event in engine.stream():
        tokens += event.new_tokens
        text = tokenizer.decode(tokens)
        # A byte-level tokenizer can end mid character: hold back the replacement mark until it completes.
        stable = text.rstrip("\ufffd")
        print(stable[len(shown):], end="", flush=True)
        shown = stable
    print(text[len(shown):])

    # Before / after, measured the same way (no printing), interleaved, median of REPS runs each.
    before = BeforeLoop(step, backend=step.backend)
    # Warm-up over the same generation: compiles its two forwards for every attention window it crosses.
    before.generate([prompt], max_new_tokens=args.max_new_tokens)
    before_times, after_times = [], []
    for _ in range(REPS):
        start = time.perf_counter()
        (reference,), _ = before.generate([prompt], max_new_tokens=args.max_new_tokens)
        before_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        (again,) = fdecode.generate(step, [prompt], max_new_tokens=args.max_new_tokens, eos_token_id=eos)
        after_times.append(time.perf_counter() - start)
    before_s, after_s = statistics.median(before_times), statistics.median(after_times)
    if eos is not None and eos in reference:
        reference = reference[: reference.index(eos) + 1]
    if not reference == again == tokens:
        print("error: the before loop and the compiled step produced different tokens", file=sys.stderr)
        return 1

    n = len(tokens)
    accepted = (n - 1) / max(engine.steps, 1)  # the first token comes from the prefill
    print(f"\n-- {n} tokens, greedy, K = {args.k}, draft: {draft_name}")
    print(f"before loop (host round trip each step): {n / before_s:8.1f} tok/s   (median of {REPS} runs)")
    print(f"fdecode step ({step.backend}, one graph):     {n / after_s:8.1f} tok/s   ({before_s / after_s:.2f}x)")
    print(f"mean accepted length: {accepted:.2f} tokens per step (of {args.k + 1}); compile: {compile_s:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fdecode", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="stream text from the bundled model, then compare with the before loop")
    p.add_argument("--model", type=Path, help="local Hugging Face checkpoint folder with its tokenizer (default: bundled)")
    p.add_argument("--draft", help="'mtp' (default), 'model' (the bundled draft LM) or a draft checkpoint folder")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt text")
    p.add_argument("-k", type=int, default=3, help="draft tokens per step")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--backend", default="auto", choices=["auto", "inductor", "aot_eager", "eager"])
    sub.add_parser("bench", help="before/after benchmark (see `fdecode bench --help`)", add_help=False)
    argv = sys.argv[1:] if argv is None else argv
    sub.add_parser("profile", help="timeline picture of the before loop and the step", add_help=False)
    if argv[:1] == ["bench"]:
        from fdecode.bench import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["profile"]:
        from fdecode.profile import main as profile_main

        return profile_main(argv[1:])
    args = parser.parse_args(argv)
    return demo(args)


if __name__ == "__main__":
    raise SystemExit(main())
