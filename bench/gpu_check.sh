#!/usr/bin/env bash
# The prepared device check for a session that is lent a GPU machine: install (keeping the
# machine's own CUDA build of torch, and its triton) and run the CUDA tests, which skip everywhere
# else: cudagraphs == eager (greedy), the Triton kernel == the reference, no re-recording after
# warm-up, 100 steps (the step, then the engine loop) under torch.cuda.set_sync_debug_mode("error").
# Then the CPU-side backend tests and the Triton interpreter comparison, as a cross-check.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
python -c "import triton; print('triton', triton.__version__)" || echo "triton missing: the Triton tests will fail"
pip install -q --no-deps -e .
pip install -q "transformers>=4.56" "pytest>=8" "hypothesis>=6"
python -m pytest -q -rs tests/test_cuda.py tests/test_backends.py tests/test_prepare_triton.py
