#!/usr/bin/env bash
# The GPU check in one command (<= 5 minutes on one GPU): the CUDA test subset (`pytest -m cuda`)
# and the side-by-side loss timings on the GPU in fp32 and bf16, with the ratio to a device copy of
# the logits (the bandwidth floor). Everything goes to one folder:
#   scripts/gpu_check.sh [OUT]      # default OUT: results/gpu
#   OUT/cuda_tests.txt  the test run's output (exit status on its last line)
#   OUT/device.md, device.csv, device_meta.json  (benchmarks/perf_device.py)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/gpu}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else
  "gpu_check.sh: no CUDA device visible (torch.cuda.is_available() is False); run it on a GPU machine")' || exit 2
mkdir -p "$OUT"
CUDA_TESTS_TIMEOUT=${CUDA_TESTS_TIMEOUT:-210} PYTHON="$PY" scripts/run_cuda_tests.sh > "$OUT/cuda_tests.txt" 2>&1
tests=$?
echo "exit status: $tests" >> "$OUT/cuda_tests.txt"
timeout "${PERF_TIMEOUT:-60}" "$PY" benchmarks/perf_device.py --out "$OUT" --repeats "${PERF_REPEATS:-30}"
perf=$?
echo "gpu_check.sh: tests exit $tests, timings exit $perf; results in $OUT"
[ "$tests" -eq 0 ] && [ "$perf" -eq 0 ]
