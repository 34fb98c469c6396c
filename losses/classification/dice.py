"""Dice semimetric loss, Jaccard metric loss and the soft Dice baseline (docs/losses/dice.md).

All three are computed from per-class (and per-image) sums over the kept positions of the
probabilities ``x`` and labels ``y``::

    |x| = sum x,  |y| = sum y,  Delta = sum |x - y|
    tp = (|x| + |y| - Delta) / 2,  fp = |x| - tp,  fn = |y| - tp
    T = (tp + s) / (tp + alpha fp + beta fn + s)

Dice semimetric (``alpha = beta = 1/2``): ``1 - T = Delta / (|x| + |y| + 2s)``; Jaccard metric
(``alpha = beta = 1``): ``1 - T = 2 Delta / (|x| + |y| + Delta + 2s)``; soft Dice (baseline):
``1 - (2<x, y> + 2s) / (|x| + |y| + 2s)``. With hard labels the Dice semimetric equals soft
Dice; with soft labels only the semimetric vanishes at ``x = y``.

Aggregation (Wang et al., NeurIPS 2023 D&B, arXiv:2310.19252): ``"dataset"`` sums over the
batch per class, ``"image"`` computes per (image, class) and averages over each image's active
classes then over images, ``"class"`` averages each class over the images where it is active,
then over classes.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from .. import _distributed as D
from .._core import (
    once_differentiable,
    check_ignore_index,
    _compiling,
    auto_extra_repr,
    check_bool,
    check_choice,
    check_class_target,
    check_class_weight,
    check_finite,
    check_floating,
    check_ids_in_range,
    check_masked_logits,
    check_number,
    check_reduction,
    check_tensor,
    check_unit_interval,
    compute_dtype,
    no_autocast,
    reduce_loss,
    type_error,
    upcast,
    value_error,
)
from .._registry import register
from ..kernels import dice_native as _dice_native

__all__ = [
    "dice_semimetric_loss",
    "jaccard_metric_loss",
    "soft_dice_loss",
    "DiceSemimetricLoss",
    "JaccardMetricLoss",
    "SoftDiceLoss",
]

_ACTIVATIONS = ("softmax", "sigmoid", "none")
_AGGREGATES = ("dataset", "image", "class")
_ACTIVE = (None, "present", "all")
#: a class is "present" in a unit when its largest kept label value exceeds this
_PRESENT_THRESHOLD = 0.01


# --------------------------------------------------------------------------------------
# shared core
# --------------------------------------------------------------------------------------


def _check_args(fn: str, input: Tensor, target: Tensor, activation: str, smooth: float, aggregate: str,
                active_classes: Optional[str], log_loss: bool, reduction: str) -> float:
    check_floating(fn, "input", input)
    check_tensor(fn, "target", target)
    check_reduction(fn, reduction)
    check_choice(fn, "activation", activation, _ACTIVATIONS)
    check_choice(fn, "aggregate", aggregate, _AGGREGATES)
    check_choice(fn, "active_classes", active_classes, _ACTIVE)
    check_bool(fn, "log_loss", log_loss)
    return check_number(fn, "smooth", smooth, low=0.0, hint="choose smooth >= 0 (1.0 is the default)")


def _unit_stats(
    fn: str,
    kind: str,
    input: Tensor,
    target: Tensor,
    *,
    activation: str,
    aggregate: str,
    active_classes: Optional[str],
    weight: Optional[Tensor],
    mask: Optional[Tensor],
    ignore_index: int,
    gather: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Optional[Tensor]]:
    """Per-unit sums ``|x|, |y|, A`` (``A = Delta``, or ``sum x + y - 2xy`` for soft Dice), the
    active-unit indicator, the class weights and (``"class"`` mode) the per-class active counts.

    Units are classes ``(C,)`` in ``"dataset"`` mode, else ``(B, C)``. With ``gather`` the
    dataset-mode sums and the class-mode counts are all-reduced over the process group.
    """
    if input.dim() < 2:
        raise value_error(fn, "input must have shape (B, C) or (B, C, d1, ..., dk) with classes on dim 1",
                          f"shape {tuple(input.shape)}",
                          "for the C classes of one sample add a batch dimension to both: input.unsqueeze(0) and "
                          "target.unsqueeze(0); for one sigmoid output per sample pass input.unsqueeze(1) with "
                          "float labels target.to(input.dtype).unsqueeze(1) and activation='sigmoid'")
    b, c = input.shape[:2]
    spatial = tuple(input.shape[2:])
    n_pos = 1
    for d in spatial:
        n_pos *= d
    if activation == "softmax" and c == 1:
        raise value_error(fn, "a softmax over a single class is identically 1, so this loss is constant and trains "
                          "nothing", "C=1", "for one foreground channel use activation='sigmoid' with float 0/1 labels "
                          "shaped like input (an id map: target.unsqueeze(1).to(input.dtype)), or pass two "
                          "classes; bce_with_logits_loss is the element-wise alternative")
    hard = not check_class_target(fn, input, target, soft=True, soft_name="soft labels")
    if hard:
        if tuple(target.shape) != (b,) + spatial:
            raise value_error(fn, f"integer target shape must be {(b,) + spatial} for input of shape "
                              f"{tuple(input.shape)}", f"shape {tuple(target.shape)}",
                              "pass one class id per position, or float soft labels shaped like input")
    elif target.shape != input.shape:
        raise value_error(fn, f"float target must have the input's shape {tuple(input.shape)}",
                          f"shape {tuple(target.shape)}", "pass soft labels (B, C, ...) or integer ids (B, ...)")
    if mask is not None:
        check_tensor(fn, "mask", mask)
        if mask.dtype != torch.bool:
            raise type_error(fn, "mask must be a bool tensor (True = keep)", str(mask.dtype), "pass mask.bool()")
        if tuple(mask.shape) != (b,) + spatial:
            raise value_error(fn, f"mask shape must be {(b,) + spatial}", f"shape {tuple(mask.shape)}",
                              "pass one bool per position (B, d1, ..., dk)")
    check_class_weight(fn, weight, c)

    # data checks
    if hard:
        check_ids_in_range(fn, target, c, ignore_index)
    else:
        check_finite(fn, "target", target)
        check_unit_interval(fn, "target", target, hint="soft labels are probabilities; pass ids as integers")
    dtype = compute_dtype(input, target if not hard else None, weight)
    if hard:
        t = target.reshape(b, n_pos)
        keep = t != ignore_index
    else:
        keep = torch.ones(b, n_pos, dtype=torch.bool, device=input.device)
    if mask is not None:
        keep = keep & mask.reshape(b, n_pos)
    finite = False
    if activation == "none":
        check_unit_interval(fn, "input", input, hint="pass probabilities or use activation='softmax'/'sigmoid'")
    elif activation == "sigmoid":
        finite = check_finite(fn, "input", input, allow_neg_inf=True, neg_inf_note="-inf is allowed (probability 0)")
    else:
        finite = check_masked_logits(fn, "input", input.reshape(b, c, n_pos), active=keep)

    x = upcast(input, dtype).reshape(b, c, n_pos)
    # every position kept (no ignored id, no mask): the keep-multiplications and the zeroing below
    # are identities and are skipped (one host sync; under torch.compile they are kept instead)
    all_kept = (mask is None and not hard) or (
        not _compiling() and keep.numel() > 0 and bool(keep.view(torch.uint8).min() == 1))
    if activation != "none" and not _compiling() and _dice_native.usable(x):
        # the fused C kernel (float32 on CPU): one read of the logits, one write of x
        kept = None if all_kept else keep.contiguous()
        ids = t.contiguous().to(torch.int64) if hard else None
        y_in = None if hard else target.reshape(b, c, n_pos).to(dtype).contiguous()
        flags = (activation == "sigmoid", hard or kind == "soft_dice")
        done = _dice_native.forward(x, ids, y_in, kept, *flags)
        if done is not None:
            xs, sums = done
            sx, sa = _DiceStatsNative.apply(x, xs, sums, ids, y_in, kept, *flags)
            sy = sums[..., 2].to(dtype)
            k = None if kept is None else kept.unsqueeze(1).to(dtype)
            return _unit_weights_and_sums(sx, sy, sa, _present_units(active_classes, hard, sy, y_in, k), k, b, c,
                                          n_pos, dtype, x.device, hard, active_classes, aggregate, weight, gather)
    if not finite and not all_kept:
        # dropped positions are zeroed before the activation: no +-inf/NaN there reaches the maths
        x = torch.where(keep.unsqueeze(1), x, torch.zeros((), dtype=dtype, device=x.device))
    k = None if all_kept else keep.unsqueeze(1).to(dtype)  # (B, 1, S)
    if hard and k is None and activation != "none":
        # ids, every position kept: no one-hot buffer (the per-class label counts are a scatter of ones)
        tc = t.clamp(0, c - 1).long().reshape(b, 1, n_pos)
        sx, sa = _DiceStatsIds.apply(x, tc, activation)
        sy = torch.zeros(b, c, dtype=dtype, device=x.device).scatter_add_(
            1, tc.view(b, n_pos), torch.ones((), dtype=dtype, device=x.device).expand(b, n_pos))
        return _unit_weights_and_sums(sx, sy, sa, sy, None, b, c, n_pos, dtype, x.device, hard, active_classes,
                                      aggregate, weight, gather)
    if hard:
        tc = t.clamp(0, c - 1).long().reshape(b, 1, n_pos)
        y = torch.zeros(b, c, n_pos, dtype=dtype, device=x.device).scatter_(1, tc, 1.0)
        if k is not None:
            y.mul_(k)
    else:
        y = target.reshape(b, c, n_pos).to(dtype)
    # hard labels through softmax / sigmoid: |x - y| = y + x (1 - 2y) termwise, so every kind takes
    # the soft-Dice form (two passes instead of three); its slope 1 - 2y differs from sign(x - y)
    # only where x = y exactly, where the activation's Jacobian is 0 (x (1 - x) = 0)
    sx, sa = _DiceStats.apply(x, y, k, activation, kind == "soft_dice" or (hard and activation != "none"))
    yk = y if (k is None or hard) else y * k
    sy = yk.sum(-1)
    return _unit_weights_and_sums(sx, sy, sa, _present_units(active_classes, hard, sy, yk, None), k, b, c, n_pos,
                                  dtype, x.device, hard, active_classes, aggregate, weight, gather)


def _present_units(active_classes: Optional[str], hard: bool, sy: Tensor, y: Optional[Tensor],
                   k: Optional[Tensor]) -> Optional[Tensor]:
    """The per-(image, class) presence read in the ``"present"`` mode (``None`` in the others, where
    every unit with a kept position is active): hard labels, the kept label counts ``sy`` (a kept
    hard label is 1 > 0.01); soft labels ``y (B, C, S)`` with keep weights ``k (B, 1, S)`` or
    ``None``, whether the largest kept label value exceeds the threshold (only "> 0" is read)."""
    if (active_classes or ("present" if hard else "all")) != "present":
        return None
    if hard:
        return sy
    if y.shape[-1] == 0:
        return torch.zeros_like(sy)
    yk = y if k is None else y * k
    return (yk.amax(-1) > _PRESENT_THRESHOLD).to(sy.dtype)


def _unit_weights_and_sums(sx: Tensor, sy: Tensor, sa: Tensor, present: Optional[Tensor], k: Optional[Tensor], b: int, c: int,
                           n_pos: int, dtype: torch.dtype, device: torch.device, hard: bool,
                           active_classes: Optional[str], aggregate: str, weight: Optional[Tensor], gather: bool):
    """The tail of :func:`_unit_stats`: aggregation of the per-(image, class) sums, active units,
    class weights and per-class counts. ``present`` is read only in the ``"present"`` mode."""
    n_keep = (torch.full((b, 1), float(n_pos), dtype=dtype, device=device) if k is None
              else k.sum(-1))  # (B, 1)
    mode = active_classes or ("present" if hard else "all")

    wc = torch.ones(c, dtype=dtype, device=device) if weight is None else upcast(weight, dtype).to(device)
    counts = None
    if aggregate == "dataset":
        pres = present.sum(0) if mode == "present" else sy.new_zeros(c)
        stats = torch.stack([sx.sum(0), sy.sum(0), sa.sum(0), pres, n_keep.sum().expand(c)], dim=1)
        if gather:
            stats = D.all_reduce_with_grad(stats)
        sx, sy, sa = stats[:, 0], stats[:, 1], stats[:, 2]
        active = stats[:, 3] > 0 if mode == "present" else stats[:, 4] > 0
    else:
        active = present > 0 if mode == "present" else (n_keep > 0).expand(b, c)
        if aggregate == "class":
            counts = active.to(dtype).sum(0)
            if gather:
                counts = D.all_reduce_with_grad(counts.detach())
    return sx, sy, sa, active, wc, counts


#: from this many classes on, :func:`_softmax_dim1` beats ``torch.softmax(z, 1)`` on a (B, C, S)
#: tensor (one CPU thread, torch 2.14, interleaved: 0.78x at C = 11, 0.54x at C = 4, 1.06x at C = 32)
_SPLIT_SOFTMAX_CLASSES = 32


def _softmax_dim1(z: Tensor) -> Tensor:
    """``softmax(z, dim=1)`` of a ``(B, C, S)`` tensor as max, exp, sum and divide, each
    vectorised along ``S`` (on CPU faster than ``torch.softmax`` over a non-last dim from
    :data:`_SPLIT_SOFTMAX_CLASSES` classes on)."""
    e = (z - z.amax(dim=1, keepdim=True)).exp_()
    return e.div_(e.sum(dim=1, keepdim=True))


def _activate(z: Tensor, activation: str) -> Tensor:
    """``x = activation(z)`` over the class dim 1 of ``(B, C, S)`` logits (``"none"``: ``z``)."""
    if activation == "softmax":
        return _softmax_dim1(z) if z.shape[1] >= _SPLIT_SOFTMAX_CLASSES else torch.softmax(z, dim=1)
    if activation == "sigmoid":
        return torch.sigmoid(z)
    return z


def _activation_backward(g: Tensor, x: Tensor, activation: str) -> Tensor:
    """``dL/dz`` from ``g = dL/dx`` and the saved ``x = activation(z)`` (the activation's own
    backward kernel)."""
    if activation == "softmax":
        return torch._softmax_backward_data(g, x, 1, x.dtype)
    if activation == "sigmoid":
        return torch.ops.aten.sigmoid_backward(g, x)
    return g


class _DiceStats(torch.autograd.Function):
    """``(|x|, A)`` per (image, class) with ``x = activation(z)``: the only ``N``-sized work.

    ``z (B, C, S)`` logits (probabilities for ``"none"``), ``y (B, C, S)`` labels, ``k (B, 1, S)``
    keep weights or ``None`` (every position kept), ``activation``, ``soft_dice``.
    ``|x|_bc = sum_s k x``; ``A_bc = sum_s k |x - y|`` (Delta), or for soft Dice
    ``sum_s k (y + x (1 - 2y))`` (``= x + y - 2xy``, termwise >= 0).

    Backward, without autograd's intermediate buffers: ``dL/dx = k (g_|x| + g_A a')`` with
    ``a' = sign(x - y)`` (``abs``'s subgradient, 0 at ``x = y``) or ``1 - 2y``, then through the
    activation with its own backward kernel. No double backward.
    """

    @staticmethod
    def forward(ctx, z, y, k, activation, soft_dice):  # type: ignore[override]
        x = _activate(z, activation)
        sx = (x if k is None else x * k).sum(-1)
        if soft_dice:
            da = torch.rsub(y, 1.0, alpha=2.0)  # 1 - 2y
            terms = torch.addcmul(y, x, da)
        else:
            da = x - y
            terms = da.abs()
            da.sign_()
        if k is not None:
            terms.mul_(k)
        sa = terms.sum(-1)
        ctx.save_for_backward(x, da, k)
        ctx.activation = activation
        return sx, sa

    @staticmethod
    @once_differentiable("dice_semimetric_loss / jaccard_metric_loss / soft_dice_loss")
    def backward(ctx, g_x, g_a):  # type: ignore[override]
        x, da, k = ctx.saved_tensors
        zeros = torch.zeros(x.shape[:2] + (1,), dtype=x.dtype, device=x.device)
        g_x = zeros if g_x is None else g_x.unsqueeze(-1)
        g_a = zeros if g_a is None else g_a.unsqueeze(-1)
        g = torch.mul(da, g_a).add_(g_x)  # (a broadcast addcmul is slower on CPU)
        if k is not None:
            g.mul_(k)
        return _activation_backward(g, x, ctx.activation), None, None, None, None


class _DiceStatsIds(torch.autograd.Function):
    """:class:`_DiceStats` for integer ids with every position kept, through softmax or sigmoid
    (the soft-Dice form ``A = sum_s |x - y|``, ``y`` one-hot), without building ``y``.

    ``z (B, C, S)`` logits, ``t (B, 1, S)`` class ids. Per (image, class):
    ``|x| = sum_s x``; ``A = sum_{s: t_s != c} x_cs + sum_{s: t_s = c} (1 - x_cs)``, summed termwise
    (the buffer ``x`` with each position's target entry replaced by ``1 - x``: no cancellation, as
    the one-hot form). Backward: ``dL/dx = g_|x| + g_A`` off the target and ``g_|x| - g_A`` at it,
    written as one broadcast copy and one scatter, then the activation's backward. Two full passes
    fewer than the one-hot form forward and one fewer backward."""

    @staticmethod
    def forward(ctx, z, t, activation):  # type: ignore[override]
        x = _activate(z, activation)
        sx = x.sum(-1)
        w = x.clone()
        w.scatter_(1, t, torch.rsub(x.gather(1, t), 1.0))
        sa = w.sum(-1)
        ctx.save_for_backward(x, t)
        ctx.activation = activation
        return sx, sa

    @staticmethod
    @once_differentiable("dice_semimetric_loss / jaccard_metric_loss / soft_dice_loss")
    def backward(ctx, g_x, g_a):  # type: ignore[override]
        x, t = ctx.saved_tensors
        zeros = torch.zeros(x.shape[:2], dtype=x.dtype, device=x.device)
        g_x = zeros if g_x is None else g_x
        g_a = zeros if g_a is None else g_a
        g = (g_x + g_a).unsqueeze(-1).expand(x.shape).contiguous()
        g.scatter_(1, t, (g_x - g_a).unsqueeze(-1).expand(x.shape).gather(1, t))
        return _activation_backward(g, x, ctx.activation), None, None


class _DiceStatsNative(torch.autograd.Function):
    """``(|x|, A)`` per (image, class) from the fused C kernel's forward (computed by the caller,
    which falls back to :class:`_DiceStats` / :class:`_DiceStatsIds` when the kernel declines);
    the backward is the kernel's (``dL/dz`` in one pass over the saved ``x`` and the labels).

    ``z (B, C, S)`` logits (only to join the graph), ``xs`` the kernel's ``x`` (0 at dropped
    positions), ``sums (B, C, 3)`` float64, ``t (B, S)`` ids or ``y (B, C, S)`` labels, ``keep
    (B, S)`` bool or ``None``, ``sigmoid``, ``soft_form``. No double backward."""

    @staticmethod
    def forward(ctx, z, xs, sums, t, y, keep, sigmoid, soft_form):  # type: ignore[override]
        ctx.save_for_backward(xs, t, y, keep)
        ctx.flags = (sigmoid, soft_form)
        return sums[..., 0].to(z.dtype), sums[..., 1].to(z.dtype)

    @staticmethod
    @once_differentiable("dice_semimetric_loss / jaccard_metric_loss / soft_dice_loss")
    def backward(ctx, g_x, g_a):  # type: ignore[override]
        xs, t, y, keep = ctx.saved_tensors
        zeros = torch.zeros(xs.shape[:2], dtype=xs.dtype, device=xs.device)
        g_x = zeros if g_x is None else g_x
        g_a = zeros if g_a is None else g_a
        dz = _dice_native.backward(xs, t, y, keep, *ctx.flags, g_x, g_a)
        return dz, None, None, None, None, None, None, None


def _dice_forward(
    fn: str,
    kind: str,
    input: Tensor,
    target: Tensor,
    *,
    activation: str,
    smooth: float,
    aggregate: str,
    active_classes: Optional[str],
    log_loss: bool,
    weight: Optional[Tensor],
    mask: Optional[Tensor],
    ignore_index: int,
    reduction: str,
    gather: bool = False,
    return_weights: bool = False,
):
    s = _check_args(fn, input, target, activation, smooth, aggregate, active_classes, log_loss, reduction)
    with no_autocast(input.device.type):
        return _dice_forward_impl(fn, kind, input, target, s, activation=activation, aggregate=aggregate,
                                  active_classes=active_classes, log_loss=log_loss, weight=weight, mask=mask,
                                  ignore_index=ignore_index, reduction=reduction, gather=gather,
                                  return_weights=return_weights)


def _dice_forward_impl(fn, kind, input, target, s, *, activation, aggregate, active_classes, log_loss, weight,
                       mask, ignore_index, reduction, gather, return_weights):
    if gather and D.is_distributed():
        D.check_equal_batch_sizes(fn, input.shape[0], device=input.device)
    sx, sy, sa, active, wc, counts = _unit_stats(
        fn, kind, input, target, activation=activation, aggregate=aggregate, active_classes=active_classes,
        weight=weight, mask=mask, ignore_index=ignore_index, gather=gather)

    # unit weights (docs/conventions.md)
    a = wc * active.to(wc.dtype)
    if aggregate == "dataset":
        w = a
    elif aggregate == "image":
        per_image = a.sum(1, keepdim=True)
        w = a / torch.where(per_image > 0, per_image, torch.ones_like(per_image))
    else:
        assert counts is not None
        w = a / torch.where(counts > 0, counts, torch.ones_like(counts))
    if return_weights:
        return w

    # per-unit loss 1 - T = num / den; den == 0 only for s == 0 and |x| + |y| == 0 (loss 0)
    if kind == "jaccard":
        num = 2.0 * sa
        den = sx + sy + sa + 2.0 * s
    else:
        num = sa
        den = sx + sy + 2.0 * s
    empty = den == 0  # (not "den > 0": NaN from unvalidated data must propagate)
    values = torch.where(empty, torch.zeros_like(den), num / torch.where(empty, torch.ones_like(den), den))
    if log_loss:
        # -log T = -log(1 - L); inactive units are set to L = 0 first so nothing non-finite leaks
        values = -torch.log1p(-torch.where(w > 0, values, torch.zeros_like(values)))

    if gather and aggregate != "dataset" and reduction != "none" and D.is_distributed():
        v = torch.where(w > 0, values, torch.zeros_like(values))
        total = D.all_reduce_with_grad((w * v).sum())
        if reduction == "sum":
            return total
        denom = D.all_reduce_with_grad(w.sum().detach())
        return total / torch.where(denom > 0, denom, torch.ones_like(denom))
    return reduce_loss(values, w, reduction)


_COMMON_DOC = r"""Args:
        input: logits (or probabilities with ``activation="none"``) ``(B, C)`` or
            ``(B, C, d1..dk)``, classes on dim 1; computed in float32 (float64 if an input is),
            also inside ``torch.autocast``. **-inf** logits are probability 0: with
            ``"softmax"`` the class is absent at that position (its probability and gradient
            are exactly 0; a kept position without a finite logit is a ``ValueError``), with
            ``"sigmoid"`` the element's probability is 0 (gradient 0); with ``"none"`` they
            are outside [0, 1] (``ValueError``). NaN and ``+inf`` raise ``ValueError`` (data
            checks). ``C = 1`` with ``"softmax"`` raises ``ValueError`` (the softmax is
            identically 1); use ``activation="sigmoid"``. Dropped positions (ignored ids, mask)
            are zeroed before the activation, so they give exactly zero gradients.
        target: integer ids ``(B, d1..dk)`` (one-hot inside) or float soft labels in [0, 1]
            shaped like ``input``; the dtype decides (float labels shaped like the ids raise
            ``TypeError``).
        activation: ``"softmax"`` over dim 1 (default), ``"sigmoid"`` (multi-label) or ``"none"``
            (``input`` must lie in [0, 1]; data check).
        smooth: ``s >= 0`` (default 1.0, the authors' training configs; the papers fix none; the
            JDTLosses class defaults to 1e-3).
        aggregate: ``"dataset"`` (default, mIoU^D): sums over the batch per class, averages over
            active classes (``sum_c w_c L_c / sum_c w_c``); ``"image"`` (mIoU^I): per (image, class),
            averaged over each image's active classes, then over images; ``"class"`` (mIoU^C): each
            class averaged over the images where it is active, then over classes.
        active_classes: ``"present"`` (largest kept label value > 0.01 in the unit), ``"all"``
            (every class of a unit with at least one kept position) or ``None`` (``"present"`` for
            integer ids, ``"all"`` for soft labels). An empty class (``|y| = 0``) under ``"all"``
            costs ``|x| / (|x| + 2s)`` (Jaccard: ``|x| / (|x| + s)``), pushing its predictions to 0.
        log_loss: return ``-log T`` instead of ``1 - T`` (``+inf`` for an active unit with ``T = 0``,
            which needs ``smooth = 0``).
        weight: class weights ``(C,)``, finite, ``>= 0`` and not all zero (data checks).
        mask: bool ``(B, d1..dk)``, True = keep.
        ignore_index: id of positions to drop (integer targets only).
        reduction: ``"none"`` gives ``(C,)`` (``"dataset"``) or ``(B, C)`` per-unit values (0 for
            inactive units); ``"mean"`` divides by the total unit weight; ``"sum"``.

    Unit weights (docs/conventions.md): ``w_c = weight_c active_c`` (``"dataset"``);
    ``w_bc = weight_c active_bc / sum_c' weight_c' active_bc'`` (``"image"``);
    ``w_bc = weight_c active_bc / #{b: active_bc}`` (``"class"``). No active unit: an exact,
    graph-attached 0. ``s = 0`` with ``|x| + |y| = 0``: 0.
"""


def dice_semimetric_loss(
    input: Tensor,
    target: Tensor,
    *,
    activation: str = "softmax",
    smooth: float = 1.0,
    aggregate: str = "dataset",
    active_classes: Optional[str] = None,
    log_loss: bool = False,
    weight: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Dice semimetric loss (DML): ``1 - T = Delta / (|x| + |y| + 2s)`` per class.

    With ``x`` the probabilities (``activation(input)``), ``y`` the labels, both restricted to the
    kept positions of a unit: ``|x| = sum x``, ``|y| = sum y``, ``Delta = sum |x - y|``,
    ``s = smooth``; equivalently ``T = (tp + s)/(tp + fp/2 + fn/2 + s)`` with
    ``tp = (|x| + |y| - Delta)/2``. It equals soft Dice for hard labels and, unlike soft Dice, is
    0 exactly at ``x = y`` for soft labels (a semimetric).

    Paper: Z. Wang, T. Popordanoska, J. Bertels, R. Lemmens, M. B. Blaschko, *Dice Semimetric
    Losses: Optimizing the Dice Score with Soft Labels*, MICCAI 2023, arXiv:2303.16296.
    Aggregation modes: Z. Wang et al., *Revisiting Evaluation Metrics for Semantic Segmentation*,
    NeurIPS 2023 (Datasets & Benchmarks), arXiv:2310.19252. Reference bugs of the public code
    (int32/uint8 labels treated as soft, out-of-range labels clamped into C-1, class weights kept
    on the CPU) are not reproduced.

    __COMMON__

    >>> import torch, losses
    >>> x = torch.tensor([[[4.0, -4.0], [-4.0, 4.0]]])      # (B=1, C=2, 2 pixels)
    >>> round(float(losses.dice_semimetric_loss(x, torch.tensor([[0, 1]]), smooth=0.0)), 4)
    0.0003
    """
    return _dice_forward("dice_semimetric_loss", "dice", input, target, activation=activation, smooth=smooth,
                         aggregate=aggregate, active_classes=active_classes, log_loss=log_loss, weight=weight,
                         mask=mask, ignore_index=ignore_index, reduction=reduction)


def jaccard_metric_loss(
    input: Tensor,
    target: Tensor,
    *,
    activation: str = "softmax",
    smooth: float = 1.0,
    aggregate: str = "dataset",
    active_classes: Optional[str] = None,
    log_loss: bool = False,
    weight: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Jaccard metric loss (JML): ``1 - T = 2 Delta / (|x| + |y| + Delta + 2s)`` per class.

    Symbols as in :func:`dice_semimetric_loss`; ``T = (tp + s)/(tp + fp + fn + s)`` is the soft
    IoU. For ``s = 0`` it is a metric on ``[0, 1]^n`` (triangle inequality) and
    ``T_dice = 2 T_jac / (1 + T_jac)``.

    Paper: Z. Wang, X. Ning, M. B. Blaschko, *Jaccard Metric Losses: Optimizing the Jaccard Index
    with Soft Labels*, NeurIPS 2023, arXiv:2302.05666. The JDTLosses reference class defaults to
    ``smooth=1e-3`` (and alpha = beta = 1); pass that for parity.

    __COMMON__

    >>> import torch, losses
    >>> p = torch.tensor([[[0.75, 0.25], [0.25, 0.75]]])
    >>> y = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    >>> round(float(losses.jaccard_metric_loss(p, y, activation="none", smooth=0.0)), 4)
    0.4
    """
    return _dice_forward("jaccard_metric_loss", "jaccard", input, target, activation=activation, smooth=smooth,
                         aggregate=aggregate, active_classes=active_classes, log_loss=log_loss, weight=weight,
                         mask=mask, ignore_index=ignore_index, reduction=reduction)


def soft_dice_loss(
    input: Tensor,
    target: Tensor,
    *,
    activation: str = "softmax",
    smooth: float = 1.0,
    aggregate: str = "dataset",
    active_classes: Optional[str] = None,
    log_loss: bool = False,
    weight: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Soft Dice loss (baseline): ``1 - (2<x, y> + 2s) / (|x| + |y| + 2s)`` per class.

    The intersection form of MONAI / segmentation_models.pytorch, with the same aggregation and
    options as :func:`dice_semimetric_loss` (``T = (2<x, y> + 2s)/(|x| + |y| + 2s)``). Equal to the
    Dice semimetric for hard labels; with soft labels it is not minimised at ``x = y``
    (``y = 0.5`` everywhere gives 1/3 at ``x = 1`` but 1/2 at ``x = y``).

    No arXiv id is registered for this classical baseline (registry ``arxiv=""``). Its origin: the
    Dice-coefficient loss of F. Milletari, N. Navab, S.-A. Ahmadi, *V-Net*, 3DV 2016,
    arXiv:1606.04797 (which squares the terms of the denominator), in the linear-denominator form
    of C. H. Sudre et al., *Generalised Dice overlap as a deep learning loss function*, DLMIA 2017.

    __COMMON__

    >>> import torch, losses
    >>> y = torch.full((1, 1, 4), 0.5)
    >>> round(float(losses.soft_dice_loss(torch.ones(1, 1, 4), y, activation="none", smooth=0.0)), 4)
    0.3333
    """
    return _dice_forward("soft_dice_loss", "soft_dice", input, target, activation=activation, smooth=smooth,
                         aggregate=aggregate, active_classes=active_classes, log_loss=log_loss, weight=weight,
                         mask=mask, ignore_index=ignore_index, reduction=reduction)


# --------------------------------------------------------------------------------------
# modules
# --------------------------------------------------------------------------------------


class _DiceBase(nn.Module):
    _fn_name = ""
    _kind = ""

    def __init__(
        self,
        *,
        activation: str = "softmax",
        smooth: float = 1.0,
        aggregate: str = "dataset",
        active_classes: Optional[str] = None,
        log_loss: bool = False,
        weight: Optional[Tensor] = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        gather_distributed: bool = False,
    ) -> None:
        super().__init__()
        fn = type(self).__name__
        check_reduction(fn, reduction)
        check_choice(fn, "activation", activation, _ACTIVATIONS)
        check_choice(fn, "aggregate", aggregate, _AGGREGATES)
        check_choice(fn, "active_classes", active_classes, _ACTIVE)
        check_bool(fn, "log_loss", log_loss)
        check_bool(fn, "gather_distributed", gather_distributed)
        self.activation = activation
        self.smooth = check_number(fn, "smooth", smooth, low=0.0, hint="choose smooth >= 0 (1.0 is the default)")
        self.aggregate = aggregate
        self.active_classes = active_classes
        self.log_loss = log_loss
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction
        self.gather_distributed = gather_distributed
        self.register_buffer("weight", None if weight is None else torch.as_tensor(weight))

    def forward(self, input: Tensor, target: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """The loss of ``input`` against ``target``.

        Args:
            input: logits (probabilities with ``activation="none"``) ``(B, C)`` or ``(B, C, d1..dk)``.
            target: integer ids ``(B, d1..dk)`` or soft labels shaped like ``input``.
            mask: optional bool ``(B, d1..dk)``, True = keep.

        Returns:
            A scalar (``"mean"``, ``"sum"``); for ``"none"`` ``(C,)`` (``"dataset"``) or ``(B, C)``.

        With ``gather_distributed=True`` in an initialised process group the
        loss is that of the concatenated global batch (``"dataset"``: the per-class sums are
        all-reduced; ``"image"``/``"class"``: the weighted sum, total unit weight and per-class
        counts are), identical on every rank; ``"none"`` returns this rank's units."""
        return _dice_forward(self._fn_name, self._kind, input, target, activation=self.activation,
                             smooth=self.smooth, aggregate=self.aggregate, active_classes=self.active_classes,
                             log_loss=self.log_loss, weight=self.weight, mask=mask, ignore_index=self.ignore_index,
                             reduction=self.reduction, gather=self.gather_distributed)

    extra_repr = auto_extra_repr


class DiceSemimetricLoss(_DiceBase):
    """Dice semimetric loss as a module (Wang et al., MICCAI 2023, arXiv:2303.16296); the maths is :func:`losses.dice_semimetric_loss`.

    Args:
        activation: ``"softmax"`` over dim 1 (default), ``"sigmoid"`` (multi-label) or ``"none"``
            (``input`` holds probabilities).
        smooth: ``s >= 0`` (default 1.0).
        aggregate: ``"dataset"`` (default), ``"image"`` or ``"class"``.
        active_classes: ``"present"``, ``"all"`` or ``None`` (default: by the target's kind).
        log_loss: return ``-log T`` instead of ``1 - T`` (default False).
        weight: optional class weights ``(C,)``, stored as the buffer ``weight`` (default None).
        ignore_index: target id whose positions are dropped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        gather_distributed: under DDP, compute the loss of the global batch, exactly (only per-class
            sums are exchanged; default False).

    ``forward(input, target, mask=None)``: ``input (B, C)`` or ``(B, C, d1..dk)``, ``target`` ids
    ``(B, d1..dk)`` or soft labels shaped like ``input``, optional bool ``mask (B, d1..dk)``.
    Returns a scalar for ``"mean"``/``"sum"``; for ``"none"`` ``(C,)`` (``"dataset"``) or
    ``(B, C)`` (``"image"``, ``"class"``).

    Buffers: ``weight`` (or None).

    >>> import torch, losses
    >>> losses.DiceSemimetricLoss(smooth=0.0)(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long)).shape
    torch.Size([])
    """

    _fn_name = "dice_semimetric_loss"
    _kind = "dice"


class JaccardMetricLoss(_DiceBase):
    """Jaccard metric loss as a module (Wang, Ning, Blaschko, NeurIPS 2023, arXiv:2302.05666); the maths is :func:`losses.jaccard_metric_loss`.

    Args:
        activation: ``"softmax"`` over dim 1 (default), ``"sigmoid"`` (multi-label) or ``"none"``
            (``input`` holds probabilities).
        smooth: ``s >= 0`` (default 1.0).
        aggregate: ``"dataset"`` (default), ``"image"`` or ``"class"``.
        active_classes: ``"present"``, ``"all"`` or ``None`` (default: by the target's kind).
        log_loss: return ``-log T`` instead of ``1 - T`` (default False).
        weight: optional class weights ``(C,)``, stored as the buffer ``weight`` (default None).
        ignore_index: target id whose positions are dropped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        gather_distributed: under DDP, compute the loss of the global batch, exactly (only per-class
            sums are exchanged; default False).

    ``forward(input, target, mask=None)``: ``input (B, C)`` or ``(B, C, d1..dk)``, ``target`` ids
    ``(B, d1..dk)`` or soft labels shaped like ``input``, optional bool ``mask (B, d1..dk)``.
    Returns a scalar for ``"mean"``/``"sum"``; for ``"none"`` ``(C,)`` (``"dataset"``) or
    ``(B, C)`` (``"image"``, ``"class"``).

    Buffers: ``weight`` (or None).
    """

    _fn_name = "jaccard_metric_loss"
    _kind = "jaccard"


class SoftDiceLoss(_DiceBase):
    """Soft Dice loss as a module (the soft Dice baseline); the maths is :func:`losses.soft_dice_loss`.

    Args:
        activation: ``"softmax"`` over dim 1 (default), ``"sigmoid"`` (multi-label) or ``"none"``
            (``input`` holds probabilities).
        smooth: ``s >= 0`` (default 1.0).
        aggregate: ``"dataset"`` (default), ``"image"`` or ``"class"``.
        active_classes: ``"present"``, ``"all"`` or ``None`` (default: by the target's kind).
        log_loss: return ``-log T`` instead of ``1 - T`` (default False).
        weight: optional class weights ``(C,)``, stored as the buffer ``weight`` (default None).
        ignore_index: target id whose positions are dropped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        gather_distributed: under DDP, compute the loss of the global batch, exactly (only per-class
            sums are exchanged; default False).

    ``forward(input, target, mask=None)``: ``input (B, C)`` or ``(B, C, d1..dk)``, ``target`` ids
    ``(B, d1..dk)`` or soft labels shaped like ``input``, optional bool ``mask (B, d1..dk)``.
    Returns a scalar for ``"mean"``/``"sum"``; for ``"none"`` ``(C,)`` (``"dataset"``) or
    ``(B, C)`` (``"image"``, ``"class"``).

    Buffers: ``weight`` (or None).
    """

    _fn_name = "soft_dice_loss"
    _kind = "soft_dice"


# --------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------


def _unit_weights_for(fn: str, kind: str):
    def unit_weights(input: Tensor, target: Tensor, mask: Optional[Tensor] = None, *, activation: str = "softmax",
                     smooth: float = 1.0, aggregate: str = "dataset", active_classes: Optional[str] = None,
                     log_loss: bool = False, weight: Optional[Tensor] = None, ignore_index: int = -100,
                     reduction: str = "mean", **_: object) -> Tensor:
        """The the unit-weight rule, docs/conventions.md unit weights of the aggregate in use, shaped like the ``"none"`` output."""
        with torch.no_grad():
            return _dice_forward(fn, kind, input.detach(), target, activation=activation, smooth=smooth,
                                 aggregate=aggregate, active_classes=active_classes, log_loss=log_loss,
                                 weight=weight, mask=mask, ignore_index=ignore_index, reduction=reduction,
                                 return_weights=True)

    return unit_weights


def _example_inputs(*, generator: Optional[torch.Generator] = None, dtype=torch.float32, case: str = "random"):
    """Segmentation-shaped example: logits (3, 4, 3, 2), ids (3, 3, 2) with one ignored pixel and
    a mask dropping another; ``"ignored"``: every pixel ignored (no active class)."""
    x = torch.randn((3, 4, 3, 2), generator=generator, dtype=torch.float64)
    t = torch.randint(0, 4, (3, 3, 2), generator=generator)
    t[0, 0, 0] = -100
    mask = torch.ones(3, 3, 2, dtype=torch.bool)
    mask[1, 2, 1] = False
    if case == "extreme":
        x = x * 1e4
    elif case == "ignored":
        t = torch.full_like(t, -100)
    return (x.to(dtype), t), {"mask": mask}


for _name, _fn, _module, _kind, _arxiv, _paper in (
    ("dice_semimetric", dice_semimetric_loss, DiceSemimetricLoss, "dice", "2303.16296",
     "Wang et al., Dice Semimetric Losses: Optimizing the Dice Score with Soft Labels, MICCAI 2023"),
    ("jaccard_metric", jaccard_metric_loss, JaccardMetricLoss, "jaccard", "2302.05666",
     "Wang, Ning, Blaschko, Jaccard Metric Losses: Optimizing the Jaccard Index with Soft Labels, NeurIPS 2023"),
    ("soft_dice", soft_dice_loss, SoftDiceLoss, "soft_dice", "",
     "Soft Dice loss (baseline; Milletari et al., V-Net, 3DV 2016, in the linear-denominator form)"),
):
    register(
        _name,
        function=_fn,
        module=_module,
        inputs="logits",
        unit="class",
        unit_weights=_unit_weights_for(_fn.__name__, _kind),
        arxiv=_arxiv,
        paper=_paper,
        example_inputs=_example_inputs,
        masks=("mask",),
        dense_targets=True,
        class_weight=True,
        tensor_args=("weight",),
    )
del _name, _fn, _module, _kind, _arxiv, _paper

for _f in (dice_semimetric_loss, jaccard_metric_loss, soft_dice_loss):
    _f.__doc__ = _f.__doc__.replace("__COMMON__", _COMMON_DOC.strip("\n").lstrip())
del _f
