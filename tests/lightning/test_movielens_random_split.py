"""MovieLens-100k, the resolving protocol: the seeded random 80/10/10 split of each user's
interactions (multi-positive evaluation), its size and the resulting standard error of
Recall@20, the false-negative and popularity-debiased stress settings, and the rare-half view.
Every expectation is recomputed here independently (pandas / numpy), not read from the module."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightning_modules.data.movielens import (
    MovieLensDataModule,
    _EvalCollate,
    _PairCollate,
    debiased_subset,
    leave_last_out,
    load_ml100k,
    random_split,
    rarest_half,
)


@pytest.fixture(scope="module")
def df():
    return load_ml100k()


@pytest.fixture(scope="module")
def split(df):
    return random_split(df, 0)


def _hand_random_split(df, seed):
    """(user, item) -> "train" | "val" | "test", computed with pandas from the documented rule."""
    d = df[["user", "item"]].copy()
    d["key"] = np.random.default_rng(seed).random(len(d))
    d["u"] = d["user"].rank(method="dense").astype(int) - 1
    d["i"] = d["item"].rank(method="dense").astype(int) - 1
    d = d.sort_values(["u", "key"], kind="mergesort")
    d["pos"] = d.groupby("u").cumcount()
    n = d.groupby("u")["item"].transform("size")
    n_held = np.floor(0.1 * n + 0.5).astype(int)
    d["part"] = np.where(d["pos"] < n_held, "test", np.where(d["pos"] < 2 * n_held, "val", "train"))
    return d


def test_random_split_sizes_match_an_independent_pandas_split(df, split):
    hand = _hand_random_split(df, 0)
    sizes = hand["part"].value_counts().to_dict()
    # the resolving test set: 10,037 test interactions (vs 943 for leave-last-out), every user has >= 2
    assert sizes == {"train": 79_926, "val": 10_037, "test": 10_037}
    assert split.train_users.numel() == 79_926
    assert int(split.test_mask.sum()) == 10_037 and int(split.val_mask.sum()) == 10_037
    assert int(split.test_mask.sum(1).min()) == 2 and bool(split.val_mask.any(1).all())
    for part, mask in (("test", split.test_mask), ("val", split.val_mask)):
        rows = hand[hand["part"] == part]
        expected = torch.zeros_like(mask)
        expected[torch.as_tensor(rows["u"].to_numpy()), torch.as_tensor(rows["i"].to_numpy())] = True
        assert torch.equal(mask, expected), part
    rows = hand[hand["part"] == "train"]
    expected = torch.zeros_like(split.train_mask)
    expected[torch.as_tensor(rows["u"].to_numpy()), torch.as_tensor(rows["i"].to_numpy())] = True
    assert torch.equal(split.train_mask, expected)
    # every interaction in exactly one part
    assert not (split.train_mask & split.test_mask).any() and not (split.val_mask & split.test_mask).any()
    assert not (split.train_mask & split.val_mask).any()
    assert int(split.train_mask.sum() + split.val_mask.sum() + split.test_mask.sum()) == 100_000
    assert split.meta["split"] == "random" and split.meta["test_interactions"] == 10_037


def test_random_split_is_seeded(df, split):
    again = random_split(df, 0)
    other = random_split(df, 1)
    assert torch.equal(again.test_mask, split.test_mask)
    assert not torch.equal(other.test_mask, split.test_mask)
    assert int(other.test_mask.sum()) == 10_037  # the sizes depend on the counts only
    with pytest.raises(ValueError, match="test_fraction"):
        random_split(df, 0, val_fraction=0.5, test_fraction=0.5)


def _popularity_recall20(split_obj, which="test"):
    """Per-user Recall@20 of the popularity ranker (training counts), by hand in numpy."""
    pop = split_obj.train_item_counts().numpy().astype(float)
    seen = split_obj.seen_mask(torch.arange(split_obj.num_users), which).numpy()
    held = split_obj.heldout_mask(which).numpy()
    out = []
    for u in np.nonzero(held.any(1))[0]:
        s = np.where(seen[u], -np.inf, pop)
        top = np.argsort(-s, kind="stable")[:20]
        out.append(held[u, top].sum() / held[u].sum())
    return np.asarray(out)


def test_random_split_resolves_recall_at_20_better_than_leave_last_out(df, split):
    """The standard error of Recall@20 over users (popularity ranker): ~0.006 on the random split
    vs ~0.013 with one held-out item per user (the spread a single arm's number carries)."""
    r_rand = _popularity_recall20(split)
    r_llo = _popularity_recall20(leave_last_out(df))
    se_rand = r_rand.std(ddof=1) / math.sqrt(len(r_rand))
    se_llo = r_llo.std(ddof=1) / math.sqrt(len(r_llo))
    assert len(r_rand) == len(r_llo) == 943
    assert 0.003 < se_rand < 0.008, se_rand
    assert 0.008 < se_llo < 0.02, se_llo
    assert se_rand < 0.6 * se_llo


def test_eval_batches_count_every_held_out_item_and_mask_the_rest(split):
    dm_rare = rarest_half(split.train_item_counts())
    for which in ("val", "test"):
        collate = _EvalCollate(split, which, dm_rare)
        batch = collate(range(5))
        users = collate.users[:5]
        assert torch.equal(batch["target"], split.heldout_mask(which)[users])
        assert int(batch["target"].sum(1).min()) >= 2  # several positives per user
        seen = split.train_mask[users] | (split.val_mask[users] if which == "test" else False)
        assert torch.equal(batch["exclude"], seen)
        assert not (batch["target"] & batch["exclude"]).any()
        rare = batch["views"]["rare"]
        assert torch.equal(rare["target"], batch["target"] & dm_rare[None, :])
        assert "debiased" not in batch["views"]


def test_rarest_half_by_hand():
    counts = torch.tensor([5, 0, 3, 3, 9, 1, 3])
    # sorted by (count, id): 1 (0), 5 (1), 2 (3), 3 (3), 6 (3), 0 (5), 4 (9): the first 3
    assert rarest_half(counts).nonzero().squeeze(1).tolist() == [1, 2, 5]


def test_debiased_subset_caps_each_items_test_interactions(split):
    held = split.test_mask
    sub = debiased_subset(held, 2, seed=7)
    t = held.sum(0)
    kept = sub.sum(0)
    assert not (sub & ~held).any()
    assert torch.equal(kept, torch.minimum(t, torch.tensor(2)))  # at most 2 per item; rarer items keep all
    assert int(sub.sum()) == 2_260  # sum over items of min(t_i, 2) on the seed-0 split
    assert torch.equal(debiased_subset(held, 2, seed=7), sub) and not torch.equal(debiased_subset(held, 2, 8), sub)
    # the head item's share of the test set drops: popularity is flattened
    head = int(t.argmax())
    assert kept[head] / sub.sum() < 0.2 * t[head] / held.sum()
    with pytest.raises(ValueError, match="cap"):
        debiased_subset(held, 0, 0)


def _dm(**kw):
    return MovieLensDataModule(split="random", batch_size=512, eval_batch_size=64, seed=0, **kw)


def test_datamodule_debiased_view_and_meta():
    dm = _dm(debiased_cap=2)
    meta = dm.meta
    assert meta["test_interactions"] == 10_037 and meta["test_debiased_interactions"] == 2_260
    assert meta["debiased_cap"] == 2 and meta["split"] == "random"
    # rare half: 767 of the 10,037 test interactions are of the 841 rarest items
    assert int(dm.rare_items.sum()) == 841 and meta["test_rare_interactions"] == 767
    batch = next(iter(dm.test_dataloader()))
    users = batch["user"]
    deb = batch["views"]["debiased"]
    assert torch.equal(deb["target"], dm.debiased_test[users])
    dropped = dm.split.test_mask[users] & ~dm.debiased_test[users]
    assert torch.equal(deb["exclude"], batch["exclude"] | dropped)
    assert "debiased" not in next(iter(dm.val_dataloader()))["views"]
    with pytest.raises(ValueError, match="split must be"):
        MovieLensDataModule(split="time")
    with pytest.raises(ValueError, match="false_negatives"):
        MovieLensDataModule(false_negatives=1.0)


def _test_item_share(split_obj, users, neg):
    return float(split_obj.test_mask[users[:, None].expand_as(neg), neg].float().mean())


@pytest.mark.parametrize("sharing", ["row", "batch"])
def test_false_negatives_are_the_users_test_items_at_the_declared_share(split, sharing):
    rows = list(range(0, 79_926, 40))  # 1,999 pairs
    clean = _PairCollate(split, 64, seed=3, negative_sharing=sharing)(rows)
    noisy = _PairCollate(split, 64, seed=3, negative_sharing=sharing, false_negatives=0.2)(rows)
    users = noisy["user"]
    if sharing == "batch":  # the pool stays shared; the replaced slots come per pair
        assert noisy["neg_items"].shape == (64,) and torch.equal(noisy["neg_items"], clean["neg_items"])
        pool = noisy["neg_items"][None, :].expand(len(rows), -1)
        effective = torch.where(noisy["neg_replace"] >= 0, noisy["neg_replace"], pool)
    else:
        effective = noisy["neg_items"]
    base = _test_item_share(split, users, clean["neg_items"].expand(len(rows), -1))
    share = _test_item_share(split, users, effective)
    assert base < 0.02  # uniform draws rarely hit a test item
    # each negative is a test item with probability 0.2 + 0.8 * base (about 128,000 draws: sd 0.0011)
    assert len(rows) == 1_999
    assert share == pytest.approx(0.2 + 0.8 * base, abs=0.006)
    assert effective.shape == (len(rows), 64)
    replaced = effective != clean["neg_items"].expand(len(rows), -1) if sharing == "batch" else None
    # per-pair draws never hit a training item of the user; the shared pool's mask follows the replaced items
    if sharing == "row":
        assert not split.train_mask[users[:, None], effective].any()
    else:
        assert torch.equal(noisy["neg_mask"], ~split.train_mask[users[:, None], effective])
        # every replacement is one of the pair's user's test items
        assert bool(split.test_mask[users[:, None].expand_as(effective)[replaced], effective[replaced]].all())
    again = _PairCollate(split, 64, seed=3, negative_sharing=sharing, false_negatives=0.2)(rows)
    assert torch.equal(again["neg_items"], noisy["neg_items"])


def test_popularity_reference_ranks_by_training_counts_at_test_only():
    """``Recommender(popularity_reference=True)``: at test, every user's unseen items ranked by their
    training interactions (ties: the lower id), scored like the model; the same numbers as a
    numpy ranking of the whole test set; nothing at validation."""
    import pytorch_lightning as pl

    import losses
    from lightning_modules.models import Recommender

    dm = _dm()
    dm.setup("test")
    model = Recommender(losses.CrossEntropyLoss(), num_users=dm.num_users, num_items=dm.num_items,
                        popularity_reference=True, init_seed=0)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.test(model, datamodule=dm, verbose=False)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    s = dm.split
    counts = s.train_item_counts().numpy()
    order = np.lexsort((np.arange(len(counts)), -counts))  # most popular first, ties: the lower id
    recalls, hits = [], []
    for u in range(s.num_users):
        seen = (s.train_mask[u] | s.val_mask[u]) & ~s.test_mask[u]
        pos = s.test_mask[u].numpy()
        if not pos.any():
            recalls.append(0.0)
            hits.append(0.0)
            continue
        ranked = [i for i in order if not seen[i]]
        recalls.append(pos[ranked[:20]].sum() / pos.sum())
        hits.append(float(pos[ranked[:10]].any()))
    assert m["test/recall@20_popularity"] == pytest.approx(float(np.mean(recalls)), abs=1e-5)
    assert m["test/hr@10_popularity"] == pytest.approx(float(np.mean(hits)), abs=1e-5)
    assert 0.05 < m["test/recall@20_popularity"] < 0.5  # far above a random ranking's ~0.012
    trainer.validate(model, datamodule=dm, verbose=False)
    assert not any("popularity" in k for k in trainer.callback_metrics)
    with pytest.raises(ValueError, match="popularity_reference must be True or False"):
        Recommender(losses.CrossEntropyLoss(), num_users=3, num_items=4, popularity_reference="yes")


def test_held_out_positive_pool_matches_an_independent_split_and_feeds_the_false_negatives(df):
    """``held_out_positives=0.1``: per user, round(0.1 n) of the n training interactions (the rows'
    numpy keys from ``test_seed + 3``, lowest first) leave training for a pool that is neither
    validation nor test, is masked from both rankings, and is the only source of the injected
    false negatives; the clean and the stressed module of one seed train on the same pairs."""
    clean = _dm(held_out_positives=0.1, test_seed=7)
    noisy = _dm(held_out_positives=0.1, test_seed=7, false_negatives=0.2)
    plain = random_split(df, 0, test_seed=7)
    # independent: the plain split's training rows, keyed in their order, per user the lowest keys
    u, i = plain.train_users.numpy(), plain.train_items.numpy()
    key = np.random.default_rng(7 + 3).random(len(u))
    expected = set()
    for user in np.unique(u):
        rows = np.nonzero(u == user)[0]
        n_pool = min(int(math.floor(0.1 * len(rows) + 0.5)), len(rows) - 1)
        expected |= {(int(user), int(i[r])) for r in rows[np.argsort(key[rows], kind="stable")[:n_pool]]}
    pool = clean.split.pool_mask
    got = set(map(tuple, torch.nonzero(pool).tolist()))
    assert got == expected and len(got) == clean.meta["pool_interactions"] > 7_000
    assert not (pool & (clean.split.train_mask | clean.split.val_mask | clean.split.test_mask)).any()
    assert torch.equal(clean.split.train_mask | pool, plain.train_mask)
    assert torch.equal(clean.split.test_mask, plain.test_mask) and torch.equal(clean.split.val_mask, plain.val_mask)
    assert torch.equal(noisy.split.train_users, clean.split.train_users)
    assert torch.equal(noisy.split.train_items, clean.split.train_items)
    assert noisy.meta["false_negative_source"] == "held-out pool" and "false_negative_source" not in clean.meta
    # the rankings mask the pool at validation and at test
    users = torch.arange(clean.split.num_users)
    for which in ("val", "test"):
        assert bool(clean.split.seen_mask(users, which)[pool].all())
        assert not (clean.split.seen_mask(users, which) & clean.split.heldout_mask(which)).any()
    # every injected negative is a pool item of its user, never a test item
    rows = list(range(0, len(clean.split.train_users), 40))
    batch = _PairCollate(noisy.split, 64, seed=3, negative_sharing="row", false_negatives=0.2)(rows)
    base = _PairCollate(clean.split, 64, seed=3, negative_sharing="row")(rows)
    users, neg = batch["user"], batch["neg_items"]
    in_pool = pool[users[:, None].expand_as(neg), neg]
    share = float(in_pool.float().mean())
    base_share = float(pool[users[:, None].expand_as(neg), base["neg_items"]].float().mean())
    assert share == pytest.approx(0.2 + 0.8 * base_share, abs=0.006)
    assert _test_item_share(noisy.split, users, neg) < 0.02  # the test items are left alone
    with pytest.raises(ValueError, match="held_out_positives"):
        MovieLensDataModule(held_out_positives=1.0)


def test_the_recommender_logs_the_share_of_injected_false_negatives(tmp_path):
    """One real epoch of PSL with 5% false negatives from the held-out pool: the logged
    ``train/false_negative_share`` is the share of the batches' ``neg_injected`` slots (about
    0.05; users whose pool is empty keep their draws); without the stress nothing is logged."""
    import pytorch_lightning as pl

    from lightning_modules.models import Recommender
    from losses import PSLLoss

    def fit(**kw):
        dm = MovieLensDataModule(split="random", batch_size=4096, seed=0, num_negatives=64,
                                 negative_sharing="batch", held_out_positives=0.1, **kw)
        model = Recommender(num_users=dm.num_users, num_items=dm.num_items, embedding_dim=8, score="cosine",
                            loss=PSLLoss(activation="tanh", temperature=0.1, score_scale=0.5))
        trainer = pl.Trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=0, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir=tmp_path)
        trainer.fit(model, dm)
        return dm, trainer.callback_metrics

    dm, metrics = fit(false_negatives=0.05)
    shares = [float(b["neg_injected"].float().mean()) for b, _ in zip(dm.train_dataloader(), range(4))]
    assert float(metrics["train/false_negative_share"]) == pytest.approx(float(np.mean(shares)), abs=1e-6)
    assert 0.04 < float(metrics["train/false_negative_share"]) < 0.051
    _, clean = fit()
    assert "train/false_negative_share" not in clean
