"""Run a recipe through the real CLI entry point, in-process (docs/conventions.md CI sizing).

``run_recipe(config, tmp_path)`` runs ``fit`` with one short epoch (2 train / 2 val / 2 test
batches; not ``fast_dev_run``, which writes no checkpoint), then ``validate`` and ``test`` from
the checkpoint that run saved, and returns the three CLI objects' logged metrics.
"""

from __future__ import annotations

import glob
import os
from typing import Dict, List, Sequence

import torch

from lightning_modules.cli import main

SHORT = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=2",
    "--trainer.limit_test_batches=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def _metrics(trainer) -> Dict[str, float]:
    return {k: float(v) for k, v in trainer.callback_metrics.items() if torch.is_tensor(v) and v.numel() == 1}


def run_cli(subcommand: str, config: str, tmp_path, extra: Sequence[str] = ()) -> "object":
    args: List[str] = [subcommand, "--config", str(config), f"--trainer.default_root_dir={tmp_path}", *SHORT, *extra]
    return main(args=args)


def find_checkpoint(root) -> str:
    ckpts = sorted(glob.glob(os.path.join(str(root), "**", "*.ckpt"), recursive=True), key=os.path.getmtime)
    assert ckpts, f"fit wrote no checkpoint under {root}"
    return ckpts[-1]


def run_recipe(config: str, tmp_path, extra: Sequence[str] = ()) -> Dict[str, Dict[str, float]]:
    fit = run_cli("fit", config, tmp_path, extra)
    ckpt = find_checkpoint(tmp_path)
    out = {"fit": _metrics(fit.trainer), "ckpt": ckpt}
    for sub in ("validate", "test"):
        cli = run_cli(sub, config, tmp_path, [*extra, f"--ckpt_path={ckpt}"])
        out[sub] = _metrics(cli.trainer)
    return out


def assert_same_state(a, b, where: str) -> None:
    """Equal state: tensors exactly, a module's extra state (e.g. a generator's state dict) entry by
    entry, through dicts and sequences; other values by ``==``."""
    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(b, dict):
        assert isinstance(a, dict) and set(a) == set(b), where
        for k in b:
            assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(b, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, where
