"""Decoupled softmax and the InfoNCE baseline (docs/losses/decoupled_softmax.md); soft top-k and
in-batch scores re-exported.

The family lives in four files: this one (decoupled softmax, InfoNCE), :mod:`losses.ranking.soft_topk`
(soft top-k), :mod:`losses.ranking.in_batch` (:func:`in_batch_scores` and the modules'
``forward(query, keys, target)`` routing) and ``losses/ranking/_targets.py`` (argument checks,
target and candidate parsing, shared by all three). Every name is importable from here as before.

* N. Gupta, F. Devvrit, A. S. Rawat, S. Bhojanapalli, P. Jain, I. S. Dhillon, *Dual-Encoders for
  Extreme Multi-label Classification*, ICLR 2024, arXiv:2310.10636 (decoupled softmax, soft
  top-k). Reference code ``nilesh2797/DEXML`` (Apache-2.0); implemented here from the maths.
* A. van den Oord, Y. Li, O. Vinyals, *Representation Learning with Contrastive Predictive
  Coding*, arXiv:1807.03748, 2018 (InfoNCE).

All three take ``scores (B, L)`` (query-label similarities) and a target naming the positives:
a bool multi-hot mask ``(B, L)``, float relevance ``(B, L)`` (positives are ``y > 0``), integer
ids ``(B,)`` (one positive per row, as ``F.cross_entropy``) or ``(B, P)`` id lists padded with
``ignore_index``. The modules also take ``(query, keys, target)`` and then score every query
against the (optionally all-gathered) keys with :func:`in_batch_scores`.

Candidates that do not exist for a row (false negatives, padding) are removed with
``mask`` (bool, the scores' shape, ``True`` = exclude) or, equivalently, a ``-inf`` score: the
loss then equals the loss of the reduced row and the gradient is exactly 0 there. Removing a
positive, or every candidate of a row, is a ``ValueError`` (data check).

Everything is computed in float32 (float64 for float64 scores), also inside ``torch.autocast``
(forward and backward; gradients come back in the inputs' dtypes). The seeded modules keep their
generator state in ``state_dict()``, so a resumed run draws what the uninterrupted run would have.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._core import (
    check_ignore_index,
    _checking,
    auto_extra_repr,
    check_choice,
    check_ids_in_range,
    check_number,
    check_reduction,
    reduce_loss,
    upcast,
    zero_rows,
)
from .._masks import check_finite_or_masked
from .._core import check_bool, no_autocast
from .._precision import softplus
from .._registry import register
from ._targets import (
    VARIANTS,
    _REFERENCE_MASK,
    _PAPER_DEXML,
    _SeededModule,
    _available,
    _check_candidate_mask,
    _check_candidates,
    _check_id_shape,
    _check_mask_value,
    _check_scores,
    _check_seed,
    _check_two_candidates,
    _example_scores,
    _loss_dtype,
    _masked_logsumexp,
    _ranking_targets,
    _row_unit_weights,
    _sample_keys,
    _scaled,
)
from .in_batch import module_forward

__all__ = [
    "decoupled_softmax_loss",
    "infonce_loss",
    "soft_topk_loss",
    "in_batch_scores",
    "DecoupledSoftmaxLoss",
    "InfoNCELoss",
    "SoftTopKLoss",
]

POSITIVE_NORMALIZATIONS = ("sum", "mean")


# --------------------------------------------------------------------------------------
# per-row values (shared by the functions and the modules)
# --------------------------------------------------------------------------------------


def _single_positive(target: object, mask: object) -> bool:
    """One integer id per row and no candidate mask: both losses are then one cross-entropy."""
    return (mask is None and isinstance(target, Tensor) and target.dim() == 1 and target.dtype != torch.bool
            and not target.is_floating_point() and not target.is_complex())


def _single_positive_rows(fn, scores, target, *, temperature, ignore_index):
    """``(values, weights)`` for one positive id per row: ``L_i = logsumexp_l s_il - s_iy``, which is
    InfoNCE and the decoupled softmax alike (with one positive the positive set is the target and
    ``softplus(NLSE - s_y)`` is the same log-sum-exp), computed by ``F.cross_entropy`` without the
    dense ``(B, L)`` positive and availability masks of the general path. The data checks and the
    rules are the general path's: ids in range, finite scores or ``-inf`` masks, a ``-inf`` positive
    or a row without a finite score raise ``ValueError``; with the checks off such a row (and an
    out-of-range id) gets weight 0, its scores zeroed first so that nothing non-finite reaches the
    gradient."""
    _check_scores(fn, scores)
    _check_two_candidates(fn, scores)
    _check_id_shape(fn, target, scores.shape[0], scores.shape[1])
    check_ids_in_range(fn, target, scores.shape[1], ignore_index,
                       hint="ids index the columns of scores; pad with ignore_index")
    check_finite_or_masked(fn, "scores", scores)
    dtype = _loss_dtype(scores, target)
    t = target.to(scores.device).long()
    valid = (t != ignore_index) & (t >= 0) & (t < scores.shape[1])
    y = torch.where(valid, t, torch.zeros_like(t))
    s_y = scores.detach().gather(1, y.unsqueeze(1)).squeeze(1)
    if _checking() and scores.numel() > 0:
        _check_candidates(fn, valid & (s_y == -math.inf), (scores.detach() == -math.inf).all(dim=1))
    valid = valid & (s_y != -math.inf)
    x = zero_rows(upcast(scores, dtype), valid)
    if temperature != 1.0:
        x = x / temperature
    values = F.cross_entropy(x, torch.where(valid, y, torch.full_like(y, -100)), ignore_index=-100,
                             reduction="none")
    return values, valid.to(dtype)


def _decoupled_rows(fn, scores, target, *, temperature, weighted, sample_one_positive, mask_value, generator,
                    ignore_index, mask=None):
    if mask_value == -math.inf and _single_positive(target, mask):
        return _single_positive_rows(fn, scores, target, temperature=temperature, ignore_index=ignore_index)
    _check_scores(fn, scores)
    _check_two_candidates(fn, scores)
    mask = _check_candidate_mask(fn, mask, scores)
    dtype = _loss_dtype(scores, target)
    pos, y = _ranking_targets(fn, scores, target, ignore_index, dtype)
    check_finite_or_masked(fn, "scores", scores)
    avail, pos = _available(fn, scores, mask, pos)
    y = torch.where(pos, y, torch.zeros_like(y))
    s = _scaled(scores, avail, pos, dtype, temperature)
    n_pos = pos.sum(dim=1)
    nlse = _masked_logsumexp(s, avail & ~pos)  # NLSE_i, -inf without negatives
    if mask_value != -math.inf:
        # one mask_value entry per positive of the row (the scored one included)
        extra = mask_value + torch.log(n_pos.clamp_min(1).to(dtype))
        nlse = torch.logaddexp(nlse, extra)
    terms = softplus(nlse.unsqueeze(1) - s)
    w = y if weighted else None
    if sample_one_positive:
        j = _sample_keys(pos, y, generator).argmax(dim=1, keepdim=True)
        values = terms.gather(1, j).squeeze(1)
        if w is not None:
            values = values * w.gather(1, j).squeeze(1)
    else:
        if w is not None:
            terms = terms * w
        values = torch.where(pos, terms, torch.zeros_like(terms)).sum(dim=1) / n_pos.clamp_min(1).to(dtype)
    return values, (n_pos > 0).to(dtype)


def _infonce_rows(fn, scores, target, *, temperature, positive_normalization, ignore_index, mask=None):
    if _single_positive(target, mask):
        return _single_positive_rows(fn, scores, target, temperature=temperature, ignore_index=ignore_index)
    _check_scores(fn, scores)
    _check_two_candidates(fn, scores)
    mask = _check_candidate_mask(fn, mask, scores)
    dtype = _loss_dtype(scores, target)
    pos, _ = _ranking_targets(fn, scores, target, ignore_index, dtype)
    check_finite_or_masked(fn, "scores", scores)
    avail, pos = _available(fn, scores, mask, pos)
    s = _scaled(scores, avail, pos, dtype, temperature)
    lse = _masked_logsumexp(s, avail).unsqueeze(1)
    terms = torch.where(pos, lse - s, torch.zeros_like(s))
    values = terms.sum(dim=1)
    n_pos = pos.sum(dim=1)
    if positive_normalization == "mean":
        values = values / n_pos.clamp_min(1).to(dtype)
    return values, (n_pos > 0).to(dtype)


# --------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------


def decoupled_softmax_loss(
    scores: Tensor,
    target: Tensor,
    *,
    temperature: float = 0.05,
    weighted: bool = False,
    variant: str = "paper",
    sample_one_positive: Optional[bool] = None,
    mask_value: Optional[float] = None,
    mask: Optional[Tensor] = None,
    generator: Optional[torch.Generator] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Decoupled softmax: each positive against the negatives only (DEXML's loss).

    With ``s_il = scores[i, l] / T`` (``T = temperature``), positives ``P_i = {l : y_il > 0}``,
    negatives ``N_i`` the rest and ``NLSE_i = logsumexp_{l in N_i} s_il`` (``-inf`` if empty)::

        L_i = (1 / |P_i|) * sum_{l in P_i} w_il * softplus(NLSE_i - s_il)

    with ``w = 1``, or ``w_il = y_il`` when ``weighted`` (float relevance targets). Unlike
    softmax cross-entropy (:func:`infonce_loss`) the other positives are not in the denominator.

    Args:
        scores: ``(B, L)`` query-label scores, ``L >= 2`` (any float dtype; NaN and ``+inf``
            rejected; ``-inf`` means the candidate does not exist, as ``mask``).
        target: bool multi-hot ``(B, L)``, float relevance ``(B, L)`` (positives ``y > 0``),
            integer ids ``(B,)`` or ``(B, P)`` padded with ``ignore_index``. An integer
            ``(B, L)`` target (L > 2) holding only 0/1 raises ``TypeError`` (data check).
        temperature: ``T > 0``; 0.05 for normalised embeddings (the reference uses 1 for
            unnormalised ones).
        weighted: weight each positive's term by its relevance ``y_il``.
        variant: ``"paper"`` (default): every positive is scored and the other positives are
            removed exactly (``-inf``). ``"reference"`` (every DEXML config):
            ``sample_one_positive=True`` and ``mask_value=-100``.
        sample_one_positive: score one positive ``j* ~ Categorical(y_i / sum y_i)`` per row:
            ``L_i = w_ij* softplus(NLSE'_i - s_ij*)``.
        mask_value: the scaled score written over *every* positive (the scored one included)
            before the log-sum-exp: ``NLSE'_i = logaddexp(NLSE_i, mask_value + log |P_i|)``;
            ``-inf`` is exact removal. Each flag overrides the variant on its own.
        mask: ``(B, L)`` bool, ``True`` = exclude the candidate (e.g. a known false negative);
            the same as a ``-inf`` score there: the loss equals the loss of the row without
            those entries and their gradient is exactly 0. Removing a positive, or every
            candidate of a row, raises ``ValueError`` (data check).
        generator: random source for ``sample_one_positive`` (``None``: the global RNG).
        ignore_index: padding id of integer targets.
        reduction: ``"none"`` (``(B,)``), ``"mean"`` or ``"sum"``.

    A row without positives has loss 0 and unit weight 0 (it leaves the mean); a row whose
    labels are all positive has ``NLSE = -inf`` and loss 0. Not reproduced from the reference:
    its shard off-by-one, its in-place writes to the scores and its exception on rows without
    positives.

    Paper: N. Gupta, F. Devvrit, A. S. Rawat, S. Bhojanapalli, P. Jain, I. S. Dhillon,
    *Dual-Encoders for Extreme Multi-label Classification*, ICLR 2024, arXiv:2310.10636.

    >>> import torch, losses
    >>> scores = torch.tensor([[2.0, 1.0, 0.0], [0.5, 0.0, 1.0]])
    >>> ids = torch.tensor([0, 2])
    >>> bool(torch.isclose(losses.decoupled_softmax_loss(scores, ids, temperature=1.0),
    ...                    torch.nn.functional.cross_entropy(scores, ids)))
    True
    """
    fn = "decoupled_softmax_loss"
    check_reduction(fn, reduction)
    check_number(fn, "temperature", temperature, low=0.0, low_inclusive=False)
    check_bool(fn, "weighted", weighted)
    check_choice(fn, "variant", variant, VARIANTS)
    check_bool(fn, "sample_one_positive", sample_one_positive, allow_none=True)
    _check_mask_value(fn, mask_value)
    sample, mask_fill = _decoupled_flags(variant, sample_one_positive, mask_value)
    with no_autocast(scores):
        values, weights = _decoupled_rows(fn, scores, target, temperature=float(temperature), weighted=weighted,
                                          sample_one_positive=sample, mask_value=mask_fill, generator=generator,
                                          ignore_index=ignore_index, mask=mask)
        return reduce_loss(values, weights, reduction, anchors=(scores,))


def _decoupled_flags(variant: str, sample_one_positive: Optional[bool], mask_value: Optional[float]):
    ref = variant == "reference"
    sample = ref if sample_one_positive is None else sample_one_positive
    mask = (_REFERENCE_MASK if ref else -math.inf) if mask_value is None else float(mask_value)
    return sample, mask


def infonce_loss(
    scores: Tensor,
    target: Tensor,
    *,
    temperature: float = 0.05,
    positive_normalization: str = "sum",
    mask: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""InfoNCE / softmax cross-entropy over labels, summed or averaged over the positives.

    With ``s_il = scores[i, l] / temperature`` and positives ``P_i = {l : y_il > 0}``::

        L_i = c_i * sum_{l in P_i} (logsumexp_{l'} s_il' - s_il)

    ``c_i = 1`` (``positive_normalization="sum"``, the DEXML reference's default) or
    ``1 / |P_i|`` (``"mean"``). Positives stay in each other's denominators. With one positive per
    row it is ``F.cross_entropy(scores / temperature, ids)``.

    Shapes and targets as :func:`decoupled_softmax_loss` (float relevance counts ``y > 0`` as
    positive, unweighted). ``"none"`` gives ``(B,)``; a row without positives has loss 0 and
    unit weight 0. ``mask`` (bool ``(B, L)``, ``True`` = exclude) and ``-inf`` scores remove
    candidates exactly, as in :func:`decoupled_softmax_loss` (a removed positive, or a row
    without any candidate, raises ``ValueError``); ``L >= 2``.

    Paper: A. van den Oord, Y. Li, O. Vinyals, *Representation Learning with Contrastive
    Predictive Coding*, arXiv:1807.03748, 2018; the multi-positive form is the baseline of
    Gupta et al., ICLR 2024, arXiv:2310.10636.

    >>> import torch, losses
    >>> scores = torch.tensor([[2.0, 1.0, 0.0]])
    >>> bool(torch.isclose(losses.infonce_loss(scores, torch.tensor([1]), temperature=1.0),
    ...                    torch.nn.functional.cross_entropy(scores, torch.tensor([1]))))
    True
    """
    fn = "infonce_loss"
    check_reduction(fn, reduction)
    check_number(fn, "temperature", temperature, low=0.0, low_inclusive=False)
    check_choice(fn, "positive_normalization", positive_normalization, POSITIVE_NORMALIZATIONS)
    with no_autocast(scores):
        values, weights = _infonce_rows(fn, scores, target, temperature=float(temperature),
                                        positive_normalization=positive_normalization, ignore_index=ignore_index,
                                        mask=mask)
        return reduce_loss(values, weights, reduction, anchors=(scores,))


# --------------------------------------------------------------------------------------
# modules
# --------------------------------------------------------------------------------------


class DecoupledSoftmaxLoss(_SeededModule):
    """Decoupled softmax loss (DEXML, arXiv:2310.10636) as a module; the maths is
    :func:`losses.decoupled_softmax_loss`.

    Args:
        temperature: ``T > 0`` (default 0.05).
        weighted: weight each positive's term by its relevance (default False).
        variant: ``"paper"`` (default) or ``"reference"``.
        sample_one_positive: score one sampled positive per row; overrides the variant (default None).
        mask_value: scaled score written over the positives; overrides the variant (default None).
        ignore_index: padding id of integer targets (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        seed: ``None`` (default: the global RNG) or the seed of a private generator for
            ``sample_one_positive``.
        gather_distributed: with keys, score against every rank's keys and return the loss of the
            global batch on every rank (default False).

    ``forward(scores, target, *, mask=None)`` with ``scores (B, L)`` and ``target`` bool / float
    ``(B, L)`` or integer ids ``(B,)`` / ``(B, P)`` padded with ``ignore_index``; or
    ``forward(query, keys, target, *, mask=None)`` with ``query (B, D)``, ``keys (K, D)``, scored
    by :func:`losses.in_batch_scores` (which then takes the mask). Returns a scalar for
    ``"mean"``/``"sum"``, ``(B,)`` for ``"none"``.

    The private generator's state is saved in ``state_dict()``, so a run resumed from a checkpoint
    draws what the uninterrupted run would have drawn (older state_dicts without it still load).
    With ``gather_distributed=True`` the loss is that of the global batch on every rank (``"mean"``
    divides by the global number of rows with positives; ``"none"`` returns this rank's rows) and
    ``forward(query, keys, target)`` scores against every rank's keys. No parameters or buffers.

    >>> import torch, losses
    >>> losses.DecoupledSoftmaxLoss(variant="reference", seed=0)
    DecoupledSoftmaxLoss(temperature=0.05, weighted=False, variant='reference', sample_one_positive=None, mask_value=None, ignore_index=-100, reduction='mean', seed=0, gather_distributed=False)
    """

    def __init__(
        self,
        *,
        temperature: float = 0.05,
        weighted: bool = False,
        variant: str = "paper",
        sample_one_positive: Optional[bool] = None,
        mask_value: Optional[float] = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        seed: Optional[int] = None,
        gather_distributed: bool = False,
    ) -> None:
        super().__init__()
        fn = "DecoupledSoftmaxLoss"
        check_number(fn, "temperature", temperature, low=0.0, low_inclusive=False)
        check_bool(fn, "weighted", weighted)
        check_choice(fn, "variant", variant, VARIANTS)
        check_bool(fn, "sample_one_positive", sample_one_positive, allow_none=True)
        _check_mask_value(fn, mask_value)
        _check_seed(fn, seed)
        check_bool(fn, "gather_distributed", gather_distributed)
        check_reduction(fn, reduction)
        self.temperature = float(temperature)
        self.weighted = weighted
        self.variant = variant
        self.sample_one_positive = sample_one_positive
        self.mask_value = None if mask_value is None else float(mask_value)
        self.seed = seed
        self.gather_distributed = gather_distributed
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction
        self._generator: Optional[torch.Generator] = None

    def forward(self, scores_or_query: Tensor, target_or_keys: Tensor, target: Optional[Tensor] = None, *,
                mask: Optional[Tensor] = None) -> Tensor:
        """The decoupled softmax loss of the scores (or of ``query`` against ``keys``).

        Args:
            scores_or_query: scores ``(B, L)``, or the queries ``(B, D)`` when ``keys`` follow.
            target_or_keys: the target of ``scores`` (bool / float ``(B, L)``, ids ``(B,)`` / ``(B, P)``),
                or the keys ``(K, D)``.
            target: the target of ``(query, keys)`` (as :func:`losses.in_batch_scores` takes it), else
                omitted.
            mask: optional bool ``(B, L)`` (``(B, K)`` with ``keys``), True = exclude the candidate.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-row losses ``(B,)`` (``"none"``).
        """
        sample, mask_fill = _decoupled_flags(self.variant, self.sample_one_positive, self.mask_value)
        gen = self._generator_or_none() if sample else None

        def rows(s, t, m):
            return _decoupled_rows("decoupled_softmax_loss", s, t, temperature=self.temperature,
                                   weighted=self.weighted, sample_one_positive=sample, mask_value=mask_fill,
                                   generator=gen, ignore_index=self.ignore_index, mask=m)

        return module_forward(self, rows, scores_or_query, target_or_keys, target, mask)

    extra_repr = auto_extra_repr


class InfoNCELoss(nn.Module):
    """InfoNCE (multi-positive softmax cross-entropy, arXiv:1807.03748) as a module; the maths is
    :func:`losses.infonce_loss`.

    Args:
        temperature: ``T > 0`` (default 0.05).
        positive_normalization: ``"sum"`` (default) or ``"mean"`` over a row's positives.
        ignore_index: padding id of integer targets (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        gather_distributed: with keys, score against every rank's keys and return the loss of the
            global batch on every rank (default False).

    ``forward(scores, target, *, mask=None)`` with ``scores (B, L)`` and ``target`` bool / float
    ``(B, L)`` or integer ids ``(B,)`` / ``(B, P)`` padded with ``ignore_index``; or
    ``forward(query, keys, target, *, mask=None)`` with ``query (B, D)``, ``keys (K, D)``, scored by
    :func:`losses.in_batch_scores` (which then takes the mask). Returns a scalar for
    ``"mean"``/``"sum"``, ``(B,)`` for ``"none"``. ``gather_distributed`` as in
    :class:`DecoupledSoftmaxLoss`. No parameters or buffers.
    """

    def __init__(
        self,
        *,
        temperature: float = 0.05,
        positive_normalization: str = "sum",
        ignore_index: int = -100,
        reduction: str = "mean",
        gather_distributed: bool = False,
    ) -> None:
        super().__init__()
        fn = "InfoNCELoss"
        check_number(fn, "temperature", temperature, low=0.0, low_inclusive=False)
        check_choice(fn, "positive_normalization", positive_normalization, POSITIVE_NORMALIZATIONS)
        check_bool(fn, "gather_distributed", gather_distributed)
        check_reduction(fn, reduction)
        self.temperature = float(temperature)
        self.positive_normalization = positive_normalization
        self.gather_distributed = gather_distributed
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction

    def forward(self, scores_or_query: Tensor, target_or_keys: Tensor, target: Optional[Tensor] = None, *,
                mask: Optional[Tensor] = None) -> Tensor:
        """The InfoNCE loss of the scores (or of ``query`` against ``keys``).

        Args:
            scores_or_query: scores ``(B, L)``, or the queries ``(B, D)`` when ``keys`` follow.
            target_or_keys: the target of ``scores`` (bool / float ``(B, L)``, ids ``(B,)`` / ``(B, P)``),
                or the keys ``(K, D)``.
            target: the target of ``(query, keys)`` (as :func:`losses.in_batch_scores` takes it), else
                omitted.
            mask: optional bool ``(B, L)`` (``(B, K)`` with ``keys``), True = exclude the candidate.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-row losses ``(B,)`` (``"none"``).
        """
        def rows(s, t, m):
            return _infonce_rows("infonce_loss", s, t, temperature=self.temperature,
                                 positive_normalization=self.positive_normalization, ignore_index=self.ignore_index,
                                 mask=m)

        return module_forward(self, rows, scores_or_query, target_or_keys, target, mask)

    extra_repr = auto_extra_repr


# --------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------


register(
    "decoupled_softmax",
    function=decoupled_softmax_loss,
    module=DecoupledSoftmaxLoss,
    inputs="scores",
    query_keys=True,  # forward(query, keys, target) scores in-batch too
    softmax=True,
    masks=("neg_inf", "mask"),
    unit="row",
    unit_weights=_row_unit_weights,
    arxiv="2310.10636",
    paper=_PAPER_DEXML,
    example_inputs=_example_scores,
)
register(
    "infonce",
    function=infonce_loss,
    module=InfoNCELoss,
    inputs="scores",
    query_keys=True,  # forward(query, keys, target) scores in-batch too
    softmax=True,
    masks=("neg_inf", "mask"),
    unit="row",
    unit_weights=_row_unit_weights,
    arxiv="1807.03748",
    paper="A. van den Oord, Y. Li, O. Vinyals, Representation Learning with Contrastive Predictive Coding, 2018",
    example_inputs=_example_scores,
)

# the split-out parts, re-exported under their old paths (losses.ranking.decoupled.<name>)
from .in_batch import in_batch_scores  # noqa: E402,F401
from .soft_topk import SoftTopKLoss, soft_topk_loss  # noqa: E402,F401
