"""The linear-probe reference of the image DataModules (a competence floor of the claims file):
the fit against scikit-learn's multinomial logistic regression, the metrics by hand, the
DataModule's switch and cache, and the classifier logging it at test."""

from __future__ import annotations

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

import losses
from lightning_modules.data import DigitsDataModule, MNISTDataModule
from lightning_modules.data import image_variants as iv
from lightning_modules.models import VisionClassifier


def _digits():
    dm = DigitsDataModule(image_size=8, seed=0, test_seed=7)
    dm.setup()
    return [dm._splits[k].tensors for k in ("train", "val", "test")]


def test_probe_matches_scikit_learn_logistic_regression(monkeypatch):
    from sklearn.linear_model import LogisticRegression

    (xtr, ytr), (xva, yva), (xte, yte) = _digits()
    l2 = 1e-2
    monkeypatch.setattr(iv, "PROBE_L2", (l2,))
    ours = iv.linear_probe_metrics((xtr, ytr), (xva, yva), (xte, yte), 10)
    a = xtr.reshape(len(xtr), -1).double().numpy()
    # sklearn minimises C * sum(CE) + |W|^2 / 2 (bias unpenalised): C = 1 / (l2 * n) is our objective
    ref = LogisticRegression(C=1.0 / (l2 * len(a)), max_iter=5000, tol=1e-10).fit(a, ytr.numpy())
    pred = ref.predict(xte.reshape(len(xte), -1).double().numpy())
    top1 = float(np.mean(pred == yte.numpy()))
    assert ours["l2_linear"] == l2
    assert ours["top1_linear"] == pytest.approx(top1, abs=1.5 / len(yte))  # at most one test image apart
    per_class = [np.mean(pred[yte.numpy() == c] == c) for c in range(10)]
    assert ours["balanced_acc_linear"] == pytest.approx(float(np.mean(per_class)), abs=0.02)


def test_probe_by_hand_separable_classes_and_tail_split():
    g = torch.Generator().manual_seed(0)
    centres = torch.eye(4) * 5.0

    def sample(n):
        y = torch.arange(4).repeat(n)
        return centres[y] + 0.1 * torch.randn(len(y), 4, generator=g), y

    train, val, test = sample(20), sample(5), sample(10)
    out = iv.linear_probe_metrics(train, val, test, 4, tail_classes=[2, 3])
    assert out["top1_linear"] == 1.0 and out["balanced_acc_linear"] == 1.0
    assert out["acc_head_linear"] == 1.0 and out["acc_tail_linear"] == 1.0
    # a class the probe never gets right: per-class and balanced accuracy by hand
    xt, yt = test
    wrong = yt.clone()
    wrong[yt == 3] = 0  # relabel the evaluation items of class 3 as class 0: the probe says 3
    out = iv.linear_probe_metrics(train, val, (xt, wrong), 4, tail_classes=[2, 3])
    n0, n3 = int((yt == 0).sum()), int((yt == 3).sum())
    assert out["top1_linear"] == pytest.approx(1 - n3 / len(yt))
    assert out["balanced_acc_linear"] == pytest.approx((n0 / (n0 + n3) + 1 + 1) / 3)  # class 3 has no items
    assert out["acc_tail_linear"] == pytest.approx(1.0)
    assert out["acc_head_linear"] == pytest.approx((n0 / (n0 + n3) + 1) / 2)


def test_soft_targets_train_the_probe():
    (xtr, ytr), val, test = _digits()
    soft = torch.nn.functional.one_hot(ytr, 10).float() * 0.9 + 0.01
    hard = iv.linear_probe_metrics((xtr, ytr), val, test, 10)
    smooth = iv.linear_probe_metrics((xtr, soft), val, test, 10)
    assert smooth["top1_linear"] > 0.9 and abs(smooth["top1_linear"] - hard["top1_linear"]) < 0.03


def test_datamodule_switch_cache_and_errors():
    off = MNISTDataModule(seed=0, test_seed=7, train_fraction=0.1)
    assert off.floor_metrics("test") == {}
    dm = MNISTDataModule(seed=0, test_seed=7, train_fraction=0.1, imbalance_factor=50.0, linear_probe=True)
    first = dm.floor_metrics("test")
    assert set(first) == {"top1_linear", "balanced_acc_linear", "l2_linear", "acc_head_linear", "acc_tail_linear"}
    assert dm.floor_metrics("test") == first  # cached: the same numbers, no refit
    again = MNISTDataModule(seed=0, test_seed=7, train_fraction=0.1, imbalance_factor=50.0, linear_probe=True)
    assert again.floor_metrics("test") == first  # deterministic
    with pytest.raises(ValueError, match="stage"):
        dm.floor_metrics("train")
    with pytest.raises(ValueError, match="linear_probe"):
        MNISTDataModule(linear_probe="yes")


def _test_once(model, dm):
    """One test batch through a real trainer: the trainer and its logged metrics."""
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_test_batches=1,
                         limit_val_batches=1)
    trainer.test(model, datamodule=dm, verbose=False)
    return trainer, {k: float(v) for k, v in trainer.callback_metrics.items()}


def test_classifier_logs_the_probe_at_test_only():
    torch.manual_seed(0)
    model = VisionClassifier(losses.CrossEntropyLoss(), backbone="test_resnet", num_classes=10, embedding_dim=16,
                             robust_eval=False)
    dm = DigitsDataModule(seed=0, test_seed=7, linear_probe=True, eval_batch_size=128)
    trainer, m = _test_once(model, dm)
    ref = dm.floor_metrics("test")
    assert m["test/top1_linear"] == pytest.approx(ref["top1_linear"], abs=1e-6)
    assert m["test/balanced_acc_linear"] == pytest.approx(ref["balanced_acc_linear"], abs=1e-6)
    assert ref["top1_linear"] > 0.9  # digits are nearly linearly separable: a floor, not chance
    trainer.validate(model, datamodule=dm, verbose=False)
    assert not any(k.endswith("_linear") for k in trainer.callback_metrics)


# -- the segmentation reference: an ink threshold plus the linear probe's image class ----------------
def _set_dice_iou(pred: np.ndarray, true: np.ndarray, n_cls: int, first: int = 0):
    """Set-level Dice / IoU by hand: per class the pixel sums over all images, then the macro mean
    over the classes present in the prediction or the labels."""
    dice, iou = [], []
    for c in range(first, n_cls):
        p, t = pred == c, true == c
        inter, ps, ts = np.sum(p & t), np.sum(p), np.sum(t)
        if ps + ts == 0:
            continue
        dice.append(2 * inter / (ps + ts))
        iou.append(inter / (ps + ts - inter))
    return float(np.mean(dice)), float(np.mean(iou))


def test_segmentation_reference_by_hand_on_digits():
    from lightning_modules.data import DigitsSegmentationDataModule

    dm = DigitsSegmentationDataModule(image_size=16, seed=0, test_seed=7, label_type="soft", linear_probe=True)
    ref = dm.floor_metrics("test")
    assert set(ref) == {"dice_linear", "dice_fg_linear", "miou_linear", "pixel_acc_linear", "threshold_linear"}
    # by hand: the threshold that best separates ink on the training maps, the probe's class elsewhere
    (xtr, ttr), (xva, _), (xte, tte) = (dm._splits[k].tensors for k in ("train", "val", "test"))
    v, ink = xtr[:, 0].numpy().ravel(), (ttr.argmax(1) > 0).numpy().ravel()
    grid = [round(0.02 * k, 2) for k in range(1, 50)]
    accs = [np.mean((v > t) == ink) for t in grid]
    t = grid[int(np.argmax(accs))]
    assert ref["threshold_linear"] == pytest.approx(t) and 0.3 <= t <= 0.7  # the maps' own threshold is 0.5
    # the probe's class of each test image (the classification probe's fit: tested above)
    pred_cls, _ = iv._probe_predict((xtr, dm._digits["train"]), (xva, dm._digits["val"]), xte, 10, iv._probe_flat)
    assert float((pred_cls == dm._digits["test"]).double().mean()) > 0.9
    xe = xte[:, 0].numpy()
    pred = np.where(xe > t, pred_cls.numpy()[:, None, None] + 1, 0)
    true = tte.argmax(1).numpy()
    dice, iou = _set_dice_iou(pred, true, 11)
    dice_fg, _ = _set_dice_iou(pred, true, 11, first=1)
    assert ref["dice_linear"] == pytest.approx(dice, abs=1e-5)
    assert ref["dice_fg_linear"] == pytest.approx(dice_fg, abs=1e-5)
    assert ref["miou_linear"] == pytest.approx(iou, abs=1e-5)
    assert ref["pixel_acc_linear"] == pytest.approx(float(np.mean(pred == true)), abs=1e-6)
    assert dm.floor_metrics("test") == ref  # cached
    off = DigitsSegmentationDataModule(seed=0, test_seed=7)
    assert off.floor_metrics("test") == {}
    with pytest.raises(ValueError, match="linear_probe"):
        DigitsSegmentationDataModule(linear_probe=1)


def test_segmenter_logs_the_reference_at_test_only():
    from lightning_modules.data import DigitsSegmentationDataModule
    from lightning_modules.models import VisionSegmenter

    torch.manual_seed(0)
    model = VisionSegmenter(losses.CrossEntropyLoss(), backbone="test_resnet", num_classes=11, init_seed=0)
    dm = DigitsSegmentationDataModule(image_size=16, seed=0, test_seed=7, label_type="hard", linear_probe=True,
                                      eval_batch_size=512)
    trainer, m = _test_once(model, dm)
    ref = dm.floor_metrics("test")
    for k in ("dice_linear", "dice_fg_linear", "miou_linear", "pixel_acc_linear"):
        assert m[f"test/{k}"] == pytest.approx(ref[k], abs=1e-6)
    assert ref["pixel_acc_linear"] > 0.9 and ref["dice_linear"] > 0.5  # a floor far above chance (1/11)
    trainer.validate(model, datamodule=dm, verbose=False)
    assert not any(k.endswith("_linear") for k in trainer.callback_metrics)
