#!/usr/bin/env bash
# Create .venv and install the project with every extra, offline-friendly (pip only).
# torch 2.14.1 + torchvision 0.29.1 are the builds pip finds on this machine's disk;
# RecBole is installed without dependencies: only its bundled MovieLens-100k files are read.
# The docs test (tests/test_docs_site.py) drives Debian's chromium + chromedriver; they are
# installed with apt when missing (needs root or sudo; skipped when already present).
set -euo pipefail
cd "$(dirname "$0")/.."
# apt waits up to APT_LOCK_WAIT seconds (default 600) for a lock another apt or dpkg process holds
# (an unattended upgrade, a second install), saying so, instead of failing at once.
APT_LOCK_WAIT=${APT_LOCK_WAIT:-600}
apt_get() {
  local waited=0 out status
  while :; do
    status=0
    out=$($SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=60 "$@" 2>&1) || status=$?
    if [ "$status" -eq 0 ]; then return 0; fi
    if printf '%s' "$out" | grep -q "Could not get lock\|Unable to acquire the dpkg frontend lock\|Unable to lock directory" &&
       [ "$waited" -lt "$APT_LOCK_WAIT" ]; then
      echo "install.sh: another apt/dpkg process holds the package lock; waiting (${waited}s of ${APT_LOCK_WAIT}s)" >&2
      sleep 10; waited=$((waited + 10))
      continue
    fi
    printf '%s\n' "$out" | tail -n 5 >&2
    return "$status"
  done
}
if ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  { apt_get update -qq && apt_get install -y -qq chromium chromium-driver >/dev/null; } ||
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
