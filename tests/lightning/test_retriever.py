"""DualEncoderRetriever: identity towers, routing of every loss kind, and the faiss evaluation
against a brute-force torch computation (multi-positive aware)."""

from __future__ import annotations

import math

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torchmetrics.retrieval import RetrievalMRR, RetrievalNormalizedDCG, RetrievalRecall

import losses
from lightning_modules.data import RetrievalDataModule
from lightning_modules.models import DualEncoderRetriever
from lightning_modules.retrieval_metrics import (
    FaissIndex,
    brute_force_search,
    candidates_from_search,
    retrieval_metrics,
)


def _hand(scores, positives):
    """R@1, R@10, MRR@10, nDCG@10 over a full score matrix by explicit loops."""
    out = {"r@1": [], "r@10": [], "mrr@10": [], "ndcg@10": []}
    for s, pos in zip(scores.tolist(), positives):
        ranked = sorted(range(len(s)), key=lambda j: -s[j])
        rel = [1 if j in pos else 0 for j in ranked]
        out["r@1"].append(sum(rel[:1]) / len(pos))
        out["r@10"].append(sum(rel[:10]) / len(pos))
        first = next((i for i, r in enumerate(rel[:10]) if r), None)
        out["mrr@10"].append(0.0 if first is None else 1.0 / (first + 1))
        dcg = sum(r / math.log2(i + 2) for i, r in enumerate(rel[:10]))
        ideal = sum(1 / math.log2(i + 2) for i in range(min(len(pos), 10)))
        out["ndcg@10"].append(dcg / ideal)
    return {k: sum(v) / len(v) for k, v in out.items()}


def _positives(g, n_queries, n_docs):
    pos = []
    for _ in range(n_queries):
        n = int(torch.randint(1, 4, (1,), generator=g))
        pos.append(sorted(torch.randperm(n_docs, generator=g)[:n].tolist()))
    return pos


def test_faiss_search_matches_brute_force_and_hand_metrics():
    g = torch.Generator().manual_seed(0)
    corpus, queries = torch.randn(60, 8, generator=g), torch.randn(25, 8, generator=g)
    # make some positives easy to find so that the metrics are not all ~0
    positives = _positives(g, 25, 60)
    for i in range(0, 25, 2):
        queries[i] = corpus[positives[i][0]] + 0.3 * queries[i]
    index = FaissIndex(corpus)
    f_scores, f_ids = index.search(queries, 10)
    b_scores, b_ids = brute_force_search(corpus, queries, 10)
    assert torch.equal(f_ids, b_ids)
    torch.testing.assert_close(f_scores, b_scores, atol=1e-5, rtol=1e-5)

    padded = torch.full((25, 3), -1, dtype=torch.long)
    for i, p in enumerate(positives):
        padded[i, : len(p)] = torch.tensor(p)
    metrics = retrieval_metrics()
    for rows in (slice(0, 10), slice(10, 25)):
        qids = torch.arange(25)[rows]
        preds, target, idx = candidates_from_search(f_scores[rows], f_ids[rows], padded[rows], qids)
        metrics.update(preds, target, indexes=idx)
    got = {k: float(v) for k, v in metrics.compute().items()}
    full = F.normalize(queries, dim=1) @ F.normalize(corpus, dim=1).T
    hand = _hand(full, positives)
    assert got == pytest.approx(hand, abs=1e-6)
    assert 0.1 < hand["r@10"] < 1.0 and hand["mrr@10"] > 0.1
    # and torchmetrics on the full score matrix (shifted positive: torchmetrics' recall and MRR
    # ignore positives scored <= 0)
    target = torch.zeros(25, 60, dtype=torch.bool)
    for i, p in enumerate(positives):
        target[i, p] = True
    idx = torch.arange(25)[:, None].expand(25, 60)
    shifted = (full + 2.0).flatten()
    for name, m in {"r@1": RetrievalRecall(top_k=1), "r@10": RetrievalRecall(top_k=10),
                    "mrr@10": RetrievalMRR(top_k=10), "ndcg@10": RetrievalNormalizedDCG(top_k=10)}.items():
        assert float(m(shifted, target.flatten(), indexes=idx.flatten())) == pytest.approx(got[name], abs=1e-6)


def test_candidates_from_search_counts_missed_positives():
    # a top-10 search (cut-offs <= k are exact): positive 7 returned third, positive 1 missed
    scores = torch.linspace(0.9, -0.9, 10)[None]
    ids = torch.tensor([[4, 2, 7, 11, 12, 13, 14, 15, 16, 17]])
    positives = torch.tensor([[7, 1, -1]])
    preds, target, idx = candidates_from_search(scores, ids, positives, torch.tensor([3]))
    assert preds.tolist() == [float(v) for v in range(11, 0, -1)]
    assert target.tolist() == [False, False, True] + [False] * 7 + [True] and idx.tolist() == [3] * 11
    m = retrieval_metrics()
    m.update(preds, target, indexes=idx)
    got = {k: float(v) for k, v in m.compute().items()}
    assert got["r@1"] == 0.0 and got["r@10"] == pytest.approx(0.5) and got["mrr@10"] == pytest.approx(1 / 3)
    ideal = 1 + 1 / math.log2(3)
    assert got["ndcg@10"] == pytest.approx((1 / math.log2(4)) / ideal)
    # only the order of the scores matters, not their sign (torchmetrics ignores positives scored <= 0)
    preds2, _, _ = candidates_from_search(scores - 5.0, ids, positives, torch.tensor([3]))
    assert torch.equal(preds, preds2)


# -- the model ------------------------------------------------------------------------------------
D = 6


def _batch(g, B=4, K=7):
    target = torch.zeros(B, K, dtype=torch.bool)
    label_pos = torch.randperm(K, generator=g)[:B]
    target[torch.arange(B), label_pos] = True
    target[0, (label_pos[0] + 1) % K] = True  # a second positive for row 0
    return {"query": torch.randn(B, D, generator=g), "keys": torch.randn(K, D, generator=g), "target": target,
            "label_pos": label_pos, "key_ids": torch.arange(10, 10 + K), "label": 10 + label_pos}


def _model(loss, **kw):
    return DualEncoderRetriever(loss, input_dim=D, embedding_dim=D, **kw)


def test_towers_start_as_identity():
    m = _model(losses.InfoNCELoss())
    x = torch.randn(3, D)
    torch.testing.assert_close(m.encode_queries(x), F.normalize(x, dim=1))
    torch.testing.assert_close(m.encode_documents(x), F.normalize(x, dim=1))
    assert m.query_tower is not m.doc_tower
    shared = _model(losses.InfoNCELoss(), shared_towers=True)
    assert shared.query_tower is shared.doc_tower
    wide = DualEncoderRetriever(losses.InfoNCELoss(), input_dim=D, embedding_dim=D + 2, normalize=False)
    torch.testing.assert_close(wide.encode_queries(x), torch.cat([x, torch.zeros(3, 2)], 1))


@pytest.mark.parametrize("loss", [losses.DecoupledSoftmaxLoss(), losses.InfoNCELoss(positive_normalization="mean"),
                                  losses.SoftTopKLoss(k=2)], ids=["decoupled", "infonce", "soft_topk"])
def test_scores_route_in_batch(loss):
    torch.manual_seed(0)
    m = _model(loss)
    with torch.no_grad():
        m.query_tower.weight.add_(0.1 * torch.randn(D, D))
    b = _batch(torch.Generator().manual_seed(1))
    q = F.normalize(m.query_tower(b["query"]), dim=1)
    k = F.normalize(m.doc_tower(b["keys"]), dim=1)
    expected = loss(q @ k.T, b["target"])
    torch.testing.assert_close(m._train_loss(b, q, k), expected)
    assert m._three_tensor_loss  # the docs/losses/decoupled_softmax.md modules take forward(query, keys, target)
    # an S loss whose forward takes (scores, target) only gets the in-batch score matrix
    m._three_tensor_loss = False
    torch.testing.assert_close(m._train_loss(b, q, k), expected)


def test_query_keys_form_comes_from_the_route():
    """The registry entry, not forward's signature, says whether a scores loss takes (query, keys, target)."""
    from lightning_modules.routing import loss_route

    assert loss_route(losses.InfoNCELoss()).query_keys and _model(losses.InfoNCELoss())._three_tensor_loss
    assert not loss_route(losses.BPRLoss()).query_keys and not _model(losses.BPRLoss())._three_tensor_loss


def test_pair_route_masks_other_positives():
    loss = losses.BPRLoss()
    m = _model(loss)
    b = _batch(torch.Generator().manual_seed(2))
    q, k = F.normalize(b["query"], dim=1), F.normalize(b["keys"], dim=1)
    s = q @ k.T
    terms = []
    for i in range(4):
        p = s[i, b["label_pos"][i]]
        terms += [F.softplus(s[i, j] - p) for j in range(7) if not b["target"][i, j]]
    torch.testing.assert_close(m._train_loss(b, q, k), torch.stack(terms).mean())


def test_logits_and_head_routes():
    b = _batch(torch.Generator().manual_seed(3))
    q, k = F.normalize(b["query"], dim=1), F.normalize(b["keys"], dim=1)
    m = _model(losses.CrossEntropyLoss(), logit_scale=5.0)
    torch.testing.assert_close(m._train_loss(b, q, k), F.cross_entropy(5.0 * q @ k.T, b["label_pos"]))
    head = losses.NBCSoftmaxLoss(D, 20)
    m = _model(head)
    torch.testing.assert_close(m._train_loss(b, q, k),
                               head(torch.cat([q, k]), torch.cat([b["label"], b["key_ids"]])))
    with pytest.raises(ValueError, match="cannot train the towers"):
        _model(losses.OrthogonalProjectionLoss())


@pytest.fixture(scope="module")
def chatterbot():
    dm = RetrievalDataModule("chatterbot", eval_batch_size=64, seed=0)
    dm.prepare_data()
    return dm


def test_zero_shot_evaluation_equals_brute_force_over_the_raw_embeddings(chatterbot):
    dm = chatterbot
    m = DualEncoderRetriever(losses.InfoNCELoss())
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    res = trainer.test(m, datamodule=dm, verbose=False)[0]
    queries = dm._query_emb[dm._split_queries["test"]]
    full = F.normalize(queries, dim=1) @ F.normalize(dm.corpus_embeddings("test"), dim=1).T
    positives = [dm._eval_positives["test"][int(q)] for q in dm._split_queries["test"]]
    hand = _hand(full, positives)
    assert res == pytest.approx({f"test/{k}": v for k, v in hand.items()}, abs=1e-5)


def test_zero_shot_reference_is_the_raw_search_whatever_the_towers(chatterbot):
    """``zero_shot_reference``: at test, the frozen embeddings' own search beside the model's; with the
    identity towers both are the brute-force numbers, with moved towers only the model's change."""
    dm = chatterbot
    queries = dm._query_emb[dm._split_queries["test"]]
    full = F.normalize(queries, dim=1) @ F.normalize(dm.corpus_embeddings("test"), dim=1).T
    hand = _hand(full, [dm._eval_positives["test"][int(q)] for q in dm._split_queries["test"]])
    m = DualEncoderRetriever(losses.InfoNCELoss(), zero_shot_reference=True)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    res = trainer.test(m, datamodule=dm, verbose=False)[0]
    for k, v in hand.items():
        assert res[f"test/{k}"] == pytest.approx(v, abs=1e-5) and res[f"test/{k}_zero_shot"] == pytest.approx(v, abs=1e-5)
    with torch.no_grad():
        m.query_tower.weight.add_(0.2 * torch.randn(m.query_tower.weight.shape, generator=torch.Generator().manual_seed(0)))
    moved = trainer.test(m, datamodule=dm, verbose=False)[0]
    assert moved["test/ndcg@10"] != pytest.approx(hand["ndcg@10"], abs=1e-6)
    assert moved["test/ndcg@10_zero_shot"] == pytest.approx(hand["ndcg@10"], abs=1e-5)
    trainer.validate(m, datamodule=dm, verbose=False)
    assert not any("zero_shot" in k for k in trainer.callback_metrics)
    with pytest.raises(ValueError, match="zero_shot_reference must be True or False"):
        DualEncoderRetriever(losses.InfoNCELoss(), zero_shot_reference=1)


def test_evaluation_without_a_corpus_raises():
    m = _model(losses.InfoNCELoss())
    with pytest.raises(RuntimeError, match="needs a corpus"):
        m._index_stage("validate")
    m.index_corpus(torch.randn(5, D))
    m._index_stage("validate")  # an explicitly indexed corpus is used
    assert m._index.size == 5
