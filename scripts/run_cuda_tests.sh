#!/usr/bin/env bash
# The CUDA subset of the tests (`pytest -m cuda`: tests/test_cuda.py), on a machine with a GPU.
# CPU CI skips these; run this script on a GPU machine before a release:
#   scripts/run_cuda_tests.sh            # uses .venv/bin/python if present, else python3
#   CUDA_TESTS_TIMEOUT=300 scripts/run_cuda_tests.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else
  "run_cuda_tests.sh: no CUDA device visible (torch.cuda.is_available() is False); run it on a GPU machine")'
exec timeout "${CUDA_TESTS_TIMEOUT:-480}" "$PY" -m pytest -m cuda -p no:xdist -q "$@"
