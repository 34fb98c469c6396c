"""MovieLens-100k data: RecBole files without importing RecBole, leave-last-out split, seen-item
masking, negative sampling, the users -> items view, and the missing-package error."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from lightning_modules.data import MissingDataPackageError
from lightning_modules.data.movielens import (
    RECBOLE_PIP,
    MovieLensDataModule,
    _EvalCollate,
    _PairCollate,
    leave_last_out,
    load_ml100k,
    movielens_file,
    sample_negatives,
)


@pytest.fixture(scope="module")
def df():
    return load_ml100k()


@pytest.fixture(scope="module")
def split(df):
    return leave_last_out(df)


def test_reads_recbole_files_without_importing_recbole(df):
    path = movielens_file()
    assert path.name == "ml-100k.inter" and path.parent.name == "ml-100k"
    assert path.parent.parent.name == "dataset_example" and path.parent.parent.parent.name == "recbole"
    assert "recbole" not in sys.modules
    assert list(df.columns[:4]) == ["user", "item", "rating", "timestamp"]
    assert len(df) == 100_000 and df["user"].nunique() == 943 and df["item"].nunique() == 1682
    with open(path, encoding="utf-8") as fh:
        header = fh.readline().rstrip("\n").split("\t")
    assert header[:2] == ["user_id:token", "item_id:token"]


def test_missing_recbole_names_package_and_pip_command(monkeypatch):
    real = importlib.util.find_spec

    def fake(name, *args, **kwargs):
        return None if name == "recbole" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", fake)
    with pytest.raises(MissingDataPackageError, match=r"`recbole`.*pip install --no-deps recbole==1\.2\.1"):
        movielens_file()
    with pytest.raises(ImportError, match="recbole"):
        MovieLensDataModule()
    assert RECBOLE_PIP == "pip install --no-deps recbole==1.2.1"


def test_sizes_and_every_interaction_in_exactly_one_split(split):
    assert (split.num_users, split.num_items) == (943, 1682)
    n_val = int((split.val_items >= 0).sum())
    n_test = int((split.test_items >= 0).sum())
    assert n_val == n_test == 943  # every ML-100k user has >= 20 ratings
    assert split.train_users.numel() + n_val + n_test == 100_000
    # no (user, item) pair is repeated in ML-100k, so the training mask counts the training rows
    assert int(split.train_mask.sum()) == split.train_users.numel()


def test_leave_last_out_matches_an_independent_pandas_split(df, split):
    # independent: remap by sorted raw ids, order each user's rows by timestamp (ties: file order)
    user_map = {u: i for i, u in enumerate(sorted(df["user"].unique()))}
    item_map = {v: i for i, v in enumerate(sorted(df["item"].unique()))}
    d = df.assign(row=np.arange(len(df))).sort_values(["user", "timestamp", "row"], kind="mergesort")
    for raw_user, g in d.groupby("user", sort=True):
        u = user_map[raw_user]
        items = [item_map[i] for i in g["item"]]
        assert int(split.test_items[u]) == items[-1]
        assert int(split.val_items[u]) == items[-2]
        assert sorted(torch.nonzero(split.train_mask[u]).squeeze(1).tolist()) == sorted(items[:-2])
    np.testing.assert_array_equal(split.user_ids, np.sort(df["user"].unique()))
    np.testing.assert_array_equal(split.item_ids, np.sort(df["item"].unique()))


def test_no_leakage_held_out_items_are_latest_and_unseen(df, split):
    uidx = np.searchsorted(split.user_ids, df["user"].to_numpy())
    iidx = np.searchsorted(split.item_ids, df["item"].to_numpy())
    ts = df["timestamp"].to_numpy()
    key = {(int(u), int(i)): int(t) for u, i, t in zip(uidx, iidx, ts)}
    for u in range(0, split.num_users, 7):
        v, t = int(split.val_items[u]), int(split.test_items[u])
        assert v != t
        assert not split.train_mask[u, v] and not split.train_mask[u, t]
        train_ts = [key[(u, i)] for i in torch.nonzero(split.train_mask[u]).squeeze(1).tolist()]
        assert max(train_ts) <= key[(u, v)] <= key[(u, t)]


def test_tiny_frame_edge_cases_ties_and_short_histories():
    # user 10: 4 rows, two tied at the last timestamp -> file order decides (item 3 after item 4)
    # user 20: 2 rows -> train + test, no validation; user 30: 1 row -> train only
    df = pd.DataFrame({
        "user": [10, 10, 20, 10, 10, 30, 20],
        "item": [1, 2, 1, 4, 3, 2, 3],
        "timestamp": [5, 1, 7, 9, 9, 3, 8],
    })
    s = leave_last_out(df)
    assert (s.num_users, s.num_items) == (3, 4)
    item = {1: 0, 2: 1, 3: 2, 4: 3}
    assert s.test_items.tolist() == [item[3], item[3], -1]
    assert s.val_items.tolist() == [item[4], -1, -1]
    assert s.train_mask.tolist() == [[True, True, False, False], [True, False, False, False],
                                     [False, True, False, False]]
    assert s.eval_users("val").tolist() == [0] and s.eval_users("test").tolist() == [0, 1]


def test_seen_mask_and_eval_batches(split):
    users = torch.tensor([0, 5, 942])
    val_mask = split.seen_mask(users, "val")
    test_mask = split.seen_mask(users, "test")
    assert torch.equal(val_mask, split.train_mask[users])
    expected = split.train_mask[users].clone()
    expected[torch.arange(3), split.val_items[users]] = True
    assert torch.equal(test_mask, expected)
    for which, items in (("val", split.val_items), ("test", split.test_items)):
        batch = _EvalCollate(split, which)([0, 5, 942])
        assert torch.equal(batch["user"], users)
        assert batch["target"].sum(1).tolist() == [1, 1, 1]
        assert torch.equal(batch["target"].float().argmax(1), items[users])
        assert not (batch["target"] & batch["exclude"]).any()  # the held-out item is ranked
        assert torch.equal(batch["exclude"], split.seen_mask(users, which))
    with pytest.raises(ValueError, match="split must be"):
        split.seen_mask(users, "train")


def test_negative_sampling_is_seeded_and_avoids_training_items(split):
    a = _PairCollate(split, 50, seed=3)(list(range(0, 4000, 13)))
    b = _PairCollate(split, 50, seed=3)(list(range(0, 4000, 13)))
    c = _PairCollate(split, 50, seed=4)(list(range(0, 4000, 13)))
    assert torch.equal(a["neg_items"], b["neg_items"]) and not torch.equal(a["neg_items"], c["neg_items"])
    assert a["neg_items"].shape == (len(range(0, 4000, 13)), 50)
    assert not split.train_mask[a["user"][:, None], a["neg_items"]].any()
    assert torch.equal(a["user"], split.train_users[torch.arange(0, 4000, 13)])
    assert torch.equal(a["item"], split.train_items[torch.arange(0, 4000, 13)])
    # a user who has seen every item but one always gets that item
    exclude = torch.ones(2, 6, dtype=torch.bool)
    exclude[:, 4] = False
    neg = sample_negatives(torch.tensor([0, 1]), 5, exclude, torch.Generator().manual_seed(0))
    assert (neg == 4).all()


def test_datamodule_views_and_sizes():
    dm = MovieLensDataModule(train_view="pairs", num_negatives=3, batch_size=32, eval_batch_size=16)
    assert (dm.num_users, dm.num_items, dm.num_classes) == (943, 1682, 1682)
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"user", "item", "neg_items"} and batch["neg_items"].shape == (32, 3)
    assert dm.split.train_mask[batch["user"], batch["item"]].all()
    again = next(iter(MovieLensDataModule(train_view="pairs", num_negatives=3, batch_size=32).train_dataloader()))
    assert all(torch.equal(batch[k], again[k]) for k in batch)  # seeded shuffling and sampling
    users_view = MovieLensDataModule(train_view="users", batch_size=8)
    ub = next(iter(users_view.train_dataloader()))
    assert torch.equal(ub["target"], users_view.split.train_mask[ub["user"]]) and ub["target"].shape == (8, 1682)
    vb = next(iter(dm.val_dataloader()))
    assert vb["user"].tolist() == list(range(16))
    assert len(dm.test_dataloader().dataset) == 943
    with pytest.raises(ValueError, match="train_view"):
        MovieLensDataModule(train_view="items")


def test_shared_negative_pool_masks_each_users_training_items(split):
    rows = list(range(0, 3000, 11))
    batch = _PairCollate(split, 40, seed=5, negative_sharing="batch")(rows)
    neg, mask = batch["neg_items"], batch["neg_mask"]
    assert neg.shape == (40,) and len(set(neg.tolist())) == 40 and mask.shape == (len(rows), 40)
    for i, u in enumerate(batch["user"].tolist()):
        for j, item in enumerate(neg.tolist()):
            assert bool(mask[i, j]) == (not bool(split.train_mask[u, item]))
        assert not mask[i, neg == batch["item"][i]].any()  # the pair's own item never counts as a negative
    again = _PairCollate(split, 40, seed=5, negative_sharing="batch")(rows)
    assert torch.equal(again["neg_items"], neg)
    with pytest.raises(ValueError, match="negative_sharing"):
        MovieLensDataModule(negative_sharing="user")


def _negatives_per_epoch(split, num_workers, epochs=2):
    from lightning_modules.base import IndexDataset

    collate = _PairCollate(split, 6, seed=3)
    loader = torch.utils.data.DataLoader(IndexDataset(64), batch_size=16, shuffle=False, collate_fn=collate,
                                         num_workers=num_workers, generator=torch.Generator().manual_seed(0))
    return [[b["neg_items"] for b in loader] for _ in range(epochs)]


def test_negatives_differ_across_dataloader_workers_and_epochs(split):
    # a generator stored on the collate object used to be copied into each worker in one state:
    # with 2 workers, batches 0 and 1 drew the same negatives, and every epoch repeated them
    for workers in (0, 2):
        (e0, e1) = _negatives_per_epoch(split, workers)
        assert not torch.equal(e0[0], e0[1]) and not torch.equal(e0[2], e0[3]), workers
        assert not any(torch.equal(a, b) for a, b in zip(e0, e1)), workers
        users = split.train_users[torch.arange(64)].reshape(4, 16)
        for u, neg in zip(users, e0):
            assert not split.train_mask[u[:, None], neg].any()
    assert all(torch.equal(a, b) for a, b in zip(_negatives_per_epoch(split, 2)[1], _negatives_per_epoch(split, 2)[1]))
