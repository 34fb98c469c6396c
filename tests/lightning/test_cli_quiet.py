"""CLI runs are quiet: no third-party tips or known-harmless warnings, and the metrics table once, last.

A tiny ``validate`` runs as a real command (a subprocess, standard output and error in one
unbuffered stream, as a terminal shows them), with the progress bar and the model summary on as in
a normal run. ``fit`` and ``test`` are held to the same checks (:func:`assert_quiet_and_summary_last`)
on the README's own recipe commands, which train and test a checkpoint as real commands
(tests/test_readme.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from tests.lightning.recipe_utils import assert_quiet_and_summary_last

#: real CLI runs in subprocesses (a process start each), like the recipe tests
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "configs", "vision", "z_loss.yaml")
TINY = ["--model.init_args.backbone=test_resnet", "--data.init_args.batch_size=16", "--trainer.log_every_n_steps=1"]


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _cmd(sub, root, *extra):
    return [sys.executable, "-m", "lightning_modules", sub, "--config", RECIPE, f"--trainer.default_root_dir={root}",
            *TINY, *extra]


def test_validate_prints_only_its_summary_last(tmp_path):
    proc = subprocess.run(_cmd("validate", tmp_path, "--trainer.limit_val_batches=2"), cwd=str(tmp_path), env=_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert_quiet_and_summary_last(proc.stdout, "validate")


def test_the_filters_are_the_cli_s_only():
    """Importing the package installs no filter; main() removes its own when it returns."""
    import logging

    from lightning_modules.cli import quiet_third_party

    before = list(warnings.filters)
    log = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    n_filters = len(log.filters)
    with quiet_third_party():
        assert len(warnings.filters) > len(before) and len(log.filters) == n_filters + 1
        with pytest.warns(UserWarning, match="other"):
            warnings.warn("some other warning", UserWarning)
    assert warnings.filters == before and len(log.filters) == n_filters
