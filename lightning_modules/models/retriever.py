"""Dual-encoder retriever: two trainable towers over frozen (cached) MiniLM embeddings.

Each tower is a linear map initialised to the identity, so before training the model *is* the
frozen encoder (zero-shot). Training batches come from
:class:`~lightning_modules.data.retrieval.RetrievalDataModule`: B queries, K keys (the union of
their positives, i.e. in-batch negatives, plus any sampled negatives) and a ``(B, K)`` positive
mask. The loss is routed by its registry declaration (never by name):

* ``"scores"`` (decoupled softmax, InfoNCE, soft top-k): ``loss(query, keys, target)`` when the
  registry entry declares ``query_keys`` (the docs/losses/decoupled_softmax.md modules, which score
  with ``losses.in_batch_scores`` and can all-gather keys), else ``loss(query @ keys.T, target)``.
* ``"pairs"`` (PSL, sampled softmax, BPR): the labelled positive's score against every other key
  of the row that is not a positive (``neg_mask``).
* ``"logits"``: ``logit_scale · query @ keys.T`` with the labelled positive's column as the class.
* ``"embeddings"`` with a head (NBC-softmax, ...): queries and keys are embedded together and labelled
  with their training-corpus document id (a query with its labelled positive), so each
  training document is a class of the head.

Evaluation (validation and test): at the start of each epoch the corpus of the stage
(``datamodule.corpus_embeddings(stage)``) is passed through the document tower, L2-normalised
and put in a ``faiss.IndexFlatIP``; each query batch is searched exactly (by cosine; a loss with its own
prediction rule, ``predict_proba``, ranks the corpus by that rule instead:
:func:`~lightning_modules.routing.predict_scores`) and scored with R@1,
R@10, MRR@10 and nDCG@10 (every positive counts; :mod:`lightning_modules.retrieval_metrics`).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from losses import InputKind

from ..base import BenchmarkModule
from ..routing import has_own_prediction, predict_scores
from ..retrieval_metrics import FaissIndex, candidates_from_search, retrieval_metrics

__all__ = ["DualEncoderRetriever"]


def _identity_linear(input_dim: int, output_dim: int) -> nn.Linear:
    layer = nn.Linear(input_dim, output_dim)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(output_dim, input_dim))
        layer.bias.zero_()
    return layer


class DualEncoderRetriever(BenchmarkModule):
    """Query and document towers over precomputed text embeddings.

    Args:
        loss: a loss of kind ``"scores"``, ``"pairs"``, ``"logits"``, or ``"embeddings"`` with a
            head (see the module docstring).
        input_dim: width of the cached embeddings (linked from the DataModule: 384).
        embedding_dim: output width of the towers (linked into a head-owning loss's
            ``embedding_dim``); equal to ``input_dim`` gives an exact identity initialisation,
            otherwise the towers start as the leading rows / columns of the identity.
        shared_towers: one tower for queries and documents.
        normalize: L2-normalise the tower outputs before the loss (cosine scores); evaluation
            always searches with cosines.
        logit_scale: multiplies the scores handed to ``"logits"`` losses.
        lr, weight_decay: AdamW.
        zero_shot_reference: at test, also search the raw frozen embeddings (no tower, cosine,
            exact) and log their metrics as ``test/<metric>_zero_shot`` (``r@1_zero_shot``, ...):
            what the frozen encoder gives before any training, where the identity-initialised
            towers start; the competence floor of the reproduction's retrieval claims.
    """

    loss_kinds = (InputKind.SCORES, InputKind.PAIRS, InputKind.LOGITS, InputKind.EMBEDDINGS)
    loss_task = "the towers"
    loss_hint = "use a scores, pairs or logits loss, or an embeddings loss that owns a head"

    def __init__(
        self,
        loss: nn.Module,
        input_dim: int = 384,
        embedding_dim: int = 384,
        shared_towers: bool = False,
        normalize: bool = True,
        logit_scale: float = 20.0,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        zero_shot_reference: bool = False,
    ) -> None:
        super().__init__(loss, lr=lr, weight_decay=weight_decay)
        if not isinstance(zero_shot_reference, bool):
            raise ValueError(f"DualEncoderRetriever: zero_shot_reference must be True or False (got "
                             f"{zero_shot_reference!r}); True also scores the frozen encoder's own search at test")
        self.zero_shot_reference = zero_shot_reference
        self._raw_index: Optional[FaissIndex] = None
        if input_dim < 1 or embedding_dim < 1:
            raise ValueError(f"DualEncoderRetriever: input_dim and embedding_dim must be >= 1 (got {input_dim}, "
                             f"{embedding_dim}); input_dim is linked from the DataModule by the CLI")
        self.loss = loss
        self.normalize = bool(normalize)
        self.logit_scale = float(logit_scale)
        self.query_tower = _identity_linear(input_dim, embedding_dim)
        self.doc_tower = self.query_tower if shared_towers else _identity_linear(input_dim, embedding_dim)
        self._three_tensor_loss = self.route.query_keys  # the route says what forward takes
        self._train_loss = {InputKind.SCORES: self._scores_loss, InputKind.PAIRS: self._pair_loss,
                            InputKind.LOGITS: self._logits_loss, InputKind.EMBEDDINGS: self._head_loss}[self.route.kind]
        self.eval_metrics = nn.ModuleDict({stage: retrieval_metrics().clone(prefix=f"{stage}/")
                                           for stage in ("val", "test")})
        self.zero_shot_metrics = retrieval_metrics().clone(prefix="test/", postfix="_zero_shot")
        self.eval_k = 10
        self._index: Optional[FaissIndex] = None
        self._corpus: Optional[Tensor] = None

    # -- towers -------------------------------------------------------------------------------
    def _prep(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=-1) if self.normalize else x

    def encode_queries(self, x: Tensor) -> Tensor:
        return self._prep(self.query_tower(x))

    def encode_documents(self, x: Tensor) -> Tensor:
        return self._prep(self.doc_tower(x))

    def forward(self, queries: Tensor) -> Tensor:
        return self.encode_queries(queries)

    # -- losses by route ----------------------------------------------------------------------
    def _scores_loss(self, batch: Dict[str, Tensor], q: Tensor, k: Tensor) -> Tensor:
        if self._three_tensor_loss:
            return self.loss(q, k, batch["target"])
        return self.loss(q @ k.T, batch["target"])

    def _pair_loss(self, batch: Dict[str, Tensor], q: Tensor, k: Tensor) -> Tensor:
        scores = q @ k.T
        pos = scores.gather(1, batch["label_pos"][:, None]).squeeze(1)
        return self.loss(pos, scores, neg_mask=~batch["target"])

    def _logits_loss(self, batch: Dict[str, Tensor], q: Tensor, k: Tensor) -> Tensor:
        return self.loss(self.logit_scale * (q @ k.T), batch["label_pos"])

    def _head_loss(self, batch: Dict[str, Tensor], q: Tensor, k: Tensor) -> Tensor:
        return self.loss(torch.cat([q, k]), torch.cat([batch["label"], batch["key_ids"]]))

    def training_step(self, batch: Dict[str, Tensor], batch_idx: int) -> Tensor:
        q = self.encode_queries(batch["query"])
        k = self.encode_documents(batch["keys"])
        loss = self._train_loss(batch, q, k)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=q.shape[0])
        return loss

    # -- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def index_corpus(self, corpus: Tensor, *, chunk: int = 4096) -> FaissIndex:
        """Encode ``corpus`` (raw embeddings ``(M, input_dim)``) with the document tower and build
        the exact inner-product index searched by the evaluation steps."""
        corpus = corpus.to(self.device)
        vecs = torch.cat([self.encode_documents(corpus[i:i + chunk]) for i in range(0, len(corpus), chunk)])
        self._index = FaissIndex(vecs)
        # a loss with its own prediction rule ranks the whole corpus itself (search)
        self._corpus = F.normalize(vecs.float(), dim=1) if has_own_prediction(self.loss) else None
        return self._index

    @torch.no_grad()
    def search(self, queries: Tensor, k: int):
        """``(scores, ids)`` of the top ``k`` documents of the indexed corpus for encoded ``queries``,
        by cosine (the exact FAISS search); for a loss with its own prediction rule, by
        :func:`~lightning_modules.routing.predict_scores` of what the loss takes as input (the
        cosines, times ``logit_scale`` for a logits loss) over the whole corpus."""
        if self._corpus is None:
            return self._index.search(queries, k)
        cos = F.normalize(queries.float(), dim=1) @ self._corpus.to(queries.device).T
        scores = predict_scores(self.loss, self.logit_scale * cos if self.route.kind == InputKind.LOGITS else cos)
        top = scores.topk(min(int(k), scores.shape[1]), dim=1)
        return top.values.cpu(), top.indices.cpu()

    def _index_stage(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is None or not hasattr(dm, "corpus_embeddings"):
            if self._index is None:
                raise RuntimeError("DualEncoderRetriever: evaluation needs a corpus; use a DataModule with "
                                   "corpus_embeddings(stage) (RetrievalDataModule) or call index_corpus() first")
            return
        self.index_corpus(dm.corpus_embeddings(stage))

    def on_validation_epoch_start(self) -> None:
        self._index_stage("validate")

    def on_test_epoch_start(self) -> None:
        self._index_stage("test")
        self._raw_index = None
        if self.zero_shot_reference:
            dm = getattr(self.trainer, "datamodule", None)
            if dm is None or not hasattr(dm, "corpus_embeddings"):
                raise ValueError("DualEncoderRetriever: zero_shot_reference needs a DataModule with "
                                 "corpus_embeddings(stage) (RetrievalDataModule); or turn it off")
            self._raw_index = FaissIndex(F.normalize(dm.corpus_embeddings("test").float(), dim=1))

    def _eval_step(self, stage: str, batch: Dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        metrics = self.eval_metrics[stage]
        q = self.encode_queries(batch["query"])
        scores, ids = self.search(q, self.eval_k)
        preds, target, indexes = candidates_from_search(scores, ids, batch["positives"].cpu(), batch["query_ids"].cpu())
        metrics.update(preds.to(self.device), target.to(self.device), indexes=indexes.to(self.device))
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=q.shape[0])
        if stage == "test" and self._raw_index is not None:  # the frozen encoder alone, same queries
            raw = F.normalize(batch["query"].float(), dim=1)
            rs, ri = self._raw_index.search(raw, self.eval_k)
            p, t, i = candidates_from_search(rs, ri, batch["positives"].cpu(), batch["query_ids"].cpu())
            self.zero_shot_metrics.update(p.to(self.device), t.to(self.device), indexes=i.to(self.device))
            self.log_dict(self.zero_shot_metrics, on_step=False, on_epoch=True, batch_size=q.shape[0])
        records = self._item_records(stage)
        if records is not None:
            from ..records import ranking_per_query

            row = ranking_per_query(preds, target, indexes, [(n, kind, k, 0.0) for n, kind, k in RECORD_METRICS])
            row["item"] = row.pop("query")
            records.add("queries", **row)

    def item_record_spec(self) -> Dict[str, Any]:
        """Per-item test records: one row per test query (``lightning_modules.records``)."""
        cols = {"item": "query id", "n_pos": "the query's positive documents"}
        metrics = {}
        for name, kind, k in RECORD_METRICS:
            cols[name] = f"{kind}@{k} of the query"
            metrics[f"test/{name}"] = {"table": "queries", "agg": "mean", "columns": [name]}
        return {"kind": "retrieval", "tables": {"queries": {"columns": cols}}, "metrics": metrics,
                "notes": "each metric is the mean over queries"}


#: the logged evaluation metrics as (name, kind, cut-off), recomputed per query for the test records
RECORD_METRICS = (("r@1", "recall", 1), ("r@10", "recall", 10), ("mrr@10", "mrr", 10), ("ndcg@10", "ndcg", 10))

