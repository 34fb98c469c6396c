"""Recommender: ranking metrics against a hand computation, routing of every loss kind, seen-item
masking in evaluation, and the rejected kinds."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torchmetrics.retrieval import RetrievalHitRate, RetrievalNormalizedDCG, RetrievalRecall

import losses
from lightning_modules.models import Recommender
from lightning_modules.retrieval_metrics import candidates_from_scores, recommendation_metrics


# -- metrics --------------------------------------------------------------------------------------
def _hand_metrics(scores, target, exclude):
    """Full ranking by explicit loops: Recall@20, NDCG@20, HR@10, NDCG@10 (binary relevance)."""
    out = {"recall@20": [], "ndcg@20": [], "hr@10": [], "ndcg@10": []}
    for s, t, e in zip(scores.tolist(), target.tolist(), exclude.tolist()):
        cand = [(sc, j) for j, sc in enumerate(s) if not e[j]]
        cand.sort(key=lambda x: -x[0])
        rel = [1 if t[j] else 0 for _, j in cand]
        n_pos = sum(rel)

        def dcg(r, k):
            return sum(x / math.log2(i + 2) for i, x in enumerate(r[:k]))

        out["recall@20"].append(sum(rel[:20]) / n_pos)
        out["hr@10"].append(1.0 if sum(rel[:10]) else 0.0)
        for k in (10, 20):
            out[f"ndcg@{k}"].append(dcg(rel, k) / dcg(sorted(rel, reverse=True), k))
    return {k: sum(v) / len(v) for k, v in out.items()}


def test_metrics_match_a_hand_computation_with_seen_items_masked():
    g = torch.Generator().manual_seed(0)
    B, L = 9, 40
    scores = torch.randn(B, L, generator=g)
    target = torch.zeros(B, L, dtype=torch.bool)
    target[torch.arange(B), torch.randint(L, (B,), generator=g)] = True
    target[:3, 7] = True  # a few rows with two positives
    exclude = torch.rand(B, L, generator=g) < 0.3
    exclude &= ~target
    exclude[0, :5] = True
    # seen items scored highest: masking must push the positives up
    scores = torch.where(exclude, scores + 10.0, scores)
    metrics = recommendation_metrics()
    # two batches with distinct query ids
    for rows in (slice(0, 4), slice(4, B)):
        ids = torch.arange(B)[rows] + 100
        preds, tgt, idx = candidates_from_scores(scores[rows], target[rows], ids, k=20, exclude=exclude[rows])
        metrics.update(preds, tgt, indexes=idx)
    got = {k: float(v) for k, v in metrics.compute().items()}
    hand = _hand_metrics(scores, target, exclude)
    for k in hand:
        assert got[k] == pytest.approx(hand[k], abs=1e-6), k
    # the candidate list equals torchmetrics on the full (masked) ranking; the scores are shifted
    # to be positive because torchmetrics' recall / MRR ignore positives scored <= 0
    keep = ~exclude
    scores = scores - scores.min() + 1.0
    rows = torch.arange(B)[:, None].expand(B, L)[keep]
    full = {"recall@20": RetrievalRecall(top_k=20), "ndcg@20": RetrievalNormalizedDCG(top_k=20),
            "hr@10": RetrievalHitRate(top_k=10), "ndcg@10": RetrievalNormalizedDCG(top_k=10)}
    for k, m in full.items():
        assert float(m(scores[keep], target[keep], indexes=rows)) == pytest.approx(got[k], abs=1e-6), k


def test_candidates_never_contain_excluded_items():
    scores = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0]])
    target = torch.tensor([[False, False, False, True, False]])
    exclude = torch.tensor([[True, True, False, False, False]])
    # rank-based scores n - position among the non-excluded items: item 2 -> 5, item 3 -> 4, item 4 -> 3
    preds, tgt, idx = candidates_from_scores(scores, target, torch.tensor([7]), k=3, exclude=exclude)
    assert preds.tolist() == [5.0, 4.0, 3.0] and tgt.tolist() == [False, True, False] and idx.tolist() == [7] * 3
    # a positive below the top k is kept, below the top k
    preds, tgt, _ = candidates_from_scores(scores, target, torch.tensor([7]), k=1, exclude=exclude)
    assert preds.tolist() == [5.0, 4.0] and tgt.tolist() == [False, True]
    scores2 = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
    preds, tgt, _ = candidates_from_scores(scores2, target, torch.tensor([7]), k=1, exclude=exclude)
    assert preds.tolist() == [4.0, 5.0] and tgt.tolist() == [True, False]  # columns 3, 4


# -- routing --------------------------------------------------------------------------------------
U, I, D = 6, 11, 4  # noqa: E741 (users, items, dim)


def _batch(g, B=5, N=3):
    return {"user": torch.randint(U, (B,), generator=g), "item": torch.randint(I, (B,), generator=g),
            "neg_items": torch.randint(I, (B, N), generator=g)}


def _model(loss, **kw):
    torch.manual_seed(0)
    return Recommender(loss, num_users=U, num_items=I, embedding_dim=D, **kw)


@pytest.mark.parametrize("loss", [losses.PSLLoss(), losses.SampledSoftmaxLoss(), losses.BPRLoss()],
                         ids=["psl", "ssm", "bpr"])
@pytest.mark.parametrize("score", ["cosine", "dot"])
def test_pair_route_scores_sampled_negatives(loss, score):
    m = _model(loss, score=score)
    b = _batch(torch.Generator().manual_seed(1))
    P, Q = m.user_embedding.weight, m.item_embedding.weight
    if score == "cosine":
        P, Q = F.normalize(P, dim=1), F.normalize(Q, dim=1)
    u = P[b["user"]]
    pos = (u * Q[b["item"]]).sum(1)
    neg = torch.stack([torch.stack([u[i] @ Q[j] for j in b["neg_items"][i]]) for i in range(5)])
    expected = loss(pos, neg)
    got = m._train_loss(b)
    torch.testing.assert_close(got, expected)
    got.backward()
    assert m.user_embedding.weight.grad[b["user"]].abs().sum() > 0
    assert m.item_embedding.weight.grad[b["neg_items"].flatten()].abs().sum() > 0


def test_logits_route_is_full_softmax_over_items():
    m = _model(losses.CrossEntropyLoss(), score="dot", logit_scale=2.0)
    b = _batch(torch.Generator().manual_seed(2))
    logits = 2.0 * m.user_embedding.weight[b["user"]] @ m.item_embedding.weight.T
    torch.testing.assert_close(m._train_loss(b), F.cross_entropy(logits, b["item"]))
    # plain torch losses (outside the registry) are logits losses too
    m2 = _model(torch.nn.CrossEntropyLoss(), score="dot", logit_scale=2.0)
    torch.testing.assert_close(m2._train_loss(b), F.cross_entropy(logits, b["item"]))


def test_head_route_partial_fc_owns_item_centres_and_scores_evaluation():
    loss = losses.PartialFCLoss(D, I, sample_rate=1.0, scale=8.0, margin=(1.0, 0.0, 0.0), seed=0)
    m = _model(loss)
    assert m.item_embedding is None
    b = _batch(torch.Generator().manual_seed(3))
    u = m.user_embedding.weight[b["user"]]
    cos = F.normalize(u, dim=1) @ F.normalize(loss.weight, dim=1).T
    torch.testing.assert_close(m._train_loss(b), F.cross_entropy(8.0 * cos, b["item"]))
    torch.testing.assert_close(m.all_item_scores(b["user"]), loss.logits(u))


def test_scores_route_users_view_and_pairs_view():
    loss = losses.DecoupledSoftmaxLoss(temperature=0.1)
    m = _model(loss)
    g = torch.Generator().manual_seed(4)
    users = torch.tensor([0, 3, 5])
    target = torch.rand(3, I, generator=g) < 0.3
    target[:, 0] = True
    scores = F.normalize(m.user_embedding.weight[users], dim=1) @ F.normalize(m.item_embedding.weight, dim=1).T
    torch.testing.assert_close(m._train_loss({"user": users, "target": target}), loss(scores, target))
    b = _batch(g)
    pos, neg = m._pos_neg(b)
    # one positive (column 0) per row: decoupled softmax = cross-entropy at temperature T (docs/losses/decoupled_softmax.md)
    torch.testing.assert_close(m._train_loss(b), F.cross_entropy(torch.cat([pos[:, None], neg], 1) / 0.1,
                                                                 torch.zeros(5, dtype=torch.long)))


@pytest.mark.usefixtures("no_experimental_warning")
def test_missing_batch_keys_and_rejected_losses():
    m = _model(losses.PSLLoss())
    with pytest.raises(ValueError, match="neg_items.*num_negatives > 0"):
        m._train_loss({"user": torch.tensor([0]), "item": torch.tensor([1])})
    with pytest.raises(ValueError, match="cannot train a recommender"):
        _model(losses.OrthogonalProjectionLoss())
    with pytest.raises(ValueError, match="cannot train a recommender"):
        _model(losses.AdversarialCompSumLoss(nu=1.0))
    with pytest.raises(ValueError, match="num_users and num_items"):
        Recommender(losses.BPRLoss())
    with pytest.raises(ValueError, match="score must be"):
        _model(losses.BPRLoss(), score="l2")


def test_eval_step_masks_seen_items_and_uses_separate_metric_objects():
    m = _model(losses.CrossEntropyLoss(), score="dot")
    assert m.eval_metrics["val"] is not m.eval_metrics["test"]
    with torch.no_grad():  # make item 0 the best item for everyone, but seen by user 1
        m.item_embedding.weight[0] = 10 * m.user_embedding.weight.mean(0) + 10
        m.user_embedding.weight.abs_()
        m.item_embedding.weight[1:].mul_(0.01)
    users = torch.tensor([0, 1])
    target = torch.zeros(2, I, dtype=torch.bool)
    target[:, 0] = True
    target[1, 0], target[1, 3] = False, True
    exclude = torch.zeros(2, I, dtype=torch.bool)
    exclude[1, 0] = True
    m.log_dict = lambda *a, **k: None  # outside a Trainer
    m.validation_step({"user": users, "target": target, "exclude": exclude}, 0)
    got = {k: float(v) for k, v in m.eval_metrics["val"].compute().items()}
    assert not any(metric.update_count for metric in m.eval_metrics["test"].values())
    scores = m.all_item_scores(users).detach()
    hand = _hand_metrics(scores, target, exclude)
    assert got == pytest.approx({f"val/{k}": v for k, v in hand.items()}, abs=1e-6)
    unmasked = _hand_metrics(scores, target, torch.zeros_like(exclude))
    assert hand["ndcg@10"] > unmasked["ndcg@10"]  # masking the seen best item moves user 1's positive up


def test_shared_negative_pool_passes_the_mask_to_the_loss():
    loss = losses.SampledSoftmaxLoss(temperature=0.1)
    m = _model(loss)
    b = {"user": torch.tensor([0, 1, 2]), "item": torch.tensor([3, 4, 5]), "neg_items": torch.tensor([6, 7, 8, 9]),
         "neg_mask": torch.tensor([[True, False, True, True], [True, True, True, True], [False, True, True, False]])}
    P = F.normalize(m.user_embedding.weight, dim=1)
    Q = F.normalize(m.item_embedding.weight, dim=1)
    pos = (P[b["user"]] * Q[b["item"]]).sum(1)
    neg = P[b["user"]] @ Q[b["neg_items"]].T
    torch.testing.assert_close(m._train_loss(b), loss(pos, neg, neg_mask=b["neg_mask"]))
    # by hand: log(1 + sum over valid negatives of exp(0.5 (neg - pos) / 0.1))
    rows = [torch.log1p(sum(torch.exp(0.5 * (neg[i, j] - pos[i]) / 0.1) for j in range(4) if b["neg_mask"][i, j]))
            for i in range(3)]
    torch.testing.assert_close(m._train_loss(b), torch.stack(rows).mean())
    # the S route on the same batch: masked pool items get a floor score, the positive is column 0
    s_loss = losses.InfoNCELoss(temperature=0.1)
    ms = _model(s_loss)
    scores = torch.cat([pos[:, None], neg.masked_fill(~b["neg_mask"], -1e4)], 1)
    torch.testing.assert_close(ms._train_loss(b), F.cross_entropy(scores / 0.1, torch.zeros(3, dtype=torch.long)))
