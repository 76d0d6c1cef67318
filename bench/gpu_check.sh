#!/usr/bin/env bash
# The prepared device check for a session that is lent a GPU machine (`run` tool), in two stages that
# each fit one 10-minute command:
#
#   bash bench/gpu_check.sh tests   # CUDA tests: cudagraphs == eager (greedy), the Triton kernel == the
#                                   # reference, no re-recording after warm-up or across generations,
#                                   # 100 steps (step, then engine loop) under set_sync_debug_mode("error"),
#                                   # then 100 engine steps with admissions and cancels inside that region,
#                                   # fdecode.staging's pinned uploads / reads under it,
#                                   # flash-attn == reference where flash-attn is present; plus the
#                                   # Triton-interpreter and attention-argument checks
#   bash bench/gpu_check.sh host-time   # fdecode bench --workloads host-time on CUDA: the host's time per step and
#                                   # the device's idle time between steps (docs/host-time.md; not run yet)
#   bash bench/gpu_check.sh bench   # fdecode bench on CUDA (cudagraphs, float32, so that the systems'
#                                   # greedy tokens agree exactly, which the bench requires): tokens/s,
#                                   # ms per step, the before loop and target-only side by side in one run
#
# That machine is offline: nothing is installed. Its image's python3 has torch (2.11 when last seen,
# older than this package's torch>=2.13 metadata, so the package runs from the checkout through
# PYTHONPATH rather than being pip-installed), triton, transformers, pytest and hypothesis. The first GPU
# session (2026-12-04, BENCHMARKS.md "First run on a GPU") took 198 s for `tests` and ~120 s for a batch-1
# `bench`, each with a cold Inductor cache; the Triton interpreter test fails there (triton 3.6 with numpy 2.5).
# Logs and JSON go to $OUT (the run tool's folder that comes back), else /tmp/fdecode-gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
out="${OUT:-/tmp/fdecode-gpu}"
mkdir -p "$out"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
case "${1:-tests}" in
  tests)
    python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_prepare_triton.py tests/test_attention.py \
      2>&1 | tee "$out/gpu-tests.log"
    ;;
  bench)  # the default ~30M / ~4M random-weight pair
    python3 -m fdecode.bench --device cuda --dtype float32 --batch 1 8 -k 3 --new-tokens 64 --reps 3 \
      --workloads random-draft --json "$out/bench-cuda.json" 2>&1 | tee "$out/gpu-bench.log"
    ;;
  bench-bundled)  # the bundled model with its MTP head, real acceptance
    python3 -m fdecode.bench --device cuda --dtype float32 --batch 1 8 -k 3 --new-tokens 64 --reps 3 \
      --workloads bundled-mtp --json "$out/bench-cuda-bundled.json" 2>&1 | tee "$out/gpu-bench-bundled.log"
    ;;
  host-time)  # the host's share of a step and the device's idle time between steps (docs/host-time.md);
              # written for issue 54 without a GPU: never run on one yet
    python3 -m fdecode.bench --device cuda --workloads host-time --json "$out/host-time-cuda.json" \
      2>&1 | tee "$out/gpu-host-time.log"
    ;;
  *)
    echo "usage: bash bench/gpu_check.sh [tests|bench|bench-bundled|host-time]" >&2
    exit 2
    ;;
esac
