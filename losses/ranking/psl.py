"""PSL (Pairwise Softmax Loss) with its sampled-softmax and BPR baselines (docs/losses/psl.md).

Each row ``b`` is one (user, positive item) pair scored ``pos_scores[b]`` together with ``N``
sampled negatives scored ``neg_scores[b, j]`` (raw cosine similarities); the caller samples the
negatives.

* W. Yang, J. Chen, X. Xin, S. Zhou, B. Hu, Y. Feng, C. Chen, C. Wang, *PSL: Rethinking and
  Improving Softmax Loss from Pairwise Perspective for Recommendation*, NeurIPS 2024,
  arXiv:2411.00163 (PSL; its softmax baseline is the sampled softmax, SSM).
* S. Rendle, C. Freudenthaler, Z. Gantner, L. Schmidt-Thieme, *BPR: Bayesian Personalized
  Ranking from Implicit Feedback*, UAI 2009, arXiv:1205.2618.

The public PSL code (``Tiny-Snow/IR-Benchmark``) is GPL-3.0; nothing here is taken from it.
This module is written from the formulas of the paper as restated in docs/losses/psl.md.

A ``-inf`` negative score is a negative that is not there: the same as ``neg_mask=False`` at that
entry (value, unit weight, and a gradient of exactly 0). Everything is computed in float32
(float64 for float64 scores), also inside ``torch.autocast``.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from .._core import (
    auto_extra_repr,
    check_bool,
    attached_zero,
    check_choice,
    check_finite,
    check_floating,
    check_number,
    check_reduction,
    check_tensor,
    compute_dtype,
    reduce_loss,
    type_error,
    upcast,
    value_error,
)
from .._masks import check_finite_or_masked
from .._core import no_autocast
from .._precision import softplus
from .._registry import register

__all__ = [
    "psl_loss",
    "sampled_softmax_loss",
    "bpr_loss",
    "PSLLoss",
    "SampledSoftmaxLoss",
    "BPRLoss",
]

VARIANTS = ("paper", "reference")
ACTIVATIONS = ("tanh", "atan", "relu", "exp")
NORMALIZATIONS = ("row", "batch")

#: Largest score_scale that keeps d = score_scale * (neg - pos) inside the activation's domain
#: when scores lie in [-1, 1] (|neg - pos| <= 2): relu needs d > -1, atan needs d > -tan(1).
_SCALE_BOUND = {"relu": 0.5, "atan": math.tan(1.0) / 2.0}


# --------------------------------------------------------------------------------------
# argument handling
# --------------------------------------------------------------------------------------


def _check_psl_hparams(fn: str, *, temperature: float, activation: str, score_scale: float, variant: str,
                       include_positive: Optional[bool], normalization: str, bounded_scores: bool) -> None:
    check_number(fn, "temperature", temperature, low=0.0, low_inclusive=False)
    check_choice(fn, "activation", activation, ACTIVATIONS)
    check_number(fn, "score_scale", score_scale, low=0.0, low_inclusive=False)
    check_choice(fn, "variant", variant, VARIANTS)
    check_bool(fn, "include_positive", include_positive, allow_none=True)
    check_choice(fn, "normalization", normalization, NORMALIZATIONS)
    check_bool(fn, "bounded_scores", bounded_scores)
    if bounded_scores and activation in _SCALE_BOUND and float(score_scale) > _SCALE_BOUND[activation]:
        raise value_error(
            fn,
            f"activation={activation!r} needs score_scale <= {_SCALE_BOUND[activation]:.4g} for scores in [-1, 1]",
            float(score_scale),
            "larger values put d outside the activation's domain",
        )


def _pair_inputs(
    fn: str, pos_scores: Tensor, neg_scores: Tensor, neg_mask: Optional[Tensor]
) -> Tuple[Tensor, Tensor, Optional[Tensor], torch.dtype]:
    """Check shapes and return ``(pos (B,), neg (B, N), mask (B, N), dtype)``.

    A ``-inf`` negative score is a negative that is not there: it is dropped exactly as
    ``neg_mask=False`` (``mask`` is ``neg_mask & (neg_scores > -inf)``) and replaced by a finite
    placeholder with zero gradient. ``-inf`` positive scores are rejected (data check)."""
    check_floating(fn, "pos_scores", pos_scores)
    check_floating(fn, "neg_scores", neg_scores)
    if pos_scores.dim() != 1:
        raise value_error(fn, "pos_scores must have shape (B,), one score per row", f"shape {tuple(pos_scores.shape)}",
                          "squeeze a trailing dimension of size 1 with pos_scores.squeeze(-1)")
    b = pos_scores.shape[0]
    if neg_scores.dim() not in (1, 2) or neg_scores.shape[0] != b:
        raise value_error(fn, f"neg_scores must have shape ({b}, N) or ({b},) for pos_scores of shape ({b},)",
                          f"shape {tuple(neg_scores.shape)}", "pass one row of sampled negative scores per positive")
    if neg_mask is not None:
        check_tensor(fn, "neg_mask", neg_mask)
        if neg_mask.dtype != torch.bool:
            raise type_error(fn, "neg_mask must be a bool tensor (True = valid negative)", str(neg_mask.dtype),
                             "pass neg_mask.bool()")
        if neg_mask.shape != neg_scores.shape:
            raise value_error(fn, f"neg_mask must have the shape of neg_scores {tuple(neg_scores.shape)}",
                              f"shape {tuple(neg_mask.shape)}", "pass one flag per negative score")
    dtype = compute_dtype(pos_scores, neg_scores)
    check_finite(fn, "pos_scores", pos_scores)
    check_finite_or_masked(fn, "neg_scores", neg_scores)
    pos = upcast(pos_scores, dtype)
    neg = upcast(neg_scores, dtype)
    present = neg.detach() != -math.inf
    mask = present if neg_mask is None else present & neg_mask.to(present.device)
    if neg.dim() == 1:  # (B,) means one negative per row
        neg = neg.unsqueeze(1)
        mask = mask.unsqueeze(1)
    # masked pairs and rows without a valid negative (unit weight 0) get finite placeholders with
    # zero gradient: their content (even inf/NaN with the data checks off) never reaches the loss
    zero = torch.zeros((), dtype=dtype, device=neg.device)
    neg = torch.where(mask, neg, zero)
    pos = torch.where(mask.any(dim=1), pos, zero)
    return pos, neg, mask, dtype


def _log_sigma(d: Tensor, activation: str) -> Tuple[Tensor, Optional[Tensor]]:
    """``(log sigma(d), in_domain)``; ``in_domain`` is ``None`` when sigma > 0 everywhere.

    Entries outside the domain (sigma(d) <= 0) get a finite placeholder so that no NaN reaches
    the backward pass; the caller masks them out exactly.
    """
    if activation == "exp":
        return d, None
    if activation == "tanh":  # log(1 + tanh d) = log 2 + log sigmoid(2d)
        return math.log(2.0) - softplus(-2.0 * d), None
    if activation == "relu":  # log max(d + 1, 0)
        ok = d > -1.0
        return torch.log1p(torch.where(ok, d, torch.zeros_like(d))), ok
    # atan: log(1 + arctan d), positive for d > -tan(1)
    a = torch.atan(d)
    ok = a > -1.0
    return torch.log1p(torch.where(ok, a, torch.zeros_like(a))), ok


def _softmax_pair_loss(
    fn: str,
    pos_scores: Tensor,
    neg_scores: Tensor,
    *,
    temperature: float,
    activation: str,
    score_scale: float,
    include_positive: bool,
    normalization: str,
    neg_mask: Optional[Tensor],
    reduction: str,
    return_rows: bool = False,
):
    """Shared body of PSL and SSM: per-row values and unit weights, then the reduction."""
    pos, neg, mask, dtype = _pair_inputs(fn, pos_scores, neg_scores, neg_mask)
    d = score_scale * (neg - pos.unsqueeze(1))
    log_sig, in_domain = _log_sigma(d, activation)
    contrib = in_domain
    if mask is not None:
        contrib = mask if contrib is None else contrib & mask
    neg_inf = torch.full((), -math.inf, dtype=dtype, device=d.device)
    x = log_sig / temperature
    if contrib is not None:
        x = torch.where(contrib, x, neg_inf)
        contrib_all = contrib
    else:
        contrib_all = torch.ones_like(d, dtype=torch.bool)
    valid = mask if mask is not None else torch.ones_like(d, dtype=torch.bool)
    anchors = (pos_scores, neg_scores)

    if normalization == "batch":
        n_valid = valid.sum().to(dtype)
        any_c = contrib_all.any()
        x_safe = torch.where(any_c, x, torch.zeros_like(x))
        lse = torch.logsumexp(x_safe.reshape(-1), dim=0) - torch.log(torch.clamp(n_valid, min=1.0))
        value = softplus(lse) if include_positive else lse
        out = torch.where(any_c, value, torch.zeros_like(value))
        return out + attached_zero(*anchors).to(dtype)

    has = contrib_all.any(dim=1)
    x_safe = torch.where(has.unsqueeze(1), x, torch.zeros_like(x))
    lse = torch.logsumexp(x_safe, dim=1)
    lse = torch.where(has, lse, neg_inf)
    if include_positive:
        values = softplus(lse)  # log(1 + sum_j sigma_j^(1/tau)); 0 when nothing contributes
        weights = valid.any(dim=1)
    else:
        values = torch.where(has, lse, torch.zeros_like(lse))
        weights = has
    weights = weights.to(dtype)
    if return_rows:
        return values, weights
    return reduce_loss(values, weights, reduction, anchors=anchors)


# --------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------


def psl_loss(
    pos_scores: Tensor,
    neg_scores: Tensor,
    *,
    temperature: float = 0.05,
    activation: str = "tanh",
    score_scale: float = 0.5,
    variant: str = "paper",
    include_positive: Optional[bool] = None,
    normalization: str = "row",
    bounded_scores: bool = True,
    neg_mask: Optional[Tensor] = None,
    reduction: str = "mean",
) -> Tensor:
    r"""Pairwise Softmax Loss: softmax loss with the exponential replaced by a tighter surrogate.

    With ``pos = pos_scores`` (``(B,)``), ``neg = neg_scores`` (``(B, N)``), ``kappa =
    score_scale``, ``tau = temperature`` and ``d_bj = kappa * (neg_bj - pos_b)``::

        l_b = log([1] + sum_j sigma(d_bj) ** (1 / tau))
            = softplus(logsumexp_j(log sigma(d_bj) / tau))     with the [1]
            =          logsumexp_j(log sigma(d_bj) / tau)      without it

    where ``sigma`` is the ``activation``:

    ============  ===================  ===================================  ==================
    activation    sigma(d)             log sigma(d) computed as             domain
    ============  ===================  ===================================  ==================
    ``"tanh"``    ``1 + tanh d``       ``log 2 - softplus(-2 d)``           all d
    ``"atan"``    ``1 + arctan d``     ``log1p(arctan d)``                  d > -tan 1
    ``"relu"``    ``max(d + 1, 0)``    ``log1p(d)``                         d > -1
    ``"exp"``     ``exp d``            ``d`` (the sampled softmax)          all d
    ============  ===================  ===================================  ==================

    The ``[1]`` is the positive item's own term ``sigma(0) ** (1/tau) = 1`` (the paper sums
    over all items); it is on when ``include_positive`` is True.

    Args:
        pos_scores: ``(B,)`` raw (cosine) scores of the positives, any float dtype.
        neg_scores: ``(B, N)`` scores of ``N`` sampled negatives per row; ``(B,)`` means N = 1.
        temperature: ``tau > 0``. Paper grid {0.005, 0.025, 0.05, 0.1, 0.25}; default 0.05.
        activation: ``"tanh"`` (default; no domain limit), ``"atan"``, ``"relu"`` or ``"exp"``.
        score_scale: ``kappa > 0``; the paper scores with ``cos / 2``, i.e. ``kappa = 0.5`` and
            ``d in [-1, 1]``.
        variant: ``"paper"`` (``include_positive=True``) or ``"reference"`` (sampled negatives
            only, ``include_positive=False``).
        include_positive: overrides the variant's choice of the ``[1]`` term.
        normalization: ``"row"`` (default) or ``"batch"``: the reference's "method 2",
            ``softplus(logsumexp_{b,j}(log sigma(d_bj) / tau) - log(#valid pairs))`` (without the
            softplus when ``include_positive`` is False); batch-level, only ``reduction="mean"``.
        bounded_scores: the scores lie in ``[-1, 1]``; then ``relu`` with ``kappa > 0.5`` or
            ``atan`` with ``kappa > tan(1)/2 ~ 0.7787`` raises ``ValueError`` (such ``d`` leave
            the domain). Set False for unbounded scores.
        neg_mask: ``(B, N)`` bool, True = valid negative (shaped like ``neg_scores``). A ``-inf``
            negative score is the same as ``neg_mask=False`` there (value, unit weight and a
            gradient of exactly 0); NaN, ``+inf`` and ``-inf`` positive scores raise.
        reduction: ``"none"`` (``(B,)``), ``"mean"`` or ``"sum"``.

    Edge cases: a pair with ``sigma(d) <= 0`` (unbounded scores; relu at ``d = -1``)
    contributes exactly 0 with zero gradient. A row without a valid (unmasked) negative has
    loss 0 and unit weight 0 (it leaves the mean). Without the ``[1]`` a row none of whose
    negatives contributes (``log 0``) also gets value 0 and unit weight 0; in batch mode such a
    batch returns an attached 0. Computed in float32 or wider (``|log sigma / tau|`` reaches ~30).

    Reference temperatures (``Tiny-Snow/IR-Benchmark``, GPL-3.0, not used here): its PSL ``tau``
    (a score divisor, CLI default 2) is ``1 / score_scale`` and its ``tau_star`` is
    ``temperature``.

    Paper: W. Yang et al., *PSL: Rethinking and Improving Softmax Loss from Pairwise Perspective
    for Recommendation*, NeurIPS 2024, arXiv:2411.00163.

    >>> import torch, losses
    >>> pos = torch.tensor([0.9, 0.2])
    >>> neg = torch.tensor([[0.1, -0.3], [0.5, 0.0]])
    >>> psl = losses.psl_loss(pos, neg, activation="exp")
    >>> bool(torch.isclose(psl, losses.sampled_softmax_loss(pos, neg)))
    True
    >>> bool(losses.psl_loss(pos, neg) <= psl)
    True
    """
    fn = "psl_loss"
    _check_psl_hparams(fn, temperature=temperature, activation=activation, score_scale=score_scale,
                       variant=variant, include_positive=include_positive, normalization=normalization,
                       bounded_scores=bounded_scores)
    check_reduction(fn, reduction, ("mean",) if normalization == "batch" else ("none", "mean", "sum"))
    inc = (variant == "paper") if include_positive is None else include_positive
    with no_autocast(pos_scores, neg_scores):
        return _softmax_pair_loss(fn, pos_scores, neg_scores, temperature=float(temperature),
                                  activation=activation, score_scale=float(score_scale), include_positive=inc,
                                  normalization=normalization, neg_mask=neg_mask, reduction=reduction)


def sampled_softmax_loss(
    pos_scores: Tensor,
    neg_scores: Tensor,
    *,
    temperature: float = 0.05,
    score_scale: float = 0.5,
    variant: str = "paper",
    include_positive: Optional[bool] = None,
    neg_mask: Optional[Tensor] = None,
    reduction: str = "mean",
) -> Tensor:
    r"""Sampled softmax (SSM), the softmax baseline of PSL.

    With ``d_bj = score_scale * (neg_scores[b, j] - pos_scores[b])`` and ``tau = temperature``::

        l_b = log([1] + sum_j exp(d_bj / tau))

    i.e. the softmax cross-entropy of the positive against its sampled negatives
    (``F.cross_entropy([0, d_b1 / tau, ..., d_bN / tau], 0)`` with the ``[1]``). The ``[1]``
    (the positive's own term) is on for ``variant="paper"`` and off for ``"reference"``;
    ``include_positive`` overrides it. It equals :func:`psl_loss` with ``activation="exp"``.

    Shapes: ``pos_scores (B,)``, ``neg_scores (B, N)`` (``(B,)`` means N = 1), ``neg_mask (B, N)``
    bool (True = valid; a ``-inf`` negative score counts as masked). ``"none"`` gives ``(B,)``; a
    row without a valid negative has loss 0 and unit weight 0. Reference temperature: the SSM ``tau`` of ``Tiny-Snow/IR-Benchmark`` (on raw
    cosines) equals ``temperature / score_scale``.

    The sampled softmax as the recommendation baseline is the SSM of W. Yang et al., *PSL:
    Rethinking and Improving Softmax Loss from Pairwise Perspective for Recommendation*,
    NeurIPS 2024, arXiv:2411.00163 (Section 2 there, following sampled-softmax recommendation work).

    >>> import torch, losses
    >>> pos, neg = torch.tensor([0.5]), torch.tensor([[0.1, 0.3]])
    >>> logits = torch.cat([torch.zeros(1, 1), 0.5 * (neg - pos[:, None]) / 0.05], dim=1)
    >>> bool(torch.isclose(losses.sampled_softmax_loss(pos, neg),
    ...                    torch.nn.functional.cross_entropy(logits, torch.tensor([0]))))
    True
    """
    fn = "sampled_softmax_loss"
    check_number(fn, "temperature", temperature, low=0.0, low_inclusive=False)
    check_number(fn, "score_scale", score_scale, low=0.0, low_inclusive=False)
    check_choice(fn, "variant", variant, VARIANTS)
    check_bool(fn, "include_positive", include_positive, allow_none=True)
    check_reduction(fn, reduction)
    inc = (variant == "paper") if include_positive is None else include_positive
    with no_autocast(pos_scores, neg_scores):
        return _softmax_pair_loss(fn, pos_scores, neg_scores, temperature=float(temperature), activation="exp",
                                  score_scale=float(score_scale), include_positive=inc, normalization="row",
                                  neg_mask=neg_mask, reduction=reduction)


def bpr_loss(
    pos_scores: Tensor,
    neg_scores: Tensor,
    *,
    neg_mask: Optional[Tensor] = None,
    reduction: str = "mean",
) -> Tensor:
    r"""Bayesian Personalized Ranking: ``l_bj = softplus(neg_bj - pos_b) = -log sigmoid(pos_b - neg_bj)``.

    On raw scores (no scale, no temperature). Unit: the (positive, negative) pair.

    Shapes: ``pos_scores (B,)``, ``neg_scores (B, N)`` or ``(B,)`` (N = 1), ``neg_mask`` bool
    shaped like ``neg_scores`` (True = valid pair; a ``-inf`` negative score counts as masked).
    ``"none"`` returns the shape of ``neg_scores`` with masked pairs 0; ``"mean"`` divides by the
    number of valid pairs.

    Paper: S. Rendle, C. Freudenthaler, Z. Gantner, L. Schmidt-Thieme, *BPR: Bayesian
    Personalized Ranking from Implicit Feedback*, UAI 2009, arXiv:1205.2618.

    >>> import torch, losses
    >>> pos, neg = torch.tensor([1.0]), torch.tensor([[1.0, 3.0]])
    >>> losses.bpr_loss(pos, neg, reduction="none")
    tensor([[0.6931, 2.1269]])
    """
    fn = "bpr_loss"
    check_reduction(fn, reduction)
    shape = neg_scores.shape if isinstance(neg_scores, Tensor) else None
    pos, neg, mask, dtype = _pair_inputs(fn, pos_scores, neg_scores, neg_mask)
    with no_autocast(pos, neg):
        values = softplus(neg - pos.unsqueeze(1))
        weights = mask.to(dtype)
        if reduction == "none" and len(shape) == 1:
            values = values.squeeze(1)
            weights = weights.squeeze(1)
        return reduce_loss(values, weights, reduction, anchors=(pos_scores, neg_scores))


# --------------------------------------------------------------------------------------
# modules
# --------------------------------------------------------------------------------------


class PSLLoss(nn.Module):
    """Pairwise softmax loss (PSL, arXiv:2411.00163) as a module; the maths is :func:`losses.psl_loss`.

    Args:
        temperature: ``tau > 0`` (default 0.05).
        activation: ``"tanh"`` (default), ``"atan"``, ``"relu"`` or ``"exp"``.
        score_scale: ``kappa > 0``, scores are multiplied by it (default 0.5: ``cos / 2``).
        variant: ``"paper"`` (default) or ``"reference"``.
        include_positive: overrides the variant's choice of the positive's own ``[1]`` term
            (default None).
        normalization: ``"row"`` (default) or ``"batch"`` (batch-level, only ``"mean"``).
        bounded_scores: the scores lie in ``[-1, 1]`` (default True; checks the activation's domain).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    ``forward(pos_scores, neg_scores, *, neg_mask=None)``: ``pos_scores (B,)``, ``neg_scores``
    ``(B, N)`` (``(B,)`` means N = 1), optional bool ``neg_mask (B, N)`` (True = valid negative).
    Returns a scalar for ``"mean"``/``"sum"``, ``(B,)`` for ``"none"``. No parameters or buffers.

    >>> import torch, losses
    >>> loss = losses.PSLLoss(activation="relu")
    >>> loss
    PSLLoss(temperature=0.05, activation='relu', score_scale=0.5, variant='paper', include_positive=None, normalization='row', bounded_scores=True, reduction='mean')
    >>> float(loss(torch.tensor([1.0]), torch.tensor([[-1.0]])))
    0.0
    """

    def __init__(
        self,
        *,
        temperature: float = 0.05,
        activation: str = "tanh",
        score_scale: float = 0.5,
        variant: str = "paper",
        include_positive: Optional[bool] = None,
        normalization: str = "row",
        bounded_scores: bool = True,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        fn = "PSLLoss"
        _check_psl_hparams(fn, temperature=temperature, activation=activation, score_scale=score_scale,
                           variant=variant, include_positive=include_positive, normalization=normalization,
                           bounded_scores=bounded_scores)
        check_reduction(fn, reduction, ("mean",) if normalization == "batch" else ("none", "mean", "sum"))
        self.temperature = float(temperature)
        self.activation = activation
        self.score_scale = float(score_scale)
        self.variant = variant
        self.include_positive = include_positive
        self.normalization = normalization
        self.bounded_scores = bounded_scores
        self.reduction = reduction

    def forward(self, pos_scores: Tensor, neg_scores: Tensor, *, neg_mask: Optional[Tensor] = None) -> Tensor:
        """The PSL of the positives against their negatives.

        Args:
            pos_scores: scores of the positives ``(B,)``.
            neg_scores: scores of the sampled negatives ``(B, N)`` (``(B,)`` means N = 1).
            neg_mask: optional bool ``(B, N)``, True = valid negative.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-row losses ``(B,)`` (``"none"``).
        """
        return psl_loss(pos_scores, neg_scores, temperature=self.temperature, activation=self.activation,
                        score_scale=self.score_scale, variant=self.variant, include_positive=self.include_positive,
                        normalization=self.normalization, bounded_scores=self.bounded_scores, neg_mask=neg_mask,
                        reduction=self.reduction)

    extra_repr = auto_extra_repr


class SampledSoftmaxLoss(nn.Module):
    """Sampled softmax loss (SSM, the baseline of arXiv:2411.00163) as a module; the maths is
    :func:`losses.sampled_softmax_loss`.

    Args:
        temperature: ``tau > 0`` (default 0.05).
        score_scale: ``kappa > 0``, scores are multiplied by it (default 0.5).
        variant: ``"paper"`` (default) or ``"reference"``.
        include_positive: overrides the variant's choice of the positive in the denominator
            (default None).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    ``forward(pos_scores, neg_scores, *, neg_mask=None)``: ``pos_scores (B,)``, ``neg_scores``
    ``(B, N)`` (``(B,)`` means N = 1), optional bool ``neg_mask (B, N)`` (True = valid negative).
    Returns a scalar for ``"mean"``/``"sum"``, ``(B,)`` for ``"none"``. No parameters or buffers.
    """

    def __init__(
        self,
        *,
        temperature: float = 0.05,
        score_scale: float = 0.5,
        variant: str = "paper",
        include_positive: Optional[bool] = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        fn = "SampledSoftmaxLoss"
        check_number(fn, "temperature", temperature, low=0.0, low_inclusive=False)
        check_number(fn, "score_scale", score_scale, low=0.0, low_inclusive=False)
        check_choice(fn, "variant", variant, VARIANTS)
        check_bool(fn, "include_positive", include_positive, allow_none=True)
        check_reduction(fn, reduction)
        self.temperature = float(temperature)
        self.score_scale = float(score_scale)
        self.variant = variant
        self.include_positive = include_positive
        self.reduction = reduction

    def forward(self, pos_scores: Tensor, neg_scores: Tensor, *, neg_mask: Optional[Tensor] = None) -> Tensor:
        """The sampled softmax loss of the positives against their negatives.

        Args:
            pos_scores: scores of the positives ``(B,)``.
            neg_scores: scores of the sampled negatives ``(B, N)`` (``(B,)`` means N = 1).
            neg_mask: optional bool ``(B, N)``, True = valid negative.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-row losses ``(B,)`` (``"none"``).
        """
        return sampled_softmax_loss(pos_scores, neg_scores, temperature=self.temperature,
                                    score_scale=self.score_scale, variant=self.variant,
                                    include_positive=self.include_positive, neg_mask=neg_mask,
                                    reduction=self.reduction)

    extra_repr = auto_extra_repr


class BPRLoss(nn.Module):
    """Bayesian personalised ranking loss (BPR, arXiv:1205.2618) as a module; the maths is
    :func:`losses.bpr_loss`.

    Args:
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    ``forward(pos_scores, neg_scores, *, neg_mask=None)``: ``pos_scores (B,)``, ``neg_scores``
    ``(B, N)`` (``(B,)`` means N = 1), optional bool ``neg_mask (B, N)`` (True = valid negative).
    Returns a scalar for ``"mean"``/``"sum"``, the per-pair losses shaped like ``neg_scores`` for
    ``"none"``. No parameters or buffers.
    """

    def __init__(self, *, reduction: str = "mean") -> None:
        super().__init__()
        check_reduction("BPRLoss", reduction)
        self.reduction = reduction

    def forward(self, pos_scores: Tensor, neg_scores: Tensor, *, neg_mask: Optional[Tensor] = None) -> Tensor:
        """The BPR loss of every (positive, negative) pair.

        Args:
            pos_scores: scores of the positives ``(B,)``.
            neg_scores: scores of the sampled negatives ``(B, N)`` (``(B,)`` means N = 1).
            neg_mask: optional bool ``(B, N)``, True = valid negative.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-pair losses shaped like ``neg_scores`` (``"none"``).
        """
        return bpr_loss(pos_scores, neg_scores, neg_mask=neg_mask, reduction=self.reduction)

    extra_repr = auto_extra_repr


# --------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------


def _psl_unit_weights(pos_scores: Tensor, neg_scores: Tensor, *, neg_mask: Optional[Tensor] = None,
                      temperature: float = 0.05, activation: str = "tanh", score_scale: float = 0.5,
                      variant: str = "paper", include_positive: Optional[bool] = None,
                      bounded_scores: bool = True, **_: object) -> Tensor:
    """Row weights of :func:`psl_loss` (row normalisation): 1 for a row with a valid negative
    (without the ``[1]``: with a contributing negative), else 0."""
    inc = (variant == "paper") if include_positive is None else include_positive
    with torch.no_grad():
        _, w = _softmax_pair_loss("psl_loss", pos_scores, neg_scores, temperature=float(temperature),
                                  activation=activation, score_scale=float(score_scale), include_positive=inc,
                                  normalization="row", neg_mask=neg_mask, reduction="none", return_rows=True)
    return w.double()


def _ssm_unit_weights(pos_scores: Tensor, neg_scores: Tensor, *, neg_mask: Optional[Tensor] = None,
                      **_: object) -> Tensor:
    """Row weights of :func:`sampled_softmax_loss`: 1 for a row with a valid negative (unmasked,
    score not ``-inf``), else 0."""
    m = neg_scores.detach() != -math.inf
    if neg_mask is not None:
        m = m & neg_mask
    m = m if m.dim() == 2 else m.unsqueeze(1)
    return m.any(dim=1).double()


def _bpr_unit_weights(pos_scores: Tensor, neg_scores: Tensor, *, neg_mask: Optional[Tensor] = None,
                      **_: object) -> Tensor:
    """Pair weights of :func:`bpr_loss`: ``neg_mask`` (all ones without it) and 0 where the
    negative score is ``-inf``, shaped like neg_scores."""
    m = neg_scores.detach() != -math.inf
    if neg_mask is not None:
        m = m & neg_mask
    return m.double()


def _example_pairs(*, generator: Optional[torch.Generator] = None, dtype=torch.float32, case: str = "random"):
    """``(pos (6,), neg (6, 7))`` cosines; ``"extreme"`` adds ``-inf`` negatives (missing ones, a
    row with none left); ``"ignored"``: every negative masked."""
    b, n = 6, 7
    pos = torch.rand(b, generator=generator, dtype=torch.float64).mul(2).sub(1)
    neg = torch.rand(b, n, generator=generator, dtype=torch.float64).mul(2).sub(1)
    kwargs: dict = {}
    if case == "extreme":
        neg[0] = -math.inf
        neg[1, :3] = -math.inf
        neg[2, 6] = -math.inf
    elif case == "ignored":
        kwargs["neg_mask"] = torch.zeros(b, n, dtype=torch.bool)
    return (pos.to(dtype), neg.to(dtype)), kwargs


register(
    "psl",
    function=psl_loss,
    module=PSLLoss,
    inputs="pairs",
    unit="row",
    unit_weights=_psl_unit_weights,
    example_inputs=_example_pairs,
    arxiv="2411.00163",
    paper="W. Yang et al., PSL: Rethinking and Improving Softmax Loss from Pairwise Perspective for "
          "Recommendation, NeurIPS 2024",
)
register(
    "sampled_softmax",
    function=sampled_softmax_loss,
    module=SampledSoftmaxLoss,
    inputs="pairs",
    unit="row",
    unit_weights=_ssm_unit_weights,
    example_inputs=_example_pairs,
    arxiv="2411.00163",
    paper="Sampled softmax (SSM), the baseline of W. Yang et al., PSL, NeurIPS 2024",
    softmax=True,
)
register(
    "bpr",
    function=bpr_loss,
    module=BPRLoss,
    inputs="pairs",
    unit="pair",
    unit_weights=_bpr_unit_weights,
    example_inputs=_example_pairs,
    arxiv="1205.2618",
    paper="S. Rendle et al., BPR: Bayesian Personalized Ranking from Implicit Feedback, UAI 2009",
)
