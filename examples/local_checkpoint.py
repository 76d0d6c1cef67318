"""Speculative decoding from local Hugging Face checkpoint folders (nothing is downloaded).

    python examples/local_checkpoint.py TARGET_DIR [--draft DRAFT_DIR | --draft mtp] [--prompt TEXT]
    python examples/local_checkpoint.py fdecode/assets/tiny-stdlib --draft fdecode/assets/tiny-stdlib-draft

TARGET_DIR: config.json + *.safetensors (+ tokenizer files) of a Llama / Qwen2 / Qwen3 model; with
`--draft mtp` (the default) its MTP head (`mtp.*` or DeepSeek-style `model.layers.N.*` keys) drafts.
DRAFT_DIR: a smaller model of the same vocabulary.
"""

from __future__ import annotations

import argparse

import torch

import fdecode
from fdecode.models import from_hf
from fdecode.tokenizer import load_tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target")
    p.add_argument("--draft", default="mtp")
    p.add_argument("--prompt", default="def main():\n")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--temperature", type=float, default=0.0)
    args = p.parse_args()

    target = from_hf(args.target, dtype=torch.float32)
    draft = "mtp" if args.draft == "mtp" else from_hf(args.draft, dtype=torch.float32)
    tok = load_tokenizer(args.target)
    prompt = tok(args.prompt)["input_ids"]
    cfg = fdecode.DecodeConfig(num_draft_tokens=args.k, max_batch=1, max_seq_len=len(prompt) + args.max_new_tokens + 16)
    step = fdecode.compile(target, draft, cfg)
    print(step)
    (out,) = fdecode.generate(
        step, [prompt], max_new_tokens=args.max_new_tokens, eos_token_id=tok.eos_token_id,
        temperature=args.temperature, seed=0,
    )
    print(args.prompt + tok.decode(out))


if __name__ == "__main__":
    main()
