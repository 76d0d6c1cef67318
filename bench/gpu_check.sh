#!/usr/bin/env bash
# The CUDA checks of fdecode, for a machine with an NVIDIA GPU, in stages that each take a few minutes:
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
#   bash bench/gpu_check.sh bench-bundled   # the same on the bundled model with its MTP head
#   bash bench/gpu_check.sh trees   # draft trees against the chain at B = 1 (bench/tree_speed.py): the bundled
#                                   # model with its MTP head and with its draft LM, tokens per verify, step ms,
#                                   # tok/s, and each verify's and level's forward time (not run on a GPU yet)
#   bash bench/gpu_check.sh --quick # a smoke run: without CUDA it says so and exits 0; with CUDA, fdecode
#                                   # bench --quick on it (tests/test_bench_scripts.py runs it)
#
# It runs the package from this checkout through PYTHONPATH, so nothing needs installing when the GPU image's
# torch is older than the package's torch>=2.13 metadata: python3 (or $PYTHON) needs torch with CUDA, triton,
# transformers, pytest and hypothesis. On an H200 (2026-12-04, BENCHMARKS.md "First run on a GPU") `tests`
# took 198 s and a batch-1 `bench` ~120 s, each with a cold Inductor cache; the Triton interpreter test
# failed there (triton 3.6 with numpy 2.5). Logs and JSON go to $OUT if set, else /tmp/fdecode-gpu.
set -uo pipefail
usage="usage: bash bench/gpu_check.sh [tests|bench|bench-bundled|trees|host-time|--quick]"
stage="${1:-tests}"
case "$stage" in
  tests | bench | bench-bundled | trees | host-time | --quick) ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
python3="${PYTHON:-python3}"
out="${OUT:-/tmp/fdecode-gpu}"
mkdir -p "$out"
if [ "$stage" = --quick ] && ! "$python3" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  echo "gpu_check --quick: no CUDA device here (torch.cuda.is_available() is False): nothing to check"
  exit 0
fi
"$python3" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
case "$stage" in
  tests)
    "$python3" -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_prepare_triton.py tests/test_attention.py \
      2>&1 | tee "$out/gpu-tests.log"
    ;;
  bench)  # the default ~30M / ~4M random-weight pair
    "$python3" -m fdecode.bench --device cuda --dtype float32 --batch 1 8 -k 3 --new-tokens 64 --reps 3 \
      --workloads random-draft --json "$out/bench-cuda.json" 2>&1 | tee "$out/gpu-bench.log"
    ;;
  bench-bundled)  # the bundled model with its MTP head, real acceptance
    "$python3" -m fdecode.bench --device cuda --dtype float32 --batch 1 8 -k 3 --new-tokens 64 --reps 3 \
      --workloads bundled-mtp --json "$out/bench-cuda-bundled.json" 2>&1 | tee "$out/gpu-bench-bundled.log"
    ;;
  trees)  # trees against chains on the GPU, where a verify of 8-16 rows should cost about what 4 rows do
    for model in bundled-mtp bundled-draft; do
      "$python3" bench/tree_speed.py --model "$model" --device cuda --shapes 3:1:3 6:2:3 8:3:3 4:1:4 8:3:4 12:3:4 16:4:4 \
        2>&1 | tee "$out/gpu-trees-$model.log"
      # the adaptive Engines of the chain (draft_topk=1) and of the tree draft_topk="auto" makes of K = 4 on an
      # accelerator (16:4:4, which chooses among both: fdecode/tree/auto.py), B = 1 and B = 4
      for batch in 1 4; do
        "$python3" bench/tree_speed.py --model "$model" --device cuda --engine-only --batch "$batch" \
          --shapes 4:1:4 16:4:4 2>&1 | tee "$out/gpu-trees-engine-$model-b$batch.log"
      done
    done
    ;;
  host-time)  # the host's share of a step and the device's idle time between steps (docs/host-time.md);
              # written without a GPU: not run on one yet
    "$python3" -m fdecode.bench --device cuda --workloads host-time --json "$out/host-time-cuda.json" \
      2>&1 | tee "$out/gpu-host-time.log"
    ;;
  --quick)  # fdecode bench's smoke run on CUDA
    "$python3" -m fdecode.bench --quick --device cuda --dtype float32 --workloads random-draft \
      --json "$out/bench-cuda-quick.json" 2>&1 | tee "$out/gpu-quick.log"
    ;;
esac
