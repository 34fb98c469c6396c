"""The end-of-run metrics table the CLI prints after fit, validate and test."""

from __future__ import annotations

import os
import re

import pytest

from lightning_modules.summary import MetricsSummary, format_summary
from tests.lightning.recipe_utils import find_checkpoint, run_cli
from tests.lightning.test_own_data import make_interactions

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow


def test_format_summary_lists_the_stage_metrics_and_the_folder():
    text = format_summary("test", {"test/r@1": 0.25, "val/loss": 1.0, "test/mrr@10": 0.000123},
                          "logs/version_0", "logs/version_0/checkpoints/a.ckpt")
    lines = text.splitlines()
    assert lines[0] == "test done: 2 metrics (test)"
    assert lines[1].split() == ["test/mrr@10", "1.230e-04"] and lines[2].split() == ["test/r@1", "0.2500"]
    assert lines[3] == "output folder: logs/version_0 (checkpoint: logs/version_0/checkpoints/a.ckpt)"


def _table(printed: str, stage: str) -> dict:
    block = printed[printed.index(f"{stage} done:"):]
    rows = {}
    for line in block.splitlines()[1:]:
        if line.startswith("output folder:"):
            rows["__folder__"] = line
            break
        name, value = line.split()
        rows[name] = float(value)
    return rows


def test_cli_prints_the_table_after_fit_and_test(tmp_path, capsys):
    make_interactions().rename(columns={"uid": "user", "iid": "item", "ts": "timestamp"}).to_csv(
        tmp_path / "inter.csv", index=False)
    extra = [f"--data.init_args.path={tmp_path / 'inter.csv'}", "--data.init_args.batch_size=8",
             "--data.init_args.eval_batch_size=8", "--trainer.num_sanity_val_steps=0"]
    recipe = os.path.join(ROOT, "configs/own_data/interactions.yaml")
    fit = run_cli("fit", recipe, tmp_path / "run", extra)
    printed = capsys.readouterr().out
    rows = _table(printed, "fit")
    metrics = {k: float(v) for k, v in fit.trainer.callback_metrics.items() if k.startswith(("train/", "val/"))}
    assert set(rows) - {"__folder__"} == set(metrics)
    for k, v in metrics.items():
        assert rows[k] == pytest.approx(v, rel=1e-3, abs=1e-4), k
    assert os.path.isdir(re.match(r"output folder: (\S+)", rows["__folder__"]).group(1))
    assert "checkpoint: " in rows["__folder__"] and ".ckpt" in rows["__folder__"]
    assert any(isinstance(cb, MetricsSummary) for cb in fit.trainer.callbacks)
    test = run_cli("test", recipe, tmp_path / "run", [*extra, f"--ckpt_path={find_checkpoint(tmp_path / 'run')}"])
    rows = _table(capsys.readouterr().out, "test")
    assert {k for k in rows if k != "__folder__"} == {k for k in test.trainer.callback_metrics if k.startswith("test/")}
    assert len(rows) > 2
