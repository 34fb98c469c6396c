"""Every vision / segmentation recipe runs through the real CLI: fit (1 epoch, 2 batches), then
validate and test from the checkpoint that fit saved (docs/conventions.md, CI sizing); and the
checkpoint round trip through ``load_from_checkpoint``.

Recipes run unchanged except for the CI shortening of ``run_recipe``, a batch size of 4 (64 for
evaluation on MNIST, where 2 batches of 4 held one class; 256 on MNIST-LT, whose tail classes the
first 128 evaluation images miss), no sanity-check pass, and PGD robust evaluation switched off for all recipes but the adversarial
one (where PGD-10 at eps 8/255 is computed in validation and test, and the training-time attack
of the loss is shortened to 2 steps).
"""

from __future__ import annotations

import glob
import math
import os

import pytest
import torch
import yaml

import pytorch_lightning as pl

from lightning_modules.routing import loss_route
from tests.lightning.recipe_utils import run_recipe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = sorted(
    os.path.relpath(p, ROOT)
    for d in ("vision", "segmentation")
    for p in glob.glob(os.path.join(ROOT, "configs", d, "*.yaml"))
)
ROBUST_RECIPE = "configs/vision/adversarial_comp_sum.yaml"

pytestmark = pytest.mark.slow


def _config(recipe: str) -> dict:
    with open(os.path.join(ROOT, recipe)) as fh:
        return yaml.safe_load(fh)


def _extra(recipe: str) -> list:
    extra = ["--data.init_args.batch_size=4", "--trainer.num_sanity_val_steps=0"]
    if _config(recipe)["data"]["class_path"].endswith("MNISTDataModule"):
        # on MNIST the first 2 evaluation batches of 4 held a single class, so the cross-class
        # cosine had no pair to average
        # (the long-tail recipes keep 256: their first 128 evaluation images hold no tail class)
        extra.append(f"--data.init_args.eval_batch_size={256 if '_lt' in recipe else 64}")
    if _config(recipe)["model"]["class_path"].endswith("VisionClassifier") and recipe != ROBUST_RECIPE:
        extra.append("--model.init_args.robust_eval=false")
    if recipe == ROBUST_RECIPE:  # the training attack shortened; the PGD-10 evaluation stays
        extra.append("--model.init_args.loss.init_args.steps=2")
    return extra


_CACHE: dict = {}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Runs each recipe once per session (the round-trip tests reuse the checkpoints)."""

    def get(recipe: str) -> dict:
        if recipe not in _CACHE:
            tmp = tmp_path_factory.mktemp(os.path.splitext(os.path.basename(recipe))[0])
            _CACHE[recipe] = run_recipe(os.path.join(ROOT, recipe), tmp, extra=_extra(recipe))
        return _CACHE[recipe]

    return get


def test_recipe_inventory():
    """Every docs/benchmarks.md digits row and its baseline has a recipe, loss given by class_path."""
    names = {os.path.basename(r) for r in RECIPES}
    expected = {
        "cross_entropy.yaml", "z_loss.yaml", "sparsemax.yaml", "comp_sum_noisy.yaml", "cross_entropy_noisy.yaml",
        "adversarial_comp_sum.yaml", "opl_lowdata.yaml", "cross_entropy_lowdata.yaml", "gol_lt.yaml",
        "cross_entropy_lt.yaml", "bce_with_logits_lt.yaml", "wcdas_lt.yaml", "cosine_softmax_lt.yaml",
        "dice_semimetric_soft.yaml", "dice_semimetric_hard.yaml", "soft_dice_hard.yaml",
        # one recipe per registered loss (tests/lightning/test_recipe_coverage.py)
        "entmax15.yaml", "entmax_bisect.yaml", "logz_penalty.yaml", "margin_softmax.yaml",
        "jaccard_metric_soft.yaml",
    }
    assert expected <= names
    for recipe in RECIPES:
        cfg = _config(recipe)
        init = cfg["model"]["init_args"]
        assert init["loss"]["class_path"].startswith("losses."), recipe
        # sizes are linked from the DataModule, never hard-coded
        assert "num_classes" not in init and "in_chans" not in init, recipe
        assert "num_classes" not in (init["loss"].get("init_args") or {}), recipe
        assert "embedding_dim" not in (init["loss"].get("init_args") or {}), recipe


def _finite(metrics: dict) -> None:
    for k, v in metrics.items():
        assert math.isfinite(v), (k, v)
        if any(k.endswith(s) for s in ("top1", "top5", "balanced_acc", "ece", "dice", "dice_fg", "pixel_acc",
                                       "robust_acc", "acc_head", "acc_tail")) or "/acc_class_" in k:
            assert 0.0 <= v <= 1.0, (k, v)


def _stochastic_loss(recipe: str) -> bool:
    """Losses that draw random numbers take a ``seed`` (docs/conventions.md Randomness); their value
    depends on the generator state, which a checkpoint does not carry."""
    import importlib

    path = _config(recipe)["model"]["init_args"]["loss"]["class_path"]
    mod, _, name = path.rpartition(".")
    import inspect

    return "seed" in inspect.signature(getattr(importlib.import_module(mod), name)).parameters


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_runs(recipe, results):
    out = results(recipe)
    fit, val, test = out["fit"], out["validate"], out["test"]
    assert os.path.isfile(out["ckpt"])
    for m in (fit, val, test):
        _finite(m)
    assert {"val/loss", "val/dice" if "segmentation" in recipe else "val/top1"} <= set(val)
    assert any(k.startswith("test/") for k in test)
    # validate from the checkpoint reproduces the end-of-fit validation exactly (same weights,
    # deterministic evaluation; the PGD start is seeded per batch)
    for k, v in val.items():
        if k.endswith("loss") and _stochastic_loss(recipe):
            continue
        assert k in fit, k
        assert v == pytest.approx(fit[k], rel=1e-5, abs=1e-6), k
    if "segmentation" in recipe:
        assert {"val/dice_fg", "val/pixel_acc", "val/ece"} <= set(val)
        return
    assert {"val/top5", "val/balanced_acc", "val/ece", "val/cos_intra", "val/cos_inter"} <= set(val)
    # support sizes only for the sparse mappings (sparsemax, 1.5-entmax, entmax by bisection)
    sparse = any(s in os.path.basename(recipe) for s in ("sparsemax", "entmax"))
    assert ("val/sparsemax_support" in val) == sparse and ("val/support" in val) == sparse, recipe
    if sparse:
        assert 1.0 <= val["val/sparsemax_support"] <= 10.0 and 1.0 <= val["val/support"] <= 10.0
    assert any(k.startswith("val/acc_class_") for k in val)
    if "_lt" in recipe:
        assert {"val/acc_head", "val/acc_tail", "test/acc_head", "test/acc_tail"} <= set(val) | set(test)
    if "opl" in recipe:
        assert {"val/main_loss", "val/aux_loss"} <= set(val)
    if recipe == ROBUST_RECIPE:
        assert {"val/robust_acc"} <= set(val) and {"test/robust_acc"} <= set(test)
    else:
        assert "val/robust_acc" not in val


@pytest.mark.parametrize("recipe", ["configs/vision/wcdas_lt.yaml", "configs/vision/comp_sum_noisy.yaml"])
def test_checkpoint_round_trip(recipe, results):
    """load_from_checkpoint rebuilds the same loss (hyperparameters and loss-owned parameters)
    and gives the validation metrics of ``validate --ckpt_path``."""
    from lightning_modules.data import DigitsDataModule
    from lightning_modules.models import VisionClassifier

    out = results(recipe)
    ckpt = torch.load(out["ckpt"], map_location="cpu", weights_only=False)
    model = VisionClassifier.load_from_checkpoint(out["ckpt"])
    cfg_loss = _config(recipe)["model"]["init_args"]["loss"]
    assert type(model.loss).__name__ == cfg_loss["class_path"].rpartition(".")[2]
    for k, v in (cfg_loss.get("init_args") or {}).items():
        assert getattr(model.loss, k) == v, k
    if loss_route(model.loss).owns_head:  # linked sizes
        assert model.loss.num_classes == 10 and model.loss.embedding_dim == 64
    saved = {k[len("loss."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("loss.")}
    assert set(saved) == set(model.loss.state_dict())
    for k, v in model.loss.state_dict().items():
        assert torch.equal(v, saved[k]), k
    if loss_route(model.loss).owns_head:
        assert saved, "a head-owning loss must carry parameters"
    dm = DigitsDataModule.load_from_checkpoint(out["ckpt"])
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=2)
    (metrics,) = trainer.validate(model, datamodule=dm, verbose=False)
    assert set(metrics) == set(out["validate"])
    for k, v in metrics.items():
        assert v == pytest.approx(out["validate"][k], rel=1e-6, abs=1e-7), k
