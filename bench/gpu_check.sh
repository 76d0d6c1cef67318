#!/usr/bin/env bash
# The prepared device check for a session that is lent a GPU machine: install (keeping the
# machine's own CUDA build of torch) and run the CUDA tests, which skip everywhere else.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
pip install -q -e ".[test]"
python -m pytest -q -rs tests/test_cuda.py
