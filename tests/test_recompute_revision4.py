"""``benchmarks/recompute_revision4.py``: an independent recomputation of every revision-4 verdict from
the committed runs and per-item records (numpy / scipy only, nothing of the pipeline's statistics)
agrees with the verdicts the pipeline wrote in ``results/revision4/summary.md``; and its verdict rules
on hand-made intervals."""

from __future__ import annotations

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("recompute_revision4", os.path.join(ROOT, "benchmarks", "recompute_revision4.py"))
rc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rc)


@pytest.mark.parametrize("kind, better, lo, hi, margin, want", [
    ("higher", "higher", 0.01, 0.02, None, "reproduced"),
    ("higher", "higher", -0.02, -0.01, None, "contradicted"),
    ("higher", "higher", -0.01, 0.02, None, "not resolved"),
    ("lower", "lower", -0.02, -0.01, None, "reproduced"),
    ("did", "lower", 0.01, 0.02, None, "contradicted"),
    ("not_worse", "higher", -0.01, 0.02, 0.02, "reproduced"),
    ("not_worse", "higher", -0.05, -0.03, 0.02, "contradicted"),
    ("not_worse", "higher", -0.03, 0.01, 0.02, "not resolved"),
    ("not_worse", "lower", -0.01, 0.01, 0.02, "reproduced"),
    ("equivalent", "higher", -0.004, 0.004, 0.005, "reproduced"),
    ("equivalent", "higher", 0.006, 0.01, 0.005, "contradicted"),
    ("equivalent", "higher", -0.004, 0.006, 0.005, "not resolved"),
])
def test_verdict_rules(kind, better, lo, hi, margin, want):
    assert rc.verdict(kind, better, lo, hi, margin) == want


def test_replicate_side_of_the_boundary():
    assert rc.same_side("higher", "higher", "reproduced", 0.01, None)
    assert not rc.same_side("higher", "higher", "reproduced", -0.01, None)
    assert rc.same_side("not_worse", "higher", "contradicted", -0.05, 0.02)
    assert not rc.same_side("equivalent", "higher", "reproduced", 0.03, 0.02)


@pytest.mark.slow
def test_committed_revision_4_verdicts_recompute_independently(capsys):
    assert rc.main([]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "DIFFERS" not in out and "verdicts agree with summary.md" in out
