"""What fdecode shows while it works: progress bars and one-line notices, on stderr
(docs/design.md, "Benchmarks, assets and tools").

`bar` is tqdm's notebook bar where Jupyter can draw one (ipywidgets installed) and
the plain text bar everywhere else: `tqdm.auto` alone picks the notebook bar in any
kernel and, without ipywidgets, warns "IProgress not found" and draws nothing useful.
`notice` prints one line through tqdm, so an open bar is redrawn below it, not torn.
"""

from __future__ import annotations

import importlib.util
import sys

from tqdm import tqdm as text_tqdm


def _bar_class() -> type:
    if importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm as auto_tqdm  # the notebook bar inside Jupyter, the text bar elsewhere

        return auto_tqdm
    return text_tqdm


def bar(**kwargs) -> text_tqdm:
    """A tqdm progress bar (keyword arguments as tqdm's) on stderr."""
    return _bar_class()(**kwargs)


def notice(message: str) -> None:
    """One line on stderr, prefixed "fdecode: "."""
    text_tqdm.write(f"fdecode: {message}", file=sys.stderr)
