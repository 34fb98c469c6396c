"""Softmax cross-entropy with the library's checks, shared by the losses built on it
(:func:`losses.cross_entropy_loss`, the logit-adjusted and balanced-softmax losses): one body, its
error messages named after the calling function."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .._core import (
    _checking,
    all_kept,
    check_class_target,
    check_class_weight,
    check_distribution,
    check_finite,
    check_floating,
    check_ids_in_range,
    check_logits_dim,
    check_masked_logits,
    check_number,
    check_reduction,
    check_softmax_classes,
    check_tensor,
    check_unit_interval,
    compute_dtype,
    check_target_shape,
    move_class_dim_last,
    no_autocast,
    reduce_loss,
    reduce_weighted_values,
    upcast,
)
from .._softcap import apply_softcap, check_softcap
from .. import kernels

__all__ = ["softmax_cross_entropy", "class_view"]


def class_view(w: Tensor, input: Tensor) -> Tensor:
    """``(C,)`` class values viewed to broadcast against ``input (N, C, d1..dk)``."""
    return w.view((1, -1) + (1,) * (input.dim() - 2))



def softmax_cross_entropy(
    fn: str,
    input: Tensor,
    target: Tensor,
    *,
    label_smoothing: float = 0.0,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    softcap: Optional[float] = None,
    logit_shift: Optional[Tensor] = None,
    inplace_backward: bool = False,
) -> Tensor:
    """:func:`losses.cross_entropy_loss` (see there for the maths, masks, units and dtypes) with
    the errors of ``fn``. ``logit_shift``: an already validated ``(C,)`` tensor added to the
    (soft-capped, upcast) logits of every position before the softmax; a ``-inf`` entry removes
    that class like a ``-inf`` logit does. The dtype follows ``input``, ``weight`` and a float64
    soft target, never the shift. ``inplace_backward``: on the Triton kernel path the backward
    writes the gradient over the logits' storage (see :func:`losses.cross_entropy_loss`)."""
    check_floating(fn, "input", input)
    check_tensor(fn, "target", target)
    check_reduction(fn, reduction)
    eps = check_number(fn, "label_smoothing", label_smoothing, low=0.0, high=1.0)
    check_logits_dim(fn, input, target)
    c = input.shape[1]
    check_softmax_classes(fn, c)
    check_class_weight(fn, weight, c)
    cap = check_softcap(fn, softcap)
    soft = check_class_target(fn, input, target, soft=True, soft_name="probabilities")
    dtype = compute_dtype(input, weight, target)  # float64 soft targets count; ids never do
    if not soft and dtype == torch.float32 and kernels.use_triton(input):
        check_target_shape(fn, input, target)
        check_ids_in_range(fn, target, c, ignore_index)
        if _checking():
            check_masked_logits(fn, "input", input, active=target != ignore_index)
        return _kernel_cross_entropy(input, target, weight, logit_shift, cap, eps, ignore_index, reduction,
                                     inplace_backward)
    with no_autocast(input.device.type):
        x = apply_softcap(upcast(input, dtype), cap)
        if logit_shift is not None:
            x = x + class_view(upcast(logit_shift, dtype).to(x.device), x)
        w = None if weight is None else upcast(weight, dtype).to(x.device)
        if soft:
            zero = torch.zeros((), dtype=dtype, device=x.device)
            check_finite(fn, "target", target)
            check_unit_interval(fn, "target", target)
            check_distribution(fn, "target", target, dim=1, tol=1e-3,
                               hint="normalise it (target / target.sum(1, keepdim=True)) or pass integer class ids")
            check_masked_logits(fn, "input", input)
            q = target.to(dtype)
            lp = torch.log_softmax(x, dim=1)
            if eps > 0:
                finite = x > -math.inf
                n_fin = finite.sum(dim=1, keepdim=True).clamp_min(1).to(dtype)
                q = q * (1.0 - eps) + torch.where(finite, eps / n_fin, zero)
            wq = q if w is None else q * class_view(w, x)
            # a class without target mass contributes exactly 0 (never 0 * -inf), before the product
            values = -(wq * torch.where(wq != 0, lp, zero)).sum(dim=1)
            return reduce_loss(values, None, reduction)
        check_target_shape(fn, input, target)
        check_ids_in_range(fn, target, c, ignore_index)
        valid = target != ignore_index
        finite = check_masked_logits(fn, "input", input, active=valid)
        kept = all_kept(valid)  # nothing ignored (one look at the ids, on CPU): no zeroing pass
        if kept and eps == 0 and w is None and reduction != "none" and valid.numel() > 0:
            # no weights: F.cross_entropy's own reduction is the unit-weight one (the mean over the
            # positions), without the per-position values and the masked sums
            return F.cross_entropy(x, target.long(), reduction=reduction)
        zero = torch.zeros((), dtype=dtype, device=x.device)
        if not (kept or finite):
            x = torch.where(valid.unsqueeze(1), x, zero)  # ignored positions: no +-inf/NaN reaches the maths
        safe = torch.where(valid, target, torch.zeros_like(target)).long()
        if eps == 0:
            values = F.cross_entropy(x, target.long(), weight=w, ignore_index=ignore_index, reduction="none")
        else:
            lp = torch.log_softmax(x, dim=1)
            nll = -lp.gather(1, safe.unsqueeze(1)).squeeze(1)
            finite = x > -math.inf
            n_fin = finite.sum(dim=1).clamp_min(1).to(dtype)
            wl = lp if w is None else lp * class_view(w, x)
            smooth = -torch.where(finite, wl, zero).sum(dim=1) / n_fin
            if w is not None:
                nll = nll * w[safe]
            values = torch.where(valid, (1.0 - eps) * nll + eps * smooth, zero)
        unit = valid.to(dtype)
        if w is not None:
            unit = unit * w[safe]
        return reduce_weighted_values(values, unit, reduction)




def _kernel_cross_entropy(input: Tensor, target: Tensor, w: Optional[Tensor], shift: Optional[Tensor],
                          cap: Optional[float], eps: float, ignore_index: int, reduction: str, inplace: bool) -> Tensor:
    """The class-id cross-entropy through the fused Triton row kernel (losses/kernels/triton_rows.py):
    the logits are read in their own dtype (no float32 copy), the per-row statistics are float32,
    a mean or sum is reduced by one more launch and the gradient is written once, in the logits'
    dtype."""
    triton_rows = kernels.triton_rows_module()
    x2d, ids = move_class_dim_last(input), target.reshape(-1)
    opts = dict(weight=w, shift=shift, softcap=cap, label_smoothing=eps, ignore_index=ignore_index, inplace=inplace)
    out = triton_rows.softmax_loss(x2d, ids, reduction, **opts)
    return out.reshape(target.shape) if reduction == "none" else out
