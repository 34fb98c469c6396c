#!/usr/bin/env bash
# The GPU check in one command (about 6 minutes on one H200): the Triton kernel tests on CUDA
# tensors, the CUDA test subset (`pytest -m cuda`), the side-by-side runs of the kernels and their
# peers (benchmarks/perf_gpu.py: the logits losses at (8192, 128256), the LM head, sparsemax /
# entmax-1.5) and every logits loss at small sizes (benchmarks/perf_device.py). The peers
# (Liger-Kernel, cut-cross-entropy, entmax) are optional: install their wheels beside it first
# for the peer rows. Everything goes to one folder:
#   scripts/gpu_check.sh [OUT]      # default OUT: results/perf/gpu
#   OUT/kernel_tests.txt, OUT/cuda_tests.txt   the test runs' output (exit status on the last line)
#   OUT/gpu.md, gpu.csv, gpu_meta.json         (benchmarks/perf_gpu.py)
#   OUT/device.md, device.csv, device_meta.json (benchmarks/perf_device.py)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/perf/gpu}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else
  "gpu_check.sh: no CUDA device visible (torch.cuda.is_available() is False); run it on a GPU machine")' || exit 2
mkdir -p "$OUT"
timeout "${KERNEL_TESTS_TIMEOUT:-150}" "$PY" -m pytest tests/test_triton_kernels.py -p no:xdist -q > "$OUT/kernel_tests.txt" 2>&1
kernels=$?
echo "exit status: $kernels" >> "$OUT/kernel_tests.txt"
CUDA_TESTS_TIMEOUT=${CUDA_TESTS_TIMEOUT:-210} PYTHON="$PY" scripts/run_cuda_tests.sh > "$OUT/cuda_tests.txt" 2>&1
tests=$?
echo "exit status: $tests" >> "$OUT/cuda_tests.txt"
timeout "${PERF_GPU_TIMEOUT:-240}" "$PY" benchmarks/perf_gpu.py --out "$OUT" --repeats "${PERF_GPU_REPEATS:-8}"
gpu=$?
timeout "${PERF_TIMEOUT:-60}" "$PY" benchmarks/perf_device.py --out "$OUT" --repeats "${PERF_REPEATS:-20}"
perf=$?
echo "gpu_check.sh: kernel tests exit $kernels, CUDA tests exit $tests, perf_gpu exit $gpu, perf_device exit $perf; results in $OUT"
[ "$kernels" -eq 0 ] && [ "$tests" -eq 0 ] && [ "$gpu" -eq 0 ] && [ "$perf" -eq 0 ]
