"""Soft top-k (DEXML, arXiv:2310.10636; docs/losses/decoupled_softmax.md).

* N. Gupta, F. Devvrit, A. S. Rawat, S. Bhojanapalli, P. Jain, I. S. Dhillon, *Dual-Encoders for
  Extreme Multi-label Classification*, ICLR 2024, arXiv:2310.10636. Reference code
  ``nilesh2797/DEXML`` (Apache-2.0); implemented here from the maths.

The threshold ``t`` of each row (``sum_l sigmoid(alpha (s_l + t)) = k``) is found by bisection
and differentiated implicitly; :func:`soft_topk_loss` and :class:`SoftTopKLoss` take the inputs
of :func:`losses.decoupled_softmax_loss` (scores and target, or query, keys and target through
:func:`losses.in_batch_scores`). Re-exported from :mod:`losses.ranking.decoupled`.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .._core import (
    once_differentiable,
    check_ignore_index,
    auto_extra_repr,
    _checking,
    check_choice,
    check_number,
    check_reduction,
    reduce_loss,
    value_error,
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
    _check_k,
    _check_n_iter,
    _check_scores,
    _check_seed,
    _example_scores,
    _loss_dtype,
    _ranking_targets,
    _row_unit_weights,
    _rows_list,
    _sample_keys,
    _scaled,
)
from .in_batch import module_forward

__all__ = ["soft_topk_loss", "SoftTopKLoss"]


# --------------------------------------------------------------------------------------
# threshold (bisection, implicit gradient) and per-row values
# --------------------------------------------------------------------------------------


def _excess(xm: Tensor, u: Tensor, k: Tensor) -> Tuple[Tensor, Tensor]:
    """``f(u) = sum_l sigmoid(xm_l + u) - k`` per row without cancellation, and ``min(p, 1 - p)``
    per entry (``xm`` holds ``-inf`` at unavailable candidates, whose terms are 0). A term with
    ``z = xm + u >= +0`` is written ``1 - sigmoid(-z)``, so
    ``f = (#{z >= +0} - k) - sum_l copysign(sigmoid(-|z_l|), z_l)``: an exact integer offset
    plus a sum of numbers in ``[-1/2, 1/2]``. In the saturated regime (the top candidates' ``p``
    within the dtype's epsilon of 1 and the others' of 0: cosine scores over a small temperature)
    the direct ``sum p - k`` is exactly 0 over a wide range of ``u`` and its root is lost; this
    form keeps its relative precision there."""
    z = xm + u.unsqueeze(1)
    small = z.abs().neg_().sigmoid_()
    n_up = z.shape[1] - torch.signbit(z).sum(dim=1)
    return (n_up.to(xm.dtype) - k) - torch.copysign(small, z).sum(dim=1), small


def _bisect_threshold(x: Tensor, k: Tensor, n_iter: int, avail: Tensor) -> Tensor:
    """``u`` with ``sum_{l available} sigmoid(x_l + u) = k`` per row, by bisection on a bracket that
    holds for every number ``L_i`` of available candidates: ``sigmoid(z) < e^z`` gives the sum
    ``< k`` at the lower end, and every term exceeds ``k / L_i`` at the upper end. Every row must
    have ``0 < k < L_i`` (the caller substitutes a safe ``k`` in inactive rows). The sign of the
    sum's excess over ``k`` comes from :func:`_excess` (no cancellation against ``k``)."""
    with torch.no_grad():
        xd = x.detach()
        n_avail = avail.sum(dim=1).to(xd.dtype)
        big = torch.full((), math.inf, dtype=xd.dtype, device=xd.device)
        xm = torch.where(avail, xd, -big)
        x_max = xm.amax(dim=1)
        x_min = torch.where(avail, xd, big).amin(dim=1)
        lo = -x_max + torch.log(k / n_avail) - 1.0
        hi = -x_min + torch.log(k / (n_avail - k)) + 1.0
        zero = torch.zeros((), dtype=xd.dtype, device=xd.device)
        for _ in range(n_iter):
            mid = 0.5 * (lo + hi)
            below = _excess(xm, mid, k)[0] < 0
            lo = torch.where(below, mid, lo)
            hi = torch.where(below, hi, mid)
        u = 0.5 * (lo + hi)
        # Newton polish inside the final bracket: f is increasing with f' = sum p (1 - p) > 0, so
        # from a bracket of width ~2^-n_iter each step squares the error; the threshold ends at the
        # precision of the dtype (float64 included), not at the bisection's 2^-n_iter. A step that
        # would leave the bracket is cut at its end.
        for _ in range(_NEWTON_STEPS):
            f, small = _excess(xm, u, k)
            fp = (small * (1.0 - small)).sum(dim=1)
            step = torch.where(fp > 0, f / torch.where(fp > 0, fp, torch.ones_like(fp)), zero)
            u = torch.minimum(torch.maximum(u - step, lo), hi)
        return u


#: Newton steps after the bisection (each doubles the correct digits; 2 reach float64 from 2^-32).
_NEWTON_STEPS = 2


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
    @once_differentiable("soft_topk_loss")
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
# public function
# --------------------------------------------------------------------------------------


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
    brackets the root for every L, polished by two Newton steps kept inside the final bracket (exact
    to the dtype's precision, float64 included), and is differentiated implicitly: with ``v = p (1 - p)``,
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
    k = _check_k(fn, k)
    check_number(fn, "alpha", alpha, low=0.0, low_inclusive=False)
    check_number(fn, "temperature", temperature, low=0.0, low_inclusive=False)
    _check_n_iter(fn, n_iter)
    check_choice(fn, "variant", variant, VARIANTS)
    with no_autocast(scores):
        values, weights = _soft_topk_rows(fn, scores, target, k=k, alpha=float(alpha),
                                          temperature=float(temperature), n_iter=n_iter, variant=variant,
                                          generator=generator, ignore_index=ignore_index, mask=mask)
        return reduce_loss(values, weights, reduction, anchors=(scores,))


# --------------------------------------------------------------------------------------
# module
# --------------------------------------------------------------------------------------


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
    ``forward(query, keys, target, *, mask=None)`` with ``query (B, D)``, ``keys (K, D)``, scored by
    :func:`losses.in_batch_scores` (which then takes the mask). Returns a scalar for
    ``"mean"``/``"sum"``, ``(B,)`` for ``"none"``. ``gather_distributed`` as in
    :class:`DecoupledSoftmaxLoss`. No parameters or buffers.
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
        k = _check_k(fn, k)
        check_number(fn, "alpha", alpha, low=0.0, low_inclusive=False)
        check_number(fn, "temperature", temperature, low=0.0, low_inclusive=False)
        _check_n_iter(fn, n_iter)
        check_choice(fn, "variant", variant, VARIANTS)
        _check_seed(fn, seed)
        check_bool(fn, "gather_distributed", gather_distributed)
        check_reduction(fn, reduction)
        self.k = k
        self.alpha = float(alpha)
        self.temperature = float(temperature)
        self.n_iter = n_iter
        self.variant = variant
        self.seed = seed
        self.gather_distributed = gather_distributed
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
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

        return module_forward(self, rows, scores_or_query, target_or_keys, target, mask)

    extra_repr = auto_extra_repr


# --------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------


register(
    "soft_topk",
    function=soft_topk_loss,
    module=SoftTopKLoss,
    inputs="scores",
    query_keys=True,  # forward(query, keys, target) scores in-batch too
    softmax=True,
    masks=("neg_inf", "mask"),
    unit="row",
    unit_weights=_row_unit_weights,
    arxiv="2310.10636",
    paper=_PAPER_DEXML + " (soft top-k)",
    example_kwargs={"k": 2},
    example_inputs=_example_scores,
)
