"""Every script kept in bench/ still runs: each one's `--quick` mode (tiny sizes, cheap backends), all in one
Python process (`runpy`, so torch and fdecode are imported once), which a script that fails stops. Scripts
that need the real pair and find it absent say so and exit 0, as they do for a user (step_phases' smoke run
uses small random models instead). A script added to bench/ must be listed here. A script whose results the
results page renders writes its `--json` here too, and the page's renderer reads it (`WRITES`). bench/gpu_check.sh, the CUDA
checks, is checked here for its syntax, its usage line and its --quick on a machine without CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = (
    "prepare_op.py",
    "ops_table.py",
    "tp_memory.py",
    "depth_policy.py",
    "seed_batch.py",
    "step_phases.py",
    "tp_step.py",
    "cold_start.py",
    "step_vs_revision.py",
    "small_linears.py",
    "weights_memory.py",
    "tree_acceptance.py",
    "tree_speed.py",
    "default_path.py",
    "background_stalls.py",
)
HELPERS = ("compile_phases.py", "child_process.py")  # imported by the scripts, not run on their own
ELSEWHERE = ("serve_load.py",)  # its --quick and --chaos --quick run in tests/test_serve.py, beside a server
WRITES = {"tree_acceptance.py": "tree_acceptance.json"}  # script -> the --json file its quick run writes

DRIVER = """
import os, runpy, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))  # as `python bench/X.py` has it: the scripts import their helpers
for run in sys.argv[1:]:  # a script, then its extra arguments, "|" between
    script, *extra = run.split("|")
    sys.argv = [script, "--quick", *extra]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    print("<<done " + script + ">>", flush=True)
"""


def test_every_kept_bench_script_is_listed() -> None:
    on_disk = {p.name for p in (ROOT / "bench").glob("*.py")}
    assert on_disk == set(SCRIPTS) | set(HELPERS) | set(ELSEWHERE)


@pytest.mark.slow  # ~40 s on an idle 2-core machine: the imports, two spawned TP ranks, one cold-start child
def test_every_bench_script_runs_its_quick_mode(tmp_path, monkeypatch) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "FDECODE_CACHE_DIR": str(tmp_path / "steps"),
    }
    scripts = [str(ROOT / "bench" / name) for name in SCRIPTS]
    runs = [script + (f"|--json|{WRITES[name]}" if name in WRITES else "") for name, script in zip(SCRIPTS, scripts)]
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, *runs], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for script in scripts:
        assert f"<<done {script}>>" in done.stdout
    assert "| 1 |" in done.stdout  # prepare_op's table row at B = 1
    assert "| 32 (4) | 4 |" in done.stdout  # small_linears' row: width 32, 4 rows
    assert "TP = 2 / TP = 1 step time" in done.stdout and "tokens identical: True" in done.stdout
    from fdecode.bench import report_tables

    monkeypatch.setattr(report_tables, "RESULTS", tmp_path)
    # tree_acceptance's smoke run: the chain of depth 3 and one tree (6 nodes, k = 2) on random models.
    header, _, chain, tree = report_tables.tree_acceptance(WRITES["tree_acceptance.py"])
    assert header.startswith("| tokens | depth S | nodes N | k = 1 (the chain) | k = 2 |")
    assert chain.startswith("| 8 | 3 | 3 | 1.00 |  |") and tree.startswith("| 8 | 3 | 6 |  | 1.00 (1.00x) |")


def test_gpu_check_parses_refuses_an_unknown_stage_and_has_a_quick_mode(tmp_path) -> None:
    script = str(ROOT / "bench" / "gpu_check.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    unknown = subprocess.run(["bash", script, "no-such-stage"], capture_output=True, text=True, timeout=60)
    assert unknown.returncode != 0
    assert "usage: bash bench/gpu_check.sh [tests|bench|bench-bundled|trees|host-time|--quick]" in unknown.stderr
    import torch

    if torch.cuda.is_available():
        pytest.skip("--quick runs fdecode bench on this CUDA device: bash bench/gpu_check.sh --quick")
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    quick = subprocess.run(["bash", script, "--quick"], capture_output=True, text=True, env=env, timeout=120)
    assert quick.returncode == 0, quick.stdout + quick.stderr
    assert "no CUDA device here" in quick.stdout
