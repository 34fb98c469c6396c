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

Evaluation ranks every item for each user by the loss's own prediction rule
(:func:`~lightning_modules.routing.predict_scores`: its ``predict_proba`` where it has one, else the
scores) with the user's other known items masked and reports
Recall@20, NDCG@20, HR@10 and NDCG@10 (:mod:`lightning_modules.retrieval_metrics`), with separate
metric objects for validation and test; every held-out item of the user is a positive (recall =
the share of the user's held-out items in the top k, averaged over users).

``extra_metrics`` adds named metrics: ``recall@k`` / ``ndcg@k`` / ``hr@k`` for other cut-offs
(``k <= 100``), and the same on an evaluation *view* the DataModule attaches to its batches
(``batch["views"][name]``, a ``target`` / ``exclude`` pair): ``rare_recall@20`` (positives among
the rarest half of the items by training popularity) or ``debiased_recall@20`` (the
popularity-debiased test set). A view's metrics average over the users with at least one of its
positives and are logged only for the splits whose batches carry the view.

A shared pool may come with ``neg_replace (B, N)``: per-pair items that replace pool slots (the
false-negative stress setting), scored for those slots only. A batch with ``neg_injected (B, N)``
(the slots the stress replaced, either sharing) logs ``train/false_negative_share`` per epoch: the
share of the training negatives that were held-out positives of the user, the check that the
stress acted.

A loss that records its sampled classes (``.last_index``, Partial FC) gets two training metrics
per epoch: ``train/softmax_classes`` (classes in the step's softmax, mean over steps) and
``train/positive_classes`` (distinct positive items of the step's batch): the rest were sampled.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from losses import InputKind

from ..base import BenchmarkModule, seeded_init
from ..routing import has_own_prediction, head_logits, predict_scores
from ..retrieval_metrics import candidates_from_scores, recommendation_metrics
from torchmetrics import MetricCollection
from torchmetrics.retrieval import RetrievalHitRate, RetrievalNormalizedDCG, RetrievalRecall

__all__ = ["Recommender"]

SCORES = ("cosine", "dot")


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
        item_bias: add a trainable per-item bias to the scores (a class head's bias; e.g. for
            sigmoid losses such as BCE and GOL, whose negatives start far above their prior).
        item_bias_init: its initial value (GOL's configs start at -2).
        extra_metrics: further evaluation metrics (module docstring), e.g.
            ``["recall@1", "recall@5", "recall@10", "rare_recall@20"]``.
        init_seed: when set, the user and item tables (and the item bias) are initialised from
            ``torch.manual_seed(init_seed)`` (the global RNG is restored afterwards), so arms of a
            paired comparison start from the same tables whatever the loss.
        lr, weight_decay: AdamW.
        popularity_reference: at test, also rank every test user's items by their training
            popularity (the number of training interactions; the same known items excluded, ties
            broken by the lower item id) and log its ``recall@20`` / ``ndcg@20`` / ``hr@10`` /
            ``ndcg@10`` as ``test/<metric>_popularity``: a trained reference that needs no user
            model, the competence floor of the reproduction's recommendation claims. Needs a
            DataModule whose ``split`` has ``train_item_counts()`` (MovieLens).
    """

    loss_kinds = (InputKind.PAIRS, InputKind.LOGITS, InputKind.SCORES, InputKind.EMBEDDINGS)
    loss_task = "a recommender"
    loss_hint = "use a pairs, logits or scores loss, or an embeddings loss that owns a head"

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
        item_bias: bool = False,
        item_bias_init: float = 0.0,
        extra_metrics: Optional[List[str]] = None,
        init_seed: Optional[int] = None,
        popularity_reference: bool = False,
    ) -> None:
        super().__init__(loss, lr=lr, weight_decay=weight_decay)
        if not isinstance(popularity_reference, bool):
            raise ValueError(f"Recommender: popularity_reference must be True or False (got {popularity_reference!r}); "
                             "True also scores the training-popularity ranking at test")
        self.popularity_reference = popularity_reference
        self._popularity: Optional[Tensor] = None
        if num_users < 1 or num_items < 1:
            raise ValueError(f"Recommender: num_users and num_items must be >= 1 (got {num_users}, {num_items}); "
                             "they are linked from the DataModule by the CLI, or pass them")
        if score not in SCORES:
            raise ValueError(f"Recommender: score must be one of {SCORES} (got {score!r})")
        self.loss = loss
        self.score = score
        self.logit_scale = float(logit_scale)
        with seeded_init(init_seed):  # the same start for every loss (paired comparisons)
            self.user_embedding = nn.Embedding(num_users, embedding_dim)
            nn.init.normal_(self.user_embedding.weight, std=init_std)
            # a head-owning loss holds the item centres itself
            self.item_embedding = None if self.route.owns_head else nn.Embedding(num_items, embedding_dim)
            if self.item_embedding is not None:
                nn.init.normal_(self.item_embedding.weight, std=init_std)
        self.num_items = num_items
        if item_bias and self.route.owns_head:
            raise ValueError("Recommender: item_bias needs the model's own item table (this loss owns the head)")
        self.item_bias = nn.Parameter(torch.full((num_items,), float(item_bias_init))) if item_bias else None
        extra = parse_extra_metrics(list(extra_metrics or []))
        self._extra_spec = extra  # per view: (logged name, kind, k), for the per-user test records
        self._extra_k = max([20] + [k for items in extra.values() for _, _, k in items])
        # per evaluation stage; extra metrics by view ("all" = the plain split; a view's users
        # without positives are skipped)
        self.eval_extra = nn.ModuleDict({stage: nn.ModuleDict({
            v or "all": _collection(items, bool(v)).clone(prefix=f"{stage}/") for v, items in extra.items()})
            for stage in ("val", "test")})
        self.eval_metrics = nn.ModuleDict({stage: recommendation_metrics().clone(prefix=f"{stage}/")
                                           for stage in ("val", "test")})
        self.popularity_metrics = recommendation_metrics().clone(prefix="test/", postfix="_popularity")
        self._train_loss = {InputKind.PAIRS: self._pair_loss, InputKind.LOGITS: self._logits_loss,
                            InputKind.SCORES: self._scores_loss, InputKind.EMBEDDINGS: self._head_loss}[self.route.kind]

    # -- scoring ------------------------------------------------------------------------------
    def _prep(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=-1) if self.score == "cosine" else x

    def user_vectors(self, users: Tensor) -> Tensor:
        return self.user_embedding(users)

    def _item_table_scores(self, u: Tensor) -> Tensor:
        """The model's own head: ``s(u, every item)`` from its item table (and item bias)."""
        scores = self._prep(u) @ self._prep(self.item_embedding.weight).T
        return scores if self.item_bias is None else scores + self.item_bias

    def all_item_scores(self, users: Tensor) -> Tensor:
        """Scores of every item for ``users``: ``(B, num_items)``; the loss's ``.logits`` when it owns
        the head (:func:`~lightning_modules.routing.head_logits`)."""
        head = None if self.item_embedding is None else self._item_table_scores
        return head_logits(self.loss, self.route, self.user_vectors(users), head)

    def ranking_scores(self, users: Tensor) -> Tensor:
        """Item scores whose order is the loss's prediction (:func:`~lightning_modules.routing.predict_scores`):
        :meth:`all_item_scores` for a loss without a rule of its own; else the loss's
        ``predict_proba`` of what it takes as input (``logit_scale`` times the scores for a logits loss)."""
        scores = self.all_item_scores(users)
        if not has_own_prediction(self.loss):
            return scores
        return predict_scores(self.loss, self.logit_scale * scores if self.route.kind == InputKind.LOGITS else scores)

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
            replace = batch.get("neg_replace")
            if replace is not None:  # per-pair replacements of pool slots (false negatives)
                r, c = torch.nonzero(replace >= 0, as_tuple=True)
                vals = (u[r] * self._prep(self.item_embedding(replace[r, c]))).sum(-1)
                negs = negs.index_put((r, c), vals)
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
        loss = self.loss(self.user_vectors(batch["user"]), items)
        index = getattr(self.loss, "last_index", None)
        if isinstance(index, Tensor):  # how many classes the step's softmax saw (positives vs sampled)
            n = items.numel()
            self.log("train/softmax_classes", float(index.numel()), on_step=False, on_epoch=True, batch_size=n)
            self.log("train/positive_classes", float(torch.unique(items).numel()), on_step=False, on_epoch=True,
                     batch_size=n)
        return loss

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
        injected = batch.get("neg_injected")
        if isinstance(injected, Tensor):  # the false-negative stress: the share of negatives it replaced
            self.log("train/false_negative_share", injected.float().mean(), on_step=False, on_epoch=True,
                     batch_size=batch["user"].numel())
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=batch["user"].numel())
        return loss

    def _eval_step(self, stage: str, batch: Dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        metrics, extra = self.eval_metrics[stage], self.eval_extra[stage]
        scores = self.ranking_scores(batch["user"])
        users, n = batch["user"], batch["user"].numel()
        preds, target, indexes = candidates_from_scores(scores, batch["target"], users, k=self._extra_k,
                                                        exclude=batch.get("exclude"))
        metrics.update(preds, target, indexes=indexes)
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=n)
        if "all" in extra:
            extra["all"].update(preds, target, indexes=indexes)
            self.log_dict(extra["all"], on_step=False, on_epoch=True, batch_size=n)
        if stage == "test" and self.popularity_reference:
            pop = self._popularity_scores().to(scores.device).expand(n, -1).clone()
            p, t, i = candidates_from_scores(pop, batch["target"], users, k=20, exclude=batch.get("exclude"))
            self.popularity_metrics.update(p, t, indexes=i)
            self.log_dict(self.popularity_metrics, on_step=False, on_epoch=True, batch_size=n)
        records = self._item_records(stage)
        row = self._user_row(preds, target, indexes, "") if records is not None else None
        views = batch.get("views") or {}
        for name in VIEWS:
            if name in extra and name in views:
                v = views[name]
                p, t, i = candidates_from_scores(scores, v["target"], users, k=self._extra_k, exclude=v["exclude"])
                extra[name].update(p, t, indexes=i)
                self.log_dict(extra[name], on_step=False, on_epoch=True, batch_size=n)
                if row is not None:
                    self._add_view_columns(row, self._user_row(p, t, i, name))
        if row is not None:
            records.add("users", **row)

    def _popularity_scores(self) -> Tensor:
        """``(1, I)`` float64 scores of the popularity ranking: training interactions per item, ties
        broken by the lower item id (a fraction below 1 that decreases with the id)."""
        if self._popularity is None:
            dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
            split = getattr(dm, "split", None)
            if split is None or not callable(getattr(split, "train_item_counts", None)):
                raise ValueError("Recommender: popularity_reference needs a DataModule whose split has "
                                 f"train_item_counts() (got {type(dm).__name__}); use MovieLensDataModule or "
                                 "turn popularity_reference off")
            counts = split.train_item_counts().double()
            ids = torch.arange(counts.numel(), dtype=torch.float64)
            self._popularity = (counts + 0.5 * (1.0 - ids / counts.numel()))[None]
        return self._popularity

    # -- per-item test records (lightning_modules.records) ---------------------------------------
    def _record_metrics(self, view: str) -> List[Tuple[str, str, int]]:
        """(logged name, kind, k) of the metrics on ``view`` ("" = the plain split)."""
        main = [("recall@20", "recall", 20), ("ndcg@20", "ndcg", 20), ("hr@10", "hr", 10), ("ndcg@10", "ndcg", 10)]
        return (main if not view else []) + list(self._extra_spec.get(view, []))

    def _user_row(self, preds: Tensor, target: Tensor, indexes: Tensor, view: str) -> Dict[str, Tensor]:
        from ..records import ranking_per_query

        # the plain split counts a user without positives as 0 (torchmetrics' default), a view skips it
        empty = float("nan") if view else 0.0
        out = ranking_per_query(preds, target, indexes, [(n, kind, k, empty) for n, kind, k in self._record_metrics(view)])
        out["item"] = out.pop("query")
        out[f"{view}_n_pos" if view else "n_pos"] = out.pop("n_pos")
        return out

    @staticmethod
    def _add_view_columns(row: Dict[str, Tensor], view_row: Dict[str, Tensor]) -> None:
        """A view's columns, aligned with the plain split's users (``nan`` for a user the view lacks)."""
        pos = torch.searchsorted(view_row["item"], row["item"]).clamp_max(max(len(view_row["item"]) - 1, 0))
        found = view_row["item"][pos] == row["item"] if len(view_row["item"]) else torch.zeros_like(row["item"], dtype=torch.bool)
        for k, v in view_row.items():
            if k != "item":
                row[k] = torch.where(found, v[pos], torch.full_like(v[pos], float("nan"))) if len(v) else \
                    torch.full(row["item"].shape, float("nan"), dtype=torch.float64)

    def item_record_spec(self) -> Dict[str, Any]:
        """Per-item test records: one row per test user (``lightning_modules.records``)."""
        cols = {"item": "user id", "n_pos": "the user's held-out positives (not excluded)"}
        metrics = {}
        for view in ("",) + VIEWS:
            if view and view not in self._extra_spec:
                continue
            if view:
                cols[f"{view}_n_pos"] = f"the user's positives in the {view} view (nan: the batch had no such view)"
            for name, kind, k in self._record_metrics(view):
                cols[name] = (f"{kind}@{k} of the user" + (f" on the {view} view (nan: no positive there)" if view
                                                           else " (0 without positives, as torchmetrics counts it)"))
                metrics[f"test/{name}"] = {"table": "users", "agg": "nanmean" if view else "mean", "columns": [name]}
        return {"kind": "recommendation", "tables": {"users": {"columns": cols}}, "metrics": metrics,
                "notes": "each metric is the mean over users (a view's: over the users with positives in it)"}


# -- extra evaluation metrics --------------------------------------------------------------
VIEWS = ("rare", "debiased")
_METRIC = re.compile(r"^(?:(?P<view>[a-z]+)_)?(?P<name>recall|ndcg|hr)@(?P<k>[0-9]+)$")
_METRIC_CLASSES = {"recall": RetrievalRecall, "ndcg": RetrievalNormalizedDCG, "hr": RetrievalHitRate}


def parse_extra_metrics(names: Sequence[str]) -> Dict[str, List[Tuple[str, str, int]]]:
    """``{view ("" = the plain split): [(logged name, kind, k), ...]}`` for ``extra_metrics``."""
    out: Dict[str, List[Tuple[str, str, int]]] = {}
    for n in names:
        m = _METRIC.match(str(n))
        if m is None or not 1 <= int(m["k"]) <= 100 or (m["view"] or "") not in ("",) + VIEWS:
            raise ValueError(f"Recommender: extra metric {n!r} is not <view>_<recall|ndcg|hr>@<k> with k in "
                             f"[1, 100] and view one of {VIEWS} (or none), e.g. 'recall@5', 'rare_recall@20'")
        out.setdefault(m["view"] or "", []).append((str(n), m["name"], int(m["k"])))
    return out


def _collection(items: Sequence[Tuple[str, str, int]], skip_empty: bool) -> MetricCollection:
    kw = {"empty_target_action": "skip"} if skip_empty else {}
    return MetricCollection({name: _METRIC_CLASSES[kind](top_k=k, **kw) for name, kind, k in items})
