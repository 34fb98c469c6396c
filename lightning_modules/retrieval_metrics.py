"""Ranking metrics for the recommendation and dense-retrieval benchmarks.

Both benchmarks score with torchmetrics' retrieval metrics, fed a compressed candidate list per
query: the ``k`` best-scored candidates plus every positive (a positive outside the top ``k``
keeps a score below the ``k``-th). For any metric whose cut-off is at most ``k`` (Recall@k,
HitRate@k, nDCG@k, MRR@k) this list gives the same value as the full ranking, with a
fraction of the memory. Excluded candidates (a user's already-seen items) are removed before
ranking.

The candidates carry *rank-based* positive scores (``n - position``), not the raw scores:
torchmetrics (1.9) ``RetrievalRecall`` and ``RetrievalMRR`` count a positive only when its
predicted score is > 0, which would silently drop positives with negative cosine / dot scores,
and ``RetrievalNormalizedDCG`` averages over tied scores. Ranks make every metric see the same
strict order (ties broken by a stable sort: the lower column first).

* Recommendation: ``recall@20``, ``ndcg@20``, ``hr@10``, ``ndcg@10`` over all items.
* Retrieval: ``r@1``, ``r@10`` (recall: the fraction of a query's positives in the top k),
  ``mrr@10`` and ``ndcg@10`` (binary relevance, every positive counts); with one positive per
  query R@k is the hit rate.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.retrieval import RetrievalHitRate, RetrievalMRR, RetrievalNormalizedDCG, RetrievalRecall

__all__ = [
    "recommendation_metrics",
    "retrieval_metrics",
    "candidates_from_scores",
    "candidates_from_search",
    "FaissIndex",
    "brute_force_search",
]


def recommendation_metrics() -> MetricCollection:
    """Recall@20, NDCG@20 (the PSL paper's metrics), HR@10 and NDCG@10."""
    return MetricCollection({
        "recall@20": RetrievalRecall(top_k=20),
        "ndcg@20": RetrievalNormalizedDCG(top_k=20),
        "hr@10": RetrievalHitRate(top_k=10),
        "ndcg@10": RetrievalNormalizedDCG(top_k=10),
    })


def retrieval_metrics() -> MetricCollection:
    """R@1, R@10, MRR@10, nDCG@10."""
    return MetricCollection({
        "r@1": RetrievalRecall(top_k=1),
        "r@10": RetrievalRecall(top_k=10),
        "mrr@10": RetrievalMRR(top_k=10),
        "ndcg@10": RetrievalNormalizedDCG(top_k=10),
    })


def candidates_from_scores(scores: Tensor, target: Tensor, query_ids: Tensor, k: int,
                           exclude: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Flat ``(preds, target, indexes)`` for torchmetrics from full score rows.

    ``scores (B, L)``; ``target (B, L)`` bool positives; ``query_ids (B,)`` global query ids;
    ``exclude (B, L)`` bool entries removed from the ranking (they are never candidates, and
    an excluded positive is not counted). Keeps, per row, the top ``k`` non-excluded scores and
    every non-excluded positive.
    """
    scores = scores.detach().float()
    target = target.bool()
    if exclude is not None:
        target = target & ~exclude
        scores = scores.masked_fill(exclude, float("-inf"))
    n = scores.shape[1]
    order = scores.argsort(dim=1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(n, device=order.device).expand_as(order))
    keep = (rank < min(int(k), n)) | target
    if exclude is not None:
        keep &= ~exclude
    rows, cols = keep.nonzero(as_tuple=True)
    preds = (n - rank[rows, cols]).to(torch.float64)  # >= 1, larger = better, strict order
    return preds, target[rows, cols], query_ids.to(scores.device).long()[rows]


def candidates_from_search(scores: Tensor, ids: Tensor, positives: Tensor,
                           query_ids: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Flat ``(preds, target, indexes)`` from a top-k search result.

    ``scores, ids (B, k)``: the search's scores and document ids (``-1`` = no result);
    ``positives (B, P)``: each query's positive document ids, padded with ``-1``. Positives the
    search did not return are appended below every returned result, so metrics with a cut-off
    <= k see their true (missed) status and recall's denominator counts them.
    """
    k = ids.shape[1]
    valid = ids >= 0
    hit = (ids[:, :, None] == positives[:, None, :]) & (positives[:, None, :] >= 0) & valid[:, :, None]
    ret_target = hit.any(2) & valid
    found = hit.any(1)  # (B, P)
    missing = (positives >= 0) & ~found
    # rank-based scores: the search's j-th result gets k + 1 - j (>= 2), a missed positive 1
    order = torch.sort(scores.float().masked_fill(~valid, float("-inf")), dim=1, descending=True, stable=True)
    rank = torch.empty_like(order.indices)
    dev = ids.device  # the search may have run on a GPU
    rank.scatter_(1, order.indices, torch.arange(k, device=dev).expand_as(order.indices))
    position = (k + 1 - rank).to(torch.float64)
    b = torch.arange(ids.shape[0], device=dev).unsqueeze(1)
    r_rows = b.expand_as(ids)[valid]
    m_rows = b.expand_as(positives)[missing]
    preds = torch.cat([position[valid], torch.ones(len(m_rows), dtype=torch.float64, device=dev)])
    target = torch.cat([ret_target[valid], torch.ones(len(m_rows), dtype=torch.bool, device=dev)])
    indexes = query_ids.long()[torch.cat([r_rows, m_rows])]
    return preds, target, indexes


class FaissIndex:
    """Exact inner-product search (``faiss.IndexFlatIP``) over L2-normalised vectors."""

    def __init__(self, corpus: Tensor) -> None:
        try:
            import faiss
        except ImportError as exc:
            raise ImportError("FaissIndex: retrieval evaluation needs the `faiss-cpu` package; install it with "
                              "`pip install faiss-cpu`") from exc

        vecs = torch.nn.functional.normalize(corpus.detach().float().cpu(), dim=1).numpy()
        self.index = faiss.IndexFlatIP(vecs.shape[1])
        self.index.add(np.ascontiguousarray(vecs))
        self.size = vecs.shape[0]

    def search(self, queries: Tensor, k: int) -> Tuple[Tensor, Tensor]:
        q = torch.nn.functional.normalize(queries.detach().float().cpu(), dim=1).numpy()
        scores, ids = self.index.search(np.ascontiguousarray(q), min(int(k), self.size))
        return torch.from_numpy(scores), torch.from_numpy(ids).long()


def brute_force_search(corpus: Tensor, queries: Tensor, k: int) -> Tuple[Tensor, Tensor]:
    """The torch equivalent of :class:`FaissIndex` (for tests and small corpora)."""
    c = torch.nn.functional.normalize(corpus.float(), dim=1)
    q = torch.nn.functional.normalize(queries.float(), dim=1)
    return (q @ c.T).topk(min(int(k), c.shape[0]), dim=1)
