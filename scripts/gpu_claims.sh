#!/usr/bin/env bash
# Benchmark claims whose arms train on a GPU (an arm's trainer.accelerator: gpu), a session at a time:
# a GPU machine may be lent for minutes only. Runs the claims on the visible CUDA device(s) until
# MINUTES have passed (no run starts that its declared time would carry past them), then writes every
# finished run, with the per-item test records of its evaluation runs, to OUT/<claims>_runs.csv. Commit
# that file as results/revision4/in_progress/<claims>_runs.csv: the next call reads it (--runs-from) and
# makes only the runs still missing. Once every run is in, the reports are written to OUT/report.
#
#   REPRODUCE_CODE_VERSION=$(git rev-parse --short=12 HEAD) scripts/gpu_claims.sh pfc_cosface_c1e5_r4 7 [OUT]
#
# REPRODUCE_CODE_VERSION names the commit where the machine receives a copy of the tree without .git
# (each run also records the hash of the code it ran). Needs torch with CUDA, pytorch_lightning,
# torchmetrics, timm, matplotlib and PyYAML, which a GPU image has; jsonargparse[signatures] and
# faiss-cpu where it lacks them: wheels put in .whl/ beside this repository are installed into a
# scratch folder first. JOBS (default 4) runs share the GPU; PYTHON picks the interpreter.
set -uo pipefail
cd "$(dirname "$0")/.."
CLAIMS=${1:?usage: scripts/gpu_claims.sh CLAIMS MINUTES [OUT]}
MINUTES=${2:?usage: scripts/gpu_claims.sh CLAIMS MINUTES [OUT]}
OUT=${3:-/tmp/gpu_claims}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else
  "gpu_claims.sh: no CUDA device visible (torch.cuda.is_available() is False); run it on a GPU machine")' || exit 2
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_claims_site \
    .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/gpu_claims_site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
NAME=${CLAIMS//,/_}
RUNS=results/revision4/in_progress/${NAME}_runs.csv
FROM=()
[ -f "$RUNS" ] && FROM=(--runs-from "$RUNS")
mkdir -p "$OUT"
COMMON=(--claims-file benchmarks/claims_revision4.yaml --claims "$CLAIMS" --workdir "$OUT/work")
# the data caches (a trained tokenizer, token streams) built once, before runs side by side would each build them
"$PY" benchmarks/reproduce_results.py "${COMMON[@]}" --prepare-data
"$PY" benchmarks/reproduce_results.py "${COMMON[@]}" "${FROM[@]}" --out "$OUT/report" --jobs "${JOBS:-4}" \
  --deadline "$MINUTES"
status=$?
"$PY" benchmarks/reproduce_results.py "${COMMON[@]}" "${FROM[@]}" --export-runs "$OUT/${NAME}_runs.csv"
exported=$?
echo "gpu_claims.sh: runs exit $status (0: every run in and the reports written to $OUT/report; 3: stopped at" \
  "the deadline), export exit $exported: $OUT/${NAME}_runs.csv"
[ "$exported" -eq 0 ] && { [ "$status" -eq 0 ] || [ "$status" -eq 3 ]; }
