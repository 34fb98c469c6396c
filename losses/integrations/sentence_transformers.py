"""The library's in-batch ranking losses as sentence-transformers losses.

Each class is built like a sentence-transformers loss -- an ``nn.Module`` that takes the model
-- and is called by ``SentenceTransformerTrainer`` (or ``model.fit``) as
``loss(sentence_features, labels)``::

    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from losses.integrations.sentence_transformers import DecoupledSoftmaxRankingLoss

    model = SentenceTransformer("path/to/local/model", device="cpu")
    loss = DecoupledSoftmaxRankingLoss(model, num_positives=2, temperature=0.05)
    # train_dataset columns: anchor, positive_1, positive_2[, negative_1, ...]
    SentenceTransformerTrainer(model=model, train_dataset=train_dataset, loss=loss).train()

**Columns.** The first column is the anchor (query), the next ``num_positives`` columns are its
positives, any further columns are hard negatives. Every anchor is scored against every
candidate of the batch (all positives and negatives of all rows: in-batch negatives), in the
column-major order of ``MultipleNegativesRankingLoss`` (column 1 rows ``0..B-1``, then column 2,
...), so with ``num_positives=1`` row ``i``'s positive is candidate ``i``.

**Scores.** ``similarity="cosine"`` (default; the embeddings are L2-normalised, as
sentence-transformers' ``cos_sim``) or ``"dot"``. The project losses divide scores by
``temperature``; sentence-transformers' ``scale`` is ``1 / temperature`` (``scale=20`` is
``temperature=0.05``). :class:`InfoNCERankingLoss` with one positive, cosine scores and
``temperature = 1 / scale`` is exactly ``MultipleNegativesRankingLoss``.

**False negatives.** ``false_negatives=None`` keeps every in-batch candidate;
``"duplicates"`` excludes candidates whose tokens equal one of the anchor's positives (a repeated
document elsewhere in the batch); ``"labels"`` takes the dataset's ``label`` column as group ids
and excludes the positives of other rows with the same label. Exclusion means the candidate is
removed from the row's softmax (exactly, through the loss's ``mask=`` argument when the installed
loss function has it; otherwise by a finite fill below the row's lowest score by 100 scaled
units, whose contribution, below ``e^-100`` of the row's mass, is zero in float32).

**Distributed.** ``gather_distributed=True`` all-gathers the candidates (and the per-row loss) from
every rank with a sum-backward all-gather, so each rank's loss is that of the global batch and
DDP's gradient averaging recovers the single-process step. Without a process group it is a
no-op.

Importing this module imports nothing beyond torch; building a loss checks that
``sentence-transformers`` is installed (``pip install softmax-losses[integrations]``).
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._core import check_int, type_error, value_error
from .._distributed import all_gather_no_grad, all_gather_with_grad, all_reduce_with_grad, is_distributed, rank, world_size
from ..ranking.decoupled import (
    DecoupledSoftmaxLoss,
    InfoNCELoss,
    SoftTopKLoss,
    decoupled_softmax_loss,
    infonce_loss,
    soft_topk_loss,
)
from ._require import require

__all__ = [
    "InBatchRankingLoss",
    "InfoNCERankingLoss",
    "DecoupledSoftmaxRankingLoss",
    "SoftTopKRankingLoss",
    "in_batch_candidates",
]

SIMILARITIES = ("cosine", "dot")
FALSE_NEGATIVES = (None, "duplicates", "labels")
#: the functional form behind each supported ranking module
_FUNCTIONS = {InfoNCELoss: infonce_loss, DecoupledSoftmaxLoss: decoupled_softmax_loss, SoftTopKLoss: soft_topk_loss}
_FILL_MARGIN = 100.0  # scaled units below a row's lowest kept score (fallback without mask=)


def _text_keys(features: Dict[str, Tensor]) -> List[int]:
    """One integer per row identifying its tokens (the non-padding ``input_ids``)."""
    ids = features.get("input_ids")
    if ids is None:
        raise value_error("InBatchRankingLoss", "false_negatives='duplicates' needs tokenised text features",
                          f"feature keys {sorted(features)}", "use false_negatives='labels' or None")
    att = features.get("attention_mask")
    rows = []
    for i in range(ids.shape[0]):
        row = ids[i] if att is None else ids[i][att[i].bool()]
        rows.append(hash(tuple(row.tolist())))  # tuples of ints hash the same in every process
    return rows


def in_batch_candidates(embeddings: Sequence[Tensor], num_positives: int = 1):
    """Split sentence-transformers column embeddings into ``(anchors (B, D), candidates (K, D),
    target (B, K) bool)``: candidates are the columns after the anchor, concatenated column by
    column; ``target[i, p * B + i]`` is True for the ``num_positives`` positive columns ``p``."""
    if len(embeddings) < 1 + num_positives:
        raise value_error("in_batch_candidates", f"need the anchor column and {num_positives} positive column(s)",
                          f"{len(embeddings)} column(s)", "give the dataset columns anchor, positive[, ...]")
    anchors = embeddings[0]
    b = anchors.shape[0]
    candidates = torch.cat(list(embeddings[1:]), dim=0)
    target = torch.zeros(b, candidates.shape[0], dtype=torch.bool, device=anchors.device)
    rows = torch.arange(b, device=anchors.device)
    for p in range(num_positives):
        target[rows, p * b + rows] = True
    return anchors, candidates, target


class InBatchRankingLoss(nn.Module):
    """A library ranking loss (kind ``"scores"``: InfoNCE, decoupled softmax, soft top-k) over in-batch
    candidates, as a sentence-transformers loss. See the module docstring for columns, scores,
    false negatives and distribution.

    Args:
        model: the ``SentenceTransformer`` (anything mapping a feature dict to a dict with
            ``"sentence_embedding"``).
        loss: a :class:`losses.InfoNCELoss`, :class:`losses.DecoupledSoftmaxLoss` or
            :class:`losses.SoftTopKLoss` with ``reduction="mean"``; its hyperparameters (temperature,
            variant, seed, ...) are used as they are. Its own ``gather_distributed`` is ignored:
            this wrapper gathers.
        num_positives: positive columns after the anchor (default 1).
        similarity: ``"cosine"`` or ``"dot"``.
        false_negatives: ``None``, ``"duplicates"`` or ``"labels"``.
        gather_distributed: score against the candidates of every rank.

    ``forward(sentence_features, labels)`` returns the mean loss over the (global) batch's anchors.
    """

    def __init__(
        self,
        model: nn.Module,
        loss: nn.Module,
        *,
        num_positives: int = 1,
        similarity: str = "cosine",
        false_negatives: Optional[str] = None,
        gather_distributed: bool = False,
    ) -> None:
        super().__init__()
        cls = type(self).__name__
        require("sentence_transformers", "sentence-transformers", cls)
        if type(loss) not in _FUNCTIONS:
            raise type_error(cls, "loss must be a losses.InfoNCELoss, DecoupledSoftmaxLoss or SoftTopKLoss",
                             type(loss).__name__, "build one with losses.create_loss('infonce') or similar")
        if loss.reduction != "mean":
            raise value_error(cls, "loss must use reduction='mean'", repr(loss.reduction),
                              "the trainer needs a scalar; build the loss with its default reduction")
        num_positives = check_int(cls, "num_positives", num_positives, low=1,
                                  hint="pass the number of positive columns after the anchor")
        if similarity not in SIMILARITIES:
            raise value_error(cls, f"similarity must be one of {SIMILARITIES}", repr(similarity), "use 'cosine'")
        if false_negatives not in FALSE_NEGATIVES:
            raise value_error(cls, f"false_negatives must be one of {FALSE_NEGATIVES}", repr(false_negatives),
                              "use None to keep every in-batch candidate")
        if not isinstance(gather_distributed, bool):
            raise type_error(cls, "gather_distributed must be a bool", type(gather_distributed).__name__,
                             "pass True or False")
        self.model = model
        self.loss = loss
        self.num_positives = num_positives
        self.similarity = similarity
        self.false_negatives = false_negatives
        self.gather_distributed = gather_distributed
        self._function = _FUNCTIONS[type(loss)]
        #: True when the installed loss function excludes candidates exactly through ``mask=``
        self.exact_mask = "mask" in inspect.signature(self._function).parameters

    # -- the pieces --------------------------------------------------------------------------
    def embed(self, sentence_features: Iterable[Dict[str, Tensor]]) -> List[Tensor]:
        """One ``(B, D)`` embedding tensor per column."""
        return [self.model(f)["sentence_embedding"] for f in sentence_features]

    def _exclusion(self, features: List[Dict[str, Tensor]], labels: Optional[Tensor], b: int, k: int,
                   device: torch.device) -> Optional[Tensor]:
        """``(B, K_global)`` bool of excluded candidates (``None`` when nothing is excluded)."""
        if self.false_negatives is None:
            return None
        gathered = self.gather_distributed and is_distributed()
        r, w = (rank(), world_size()) if gathered else (0, 1)
        cand_rows = torch.arange(k, device=device) % b  # the local row each candidate belongs to
        cand_is_pos = torch.arange(k, device=device) < self.num_positives * b
        if self.false_negatives == "duplicates":
            keys = [_text_keys(f) for f in features]
            anchor_pos = torch.tensor([keys[1 + p] for p in range(self.num_positives)], dtype=torch.long,
                                      device=device).T  # (B, P) keys of each row's positives
            cand = torch.tensor([x for col in keys[1:] for x in col], dtype=torch.long, device=device)
            cand = all_gather_no_grad(cand) if gathered else cand
            excl = (cand[None, None, :] == anchor_pos[:, :, None]).any(dim=1)
        else:
            if labels is None:
                raise value_error(type(self).__name__, "false_negatives='labels' needs a 'label' column",
                                  "labels=None", "add integer group ids as the dataset's 'label' column")
            if labels.dim() != 1 or labels.shape[0] != b or labels.is_floating_point():
                raise value_error(type(self).__name__, f"labels must be ({b},) integer group ids",
                                  f"shape {tuple(labels.shape)}, dtype {labels.dtype}", "one id per anchor")
            labels = labels.to(device)
            lab = all_gather_no_grad(labels) if gathered else labels
            cand_lab = lab.view(w, b)[:, cand_rows].reshape(-1)  # (K_global,)
            pos_g = cand_is_pos.repeat(w)
            excl = (cand_lab[None, :] == labels[:, None]) & pos_g[None, :]
        # never exclude the row's own positives
        own = torch.zeros_like(excl)
        rows = torch.arange(b, device=device)
        for p in range(self.num_positives):
            own[rows, r * k + p * b + rows] = True
        return excl & ~own

    def _call(self, scores: Tensor, target: Tensor, exclude: Optional[Tensor]) -> Tensor:
        """Per-row losses ``(B,)`` of the wrapped loss's functional form."""
        loss = self.loss
        kwargs: Dict[str, Any] = {"temperature": loss.temperature, "ignore_index": loss.ignore_index,
                                  "reduction": "none"}
        if isinstance(loss, InfoNCELoss):
            kwargs["positive_normalization"] = loss.positive_normalization
        elif isinstance(loss, DecoupledSoftmaxLoss):
            kwargs.update(weighted=loss.weighted, variant=loss.variant, sample_one_positive=loss.sample_one_positive,
                          mask_value=loss.mask_value, generator=loss._generator_or_none())
        else:
            kwargs.update(k=loss.k, alpha=loss.alpha, n_iter=loss.n_iter, variant=loss.variant,
                          generator=loss._generator_or_none())
        if exclude is not None and bool(exclude.any()):
            if self.exact_mask:
                kwargs["mask"] = exclude
            else:
                margin = _FILL_MARGIN * loss.temperature * max(1.0, 1.0 / getattr(loss, "alpha", 1.0))
                low = torch.where(exclude, torch.full_like(scores, float("inf")), scores).amin(dim=1, keepdim=True)
                scores = torch.where(exclude, (low - margin).detach().expand_as(scores), scores)
        return self._function(scores, target, **kwargs)

    def loss_from_embeddings(self, embeddings: Sequence[Tensor], labels: Optional[Tensor] = None,
                             features: Optional[List[Dict[str, Tensor]]] = None) -> Tensor:
        """The loss of column embeddings (``features`` are needed for ``"duplicates"``)."""
        anchors, candidates, target = in_batch_candidates(embeddings, self.num_positives)
        if self.similarity == "cosine":
            anchors, candidates = F.normalize(anchors, dim=-1), F.normalize(candidates, dim=-1)
        b, k = anchors.shape[0], candidates.shape[0]
        gathered = self.gather_distributed and is_distributed()
        if gathered:
            r, w = rank(), world_size()
            candidates = all_gather_with_grad(candidates, fn=type(self).__name__)
            target = torch.cat([target.new_zeros(b, r * k), target, target.new_zeros(b, (w - r - 1) * k)], dim=1)
        exclude = self._exclusion(features or [], labels, b, k, anchors.device)
        scores = anchors @ candidates.T
        values = self._call(scores, target, exclude)
        if gathered:
            # every row has a positive (unit weight 1) and every rank has B rows: the global mean
            return all_reduce_with_grad(values.mean()) / world_size()
        return values.mean()

    def forward(self, sentence_features: Iterable[Dict[str, Tensor]], labels: Optional[Tensor] = None) -> Tensor:
        """The mean loss over the batch's anchors.

        Args:
            sentence_features: one feature dict per column (anchor, then the positive columns).
            labels: optional per-anchor labels, used by ``false_negatives="labels"``.

        Returns:
            A scalar: the mean over the (global, with ``gather_distributed``) batch's anchors.
        """
        features = list(sentence_features)
        return self.loss_from_embeddings(self.embed(features), labels, features)

    def get_config_dict(self) -> Dict[str, Any]:
        """Hyperparameters for sentence-transformers' model card."""
        inner = {k: v for k, v in vars(self.loss).items() if not k.startswith("_") and k != "training"
                 and isinstance(v, (int, float, str, bool, type(None)))}
        return {"loss": type(self.loss).__name__, **inner, "num_positives": self.num_positives,
                "similarity": self.similarity, "false_negatives": self.false_negatives,
                "gather_distributed": self.gather_distributed}


class InfoNCERankingLoss(InBatchRankingLoss):
    """InfoNCE over in-batch candidates (:func:`losses.infonce_loss`, van den Oord et al.,
    arXiv:1807.03748). With one positive and cosine scores it equals sentence-transformers'
    ``MultipleNegativesRankingLoss(model, scale=1 / temperature)``.

    Args:
        model: the ``SentenceTransformer``.
        temperature: as :class:`losses.InfoNCELoss`.
        positive_normalization: as :class:`losses.InfoNCELoss`.
        num_positives: positive columns after the anchor (default 1).
        similarity: ``"cosine"`` (default) or ``"dot"``.
        false_negatives: ``None`` (default), ``"duplicates"`` or ``"labels"``.
        gather_distributed: score against the candidates of every rank (default False).

    ``forward(sentence_features, labels)`` as :class:`InBatchRankingLoss`: returns the mean loss
    over the (global) batch's anchors.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        temperature: float = 0.05,
        positive_normalization: str = "sum",
        num_positives: int = 1,
        similarity: str = "cosine",
        false_negatives: Optional[str] = None,
        gather_distributed: bool = False,
    ) -> None:
        super().__init__(model, InfoNCELoss(temperature=temperature, positive_normalization=positive_normalization),
                         num_positives=num_positives, similarity=similarity, false_negatives=false_negatives,
                         gather_distributed=gather_distributed)


class DecoupledSoftmaxRankingLoss(InBatchRankingLoss):
    """Decoupled softmax over in-batch candidates, for several positives per anchor
    (:func:`losses.decoupled_softmax_loss`, Gupta et al., ICLR 2024, arXiv:2310.10636): each
    positive is scored against the negatives only, the other positives are removed.

    Args:
        model: the ``SentenceTransformer``.
        temperature: as :class:`losses.DecoupledSoftmaxLoss`.
        weighted: as :class:`losses.DecoupledSoftmaxLoss`.
        variant: as :class:`losses.DecoupledSoftmaxLoss`.
        sample_one_positive: as :class:`losses.DecoupledSoftmaxLoss`.
        mask_value: as :class:`losses.DecoupledSoftmaxLoss`.
        seed: as :class:`losses.DecoupledSoftmaxLoss`.
        num_positives: positive columns after the anchor (default 1).
        similarity: ``"cosine"`` (default) or ``"dot"``.
        false_negatives: ``None`` (default), ``"duplicates"`` or ``"labels"``.
        gather_distributed: score against the candidates of every rank (default False).

    ``forward(sentence_features, labels)`` as :class:`InBatchRankingLoss`: returns the mean loss
    over the (global) batch's anchors.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        temperature: float = 0.05,
        weighted: bool = False,
        variant: str = "paper",
        sample_one_positive: Optional[bool] = None,
        mask_value: Optional[float] = None,
        seed: Optional[int] = None,
        num_positives: int = 1,
        similarity: str = "cosine",
        false_negatives: Optional[str] = None,
        gather_distributed: bool = False,
    ) -> None:
        super().__init__(model, DecoupledSoftmaxLoss(temperature=temperature, weighted=weighted, variant=variant,
                                                     sample_one_positive=sample_one_positive,
                                                     mask_value=mask_value, seed=seed),
                         num_positives=num_positives, similarity=similarity, false_negatives=false_negatives,
                         gather_distributed=gather_distributed)


class SoftTopKRankingLoss(InBatchRankingLoss):
    """Soft top-k over in-batch candidates (:func:`losses.soft_topk_loss`, Gupta et al.,
    arXiv:2310.10636). ``k`` must be below the number of candidates in a batch.

    Args:
        model: the ``SentenceTransformer``.
        k: as :class:`losses.SoftTopKLoss`.
        alpha: as :class:`losses.SoftTopKLoss`.
        temperature: as :class:`losses.SoftTopKLoss`.
        n_iter: as :class:`losses.SoftTopKLoss`.
        variant: as :class:`losses.SoftTopKLoss`.
        seed: as :class:`losses.SoftTopKLoss`.
        num_positives: positive columns after the anchor (default 1).
        similarity: ``"cosine"`` (default) or ``"dot"``.
        false_negatives: ``None`` (default), ``"duplicates"`` or ``"labels"``.
        gather_distributed: score against the candidates of every rank (default False).

    ``forward(sentence_features, labels)`` as :class:`InBatchRankingLoss`: returns the mean loss
    over the (global) batch's anchors.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        k: Union[int, str] = 5,
        alpha: float = 2.0,
        temperature: float = 0.05,
        n_iter: int = 32,
        variant: str = "paper",
        seed: Optional[int] = None,
        num_positives: int = 1,
        similarity: str = "cosine",
        false_negatives: Optional[str] = None,
        gather_distributed: bool = False,
    ) -> None:
        super().__init__(model, SoftTopKLoss(k=k, alpha=alpha, temperature=temperature, n_iter=n_iter,
                                             variant=variant, seed=seed),
                         num_positives=num_positives, similarity=similarity, false_negatives=false_negatives,
                         gather_distributed=gather_distributed)
