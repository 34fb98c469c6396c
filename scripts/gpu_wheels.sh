#!/usr/bin/env bash
# The wheels a GPU machine's image lacks for scripts/gpu_claims.sh -- jsonargparse[signatures]
# (jsonargparse, docstring-parser, typeshed-client), faiss-cpu and tokenizers (the language model's
# byte-level BPE; its from_pretrained alone needs huggingface_hub), at the versions installed in this
# checkout's .venv -- downloaded for that machine's Python (default 3.12, x86-64 manylinux) into
# .whl/ (ignored by git; name it among the paths carried to the machine). Needs the package index.
#   scripts/gpu_wheels.sh [PYTHON_VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${1:-3.12}
PY=${PYTHON:-.venv/bin/python}
mapfile -t PINS < <("$PY" - <<'PYCODE'
from importlib.metadata import version
for name in ("jsonargparse", "docstring_parser", "typeshed_client", "faiss-cpu", "tokenizers"):
    print(f"{name}=={version(name)}")
PYCODE
)
mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "${PINS[@]}"
echo "gpu_wheels.sh: ${PINS[*]} for Python $PYV in .whl/"
