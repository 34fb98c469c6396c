"""Metrics are logged only where they mean something.

* Support sizes (``sparsemax_support``, ``support``) only for a loss whose predictive
  distribution can hold exact zeros (sparsemax, 1.5-entmax), decided from what the loss does
  (:func:`lightning_modules.routing.has_sparse_probabilities`), never from its name.
* ``top5`` only with more than 5 classes (with 3 classes it is 1.0 for any model).
* The model summary at the start of ``fit`` has no FLOPs column (Lightning's counts zeros
  without an example input): a real CLI fit prints the parameter table without it.
"""

from __future__ import annotations

import os

import pytest
import pytorch_lightning as pl
import torch

import losses
from lightning_modules.data import DigitsDataModule
from lightning_modules.metrics import classification_metrics
from lightning_modules.models import VisionClassifier
from lightning_modules.routing import has_sparse_probabilities

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = dict(backbone="test_resnet", num_classes=10, embedding_dim=16, robust_eval=False)
PRIOR = [0.1] * 10


@pytest.mark.parametrize("make, sparse", [
    (lambda: losses.SparsemaxLoss(), True),
    (lambda: losses.Entmax15Loss(), True),
    (lambda: losses.EntmaxBisectLoss(), True),
    (lambda: losses.CrossEntropyLoss(), False),
    (lambda: losses.ZLoss(), False),
    (lambda: losses.LogitAdjustedLoss(class_prior=PRIOR), False),  # its own predict_proba: a softmax
    (lambda: losses.BalancedSoftmaxLoss(class_counts=[10] * 10), False),
    (lambda: losses.WCDASLoss(16, 10), False),
])
def test_sparse_probabilities_are_read_from_the_loss(make, sparse):
    assert has_sparse_probabilities(make(), 10) is sparse


def test_an_undeclared_loss_is_probed_through_its_predict_proba():
    """A user's loss that declares nothing: its own ``predict_proba`` is probed (sparsemax gives exact
    zeros on the probe row, a softmax does not); the library's sparse losses declare it."""

    class OwnSparse(torch.nn.Module):
        def forward(self, x, y):
            return losses.sparsemax_loss(x, y)

        def predict_proba(self, x):
            return losses.SparsemaxLoss().predict_proba(x)

    class OwnSoftmax(OwnSparse):
        def predict_proba(self, x):
            return torch.softmax(x, -1)

    assert not hasattr(OwnSparse(), "sparse_probabilities")
    assert has_sparse_probabilities(OwnSparse(), 10) is True
    assert has_sparse_probabilities(OwnSoftmax(), 10) is False
    assert losses.SparsemaxLoss.sparse_probabilities is True and losses.EntmaxBisectLoss.sparse_probabilities is True


def test_a_declared_attribute_wins():
    class DeclaredSparse(losses.CrossEntropyLoss):
        sparse_probabilities = True

    class DeclaredDense(losses.SparsemaxLoss):
        sparse_probabilities = False

    assert has_sparse_probabilities(DeclaredSparse(), 10) is True
    assert has_sparse_probabilities(DeclaredDense(), 10) is False


def test_top5_only_with_more_than_five_classes():
    assert "top5" in classification_metrics(10, full=True)
    for c in (3, 5):
        assert set(classification_metrics(c, full=True)) == {"top1", "balanced_acc", "ece"}, c
    model = VisionClassifier(losses.CrossEntropyLoss(), **{**TINY, "num_classes": 3})
    assert not any(k.endswith("top5") for k in model.eval_metrics["val"].keys())


def _validate(loss) -> dict:
    torch.manual_seed(0)
    model = VisionClassifier(loss, **TINY)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=1)
    (res,) = trainer.validate(model, datamodule=DigitsDataModule(batch_size=32), verbose=False)
    return res


def test_support_sizes_are_logged_for_sparse_losses_only():
    sparse = _validate(losses.SparsemaxLoss())
    assert 1.0 <= sparse["val/sparsemax_support"] <= 10.0 and 1.0 <= sparse["val/support"] <= 10.0
    for loss in (losses.CrossEntropyLoss(), losses.LogitAdjustedLoss(class_prior=PRIOR)):
        res = _validate(loss)
        assert "val/top1" in res and "val/top5" in res
        assert "val/sparsemax_support" not in res and "val/support" not in res, type(loss).__name__


@pytest.mark.slow
def test_cli_model_summary_has_no_flops_column(tmp_path, capfd, monkeypatch):
    """The CLI entry point in this process, its console output read at the file descriptors."""
    from lightning_modules.cli import main

    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    main(["fit", "--config", os.path.join(ROOT, "configs", "mnist", "z_loss.yaml"), "--trainer.max_epochs=1",
          "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1", f"--trainer.default_root_dir={tmp_path}"])
    out = "".join(capfd.readouterr())
    assert "Trainable params" in out and "| ZLoss" in out  # the summary is printed ...
    assert "FLOPs" not in out and "Total Flops" not in out  # ... without the column of zeros
    # a sparse distribution is not Z-loss's: no support sizes in its table; 10 classes: top-5 logged
    assert "val/sparsemax_support" not in out and "val/top5" in out
