"""The CLI links the DataModule's training class counts into a loss that takes them.

``data.class_counts`` -> ``model.init_args.loss.init_args.class_counts`` (a list of ints) and, normalised,
``model.init_args.loss.init_args.class_prior``; skipped for a loss that takes neither, and for a
DataModule without class counts. The losses here are defined and registered by the test only.
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import losses
from lightning_modules.cli import main, prior_list
from lightning_modules.data import DigitsDataModule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "configs", "vision", "cross_entropy.yaml")
HERE = "tests.lightning.test_class_counts_link"
LT = ["--data.init_args.imbalance_factor=10", "--model.init_args.robust_eval=false"]


def _ce(input: Tensor, target: Tensor, *, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    return F.cross_entropy(input.float(), target, ignore_index=ignore_index, reduction=reduction)


def _unit_weights(input: Tensor, target: Tensor, *, ignore_index: int = -100, **_: object) -> Tensor:
    return (target != ignore_index).double()


class CountsLoss(nn.Module):
    """Test loss that takes the training class counts (as a balanced softmax would)."""

    def __init__(self, class_counts: Optional[Sequence[int]] = None, reduction: str = "mean") -> None:
        super().__init__()
        self.class_counts = None if class_counts is None else list(class_counts)
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return _ce(input, target, reduction=self.reduction)


class PriorLoss(nn.Module):
    """Test loss that takes the class prior as a tensor (as a logit-adjusted loss would)."""

    def __init__(self, class_prior: Optional[Tensor] = None, tau: float = 1.0, reduction: str = "mean") -> None:
        super().__init__()
        prior = torch.as_tensor(class_prior, dtype=torch.float32) if class_prior is not None else None
        self.register_buffer("class_prior", prior)
        self.tau = tau
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return _ce(input, target, reduction=self.reduction)


@pytest.fixture
def registered():
    names = {"test_counts_loss": CountsLoss, "test_prior_loss": PriorLoss}
    for name, cls in names.items():
        losses.register(name, function=_ce, module=cls, inputs=losses.InputKind.LOGITS, unit="position",
                        unit_weights=_unit_weights, arxiv="", paper="test only", replace=True)
    try:
        yield
    finally:
        for name in names:
            losses.unregister(name)


def test_digits_class_counts_before_setup_are_the_training_counts():
    dm = DigitsDataModule(imbalance_factor=10.0)
    counts = dm.class_counts  # read before setup: runs it
    assert dm.split_sizes()["train"] == int(counts.sum())
    assert torch.equal(counts, torch.bincount(dm._splits["train"].tensors[1], minlength=10))
    assert counts[0] > counts[9]


def test_class_counts_and_prior_are_linked_into_the_loss(registered):
    cli = main(["--config", RECIPE, *LT, f"--model.init_args.loss={HERE}.CountsLoss"], run=False)
    expected = cli.datamodule.class_counts.tolist()
    assert cli.model.loss.class_counts == expected and expected[0] > expected[-1]
    # saved with the hyperparameters as a plain list: a checkpoint rebuilds the loss
    assert cli.model.hparams["loss"]["init_args"]["class_counts"] == expected
    cli = main(["--config", RECIPE, *LT, f"--model.init_args.loss={HERE}.PriorLoss",
                "--model.init_args.loss.init_args.tau=0.5"], run=False)
    prior = cli.model.loss.class_prior
    counts = cli.datamodule.class_counts.double()
    torch.testing.assert_close(prior.double(), counts / counts.sum(), rtol=1e-6, atol=1e-7)
    assert cli.model.loss.tau == 0.5


def test_the_links_are_skipped_for_a_loss_that_takes_neither():
    cli = main(["--config", RECIPE, *LT], run=False)
    assert type(cli.model.loss).__name__ == "CrossEntropyLoss"


def test_linked_counts_train_through_the_cli(registered, tmp_path):
    cli = main(["fit", "--config", RECIPE, *LT, f"--model.init_args.loss={HERE}.CountsLoss",
                "--model.init_args.backbone=test_resnet", "--data.init_args.image_size=16",
                "--trainer.fast_dev_run=true", f"--trainer.default_root_dir={tmp_path}",
                "--trainer.enable_progress_bar=false"])
    assert cli.model.loss.class_counts == cli.datamodule.class_counts.tolist()


def test_prior_list_normalises_and_refuses_empty_counts():
    assert prior_list(torch.tensor([1, 3])) == [0.25, 0.75]
    with pytest.raises(ValueError, match="class_prior"):
        prior_list([0, 0])


def test_linked_values_take_the_form_of_the_constructor_hint():
    from lightning_modules.cli import adapt_to_hint

    class Hinted:
        def __init__(self, a: Optional[Tensor] = None, b: Optional[Sequence[float]] = None,
                     c: "Optional[torch.Tensor | List[float]]" = None, d=None) -> None:
            pass

    t = adapt_to_hint(Hinted, "a", [0.25, 0.75])
    assert isinstance(t, Tensor) and t.dtype == torch.float32 and t.tolist() == [0.25, 0.75]
    assert adapt_to_hint(Hinted, "a", [1, 3]).dtype == torch.int64
    for arg in ("b", "d", "missing"):
        assert adapt_to_hint(Hinted, arg, [1, 3]) == [1, 3]
    assert adapt_to_hint(None, "a", [1, 3]) == [1, 3]
