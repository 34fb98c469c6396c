"""The BenchmarkModule contract: a subclass written against it alone (no save_hyperparameters, no
hparams fix, no route check, no validation_step of its own) saves re-instantiable
hyperparameters, round-trips a checkpoint through load_from_checkpoint and ``validate
--ckpt_path``, prints its config, and a subclass of a subclass saves them exactly once."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanMetric

import losses
from losses import InputKind
from lightning_modules.base import BenchmarkDataModule, BenchmarkModule
from lightning_modules.cli import main
from tests.lightning.recipe_utils import find_checkpoint, run_cli


class TinyData(BenchmarkDataModule):
    """Three classes of 5-dimensional points, 24 per split."""

    def __init__(self, n: int = 24, batch_size: int = 8, seed: int = 0) -> None:
        super().__init__()
        self.num_classes, self.input_dim = 3, 5
        g = torch.Generator().manual_seed(seed)
        centres = 3 * torch.randn(3, 5, generator=g)
        self.splits = {}
        for split in ("train", "val", "test"):
            y = torch.randint(3, (n,), generator=g)
            self.splits[split] = TensorDataset(centres[y] + torch.randn(n, 5, generator=g), y)
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.splits["train"], batch_size=self.batch_size, shuffle=False)

    def val_dataloader(self):
        return DataLoader(self.splits["val"], batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.splits["test"], batch_size=self.batch_size)


class TinyClassifier(BenchmarkModule):
    """A linear classifier written against the contract only (the BenchmarkModule docstring)."""

    loss_kinds = (InputKind.LOGITS, InputKind.EMBEDDINGS)
    loss_task = "a tiny classifier"
    loss_hint = "use a logits loss or an embeddings loss that owns a head"
    loss_example = "losses.CrossEntropyLoss()"

    def __init__(self, loss: nn.Module, num_classes: int = 0, input_dim: int = 0, embedding_dim: int = 8,
                 lr: float = 0.05, weight_decay: float = 0.0) -> None:
        super().__init__(loss, lr=lr, weight_decay=weight_decay)
        self.num_classes, self.input_dim, self.embedding_dim = num_classes, input_dim, embedding_dim
        self.net = nn.Linear(input_dim, embedding_dim)
        self.head = None if self.route.owns_head else nn.Linear(embedding_dim, num_classes)
        self.loss = loss
        self.eval_metrics = nn.ModuleDict({stage: MeanMetric() for stage in ("val", "test")})
        self.calls = []

    def logits(self, x):
        features = self.net(x)
        return self.loss.logits(features) if self.route.owns_head else self.head(features)

    def training_step(self, batch, batch_idx: int):
        x, y = batch
        features = self.net(x)
        loss = self.loss(features, y) if self.route.owns_head else self.loss(self.head(features), y)
        self.log("train/loss", loss, on_step=False, on_epoch=True)
        return loss

    def _eval_step(self, stage: str, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.calls.append((stage, batch_idx, dataloader_idx))
        x, y = batch
        self.eval_metrics[stage].update((self.logits(x).argmax(1) == y).float())

    def _eval_epoch_end(self, stage: str) -> None:
        self.calls.append((stage, "end"))
        metric = self.eval_metrics[stage]
        if metric.update_count:
            self.log(f"{stage}/top1", metric.compute())
        metric.reset()


class WiderTiny(TinyClassifier):
    """A subclass of a subclass, passing its parent's arguments through ``**kwargs``."""

    def __init__(self, loss: nn.Module, extra_width: int = 2, **kwargs) -> None:
        super().__init__(loss, **kwargs)
        self.extra = nn.Linear(self.embedding_dim, extra_width)


class Bare(BenchmarkModule):
    loss_kinds = (InputKind.LOGITS,)

    def __init__(self, loss: nn.Module) -> None:
        super().__init__(loss)
        self.loss = loss


CONFIG = """\
seed_everything: 0
trainer:
  max_epochs: 2
  log_every_n_steps: 1
model:
  class_path: tests.lightning.test_base.TinyClassifier
  init_args:
    embedding_dim: 6
    loss:
      class_path: losses.MarginSoftmaxLoss
      init_args:
        scale: 8.0
        margin: [1.0, 0.0, 0.0]
data:
  class_path: tests.lightning.test_base.TinyData
  init_args:
    batch_size: 8
"""


def _direct(cls=TinyClassifier, loss=None, **kwargs):
    with warnings.catch_warnings():  # a loss module kept in the hparams: Lightning's advice to ignore it
        warnings.simplefilter("ignore", UserWarning)
        return cls(losses.CrossEntropyLoss() if loss is None else loss, **kwargs)


def test_the_base_saves_the_constructor_arguments():
    m = _direct(num_classes=3, input_dim=5)
    assert set(m.hparams) == {"loss", "num_classes", "input_dim", "embedding_dim", "lr", "weight_decay"}
    assert (m.hparams.num_classes, m.hparams.input_dim, m.hparams.embedding_dim, m.hparams.lr) == (3, 5, 8, 0.05)
    assert m.hparams_initial.num_classes == 3 and m._hparams_name == "kwargs"
    # the wrapped __init__ keeps its real signature (jsonargparse and load_from_checkpoint read it)
    assert list(inspect.signature(TinyClassifier.__init__).parameters)[:3] == ["self", "loss", "num_classes"]
    assert inspect.getfullargspec(TinyClassifier.__init__).varkw is None


def test_a_subclass_of_a_subclass_saves_once_after_the_outermost_init(monkeypatch):
    seen = []
    save = BenchmarkModule._save_benchmark_hparams

    def spy(self, init_args):
        seen.append((type(self).__name__, hasattr(self, "extra"), sorted(init_args)))
        save(self, init_args)

    monkeypatch.setattr(BenchmarkModule, "_save_benchmark_hparams", spy)
    m = _direct(WiderTiny, extra_width=3, num_classes=3, input_dim=5)
    # once, and only when the outermost __init__ is done (its own sub-module exists)
    assert seen == [("WiderTiny", True, ["embedding_dim", "extra_width", "input_dim", "loss", "lr", "num_classes",
                                         "weight_decay"])]
    # every level's arguments, the parent's defaults included
    assert {k: v for k, v in m.hparams.items() if k != "loss"} == {
        "extra_width": 3, "num_classes": 3, "input_dim": 5, "embedding_dim": 8, "lr": 0.05, "weight_decay": 0.0}
    seen.clear()
    _direct(num_classes=3, input_dim=5)
    assert seen == [("TinyClassifier", False, ["embedding_dim", "input_dim", "loss", "lr", "num_classes",
                                               "weight_decay"])]
    m = _direct(WiderTiny, num_classes=3, input_dim=5)
    assert m.hparams.extra_width == 2 and "_benchmark_pending_init_args" not in vars(m)


def test_the_base_routes_and_checks_the_loss():
    m = _direct(num_classes=3, input_dim=5)
    assert m.route.kind == InputKind.LOGITS and not m.route.owns_head
    with pytest.raises(ValueError, match=r"^TinyClassifier: BPRLoss takes inputs of kind 'pairs', not one of "
                                         r".*cannot train a tiny classifier on its own; use a logits loss"):
        TinyClassifier(losses.BPRLoss(), num_classes=3, input_dim=5)
    with pytest.raises(ValueError, match=r"^WiderTiny: OrthogonalProjectionLoss is an auxiliary loss"):
        WiderTiny(losses.OrthogonalProjectionLoss(), num_classes=3, input_dim=5)
    with pytest.raises(TypeError, match=r"^TinyClassifier: loss must be an nn.Module \(got str\); pass e\.g\. "
                                        r"losses\.CrossEntropyLoss\(\)"):
        TinyClassifier("cross_entropy", num_classes=3, input_dim=5)


def test_validation_and_test_dispatch_to_eval_step_by_stage():
    m = _direct(num_classes=3, input_dim=5)
    m.log = lambda *a, **k: None  # outside a Trainer
    batch = (torch.randn(4, 5), torch.tensor([0, 1, 2, 0]))
    assert m.validation_step(batch, 3) is None
    m.test_step(batch, 1, 1)
    m.on_validation_epoch_end()
    m.on_test_epoch_end()
    assert m.calls == [("val", 3, 0), ("test", 1, 1), ("val", "end"), ("test", "end")]
    assert m.eval_metrics["val"] is not m.eval_metrics["test"]
    bare = _direct(Bare)
    bare.on_validation_epoch_end()  # nothing to do by default
    with pytest.raises(NotImplementedError, match=r"^Bare: implement _eval_step\(stage, batch, batch_idx"):
        bare.validation_step(batch, 0)


def test_cli_round_trip_of_a_module_that_only_follows_the_contract(tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", str(config), "--print_config"])
    assert info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"] == "tests.lightning.test_base.TinyClassifier"
    assert printed["model"]["init_args"]["embedding_dim"] == 6
    assert printed["model"]["init_args"]["loss"]["class_path"] == "losses.MarginSoftmaxLoss"

    fit = run_cli("fit", str(config), tmp_path)
    model = fit.model
    assert (model.num_classes, model.input_dim, model.loss.num_classes, model.loss.embedding_dim) == (3, 5, 3, 6)
    ckpt_path = find_checkpoint(tmp_path)
    hp = torch.load(ckpt_path, map_location="cpu", weights_only=False)["hyper_parameters"]
    # the size links this class does not take are gone; the loss's linked sizes are all there
    assert not {"num_users", "num_items", "in_chans"} & set(hp)
    assert (hp["num_classes"], hp["input_dim"], hp["embedding_dim"]) == (3, 5, 6)
    assert hp["loss"]["init_args"]["num_classes"] == 3 and hp["loss"]["init_args"]["embedding_dim"] == 6
    assert dict(model.hparams) == hp

    loaded = TinyClassifier.load_from_checkpoint(ckpt_path)
    assert type(loaded.loss) is losses.MarginSoftmaxLoss and loaded.loss.embedding_dim == 6
    own, saved = loaded.state_dict(), model.state_dict()
    assert set(own) == set(saved) and all(torch.equal(own[k], saved[k]) for k in saved)

    validate = run_cli("validate", str(config), tmp_path, [f"--ckpt_path={ckpt_path}"])
    fit_top1 = float(fit.trainer.callback_metrics["val/top1"])
    assert float(validate.trainer.callback_metrics["val/top1"]) == pytest.approx(fit_top1, abs=1e-6)
    test = run_cli("test", str(config), tmp_path, [f"--ckpt_path={ckpt_path}"])
    assert "test/top1" in test.trainer.callback_metrics
    assert test.model.calls[-1] == ("test", "end")
