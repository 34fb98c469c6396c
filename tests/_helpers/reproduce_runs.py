"""Shared by the tests of the reproduction pipeline (``benchmarks/reproduce``): :func:`only_cached`
makes a run that is not finished in the workdir fail the test instead of training, so a test that
regenerates reports from committed runs proves that nothing trained."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.path.join(ROOT, "benchmarks") not in sys.path:
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # as benchmarks/reproduce_results.py puts it there
import reproduce.running  # noqa: E402


def only_cached(monkeypatch) -> None:
    """Make any run that is not already finished in the workdir fail the test instead of training."""
    running = reproduce.running
    real = running.execute

    def execute(run, **kw):
        assert running.cached_row(run, quick=kw["quick"], workdir=kw["workdir"]) is not None, \
            f"{run.phase} {run.arm.key} seed {run.seed} would have run"
        return real(run, **kw)

    monkeypatch.setattr(running, "execute", execute)
