"""The README stays true: its loss table is the registry's, its test command is .ci/run's."""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def test_loss_table_matches_registry():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        from loss_table import table
    finally:
        sys.path.pop(0)
    assert table() in _readme(), "README loss table is stale: regenerate it with python scripts/update_readme_table.py"


def test_ci_runs_the_readme_test_command():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    m = re.search(r"```bash\n# run the whole test suite\n(.+?)\n```", _readme())
    assert m, "README must show the test command in a ```bash block headed '# run the whole test suite'"
    assert m.group(1).strip() in ci


@pytest.mark.parametrize("failing, expected", [("install", 3), ("tests", 1)])
def test_ci_fails_when_the_install_or_the_tests_fail(tmp_path, failing, expected):
    """.ci/run exits with the failing step's status (a bare ``a && b`` under ``set -e`` would exit 0):
    a copy of it runs beside an install script that fails, or beside this interpreter and a test
    suite whose one test fails."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(os.path.join(ROOT, ".ci", "run"), tmp_path / ".ci" / "run")
    (tmp_path / "scripts").mkdir()
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    python = tmp_path / ".venv" / "bin" / "python"  # this interpreter, with its installed pytest-xdist
    python.write_text(f'#!/usr/bin/env bash\nexec "{sys.executable}" "$@"\n')
    install = tmp_path / "scripts" / "install.sh"
    install.write_text("#!/usr/bin/env bash\nexit %d\n" % (3 if failing == "install" else 0))
    for f in (python, install):
        f.chmod(0o755)
    (tmp_path / "test_fails.py").write_text("def test_fails():\n    assert 1 == 2\n")
    res = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert res.returncode == expected, res.stdout[-2000:] + res.stderr[-2000:]
    assert "CI took" in res.stdout
    if failing == "tests":
        assert "1 failed" in res.stdout
