"""Run a recipe through the real CLI entry point, in-process (docs/conventions.md CI sizing).

``run_recipe(config, tmp_path)`` runs ``fit`` with one short epoch (2 train / 2 val / 2 test
batches; not ``fast_dev_run``, which writes no checkpoint), then ``validate`` and ``test`` from
the checkpoint that run saved, and returns the three CLI objects' logged metrics.
``assert_quiet_and_summary_last(output, stage)`` checks what a CLI command printed: no third-party
noise, the project's summary once and last.
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


#: what a quiet CLI run never prints
NOISE = (
    "tensorboardX", "Tip:", "litlogger", "litmodels", "LeafSpec",  # Lightning's notices and tips, torch's warning
    "dirpath has changed",  # the checkpoint callback, when validate / test write a new version folder
    "Test metric", "Validate metric", "DataLoader 0",  # Lightning's own results table
)


def assert_quiet_and_summary_last(output: str, stage: str) -> None:
    for noise in NOISE:
        assert noise not in output, (noise, output[-4000:])
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    heads = [i for i, line in enumerate(lines) if line.startswith(f"{stage} done: ")]
    assert len(heads) == 1, output[-4000:]  # exactly once
    block = lines[heads[0]:]  # ... and the last block: its rows, then the output folder, then nothing
    assert block[-1].startswith("output folder: "), block
    assert all(line.startswith("  ") and len(line.split()) == 2 for line in block[1:-1]), block
    assert len(block) > 3
