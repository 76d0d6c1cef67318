"""`fdecode` console script.

    fdecode demo                       # a seeded random Llama target with a 1-layer draft, eager vs compiled
    fdecode demo --model DIR [--draft DIR|mtp] --prompt "def f(x):"   # a local Hugging Face checkpoint
    fdecode bench [--quick] [--batch 1 4 16] [-k 1 2 3 4]              # before/after, side by side

The demo checks that the compiled step gives the same tokens as the eager
reference, then prints throughput, mean accepted length and compile time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import fdecode
from fdecode.models import LlamaModel, ModelConfig, from_hf


def _demo_models(seed: int) -> tuple[LlamaModel, LlamaModel]:
    """A random 4-layer target and, as draft, the same weights truncated to the first layer."""
    cfg = ModelConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=688, num_layers=4, num_heads=8, num_kv_heads=4, head_dim=32
    )
    target = LlamaModel.random(cfg, seed=seed, std=0.08)
    with torch.no_grad():  # quiet the upper layers so the 1-layer draft agrees part of the time
        for layer in target.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(0.25)
            layer.mlp.down_proj.weight.mul_(0.25)
    draft = LlamaModel(cfg.replace(num_layers=1))
    draft.load_state_dict(
        {k: v for k, v in target.state_dict().items() if not k.startswith("layers.") or k.startswith("layers.0.")}
    )
    return target, draft


def _timed_generate(step, prompts, max_new_tokens, eos):
    start = time.perf_counter()
    outputs = fdecode.generate(step, prompts, max_new_tokens=max_new_tokens, eos_token_id=eos)
    return outputs, time.perf_counter() - start


def demo(args: argparse.Namespace) -> int:
    torch.manual_seed(args.seed)
    tokenizer = None
    if args.model is None:
        target, draft = _demo_models(args.seed)
        source = "random 4-layer Llama (hidden 256, vocab 4096), draft = its first layer"
        gen = torch.Generator().manual_seed(args.seed)
        prompts = [torch.randint(0, 4096, (n,), generator=gen).tolist() for n in (12, 30, 7, 21)[: args.batch]]
    else:
        target = from_hf(args.model)
        draft = "mtp" if args.draft == "mtp" else from_hf(args.draft) if args.draft else "mtp"
        source = f"{args.model} (draft: {args.draft or 'mtp'})"
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(args.model)
        except Exception as err:  # no tokenizer files or no transformers: token ids only
            print(f"(no tokenizer: {err})", file=sys.stderr)
        if tokenizer is None:
            prompts = [[1, 2, 3]]
        else:
            prompts = [tokenizer(args.prompt)["input_ids"]]
    eos = tokenizer.eos_token_id if tokenizer is not None else None
    max_seq_len = max(len(p) for p in prompts) + args.max_new_tokens + args.k + 1
    # The demo decodes greedily, so it captures the leaner greedy-only graph.
    base = dict(num_draft_tokens=args.k, max_batch=len(prompts), max_seq_len=max_seq_len, sampling=False)

    print(f"model: {source}")
    eager = fdecode.compile(target, draft, fdecode.DecodeConfig(**base, backend="eager"))
    compiled = fdecode.compile(target, draft, fdecode.DecodeConfig(**base, backend=args.backend))
    print(f"step:  {compiled}")

    reference, eager_s = _timed_generate(eager, prompts, args.max_new_tokens, eos)
    start = time.perf_counter()
    _timed_generate(compiled, prompts, args.max_new_tokens, eos)  # warm-up: compiles the step
    compile_s = time.perf_counter() - start
    outputs, compiled_s = _timed_generate(compiled, prompts, args.max_new_tokens, eos)
    if outputs != reference:
        print("error: compiled and eager outputs differ", file=sys.stderr)
        return 1

    state = compiled.prefill(prompts, max_new_tokens=args.max_new_tokens, eos_token_id=eos)
    steps, committed = 0, 0
    while not bool(state.step_output.finished[: len(prompts)].all()):
        state, out = compiled(state)
        steps += 1
        committed += int(out.num_tokens.sum())
    report = fdecode.inspect(compiled, compiled.prefill(prompts, max_new_tokens=args.max_new_tokens))

    for prompt, out in zip(prompts, outputs):
        shown = tokenizer.decode(prompt + out) if tokenizer is not None else f"{prompt} -> {out}"
        print(f"\n{shown}")
    total = sum(len(o) for o in outputs)
    lanes_steps = max(steps, 1) * len(prompts)
    print(
        f"\ntokens: {total} in {len(prompts)} sequence(s); mean accepted length "
        f"{committed / lanes_steps:.2f} of {args.k + 1} per lane-step"
    )
    print(f"eager:    {total / eager_s:8.1f} tok/s")
    print(f"{compiled.backend}: {total / compiled_s:8.1f} tok/s   (compile + first run {compile_s:.1f} s)")
    print(
        f"graph:    {report.graph_count} graph, {report.graph_break_count} breaks, "
        f"{report.op_counts.get('fdecode::prepare_next_draft', 0)} fused prepare op, host syncs: {report.host_syncs or 'none'}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fdecode", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="speculative decoding end to end, eager vs compiled")
    p.add_argument("--model", type=Path, help="local Hugging Face checkpoint folder (default: a seeded random model)")
    p.add_argument("--draft", help="draft checkpoint folder, or 'mtp' (default with --model)")
    p.add_argument("--prompt", default="def fibonacci(n):", help="prompt text (needs the model's tokenizer)")
    p.add_argument("-k", type=int, default=3, help="draft tokens per step")
    p.add_argument("--batch", type=int, default=2, choices=[1, 2, 3, 4], help="prompts (random model only)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--backend", default="auto", choices=["auto", "inductor", "aot_eager", "eager"])
    p.add_argument("--seed", type=int, default=0)
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
