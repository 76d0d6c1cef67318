"""The `fdecode bench` workloads that keep rows and a table of their own (docs/design.md, "Benchmarks, assets
and tools").

Each is one module of this package with `run(options) -> list[dict]` (its rows, plain JSON values) and
`markdown(rows) -> str` (the table the CLI prints and BENCHMARKS.md quotes: `fdecode.bench.report_tables.rows`
renders a file's rows with the same function). `--json` writes them under "tables", by workload name.
`Options` carries what the command line says (`--quick`, `--batch`, `-k`, ...); each workload picks its
own points (prompt lengths, contexts, experts) and smaller ones with `quick`. A new workload: a module, a
row in `TABLES`, a line in the CLI's help (`fdecode.bench.cli`), a test of its `--quick` run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

# workload name -> its module under fdecode.bench (imported when the workload runs)
TABLES = {
    "acceptance": "acceptance",
    "depths": "depths",
    "context": "context",
    "prefill": "prefill",
    "moe-experts": "moe",
    "ttft": "ttft",
}


@dataclass(frozen=True)
class Options:
    quick: bool  # tiny sizes and few steps (CI)
    batches: tuple[int, ...]  # --batch
    ks: tuple[int, ...]  # -k: the drafts per step (K)
    new_tokens: int  # --new-tokens
    reps: int  # --reps: timed rounds, interleaved
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    backend: str = "auto"  # what compiles the steps timed ("auto": cudagraphs on CUDA, else inductor)


def module(name: str):
    """The module of a workload in `TABLES`."""
    if name not in TABLES:
        raise ValueError(f"{name!r} is not a workload with a table of its own; those are {sorted(TABLES)}")
    return importlib.import_module(f"fdecode.bench.{TABLES[name]}")


def run(name: str, options: Options) -> list[dict]:
    return module(name).run(options)


def markdown(name: str, rows: list[dict]) -> str:
    return module(name).markdown(rows)
