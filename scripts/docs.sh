#!/usr/bin/env bash
# Build or serve the documentation site (MkDocs + Material + mkdocstrings, MathJax from a wheel).
#
#   scripts/docs.sh serve          # http://127.0.0.1:8000, rebuilt on every edit
#   scripts/docs.sh build [DIR]    # strict build into DIR (default build/site); fails on any warning
#
# Needs the docs extra (scripts/install.sh installs every extra): pip install -e ".[docs]".
# Everything the site loads is local (MathJax is copied from the django-static-mathjax wheel by
# docs/_hooks/mathjax_assets.py); it renders with no network.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export NO_MKDOCS_2_WARNING=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cmd=${1:-serve}
case "$cmd" in
  serve) exec "$PY" -m mkdocs serve --strict -a "${DOCS_ADDR:-127.0.0.1:8000}" ;;
  build) exec "$PY" -m mkdocs build --strict -d "${2:-build/site}" ;;
  *) echo "usage: scripts/docs.sh serve|build [DIR]" >&2; exit 2 ;;
esac
