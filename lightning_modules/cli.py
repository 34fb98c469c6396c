"""The LightningCLI entry point: ``python -m lightning_modules fit --config configs/...yaml``.

Sizes flow from the DataModule (:class:`~lightning_modules.base.BenchmarkDataModule`) into the
model and into a loss that owns a head, so recipes never hard-code them:

* ``data.num_classes`` -> ``model.init_args.num_classes`` and ``model.init_args.loss.init_args.num_classes``
* ``data.num_users`` / ``data.num_items`` / ``data.input_dim`` / ``data.in_chans`` -> the model's arguments of the same name
* ``model.init_args.embedding_dim`` -> ``model.init_args.loss.init_args.embedding_dim`` (a head's input width)

A link whose target the chosen class does not take is skipped, so one CLI serves every
benchmark. CPU is the default accelerator. Every run ends with a short table of the logged
metrics and the output folder (:class:`~lightning_modules.summary.MetricsSummary`).
"""

from __future__ import annotations

import os
from typing import List, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pytorch_lightning.cli import LightningCLI  # noqa: E402

from .base import BenchmarkDataModule, BenchmarkModule  # noqa: E402
from .summary import MetricsSummary  # noqa: E402

SIZE_LINKS = ("num_users", "num_items", "input_dim", "in_chans")


class LossCLI(LightningCLI):
    """LightningCLI with the size links described in the module docstring."""

    def add_arguments_to_parser(self, parser) -> None:  # noqa: D102
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments(
            "data.num_classes", "model.init_args.loss.init_args.num_classes", apply_on="instantiate"
        )
        for name in SIZE_LINKS:
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")
        parser.link_arguments(
            "model.init_args.embedding_dim", "model.init_args.loss.init_args.embedding_dim", apply_on="parse"
        )

    def instantiate_trainer(self, **kwargs):  # noqa: D102
        trainer = super().instantiate_trainer(**kwargs)
        if not any(isinstance(cb, MetricsSummary) for cb in trainer.callbacks):
            trainer.callbacks.append(MetricsSummary())  # the end-of-run table
        return trainer


def _close_process_group() -> None:
    """Leave ``torch.distributed`` cleanly once a multi-process run has finished.

    Lightning's DDP strategy leaves the process group open when ``fit`` returns; if the
    interpreter then exits, the gloo group's worker threads are torn down by static destructors
    while the other rank may still be talking to them, which can abort the process
    ("terminate called without an active exception", exit status -6) after a successful run.
    Every rank waits for the others here and destroys its group before returning.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def main(args: Optional[List[str]] = None, *, run: bool = True) -> LossCLI:
    """Run the CLI (``args=None`` reads ``sys.argv``); returns the CLI object.

    After a run (``run=True``) under a multi-process strategy, the process group is closed on
    every rank, so the command exits with status 0 instead of racing the group's teardown.
    """
    cli = LossCLI(
        model_class=BenchmarkModule,
        datamodule_class=BenchmarkDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        trainer_defaults={"accelerator": "cpu", "devices": 1},
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
    )
    if run:
        _close_process_group()
    return cli
