"""Baselines the papers compare against: softmax cross-entropy and binary cross-entropy.

Both are thin, validated wrappers of :func:`torch.nn.functional.cross_entropy` and
:func:`torch.nn.functional.binary_cross_entropy_with_logits` that follow the library's
conventions (error format, dtype rule, all-ignored batch gives an attached 0 instead of NaN).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._core import (
    check_finite,
    check_floating,
    check_ids_in_range,
    check_number,
    check_reduction,
    check_tensor,
    check_unit_interval,
    compute_dtype,
    flatten_logits_and_target,
    reduce_loss,
    upcast,
    value_error,
)
from .._registry import register
from .._softcap import apply_softcap, check_softcap
from ._targets import broadcast_class_weight, elementwise_targets

__all__ = ["cross_entropy_loss", "bce_with_logits_loss", "CrossEntropyLoss", "BCEWithLogitsLoss"]


def _check_class_weight(fn: str, weight: Optional[Tensor], c: int) -> None:
    if weight is None:
        return
    check_tensor(fn, "weight", weight)
    if weight.shape != (c,):
        raise value_error(fn, f"weight must have shape ({c},), one per class", f"shape {tuple(weight.shape)}",
                          "pass a 1-D tensor of class weights")
    check_finite(fn, "weight", weight)


def cross_entropy_loss(
    input: Tensor,
    target: Tensor,
    *,
    label_smoothing: float = 0.0,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    softcap: Optional[float] = None,
) -> Tensor:
    r"""Softmax cross-entropy, the baseline of every classification family.

    ``L_i = logsumexp_k(input_ik) - input_{i,y_i}`` for class ids ``y``, or
    ``L_i = -sum_k q_ik log softmax(input_i)_k`` for a float (soft) target ``q``; label smoothing
    ``eps`` mixes the target with the uniform distribution as :func:`F.cross_entropy` does.

    Shapes: ``input (N, C)`` or ``(N, C, d1..dk)``; ``target`` ids ``(N,)`` / ``(N, d1..dk)`` or
    probabilities shaped like ``input``; ``weight (C,)``. ``"none"`` gives ``(N, d1..dk)``.

    Unit: the position; unit weight ``weight[y_i]`` (1 without ``weight``), 0 where
    ``y_i == ignore_index``. As in :func:`F.cross_entropy`, ``"none"`` values already include
    the class weight (so ``"sum"`` is their sum) and ``"mean"`` divides by the total weight of
    the non-ignored positions. A batch with every position ignored gives an exact,
    graph-attached 0 (:func:`F.cross_entropy` gives NaN). ``-inf`` logits act as masks.

    Half inputs are computed in float32; float64 stays float64.

    ``softcap``: ``None`` (off) or a positive float ``c``; the logits become
    ``c * tanh(input / c)`` (computed in float32 or wider) before the softmax, i.e. final-logit
    soft-capping as in Gemma 2 (arXiv:2408.00118); ``-inf`` entries stay masks.

    >>> import torch, losses
    >>> x = torch.tensor([[2.0, 0.0, -1.0]])
    >>> bool(torch.isclose(losses.cross_entropy_loss(x, torch.tensor([0])),
    ...                    torch.nn.functional.cross_entropy(x, torch.tensor([0]))))
    True
    """
    fn = "cross_entropy_loss"
    check_floating(fn, "input", input)
    check_tensor(fn, "target", target)
    check_reduction(fn, reduction)
    check_number(fn, "label_smoothing", label_smoothing, low=0.0, high=1.0)
    if input.dim() < 2:
        raise value_error(fn, "input must have shape (N, C) or (N, C, d1, ..., dk) with classes on dim 1",
                          f"shape {tuple(input.shape)}", "add a batch dimension with input.unsqueeze(0)")
    c = input.shape[1]
    _check_class_weight(fn, weight, c)
    cap = check_softcap(fn, softcap)
    dtype = compute_dtype(input, weight)
    x = apply_softcap(upcast(input, dtype), cap)
    w = None if weight is None else upcast(weight, dtype)
    check_finite(fn, "input", input, allow_neg_inf=True)
    if target.is_floating_point():
        if target.shape != input.shape:
            raise value_error(fn, f"float target must have the input's shape {tuple(input.shape)}",
                              f"shape {tuple(target.shape)}", "pass class ids as an integer tensor")
        check_finite(fn, "target", target)
        check_unit_interval(fn, "target", target)
        values = F.cross_entropy(x, target.to(dtype), weight=w, label_smoothing=label_smoothing, reduction="none")
        return reduce_loss(values, None, reduction)
    if target.dtype == torch.bool:
        raise TypeError(f"{fn}: target must hold integer class ids or float probabilities (got torch.bool); "
                        "pass target.long() or target.float()")
    flatten_logits_and_target(fn, input, target)  # shape check only
    check_ids_in_range(fn, target, c, ignore_index)
    values = F.cross_entropy(x, target.long(), weight=w, ignore_index=ignore_index,
                             label_smoothing=label_smoothing, reduction="none")
    valid = target != ignore_index
    unit = valid.to(dtype)
    if w is not None:
        unit = unit * w[torch.where(valid, target, torch.zeros_like(target)).long()]
    if reduction == "none":
        return values
    total = values.sum()
    if reduction == "sum":
        return total
    denom = unit.sum()
    return total / torch.where(denom > 0, denom, torch.ones_like(denom))


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

    ``l = softplus(input) - y * input = -y log sigmoid(input) - (1-y) log(1 - sigmoid(input))``.

    Target: integer ids ``(N, d1..dk)`` (one-hot encoded over dim 1; an ``ignore_index`` id drops
    its whole row of ``C`` elements) or float labels in ``[0, 1]`` shaped like ``input``. Label
    smoothing: ``y -> y (1 - eps) + eps / C``. ``weight`` is ``(C,)`` or shaped like ``input`` and
    scales the values (the unit weight stays 1, as in :func:`F.binary_cross_entropy_with_logits`).

    Unit: the element. ``"none"`` gives ``(N, C, d1..dk)``; ``"mean"`` divides by the number of
    non-ignored elements.

    >>> import torch, losses
    >>> x = torch.zeros(2, 3)
    >>> round(float(losses.bce_with_logits_loss(x, torch.tensor([0, 2]))), 4)
    0.6931
    """
    fn = "bce_with_logits_loss"
    check_floating(fn, "input", input)
    check_reduction(fn, reduction)
    check_number(fn, "label_smoothing", label_smoothing, low=0.0, high=1.0, high_inclusive=False)
    dtype = compute_dtype(input, weight)
    y, unit = elementwise_targets(fn, input, target, label_smoothing=label_smoothing,
                                  ignore_index=ignore_index, dtype=dtype)
    w = broadcast_class_weight(fn, weight, input, dtype)
    check_finite(fn, "input", input)
    if w is not None:
        check_finite(fn, "weight", weight)
    x = upcast(input, dtype)
    values = F.softplus(x) - y * x
    if w is not None:
        values = values * w
    return reduce_loss(values, unit, reduction)


class CrossEntropyLoss(nn.Module):
    """Module form of :func:`cross_entropy_loss`; ``weight`` (if given) is stored as a buffer."""

    def __init__(
        self,
        *,
        label_smoothing: float = 0.0,
        weight: Optional[Tensor] = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        softcap: Optional[float] = None,
    ) -> None:
        super().__init__()
        check_reduction("CrossEntropyLoss", reduction)
        check_number("CrossEntropyLoss", "label_smoothing", label_smoothing, low=0.0, high=1.0)
        self.softcap = check_softcap("CrossEntropyLoss", softcap)
        self.label_smoothing = float(label_smoothing)
        self.ignore_index = int(ignore_index)
        self.reduction = reduction
        self.register_buffer("weight", None if weight is None else torch.as_tensor(weight))

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return cross_entropy_loss(input, target, label_smoothing=self.label_smoothing, weight=self.weight,
                                  ignore_index=self.ignore_index, reduction=self.reduction, softcap=self.softcap)

    def extra_repr(self) -> str:
        return (f"label_smoothing={self.label_smoothing}, ignore_index={self.ignore_index}, "
                f"reduction={self.reduction!r}" + ("" if self.softcap is None else f", softcap={self.softcap}"))


class BCEWithLogitsLoss(nn.Module):
    """Module form of :func:`bce_with_logits_loss`; ``weight`` (if given) is stored as a buffer."""

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
        self.ignore_index = int(ignore_index)
        self.reduction = reduction
        self.register_buffer("weight", None if weight is None else torch.as_tensor(weight))

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return bce_with_logits_loss(input, target, label_smoothing=self.label_smoothing, weight=self.weight,
                                    ignore_index=self.ignore_index, reduction=self.reduction)

    def extra_repr(self) -> str:
        return (f"label_smoothing={self.label_smoothing}, ignore_index={self.ignore_index}, "
                f"reduction={self.reduction!r}")


# --------------------------------------------------------------------------------------
# unit weights (the unit-weight rule, docs/conventions.md), exposed through the registry
# --------------------------------------------------------------------------------------


def position_unit_weights(input: Tensor, target: Tensor, *, ignore_index: int = -100, **_: object) -> Tensor:
    """Unit weights of position-level losses without class weights: 1 where ``target`` is a
    valid id (or for every position of a float target), else 0; shaped ``(N, d1..dk)``."""
    if target.is_floating_point():
        return torch.ones((input.shape[0],) + tuple(input.shape[2:]), dtype=torch.float64)
    return (target != ignore_index).double()


def element_unit_weights(input: Tensor, target: Tensor, *, ignore_index: int = -100, **_: object) -> Tensor:
    """Unit weights of element-level losses: 1 per element of non-ignored rows, shaped like input."""
    if target.is_floating_point():
        return torch.ones(input.shape, dtype=torch.float64)
    valid = (target != ignore_index).double().unsqueeze(1)
    return valid.expand(input.shape).clone()


register(
    "cross_entropy",
    function=cross_entropy_loss,
    module=CrossEntropyLoss,
    inputs="I",
    unit="position",
    unit_weights=position_unit_weights,
    arxiv="",
    paper="Softmax cross-entropy (torch.nn.functional.cross_entropy)",
)
register(
    "bce_with_logits",
    function=bce_with_logits_loss,
    module=BCEWithLogitsLoss,
    inputs="I",
    unit="element",
    unit_weights=element_unit_weights,
    arxiv="",
    paper="Sigmoid binary cross-entropy (torch.nn.functional.binary_cross_entropy_with_logits)",
)
