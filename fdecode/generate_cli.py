"""`fdecode generate`: run a model folder on a prompt from the command line, streaming its text.

    fdecode generate "def fib(n):"                                    # the bundled model
    fdecode generate --model DIR --draft ngram --chat "Write a haiku about the sea."
    fdecode generate --model DIR --draft DRAFT_DIR --temperature 0.7 --seed 1 "Once upon a time"
    fdecode generate -k 8 --draft-topk 3 --draft-depth 4 "def fib(n):"   # draft trees (docs/guide.md)

--chat sends the prompt as one user message through the tokenizer's chat template. The text streams as
the Engine commits it (`Event.text`: never a broken character); a summary line goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import fdecode
from fdecode.draft_flags import add_draft_flags, draft_settings
from fdecode.models.loading.pair import load_pair
from fdecode.tokenizer import load_tokenizer


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fdecode generate", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("prompt")
    p.add_argument("--model", type=Path, help="local Hugging Face checkpoint folder (default: the bundled model)")
    p.add_argument("--draft", help="'mtp', 'ngram' or a draft checkpoint folder (default: mtp where the model has it)")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    add_draft_flags(p)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--backend", default="auto", help="what compiles the step (default: auto)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:  # the config is checked before any weight is read
        cfg = fdecode.DecodeConfig(
            **draft_settings(args), max_batch=1, max_seq_len=args.max_seq_len, backend=args.backend
        )
        target, draft, folder = load_pair(args.model, args.draft)
        step = fdecode.compile(target, draft, cfg)  # refuses what these models cannot run, before any capture
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    tokenizer = load_tokenizer(folder)
    engine = fdecode.Engine(step, tokenizer=tokenizer)
    prompt = [{"role": "user", "content": args.prompt}] if args.chat else args.prompt
    sampling = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p)
    try:
        engine.add_request(prompt, max_new_tokens=args.max_new_tokens, seed=args.seed, **sampling)
    except (ValueError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not args.chat:
        print(args.prompt, end="", flush=True)
    start, count = time.perf_counter(), 0
    for event in engine.stream():
        print(event.text or "", end="", flush=True)
        count += len(event.new_tokens)
        if event.finished:
            reason, metrics = event.reason, event.metrics
    seconds = time.perf_counter() - start
    print()
    print(
        f"-- {count} tokens in {seconds:.1f} s ({count / seconds:.1f} tok/s, compile included), ended: {reason}; "
        f"{metrics.mean_accepted_length:.2f} tokens per verified step ({step.backend}, draft: {step.draft_kind})",
        file=sys.stderr,
    )
    return 0
