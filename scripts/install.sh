#!/usr/bin/env bash
# Create .venv and install the project with every extra, offline-friendly (pip only).
# torch 2.14.1 + torchvision 0.29.1 are the builds pip finds on this machine's disk;
# RecBole is installed without dependencies: only its bundled MovieLens-100k files are read.
#
#   ./scripts/install.sh               # the project into .venv: pip only, no root, no apt
#   ./scripts/install.sh --docs-test   # also the test suite's system tools, with apt (root or sudo):
#                                      # Debian's chromium + chromedriver for the docs test
#                                      # (tests/test_docs_site.py) and clang for the C kernels'
#                                      # second compiler (tests/classification/test_native_clang.py),
#                                      # which fail without them; the full suite and CI need this
#   ./scripts/install.sh --dry-run     # print the steps, run none
# INSTALL_DOCS_TEST=1 in the environment is the same as --docs-test.
set -euo pipefail
cd "$(dirname "$0")/.."
DOCS_TEST=${INSTALL_DOCS_TEST:-0}
DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --docs-test) DOCS_TEST=1 ;;
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (options: --docs-test, --dry-run, --help)" >&2; exit 2 ;;
  esac
done
[ "$DOCS_TEST" = 1 ] || [ "$DOCS_TEST" = 0 ] || { echo "install.sh: INSTALL_DOCS_TEST must be 0 or 1 (got '$DOCS_TEST')" >&2; exit 2; }
step() {  # run a step, or print it under --dry-run
  if [ "$DRY_RUN" = 1 ]; then echo "would run: $*"; else "$@"; fi
}
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
#: the system tools the full suite needs besides .venv: (command, Debian package)
TEST_TOOLS="chromium:chromium chromedriver:chromium-driver clang:clang"
install_test_tools() {
  local missing="" tool
  for tool in $TEST_TOOLS; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing="$missing ${tool#*:}"
  done
  if [ -z "$missing" ]; then
    echo "install.sh: chromium, chromedriver and clang found; apt not needed"
    return 0
  fi
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  if [ "$DRY_RUN" = 1 ]; then
    echo "would run: ${SUDO:+$SUDO }apt-get update && ${SUDO:+$SUDO }apt-get install -y${missing}"
    return 0
  fi
  # shellcheck disable=SC2086  # one word per package
  { apt_get update -qq && apt_get install -y -qq $missing >/dev/null; } || {
    echo "install.sh: could not install${missing} with apt; tests/test_docs_site.py and" \
         "tests/classification/test_native_clang.py will fail" >&2
    return 1
  }
}
if [ "$DOCS_TEST" = 1 ]; then
  install_test_tools
else
  echo "install.sh: no apt (the tests' browser and clang are installed by ./scripts/install.sh --docs-test)"
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  step "$PY" -m venv .venv
fi
step .venv/bin/python -m pip install -q --upgrade pip
step .venv/bin/python -m pip install -q "torch==2.14.1" "torchvision==0.29.1" -e ".[all]"
step .venv/bin/python -m pip install -q --no-deps "recbole==1.2.1"
step .venv/bin/python -c "import torch, losses; print('installed: torch', torch.__version__, '| losses', losses.__version__)"
