"""`fdecode bench --quick` runs end to end and its JSON has every field."""

from __future__ import annotations

import json

import pytest

from fdecode.bench import Result, main

SYSTEMS = {"target-only", "before", "fdecode-eager", "fdecode", "hf-generate", "hf-assisted"}


@pytest.mark.slow
def test_quick_bench_writes_every_field(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--quick", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    fields = set(Result.__dataclass_fields__)
    for row in data["results"]:
        assert set(row) == fields
        assert row["tokens_per_s"] > 0 and row["step_ms"] > 0
    for workload in ("random-draft", "draft=target"):
        rows = [r for r in data["results"] if r["workload"] == workload]
        assert {r["system"] for r in rows} == SYSTEMS
        (ours,) = [r for r in rows if r["system"] == "fdecode"]
        assert ours["floor_ms"] > 0 and ours["overhead"] < 1
    # draft == target: every draft is accepted, K + 1 tokens per lane-step (the bench's own check of outputs
    # against target-only already passed, or main() would have raised).
    (same,) = [r for r in data["results"] if r["workload"] == "draft=target" and r["system"] == "fdecode"]
    assert same["tokens_per_step"] > 2.5
    assert "| fdecode |" in capsys.readouterr().out


@pytest.mark.slow
def test_profile_writes_traces_and_a_timeline(tmp_path, capsys):
    from fdecode.profile import main as profile_main

    assert profile_main(["--out", str(tmp_path), "--iterations", "3", "--target", "64x2", "--vocab", "256", "-k", "2"]) == 0
    for name in ("before.json", "fdecode.json"):
        trace = json.loads((tmp_path / name).read_text())
        labels = {e.get("name", "") for e in trace["traceEvents"]}
        assert any(label.startswith(("before/", "fdecode/")) for label in labels)
    png = (tmp_path / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    out = capsys.readouterr().out
    assert "host round trip" in out and "fdecode step" in out
