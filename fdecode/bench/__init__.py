"""Benchmarks of fdecode: `fdecode bench` (`main`) and the helpers the scripts in bench/ share
(docs/design.md, "Benchmarks, assets and tools").

Outside the library's import graph: nothing in fdecode imports this package but the CLI's `bench`
subcommand. One concept a module: `timing` (synchronize, interleaved and median runs), `results`
(`Result` rows and their markdown table), `models` (random model builders and transformers copies),
`loops` (the decoding loops timed, the mean accepted length), `floor` (the compiled step's compute
floor), `systems` (one workload's systems side by side), `workloads` (the named workloads), `cli`
(`fdecode bench`), and the workloads with modules of their own: `sampling` (real-vocabulary
sampling plans), `pair` (the real Qwen2.5-Coder pair), `features`, `grammar`, `host`, and those with a table of
their own, listed in `registry`: `acceptance`, `depths`, `context`, `prefill`, `moe` (moe-experts) and `ttft`.
`report` and `report_tables` write BENCHMARKS.md. The names below are re-exported for the tests and scripts;
the workloads' modules are imported as modules.
"""

from fdecode.bench.cli import main
from fdecode.bench.floor import compute_floor
from fdecode.bench.loops import fdecode_loop, mean_accepted_length
from fdecode.bench.models import deepseek_v3, hf_pair, llama, qwen3_5
from fdecode.bench.results import Result, markdown
from fdecode.bench.systems import run_workload
from fdecode.bench.timing import interleaved_runs, median_run, synchronize

__all__ = [
    "Result",
    "compute_floor",
    "deepseek_v3",
    "fdecode_loop",
    "hf_pair",
    "interleaved_runs",
    "llama",
    "main",
    "markdown",
    "mean_accepted_length",
    "median_run",
    "qwen3_5",
    "run_workload",
    "synchronize",
]
