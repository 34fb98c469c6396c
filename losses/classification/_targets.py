"""Target handling shared by the element-wise (multi-label style) classification losses.

``bce_with_logits_loss`` and ``gumbel_bce_loss`` (GOL) accept, for input ``(N, C, *)``:

* integer ids ``(N, *)``: one-hot encoded; a position whose id is ``ignore_index`` drops its
  whole row of ``C`` elements (unit weight 0);
* float targets ``(N, C, *)`` in ``[0, 1]`` (soft or multi-hot labels; ``ignore_index`` does not
  apply).

Label smoothing maps ``y -> y (1 - eps) + eps / C``.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .._core import (
    check_class_target,
    check_class_weight,
    check_finite,
    check_ids_in_range,
    check_tensor,
    check_unit_interval,
    value_error,
)


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
    if input.dim() < 2:
        raise value_error(
            fn,
            "input must have shape (N, C) or (N, C, d1, ..., dk) with classes on dim 1",
            f"shape {tuple(input.shape)}",
            "add a batch dimension with input.unsqueeze(0)",
        )
    c = input.shape[1]
    if check_class_target(fn, input, target, soft=True, soft_name="labels in [0, 1]"):
        check_finite(fn, "target", target)
        check_unit_interval(fn, "target", target, hint="float targets are probabilities; pass ids as integers")
        y = target.to(dtype)
        unit = torch.ones_like(y)
    else:
        expected = (input.shape[0],) + tuple(input.shape[2:])
        if tuple(target.shape) != expected:
            raise value_error(
                fn,
                f"integer target shape must be {expected} for input of shape {tuple(input.shape)}",
                f"shape {tuple(target.shape)}",
                "classes go on dim 1 of input and target holds one id per position",
            )
        check_ids_in_range(fn, target, c, ignore_index)
        valid = target != ignore_index
        safe = torch.where(valid, target, torch.zeros_like(target)).long()
        y = F.one_hot(safe, c).movedim(-1, 1).to(dtype)
        unit = valid.unsqueeze(1).expand_as(y).to(dtype)
    if label_smoothing > 0:
        y = y * (1.0 - label_smoothing) + label_smoothing / c
    return y, unit


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
