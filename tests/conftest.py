"""pytest configuration: xdist workers on one thread each, the slowest files first.

Fixtures and hooks only; the helpers the tests share live in tests/support/ (see its __init__).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
import torch
from support.durations import SLOW_SECONDS, measured

# pytest-xdist (`-n 2` in pyproject.toml): one worker per core, each on one thread (its child processes
# too: the notebook's kernel, TP ranks, the CLI) and compiling Inductor's C++ itself rather than through a
# pool of compile processes, so two workers never fight over the cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch._inductor.config

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    torch._inductor.config.compile_threads = 1

# No graphs made in the background (`fdecode.graphs.background`) but where a test asks for them: an adaptive
# Engine would otherwise compile its other depths' graphs beside every test that runs one.
os.environ.setdefault("FDECODE_BACKGROUND_GRAPHS", "0")

# Compiled step graphs go to one folder per test session (`fdecode.graphs.stored`), not the user's cache:
# set here, before the xdist workers start, so both workers share it and a step one test compiled loads
# in the next test that compiles it.
if "FDECODE_CACHE_DIR" not in os.environ:
    _steps = tempfile.mkdtemp(prefix="fdecode-test-steps-")
    os.environ["FDECODE_CACHE_DIR"] = _steps
    atexit.register(shutil.rmtree, _steps, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The fast tier (`pytest -m "not slow"`): every test measured above SLOW_SECONDS is slow too.
    seconds = measured()
    for item in items:
        if seconds.get(item.nodeid, 0.0) > SLOW_SECONDS:
            item.add_marker(pytest.mark.slow)
    # The files that took longest start first, so the two workers end together (`--dist loadfile` hands out
    # whole files in collection order; a file never measured goes last).
    per_file: dict[str, float] = {}
    for nodeid, spent in seconds.items():
        per_file[nodeid.split("::")[0]] = per_file.get(nodeid.split("::")[0], 0.0) + spent
    items.sort(key=lambda item: -per_file.get(item.nodeid.split("::")[0], 0.0))  # stable within a file
