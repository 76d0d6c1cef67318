"""Where a step's time goes on the real pair, against what this machine's memory bandwidth allows.

    python bench/step_phases.py                 # Qwen2.5-Coder 1.5B + 0.5B, fp32, B = 1, K = 4
    python bench/step_phases.py --k 8 --json bench/results/step_phases.json
    python bench/step_phases.py --compare-onednn   # the compiled forwards with and without oneDNN, interleaved
    python bench/step_phases.py --compare-packed   # ... with oneDNN's packed weights and without, interleaved
    python bench/step_phases.py --quick            # a smoke run: small random models, eager

At B = 1 a decoder forward is bound by reading its weights: every row of a verify, and every draft
forward, reads all of them once. The script measures the read bandwidth (the median of summing a
1 GiB float32 tensor with the process's threads), counts the bytes each forward reads (every
parameter except the embedding table, of which a forward gathers a few rows; a tied head reads it
whole as the LM head) and so states each forward's floor. It then times, eagerly and one phase at a
time over a prefilled state (medians of `--repeats`):
- the target's verify forward over K + 1 rows;
- one draft forward of 1 row (a step runs K of them: 2 rows, then 1);
- the whole step, eager and compiled (inductor, the default config);
and the two forwards again compiled as the step compiles them (large linears by oneDNN from the packed
weights `fdecode.compile` keeps, small few-row ones weight-stationary: `fdecode.backends.cpu.matmul`). "other" is a step less the target's
verify and K draft forwards: sampling, acceptance, the prepare op, the draft's first forward having
2 rows, and the wrapper. Tokens per second at the floor: (accepted tokens per step) / (target + K drafts at the floor).
The models come from `fdecode.assets.qwen_coder` (skipped, naming the script that fetches them, when
missing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch

import fdecode
from fdecode.assets import qwen_coder
from fdecode.backends import cpu
from fdecode.backends.cpu.onednn_linear import pack_linears
from fdecode.bench.pair import PROMPTS, chat_ids
from fdecode.bench.timing import interleaved_runs
from fdecode.graphs.backends import capture
from fdecode.models.cost import forward_bytes  # what one forward reads: the floor's bytes

PROMPT = PROMPTS["write"]  # the workload's code-writing prompt


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm: allocator, lazy init
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes per second this process reads from memory (a float32 sum over `gib` GiB)."""
    data = torch.ones(int(gib * 2**30) // 4)
    seconds = median_seconds(lambda: data.sum(), repeats)
    return data.numel() * 4 / seconds


def without_onednn(verify, draft_row, compiled_verify, compiled_draft, cfg, repeats: int) -> dict[str, float]:
    """The compiled forwards with oneDNN (`fdecode.backends.cpu.onednn_linear`) and without it (every linear left to the
    BLAS call, few rows weight-stationary), timed in turn `repeats` times: medians."""
    from unittest import mock

    from fdecode.backends.cpu import onednn_linear

    def verify_blas():  # code objects of their own: Dynamo would otherwise reuse the graphs compiled above
        return verify()

    def draft_blas():
        return draft_row()

    with mock.patch.object(onednn_linear, "MIN_BYTES", 2**62):  # no weight is this large: the pass keeps BLAS
        blas_verify, blas_draft = capture("inductor", verify_blas, cfg), capture("inductor", draft_blas, cfg)
        blas_verify(), blas_draft()  # compile here, under the patch
    systems = {
        "target_verify_onednn": compiled_verify,
        "target_verify_blas": blas_verify,
        "draft_forward_onednn": compiled_draft,
        "draft_forward_blas": blas_draft,
    }
    return {name: timed[0] for name, timed in interleaved_runs(systems, repeats, warm_up=False).items()}


def without_packing(compiled_verify, compiled_draft, repeats: int) -> dict[str, float]:
    """The compiled forwards with oneDNN's packed weights (`fdecode.backends.cpu.onednn_packed`) and with oneDNN reading
    the weights as they lie (the same graphs: the op finds no packed copy), timed in turn: medians."""
    from unittest import mock

    from fdecode.backends.cpu import onednn_packed

    def unpacked(fn):
        def run():
            with mock.patch.object(onednn_packed, "packed", lambda weight: None):
                return fn()

        return run

    systems = {
        "target_verify_packed": compiled_verify,
        "target_verify_unpacked": unpacked(compiled_verify),
        "draft_forward_packed": compiled_draft,
        "draft_forward_unpacked": unpacked(compiled_draft),
    }
    return {name: timed[0] for name, timed in interleaved_runs(systems, repeats, warm_up=False).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--compare-onednn",
        action="store_true",
        help="also time the compiled verify and draft forward with every linear left to the BLAS "
        "call (no oneDNN), interleaved with the default ones",
    )
    parser.add_argument(
        "--compare-packed",
        action="store_true",
        help="also time the compiled verify and draft forward with oneDNN reading the weights as "
        "they lie (no packed copies), interleaved with the default ones",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: small random models, eager, 8 tokens")
    args = parser.parse_args(argv)
    if args.quick:
        from fdecode.bench import llama

        models, prompt, compiler, gib, new = (
            (llama(512, 64, 2, seed=0), llama(512, 64, 1, seed=1)),
            [5] * 24,
            "eager",
            0.01,
            8,
        )
        args.repeats = 1
    else:
        reason = qwen_coder.missing_reason()
        if reason is not None:
            print(f"skipped: {reason}")
            return 0
        from transformers import AutoTokenizer

        target_dir, draft_dir = qwen_coder.safetensors_folders()
        prompt = chat_ids(AutoTokenizer.from_pretrained(target_dir), PROMPT)
        models, compiler, gib, new = (str(target_dir), str(draft_dir)), "inductor", 1.0, 64
    k = args.k
    cfg = fdecode.DecodeConfig(num_draft_tokens=k, max_batch=1, max_seq_len=512, backend="eager", sampling=False)
    eager = fdecode.compile(*models, cfg)
    target, draft = eager.target, eager.draft
    bandwidth = read_bandwidth(gib)
    floor = {name: forward_bytes(m) / bandwidth for name, m in (("target", target), ("draft", draft))}

    state = eager.prefill([prompt], max_new_tokens=new)
    tables, bs = state.block_tables, cfg.block_size
    rows = state.base_pos[:, None] + torch.arange(k + 1)
    tokens = state.tokens.clamp_min(0)
    scratch = torch.zeros_like(rows)  # slot 0: the scratch block, so timing writes nothing that matters

    def verify():
        return target(tokens, rows, scratch, state.target_kv, tables, block_size=bs)

    def draft_row():
        return draft(tokens[:, :1], rows[:, :1], scratch[:, :1], state.draft_kv, tables, block_size=bs)

    def eager_step():
        fresh = eager.prefill([prompt], max_new_tokens=new)
        start = time.perf_counter()
        eager(fresh)
        return time.perf_counter() - start

    inductor = dataclasses.replace(cfg, backend=compiler)
    with torch.no_grad():
        measured = {
            "eager_target_verify": median_seconds(verify, args.repeats),
            "eager_draft_forward": median_seconds(draft_row, args.repeats),
        }
        eager_step()
        measured["eager_step"] = statistics.median(eager_step() for _ in range(args.repeats))
        # The same forwards compiled as the step compiles them (Inductor, few-row matmuls weight-stationary).
        if cpu.packs_weights(inductor, compiler):  # as fdecode.compile does for this config
            pack_linears(target, draft)
        compiled_verify, compiled_draft = (
            capture(compiler, verify, inductor),
            capture(compiler, draft_row, inductor),
        )
        measured["target_verify"] = median_seconds(compiled_verify, args.repeats)
        measured["draft_forward"] = median_seconds(compiled_draft, args.repeats)
        if args.compare_onednn:
            measured.update(without_onednn(verify, draft_row, compiled_verify, compiled_draft, inductor, args.repeats))
        if args.compare_packed:
            measured.update(without_packing(compiled_verify, compiled_draft, args.repeats))
    measured["eager_other"] = (
        measured["eager_step"] - measured["eager_target_verify"] - k * measured["eager_draft_forward"]
    )

    compiled = fdecode.compile(target, draft, inductor)
    state = compiled.prefill([prompt], max_new_tokens=new)
    compiled(state.clone())  # compiles (minutes cold: BENCHMARKS.md, "Cold start and warm-up")
    times, accepted = [], []
    state = compiled.prefill([prompt], max_new_tokens=new)
    while not bool(state.step_output.finished[0]):
        start = time.perf_counter()
        state, out = compiled(state)
        accepted.append(int(out.num_tokens[0]))
        times.append(time.perf_counter() - start)
    measured["compiled_step"] = statistics.median(times)
    measured["compiled_other"] = measured["compiled_step"] - measured["target_verify"] - k * measured["draft_forward"]
    mean_accepted = sum(accepted) / len(accepted)
    step_floor = floor["target"] + k * floor["draft"]
    result = {
        "k": k,
        "bandwidth_gb_s": bandwidth / 1e9,
        "threads": torch.get_num_threads(),
        "floor_s": floor,
        "step_floor_s": step_floor,
        "measured_s": measured,
        "mean_accepted": mean_accepted,
        "steps": len(accepted),
        "tokens_per_s": {
            "floor": mean_accepted / step_floor,
            "compiled": mean_accepted / measured["compiled_step"],
            "target_only_floor": 1 / floor["target"],
        },
    }
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s ({torch.get_num_threads()} threads); K = {k}")
    print(
        f"floors: target forward {floor['target'] * 1e3:.0f} ms, draft forward {floor['draft'] * 1e3:.0f} ms, "
        f"step {step_floor * 1e3:.0f} ms"
    )
    for name, seconds in measured.items():
        print(f"  {name:14s} {seconds * 1e3:8.1f} ms")
    print(
        f"mean accepted {mean_accepted:.2f} tokens/step over {len(accepted)} steps: "
        f"{result['tokens_per_s']['compiled']:.2f} tok/s compiled, {result['tokens_per_s']['floor']:.2f} at the floor "
        f"(target alone at its floor: {result['tokens_per_s']['target_only_floor']:.2f})"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
