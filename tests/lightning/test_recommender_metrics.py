"""The Recommender's added evaluation metrics against hand computations: recall / NDCG / HR at
other cut-offs with several positives per user, the rare-half and popularity-debiased views
(users without a view positive are skipped), the item bias, and the Partial FC classes-seen
training metrics through the real CLI."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

import losses
from lightning_modules.models import Recommender
from lightning_modules.models.recommender import parse_extra_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
U, I = 6, 30


def _hand(scores, target, exclude, k):
    """Per-user recall@k / ndcg@k / hr@k (binary relevance), users without positives dropped."""
    rec, ndcg, hr = [], [], []
    for s, t, e in zip(scores.tolist(), target.tolist(), exclude.tolist()):
        cand = [j for j in range(len(s)) if not e[j]]
        pos = {j for j in cand if t[j]}
        if not pos:
            continue
        top = sorted(cand, key=lambda j: (-s[j], j))[:k]
        hits = [1.0 if j in pos else 0.0 for j in top]
        rec.append(sum(hits) / len(pos))
        hr.append(1.0 if sum(hits) else 0.0)
        dcg = sum(h / math.log2(r + 2) for r, h in enumerate(hits))
        ideal = sum(1.0 / math.log2(r + 2) for r in range(min(len(pos), k)))
        ndcg.append(dcg / ideal)
    return {"recall": np.mean(rec), "ndcg": np.mean(ndcg), "hr": np.mean(hr), "n": len(rec)}


def _model(**kw):
    torch.manual_seed(0)
    return Recommender(losses.CrossEntropyLoss(), num_users=U, num_items=I, embedding_dim=8, score="dot", **kw)


def _batch(g):
    users = torch.arange(U)
    target = torch.rand(U, I, generator=g) < 0.2
    target[0, :3] = True  # user 0: several positives
    exclude = (torch.rand(U, I, generator=g) < 0.15) & ~target
    rare_items = torch.zeros(I, dtype=torch.bool)
    rare_items[: I // 2] = True
    rare_t = target & rare_items[None, :]
    rare_t[1] = False  # a user with no rare positive: skipped, not counted as 0
    kept = target.clone()
    kept[:, ::3] = False
    views = {"rare": {"target": rare_t, "exclude": exclude},
             "debiased": {"target": kept, "exclude": exclude | (target & ~kept)}}
    return {"user": users, "target": target, "exclude": exclude, "views": views}


def test_extra_metrics_match_hand_computations_per_view():
    names = ["recall@1", "recall@5", "recall@10", "ndcg@5", "hr@5", "rare_recall@20", "rare_ndcg@20",
             "debiased_recall@20", "recall@40"]
    m = _model(extra_metrics=names)
    g = torch.Generator().manual_seed(1)
    b1, b2 = _batch(g), _batch(g)
    m.log_dict = lambda *a, **k: None  # outside a Trainer
    for b in (b1, b2):  # two batches of the same users: torchmetrics groups by user index
        b["user"] = b["user"] + (0 if b is b1 else U)
    m.user_embedding = torch.nn.Embedding(2 * U, 8)
    for b in (b1, b2):
        m.test_step(b, 0)  # the base's dispatch to _eval_step("test", ...)
    got = {}
    for coll in m.eval_extra["test"].values():
        got.update({k: float(v) for k, v in coll.compute().items()})
    got.update({k: float(v) for k, v in m.eval_metrics["test"].compute().items()})
    with torch.no_grad():
        scores = torch.cat([m.all_item_scores(b["user"]) for b in (b1, b2)])

    def cat(key, view=None):
        return torch.cat([(b["views"][view] if view else b)[key] for b in (b1, b2)])

    plain = {k: _hand(scores, cat("target"), cat("exclude"), k) for k in (1, 5, 10, 20, 40)}
    rare = _hand(scores, cat("target", "rare"), cat("exclude", "rare"), 20)
    deb = _hand(scores, cat("target", "debiased"), cat("exclude", "debiased"), 20)
    assert rare["n"] == 2 * U - 2  # the two users without rare positives are skipped
    expected = {"test/recall@1": plain[1]["recall"], "test/recall@5": plain[5]["recall"],
                "test/recall@10": plain[10]["recall"], "test/ndcg@5": plain[5]["ndcg"], "test/hr@5": plain[5]["hr"],
                "test/recall@40": plain[40]["recall"], "test/recall@20": plain[20]["recall"],
                "test/ndcg@20": plain[20]["ndcg"], "test/hr@10": plain[10]["hr"], "test/ndcg@10": plain[10]["ndcg"],
                "test/rare_recall@20": rare["recall"], "test/rare_ndcg@20": rare["ndcg"],
                "test/debiased_recall@20": deb["recall"]}
    assert got == pytest.approx(expected, abs=1e-6)
    # several positives: recall@k < hr@k for user 0's partial hits is possible; the cut-offs are ordered
    assert got["test/recall@1"] <= got["test/recall@5"] <= got["test/recall@10"] <= got["test/recall@20"]


def test_view_metrics_are_skipped_for_batches_without_the_view_and_names_are_checked():
    m = _model(extra_metrics=["debiased_recall@20"])
    m.log_dict = lambda *a, **k: None
    b = _batch(torch.Generator().manual_seed(2))
    del b["views"]["debiased"]
    m.validation_step(b, 0)
    assert all(metric._update_count == 0 for metric in m.eval_extra["val"]["debiased"].values())
    assert parse_extra_metrics(["recall@5", "rare_ndcg@20"]) == {"": [("recall@5", "recall", 5)],
                                                               "rare": [("rare_ndcg@20", "ndcg", 20)]}
    for bad in ("recall", "precision@5", "tail_recall@20", "recall@0", "recall@101"):
        with pytest.raises(ValueError, match="extra metric"):
            parse_extra_metrics([bad])


def test_item_bias_adds_to_every_users_scores_and_is_trained():
    m = _model(item_bias=True, item_bias_init=-2.0)
    users = torch.tensor([0, 3])
    plain = m.user_embedding(users) @ m.item_embedding.weight.T
    assert torch.allclose(m.all_item_scores(users), plain - 2.0)
    loss = m._logits_loss({"user": users, "item": torch.tensor([1, 2])})
    loss.backward()
    assert m.item_bias.grad is not None and m.item_bias.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="item_bias"):
        Recommender(losses.PartialFCLoss(8, I, sample_rate=0.5, seed=0), num_users=U, num_items=I,
                    embedding_dim=8, item_bias=True)


@pytest.mark.slow
def test_partial_fc_logs_the_classes_each_step_saw_through_the_cli(tmp_path):
    """rate 0.1 of 1,682 items = k 168; with batches of 128 pairs the softmax sees
    max(distinct positives, 168) classes: sampled ones fill up to k."""
    from lightning_modules.cli import main
    from lightning_modules.data.movielens import MovieLensDataModule

    args = ["fit", "--config", os.path.join(ROOT, "configs/recommendation/partial_fc.yaml"),
            f"--trainer.default_root_dir={tmp_path}", "--trainer.max_epochs=1", "--trainer.limit_train_batches=3",
            "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", "--data.init_args.batch_size=128"]
    cli = main(args=args)
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    dm = MovieLensDataModule(train_view="pairs", num_negatives=0, batch_size=128, seed=0)
    positives = []
    for i, batch in enumerate(dm.train_dataloader()):
        if i == 3:
            break
        positives.append(torch.unique(batch["item"]).numel())
    assert metrics["train/positive_classes"] == pytest.approx(np.mean(positives))
    assert metrics["train/softmax_classes"] == pytest.approx(np.mean([max(p, 168) for p in positives]))
    assert metrics["train/softmax_classes"] > metrics["train/positive_classes"]  # 128 pairs < 168: sampling


def test_replaced_pool_slots_are_scored_with_the_replacing_item():
    torch.manual_seed(0)
    m = Recommender(losses.PSLLoss(), num_users=U, num_items=I, embedding_dim=8, score="cosine")
    users, items = torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])
    pool = torch.tensor([7, 8, 9, 10])
    replace = torch.full((3, 4), -1)
    replace[0, 1], replace[2, 3] = 20, 21
    pos, neg = m._pos_neg({"user": users, "item": items, "neg_items": pool, "neg_replace": replace})
    u = torch.nn.functional.normalize(m.user_embedding.weight, dim=1)
    q = torch.nn.functional.normalize(m.item_embedding.weight, dim=1)
    effective = torch.where(replace >= 0, replace, pool[None, :].expand(3, 4))
    hand = torch.stack([torch.stack([u[b] @ q[effective[b, j]] for j in range(4)]) for b in range(3)])
    assert torch.allclose(neg, hand, atol=1e-6)
    assert torch.allclose(pos, (u[users] * q[items]).sum(1), atol=1e-6)
    neg.sum().backward()
    assert m.item_embedding.weight.grad[20].abs().sum() > 0 and m.item_embedding.weight.grad[8].abs().sum() > 0


@pytest.mark.slow
def test_psl_stress_settings_run_through_the_cli(tmp_path):
    """The PSL claims' overrides (random split, 2% false negatives, debiased test view) through the
    real CLI at a tiny size: fit, then validate and test from the checkpoint."""
    from tests.lightning.recipe_utils import run_recipe

    extra = ["--trainer.num_sanity_val_steps=0", "--data.init_args.split=random",
             "--data.init_args.false_negatives=0.02", "--data.init_args.debiased_cap=2",
             "--data.init_args.batch_size=256", "--data.init_args.eval_batch_size=64",
             '--model.init_args.extra_metrics=["debiased_recall@20", "debiased_ndcg@20"]']
    out = run_recipe(os.path.join(ROOT, "configs/recommendation/psl_tanh.yaml"), tmp_path, extra=extra)
    assert math.isfinite(out["fit"]["train/loss"])
    assert {"test/debiased_recall@20", "test/debiased_ndcg@20", "test/recall@20"} <= set(out["test"])
    assert "val/debiased_recall@20" not in out["validate"]  # the view exists in test batches only
    for k, v in out["test"].items():
        assert 0.0 <= v <= 1.0, (k, v)
