"""Speculative decoding from local Hugging Face checkpoint folders (nothing is downloaded).

    python examples/local_checkpoint.py TARGET_DIR [--draft DRAFT_DIR | --draft mtp | --draft ngram] [--prompt TEXT]
    python examples/local_checkpoint.py fdecode/assets/tiny-stdlib --draft fdecode/assets/tiny-stdlib-draft

Compiles the step up front (it says so, with a progress bar: tens of seconds on a CPU for the one
graph that serves every attention window, cached for later runs), generates, and prints the text, the speed and the mean accepted length (tokens each
step commits: 1 .. K + 1).

TARGET_DIR: config.json + *.safetensors (+ tokenizer files) of a Llama / Qwen2 / Qwen3 model; with
`--draft mtp` (the default where the checkpoint has one) its MTP head (`mtp.*` or DeepSeek-style
`model.layers.N.*` keys) drafts; `--draft ngram` drafts by prompt lookup (no second model), the default
where the checkpoint has no MTP head.
DRAFT_DIR: a smaller model of the same tokenizer (its vocabulary may be padded to another size).
"""

from __future__ import annotations

import argparse
import time

import torch

import fdecode
from fdecode.cli import DEFAULT_PROMPT
from fdecode.models import from_hf
from fdecode.ops.plan import plan_for
from fdecode.tokenizer import load_tokenizer


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target")
    p.add_argument(
        "--draft",
        help="mtp, ngram or a draft checkpoint folder (default: mtp where the target has an MTP head, else ngram)",
    )
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="default: the start of a Python class (fdecode demo's)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--backend", default="auto", help="auto, inductor, aot_eager, eager (no compile)")
    args = p.parse_args(argv)

    target = from_hf(args.target, dtype=torch.float32)
    draft = args.draft or ("mtp" if target.mtp is not None else "ngram")
    if draft not in ("mtp", "ngram"):
        draft = from_hf(draft, dtype=torch.float32)
    tok = load_tokenizer(args.target)
    prompt = tok(args.prompt)["input_ids"]
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=args.k, max_batch=1, max_seq_len=len(prompt) + args.max_new_tokens + 16, backend=args.backend
    )
    step = fdecode.compile(target, draft, cfg)
    print(step)
    windows = len(cfg.bucket_blocks)
    print(f"compiling the {step.backend} step ({windows} attention window{'s' * (windows > 1)}) ...", flush=True)
    plan = plan_for([(args.temperature, 0, 1.0)], candidates=cfg.top_k_candidates)  # the one plan this run uses
    print(f"compiled in {sum(step.warmup(plans=(plan,)).values()):.1f} s (summed over windows)")

    engine = fdecode.Engine(step)
    engine.add_request(
        prompt, max_new_tokens=args.max_new_tokens, eos_token_id=tok.eos_token_id, temperature=args.temperature, seed=0
    )
    out, steps = [], 0
    start = time.perf_counter()
    for event in engine.stream():
        out += event.new_tokens
        steps += bool(event.new_tokens)  # one event per step that committed tokens, and the prefill's
    seconds = time.perf_counter() - start
    print(args.prompt + tok.decode(out))
    # The prefill commits the first token; each decode step commits 1 .. K + 1.
    accepted = (len(out) - 1) / max(steps - 1, 1)
    print(
        f"-- {len(out)} tokens in {seconds:.2f} s: {len(out) / seconds:.1f} tok/s (prefill included); "
        f"mean accepted length {accepted:.2f} tokens per step (of {args.k + 1})"
    )


if __name__ == "__main__":
    main()
