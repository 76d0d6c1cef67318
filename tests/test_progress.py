"""fdecode.progress: tqdm's notebook bar only where Jupyter can draw it (ipywidgets), the text bar elsewhere."""

from __future__ import annotations

import importlib.util

import tqdm.auto
import tqdm.std

from fdecode import progress


def test_the_notebook_bar_only_where_ipywidgets_is_installed(monkeypatch) -> None:
    """`tqdm.auto` in a Jupyter kernel without ipywidgets warns "IProgress not found" and draws no bar;
    without ipywidgets fdecode takes the text bar, which a notebook shows as text."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ipywidgets" else real(name, *a))
    with progress.bar(total=1, disable=True) as shown:
        assert type(shown) is tqdm.std.tqdm
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "ipywidgets" else real(name, *a)
    )
    with progress.bar(total=1, disable=True) as shown:
        assert type(shown) is tqdm.auto.tqdm


def test_a_notice_is_one_prefixed_line_on_stderr(capsys) -> None:
    progress.notice("compiling")
    captured = capsys.readouterr()
    assert captured.err == "fdecode: compiling\n" and captured.out == ""
