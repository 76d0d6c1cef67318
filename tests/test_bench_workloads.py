"""The `fdecode bench` workloads with a table of their own (`fdecode.bench.registry`): each one's `--quick` run
through the CLI, eager (their figures are timings or counts of the step as it runs, not Inductor's code), its
JSON rows under "tables", what the rows must say whatever the timings, and the table the results page would
render from the file (`fdecode.bench.report_tables.rows`). In the slow tier, as tests/test_bench.py's `--quick`
runs are: 1-4 s each here (one thread), which the fast tier (`pytest -m "not slow"`, ~2 minutes) has no room for,
and an edit to the library is checked by its own tests, not by its benchmarks."""

from __future__ import annotations

import json

import pytest

from fdecode.bench import main, report_tables, ttft
from fdecode.bench.registry import Options

pytestmark = pytest.mark.slow


def quick(workload: str, tmp_path, monkeypatch, capsys) -> list[dict]:
    out = tmp_path / f"{workload}.json"
    assert main(["--quick", "--backend", "eager", "--workloads", workload, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert list(data["tables"]) == [workload] and data["results"] == []
    monkeypatch.setattr(report_tables, "RESULTS", tmp_path)
    table = report_tables.rows(out.name, workload)
    assert "\n".join(table) in printed and len(table) == 2 + len(data["tables"][workload])
    return data["tables"][workload]


def test_acceptance_counts_every_draft_kind_at_k(tmp_path, monkeypatch, capsys):
    rows = quick("acceptance", tmp_path, monkeypatch, capsys)
    assert [(r["draft"], r["k"]) for r in rows] == [("MTP head", 2), ("draft LM", 2), ("n-gram", 2)]
    for r in rows:
        assert 1.0 <= r["mean_accepted_length"] <= 3.0 and len(r["by_position"]) == 2 and r["verified_steps"] > 0
    # The bundled model's trained drafts are accepted (the n-gram lookup may find nothing in 12 tokens).
    assert rows[0]["mean_accepted_length"] > 1.5 and rows[1]["mean_accepted_length"] > 1.5


def test_depths_runs_every_depth_and_both_engines(tmp_path, monkeypatch, capsys):
    rows = {r["system"]: r for r in quick("depths", tmp_path, monkeypatch, capsys)}
    assert list(rows) == ["depth 0", "depth 1", "depth 2", "Engine depth 2", "Engine"]
    # draft == target: a step at depth d commits d + 1 tokens (12 tokens: the prefill's, then 11 over the steps).
    assert [round(rows[f"depth {d}"]["tokens_per_step"], 2) for d in range(3)] == [round(12 / 11, 2), 2.0, 3.0]
    assert rows["Engine depth 2"]["extra"]["depths_launched"] == {"2": 4}
    engine = rows["Engine"]  # choosing: its launches are its steps
    assert sum(engine["extra"]["depths_launched"].values()) == round(12 / engine["tokens_per_step"])


def test_context_times_buckets_and_the_whole_lane(tmp_path, monkeypatch, capsys):
    rows = quick("context", tmp_path, monkeypatch, capsys)
    assert [(r["max_seq_len"], r["context"], r["window"]) for r in rows] == [
        (256, 100, 256),
        (1024, 100, 256),
        (1024, 400, 512),
    ]
    assert all(r["buckets_ms"] > 0 and r["whole_lane_ms"] > 0 for r in rows)


def test_prefill_times_the_bucket_and_the_whole_lane(tmp_path, monkeypatch, capsys):
    (row,) = quick("prefill", tmp_path, monkeypatch, capsys)
    assert (row["max_seq_len"], row["prompt_tokens"], row["window"]) == (1024, 100, 256)
    assert row["bucketed_ms"] > 0 and row["whole_lane_ms"] > 0


def test_moe_experts_times_each_expert_count(tmp_path, monkeypatch, capsys):
    rows = quick("moe-experts", tmp_path, monkeypatch, capsys)
    assert [(r["experts"], r["pairs_per_moe_layer"]) for r in rows] == [(4, 6), (8, 6)]  # B = 1, K = 2, top-2
    assert rows[0]["ratio"] == 1.0 and rows[1]["step_ms"] > 0


def test_ttft_reads_the_first_token_of_an_admitted_request(tmp_path, monkeypatch, capsys):
    (alone, longer) = quick("ttft", tmp_path, monkeypatch, capsys)
    assert (alone["prompt_tokens"], longer["prompt_tokens"], alone["running"]) == (16, 64, 0)
    # Beside a running request (--quick's sizes at B = 2): admitted (primed) in the first step() after
    # add_request, its token read with the next step's output.
    rows = ttft.run(Options(quick=True, batches=(2,), ks=(2,), new_tokens=12, reps=1, backend="eager"))
    assert [(r["running"], r["engine_steps"]) for r in rows] == [(1, 2), (1, 2)]
    assert all(r["ttft_ms"] > 0 for r in rows)
