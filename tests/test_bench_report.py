"""BENCHMARKS.md is what `python -m fdecode.bench.report` writes from bench/results/, and bench/results/ holds
exactly the files it cites (a result no page reads is not kept; a page never cites a file that is gone)."""

from __future__ import annotations

from fdecode.bench import report
from fdecode.bench.report_tables import RESULTS


def test_the_results_page_is_regenerated_without_a_diff() -> None:
    page = report.PAGE.read_text()
    assert page == report.render(), "BENCHMARKS.md differs: run python -m fdecode.bench.report"
    assert page.count("\n") <= 400


def test_results_hold_exactly_the_cited_files() -> None:
    cited = {name for section in report.SECTIONS for name in section.files if not name.startswith("../")}
    assert cited == {p.name for p in RESULTS.iterdir()}
    for section in report.SECTIONS:
        assert section.machine in report.MACHINES and section.command and section.date


def test_check_mode_fails_on_a_stale_page(tmp_path, monkeypatch, capsys) -> None:
    stale = tmp_path / "BENCHMARKS.md"
    stale.write_text(report.render().replace("2.19x", "2.20x"))
    monkeypatch.setattr(report, "PAGE", stale)
    assert report.main(["--check"]) == 1
    stale.write_text(report.render())
    assert report.main(["--check"]) == 0
    assert "up to date" in capsys.readouterr().out
