"""The operator-profile script (benchmarks/profile_losses.py) runs for real at its smoke size.

``--small`` profiles every eager case of the full run at C = 10, and compiled (inductor, kernel
profiling on) ``F.cross_entropy`` and one loss (``SMALL_COMPILED_LOSSES``: each compile costs
seconds of C++ builds; the full run's compiled losses share that code path), and writes
``profile.md`` / ``profile.csv`` / ``profile_units.csv``: a section per case with its operators by
self CPU time, and the unit-cost table of elementwise passes.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "profile_losses.py")


def _script():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    spec = importlib.util.spec_from_file_location("_profile_losses", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_profile_small_writes_every_case(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, SCRIPT, "--small", "--steps", "2", "--out", str(tmp_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (tmp_path / "profile.md").read_text()
    with open(tmp_path / "profile.csv") as f:
        rows = list(csv.DictReader(f))
    labels = {c["label"] for c in _script().cases(small=True)}
    assert labels == {r["label"] for r in rows}
    for label in labels:
        assert f"### {label} (" in md
        mine = [r for r in rows if r["label"] == label]
        assert all(float(r["self_ms"]) > 0 for r in mine)
        assert abs(sum(float(r["share"]) for r in mine) - 1.0) < 0.01
    # the compiled cases are profiled as inductor kernels, not as the eager aten operators
    compiled = [r["op"] for r in rows if r["label"] == "gol (compiled)"]
    assert any("cpp_fused" in op for op in compiled), compiled[:10]
    with open(tmp_path / "profile_units.csv") as f:
        units = list(csv.DictReader(f))
    assert [u["C"] for u in units] == ["10"] and all(float(units[0][k]) >= 0 for k in ("copy", "exp", "tanh"))
