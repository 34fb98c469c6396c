"""A short table of the logged metrics at the end of ``fit``, ``validate`` and ``test``.

:class:`MetricsSummary` is a Lightning callback; the CLI (:mod:`lightning_modules.cli`) adds it
to every run, so a recipe ends with, e.g.::

    fit done: 12 metrics (last validation and training epoch)
      train/loss_epoch   1.0234
      val/loss           0.9876
      val/top1           0.7310
    output folder: lightning_logs/version_3 (checkpoint: lightning_logs/version_3/checkpoints/epoch=9-step=230.ckpt)

Values are the trainer's ``callback_metrics`` (the epoch-level values the model logged); only
rank 0 prints. The table is made when the stage ends and printed when the trainer tears down,
after the progress bar has printed its last state, so it is the last thing a run prints (the
callback is appended last to the trainer's callbacks).

:class:`ParameterSummary` replaces Lightning's model summary at the start of ``fit``: the same
table of modules, parameters and modes, without Lightning's FLOPs column, which counts only with
an ``example_input_array`` (these modules have none: their input sizes come from the data) and
otherwise shows a column of zeros and "Total FLOPs: 0".
"""

from __future__ import annotations

import math
import os
from typing import Dict, List, Optional

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelSummary
from pytorch_lightning.trainer.states import TrainerFn
from pytorch_lightning.utilities.model_summary.model_summary import (
    get_formatted_model_size,
    get_human_readable_count,
)

__all__ = ["MetricsSummary", "ParameterSummary", "format_summary"]

_STAGE_PREFIXES = {"fit": ("train/", "val/"), "validate": ("val/",), "test": ("test/",)}


def _scalars(trainer: "pl.Trainer") -> Dict[str, float]:
    out = {}
    for k, v in trainer.callback_metrics.items():
        if torch.is_tensor(v) and v.numel() == 1:
            out[k] = float(v)
        elif isinstance(v, (int, float)):
            out[k] = float(v)
    return out


def _fmt(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.4f}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3e}"


def format_summary(stage: str, metrics: Dict[str, float], folder: Optional[str], checkpoint: Optional[str]) -> str:
    """The table printed by :class:`MetricsSummary` for ``stage`` (``"fit"``, ``"validate"``, ``"test"``)."""
    prefixes = _STAGE_PREFIXES.get(stage, ())
    names = sorted(k for k in metrics if k.startswith(prefixes)) or sorted(metrics)
    what = {"fit": "last validation and training epoch", "validate": "validation", "test": "test"}.get(stage, stage)
    lines: List[str] = [f"{stage} done: {len(names)} metrics ({what})"]
    width = max((len(n) for n in names), default=0)
    lines += [f"  {n.ljust(width)}  {_fmt(metrics[n])}" for n in names]
    where = f"output folder: {folder}" if folder else "output folder: none (no logger)"
    if checkpoint:
        where += f" (checkpoint: {checkpoint})"
    lines.append(where)
    return "\n".join(lines)


class MetricsSummary(pl.Callback):
    """Print :func:`format_summary` at the end of ``fit``, ``validate`` and ``test`` (rank 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.last: Optional[str] = None  #: the last printed summary
        self._pending: Optional[str] = None  # made at the end of the stage, printed at teardown

    def _report(self, trainer: "pl.Trainer", stage: str) -> None:
        if trainer.sanity_checking:
            return
        # trainer.log_dir broadcasts from rank 0 under DDP: every rank must call it
        folder = trainer.log_dir if trainer.logger is not None else None
        if not trainer.is_global_zero:
            return
        ckpt = None
        cb = trainer.checkpoint_callback
        if stage == "fit" and cb is not None:
            ckpt = getattr(cb, "best_model_path", "") or getattr(cb, "last_model_path", "") or None
        elif stage != "fit":
            ckpt = trainer.ckpt_path
        rel = (lambda p: os.path.relpath(p) if p and not os.path.relpath(p).startswith("..") else p)
        self.last = self._pending = format_summary(stage, _scalars(trainer), rel(folder), rel(ckpt))

    def on_fit_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:  # noqa: D102
        self._report(trainer, "fit")

    def on_validation_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:  # noqa: D102
        if trainer.state.fn == TrainerFn.VALIDATING:
            self._report(trainer, "validate")

    def on_test_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:  # noqa: D102
        self._report(trainer, "test")

    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:  # noqa: D102
        # printed here, not at the end of the stage: the progress bar prints its last state when
        # it is torn down, and the table must come after it, as the last lines of the run
        text, self._pending = self._pending, None
        if text is not None:
            print(text, flush=True)


#: Lightning's summary columns that are left out (see :class:`ParameterSummary`)
DROPPED_COLUMNS = ("FLOPs",)


def format_parameter_summary(summary_data, total_parameters: int, trainable_parameters: int, model_size: float,
                             total_training_modes: Dict[str, int]) -> str:
    """The model summary as plain text: one row per module (the columns Lightning collected,
    less :data:`DROPPED_COLUMNS`), then the parameter counts, the size and the train / eval modes."""
    columns = [(name, [str(v) for v in values]) for name, values in summary_data if name not in DROPPED_COLUMNS]
    widths = [max([len(name)] + [len(v) for v in values]) for name, values in columns]
    rows = list(zip(*(values for _, values in columns)))
    lines = [" | ".join(name.ljust(w) for (name, _), w in zip(columns, widths)),
             "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(v.ljust(w) for v, w in zip(row, widths)) for row in rows]
    lines += [
        "-" * len(lines[1]),
        f"{get_human_readable_count(int(trainable_parameters)):<10} Trainable params",
        f"{get_human_readable_count(int(total_parameters - trainable_parameters)):<10} Non-trainable params",
        f"{get_human_readable_count(int(total_parameters)):<10} Total params",
        f"{get_formatted_model_size(model_size):<10} Total estimated model params size (MB)",
        f"{total_training_modes.get('train', 0):<10} Modules in train mode",
        f"{total_training_modes.get('eval', 0):<10} Modules in eval mode",
    ]
    return "\n".join(lines)


class ParameterSummary(ModelSummary):
    """Lightning's model summary (``max_depth`` levels of modules) without its FLOPs column;
    printed by rank 0 at the start of ``fit``, as Lightning's is."""

    @staticmethod
    def summarize(summary_data, total_parameters: int, trainable_parameters: int, model_size: float,
                  total_training_modes: Dict[str, int], total_flops: int = 0, **summarize_kwargs) -> None:
        print(format_parameter_summary(summary_data, total_parameters, trainable_parameters, model_size,
                                       total_training_modes), flush=True)
