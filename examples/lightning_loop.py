"""Train a timm backbone on digits with a loss from the library, through Lightning's Trainer.

The same objects the recipes build, assembled by hand: the DataModule supplies the sizes and, for
a loss built from the training label distribution (``logit_adjusted``'s ``class_prior``,
``balanced_softmax``'s ``class_counts``), the training class counts, linked exactly as the
LightningCLI links them (:func:`lightning_modules.cli.linked_loss_kwargs`); the VisionClassifier
routes any registered loss by what it declares it takes (logits, features for a loss that owns
its head, model + inputs for the adversarial loss).

    python examples/lightning_loop.py --loss wcdas --epochs 3
    python examples/lightning_loop.py --loss logit_adjusted --epochs 3
    python examples/lightning_loop.py --loss z_loss --max-batches 2 --backbone test_resnet   # a smoke run

The last line printed is the test metrics. ``test/ece`` is the expected calibration error: the
test images are grouped into 15 bins by the model's confidence (its largest class probability,
from the loss's own ``predict_proba`` where it has one, else the softmax of the logits) and ECE is
the bin-size-weighted mean of |accuracy - mean confidence| over the bins: 0 when a confidence of
0.9 is right 90% of the time. The Z-loss reads only the z-scores of the logits (shift- and
scale-invariant, see docs/losses/z_loss.md), so nothing in its training sets the scale of the
logits and the softmax of them is far less confident than the model is accurate: a high ECE next
to a good top-1. Rank by it, do not read its softmax as probabilities.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Dict, List, Optional

import pytorch_lightning as pl

import losses
from lightning_modules.cli import linked_loss_kwargs
from lightning_modules.data import DigitsDataModule
from lightning_modules.models import VisionClassifier
from lightning_modules.summary import ParameterSummary

#: constructor arguments the DataModule and the model supply (the registry's example values of
#: these are sized for its 5-class test inputs, not for a 10-class model)
LINKED = ("num_classes", "embedding_dim", "class_counts", "class_prior")


def build_loss(name: str, data: DigitsDataModule, embedding_dim: int):
    """The registry loss ``name`` with its sizes and class counts / prior from ``data``."""
    spec = losses.get_loss_spec(name)
    kwargs = {k: v for k, v in spec.example_kwargs.items() if k not in LINKED}
    kwargs.update(linked_loss_kwargs(spec.module, data, embedding_dim=embedding_dim))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", losses.ExperimentalWarning)
        return spec.create(**kwargs)


def run(name: str, *, epochs: int = 3, seed: int = 0, backbone: str = "resnet10t",
        max_batches: Optional[int] = None, quiet: bool = False) -> Dict[str, float]:
    """Fit ``epochs`` epochs with the registry loss ``name``, test, return the test metrics.
    ``max_batches`` limits the training, validation and test batches of each epoch (a smoke run)."""
    pl.seed_everything(seed, verbose=not quiet)
    data = DigitsDataModule(seed=seed)
    embedding_dim = 64
    loss = build_loss(name, data, embedding_dim)
    model = VisionClassifier(loss, backbone=backbone, num_classes=data.num_classes, in_chans=data.in_chans,
                             embedding_dim=embedding_dim, lr=2e-3, robust_eval=False)
    limits = {} if max_batches is None else {f"limit_{s}_batches": max_batches for s in ("train", "val", "test")}
    # ParameterSummary: Lightning's model summary without its FLOPs column (zeros without an example input)
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=not quiet, enable_model_summary=not quiet,
                         callbacks=[] if quiet else [ParameterSummary()], **limits)
    trainer.fit(model, datamodule=data)
    (metrics,) = trainer.test(model, datamodule=data, verbose=not quiet)
    return {k: round(float(v), 4) for k, v in metrics.items() if not k.startswith("test/acc_class_")}


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loss", default="z_loss", help="a registry name, see losses.list_losses()")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backbone", default="resnet10t", help="a timm model name (test_resnet: a tiny one)")
    p.add_argument("--max-batches", type=int, default=None,
                   help="limit the training / validation / test batches per epoch (a quick smoke run)")
    args = p.parse_args(argv)
    metrics = run(args.loss, epochs=args.epochs, seed=args.seed, backbone=args.backbone,
                  max_batches=args.max_batches)
    print(metrics)
    print("test/ece: expected calibration error of the predicted probabilities, 0 = calibrated "
          "(see this script's docstring, and why the Z-loss's is high)")


if __name__ == "__main__":
    main()
