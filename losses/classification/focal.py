"""Focal loss: softmax cross-entropy down-weighted on well-classified positions.

T.-Y. Lin, P. Goyal, R. Girshick, K. He, P. Dollár, *Focal Loss for Dense Object Detection*,
ICCV 2017, arXiv:1708.02002. The paper states the binary (sigmoid) form; this is the multi-class
softmax form of its equation (5), ``-alpha_y (1 - p_y)^gamma log p_y``, written from the maths.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch
from torch import Tensor, nn

from .._core import (
    auto_extra_repr,
    check_class_weight,
    check_floating,
    check_ignore_index,
    check_integer_target,
    check_masked_logits,
    check_number,
    check_reduction,
    compute_dtype,
    no_autocast,
    reduce_weighted_values,
    upcast,
    zero_rows,
)
from .._registry import position_unit_weights, register
from .. import kernels
from ..kernels import triton_rows_module as triton_rows
from ._targets import class_ids, kernel_result, kernel_rows

__all__ = ["focal_loss", "FocalLoss"]


def _check_gamma(fn: str, gamma: float) -> float:
    return check_number(fn, "gamma", gamma, low=0.0,
                        hint="choose gamma >= 0 (0: cross-entropy; the paper's default is 2)")


def _modulating_factor(lp: Tensor, gamma: float) -> Tensor:
    """``(1 - p)^gamma`` from ``lp = log p``, with ``1 - p = -expm1(lp)`` (exact near ``p = 1``).

    Where ``1 - p`` is below the smallest normal number (``p = 1`` to working precision) the
    factor is the constant 0: the loss ``(1 - p)^(gamma + 1)`` and its gradient vanish there, and
    ``(1 - p)^(gamma - 1)`` (the power's derivative) would overflow or meet ``0 * inf``. Where
    ``lp = -inf`` (a target on a masked class) it is the constant 1, so the value is ``+inf`` with
    the finite gradient of cross-entropy, ``softmax - onehot``."""
    if gamma == 0:
        return torch.ones_like(lp)
    q = -torch.expm1(lp)
    ok = (q > torch.finfo(q.dtype).tiny) & (lp > -math.inf)
    q_safe = torch.where(ok, q, torch.ones_like(q))
    const = torch.where(lp == -math.inf, torch.ones_like(q), torch.zeros_like(q))
    return torch.where(ok, q_safe.pow(gamma), const)


def focal_loss(
    input: Tensor,
    target: Tensor,
    *,
    gamma: float = 2.0,
    alpha: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Multi-class focal loss ``-alpha_y (1 - p_y)^gamma log p_y`` (Lin et al., ICCV 2017).

    With logits ``h = input[i, :, ...]``, class id ``y = target[i, ...]`` and
    ``p = softmax(h)``:

    .. math::

        \ell = -\alpha_y \, (1 - p_y)^{\gamma} \log p_y

    ``gamma`` (:math:`\gamma \ge 0`) is the focusing parameter: ``0`` gives cross-entropy, larger
    values shrink the loss of positions the model already classifies well (``p_y`` near 1).
    ``alpha`` (:math:`\alpha`, optional, one weight per class) is the paper's class balance
    factor; without it every class weighs 1.

    ``(1 - p_y)`` is computed as ``-expm1(log p_y)`` and the power only where it is a normal
    number, so the loss is exact at ``p_y = 1`` for every ``gamma > 0``: the value is 0 and the
    gradient exactly 0 (the limit), never NaN.

    Args:
        input: logits ``(N, C)`` or ``(N, C, d1, ..., dk)``, classes on dim 1, ``C >= 2``
            (``C = 1`` raises ``ValueError``: the loss would be identically 0). ``-inf`` entries are
            masks ("this class does not exist for this row"): the value equals the loss with those
            classes removed and their gradient is exactly 0. A target on a masked class gives
            ``+inf`` with the finite gradient ``softmax - onehot`` (as cross-entropy). NaN,
            ``+inf`` and a non-ignored position without a finite logit raise ``ValueError`` (data
            checks).
        target: integer class ids ``(N,)`` / ``(N, d1, ..., dk)``. Soft (probability) targets are
            not supported: a float target raises ``TypeError``.
        gamma: the focusing parameter, ``gamma >= 0`` and finite (default 2.0, the paper's best
            value with ``alpha = 0.25`` for its binary detector).
        alpha: optional per-class weights ``(C,)``: finite, non-negative, not all zero (data
            checks). Applied like ``F.cross_entropy``'s ``weight``.
        ignore_index: positions with this id give 0 and leave the ``"mean"`` denominator.
        reduction: ``"none"`` (shape ``(N, d1, ..., dk)``), ``"mean"`` or ``"sum"``.

    Unit: the position, weight ``alpha[y]`` (1 without ``alpha``), 0 where ``y == ignore_index``.
    As in ``F.cross_entropy``, the ``"none"`` values already carry ``alpha[y]``, ``"sum"`` is their
    sum and ``"mean"`` divides it by the summed ``alpha[y]`` of the non-ignored positions (the
    number of them without ``alpha``). A batch with every position ignored gives an exact,
    graph-attached 0; ignored positions are zeroed before the maths (exactly zero gradients even if
    they hold ``+-inf`` with validation off).

    Half inputs are computed in float32, float64 stays float64; under ``torch.autocast`` the forward
    and backward run in float32 and the gradient comes back in the input's dtype.

    Paper: T.-Y. Lin, P. Goyal, R. Girshick, K. He, P. Dollár, *Focal Loss for Dense Object
    Detection*, ICCV 2017, arXiv:1708.02002 (sigmoid form for detection; the softmax form here is
    the paper's own remark that the loss extends to the multi-class case).

    >>> import torch, losses
    >>> x, y = torch.tensor([[2.0, 0.5, -1.0]]), torch.tensor([0])
    >>> p = torch.softmax(x, 1)[0, 0]
    >>> bool(torch.isclose(losses.focal_loss(x, y, gamma=2.0), -(1 - p) ** 2 * p.log()))
    True
    >>> bool(torch.isclose(losses.focal_loss(x, y, gamma=0.0), torch.nn.functional.cross_entropy(x, y)))
    True
    """
    fn = "focal_loss"
    check_floating(fn, "input", input)
    check_integer_target(fn, target)
    check_reduction(fn, reduction)
    gamma = _check_gamma(fn, gamma)
    if kernels.use_triton(input) and compute_dtype(input, alpha) == torch.float32:  # one fused row kernel
        x2d, ids, out_shape = kernel_rows(fn, input, target, ignore_index)
        check_class_weight(fn, alpha, input.shape[1], name="alpha")
        opts = dict(weight=alpha, ignore_index=ignore_index, mode="focal" if gamma > 0 else "ce", hyper=gamma)
        return kernel_result(triton_rows().softmax_loss(x2d, ids, reduction, **opts), out_shape, reduction)
    x2d, y, valid, out_shape = class_ids(fn, input, target, ignore_index)
    check_class_weight(fn, alpha, input.shape[1], name="alpha")
    finite = check_masked_logits(fn, "input", x2d, active=valid)
    dtype = compute_dtype(input, alpha)
    with no_autocast(input):
        x = zero_rows(upcast(x2d, dtype), valid, verified_finite=finite)
        lp = torch.log_softmax(x, dim=1).gather(1, y.unsqueeze(1)).squeeze(1)
        zero = torch.zeros((), dtype=dtype, device=x.device)
        values = -_modulating_factor(lp, gamma) * lp
        unit = valid.to(dtype)
        if alpha is not None:
            a = upcast(alpha, dtype).to(x.device)[y]
            values = values * a
            unit = unit * a
        values = torch.where(valid, values, zero).reshape(out_shape)
        return reduce_weighted_values(values, unit, reduction)


class FocalLoss(nn.Module):
    """Multi-class focal loss as a module (Lin et al., ICCV 2017, arXiv:1708.02002); the maths is
    :func:`losses.focal_loss`.

    Args:
        gamma: the focusing parameter, ``gamma >= 0`` (default 2.0; 0 is cross-entropy).
        alpha: optional per-class weights ``(C,)`` (a tensor or a list of numbers), stored as the
            buffer ``alpha`` (default None: every class weighs 1).
        ignore_index: target id whose positions are skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    ``forward(input, target)``: ``input (N, C)`` or ``(N, C, d1..dk)`` logits, ``target`` integer
    ids ``(N,)`` / ``(N, d1..dk)``. Returns a scalar for ``"mean"``/``"sum"``, ``(N, d1..dk)`` for
    ``"none"``.

    Buffers: ``alpha`` (``(C,)`` or None).

    >>> import losses
    >>> losses.FocalLoss(gamma=1.0)
    FocalLoss(gamma=1.0, ignore_index=-100, reduction='mean')
    """

    def __init__(
        self,
        *,
        gamma: float = 2.0,
        alpha: Optional[Union[Tensor, Sequence[float]]] = None,
        ignore_index: int = -100,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        check_reduction("FocalLoss", reduction)
        self.gamma = _check_gamma("FocalLoss", gamma)
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction
        if alpha is not None and not isinstance(alpha, Tensor):
            alpha = torch.as_tensor(alpha, dtype=torch.get_default_dtype())
        self.register_buffer("alpha", alpha)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The focal loss of ``input`` against ``target``.

        Args:
            input: logits ``(N, C)`` or ``(N, C, d1..dk)``, classes on dim 1.
            target: integer class ids ``(N,)`` or ``(N, d1..dk)``.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-position losses ``(N, d1..dk)`` (``"none"``).
        """
        return focal_loss(input, target, gamma=self.gamma, alpha=self.alpha, ignore_index=self.ignore_index,
                          reduction=self.reduction)

    extra_repr = auto_extra_repr


register(
    "focal",
    function=focal_loss,
    module=FocalLoss,
    inputs="logits",
    unit="position",
    unit_weights=position_unit_weights,
    arxiv="1708.02002",
    paper="T.-Y. Lin, P. Goyal, R. Girshick, K. He, P. Dollár, Focal Loss for Dense Object Detection, ICCV 2017",
    softmax=True,
    masks=("neg_inf",),
    tensor_args=("alpha",),
)
