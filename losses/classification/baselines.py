"""Baselines the papers compare against: softmax cross-entropy and binary cross-entropy.

Both are thin, validated wrappers of :func:`torch.nn.functional.cross_entropy` and
:func:`torch.nn.functional.binary_cross_entropy_with_logits` that follow the library's
conventions (error format, dtype rule, all-ignored batch gives an attached 0 instead of NaN).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._core import (
    add_at_target,
    check_bool,
    once_differentiable,
    check_ignore_index,
    auto_extra_repr,
    check_class_weight,
    check_finite,
    check_floating,
    check_number,
    check_reduction,
    _compiling,
    compute_dtype,
    move_class_dim_last,
    no_autocast,
    reduce_loss,
    upcast,
    zero_rows,
)
from .._precision import softplus
from .._registry import element_unit_weights, position_unit_weights, register
from .._softcap import check_softcap
from ._cross_entropy import softmax_cross_entropy
from .. import kernels
from ._targets import binary_kernel, broadcast_class_weight, elementwise_targets, integer_targets, one_channel

__all__ = ["cross_entropy_loss", "bce_with_logits_loss", "CrossEntropyLoss", "BCEWithLogitsLoss"]


def cross_entropy_loss(
    input: Tensor,
    target: Tensor,
    *,
    label_smoothing: float = 0.0,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    softcap: Optional[float] = None,
    inplace_backward: bool = False,
) -> Tensor:
    r"""Softmax cross-entropy, the baseline of every classification family.

    ``L_i = logsumexp_k(input_ik) - input_{i,y_i}`` for class ids ``y``, or
    ``L_i = -sum_k q_ik log softmax(input_i)_k`` for a float (soft) target ``q``; label smoothing
    ``eps`` mixes the target with the uniform distribution as :func:`F.cross_entropy` does
    (``(1 - eps) w_y L_i + eps/C sum_k w_k (-log softmax_k)`` for ids).

    Shapes: ``input (N, C)`` or ``(N, C, d1..dk)`` with ``C >= 2`` (``C = 1`` raises
    ``ValueError``: the loss would be identically 0; for 0/1 labels use one logit per sample,
    ``bce_with_logits_loss(input.squeeze(1), target.to(input.dtype))``);
    ``target`` ids ``(N,)`` / ``(N, d1..dk)`` or probabilities shaped like ``input`` (each row
    non-negative and summing to 1 within 1e-3, a data check); float labels shaped like the ids
    raise ``TypeError``. ``weight (C,)``: finite, non-negative, not all zero (data checks).
    ``"none"`` gives ``(N, d1..dk)``.

    **Masks.** ``-inf`` logits mean "this class does not exist for this row": the value equals
    the loss with that class removed and its gradient is exactly 0; label smoothing spreads its
    mass ``eps`` over the row's unmasked classes only (``eps / C_row`` each). A target (id, or
    positive probability) on a masked class gives ``+inf`` exactly, with the finite gradient
    ``softmax - target``. NaN, ``+inf`` and a non-ignored row without a finite logit raise
    ``ValueError`` (data checks).

    Unit: the position; unit weight ``weight[y_i]`` (1 without ``weight``), 0 where
    ``y_i == ignore_index``. As in :func:`F.cross_entropy`, ``"none"`` values already include
    the class weight (so ``"sum"`` is their sum) and ``"mean"`` divides by the total weight of
    the non-ignored positions. A batch with every position ignored gives an exact,
    graph-attached 0 (:func:`F.cross_entropy` gives NaN); ignored positions are zeroed before
    the maths, so they give exactly zero gradients even when they hold ``+-inf``.

    Half inputs are computed in float32; float64 stays float64; under ``torch.autocast`` the
    forward and backward run in float32 (as :func:`F.cross_entropy` does).

    ``softcap``: ``None`` (off) or a positive float ``c``; the logits become
    ``c * tanh(input / c)`` (computed in float32 or wider) before the softmax, i.e. final-logit
    soft-capping as in Gemma 2 (arXiv:2408.00118); ``-inf`` entries stay masks.

    **On a GPU** (CUDA logits in float32, bfloat16 or float16, class ids) the loss runs in one fused
    Triton row kernel (``losses/kernels/``): the logits are read in their own dtype, never copied to
    float32, and the gradient is written once in their dtype; ``LOSSES_TRITON=0`` switches it off.
    ``inplace_backward=True`` makes that kernel write the gradient over the logits' own storage
    (no second logits-sized buffer, as Liger-Kernel does). **Danger**: after ``backward()`` the
    tensor passed as ``input`` holds its gradient, not the logits; use it only when nothing reads
    those logits afterwards (no metric on them, no other loss on them, no autograd node that saved
    them, e.g. a soft-capping you applied yourself). Elsewhere (CPU, float64, soft targets) the flag
    changes nothing.

    >>> import torch, losses
    >>> x = torch.tensor([[2.0, 0.0, -1.0]])
    >>> bool(torch.isclose(losses.cross_entropy_loss(x, torch.tensor([0])),
    ...                    torch.nn.functional.cross_entropy(x, torch.tensor([0]))))
    True
    """
    check_bool("cross_entropy_loss", "inplace_backward", inplace_backward)
    return softmax_cross_entropy("cross_entropy_loss", input, target, label_smoothing=label_smoothing,
                                 weight=weight, ignore_index=ignore_index, reduction=reduction, softcap=softcap,
                                 inplace_backward=inplace_backward)


def bce_with_logits_loss(
    input: Tensor,
    target: Tensor,
    *,
    label_smoothing: float = 0.0,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Element-wise sigmoid binary cross-entropy (the one-vs-all baseline of GOL).

    ``l = softplus(input) - y * input = -y log sigmoid(input) - (1-y) log(1 - sigmoid(input))``,
    with the exact ``softplus(x) = max(x, 0) + log1p(exp(-|x|))`` (no linearisation above a
    threshold, so float64 is exact at any magnitude).

    Target: integer ids ``(N, d1..dk)`` (one-hot encoded over dim 1; an ``ignore_index`` id drops
    its whole row of ``C`` elements) or float labels in ``[0, 1]`` shaped like ``input`` (float
    labels shaped like the ids raise ``TypeError``). Label smoothing:
    ``y -> y (1 - eps) + eps / C``. ``weight`` is ``(C,)`` or shaped like ``input`` and scales
    the values (the unit weight stays 1, as in :func:`F.binary_cross_entropy_with_logits`);
    finite and non-negative, and ``(C,)`` class weights not all zero (data checks).

    **-inf logits** are probability 0 (each element is its own sigmoid, so nothing is removed):
    the element gives 0 when its label is 0 and ``+inf`` when its label is positive, and its
    gradient is 0 (the logit is treated as fixed). NaN and ``+inf`` raise ``ValueError``.

    **Without a class dimension**, as :func:`F.binary_cross_entropy_with_logits`: ``input`` of shape
    ``()`` or ``(N,)`` (one logit per element) takes float labels in ``[0, 1]`` of the same shape and
    equals ``F.binary_cross_entropy_with_logits(input, target, weight=weight)``; ``weight`` is then
    shaped like ``input`` or ``(1,)``. Each element is one channel (``C = 1``, as for ``(N, 1)``),
    so label smoothing maps ``y -> y (1 - eps) + eps``. Class ids need the class dimension
    (``TypeError``, whose hint ``target.to(input.dtype)`` takes 0/1 labels as floats). For any
    other shape, float labels shaped like ``input`` are the same element-wise loss (only the
    smoothing's ``C`` and a ``(C,)`` weight read dim 1).

    Unit: the element. ``"none"`` gives the input's shape (``(N, C, d1..dk)``); ``"mean"`` divides
    by the number of non-ignored elements (every element for float labels). Ignored rows are zeroed
    before the maths (exactly zero gradients even with ``+-inf`` there). Under ``torch.autocast`` the
    computation runs in float32 (or float64).

    >>> import torch, losses
    >>> x = torch.zeros(2, 3)
    >>> round(float(losses.bce_with_logits_loss(x, torch.tensor([0, 2]))), 4)
    0.6931
    """
    fn = "bce_with_logits_loss"
    check_floating(fn, "input", input)
    check_reduction(fn, reduction)
    check_number(fn, "label_smoothing", label_smoothing, low=0.0, high=1.0, high_inclusive=False)
    if input.dim() < 2:  # one logit per element: one channel, C = 1
        x, t, w = one_channel(fn, input, target, weight)
        out = bce_with_logits_loss(x, t, label_smoothing=label_smoothing, weight=w, reduction=reduction)
        return out.reshape(input.shape) if reduction == "none" else out
    dtype = compute_dtype(input, weight, target)  # float64 soft targets count; ids never do
    # integer ids, reduced: the fused Function (eagerly 10x faster at C = 1e5); under torch.compile
    # the elementwise form below fuses better (measured 1.21x vs 1.72x compiled F.cross_entropy)
    if (reduction != "none" and not _compiling() and isinstance(target, Tensor) and not target.is_floating_point()
            and not target.is_complex() and target.dtype != torch.bool and input.dim() >= 2
            and (weight is None or (isinstance(weight, Tensor) and weight.dim() == 1))):
        if dtype == torch.float32 and kernels.use_triton(input):  # one fused row kernel (losses/kernels/)
            return binary_kernel(fn, "bce", input, target, float(label_smoothing), weight, ignore_index, reduction)
        return _bce_ids(fn, input, target, float(label_smoothing), weight, ignore_index, reduction, dtype)
    y, unit = elementwise_targets(fn, input, target, label_smoothing=label_smoothing,
                                  ignore_index=ignore_index, dtype=dtype)
    w = broadcast_class_weight(fn, weight, input, dtype)
    finite = check_finite(fn, "input", input, allow_neg_inf=True, neg_inf_note="-inf is allowed (probability 0)")
    with no_autocast(input.device.type):
        zero = torch.zeros((), dtype=dtype, device=input.device)
        x = upcast(input, dtype)
        if _compiling():
            # one traced Function: value and gradient each one element-wise expression, which
            # inductor fuses into one kernel apiece (autograd through the branches of
            # _bce_values compiled to 1.6x compiled F.cross_entropy at (256, 1e5), this to 1.3x)
            if not finite and not target.is_floating_point():
                x = torch.where(unit > 0, x, zero)
            values = _BCEElementwiseFunction.apply(x, y)
        elif finite:  # verified finite: no -inf to define, no +-inf in ignored rows
            values = _bce_values(x, y, zero)
        else:
            if not target.is_floating_point():
                x = torch.where(unit > 0, x, zero)
            neg = x == -math.inf
            xs = torch.where(neg, zero, x)
            values = _bce_values(xs, y, zero)
            values = torch.where(neg, torch.where(y > 0, math.inf, 0.0).to(dtype), values)
        if w is not None:
            values = values * w
        return reduce_loss(values, unit, reduction)


def _bce_values(x: Tensor, y: Tensor, zero: Tensor) -> Tensor:
    """``softplus(x) - y x`` per element without cancellation: ``log(1 + exp(-|x|))`` plus
    ``(1 - y) x`` where ``x > 0`` and ``-y x`` elsewhere (both non-negative for ``y`` in
    ``[0, 1]``), so a confident logit (``softplus(10) - 10 ~ 4.5e-5``) keeps float32 precision.
    ``|x|`` is written as a branch so that the gradient at ``x = 0`` is ``sigmoid(0) - y``.
    ``log1p(exp(.))`` of the non-positive ``-|x|`` rather than ``logaddexp(-|x|, 0)``: the same
    value (``exp`` of a non-positive number cannot overflow), without ``logaddexp``'s handling of
    infinite operands, which compiled to about a third more time per element."""
    pos = x > 0
    return torch.log1p(torch.exp(torch.where(pos, -x, x))) + torch.where(pos, (1 - y) * x, -y * x)


class _BCEElementwiseFunction(torch.autograd.Function):
    """``softplus(x) - y x`` per element (:func:`_bce_values`; ``0`` at ``x = -inf, y = 0`` and
    ``+inf`` at ``x = -inf, y > 0``) with the gradient written out: ``sigmoid(x) - y`` for ``x``
    and ``-x`` for ``y`` (both 0 at ``x = -inf``, where the probability is fixed at 0). Used while
    ``torch.compile`` traces: each direction is one element-wise expression for inductor to fuse.
    The backward is built from differentiable operations, so a second derivative works too."""

    @staticmethod
    def forward(ctx, x, y):  # type: ignore[override]
        ctx.save_for_backward(x, y)
        # _bce_values with its -y x branch written as where(y > 0, -y x, 0): the same value for
        # finite x, and at x = -inf exactly the defined 0 (y = 0) or +inf (y > 0), no NaN
        pos = x > 0
        zero = torch.zeros((), dtype=x.dtype, device=x.device)
        return torch.log1p(torch.exp(torch.where(pos, -x, x))) + torch.where(
            pos, (1 - y) * x, torch.where(y > 0, -y * x, zero))

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x, y = ctx.saved_tensors
        keep = x != -math.inf
        zero = torch.zeros((), dtype=x.dtype, device=x.device)
        gx = torch.where(keep, torch.sigmoid(x) - y, zero) * grad if ctx.needs_input_grad[0] else None
        gy = torch.where(keep, -x, zero) * grad if ctx.needs_input_grad[1] else None
        return gx, gy


class _BCEIdsFunction(torch.autograd.Function):
    """Per-row sums of the binary cross-entropy against smoothed one-hot ids, fused.

    ``forward(x (M, C), ids (M,), eps, w (C,) or None)`` returns ``(M,)``:
    ``sum_{j != y} w_j (softplus(x_j) - (eps/C) x_j) + w_y (softplus(-x_y) + eps (1 - 1/C) x_y)``
    (``= sum_j w_j (softplus(x_j) - y_j x_j)``, each term without cancellation) with the exact
    ``softplus(x) = max(x, 0) + log1p(exp(-|x|))``; no one-hot matrix is built. Backward:
    ``w_j (sigmoid(x_j) - y_j)`` times the row's incoming gradient, 0 at ``-inf`` logits (their
    probability is fixed at 0). ``sigmoid`` is recomputed rather than saved (a pass over the
    logits costs less than writing and reading an ``(M, C)`` buffer). Class weights that require
    grad get ``sum_rows grad_row (softplus(x_j) - y_j x_j)``, as the elementwise form gives them."""

    @staticmethod
    def forward(ctx, x, ids, eps, w):  # type: ignore[override]
        sp = _bce_id_terms(x, ids, eps)
        if w is not None:
            sp.mul_(w)
        row = sp.sum(dim=1)
        ctx.eps = eps
        ctx.save_for_backward(x, ids, w)
        return row

    @staticmethod
    @once_differentiable("bce_with_logits_loss")
    def backward(ctx, grad):  # type: ignore[override]
        x, ids, w = ctx.saved_tensors
        eps = ctx.eps
        g = torch.sigmoid(x)
        if eps > 0:
            g.sub_(eps / x.shape[1])
        g = add_at_target(g, ids, torch.full((), -(1.0 - eps), dtype=g.dtype, device=g.device))
        if w is not None:
            g.mul_(w)
        g.mul_(grad.unsqueeze(1))
        if x.device.type != "cpu" or _compiling() or bool(torch.isneginf(x).any()):
            g = torch.where(x == -math.inf, torch.zeros((), dtype=g.dtype, device=g.device), g)
        gw = None
        if w is not None and ctx.needs_input_grad[3]:  # learnt class weights: sum over rows of grad x term
            gw = (_bce_id_terms(x, ids, eps) * grad.unsqueeze(1)).sum(dim=0)
        return g, None, None, gw


def _bce_id_terms(x: Tensor, ids: Tensor, eps: float) -> Tensor:
    """The unweighted ``(M, C)`` terms ``softplus(x_j) - y_j x_j`` of :class:`_BCEIdsFunction` against
    the smoothed one-hot ``y`` of ``ids``, each without cancellation (a new tensor)."""
    c = x.shape[1]
    if x.dtype == torch.float64:  # softplus(x_j), the term of a label 0, exact at any magnitude
        sp = softplus(x)
    else:  # one fused pass; its linearisation above 20 is below float32 rounding (e^-20 / 20)
        sp = F.softplus(x)
    if eps > 0:
        sp.sub_(x, alpha=eps / c)  # - (eps / C) x_j: the smoothed label of every class
    # the target's own term, softplus(-x_y) + eps (1 - 1/C) x_y, written in place (not subtracted
    # from the row sum, which would cancel softplus(x_y) ~ x_y in float32 at confident logits)
    xy = x.gather(1, ids.unsqueeze(1))
    tgt = softplus(-xy)
    if eps > 0:
        tgt = tgt + (eps * (1.0 - 1.0 / c)) * xy
        tgt = torch.where(xy == -math.inf, math.inf, tgt)  # a positive label on a logit of -inf
    return sp.scatter_(1, ids.unsqueeze(1), tgt)


def _bce_ids(fn: str, input: Tensor, target: Tensor, eps: float, weight: Optional[Tensor], ignore_index: int,
             reduction: str, dtype: torch.dtype) -> Tensor:
    """:func:`bce_with_logits_loss` for integer ids and a reduced output, without the one-hot matrix."""
    ids, valid = integer_targets(fn, input, target, ignore_index)
    x2d, ids, valid = move_class_dim_last(input), ids.reshape(-1), valid.reshape(-1)
    c = x2d.shape[1]
    w = None
    if weight is not None:
        check_class_weight(fn, weight, c, allow_shape=tuple(input.shape))
        w = weight.to(device=input.device, dtype=dtype)
    finite = check_finite(fn, "input", input, allow_neg_inf=True, neg_inf_note="-inf is allowed (probability 0)")
    with no_autocast(input.device.type):
        x = zero_rows(upcast(x2d, dtype), valid, verified_finite=finite)
        rows = _BCEIdsFunction.apply(x, torch.where(valid, ids, torch.zeros_like(ids)), eps, w)
        out = reduce_loss(rows, valid.to(dtype), reduction)
        return out / c if reduction == "mean" else out


class CrossEntropyLoss(nn.Module):
    """Softmax cross-entropy as a module; the maths is :func:`losses.cross_entropy_loss`.

    Args:
        label_smoothing: mixing weight ``eps`` in ``[0, 1]`` of the uniform distribution
            (default 0.0).
        weight: optional per-class weights ``(C,)``, stored as the buffer ``weight`` (default None).
        ignore_index: target id whose positions are skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        softcap: ``None`` (default, off) or ``c > 0``: logits become ``c * tanh(input / c)``.
        inplace_backward: on the GPU kernel path, write the gradient over the logits (default
            False; see :func:`losses.cross_entropy_loss` for when that is safe).

    ``forward(input, target)``: ``input (N, C)`` or ``(N, C, d1..dk)`` logits, ``target`` ids
    ``(N,)`` / ``(N, d1..dk)`` or probabilities shaped like ``input``. Returns a scalar for
    ``"mean"``/``"sum"``, ``(N, d1..dk)`` for ``"none"``.

    Buffers: ``weight`` (``(C,)`` or None).
    """

    def __init__(
        self,
        *,
        label_smoothing: float = 0.0,
        weight: Optional[Tensor] = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        softcap: Optional[float] = None,
        inplace_backward: bool = False,
    ) -> None:
        super().__init__()
        check_reduction("CrossEntropyLoss", reduction)
        self.inplace_backward = check_bool("CrossEntropyLoss", "inplace_backward", inplace_backward)
        check_number("CrossEntropyLoss", "label_smoothing", label_smoothing, low=0.0, high=1.0)
        self.softcap = check_softcap("CrossEntropyLoss", softcap)
        self.label_smoothing = float(label_smoothing)
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction
        self.register_buffer("weight", None if weight is None else torch.as_tensor(weight))

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The cross-entropy of ``input`` against ``target``.

        Args:
            input: logits ``(N, C)`` or ``(N, C, d1..dk)``.
            target: class ids ``(N,)`` / ``(N, d1..dk)``, or probabilities shaped like ``input``.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-position losses ``(N, d1..dk)`` (``"none"``).
        """
        return cross_entropy_loss(input, target, label_smoothing=self.label_smoothing, weight=self.weight,
                                  ignore_index=self.ignore_index, reduction=self.reduction, softcap=self.softcap,
                                  inplace_backward=self.inplace_backward)

    extra_repr = auto_extra_repr

    _repr_omit_none = ("softcap",)
    _repr_omit_false = ("inplace_backward",)


class BCEWithLogitsLoss(nn.Module):
    """Binary cross-entropy on logits as a module; the maths is :func:`losses.bce_with_logits_loss`.

    Args:
        label_smoothing: smoothing ``eps`` in ``[0, 1)``: ``y -> y (1 - eps) + eps / C``
            (default 0.0).
        weight: optional weights ``(C,)`` or shaped like ``input``, stored as the buffer ``weight``
            (default None).
        ignore_index: target id whose whole row of ``C`` elements is skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    ``forward(input, target)``: ``input (N, C)`` or ``(N, C, d1..dk)`` logits, ``target`` ids
    ``(N,)`` / ``(N, d1..dk)`` (one-hot encoded over dim 1) or float labels in ``[0, 1]`` shaped
    like ``input``; or ``input`` ``()`` / ``(N,)`` (one logit per element) with float labels of
    that shape, as :class:`torch.nn.BCEWithLogitsLoss`. Returns a scalar for ``"mean"``/``"sum"``,
    the input's shape for ``"none"``.

    Buffers: ``weight`` (or None).
    """

    def __init__(
        self,
        *,
        label_smoothing: float = 0.0,
        weight: Optional[Tensor] = None,
        ignore_index: int = -100,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        check_reduction("BCEWithLogitsLoss", reduction)
        check_number("BCEWithLogitsLoss", "label_smoothing", label_smoothing, low=0.0, high=1.0,
                     high_inclusive=False)
        self.label_smoothing = float(label_smoothing)
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction
        self.register_buffer("weight", None if weight is None else torch.as_tensor(weight))

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The binary cross-entropy of ``input`` against ``target``.

        Args:
            input: logits ``(N, C)`` or ``(N, C, d1..dk)``; or ``()`` / ``(N,)``, one logit per element.
            target: class ids ``(N,)`` / ``(N, d1..dk)``, or float labels shaped like ``input``.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-element losses, shaped like ``input`` (``"none"``).
        """
        return bce_with_logits_loss(input, target, label_smoothing=self.label_smoothing, weight=self.weight,
                                    ignore_index=self.ignore_index, reduction=self.reduction)

    extra_repr = auto_extra_repr


# --------------------------------------------------------------------------------------
# unit weights (the unit-weight rule, docs/conventions.md), exposed through the registry
# --------------------------------------------------------------------------------------


register(
    "cross_entropy",
    function=cross_entropy_loss,
    module=CrossEntropyLoss,
    inputs="logits",
    unit="position",
    unit_weights=position_unit_weights,
    arxiv="",
    paper="Softmax cross-entropy (torch.nn.functional.cross_entropy)",
    softmax=True,
    masks=("neg_inf",),
    soft_targets=True,
    class_weight=True,
    weighted_mean=True,
    tensor_args=("weight",),
)
register(
    "bce_with_logits",
    function=bce_with_logits_loss,
    module=BCEWithLogitsLoss,
    inputs="logits",
    unit="element",
    unit_weights=element_unit_weights,
    arxiv="",
    paper="Sigmoid binary cross-entropy (torch.nn.functional.binary_cross_entropy_with_logits)",
    dense_targets=True,
    class_weight=True,
    tensor_args=("weight",),
)
