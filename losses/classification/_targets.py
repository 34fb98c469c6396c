"""Target handling shared by the classification losses.

``class_ids`` and ``row_max_logsum`` serve the position-level softmax losses (Z-loss, log-Z
penalty, comp-sum, the adversarial loss).

The element-wise (multi-label style) losses

``bce_with_logits_loss`` and ``gumbel_bce_loss`` (GOL) accept, for input ``(N, C, *)``:

* integer ids ``(N, *)``: one-hot encoded; a position whose id is ``ignore_index`` drops its
  whole row of ``C`` elements (unit weight 0);
* float targets ``(N, C, *)`` in ``[0, 1]`` (soft or multi-hot labels; ``ignore_index`` does not
  apply).

Label smoothing maps ``y -> y (1 - eps) + eps / C``.

Given ``input`` without a class dimension (``()`` or ``(N,)``: one logit per element, as
``F.binary_cross_entropy_with_logits`` takes it), they need float labels shaped like ``input``
and treat each element as one channel (:func:`one_channel`: ``C = 1``, as for ``(N, 1)``).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .._core import (
    _checking,
    all_kept,
    check_masked_logits,
    check_logits_dim,
    check_class_target,
    check_softmax_classes,
    flatten_logits_and_target,
    check_class_weight,
    check_finite,
    check_ids_in_range,
    check_target_shape,
    check_tensor,
    check_unit_interval,
    move_class_dim_last,
    type_error,
    value_error,
)


def integer_targets(fn: str, input: Tensor, target: Tensor, ignore_index: int) -> Tuple[Tensor, Tensor]:
    """``(ids, valid)`` for integer ids ``target (N, d1..dk)`` of ``input (N, C, d1..dk)``: the shape
    and range checks of :func:`elementwise_targets`, without building the dense one-hot tensor
    (for losses that handle ids sparsely). ``ids`` is int64, ``valid`` is ``target != ignore_index``."""
    check_target_shape(fn, input, target, name="integer target")
    if input.shape[1] < 1:  # no class for any id (an empty batch too: the loss would be 0 / 0)
        raise value_error(fn, "input needs at least one class on dim 1 for class ids", f"shape {tuple(input.shape)}",
                          "pass logits for C >= 1 classes")
    check_ids_in_range(fn, target, input.shape[1], ignore_index)
    return target.long(), target != ignore_index


def elementwise_targets(
    fn: str,
    input: Tensor,
    target: Tensor,
    *,
    label_smoothing: float,
    ignore_index: int,
    dtype: torch.dtype,
) -> Tuple[Tensor, Tensor]:
    """Return ``(y, unit_weight)``, both shaped like ``input`` and in ``dtype``."""
    check_tensor(fn, "target", target)
    check_logits_dim(fn, input, target)
    c = input.shape[1]
    if check_class_target(fn, input, target, soft=True, soft_name="labels in [0, 1]"):
        check_finite(fn, "target", target)
        check_unit_interval(fn, "target", target, hint="float targets are probabilities; pass ids as integers")
        y = target.to(dtype)
        unit = torch.ones_like(y)
    else:
        ids, valid = integer_targets(fn, input, target, ignore_index)
        safe = torch.where(valid, ids, torch.zeros_like(ids))
        y = F.one_hot(safe, c).movedim(-1, 1).to(dtype)
        unit = valid.unsqueeze(1).expand_as(y).to(dtype)
    if label_smoothing > 0:
        y = y * (1.0 - label_smoothing) + label_smoothing / c
    return y, unit


def one_channel(fn: str, input: Tensor, target: object,
                weight: Optional[Tensor]) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """An element-wise binary loss's ``input`` without a class dimension (shape ``()`` or ``(N,)``,
    one logit per element) as ``(M, 1)``: one channel, ``C = 1``. ``target`` must be float labels
    shaped like ``input`` (class ids need a class dimension: ``TypeError``); ``weight`` is ``None``,
    shaped like ``input`` (per element) or ``(1,)`` (the one channel's weight). Returns
    ``(input, target, weight)`` reshaped; the caller reshapes a ``"none"`` result to
    ``input.shape``."""
    check_tensor(fn, "target", target)
    if target.dtype == torch.bool or target.is_complex() or not target.is_floating_point():
        raise type_error(
            fn,
            f"input of shape {tuple(input.shape)} has no class dimension (one logit per element), so target "
            "must hold float labels in [0, 1] shaped like it",
            str(target.dtype),
            "pass 0/1 labels as target.to(input.dtype); class ids need logits (N, C) or (N, C, d1, ..., dk) "
            "with classes on dim 1",
        )
    if target.shape != input.shape:
        raise value_error(fn, f"float target must have the input's shape {tuple(input.shape)}",
                          f"shape {tuple(target.shape)}", "pass one label in [0, 1] per logit")
    if isinstance(weight, Tensor) and weight.shape == input.shape:
        weight = weight.reshape(-1, 1)
    elif weight is not None and not (isinstance(weight, Tensor) and tuple(weight.shape) == (1,)):
        check_tensor(fn, "weight", weight)
        raise value_error(fn, f"weight must have the input's shape {tuple(input.shape)} or shape (1,)",
                          f"shape {tuple(weight.shape)}", "pass one weight per logit, or one for all")
    return input.reshape(-1, 1), target.reshape(-1, 1), weight


def broadcast_class_weight(fn: str, weight: Optional[Tensor], input: Tensor, dtype: torch.dtype) -> Optional[Tensor]:
    """``weight`` of shape ``(C,)`` (per class) or the input's shape (per element), as a
    tensor broadcastable to ``input``."""
    if weight is None:
        return None
    c = input.shape[1]
    check_class_weight(fn, weight, c, allow_shape=tuple(input.shape))
    if weight.shape == (c,):
        return weight.to(dtype).view((1, c) + (1,) * (input.dim() - 2))
    return weight.to(dtype)


def row_exp(x: Tensor, m: Tensor) -> Tuple[Tensor, Tensor]:
    """``(e, s)``: the ``(M, C)`` buffer ``e = exp(x - m)`` (``m`` per row) and its row sums."""
    e = torch.sub(x, m.unsqueeze(1)).exp_()
    return e, e.sum(dim=1)


def finite_row_max(x: Tensor) -> Tensor:
    """``(M,)`` row maxima of a 2-D tensor, 0 where a row's max is not finite (all ``-inf``, or
    ``+inf`` / NaN with validation off), so that no ``inf - inf`` arises when it is subtracted."""
    return torch.nan_to_num(x.amax(dim=1), nan=0.0, posinf=0.0, neginf=0.0)


def row_max_exp(x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """``(m, e, s)`` per row of a 2-D tensor: ``m = max_k x_k`` (0 for a row whose max is +-inf,
    only reachable with validation off, so that no ``inf - inf`` arises), ``e = exp(x - m)`` and
    ``s = sum_k e_k``; ``logsumexp(x) = m + log s``. For a caller that reuses ``e`` (a gradient
    written from the forward's buffer); :func:`row_max_logsum` keeps only the logarithm."""
    m = finite_row_max(x)
    return (m, *row_exp(x, m))


def row_max_logsum(x: Tensor) -> Tuple[Tensor, Tensor]:
    """``(m, log_s)`` with ``m = max_k x_k`` and ``log_s = log sum_k exp(x_k - m)`` per row of a
    2-D tensor, so that ``logsumexp(x) = m + log_s``. One temporary, no saved ``(M, C)`` output."""
    m, _, s = row_max_exp(x)
    return m, s.log()


def _checked_rows(fn: str, input: Tensor, target: Tensor, ignore_index: int, softmax: bool):
    """The shape, class-count and id-range checks of the position-level losses, then ``input`` as
    ``(M, C)``, ``target`` as ``(M,)`` and the positions' shape."""
    x2d, t, out_shape = flatten_logits_and_target(fn, input, target)
    c = input.shape[1]
    if c < 1:
        raise value_error(fn, "input needs at least one class", f"C={c}", "pass logits with C >= 1")
    if softmax:
        check_softmax_classes(fn, c)
    check_ids_in_range(fn, target, c, ignore_index)
    return x2d, t, out_shape


def class_ids(fn: str, input: Tensor, target: Tensor, ignore_index: int, *, softmax: bool = True,
              none_if_all_kept: bool = False):
    """Shape checks, flattening and safe ids shared by the position-level losses.

    Returns ``(x2d, safe_ids, valid, out_shape)`` with ``x2d`` of shape ``(M, C)`` (not yet
    upcast), ``safe_ids`` long ``(M,)`` with ignored positions mapped to class 0 and ``valid``
    bool ``(M,)``. ``softmax``: a single class is an error (the loss would be identically 0).
    ``none_if_all_kept``: ``valid`` is ``None`` when no position is ignored and that is known on
    the host (:func:`losses._core.all_kept`: CPU, eager), and the ids are then used as they are.
    """
    x2d, t, out_shape = _checked_rows(fn, input, target, ignore_index, softmax)
    valid = t != ignore_index
    if none_if_all_kept and all_kept(valid):
        return x2d, t.long(), None, out_shape
    safe = torch.where(valid, t, torch.zeros_like(t)).long()
    return x2d, safe, valid, out_shape


def kernel_rows(fn: str, input: Tensor, target: Tensor, ignore_index: int, *, softmax: bool = True,
                finite_hint: Optional[str] = None) -> Tuple[Tensor, Tensor, Tuple[int, ...]]:
    """The checks of :func:`class_ids` for a loss that takes a fused row kernel
    (``losses/kernels/``): ``(x2d (M, C), ids (M,), out_shape)``, with no safe ids or ``valid`` mask
    built (the kernel reads ``ignore_index`` itself). The data checks run as they do on the
    PyTorch path: ``-inf`` as masks (``check_masked_logits``), or every logit finite when
    ``finite_hint`` is given (losses without masks)."""
    x2d, t, out_shape = _checked_rows(fn, input, target, ignore_index, softmax)
    if _checking():
        if finite_hint is not None:
            check_finite(fn, "input", input, hint=finite_hint)
        else:
            check_masked_logits(fn, "input", x2d, active=t.reshape(-1) != ignore_index)
    return x2d, t.reshape(-1), out_shape


def binary_kernel(fn: str, kind: str, input: Tensor, target: Tensor, eps: float, weight: Optional[Tensor],
                  ignore_index: int, reduction: str) -> Tensor:
    """An element-wise binary loss (``kind``: ``"bce"`` / ``"gol"``) of integer ids, reduced, through
    the fused Triton row kernel (``losses/kernels/triton_rows.py``): the checks of the PyTorch
    path (shapes, id range, ``(C,)`` weights, NaN / ``+inf`` logits with ``-inf`` allowed), then one
    kernel launch per direction and one reduction launch."""
    from ..kernels import triton_rows_module

    ids, _ = integer_targets(fn, input, target, ignore_index)
    check_class_weight(fn, weight, input.shape[1])
    check_finite(fn, "input", input, allow_neg_inf=True, neg_inf_note="-inf is allowed (probability 0)")
    return triton_rows_module().binary_reduced(move_class_dim_last(input), ids.reshape(-1), kind=kind,
                                               reduction=reduction, weight=weight, label_smoothing=eps,
                                               ignore_index=ignore_index)


def kernel_result(loss: Tensor, out_shape: Tuple[int, ...], reduction: str) -> Tensor:
    """A kernel's per-row values in the positions' shape (``"none"``), or its reduced scalar."""
    return loss.reshape(out_shape) if reduction == "none" else loss


def fused_divisor(valid: Optional[Tensor], reduction: str, m: int) -> Optional[int]:
    """The divisor of a reduction a loss's autograd Function can do itself, or ``None``.

    With no ignored position (``valid is None``, see :func:`class_ids`) the unit-weight reduction
    is a plain sum (divisor 1) or mean (divisor ``M``, the number of positions), so the Function
    can return ``values.sum() / divisor`` and receive one scalar gradient, without the per-position
    values, the weighted sums of :func:`losses._core.reduce_loss` and their autograd nodes."""
    if valid is not None or reduction == "none" or m == 0:
        return None
    return 1 if reduction == "sum" else m


def reduced_sum(values: Tensor, divisor: Optional[int]) -> Tensor:
    """``values`` as they are (``divisor is None``), else ``values.sum() / divisor`` (the sum for 1)."""
    if divisor is None:
        return values
    total = values.sum()
    return total if divisor == 1 else total / divisor
