"""Digits DataModules: splits, variants and targets checked against independent computations
on scikit-learn's data, and the missing-package error."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

from lightning_modules.data import ASYMMETRIC_FLIPS, DigitsDataModule, DigitsSegmentationDataModule

RAW = load_digits()
IMAGES = torch.as_tensor(RAW.images, dtype=torch.float32) / 16.0  # (1797, 8, 8)
LABELS = torch.as_tensor(RAW.target)


def _all(dm, split):
    ds = dm._splits[split]
    return ds.tensors


def _source_index(x32: torch.Tensor) -> torch.Tensor:
    """Recover the index into load_digits of each upsampled image (independent upsampling)."""
    ref = F.interpolate(IMAGES.unsqueeze(1), size=x32.shape[-2:], mode="bilinear", align_corners=False)
    d = torch.cdist(x32.flatten(1).double(), ref.flatten(1).double())
    idx = d.argmin(1)
    assert torch.all(d.gather(1, idx[:, None]).squeeze(1) < 1e-5)
    return idx


@pytest.fixture(scope="module")
def full():
    dm = DigitsDataModule(seed=0)
    dm.setup("fit")
    return dm


def test_sizes_known_before_setup():
    dm = DigitsDataModule()
    assert (dm.num_classes, dm.in_chans, dm.num_users, dm.num_items, dm.input_dim) == (10, 1, 0, 0, 0)
    seg = DigitsSegmentationDataModule()
    assert (seg.num_classes, seg.in_chans) == (11, 1)


def test_full_split_is_stratified_disjoint_and_scaled(full):
    sizes = full.split_sizes()
    assert sum(sizes.values()) == 1797
    idx = {}
    for split in ("train", "val", "test"):
        x, y = _all(full, split)
        assert x.shape[1:] == (1, 32, 32) and x.dtype == torch.float32
        assert float(x.min()) == 0.0 and float(x.max()) == 1.0  # [0, 1], no standardisation
        idx[split] = _source_index(x)
        assert torch.equal(LABELS[idx[split]], y)  # labels travel with their images
    all_idx = torch.cat(list(idx.values()))
    assert torch.equal(torch.sort(all_idx).values, torch.arange(1797))  # disjoint and complete
    counts = np.bincount(RAW.target, minlength=10)
    for split, frac in (("test", 0.2), ("val", 0.15)):
        got = np.bincount(LABELS[idx[split]].numpy(), minlength=10)
        np.testing.assert_array_equal(got, np.round(frac * counts).astype(int))


def test_upsampled_pixels_equal_bilinear_interpolation(full):
    x, _ = _all(full, "val")
    idx = _source_index(x)
    ref = F.interpolate(IMAGES[idx].unsqueeze(1), size=(32, 32), mode="bilinear", align_corners=False)
    torch.testing.assert_close(x, ref, rtol=0, atol=1e-6)
    x16 = DigitsDataModule(image_size=16)
    x16.setup()
    assert _all(x16, "train")[0].shape[-2:] == (16, 16)


def test_seeds_reproduce_and_differ():
    a, b, c = DigitsDataModule(seed=3), DigitsDataModule(seed=3), DigitsDataModule(seed=4)
    for dm in (a, b, c):
        dm.setup()
    assert torch.equal(_all(a, "train")[1], _all(b, "train")[1])
    assert torch.equal(_all(a, "test")[0], _all(b, "test")[0])
    assert not torch.equal(_all(a, "test")[0], _all(c, "test")[0])


def test_low_data_fraction(full):
    dm = DigitsDataModule(train_fraction=0.1)
    dm.setup()
    _, y = _all(dm, "train")
    full_counts = torch.bincount(_all(full, "train")[1], minlength=10)
    expected = torch.clamp(torch.round(0.1 * full_counts.double()).long(), min=1)
    assert torch.equal(torch.bincount(y, minlength=10), expected)
    # val / test untouched
    assert torch.equal(_all(dm, "test")[0], _all(full, "test")[0])
    # the kept images are a subset of the full training split
    assert set(_source_index(_all(dm, "train")[0]).tolist()) <= set(_source_index(_all(full, "train")[0]).tolist())


@pytest.mark.parametrize("imbalance", [10.0, 50.0])
def test_long_tailed_counts_and_balanced_eval(full, imbalance):
    dm = DigitsDataModule(imbalance_factor=imbalance)
    dm.setup()
    n_max = int(torch.bincount(_all(full, "train")[1], minlength=10).min())
    expected = [max(1, math.floor(n_max * imbalance ** (-c / 9))) for c in range(10)]
    got = torch.bincount(_all(dm, "train")[1], minlength=10).tolist()
    assert got == expected and got[0] == n_max and got[0] / got[-1] == pytest.approx(imbalance, rel=0.35)
    assert dm.class_counts.tolist() == expected
    assert dm.tail_classes == [5, 6, 7, 8, 9]
    for split in ("val", "test"):  # balanced held-out splits, identical to the full variant's
        assert torch.equal(_all(dm, split)[1], _all(full, split)[1])
    assert DigitsDataModule().tail_classes == []


def test_symmetric_label_noise(full):
    dm = DigitsDataModule(noise_rate=0.4, noise_type="symmetric")
    dm.setup()
    x, y = _all(dm, "train")
    clean = LABELS[_source_index(x)]
    changed = y != clean
    assert int(changed.sum()) == round(0.4 * len(y))
    assert torch.equal(changed, dm.noise_mask)
    # every other class receives flipped labels (uniform over the other classes)
    assert len(torch.unique(y[changed])) == 10
    for split in ("val", "test"):  # clean evaluation labels
        xs, ys = _all(dm, split)
        assert torch.equal(ys, LABELS[_source_index(xs)])


def test_asymmetric_label_noise():
    dm = DigitsDataModule(noise_rate=0.4, noise_type="asymmetric")
    dm.setup()
    x, y = _all(dm, "train")
    clean = LABELS[_source_index(x)]
    changed = y != clean
    for src in range(10):
        n_src = int((clean == src).sum())
        flipped = changed & (clean == src)
        if src in ASYMMETRIC_FLIPS:
            assert int(flipped.sum()) == round(0.4 * n_src)
            assert torch.all(y[flipped] == ASYMMETRIC_FLIPS[src])
        else:
            assert int(flipped.sum()) == 0


def test_soft_targets_are_knn_label_histograms():
    dm = DigitsDataModule(soft_targets=True, soft_neighbours=5)
    dm.setup()
    x, q = _all(dm, "train")
    assert q.shape == (len(x), 10) and q.dtype == torch.float32
    torch.testing.assert_close(q.sum(1), torch.ones(len(x)))
    src = _source_index(x)
    pixels = IMAGES[src].flatten(1).double()
    labels = LABELS[src]
    for i in (0, 7, 100):  # brute-force neighbours: the image itself plus its 5 nearest others
        d = ((pixels - pixels[i]) ** 2).sum(1).sqrt()
        d[i] = -1.0
        nn_idx = torch.argsort(d)[:6]
        ref = torch.bincount(labels[nn_idx], minlength=10).float() / 6
        torch.testing.assert_close(q[i], ref)
    assert float((q.argmax(1) == labels).float().mean()) > 0.9
    xv, yv = _all(dm, "val")
    assert yv.dtype == torch.int64  # evaluation keeps class ids


def test_loaders_batches(full):
    x, y = next(iter(full.train_dataloader()))
    assert x.shape == (64, 1, 32, 32) and y.shape == (64,)
    dm = DigitsDataModule(batch_size=16, eval_batch_size=50)
    xv, _ = next(iter(dm.val_dataloader()))  # setup on demand
    assert xv.shape[0] == 50
    # shuffle=False keeps the pre-shuffled (mixed-class) order
    dm2 = DigitsDataModule(shuffle=False)
    y1 = next(iter(dm2.train_dataloader()))[1]
    y2 = next(iter(dm2.train_dataloader()))[1]
    assert torch.equal(y1, y2) and len(torch.unique(y1)) == 10


@pytest.mark.parametrize("label_type", ["hard", "soft"])
def test_segmentation_targets(label_type):
    dm = DigitsSegmentationDataModule(label_type=label_type)
    dm.setup()
    x, t = _all(dm, "val")
    digits = LABELS[_source_index(x)]
    v = x[:, 0]
    hard_ref = torch.where(v > 0.5, digits[:, None, None] + 1, torch.zeros_like(v, dtype=torch.long))
    if label_type == "hard":
        assert t.dtype == torch.int64 and t.shape == v.shape
        assert torch.equal(t, hard_ref)
    else:
        assert t.shape == (len(x), 11, 32, 32) and t.dtype == torch.float32
        torch.testing.assert_close(t.sum(1), torch.ones_like(v))
        torch.testing.assert_close(t[:, 0], 1 - v)
        on_digit = t.gather(1, (digits + 1).view(-1, 1, 1, 1).expand(-1, 1, 32, 32)).squeeze(1)
        torch.testing.assert_close(on_digit, v)
        assert torch.equal(t.argmax(1), hard_ref)  # the hard label is the soft label's threshold
    # inked pixels exist in every image and background dominates
    assert torch.all((hard_ref > 0).flatten(1).any(1))


@pytest.mark.parametrize("cls", [DigitsDataModule, DigitsSegmentationDataModule])
def test_missing_scikit_learn_names_the_package(monkeypatch, cls):
    """The missing-package case (import of sklearn fails), not a mock of the data."""
    for name in [m for m in sys.modules if m == "sklearn" or m.startswith("sklearn.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "sklearn", None)
    dm = cls()
    with pytest.raises(ModuleNotFoundError, match="scikit-learn") as info:
        dm.setup("fit")
    assert "pip install scikit-learn" in str(info.value)
    with pytest.raises(ModuleNotFoundError, match="scikit-learn"):
        dm.prepare_data()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"train_fraction": 0.0}, "train_fraction must be in"),
        ({"train_fraction": 1.5}, "train_fraction must be in"),
        ({"imbalance_factor": 0.5}, "imbalance_factor must be"),
        ({"imbalance_factor": float("inf")}, "imbalance_factor must be"),
        ({"noise_rate": 1.0}, "noise_rate must be in"),
        ({"noise_type": "pair"}, "noise_type must be"),
        ({"batch_size": 0}, "batch_size must be"),
        ({"val_fraction": 0.6, "test_fraction": 0.5}, "val_fraction \\+ test_fraction"),
        ({"image_size": 4}, "image_size must be"),
        ({"soft_neighbours": 0}, "soft_neighbours must be"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match="DigitsDataModule: " + match):
        DigitsDataModule(**kwargs)


def test_bad_segmentation_arguments():
    with pytest.raises(ValueError, match="DigitsSegmentationDataModule: label_type"):
        DigitsSegmentationDataModule(label_type="probabilities")
    with pytest.raises(ValueError, match="DigitsSegmentationDataModule: threshold"):
        DigitsSegmentationDataModule(threshold=1.0)
