"""Matrix-factorisation recommender trained with any registered ranking / classification loss.

The loss is routed by its registry declaration (:func:`~lightning_modules.routing.loss_route`),
never by its name:

* ``"pairs"`` (PSL, sampled softmax, BPR): ``pos_scores (B,)`` = s(u, i⁺) and ``neg_scores (B, N)``
  = s(u, i⁻) against the batch's sampled negatives (the ``"pairs"`` view with
  ``num_negatives > 0``; a pool shared by the batch comes with ``neg_mask``, handed to the
  loss). ``score="cosine"`` scores with cosines, as the PSL paper does.
* ``"logits"`` (full softmax = ``cross_entropy`` over items, or any logits loss): logits
  ``logit_scale · s(u, every item)`` and the positive item as the class id.
* ``"embeddings"`` with a head (Partial FC, margin softmax, ...): the loss owns the item centres; it gets
  the user embeddings and the positive item ids as class ids, and evaluation ranks items by the
  loss's ``.logits(user_embeddings)``. The model then has no item table of its own.
* ``"scores"`` (decoupled softmax, InfoNCE, soft top-k): with the ``"users"`` view (a user and all its
  training items as positives) the scores are s(u, every item) with the multi-hot target; with
  the ``"pairs"`` view they are ``[s(u, i⁺), s(u, i⁻_1..N)]`` with the positive in column 0.

Evaluation ranks every item for each user with the user's other known items masked and reports
Recall@20, NDCG@20, HR@10 and NDCG@10 (:mod:`lightning_modules.retrieval_metrics`), with separate
metric objects for validation and test.
"""

from __future__ import annotations

from typing import Dict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from losses import InputKind

from ..base import BenchmarkModule
from ..retrieval_metrics import candidates_from_scores, log_data_meta, recommendation_metrics
from ..routing import loss_route
from ..base import clean_linked_hparams

__all__ = ["Recommender"]

SCORES = ("cosine", "dot")
#: The input kinds a recommender routes (the loss must also train alone).
_KINDS = (InputKind.PAIRS, InputKind.LOGITS, InputKind.SCORES, InputKind.EMBEDDINGS)


class Recommender(BenchmarkModule):
    """Matrix factorisation ``s(u, i) = <p_u, q_i>`` (or their cosine) with a pluggable loss.

    Args:
        loss: any loss module of kind ``"pairs"``, ``"logits"``, ``"scores"``, or
            ``"embeddings"`` with a head (see the module docstring); ``"model"``, auxiliary and
            head-less embedding losses are rejected
            (:meth:`~lightning_modules.routing.LossRoute.require_main`).
        num_users, num_items: table sizes (linked from the DataModule by the CLI).
        embedding_dim: factor dimension (linked into a head-owning loss's ``embedding_dim``).
        score: ``"cosine"`` or ``"dot"``.
        logit_scale: multiplies the scores handed to ``"logits"`` losses (cosines need a scale for a
            softmax, e.g. 10-20; leave 1 for dot scores).
        init_std: standard deviation of the normal initialisation of the tables.
        lr, weight_decay: AdamW.
    """

    def __init__(
        self,
        loss: nn.Module,
        num_users: int = 0,
        num_items: int = 0,
        embedding_dim: int = 64,
        score: str = "cosine",
        logit_scale: float = 1.0,
        init_std: float = 0.1,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(lr=lr, weight_decay=weight_decay)
        self.save_hyperparameters()
        if num_users < 1 or num_items < 1:
            raise ValueError(f"Recommender: num_users and num_items must be >= 1 (got {num_users}, {num_items}); "
                             "they are linked from the DataModule by the CLI, or pass them")
        if score not in SCORES:
            raise ValueError(f"Recommender: score must be one of {SCORES} (got {score!r})")
        self.loss = loss
        self.route = loss_route(loss)
        self.route.require_main("Recommender", _KINDS, task="a recommender",
                                hint="use a pairs, logits or scores loss, or an embeddings loss that owns a head")
        self.score = score
        self.logit_scale = float(logit_scale)
        self.user_embedding = nn.Embedding(num_users, embedding_dim)
        nn.init.normal_(self.user_embedding.weight, std=init_std)
        # a head-owning loss holds the item centres itself
        self.item_embedding = None if self.route.owns_head else nn.Embedding(num_items, embedding_dim)
        if self.item_embedding is not None:
            nn.init.normal_(self.item_embedding.weight, std=init_std)
        self.num_items = num_items
        self.val_metrics = recommendation_metrics().clone(prefix="val/")
        self.test_metrics = recommendation_metrics().clone(prefix="test/")
        self._train_loss = {InputKind.PAIRS: self._pair_loss, InputKind.LOGITS: self._logits_loss,
                            InputKind.SCORES: self._scores_loss, InputKind.EMBEDDINGS: self._head_loss}[self.route.kind]
        clean_linked_hparams(self)  # re-instantiable hparams after the CLI's size links

    # -- scoring ------------------------------------------------------------------------------
    def _prep(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=-1) if self.score == "cosine" else x

    def user_vectors(self, users: Tensor) -> Tensor:
        return self.user_embedding(users)

    def all_item_scores(self, users: Tensor) -> Tensor:
        """Scores of every item for ``users``: ``(B, num_items)``."""
        u = self.user_vectors(users)
        if self.route.owns_head:
            return self.loss.logits(u)
        return self._prep(u) @ self._prep(self.item_embedding.weight).T

    def forward(self, users: Tensor) -> Tensor:
        return self.all_item_scores(users)

    # -- losses by route ----------------------------------------------------------------------
    @staticmethod
    def _need(batch: Dict[str, Tensor], key: str, hint: str) -> Tensor:
        if key not in batch:
            raise ValueError(f"Recommender: this loss needs `{key}` in the training batch ({hint}); "
                             f"got keys {sorted(batch)}")
        return batch[key]

    def _pos_neg(self, batch: Dict[str, Tensor]):
        users = self._need(batch, "user", "use MovieLensDataModule")
        items = self._need(batch, "item", "use train_view='pairs'")
        neg = self._need(batch, "neg_items", "use train_view='pairs' with num_negatives > 0")
        u = self._prep(self.user_vectors(users))
        pos = (u * self._prep(self.item_embedding(items))).sum(-1)
        if neg.dim() == 1:  # one pool shared by the batch (negative_sharing="batch")
            negs = u @ self._prep(self.item_embedding(neg)).T
        else:
            negs = torch.einsum("bd,bnd->bn", u, self._prep(self.item_embedding(neg)))
        return pos, negs

    def _pair_loss(self, batch: Dict[str, Tensor]) -> Tensor:
        pos, neg = self._pos_neg(batch)
        if "neg_mask" in batch:
            return self.loss(pos, neg, neg_mask=batch["neg_mask"])
        return self.loss(pos, neg)

    def _logits_loss(self, batch: Dict[str, Tensor]) -> Tensor:
        items = self._need(batch, "item", "use train_view='pairs'")
        return self.loss(self.logit_scale * self.all_item_scores(batch["user"]), items)

    def _head_loss(self, batch: Dict[str, Tensor]) -> Tensor:
        items = self._need(batch, "item", "use train_view='pairs'")
        return self.loss(self.user_vectors(batch["user"]), items)

    def _scores_loss(self, batch: Dict[str, Tensor]) -> Tensor:
        if "target" in batch:  # users view: every training item of the user is a positive
            return self.loss(self.all_item_scores(batch["user"]), batch["target"])
        pos, neg = self._pos_neg(batch)
        if "neg_mask" in batch:  # the user's own training items leave the shared pool (a finite
            neg = neg.masked_fill(~batch["neg_mask"], -1e4)  # floor: -inf fails the losses' data checks
        scores = torch.cat([pos[:, None], neg], dim=1)
        return self.loss(scores, torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device))

    # -- Lightning ----------------------------------------------------------------------------
    def training_step(self, batch: Dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self._train_loss(batch)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=batch["user"].numel())
        return loss

    def _eval_step(self, batch: Dict[str, Tensor], metrics) -> None:
        scores = self.all_item_scores(batch["user"])
        preds, target, indexes = candidates_from_scores(scores, batch["target"], batch["user"], k=20,
                                                        exclude=batch.get("exclude"))
        metrics.update(preds, target, indexes=indexes)
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=batch["user"].numel())

    def on_fit_start(self) -> None:
        log_data_meta(self)  # data set counts and sys.version go with every result

    def on_test_start(self) -> None:
        log_data_meta(self)

    def validation_step(self, batch: Dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, self.val_metrics)

    def test_step(self, batch: Dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, self.test_metrics)
