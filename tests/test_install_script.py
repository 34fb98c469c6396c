"""``scripts/install.sh`` reaches for apt only when the test suite's system tools are asked for.

The script runs for real with ``--dry-run`` (it prints each step instead of running it, and
decides about the tools exactly as an install does): without ``--docs-test`` no apt step
appears; with it (or ``INSTALL_DOCS_TEST=1``) the tools this machine lacks (``chromium``,
``chromedriver`` for the docs test, ``clang`` for the C kernels' second compiler) are installed
with apt, and none when all are found. CI and the README's test command ask for them, since the
full suite includes the tests that use them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALL = os.path.join(ROOT, "scripts", "install.sh")


def _install(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", INSTALL, *args], capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in os.environ.items() if k != "INSTALL_DOCS_TEST"}, **env})


def test_a_plain_install_never_runs_apt():
    res = _install("--dry-run")
    assert res.returncode == 0, res.stderr
    assert "apt" not in res.stdout.replace("install.sh: no apt (", "") and "sudo" not in res.stdout, res.stdout
    assert "./scripts/install.sh --docs-test" in res.stdout  # says how to get the browser
    assert re.search(r"would run: \.venv/bin/python -m pip install .*-e \.\[all\]", res.stdout), res.stdout


TOOLS = {"chromium": "chromium", "chromedriver": "chromium-driver", "clang": "clang"}


def test_the_docs_test_flag_installs_the_missing_tools():
    missing = [pkg for cmd, pkg in TOOLS.items() if not shutil.which(cmd)]
    for args, env in ((("--docs-test", "--dry-run"), {}), (("--dry-run",), {"INSTALL_DOCS_TEST": "1"})):
        res = _install(*args, **env)
        assert res.returncode == 0, res.stderr
        if not missing:
            assert "chromium, chromedriver and clang found; apt not needed" in res.stdout, res.stdout
        else:
            assert "apt-get install -y " + " ".join(missing) + "\n" in res.stdout, res.stdout
        assert "pip install" in res.stdout


def test_only_the_missing_tools_are_installed(tmp_path):
    """A PATH with every command of this machine's bin folders but ``clang`` and ``chromedriver``:
    the dry run installs exactly their two packages."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            if name in ("clang", "chromedriver") or (bin_dir / name).exists():
                continue
            os.symlink(os.path.join(folder, name), bin_dir / name)
    res = _install("--docs-test", "--dry-run", PATH=str(bin_dir))
    assert res.returncode == 0, res.stderr
    missing = ["chromium"] if not shutil.which("chromium") else []
    assert "apt-get install -y " + " ".join(missing + ["chromium-driver", "clang"]) + "\n" in res.stdout, res.stdout


def test_unknown_options_are_refused_before_any_step():
    res = _install("--docs", "--dry-run")
    assert res.returncode == 2 and "unknown option '--docs'" in res.stderr and "would run" not in res.stdout
    res = _install("--dry-run", INSTALL_DOCS_TEST="yes")
    assert res.returncode == 2 and "INSTALL_DOCS_TEST must be 0 or 1" in res.stderr


def test_ci_installs_the_browser_and_runs_the_full_suite():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    assert "./scripts/install.sh --docs-test && .venv/bin/python -m pytest " in ci
    assert " -m " not in ci.split(".venv/bin/python -m pytest", 1)[1].split("\n", 1)[0]  # no marker filter
