"""Comp-sum losses (docs/losses/comp_sum.md): sum-exponential, cross-entropy, GCE and MAE in one family.

A. Mao, M. Mohri, Y. Zhong, *Cross-Entropy Loss Functions: Theoretical Analysis and
Applications*, ICML 2023, arXiv:2304.07288. There is no public code; implemented from the maths.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._core import (
    check_ignore_index,
    auto_extra_repr,
    check_floating,
    check_integer_target,
    check_masked_logits,
    check_number,
    check_reduction,
    compute_dtype,
    no_autocast,
    reduce_loss,
    upcast,
    zero_rows,
)
from .._registry import position_unit_weights, register
from ._comp_sum_kernel import CompSumFunction
from .. import kernels
from ..kernels import triton_rows_module as triton_rows
from ._targets import class_ids, fused_divisor, kernel_result, kernel_rows
from .zloss import _cpu_kernel

__all__ = ["comp_sum_loss", "CompSumLoss"]


def _check_tau(fn: str, tau: float) -> float:
    return check_number(fn, "tau", tau, low=0.0,
                        hint="choose tau >= 0 (0: sum-exponential, 1: cross-entropy, 1+q: GCE, 2: MAE-like)")


def comp_sum_loss(
    input: Tensor,
    target: Tensor,
    *,
    tau: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Comp-sum loss ``Phi^tau(sum_{y' != y} exp(h_{y'} - h_y))`` (Mao, Mohri & Zhong, 2023).

    With logits ``h = input[i, :, ...]``, class id ``y = target[i, ...]``, ``p = softmax(h)`` and
    ``ce = logsumexp(h) - h_y = -log p_y`` (so ``1 + u = e^ce`` for the sum ``u``)::

        Phi^1(u) = log(1 + u)                               -> ce
        Phi^tau(u) = ((1 + u)^(1-tau) - 1) / (1 - tau)      -> expm1((1 - tau) ce) / (1 - tau)

    ``tau`` (``tau >= 0``, the ``Phi`` exponent) selects the member: ``0`` sum-exponential
    ``1/p_y - 1``; ``1`` cross-entropy ``-log p_y``; ``1 + q`` (``0 < q < 1``) the generalised
    cross-entropy ``(1 - p_y^q)/q`` of Zhang & Sabuncu (NeurIPS 2018); ``2`` the MAE-like
    ``1 - p_y``. Powers of ``p_y`` are never taken: the ``expm1`` form is exact and continuous at
    ``tau = 1``.

    Gradient: ``p_y^(tau-1) (p - e_y)``, computed in log space by a custom backward. For
    ``tau < 1`` the value leaves the float32 range once ``(1 - tau) ce > 88.72 + ln(1 - tau)``:
    float32 then returns ``+inf`` and gradient entries reach ``+-inf`` (never NaN). There is no
    clamp; use float64 inputs for such logits.

    Args:
        input: logits ``(N, C)`` or ``(N, C, d1, ..., dk)``, classes on dim 1, ``C >= 2``
            (``C = 1`` raises ``ValueError``: the loss would be identically 0). ``-inf`` entries
            are masks ("this class does not exist for this row"): the value equals the loss with
            those classes removed and their gradient is exactly 0. A target on a masked class
            (``p_y = 0``) gives the exact limit: ``+inf`` for ``tau <= 1`` (gradient ``p - e_y``
            at ``tau = 1``, entries ``+-inf`` for ``tau < 1``; never NaN) and ``1/(tau - 1)`` with
            zero gradient for ``tau > 1``. NaN, ``+inf`` and a non-ignored position without a
            finite logit raise ``ValueError`` (data checks).
        target: integer ids ``(N,)`` / ``(N, d1, ..., dk)``; float targets raise ``TypeError``.
        tau: ``tau >= 0`` and finite (default 1: cross-entropy; the paper analyses [0, 2]; larger
            values are allowed).
        ignore_index: positions with this id give 0 and leave the ``"mean"`` denominator.
        reduction: ``"none"`` (shape ``(N, d1, ..., dk)``), ``"mean"`` or ``"sum"``.

    Unit: the position, weight 1 (0 if ignored). Ignored positions are zeroed before the maths
    (exactly zero gradients even if they hold ``+-inf`` with validation off). Under
    ``torch.autocast`` the computation runs in float32 (or float64).

    Paper: A. Mao, M. Mohri, Y. Zhong, *Cross-Entropy Loss Functions: Theoretical Analysis and
    Applications*, ICML 2023, arXiv:2304.07288. No public code exists, so there is no reference
    variant.

    >>> import torch, losses
    >>> x, y = torch.tensor([[2.0, 0.5, -1.0]]), torch.tensor([1])
    >>> p_y = torch.softmax(x, 1)[0, 1]
    >>> bool(torch.isclose(losses.comp_sum_loss(x, y, tau=2.0), 1 - p_y))
    True
    >>> bool(torch.isclose(losses.comp_sum_loss(x, y, tau=0.0), 1 / p_y - 1))
    True
    """
    fn = "comp_sum_loss"
    check_floating(fn, "input", input)
    check_integer_target(fn, target)
    check_reduction(fn, reduction)
    tau = _check_tau(fn, tau)
    if kernels.use_triton(input):  # one fused row kernel (losses/kernels/triton_rows.py)
        x2d, ids, out_shape = kernel_rows(fn, input, target, ignore_index)
        mode = dict(mode="ce") if tau == 1.0 else dict(mode="comp_sum", hyper=1.0 - tau)
        return kernel_result(triton_rows().softmax_loss(x2d, ids, reduction, ignore_index=ignore_index, **mode),
                             out_shape, reduction)
    x2d, y, valid, out_shape = class_ids(fn, input, target, ignore_index, none_if_all_kept=True)
    finite = check_masked_logits(fn, "input", x2d, active=valid)
    dtype = compute_dtype(input)
    done = _cpu_kernel("comp_sum", x2d, target, dtype, reduction, (tau,), ignore_index)
    if done is not None:  # the CPU kernel (losses/kernels/rows_native.py)
        return done
    with no_autocast(input.device.type):
        x = upcast(x2d, dtype)
        divisor = fused_divisor(valid, reduction, y.numel())
        if divisor is not None:  # nothing ignored, "mean" / "sum": reduced inside the Function
            return CompSumFunction.apply(x, y, tau, divisor, torch.is_grad_enabled())
        if valid is None:
            return reduce_loss(CompSumFunction.apply(x, y, tau).reshape(out_shape), None, reduction)
        values = CompSumFunction.apply(zero_rows(x, valid, verified_finite=finite), y, tau)
        return reduce_loss(values.reshape(out_shape), valid.reshape(out_shape).to(dtype), reduction)


class CompSumLoss(nn.Module):
    """Comp-sum loss as a module (Mao, Mohri & Zhong, ICML 2023, arXiv:2304.07288); the maths is
    :func:`losses.comp_sum_loss`.

    Args:
        tau: the comp-sum exponent, ``tau >= 0`` (default 1.0: cross-entropy).
        ignore_index: target id whose positions are skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    ``forward(input, target)``: ``input (N, C)`` or ``(N, C, d1..dk)`` logits, ``target`` ids
    ``(N,)`` / ``(N, d1..dk)``. Returns a scalar for ``"mean"``/``"sum"``, ``(N, d1..dk)`` for
    ``"none"``. No parameters or buffers.

    >>> import losses
    >>> losses.CompSumLoss(tau=0.5)
    CompSumLoss(tau=0.5, ignore_index=-100, reduction='mean')
    """

    def __init__(self, *, tau: float = 1.0, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__()
        check_reduction("CompSumLoss", reduction)
        self.tau = _check_tau("CompSumLoss", tau)
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The comp-sum loss of ``input`` against ``target``.

        Args:
            input: logits ``(N, C)`` or ``(N, C, d1..dk)``, classes on dim 1.
            target: integer class ids ``(N,)`` or ``(N, d1..dk)``.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-position losses ``(N, d1..dk)`` (``"none"``).
        """
        return comp_sum_loss(input, target, tau=self.tau, ignore_index=self.ignore_index, reduction=self.reduction)

    extra_repr = auto_extra_repr


register(
    "comp_sum",
    function=comp_sum_loss,
    module=CompSumLoss,
    inputs="logits",
    unit="position",
    unit_weights=position_unit_weights,
    arxiv="2304.07288",
    paper="A. Mao, M. Mohri, Y. Zhong, Cross-Entropy Loss Functions: Theoretical Analysis and Applications, ICML 2023",
    example_kwargs={"tau": 0.5},
    softmax=True,
    masks=("neg_inf",),
    documented_inf=True,  # tau < 1: exp((1 - tau) * ce) overflows to +inf on logits x1e4
)
