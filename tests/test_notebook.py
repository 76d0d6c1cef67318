"""examples/quickstart.ipynb: shipped with its outputs, and it executes end to end (so it never goes stale)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"


def code_cells(nb) -> list:
    return [cell for cell in nb["cells"] if cell["cell_type"] == "code"]


def check_outputs(nb) -> None:
    """Every code cell shows something, nothing failed or warned about tqdm's notebook bar, the timeline was drawn."""
    cells = code_cells(nb)
    assert all(cell["outputs"] for cell in cells), [cell["source"][:40] for cell in cells if not cell["outputs"]]
    outputs = [o for cell in cells for o in cell["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error"]
    text = "".join(o.get("text", "") if isinstance(o.get("text", ""), str) else "".join(o["text"]) for o in outputs)
    assert "IProgress not found" not in text and "TqdmWarning" not in text
    assert "mean accepted length" in text and "tok/s" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the timeline picture


def test_the_shipped_notebook_has_its_outputs_and_one_model() -> None:
    nb = json.loads(NOTEBOOK.read_text())
    check_outputs(nb)
    source = "\n".join("".join(cell["source"]) for cell in code_cells(nb))
    # The bundled model and its MTP head throughout: no random model swapped in anywhere.
    assert "from_hf(TINY" in source and "fdecode.bench" not in source and "random" not in source
    for topic in ("fdecode.Engine(step)", "step.warmup(", "engine.cancel(", "TargetOnly"):
        assert topic in source, topic
    markdown = "\n".join("".join(cell["source"]) for cell in nb["cells"] if cell["cell_type"] == "markdown")
    assert "padded with `-1`" in markdown


@pytest.mark.slow
def test_quickstart_notebook_executes(tmp_path, monkeypatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in code_cells(nb):
        cell.outputs = []
    # The cells as written (backend "auto"), run eagerly (FDECODE_BACKEND) in the kernel: this checks that they
    # run and show what they should (half the time of aot_eager's captures); capture is checked by the graph
    # tests, Inductor's code by the lossless tests.
    monkeypatch.setenv("FDECODE_BACKEND", "eager")
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    check_outputs(nb)
