"""Train a timm backbone on digits with a loss from the library, through Lightning's Trainer.

The same objects the recipes build, assembled by hand: the DataModule supplies the sizes, the
VisionClassifier routes any registered loss by what it declares it takes (logits, features for
a loss that owns its head, model + inputs for the adversarial loss).

    python examples/lightning_loop.py --loss wcdas --epochs 3
    python examples/lightning_loop.py --loss z_loss --epochs 3
"""

from __future__ import annotations

import argparse
import warnings

import pytorch_lightning as pl

import losses
from lightning_modules.data import DigitsDataModule
from lightning_modules.models import VisionClassifier


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loss", default="z_loss", help="a registry name, see losses.list_losses()")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    pl.seed_everything(args.seed)
    data = DigitsDataModule(seed=args.seed)
    spec = losses.get_loss_spec(args.loss)
    embedding_dim = 64
    kwargs = dict(spec.example_kwargs)
    if spec.owns_head:
        kwargs.update(embedding_dim=embedding_dim, num_classes=data.num_classes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", losses.ExperimentalWarning)
        loss = spec.create(**kwargs)
    model = VisionClassifier(loss, backbone="resnet10t", num_classes=data.num_classes, in_chans=data.in_chans,
                             embedding_dim=embedding_dim, lr=2e-3, robust_eval=False)
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False)
    trainer.fit(model, datamodule=data)
    (metrics,) = trainer.test(model, datamodule=data)
    print({k: round(v, 4) for k, v in metrics.items() if not k.startswith("test/acc_class_")})


if __name__ == "__main__":
    main()
