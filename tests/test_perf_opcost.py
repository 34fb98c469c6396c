"""The operator-cost table of the performance suite (``--suite opcost``): every unit pass timed and
written with the CPU model, its vector extensions and the ratios to ``F.cross_entropy`` and a copy."""

from __future__ import annotations

import csv
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("_perf_losses_opcost", os.path.join(ROOT, "benchmarks", "perf_losses.py"))
perf_losses = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(perf_losses)


def test_opcost_writes_every_unit_pass_with_the_machine(tmp_path):
    rows = perf_losses.run_opcost(str(tmp_path), repeats=1)
    names = [name for name, _ in perf_losses.opcost_ops()]
    assert [r["op"] for r in rows] == names and len(names) >= 14
    for r in rows:
        assert r["ms"] > 0 and abs(r["x_copy"] * rows[0]["ms"] - r["ms"]) < 1e-9
    ce = next(r for r in rows if r["op"].startswith("F.cross_entropy"))
    assert ce["x_ce"] == 1.0
    md = open(tmp_path / "opcost.md").read()
    assert perf_losses._cpu_name() in md and "one thread" in md and "| torch.tanh |" in md
    with open(tmp_path / "opcost.csv") as f:
        assert [r["op"] for r in csv.DictReader(f)] == names
