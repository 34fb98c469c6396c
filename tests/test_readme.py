"""The README stays true: its loss table is the registry's, its test command is .ci/run's."""

import os
import re
import sys

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
