"""Logit-adjusted loss: cross-entropy on logits shifted by the log class prior, for long-tailed labels.

A. K. Menon, S. Jayasumana, A. S. Rawat, H. Jain, A. Veit, S. Kumar, *Long-tail learning via
logit adjustment*, ICLR 2021, arXiv:2007.07314. Written from the maths of its equation (10).
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import Tensor, nn

from .._core import (
    as_class_vector,
    _checking,
    auto_extra_repr,
    check_floating,
    check_ignore_index,
    check_logits_dim,
    check_number,
    check_reduction,
    check_softmax_classes,
    compute_dtype,
    value_error,
)
from .._registry import position_unit_weights, register
from ._cross_entropy import softmax_cross_entropy

__all__ = ["logit_adjusted_loss", "LogitAdjustedLoss"]

PriorLike = Union[Tensor, Sequence[float]]


def _check_tau(fn: str, tau: float) -> float:
    return check_number(fn, "tau", tau, low=0.0, hint="choose tau >= 0 (1: the paper's default; 0: cross-entropy)")


def _as_prior(fn: str, class_prior: object) -> Tensor:
    return as_class_vector(fn, "class_prior", class_prior, example="[0.5, 0.3, 0.2]", what="the class frequencies")


def _check_prior(fn: str, prior: Tensor, c: int) -> None:
    if tuple(prior.shape) != (c,):
        raise value_error(fn, f"class_prior must have shape ({c},), one entry per class",
                          f"shape {tuple(prior.shape)}", "pass one frequency per class of input's dim 1")
    if _checking() and prior.numel() > 0:
        p = prior.detach()
        bad = ~torch.isfinite(p) | (p <= 0)
        if bool(bad.any()):
            first = int(bad.nonzero()[0, 0])
            raise value_error(fn, "class_prior must be positive and finite", f"class {first}: {float(p[first])}",
                              "estimate it from the training labels, smoothing classes never seen (or use "
                              "balanced_softmax_loss, which takes raw counts and zero-count classes)")


def logit_adjusted_loss(
    input: Tensor,
    target: Tensor,
    class_prior: PriorLike,
    *,
    tau: float = 1.0,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Logit-adjusted softmax cross-entropy (Menon et al., ICLR 2021).

    With logits ``f = input[i, :, ...]``, class id ``y`` and the class prior ``pi``:

    .. math::

        \ell = -\log \frac{e^{f_y + \tau \log \pi_y}}{\sum_k e^{f_k + \tau \log \pi_k}}

    i.e. :func:`losses.cross_entropy_loss` of ``input + tau * log(class_prior)``. Training with
    the adjustment and predicting with the *unadjusted* logits ``argmax_k f_k`` is the paper's
    Fisher-consistent rule for the balanced error; :meth:`LogitAdjustedLoss.predict_proba` gives
    ``softmax(input)`` for that.

    Args:
        input: logits ``(N, C)`` or ``(N, C, d1, ..., dk)``, classes on dim 1, ``C >= 2``.
            ``-inf`` entries are masks (the value equals the loss without those classes, their
            gradient is exactly 0), as in :func:`losses.cross_entropy_loss`; NaN and ``+inf``
            raise ``ValueError`` (data checks).
        target: integer ids ``(N,)`` / ``(N, d1, ..., dk)``, or class probabilities shaped like
            ``input`` (non-negative, summing to 1).
        class_prior: the training label distribution ``pi``, a ``(C,)`` tensor or a list of ``C``
            numbers, every entry positive and finite (``ValueError`` otherwise: a data check; a
            wrong length is always checked). It need not sum to 1: a common factor shifts every
            logit of a position by one constant, which the softmax cancels, so class counts give
            the same loss as frequencies. Its gradient is not meant to be used (a fixed statistic).
        tau: the adjustment strength ``tau >= 0`` (default 1.0, the paper's choice; 0 gives
            cross-entropy).
        weight: optional per-class weights ``(C,)``, as in :func:`losses.cross_entropy_loss`.
        ignore_index: positions with this id give 0 and leave the ``"mean"`` denominator.
        reduction: ``"none"`` (shape ``(N, d1, ..., dk)``), ``"mean"`` or ``"sum"``.

    Unit: the position, weight ``weight[y]`` (1 without ``weight``), 0 where ``y ==
    ignore_index``; ``"mean"`` divides by the summed unit weights, as ``F.cross_entropy``. An
    all-ignored batch gives an exact, graph-attached 0. Half inputs are computed in float32,
    float64 stays float64, under ``torch.autocast`` the maths runs in float32.

    Paper: A. K. Menon, S. Jayasumana, A. S. Rawat, H. Jain, A. Veit, S. Kumar, *Long-tail
    learning via logit adjustment*, ICLR 2021, arXiv:2007.07314. The default ``tau = 1`` is the
    paper's; its released code adds the same ``tau * log(prior)`` to the logits.

    >>> import torch, losses
    >>> x, y = torch.tensor([[1.0, 0.5, -1.0]]), torch.tensor([2])
    >>> prior = torch.tensor([0.7, 0.2, 0.1])
    >>> ref = torch.nn.functional.cross_entropy(x + prior.log(), y)
    >>> bool(torch.isclose(losses.logit_adjusted_loss(x, y, prior), ref))
    True
    """
    fn = "logit_adjusted_loss"
    check_floating(fn, "input", input)
    tau = _check_tau(fn, tau)
    prior = _as_prior(fn, class_prior)
    check_logits_dim(fn, input, target)
    check_softmax_classes(fn, input.shape[1])  # one class: the cross-entropy hint, before the lengths
    _check_prior(fn, prior, input.shape[1])
    work = torch.promote_types(compute_dtype(input), prior.dtype if prior.is_floating_point() else torch.float32)
    shift = tau * torch.log(prior.to(device=input.device, dtype=work))
    return softmax_cross_entropy(fn, input, target, weight=weight, ignore_index=ignore_index, reduction=reduction,
                                 logit_shift=shift)


class LogitAdjustedLoss(nn.Module):
    """Logit-adjusted loss as a module (Menon et al., ICLR 2021, arXiv:2007.07314); the maths is
    :func:`losses.logit_adjusted_loss`.

    Args:
        class_prior: the training label distribution ``(C,)`` (a tensor or a list of positive
            numbers; counts work as well), stored as the buffer ``class_prior``. Required.
        tau: the adjustment strength ``tau >= 0`` (default 1.0).
        weight: optional per-class weights ``(C,)``, stored as the buffer ``weight``.
        ignore_index: target id whose positions are skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    ``forward(input, target)``: ``input (N, C)`` or ``(N, C, d1..dk)`` logits, ``target`` ids
    ``(N,)`` / ``(N, d1..dk)`` or probabilities shaped like ``input``. Returns a scalar for
    ``"mean"``/``"sum"``, ``(N, d1..dk)`` for ``"none"``.

    ``predict_proba(input)``: ``softmax(input)`` over dim 1, the *unadjusted* prediction the
    paper evaluates (the Lightning modules use it for accuracy and calibration).

    Buffers: ``class_prior`` (``(C,)``; a list or integer counts are kept in float64), ``weight`` (``(C,)`` or None).

    >>> import losses
    >>> losses.LogitAdjustedLoss(class_prior=[0.5, 0.3, 0.2], tau=1.5)
    LogitAdjustedLoss(tau=1.5, ignore_index=-100, reduction='mean')
    """

    def __init__(
        self,
        *,
        class_prior: PriorLike,
        tau: float = 1.0,
        weight: Optional[Tensor] = None,
        ignore_index: int = -100,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_reduction(name, reduction)
        self.tau = _check_tau(name, tau)
        prior = _as_prior(name, class_prior)
        if prior.dim() != 1:
            raise value_error(name, "class_prior must be 1-D, one entry per class", f"shape {tuple(prior.shape)}",
                              "pass one frequency per class")
        if not prior.is_floating_point():
            prior = prior.double()  # counts: kept exactly (a list is float64 already)
        self.ignore_index = check_ignore_index(name, ignore_index)
        self.reduction = reduction
        self.register_buffer("class_prior", prior.clone())
        self.register_buffer("weight", None if weight is None else torch.as_tensor(weight))

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The logit-adjusted loss of ``input`` against ``target``.

        Args:
            input: logits ``(N, C)`` or ``(N, C, d1..dk)``, classes on dim 1.
            target: class ids ``(N,)`` / ``(N, d1..dk)`` or probabilities shaped like ``input``.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-position losses ``(N, d1..dk)`` (``"none"``).
        """
        return logit_adjusted_loss(input, target, self.class_prior, tau=self.tau, weight=self.weight,
                                   ignore_index=self.ignore_index, reduction=self.reduction)

    def predict_proba(self, input: Tensor) -> Tensor:
        """``softmax(input)`` over the classes (dim 1): the unadjusted prediction (at least float32)."""
        x = input if input.dtype == torch.float64 else input.float()
        return torch.softmax(x, dim=1)

    extra_repr = auto_extra_repr


def _example_kwargs() -> dict:
    return {"class_prior": [0.4, 0.25, 0.15, 0.12, 0.08]}  # C = 5, the registry's example logits


register(
    "logit_adjusted",
    function=logit_adjusted_loss,
    module=LogitAdjustedLoss,
    inputs="logits",
    unit="position",
    unit_weights=position_unit_weights,
    arxiv="2007.07314",
    paper="A. K. Menon, S. Jayasumana, A. S. Rawat, H. Jain, A. Veit, S. Kumar, Long-tail learning via logit "
          "adjustment, ICLR 2021",
    example_kwargs=_example_kwargs(),
    softmax=True,
    masks=("neg_inf",),
    soft_targets=True,
    class_weight=True,
    weighted_mean=True,
    tensor_args=("class_prior", "weight"),
)
