"""The Triton kernel of the fused op equals the reference, bit for bit, on random inputs.

The inputs cover what the reference handles specially: inactive lanes (L = 0),
L = 1 (placeholder repair row), L = K + 1 (repair row writes P - 1), positions
before 0 and past a lane's blocks, negative block ids, a window of one (K = 0),
hidden sizes that are not powers of two or exceed one column chunk, three float
dtypes and a strided hidden tensor: every dtype x hidden width x block size in 60 trials.

Here (no GPU) the kernel runs in Triton's interpreter on CPU tensors
(TRITON_INTERPRET=1 must be set before triton is imported, hence the subprocess).
On CUDA, tests/test_cuda.py runs the same comparison through the registered op.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.prepare_cases import COMBINATIONS


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed (pip install triton)")
def test_triton_kernel_equals_reference_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "tests"), env.get("PYTHONPATH", "")])
    code = "import support.prepare_cases as t; t.interpreted_main()"
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert f"compared {COMBINATIONS}" in done.stdout  # every dtype x width x block size once
