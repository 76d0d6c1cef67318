"""What the default costs on the real pair: first token, peak resident memory and step time, per way of
passing the weights.

    flock /tmp/fdecode-realpair.lock python bench/weights_memory.py [--cache DIR] [--json FILE]
    python bench/weights_memory.py --proxy 2     # random checkpoints of the pair's shapes, 2 layers each
    python bench/weights_memory.py --quick       # a smoke run: tiny random checkpoints, eager, nothing packed

Each row is a fresh process on the plain path (`fdecode.compile` + `step.prefill` + steps, no warmup call):
Qwen2.5-Coder-1.5B-Instruct with the 0.5B draft (`fdecode.assets.qwen_coder`), float32, K = 4, B = 1, greedy.
Ways ("how"):
- folders: `fdecode.compile(target_dir, draft_dir, cfg)`: the default, packed in place (`onednn_packed`);
- rows: the same, but one-row products read the original, whose pages the file then serves again;
- beside: the same, with every packed layout kept beside its weight (what fdecode did before: a second copy);
- unpacked: the same, DecodeConfig.pack_weights=False;
- transformers: transformers models (`AutoModelForCausalLM.from_pretrained`, float32) passed in.
Starts: "cold" runs with every cache empty (Inductor's, the stored graphs, the packed layouts); "first"
(--no-cold) only without the packed layouts; "warm" is a later process on those caches. Times: import apart; `load_s` (transformers only, before compile);
`compile_s` (models read and packed included); `prefill_s` (the first new token is its output);
`first_token_s` = compile + prefill; `first_step_s` (the first decode step: its graph compiles, or loads).
`peak_gb`: the process's peak resident set (ru_maxrss, mapped file pages it touched included); `weights_gb`:
the bytes of the step's models' tensors; `step_ms`: median of 10 decode steps after the first.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

from child_process import cache_env, run_json_child  # bench/child_process.py, beside this script

PROMPT = list(range(1000, 1060))


def weights_bytes(*models) -> int:
    seen, total = set(), 0
    for model in models:
        for t in list(model.parameters()) + list(model.buffers()):
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


PAIR_SHAPES = {"target": (1536, 8960, 12, 128), "draft": (896, 4864, 14, 64)}  # hidden, MLP, heads, head dim
QUICK_SHAPES = {"target": (128, 256, 4, 32), "draft": (64, 128, 2, 32)}


def proxy_folders(cache: str, layers: int, vocab: int, quick: bool = False) -> tuple[str, str]:
    """Random float32 checkpoints of the real pair's layer shapes (Qwen2: 1.5B's and 0.5B's hidden, heads,
    MLP) at `layers` layers each and `vocab` tokens, saved once under `cache`: a stand-in run without the pair."""
    from fdecode.models import LlamaModel, ModelConfig
    from fdecode.models.loading.hf import save_hf

    out = []
    for i, (name, (hidden, mlp, heads, head_dim)) in enumerate((QUICK_SHAPES if quick else PAIR_SHAPES).items()):
        folder = os.path.join(cache, f"proxy-{layers}-{vocab}{'-quick' * quick}", name)
        if not os.path.exists(os.path.join(folder, "model.safetensors")):
            cfg = ModelConfig(
                vocab_size=vocab,
                hidden_size=hidden,
                intermediate_size=mlp,
                num_layers=layers,
                num_heads=heads,
                num_kv_heads=2,
                head_dim=head_dim,
                attention_bias=True,
                model_type="qwen2",
            )
            save_hf(LlamaModel.random(cfg, seed=i, std=0.02), folder)
        out.append(folder)
    return out[0], out[1]


def child(spec: dict) -> dict:
    import dataclasses

    import torch

    import fdecode
    from fdecode.assets.qwen_coder import safetensors_folders

    if spec["how"] == "beside":  # nothing is a checkpoint file's bytes: every layout beside its weight
        from fdecode.backends.cpu import file_pages

        file_pages.file_backed = lambda weight, mappings=None: None
    if spec.get("proxy"):
        target, draft = proxy_folders(
            os.environ["WEIGHTS_BENCH_CACHE"], spec["proxy"], spec["vocab"], spec.get("quick", False)
        )
    else:
        target, draft = (str(p) for p in safetensors_folders())
    start = time.perf_counter()
    if spec["how"] == "transformers":
        from transformers import AutoModelForCausalLM

        target, draft = (AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32) for p in (target, draft))
    load_s = time.perf_counter() - start
    cfg = fdecode.DecodeConfig(num_draft_tokens=4, max_batch=1, max_seq_len=512)
    if spec.get("quick"):  # the script's smoke run: no compile, nothing packed
        cfg = dataclasses.replace(cfg, backend="eager")
    if spec["how"] == "unpacked":
        cfg = dataclasses.replace(cfg, pack_weights=False)
    start = time.perf_counter()
    step = fdecode.compile(target, draft, cfg, announce=False)
    if spec["how"] == "rows":  # in place, but one-row products read the original (its pages come back)
        from fdecode.backends.cpu import onednn_packed

        onednn_packed.read_original_at_one_row(step.target, step.draft)
    compiled = time.perf_counter()
    state = step.prefill([[t % spec.get("vocab", 151936) for t in PROMPT]], max_new_tokens=200)
    prefilled = time.perf_counter()
    first = state.step_output.tokens[0].tolist()
    state, out = step(state)
    stepped = time.perf_counter()
    tokens = first + out.tokens[0].tolist()
    times = []
    for _ in range(2 if spec.get("quick") else 10):
        t = time.perf_counter()
        state, out = step(state)
        tokens += out.tokens[0].tolist()
        times.append(time.perf_counter() - t)
    return {
        **spec,
        "load_s": round(load_s, 2),
        "compile_s": round(compiled - start, 2),
        "prefill_s": round(prefilled - compiled, 2),
        "first_token_s": round(prefilled - start, 2),
        "first_step_s": round(stepped - prefilled, 2),
        "step_ms": round(1000 * statistics.median(times), 1),
        "peak_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9, 2),
        "weights_gb": round(weights_bytes(step.target, step.draft) / 1e9, 2),
        "packing": str(step.packing),
        "tokens": [t for t in tokens if t >= 0][:40],
    }


def run(spec: dict, cache: str) -> dict:
    env = {
        **os.environ,
        **cache_env(cache),
        "WEIGHTS_BENCH_CACHE": cache,
    }
    return run_json_child([__file__, "--child", json.dumps(spec)], env, str(spec))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", default="/tmp/fdecode-weights-bench", help="the caches' folder (kept)")
    parser.add_argument("--hows", nargs="+", default=["folders", "beside", "transformers"])
    parser.add_argument("--proxy", type=int, default=0, help="random checkpoints of the pair's shapes, N layers")
    parser.add_argument("--vocab", type=int, default=151936, help="with --proxy: the vocabulary")
    parser.add_argument(
        "--no-cold", dest="cold", action="store_false", help="keep the compiled graphs: the first row packs only"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny random checkpoints, eager")
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    import shutil

    if args.quick:
        args.proxy, args.vocab, args.hows = 1, 512, ["folders", "rows"]
        args.cache = os.path.join(os.getcwd(), "weights-bench-quick")
    elif not args.proxy:
        from fdecode.assets.qwen_coder import missing_reason

        reason = missing_reason()
        if reason is not None:
            print(f"skipping the real pair: {reason}", file=sys.stderr)
            return 0

    for name in ("inductor", "steps") if args.cold else ("steps/packed",):  # the first row: caches empty
        shutil.rmtree(os.path.join(args.cache, name), ignore_errors=True)
    rows = []
    for how, start in [("folders", "cold" if args.cold else "first"), ("folders", "warm")] + [
        (h, "warm") for h in args.hows if h != "folders"
    ]:
        spec = {"how": how, "start": start, "proxy": args.proxy, "vocab": args.vocab, "quick": args.quick}
        row = run(spec, args.cache)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench_weights_memory_py": rows, "load": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
