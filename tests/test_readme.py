"""The README stays true: its loss table is the registry's, its test command is .ci/run's."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.lightning.recipe_utils import assert_quiet_and_summary_last

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


# ------------------------------------------------------------------------------------------
# every command and snippet of the README runs as written
# ------------------------------------------------------------------------------------------
#: the two set-up blocks: .ci/run executes the test command (above); of the first block the
#: example runs here, the install is what CI and every fresh machine run first (its own test,
#: tests/test_install_script.py, runs it with --dry-run)
SETUP = {"# install, then": "./scripts/install.sh && ", "# run the whole test suite": None}


def _blocks(lang: str):
    return re.findall(rf"```{lang}\n(.*?)```", _readme(), re.S)


@pytest.fixture
def checkout(tmp_path):
    """A scratch folder laid out like the checkout (its ``.venv`` is this interpreter's environment,
    the project's folders are links), so the README's relative commands run verbatim from it and
    whatever they write (runs/, lightning_logs/) stays in the test's temporary folder."""
    for name in ("configs", "examples", "scripts", "losses", "lightning_modules"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    os.symlink(sys.prefix, tmp_path / ".venv")
    assert os.path.exists(tmp_path / ".venv" / "bin" / "python")
    return tmp_path


def _run_shell(block: str, cwd, timeout: int = 900, merged: bool = False) -> subprocess.CompletedProcess:
    streams = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT) if merged else dict(capture_output=True)
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=cwd, text=True, timeout=timeout,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"), **streams)
    assert res.returncode == 0, f"README block failed ({res.returncode}):\n{block}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def test_readme_blocks_are_all_accounted_for():
    """Every bash block is a set-up block or one the tests below run; every python block runs."""
    bash = _blocks("bash")
    setup = [b for b in bash if any(b.startswith(h) for h in SETUP)]
    assert len(setup) == len(SETUP), setup
    assert len(bash) - len(setup) >= 1 and len(_blocks("python")) >= 1
    assert not re.search(r"^python ", _readme(), re.M), "commands use .venv/bin/python, as the install makes it"


@pytest.mark.slow
def test_readme_python_blocks_run_as_written(checkout):
    for i, block in enumerate(_blocks("python")):
        res = subprocess.run([".venv/bin/python", "-"], input=block, cwd=checkout, capture_output=True, text=True,
                             timeout=900)
        assert res.returncode == 0, f"README python block failed:\n{block}\n{res.stderr[-3000:]}"
        if i == 0:  # the smallest snippet, first: it ends by printing every registry name
            assert "'cross_entropy'" in res.stdout and "'z_loss'" in res.stdout, res.stdout


def test_readme_starts_with_the_install_and_the_smallest_snippet():
    """``pip install .`` and the first python block come before the set-up commands, and the
    README stays short (the details live under docs/)."""
    text = _readme()
    first_python = text.index("```python")
    assert text.index("pip install .") < first_python < text.index("# install, then")
    assert len(text.splitlines()) <= 170, len(text.splitlines())


@pytest.mark.slow
def test_readme_example_and_recipe_commands_run_as_written(checkout):
    bash = _blocks("bash")
    first = next(b for b in bash if b.startswith("# install, then"))
    example = first.split("\n", 1)[1].strip()
    prefix = SETUP["# install, then"]
    assert example.startswith(prefix)
    res = _run_shell(example[len(prefix):], checkout)
    assert "cross_entropy" in res.stdout and "test acc" in res.stdout
    for block in bash:
        if any(block.startswith(h) for h in SETUP):
            continue
        res = _run_shell(block, checkout, merged=True)  # one stream, as a terminal shows it
        assert "test/top1" in res.stdout  # the test run's summary
        # quiet runs: each command's output holds its own summary once, last, and no third-party noise
        folder = res.stdout.index("\noutput folder: ") + 1  # the fit's last line ...
        cut = res.stdout.index("\n", folder) + 1  # ... ends the fit's output; the test's follows
        assert_quiet_and_summary_last(res.stdout[:cut], "fit")
        assert_quiet_and_summary_last(res.stdout[cut:], "test")
    assert list(checkout.glob("runs/z_loss/lightning_logs/version_*/checkpoints/*.ckpt"))
