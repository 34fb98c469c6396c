"""Per-item test records (``lightning_modules.records.TestItemRecorder``): for every benchmark module
kind, a tiny real run through the CLI (``--trainer.callbacks+=...TestItemRecorder``) writes one row
per test item, in the test split's order, and the documented aggregation of the rows gives back
every logged test metric it declares (to float tolerance); the metrics left out are the documented
non-per-item ones. Off by default: without the callback nothing is recorded.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from lightning_modules.records import (
    ItemRecords,
    TestItemRecorder,
    aggregate_metric,
    load_test_items,
    ranking_per_query,
)
from tests.lightning.recipe_utils import find_checkpoint, run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUIET = ["--trainer.num_sanity_val_steps=0"]
RECORDER = "--trainer.callbacks+=lightning_modules.records.TestItemRecorder"

#: logged test metrics that are not per-item quantities (documented in each module's record notes)
NOT_PER_ITEM = {
    "classifier": {"test/loss", "test/cos_intra", "test/cos_inter"},
    "segmentation": {"test/loss", "test/ece"},
    "recommendation": set(),
    "retrieval": set(),
    "many_class": {"test/open_tar_far", "test/open_rank1_raw", "test/open_rank1_fixed", "test/top1_fixed"},
    "language_model": {"test/loss", "test/peak_memory_mb", "test/unigram_top1", "test/unigram_top5",
                       "test/unigram_nll", "test/unigram_ppl", "test/bigram_top1", "test/bigram_top5",
                       "test/bigram_nll", "test/bigram_ppl"},
}

LM_SMALL = {"max_files": 30, "vocab_size": 512, "seq_len": 32, "batch_size": 4, "eval_batch_size": 4,
            "max_tokens": 4096, "max_eval_tokens": 512}
LM_MODEL = ["--model.init_args.embedding_dim=32", "--model.init_args.num_layers=1", "--model.init_args.num_heads=2",
            "--model.init_args.eval_chunk_tokens=50"]  # chunks that cut windows: the per-window sums still add up


def _test_with_records(recipe, root, extra, ckpt=None):
    path = os.path.join(str(root), "records", "test_items.npz")
    args = [*QUIET, *extra, RECORDER, f"--trainer.callbacks.path={path}"]
    if ckpt is not None:
        args.append(f"--ckpt_path={ckpt}")
    cli = run_cli("test", os.path.join(ROOT, recipe), root, args)
    logged = {k: float(v) for k, v in cli.trainer.callback_metrics.items()
              if k.startswith("test/") and torch.is_tensor(v) and v.numel() == 1}
    return load_test_items(path), logged


def _check(records, logged, kind, module):
    h = records.header
    assert h["format"] == "test-item-records" and h["kind"] == kind and h["module"] == module
    assert h["logged"] == pytest.approx(logged)
    for t, info in h["tables"].items():
        cols = records.tables[t]
        assert set(cols) == set(info["columns"]) and all(v.shape[0] == info["rows"] for v in cols.values())
        assert (np.diff(cols["item"]) > 0).all(), t  # sorted by item id, one row per item
    agg = records.aggregate()
    checked = set()
    for name, value in agg.items():
        if name not in logged:  # a metric the run did not log (nan: e.g. no item of a class)
            assert math.isnan(value), (name, value)
            continue
        want = logged[name]
        if math.isinf(want):
            assert math.isinf(value) and value > 0, (name, value)
        else:
            assert value == pytest.approx(want, rel=1e-5, abs=1e-6), name
        checked.add(name)
    missing = set(logged) - checked - NOT_PER_ITEM[kind]
    assert not missing, f"logged test metrics without records: {sorted(missing)}"
    return agg


def _positional(records, table, n=None):
    items = records.tables[table]["item"]
    assert np.array_equal(items, np.arange(len(items))), table  # the test split's own order
    if n is not None:
        assert len(items) == n


# -- every module kind, through the CLI ------------------------------------------------------------
def test_classifier_long_tail_fit_then_test_records(tmp_path):
    """As the benchmark worker runs it: fit (2 batches), then test from the checkpoint with the
    recorder; long-tail data (head / tail accuracy from the class column) and two PGD radii."""
    recipe = "configs/vision/cross_entropy_lt.yaml"
    extra = ["--data.init_args.batch_size=16", "--trainer.limit_test_batches=3", "--model.init_args.pgd_steps=1",
             "--model.init_args.robust_epsilons=[0.1]", "--model.init_args.robust_eval=true",
             "--model.init_args.backbone=test_resnet",
             "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=0",
             "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    fit = run_cli("fit", os.path.join(ROOT, recipe), tmp_path, [*QUIET, *extra])
    assert fit.model.item_records is None  # off outside the recorder's test
    records, logged = _test_with_records(recipe, tmp_path, extra, ckpt=find_checkpoint(tmp_path))
    _check(records, logged, "classifier", "VisionClassifier")
    _positional(records, "items", 48)
    rows = records.tables["items"]
    assert {"test/acc_head", "test/acc_tail", "test/robust_acc", "test/robust_acc@0.1", "test/top5"} <= set(logged)
    assert records.header["metrics"]["test/acc_tail"]["classes"] == [5, 6, 7, 8, 9]
    assert np.array_equal(rows["correct"], rows["pred"] == rows["target"])
    np.testing.assert_allclose(rows["nll"], -np.log(np.maximum(rows["p_true"], 1e-12)))


def test_sparse_classifier_records_support(tmp_path):
    records, logged = _test_with_records("configs/vision/sparsemax.yaml", tmp_path, [
        "--data.init_args.batch_size=16", "--trainer.limit_test_batches=2", "--model.init_args.robust_eval=false",
        "--model.init_args.backbone=test_resnet"])
    _check(records, logged, "classifier", "VisionClassifier")
    assert {"test/support", "test/sparsemax_support"} <= set(logged)


def test_segmentation_records_per_image_pixel_counts(tmp_path):
    records, logged = _test_with_records("configs/segmentation/soft_dice_hard.yaml", tmp_path, [
        "--data.init_args.batch_size=8", "--trainer.limit_test_batches=2", "--model.init_args.backbone=test_resnet"])
    agg = _check(records, logged, "segmentation", "VisionSegmenter")
    assert {"test/dice", "test/dice_fg", "test/miou", "test/pixel_acc"} <= set(agg)
    _positional(records, "images", 16)
    rows = records.tables["images"]
    assert rows["intersection"].shape == (16, 11)
    assert (rows["true_pixels"].sum(1) == rows["pixels"]).all() and (rows["pred_pixels"].sum(1) == rows["pixels"]).all()


def test_recommendation_records_per_user_with_views(tmp_path):
    records, logged = _test_with_records("configs/recommendation/next_item_ce.yaml", tmp_path, [
        "--trainer.limit_test_batches=2", "--data.init_args.eval_batch_size=64", "--data.init_args.debiased_cap=2",
        "--model.init_args.extra_metrics=[recall@5,rare_recall@20,rare_ndcg@20,debiased_recall@20,debiased_ndcg@20]"])
    agg = _check(records, logged, "recommendation", "Recommender")
    assert {"test/recall@20", "test/ndcg@20", "test/hr@10", "test/ndcg@10", "test/recall@5", "test/rare_recall@20",
            "test/debiased_recall@20", "test/debiased_ndcg@20"} <= set(agg)
    rows = records.tables["users"]
    assert len(rows["item"]) == 128  # user ids, sorted
    assert np.isnan(rows["rare_recall@20"]).any() and not np.isnan(rows["recall@20"]).any()


def test_retrieval_records_per_query(tmp_path):
    records, logged = _test_with_records("configs/retrieval/chatterbot_infonce.yaml", tmp_path, [
        "--data.init_args.max_queries=20", "--data.init_args.val_size=3", "--data.init_args.test_size=12",
        "--data.init_args.eval_batch_size=4", "--trainer.limit_test_batches=1.0"])
    agg = _check(records, logged, "retrieval", "DualEncoderRetriever")
    assert set(agg) == {"test/r@1", "test/r@10", "test/mrr@10", "test/ndcg@10"}
    assert len(records.tables["queries"]["item"]) == 12  # query ids, sorted


def test_many_class_records_closed_and_open_set(tmp_path):
    records, logged = _test_with_records("configs/many_class/arcface_pfc01.yaml", tmp_path, [
        "--data.init_args.num_classes=200", "--data.init_args.open_classes=30", "--data.init_args.eval_batch_size=64",
        "--trainer.limit_test_batches=1.0"])
    agg = _check(records, logged, "many_class", "IdentityEmbedder")
    assert set(agg) == {"test/top1", "test/top5", "test/open_rank1"}
    _positional(records, "closed", 200)
    assert len(records.tables["open"]["item"]) == 60  # the probes (2 per held-out identity) that are scored


@pytest.mark.parametrize("recipe", ["cross_entropy", "sparsemax"])
def test_language_model_records_per_window_token_sums(tmp_path, recipe):
    cache = str(tmp_path.parent / "lm-cache")  # shared by the two parameters
    records, logged = _test_with_records(f"configs/language_model/{recipe}.yaml", tmp_path, [
        *(f"--data.init_args.{k}={v}" for k, v in {**LM_SMALL, "cache_dir": cache}.items()), *LM_MODEL])
    agg = _check(records, logged, "language_model", "LanguageModel")
    assert {"test/top1", "test/top5", "test/softmax_ppl", "test/logz_std"} <= set(agg)
    assert ("test/zero_prob" in agg) == (recipe == "sparsemax")
    _positional(records, "sequences")
    assert records.tables["sequences"]["tokens"].sum() > 0


# -- off by default, the pieces ----------------------------------------------------------------------
def test_without_the_recorder_nothing_is_recorded(tmp_path):
    cli = run_cli("test", os.path.join(ROOT, "configs/many_class/arcface_pfc01.yaml"), tmp_path, [
        *QUIET, "--data.init_args.num_classes=50", "--data.init_args.open_classes=10"])
    assert cli.model.item_records is None and type(cli.model).item_records is None
    assert not any(isinstance(cb, TestItemRecorder) for cb in cli.trainer.callbacks)
    assert not list(tmp_path.rglob("*.npz"))


def test_ranking_per_query_against_a_hand_computation():
    # query 7: candidates ranked c0 > c1 > c2 > c3, positives c1 and c3; query 3: no positive
    preds = torch.tensor([4.0, 3.0, 2.0, 1.0, 2.0, 1.0], dtype=torch.float64)
    target = torch.tensor([False, True, False, True, False, False])
    indexes = torch.tensor([7, 7, 7, 7, 3, 3])
    out = ranking_per_query(preds, target, indexes, [("r@2", "recall", 2, 0.0), ("hr@1", "hr", 1, 0.0),
                                                     ("mrr", "mrr", 10, 0.0), ("ndcg@3", "ndcg", 3, float("nan"))])
    assert out["query"].tolist() == [3, 7] and out["n_pos"].tolist() == [0.0, 2.0]
    assert out["r@2"].tolist() == [0.0, 0.5] and out["hr@1"].tolist() == [0.0, 0.0]
    assert out["mrr"].tolist() == [0.0, 0.5]
    assert math.isnan(out["ndcg@3"][0])
    assert out["ndcg@3"][1] == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))


def test_aggregations_and_positions_on_hand_made_rows():
    rows = {"correct": np.array([1, 0, 1, 1]), "target": np.array([0, 0, 1, 2]), "num": np.array([3.0, 1.0]),
            "den": np.array([2.0, 2.0])}
    assert aggregate_metric({"agg": "mean", "columns": ["correct"]}, rows) == 0.75
    assert aggregate_metric({"agg": "class_mean", "columns": ["correct", "target"]}, rows) == pytest.approx(2.5 / 3)
    assert aggregate_metric({"agg": "class_mean", "columns": ["correct", "target"], "classes": [0, 5]}, rows) == 0.5
    assert aggregate_metric({"agg": "exp_ratio", "columns": ["num", "den"]}, rows) == pytest.approx(math.e)
    rec = ItemRecords(None)  # no trainer: positions in loader order
    assert rec.positions(3).tolist() == [0, 1, 2] and rec.positions(2).tolist() == [3, 4]
    with pytest.raises(ValueError, match="'item' column"):
        rec.add("t", x=torch.zeros(2))
