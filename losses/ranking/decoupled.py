"""Decoupled softmax, the InfoNCE baseline and soft top-k (docs/losses/decoupled_softmax.md), plus in-batch scores.

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
from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn

from .._core import (
    auto_extra_repr,
    check_seed,
    check_int,
    check_bool,
    _checking,
    check_choice,
    check_finite,
    check_floating,
    check_ids_in_range,
    check_number,
    check_reduction,
    check_tensor,
    compute_dtype,
    reduce_loss,
    type_error,
    upcast,
    value_error,
)
from .._distributed import all_gather_no_grad, all_gather_with_grad, is_distributed, rank, world_size
from .._masks import check_finite_or_masked
from .._precision import matmul, no_autocast, softplus
from .._random import GeneratorStateMixin
from .._registry import register

__all__ = [
    "decoupled_softmax_loss",
    "infonce_loss",
    "soft_topk_loss",
    "in_batch_scores",
    "DecoupledSoftmaxLoss",
    "InfoNCELoss",
    "SoftTopKLoss",
]

VARIANTS = ("paper", "reference")
POSITIVE_NORMALIZATIONS = ("sum", "mean")
_REFERENCE_MASK = -100.0  # the reference overwrites positives' scaled scores with -100


# --------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------


def _check_bool(fn: str, name: str, value: object, *, allow_none: bool = False) -> None:
    check_bool(fn, name, value, allow_none=allow_none)


def _check_mask_value(fn: str, value: object) -> None:
    if value is None:
        return
    args = (fn, "mask_value must be None, a finite real number or -inf", repr(value),
            "use -100.0 (the reference) or float('-inf') (exact removal)")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise type_error(*args)  # a wrong kind of argument
    if math.isnan(value) or value == math.inf:
        raise value_error(*args)


def _check_k(fn: str, k: object) -> None:
    if k == "num_positives" and isinstance(k, str):
        return
    args = (fn, "k must be an int with 0 < k < L or 'num_positives'", repr(k),
            "pass the number of labels the soft top-k keeps")
    if isinstance(k, bool) or not isinstance(k, (int, str)):
        raise type_error(*args)  # a wrong kind of argument (float, None, bool)
    if isinstance(k, str) or k < 1:
        raise value_error(*args)


def _check_n_iter(fn: str, n_iter: object) -> None:
    check_int(fn, "n_iter", n_iter, low=1, what="an int >= 1", hint="32 bisection steps are the default")


def _check_seed(fn: str, seed: object) -> None:
    check_seed(fn, seed)


# --------------------------------------------------------------------------------------
# targets
# --------------------------------------------------------------------------------------


def _check_scores(fn: str, scores: object) -> None:
    check_floating(fn, "scores", scores)
    if scores.dim() != 2:
        raise value_error(fn, "scores must have shape (B, L)", f"shape {tuple(scores.shape)}",
                          "pass one row of label scores per query")


def _check_candidate_mask(fn: str, mask: object, scores: Tensor) -> Optional[Tensor]:
    """``mask`` (bool, the scores' shape, True = exclude) or ``None``."""
    if mask is None:
        return None
    check_tensor(fn, "mask", mask)
    if mask.dtype != torch.bool:
        raise type_error(fn, "mask must be a bool tensor (True = exclude the candidate)", str(mask.dtype),
                         "pass mask.bool(); use target for the positives")
    if tuple(mask.shape) != tuple(scores.shape):
        raise value_error(fn, f"mask must have the scores' shape {tuple(scores.shape)}", f"shape {tuple(mask.shape)}",
                          "pass one flag per score (True = exclude)")
    return mask.to(scores.device)


def _rows_list(flags: Tensor) -> str:
    rows = flags.nonzero().flatten()
    return f"rows {rows[:8].tolist()}{' ...' if rows.numel() > 8 else ''}"


def _available(fn: str, scores: Tensor, mask: Optional[Tensor], pos: Tensor) -> Tuple[Tensor, Tensor]:
    """``(avail, pos)``: the candidates that exist (not masked, score not ``-inf``) and the positives
    among them. Data checks: a removed positive and a row without any candidate raise
    ``ValueError``; with validation off a removed positive is dropped from the positives."""
    avail = scores.detach() != -math.inf
    if mask is not None:
        avail = avail & ~mask
    if _checking() and scores.numel() > 0:
        removed = pos & ~avail
        if bool(removed.any()):
            raise value_error(fn, "mask or a -inf score removes a positive", _rows_list(removed.any(dim=1)),
                              "a positive must stay a candidate: unmark it in mask or drop it from target")
        empty = ~avail.any(dim=1)
        if bool(empty.any()):
            raise value_error(fn, "a row has no finite score (every candidate is masked or -inf)",
                              _rows_list(empty), "keep at least one candidate per row or drop the row")
    return avail, pos & avail


def _check_two_candidates(fn: str, scores: Tensor) -> None:
    if scores.shape[1] < 2:
        raise value_error(fn, "scores must have at least 2 candidates per row; with one the loss is identically 0",
                          f"shape {tuple(scores.shape)}",
                          "score more candidates per query, or use losses.bce_with_logits_loss for one score")


def _check_not_a_mask(fn: str, target: Tensor, num_labels: int) -> None:
    """Data check: an integer (B, L) target holding only 0 and 1 is almost surely a mask."""
    if (target.dim() == 2 and target.shape[1] == num_labels and num_labels > 2 and target.numel() > 0
            and _checking() and bool(((target == 0) | (target == 1)).all())):
        raise type_error(fn, "integer target of shape (B, L) looks like a multi-hot mask", "values in {0, 1}",
                         "pass target.bool() or pad id lists with ignore_index")


def _ranking_targets(fn: str, scores: Tensor, target: object, ignore_index: int,
                     dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """``(pos, y)``: bool positives ``(B, L)`` and relevance ``y`` (0 off the positives)."""
    check_tensor(fn, "target", target)
    b, n_labels = scores.shape
    if target.is_complex():
        raise type_error(fn, "target must be bool, float or integer", str(target.dtype), "pass a real tensor")
    if target.dtype == torch.bool or target.is_floating_point():
        if target.shape != scores.shape:
            kind = "bool" if target.dtype == torch.bool else "float"
            raise value_error(fn, f"{kind} target must have the scores' shape {tuple(scores.shape)}",
                              f"shape {tuple(target.shape)}", "pass integer ids of shape (B,) or (B, P) otherwise")
        if target.dtype == torch.bool:
            return target, target.to(dtype)
        check_finite(fn, "target", target)
        pos = target > 0
        y = upcast(target, dtype)
        return pos, torch.where(pos, y, torch.zeros_like(y))
    # integer ids
    if target.dim() not in (1, 2) or target.shape[0] != b:
        raise value_error(fn, f"integer target must have shape ({b},) or ({b}, P) for scores of shape ({b}, {n_labels})",
                          f"shape {tuple(target.shape)}", "pass one id per row or id lists padded with ignore_index")
    _check_not_a_mask(fn, target, n_labels)
    check_ids_in_range(fn, target, n_labels, ignore_index, hint="ids index the columns of scores; pad with ignore_index")
    ids = target if target.dim() == 2 else target.unsqueeze(1)
    # ignored ids (and, with validation off, out-of-range ids) go to a dummy column L that is
    # dropped afterwards; scatter gives set semantics for repeated ids
    valid = (ids != ignore_index) & (ids >= 0) & (ids < n_labels)
    safe = torch.where(valid, ids, torch.full_like(ids, n_labels)).long()
    pos = torch.zeros(b, n_labels + 1, dtype=torch.bool, device=scores.device)
    pos = pos.scatter(1, safe, True)[:, :n_labels]
    return pos, pos.to(dtype)


def _masked_logsumexp(x: Tensor, keep: Tensor) -> Tensor:
    """Row-wise logsumexp over ``keep``; ``-inf`` (with zero, NaN-free gradients) where empty."""
    has = keep.any(dim=1)
    neg_inf = torch.full((), -math.inf, dtype=x.dtype, device=x.device)
    z = torch.where(keep & has.unsqueeze(1), x, neg_inf)
    z = torch.where(has.unsqueeze(1), z, torch.zeros_like(z))
    return torch.where(has, torch.logsumexp(z, dim=1), neg_inf)


def _gumbel(shape: Tuple[int, ...], generator: Optional[torch.Generator], device: torch.device) -> Tensor:
    gen_device = generator.device if generator is not None else device
    u = torch.rand(shape, generator=generator, device=gen_device, dtype=torch.float64)
    u = u.clamp_min(torch.finfo(torch.float64).tiny)
    return (-torch.log(-torch.log(u))).to(device)


def _sample_keys(pos: Tensor, y: Tensor, generator: Optional[torch.Generator]) -> Tensor:
    """Gumbel keys ``log y + G`` on the positives (``-inf`` elsewhere): the arg-max is a draw from
    ``Categorical(y / sum y)`` and sorting gives draws without replacement."""
    g = _gumbel(tuple(pos.shape), generator, pos.device)
    logy = torch.log(torch.where(pos, y.detach().double(), torch.ones((), dtype=torch.float64, device=pos.device)))
    return torch.where(pos, logy + g, torch.full((), -math.inf, dtype=torch.float64, device=pos.device))


def _loss_dtype(scores: Tensor, target: Tensor) -> torch.dtype:
    return compute_dtype(scores, target if isinstance(target, Tensor) and target.is_floating_point() else None)


# --------------------------------------------------------------------------------------
# per-row values (shared by the functions and the modules)
# --------------------------------------------------------------------------------------


def _scaled(scores: Tensor, avail: Tensor, pos: Tensor, dtype: torch.dtype, temperature: float) -> Tensor:
    """``scores / T`` in ``dtype`` with 0 (a finite placeholder, zero gradient) where excluded and
    in rows without a positive (unit weight 0), so that nothing there, even ``inf``/NaN with the
    data checks off, reaches the value or the gradient."""
    s = upcast(scores, dtype)
    keep = avail & pos.any(dim=1, keepdim=True)
    return torch.where(keep, s, torch.zeros((), dtype=dtype, device=s.device)) / temperature


def _decoupled_rows(fn, scores, target, *, temperature, weighted, sample_one_positive, mask_value, generator,
                    ignore_index, mask=None):
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


def _bisect_threshold(x: Tensor, k: Tensor, n_iter: int, avail: Tensor) -> Tensor:
    """``u`` with ``sum_{l available} sigmoid(x_l + u) = k`` per row, by bisection on a bracket that
    holds for every number ``L_i`` of available candidates: ``sigmoid(z) < e^z`` gives the sum
    ``< k`` at the lower end, and every term exceeds ``k / L_i`` at the upper end. Every row must
    have ``0 < k < L_i`` (the caller substitutes a safe ``k`` in inactive rows)."""
    with torch.no_grad():
        xd = x.detach()
        n_avail = avail.sum(dim=1).to(xd.dtype)
        big = torch.full((), math.inf, dtype=xd.dtype, device=xd.device)
        x_max = torch.where(avail, xd, -big).amax(dim=1)
        x_min = torch.where(avail, xd, big).amin(dim=1)
        lo = -x_max + torch.log(k / n_avail) - 1.0
        hi = -x_min + torch.log(k / (n_avail - k)) + 1.0
        zero = torch.zeros((), dtype=xd.dtype, device=xd.device)
        for _ in range(n_iter):
            mid = 0.5 * (lo + hi)
            p = torch.where(avail, (xd + mid.unsqueeze(1)).sigmoid_(), zero)
            below = p.sum(dim=1) < k
            lo = torch.where(below, mid, lo)
            hi = torch.where(below, hi, mid)
        return 0.5 * (lo + hi)


class _ImplicitThreshold(torch.autograd.Function):
    """Identity on the bisected threshold ``u`` whose backward is the implicit-function gradient
    ``du/dx_m = -v_m / sum_l v_l`` with ``v = p (1 - p)``, ``p = sigmoid(x + u)``, over the
    available candidates (0 elsewhere); the weights are a softmax of
    ``log v = -softplus(z) - softplus(-z)``, so they never divide 0 by 0."""

    @staticmethod
    def forward(ctx, x: Tensor, u: Tensor, avail: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, u, avail)
        return u.clone()

    @staticmethod
    def backward(ctx, grad_u: Tensor):  # type: ignore[override]
        x, u, avail = ctx.saved_tensors
        with no_autocast(grad_u):
            z = x + u.unsqueeze(1)
            log_v = torch.where(avail, -softplus(z) - softplus(-z),
                                torch.full((), -math.inf, dtype=z.dtype, device=z.device))
            weights = torch.softmax(log_v, dim=1)
            return -grad_u.unsqueeze(1) * weights, None, None


def _soft_topk_threshold(scores: Tensor, k: Union[Tensor, float], alpha: float, n_iter: int,
                         avail: Optional[Tensor] = None) -> Tensor:
    """Threshold ``t`` (``(B,)``) with ``sum_{l available} sigmoid(alpha (scores_l + t)) = k``,
    differentiable in ``scores`` by the implicit-function theorem (used by :func:`soft_topk_loss`;
    ``scores`` are the already temperature-scaled ``s``, finite; ``avail`` defaults to all)."""
    x = alpha * scores
    if avail is None:
        avail = torch.ones_like(x, dtype=torch.bool)
    kk = torch.as_tensor(k, dtype=x.dtype, device=x.device).expand(x.shape[0])
    u = _bisect_threshold(x, kk, n_iter, avail)
    return _ImplicitThreshold.apply(x, u, avail) / alpha


def _soft_topk_rows(fn, scores, target, *, k, alpha, temperature, n_iter, variant, generator, ignore_index,
                    mask=None):
    _check_scores(fn, scores)
    mask = _check_candidate_mask(fn, mask, scores)
    dtype = _loss_dtype(scores, target)
    n_labels = scores.shape[1]
    if k == "num_positives":
        if n_labels < 2:
            raise value_error(fn, "soft top-k needs at least 2 labels per row", f"shape {tuple(scores.shape)}",
                              "score more than one label per query")
    elif k >= n_labels:
        raise value_error(fn, f"k must satisfy 0 < k < L = {n_labels}", k, "pick k smaller than the number of labels")
    pos, y = _ranking_targets(fn, scores, target, ignore_index, dtype)
    check_finite_or_masked(fn, "scores", scores)
    avail, pos = _available(fn, scores, mask, pos)
    y = torch.where(pos, y, torch.zeros_like(y))
    s = _scaled(scores, avail, pos, dtype, temperature)
    n_pos = pos.sum(dim=1)
    n_avail = avail.sum(dim=1).to(dtype)
    if k == "num_positives":
        k_row = torch.ceil(y.sum(dim=1))
        if _checking() and bool((k_row >= n_avail).any()):
            raise value_error(fn, f"k='num_positives' needs fewer than L = {n_labels} positives per row",
                              f"max k_i={int(k_row.max())}",
                              "drop rows whose labels are all positive or pass an int k (L counts the unmasked "
                              "candidates of the row)")
    else:
        k_row = torch.full((scores.shape[0],), float(k), dtype=dtype, device=scores.device)
        if _checking():
            short = (n_pos > 0) & (k_row >= n_avail)
            if bool(short.any()):
                raise value_error(fn, f"k = {k} must be smaller than the number of unmasked candidates of every row",
                                  _rows_list(short), "mask fewer candidates or pick a smaller k")
    pos_loss = pos
    if variant == "reference":
        # keep min(k_i, |P_i|) sampled positives; the other positives' scaled scores become -100
        keys = _sample_keys(pos, y, generator)
        order = keys.argsort(dim=1, descending=True)
        ranks = torch.empty_like(order).scatter_(
            1, order, torch.arange(n_labels, device=order.device).expand_as(order).contiguous())
        keep = torch.minimum(k_row, n_pos.to(dtype)).unsqueeze(1)
        pos_loss = pos & (ranks.to(dtype) < keep)
        s = torch.where(pos & ~pos_loss, torch.full((), _REFERENCE_MASK, dtype=dtype, device=s.device), s)
    active = (pos_loss.sum(dim=1) > 0) & (k_row > 0) & (k_row < n_avail)
    # inactive rows (no positive, k_i = 0; with validation off also too few candidates) get a
    # safe k, and rows with fewer than 2 candidates use every entry as a placeholder: finite, weight 0
    avail_c = torch.where(((n_avail >= 2) & (n_pos > 0)).unsqueeze(1), avail, torch.ones_like(avail))
    k_safe = torch.where(active, k_row, avail_c.sum(dim=1).to(dtype) / 2.0)
    t = _soft_topk_threshold(s, k_safe, alpha, n_iter, avail_c)
    terms = softplus(-alpha * (s + t.unsqueeze(1)))  # -log p_il
    n_loss = pos_loss.sum(dim=1)
    values = torch.where(pos_loss, terms, torch.zeros_like(terms)).sum(dim=1) / n_loss.clamp_min(1).to(dtype)
    return values, active.to(dtype)


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
    _check_bool(fn, "weighted", weighted)
    check_choice(fn, "variant", variant, VARIANTS)
    _check_bool(fn, "sample_one_positive", sample_one_positive, allow_none=True)
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


def soft_topk_loss(
    scores: Tensor,
    target: Tensor,
    *,
    k: Union[int, str] = 5,
    alpha: float = 2.0,
    temperature: float = 0.05,
    n_iter: int = 32,
    variant: str = "paper",
    mask: Optional[Tensor] = None,
    generator: Optional[torch.Generator] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Soft top-k loss: the positives' log-probabilities of being in a smooth top-k set.

    With ``s_il = scores[i, l] / temperature``, the threshold ``t_i`` solves
    ``sum_l sigmoid(alpha (s_il + t_i)) = k_i`` and ``p_il = sigmoid(alpha (s_il + t_i))``::

        L_i = (1 / |P_i|) * sum_{l in P_i} softplus(-alpha (s_il + t_i))     (= -mean log p_il)

    ``t`` comes from ``n_iter`` bisection steps (no gradient) on
    ``[-max_l s_il + (log(k_i/L) - 1)/alpha, -min_l s_il + (log(k_i/(L-k_i)) + 1)/alpha]``, which
    brackets the root for every L, and is differentiated implicitly: with ``v = p (1 - p)``,
    ``dt_i/ds_im = -v_im / sum_l v_il`` (a custom ``autograd.Function``). Positives stay in each
    other's denominators.

    Args:
        scores, target: as :func:`decoupled_softmax_loss`.
        k: an int with ``0 < k < L``, or ``"num_positives"`` (``k_i = ceil(sum_l y_il)``; a row
            with ``k_i >= L`` raises, a data check). Default 5.
        alpha: sigmoid sharpness ``> 0`` (default 2).
        temperature: ``> 0`` (default 0.05).
        n_iter: bisection steps (default 32).
        variant: ``"paper"`` or ``"reference"``: the reference keeps ``min(k_i, |P_i|)`` positives
            per row, drawn without replacement with probabilities ``~ y`` (``generator``), and
            overwrites the other positives' scaled scores with -100; it equals the paper when
            no row has more than ``k_i`` positives.
        mask: ``(B, L)`` bool, ``True`` = exclude the candidate; as a ``-inf`` score there. The
            threshold is then solved over the ``L_i`` remaining candidates of the row (the loss
            of the reduced row; gradient exactly 0 at excluded entries), and ``k`` must be
            ``< L_i`` in every row with a positive (data check). A removed positive, or a row
            without any candidate, raises ``ValueError``.
        generator: random source of the reference variant's draws.
        reduction: ``"none"`` (``(B,)``), ``"mean"`` or ``"sum"``.

    A row without positives has loss 0 and unit weight 0.

    Paper: N. Gupta et al., *Dual-Encoders for Extreme Multi-label Classification*, ICLR 2024,
    arXiv:2310.10636.

    >>> import torch, losses
    >>> scores = torch.zeros(1, 4)                     # equal scores: L_i = log(L / k)
    >>> loss = losses.soft_topk_loss(scores, torch.tensor([0]), k=2)
    >>> bool(torch.isclose(loss, torch.tensor(2.0).log()))
    True
    """
    fn = "soft_topk_loss"
    check_reduction(fn, reduction)
    _check_k(fn, k)
    check_number(fn, "alpha", alpha, low=0.0, low_inclusive=False)
    check_number(fn, "temperature", temperature, low=0.0, low_inclusive=False)
    _check_n_iter(fn, n_iter)
    check_choice(fn, "variant", variant, VARIANTS)
    with no_autocast(scores):
        values, weights = _soft_topk_rows(fn, scores, target, k=k, alpha=float(alpha),
                                          temperature=float(temperature), n_iter=n_iter, variant=variant,
                                          generator=generator, ignore_index=ignore_index, mask=mask)
        return reduce_loss(values, weights, reduction, anchors=(scores,))


def in_batch_scores(
    query: Tensor,
    keys: Tensor,
    target: Tensor,
    *,
    gather_distributed: bool = False,
    mask: Optional[Tensor] = None,
    ignore_index: int = -100,
) -> Tuple[Tensor, Tensor]:
    r"""Score every query against every key: ``scores = query @ keys_all.T`` and the matching target.

    ``query (B, D)``, ``keys (K, D)``; ``target`` names each query's positive keys among this
    rank's ``K`` keys: integer ids ``(B,)`` / ``(B, P)`` (padded with ``ignore_index``) or a bool /
    float ``(B, K)`` mask. With ``gather_distributed=True`` under an initialised multi-rank
    process group, ``keys`` are all-gathered from every rank (a global negative pool, rank order;
    the backward sums the gradients over ranks) and the target is moved into global columns: ids
    are offset by ``rank * K`` (``ignore_index`` stays), masks are placed in this rank's column
    block of a ``(B, world_size * K)`` zero mask. Every rank must pass the same ``K``. Without a
    process group (or with the flag off) ``keys_all = keys`` and ``target`` is returned as is.

    ``mask`` (bool, ``True`` = exclude, e.g. a known false negative) has shape ``(B, K)`` (this
    rank's keys; gathered: placed in this rank's column block, the other ranks' keys stay in) or
    ``(B, world_size * K)`` (every key); the returned scores are ``-inf`` there (gradient
    exactly 0), which the ranking losses treat as a missing candidate.

    Computed in float32 or wider (float64 if either input is float64). Used by the modules of
    :func:`decoupled_softmax_loss`, :func:`infonce_loss` and :func:`soft_topk_loss` for
    ``forward(query, keys, target)`` (Gupta et al., arXiv:2310.10636).

    >>> import torch, losses
    >>> q, k = torch.eye(2), torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    >>> scores, t = losses.in_batch_scores(q, k, torch.tensor([0, 1]))
    >>> scores
    tensor([[1., 0.],
            [0., 2.]])
    """
    fn = "in_batch_scores"
    check_floating(fn, "query", query)
    check_floating(fn, "keys", keys)
    check_tensor(fn, "target", target)
    _check_bool(fn, "gather_distributed", gather_distributed)
    if query.dim() != 2 or keys.dim() != 2 or query.shape[1] != keys.shape[1]:
        raise value_error(fn, "query and keys must have shapes (B, D) and (K, D) with the same D",
                          f"shapes {tuple(query.shape)} and {tuple(keys.shape)}", "pass one embedding per row")
    dtype = compute_dtype(query, keys)
    q = upcast(query, dtype)
    kk = upcast(keys, dtype)
    if mask is not None:
        check_tensor(fn, "mask", mask)
        if mask.dtype != torch.bool:
            raise type_error(fn, "mask must be a bool tensor (True = exclude the key)", str(mask.dtype),
                             "pass mask.bool()")
    gathered = gather_distributed and is_distributed()
    n_world = world_size() if gathered else 1
    if mask is not None:
        shapes = [(query.shape[0], keys.shape[0])] + ([(query.shape[0], n_world * keys.shape[0])] if gathered else [])
        if tuple(mask.shape) not in shapes:
            raise value_error(fn, "mask must have shape " + " or ".join(str(t) for t in shapes)
                              + ", one flag per (query, key)", f"shape {tuple(mask.shape)}",
                              "pass True where a key must not be a candidate for the query")
        if gathered and tuple(mask.shape) == shapes[0]:
            r_, w_ = rank(), n_world
            n_keys = keys.shape[0]
            mask = torch.cat([mask.new_zeros(query.shape[0], r_ * n_keys), mask,
                              mask.new_zeros(query.shape[0], (w_ - r_ - 1) * n_keys)], dim=1)
    if gathered:
        n_keys = keys.shape[0]
        r, w = rank(), world_size()
        if target.dtype == torch.bool or target.is_floating_point():
            if target.shape != (query.shape[0], n_keys):
                raise value_error(fn, f"mask target must have shape ({query.shape[0]}, {n_keys}), one column per key",
                                  f"shape {tuple(target.shape)}", "pass integer ids of the positive keys otherwise")
            left = target.new_zeros(query.shape[0], r * n_keys)
            right = target.new_zeros(query.shape[0], (w - r - 1) * n_keys)
            target = torch.cat([left, target, right], dim=1)
        else:
            if target.dim() not in (1, 2) or target.shape[0] != query.shape[0]:
                raise value_error(fn, f"integer target must have shape ({query.shape[0]},) or ({query.shape[0]}, P)",
                                  f"shape {tuple(target.shape)}", "pass one id per query or padded id lists")
            _check_not_a_mask(fn, target, n_keys)
            check_ids_in_range(fn, target, n_keys, ignore_index, hint="ids index this rank's keys; pad with ignore_index")
            target = torch.where(target != ignore_index, target + r * n_keys, target)
        kk = all_gather_with_grad(kk, fn=fn)
    with no_autocast(q, kk):
        scores = matmul(q, kk.T)
        if mask is not None:
            scores = torch.where(mask.to(scores.device), torch.full((), -math.inf, dtype=scores.dtype,
                                                                    device=scores.device), scores)
    return scores, target


# --------------------------------------------------------------------------------------
# modules
# --------------------------------------------------------------------------------------


def _module_forward(module: nn.Module, rows_fn, a: Tensor, b: Tensor, c: Optional[Tensor],
                    mask: Optional[Tensor] = None) -> Tensor:
    """``forward(scores, target)`` or ``forward(query, keys, target)``, reduced over the global
    batch when ``gather_distributed`` (docs/conventions.md Distributed)."""
    if c is None:
        scores, target, anchors = a, b, (a,)
    else:
        scores, target = in_batch_scores(a, b, c, gather_distributed=module.gather_distributed, mask=mask,
                                         ignore_index=module.ignore_index)
        anchors, mask = (a, b), None
    with no_autocast(scores):
        values, weights = rows_fn(scores, target, mask)
        if module.reduction != "none" and module.gather_distributed and is_distributed():
            fn = type(module).__name__
            values = all_gather_with_grad(values, fn=fn)
            weights = all_gather_no_grad(weights, fn=fn)
        return reduce_loss(values, weights, module.reduction, anchors=anchors)


class _SeededModule(GeneratorStateMixin):
    """Holds an optional private ``torch.Generator`` created lazily (on CPU) from ``seed``; its
    state is in ``state_dict()`` (so a resumed run draws what the uninterrupted run would have),
    and deepcopy and pickle carry it, so copies reproduce the same draws."""

    seed: Optional[int]

    def _generator_or_none(self) -> Optional[torch.Generator]:
        return self._seeded_generator(torch.device("cpu"))


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
        _check_bool(fn, "weighted", weighted)
        check_choice(fn, "variant", variant, VARIANTS)
        _check_bool(fn, "sample_one_positive", sample_one_positive, allow_none=True)
        _check_mask_value(fn, mask_value)
        _check_seed(fn, seed)
        _check_bool(fn, "gather_distributed", gather_distributed)
        check_reduction(fn, reduction)
        self.temperature = float(temperature)
        self.weighted = weighted
        self.variant = variant
        self.sample_one_positive = sample_one_positive
        self.mask_value = None if mask_value is None else float(mask_value)
        self.seed = seed
        self.gather_distributed = gather_distributed
        self.ignore_index = int(ignore_index)
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

        return _module_forward(self, rows, scores_or_query, target_or_keys, target, mask)

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
    ``forward(query, keys, target, *, mask=None)`` with ``query (B, D)``, ``keys (K, D)``, scored
    by :func:`losses.in_batch_scores` (which then takes the mask). Returns a scalar for
    ``"mean"``/``"sum"``, ``(B,)`` for ``"none"``. ``gather_distributed`` as in :class:`DecoupledSoftmaxLoss`. No parameters or
    buffers.
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
        _check_bool(fn, "gather_distributed", gather_distributed)
        check_reduction(fn, reduction)
        self.temperature = float(temperature)
        self.positive_normalization = positive_normalization
        self.gather_distributed = gather_distributed
        self.ignore_index = int(ignore_index)
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

        return _module_forward(self, rows, scores_or_query, target_or_keys, target, mask)

    extra_repr = auto_extra_repr


class SoftTopKLoss(_SeededModule):
    """Soft top-k loss (DEXML soft top-k, arXiv:2310.10636) as a module; the maths is
    :func:`losses.soft_topk_loss`.

    Args:
        k: an int ``0 < k < L`` or ``"num_positives"`` (default 5).
        alpha: sigmoid sharpness ``> 0`` (default 2.0).
        temperature: ``> 0`` (default 0.05).
        n_iter: bisection steps of the threshold (default 32).
        variant: ``"paper"`` (default) or ``"reference"``.
        ignore_index: padding id of integer targets (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        seed: ``None`` (default: the global RNG) or the seed of a private generator for the
            reference variant's draws (its state is in ``state_dict()``, as
            :class:`DecoupledSoftmaxLoss`).
        gather_distributed: with keys, score against every rank's keys and return the loss of the
            global batch on every rank (default False).

    ``forward(scores, target, *, mask=None)`` with ``scores (B, L)`` and ``target`` bool / float
    ``(B, L)`` or integer ids ``(B,)`` / ``(B, P)`` padded with ``ignore_index``; or
    ``forward(query, keys, target, *, mask=None)`` with ``query (B, D)``, ``keys (K, D)``, scored
    by :func:`losses.in_batch_scores` (which then takes the mask). Returns a scalar for
    ``"mean"``/``"sum"``, ``(B,)`` for ``"none"``. ``gather_distributed`` as in :class:`DecoupledSoftmaxLoss`. No parameters or
    buffers.
    """

    def __init__(
        self,
        *,
        k: Union[int, str] = 5,
        alpha: float = 2.0,
        temperature: float = 0.05,
        n_iter: int = 32,
        variant: str = "paper",
        ignore_index: int = -100,
        reduction: str = "mean",
        seed: Optional[int] = None,
        gather_distributed: bool = False,
    ) -> None:
        super().__init__()
        fn = "SoftTopKLoss"
        _check_k(fn, k)
        check_number(fn, "alpha", alpha, low=0.0, low_inclusive=False)
        check_number(fn, "temperature", temperature, low=0.0, low_inclusive=False)
        _check_n_iter(fn, n_iter)
        check_choice(fn, "variant", variant, VARIANTS)
        _check_seed(fn, seed)
        _check_bool(fn, "gather_distributed", gather_distributed)
        check_reduction(fn, reduction)
        self.k = k
        self.alpha = float(alpha)
        self.temperature = float(temperature)
        self.n_iter = n_iter
        self.variant = variant
        self.seed = seed
        self.gather_distributed = gather_distributed
        self.ignore_index = int(ignore_index)
        self.reduction = reduction
        self._generator: Optional[torch.Generator] = None

    def forward(self, scores_or_query: Tensor, target_or_keys: Tensor, target: Optional[Tensor] = None, *,
                mask: Optional[Tensor] = None) -> Tensor:
        """The soft top-k loss of the scores (or of ``query`` against ``keys``).

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
        gen = self._generator_or_none() if self.variant == "reference" else None

        def rows(s, t, m):
            return _soft_topk_rows("soft_topk_loss", s, t, k=self.k, alpha=self.alpha, temperature=self.temperature,
                                   n_iter=self.n_iter, variant=self.variant, generator=gen,
                                   ignore_index=self.ignore_index, mask=m)

        return _module_forward(self, rows, scores_or_query, target_or_keys, target, mask)

    extra_repr = auto_extra_repr


# --------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------


def _row_unit_weights(scores: Tensor, target: Tensor, *, ignore_index: int = -100, **_: object) -> Tensor:
    """Row weights of the docs/losses/decoupled_softmax.md losses: 1 for a row with at least one positive, else 0."""
    pos, _ = _ranking_targets("unit_weights", scores, target, ignore_index, torch.float64)
    return pos.any(dim=1).double()


def _example_scores(*, generator: Optional[torch.Generator] = None, dtype=torch.float32, case: str = "random"):
    """``(scores (6, 7), bool target)``; ``"extreme"``: scores x1e4 with ``-inf`` on some negatives
    (never a positive; every row keeps at least 4 candidates); ``"ignored"``: no positives."""
    b, n = 6, 7
    x = torch.randn((b, n), generator=generator, dtype=torch.float64)
    t = torch.zeros(b, n, dtype=torch.bool)
    t[torch.arange(b), torch.arange(b) % n] = True
    t[0, 1] = True  # one row with two positives
    if case == "extreme":
        x = x * 1e4
        drop = torch.zeros(b, n, dtype=torch.bool)
        drop[0, 4:] = True
        drop[1, 0] = True
        drop[2, [0, 1, 3]] = True
        x = x.masked_fill(drop & ~t, -math.inf)
    elif case == "ignored":
        t = torch.zeros_like(t)
    return (x.to(dtype), t), {}


_PAPER_DEXML = "N. Gupta et al., Dual-Encoders for Extreme Multi-label Classification, ICLR 2024"

register(
    "decoupled_softmax",
    function=decoupled_softmax_loss,
    module=DecoupledSoftmaxLoss,
    inputs="scores",
    query_keys=True,  # forward(query, keys, target) scores in-batch too
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
    unit="row",
    unit_weights=_row_unit_weights,
    arxiv="1807.03748",
    paper="A. van den Oord, Y. Li, O. Vinyals, Representation Learning with Contrastive Predictive Coding, 2018",
    example_inputs=_example_scores,
)
register(
    "soft_topk",
    function=soft_topk_loss,
    module=SoftTopKLoss,
    inputs="scores",
    query_keys=True,  # forward(query, keys, target) scores in-batch too
    unit="row",
    unit_weights=_row_unit_weights,
    arxiv="2310.10636",
    paper=_PAPER_DEXML + " (soft top-k)",
    example_kwargs={"k": 2},
    example_inputs=_example_scores,
)
