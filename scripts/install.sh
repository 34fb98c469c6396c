#!/usr/bin/env bash
# Create .venv and install the project with every extra, offline-friendly (pip only).
# torch 2.14.1 + torchvision 0.29.1 are the builds pip finds on this machine's disk;
# RecBole is installed without dependencies: only its bundled MovieLens-100k files are read.
# The docs test (tests/test_docs_site.py) drives Debian's chromium + chromedriver; they are
# installed with apt when missing (needs root or sudo; skipped when already present).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  { $SUDO apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; } ||
    echo "install.sh: could not install chromium / chromium-driver with apt; tests/test_docs_site.py will fail" >&2
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.14.1" "torchvision==0.29.1" -e ".[all]"
.venv/bin/python -m pip install -q --no-deps "recbole==1.2.1"
.venv/bin/python -c "import torch, losses; print('installed: torch', torch.__version__, '| losses', losses.__version__)"
