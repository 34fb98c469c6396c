"""Margin softmax on a cosine head: ArcFace, CosFace and combined margins (``docs/losses/partial_fc.md``).

The margin is a plain function of the cosines: :func:`margin_logits` maps a cosine matrix and the
class ids to logits ``s·cos`` with the target entries replaced by ``s·psi(cos)``; it is what a user
with their own head combines with :func:`torch.nn.functional.cross_entropy`.

:func:`margin_softmax_loss` computes the same loss without materialising more than one ``N x C``
buffer: the centres are normalised inside one fused ``autograd.Function`` (one matmul forward, two
backward), the margin touches only the ``N`` target entries (gathered, transformed with ordinary
autograd, scattered back) and the log-sum-exp keeps ``exp(z - max)`` in place of the logits, so the
backward needs no further ``N x C`` temporary. For the ``"paper"`` variant with ``m1 = 1`` and no
filtering threshold (ArcFace, CosFace, the plain cosine softmax) one Function computes value and
gradients: the target cosine is read from the cosine matrix, ``psi`` and ``psi'`` are evaluated in
closed form, and the backward writes the logit gradient into the same buffer (no autograd graph
for the normalisations or the margin). The general core serves the other margins and
:mod:`losses.embedding.partial_fc` (sampled centres, and the model-parallel shards, whose row maxima
and sums are all-reduced).
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from .._core import (
    all_kept,
    once_differentiable,
    check_ignore_index,
    auto_extra_repr,
    check_choice,
    check_finite,
    check_floating,
    check_ids_in_range,
    check_integer_target,
    check_number,
    check_reduction,
    compute_dtype,
    reduce_loss,
    upcast,
    value_error,
)
from .._heads import check_head_embeddings, check_head_sizes, check_softmax_classes, drop_rows
from .._core import no_autocast
from .._precision import matmul
from .._registry import id_unit_weights, register

__all__ = ["margin_logits", "margin_softmax_loss", "MarginSoftmaxLoss"]

VARIANTS = ("paper", "reference")
#: ``-log(1e-30)``: the ``"reference"`` variant's forward-only cap on the per-sample loss.
REFERENCE_CAP = -math.log(1e-30)
#: ``normalize(v) = v / max(||v||, 1e-12)`` (docs/conventions.md, Numerics).
NORM_EPS = 1e-12
#: ArcFace's square root ``sqrt(1 - c^2)`` sees ``c`` clamped to ``[-1 + 1e-6, 1 - 1e-6]``.
ROOT_CLAMP = 1e-6

Margin = Tuple[float, float, float]


# --------------------------------------------------------------------------------------
# hyperparameters and inputs
# --------------------------------------------------------------------------------------


def check_margin_hparams(
    fn: str,
    *,
    scale: float,
    margin: Sequence[float],
    variant: str,
    interclass_filtering_threshold: float,
) -> Tuple[float, Margin, float]:
    """Validate the shared keywords; returns ``(scale, (m1, m2, m3), threshold)`` as floats."""
    s = check_number(fn, "scale", scale, low=0.0, low_inclusive=False)
    check_choice(fn, "variant", variant, VARIANTS)
    try:
        parts = tuple(margin)  # type: ignore[arg-type]
    except TypeError:
        parts = ()
    if len(parts) != 3:
        raise value_error(
            fn,
            "margin must be a triple (m1, m2, m3) for cos(m1*theta + m2) - m3",
            repr(margin),
            "use (1.0, 0.5, 0.0) for ArcFace, (1.0, 0.0, 0.35) for CosFace or (1.0, 0.0, 0.0) for none",
        )
    m1 = check_number(fn, "margin[0] (m1)", parts[0], low=0.0, low_inclusive=False)
    m2 = check_number(fn, "margin[1] (m2)", parts[1], low=-math.pi, high=math.pi,
                      low_inclusive=False, high_inclusive=False)
    m3 = check_number(fn, "margin[2] (m3)", parts[2])
    if variant == "reference" and not (m1 == 1.0 and (m2 == 0.0 or m3 == 0.0)):
        raise value_error(
            fn,
            "variant='reference' supports only ArcFace (1, m2, 0) and CosFace (1, 0, m3) margins",
            repr((m1, m2, m3)),
            "use variant='paper' for multiplicative or combined margins",
        )
    thr = check_number(fn, "interclass_filtering_threshold", interclass_filtering_threshold, low=0.0, high=1.0,
                       hint="use 0 to switch the filter off, or a cosine such as 0.4")
    return s, (m1, m2, m3), thr


def check_head_inputs(fn: str, embeddings: Tensor, target: Tensor, weight: Tensor, *, min_classes: int = 1) -> None:
    """Shape and dtype checks of ``(embeddings (N, D), target (N,), weight (C, D))`` (no host sync)."""
    check_floating(fn, "embeddings", embeddings)
    check_integer_target(fn, target)
    check_floating(fn, "weight", weight)
    if embeddings.dim() != 2:
        raise value_error(fn, "embeddings must have shape (N, D)", f"shape {tuple(embeddings.shape)}",
                          "flatten the features to one row per sample")
    if tuple(target.shape) != (embeddings.shape[0],):
        raise value_error(fn, f"target must have shape ({embeddings.shape[0]},), one class id per embedding",
                          f"shape {tuple(target.shape)}", "pass one integer label per row of embeddings")
    if weight.dim() != 2 or weight.shape[1] != embeddings.shape[1] or weight.shape[0] < min_classes:
        raise value_error(fn, f"weight must have shape (C, {embeddings.shape[1]}) with C >= 1, one centre per class",
                          f"shape {tuple(weight.shape)}", "pass the class centres as a (num_classes, D) tensor")


# --------------------------------------------------------------------------------------
# the margin function psi (acts on the N target cosines only)
# --------------------------------------------------------------------------------------


def target_transform(cos: Tensor, margin: Margin, variant: str) -> Tensor:
    """``psi(c) = cos(m1·arccos c + m2) - m3`` on target cosines ``cos`` (already in ``[-1, 1]``).

    ``"paper"``: the exact function with an exact gradient. For ``m1 = 1`` it is evaluated as
    ``c cos m2 - sqrt(1 - c'^2) sin m2 - m3`` with ``c' = clamp(c, -1 + 1e-6, 1 - 1e-6)``, and for
    ``m2 > 0`` it switches to the ArcFace authors' monotone fallback ``c - m2 sin m2 - m3`` where
    ``theta + m2 > pi`` (``c <= -cos m2``). For ``m1 != 1`` the arccos sees ``c'`` (no fallback).
    ``"reference"``: straight-through, forward ``cos(arccos c + m2)`` or ``c - m3`` with gradient 1.
    """
    m1, m2, m3 = margin
    if variant == "reference":
        if m2 != 0.0:
            with torch.no_grad():
                value = torch.cos(torch.acos(cos) + m2)
            return value + (cos - cos.detach())
        return cos - m3 if m3 != 0.0 else cos
    if m1 == 1.0:
        if m2 == 0.0:
            out = cos
        else:
            cc = cos.clamp(-1.0 + ROOT_CLAMP, 1.0 - ROOT_CLAMP)
            out = cos * math.cos(m2) - torch.sqrt(1.0 - cc * cc) * math.sin(m2)
            if m2 > 0.0:
                out = torch.where(cos > -math.cos(m2), out, cos - m2 * math.sin(m2))
    else:
        cc = cos.clamp(-1.0 + ROOT_CLAMP, 1.0 - ROOT_CLAMP)
        out = torch.cos(m1 * torch.acos(cc) + m2)
    return out - m3 if m3 != 0.0 else out


def margin_logits(
    cos: Tensor,
    target: Tensor,
    *,
    scale: float = 64.0,
    margin: Sequence[float] = (1.0, 0.5, 0.0),
    variant: str = "paper",
    interclass_filtering_threshold: float = 0.0,
    ignore_index: int = -100,
) -> Tensor:
    r"""The margin as a function ``(cos, target) -> logits`` for any cosine head.

    ``logits_ik = s·c_ik`` for ``k != y_i`` and ``logits_{i,y_i} = s·psi(c_{i,y_i})`` with
    ``c = clamp(cos, -1, 1)``, ``s = scale``, ``(m1, m2, m3) = margin`` and
    ``psi(c) = cos(m1·arccos c + m2) - m3`` (ArcFace ``(1, m, 0)``, CosFace ``(1, 0, m)``; see
    :func:`margin_softmax_loss` for the variants and the ArcFace fallback). With
    ``interclass_filtering_threshold > 0`` non-target cosines above it become 0. Rows whose id is
    ``ignore_index`` get no margin. ``F.cross_entropy(margin_logits(cos, y), y)`` is the
    ``"paper"`` margin softmax loss (``margin_softmax_loss`` adds the ``"reference"`` cap and avoids
    the extra ``N x C`` buffers).

    Shapes: ``cos (N, C)`` floating, ``target (N,)`` integer ids; returns ``(N, C)`` in float32
    (float64 for float64 input; also inside ``torch.autocast``).

    Masking classes: the margin heads take no mask. To remove classes for some rows (classes
    that do not exist for a sample), set the returned logits (or ``MarginSoftmaxLoss.logits``)
    to ``-inf`` there and use ``losses.cross_entropy_loss`` / ``F.cross_entropy``: the loss is
    that of the row without those classes and their gradient is exactly 0. Masking a row's
    target entry is a mistake (the loss of that row is ``+inf``). Papers: Deng et al., *ArcFace*, CVPR 2019, arXiv:1801.07698;
    Wang et al., *CosFace*, CVPR 2018, arXiv:1801.09414.

    >>> import torch, losses
    >>> cos = torch.tensor([[0.5, 0.2]])
    >>> losses.margin_logits(cos, torch.tensor([0]), scale=10.0, margin=(1.0, 0.0, 0.1))
    tensor([[4., 2.]])
    """
    fn = "margin_logits"
    s, m, thr = check_margin_hparams(fn, scale=scale, margin=margin, variant=variant,
                                     interclass_filtering_threshold=interclass_filtering_threshold)
    check_floating(fn, "cos", cos)
    check_integer_target(fn, target)
    if cos.dim() != 2 or tuple(target.shape) != (cos.shape[0],):
        raise value_error(fn, "cos must have shape (N, C) and target shape (N,)",
                          f"shapes {tuple(cos.shape)} and {tuple(target.shape)}", "pass one id per row of cos")
    check_ids_in_range(fn, target, cos.shape[1], ignore_index)
    check_finite(fn, "cos", cos)
    with no_autocast(cos):
        c = upcast(cos, compute_dtype(cos)).clamp(-1.0, 1.0)
        valid = target != ignore_index
        col = torch.where(valid, target, torch.zeros_like(target)).long().unsqueeze(1)
        base = torch.where(c > thr, torch.zeros((), dtype=c.dtype, device=c.device), c) if thr > 0 else c
        if c.shape[1] == 0:
            return s * base
        cy = c.gather(1, col).squeeze(1)
        new = torch.where(valid, target_transform(cy, m, variant), base.gather(1, col).squeeze(1))
        return s * base.scatter(1, col, new.unsqueeze(1))


# --------------------------------------------------------------------------------------
# fused cosine log-sum-exp (one N x K buffer)
# --------------------------------------------------------------------------------------


class _CosineLogSumExp(torch.autograd.Function):
    """Row maxima and sums of exponentials of ``z = s·cos`` with target entries replaced.

    Inputs: ``xs (N, D) = s·normalize(x)``, ``w (K, D)`` raw centres (normalised here), ``t (N,)``
    target logits, ``y (N,)`` target column per row, ``has_target (N,)`` bool (rows without one
    keep ``z_{i,y_i}``), ``scale``, ``threshold`` and a process ``group`` (``None``: no all-reduce).

    ``z_ik = clamp(xs_i·normalize(w_k), -s, s)``, set to 0 where above ``s·threshold`` (when
    ``threshold > 0``), ``z_{i,y_i} = t_i`` where ``has_target``; returns ``m_i = max_k z_ik``
    (all-reduced with MAX over ``group``; no gradient) and ``S_i = sum_k exp(z_ik - m_i)``.

    Only ``E = exp(z - m)`` is kept for backward (in the buffer of the matmul output), and the
    backward needs no further ``N x K`` buffer: the target column's share of ``E @ w`` is
    subtracted as an ``N x D`` correction. The clamp's zero gradient at ``|cos| > 1`` (reachable
    only by rounding) is not reproduced. No double backward.
    """

    @staticmethod
    def forward(ctx, xs, w, t, y, has_target, scale, threshold, group):  # type: ignore[override]
        n, k = xs.shape[0], w.shape[0]
        norm = torch.linalg.vector_norm(w, dim=1)
        inv = norm.clamp_min(NORM_EPS).reciprocal()
        wn = w * inv.unsqueeze(1)
        z = xs @ wn.t()
        del wn
        z.clamp_(-scale, scale)
        mask = None
        if threshold > 0:
            mask = z > scale * threshold
            z.masked_fill_(mask, 0.0)
        col = y.unsqueeze(1)
        if k > 0 and n > 0:
            keep = has_target.unsqueeze(1)
            z.scatter_(1, col, torch.where(keep, t.unsqueeze(1), z.gather(1, col)))
            if mask is not None:
                mask.scatter_(1, col, mask.gather(1, col) & ~keep)
        if k > 0:
            m = z.amax(dim=1)
        else:
            m = torch.full((n,), -math.inf, dtype=z.dtype, device=z.device)
        if group is not None:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        z.sub_(m.unsqueeze(1)).exp_()
        s_sum = z.sum(dim=1)
        ctx.save_for_backward(xs, w, inv, norm, z, y, has_target, mask)
        ctx.mark_non_differentiable(m)
        return m, s_sum

    @staticmethod
    @once_differentiable("margin_softmax_loss (also inside cosine softmax and Partial FC)")
    def backward(ctx, grad_m, grad_s):  # type: ignore[override]
        with no_autocast(grad_s):
            return _CosineLogSumExp._backward(ctx, grad_s)

    @staticmethod
    def _backward(ctx, grad_s):
        xs, w, inv, norm, e, y, has_target, mask = ctx.saved_tensors
        n, k = xs.shape[0], w.shape[0]
        g = grad_s
        if k > 0 and n > 0:
            e_y = e.gather(1, y.unsqueeze(1)).squeeze(1)
            coef = torch.where(has_target, g * e_y, torch.zeros((), dtype=g.dtype, device=g.device))
        else:
            coef = torch.zeros_like(g)
        p = e.masked_fill(mask, 0.0) if mask is not None else e
        wn = w * inv.unsqueeze(1)
        grad_xs = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_xs = (p @ wn).mul_(g.unsqueeze(1))
            if k > 0 and n > 0:
                grad_xs.sub_(coef.unsqueeze(1) * wn.index_select(0, y))
        if ctx.needs_input_grad[1]:
            grad_wn = p.t() @ (xs * g.unsqueeze(1))
            if k > 0 and n > 0:
                grad_wn.index_add_(0, y, xs * coef.unsqueeze(1), alpha=-1)
            del wn
            # backward of w / max(||w||, eps), in place: inv * (g - wn <wn, g>) where ||w|| > eps,
            # written as g * inv - w * inv^3 <w, g>
            coef_w = (w * grad_wn).sum(dim=1) * inv.pow(3) * (norm > NORM_EPS).to(w.dtype)
            grad_w = grad_wn.mul_(inv.unsqueeze(1)).addcmul_(w, coef_w.unsqueeze(1), value=-1.0)
        return grad_xs, grad_w, coef, None, None, None, None, None


def margin_row_losses(
    x: Tensor,
    w: Tensor,
    y: Tensor,
    has_target: Tensor,
    *,
    scale: float,
    margin: Margin,
    variant: str,
    threshold: float,
    group: Optional[object] = None,
    global_sum: Optional[Callable[[Tensor], Tensor]] = None,
) -> Tensor:
    """Per-row margin softmax losses ``logsumexp_k z_ik - z_{i,y_i}`` (private core).

    ``x (N, D)`` and ``w (K, D)`` in the compute dtype; ``y`` holds each row's target column in
    ``w`` (any valid column for rows without a target). With ``group``/``global_sum`` the row
    maxima are all-reduced inside the fused function and ``global_sum`` adds the sums of
    exponentials and the (single-owner) target logits over the ranks.
    """
    xn = F.normalize(x, dim=1, eps=NORM_EPS)
    if w.shape[0] > 0 and x.shape[0] > 0:
        wy = F.normalize(w.index_select(0, y), dim=1, eps=NORM_EPS)
        cy = (xn * wy).sum(dim=1).clamp(-1.0, 1.0)
        t = scale * target_transform(cy, margin, variant)
    else:
        t = xn.new_zeros(x.shape[0])
    m, s_sum = _CosineLogSumExp.apply(xn * scale, w, t, y, has_target, scale, threshold, group)
    if global_sum is not None:
        t = global_sum(torch.where(has_target, t, torch.zeros((), dtype=t.dtype, device=t.device)))
        s_sum = global_sum(s_sum)
    values = m + torch.log(s_sum) - t
    if variant == "reference":
        # forward-only cap -log max(p, 1e-30), with the uncapped gradient
        values = values.detach().clamp(max=REFERENCE_CAP) + (values - values.detach())
    return values


def _psi_and_derivative(c: Tensor, m2: float, m3: float) -> Tuple[Tensor, Tensor]:
    """``psi(c)`` and ``psi'(c)`` of the ``"paper"`` variant with ``m1 = 1`` in closed form (the
    same function and gradient :func:`target_transform` gives through autograd)."""
    if m2 == 0.0:
        psi = c - m3 if m3 != 0.0 else c
        return psi, torch.ones_like(c)
    cos_m, sin_m = math.cos(m2), math.sin(m2)
    cc = c.clamp(-1.0 + ROOT_CLAMP, 1.0 - ROOT_CLAMP)
    root = torch.rsub(cc * cc, 1.0).sqrt_()
    psi = (c * cos_m).sub_(root * sin_m)
    # d/dc of -sqrt(1 - cc^2) sin m2 is sin m2 cc / root where the clamp passes the gradient
    # (cc == c, the bounds included), 0 where it does not
    dpsi = torch.div(cc, root).masked_fill_(cc != c, 0.0).mul_(sin_m).add_(cos_m)
    if m2 > 0.0:
        fallback = c <= -cos_m  # theta + m2 > pi: the monotone fallback c - m2 sin m2, slope 1
        psi = torch.where(fallback, c - m2 * sin_m, psi)
        dpsi.masked_fill_(fallback, 1.0)
    return (psi - m3 if m3 != 0.0 else psi), dpsi


def _margin_exp_buffer(xs: Tensor, wn: Tensor, y: Tensor, scale: float, m2: float,
                       m3: float) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(E, m, S, t, psi')`` of :class:`_MarginSoftmaxFunction`: ``z = xs @ wn.T`` (``wn`` the
    normalised centres) clamped to ``[-s, s]``, the target entry patched to ``t = s·psi(z_{i,y_i}/s)``,
    ``m`` the row maxima, ``E = exp(z - m)`` in the matmul's buffer and ``S`` its row sums."""
    z = xs @ wn.t()
    z.clamp_(-scale, scale)
    col = y.unsqueeze(1)
    psi, dpsi = _psi_and_derivative(z.gather(1, col).squeeze(1).div_(scale), m2, m3)
    t = psi.mul_(scale)
    z.scatter_(1, col, t.unsqueeze(1))
    m = z.amax(dim=1)
    z.sub_(m.unsqueeze(1)).exp_()
    return z, m, z.sum(dim=1), t, dpsi


class _MarginSoftmaxFunction(torch.autograd.Function):
    """The ``"paper"`` margin softmax with ``m1 = 1``, no filtering threshold and no process group,
    value and gradients in one Function (one ``N x C`` buffer, three matmuls, no autograd graph).

    Forward: ``z = (s·normalize(x)) @ normalize(w).T`` clamped to ``[-s, s]``, the target cosine
    ``c_i = z_{i,y_i}/s`` read from it and its entry patched to ``s·psi(c_i)`` (``psi'`` kept),
    then ``L_i = m_i + log S_i - s·psi(c_i)`` with ``E = exp(z - m)`` kept in the buffer.
    Backward: ``dL/dcos_ik = s g_i p_ik`` off the target, ``s g_i (p_{i,y_i} - 1) psi'(c_i)`` on it,
    written into ``E`` in place, then ``G @ wn`` and ``G.T @ xn`` and the backward of both
    normalisations. Row weights (``valid`` and the mean's ``1/count``) are applied inside; ignored
    rows weigh 0. A second backward through a retained graph rebuilds ``E`` (the first one
    overwrote it). No double backward.
    """

    @staticmethod
    def forward(ctx, x, w, y, valid, scale, m2, m3, reduction):  # type: ignore[override]
        norm_x = torch.linalg.vector_norm(x, dim=1)
        inv_x = norm_x.clamp_min(NORM_EPS).reciprocal()
        xs = x * (inv_x * scale).unsqueeze(1)
        norm_w = torch.linalg.vector_norm(w, dim=1)
        inv_w = norm_w.clamp_min(NORM_EPS).reciprocal()
        wn = w * inv_w.unsqueeze(1)  # saved: the backward needs it (no larger peak than rebuilding it)
        e, m, s_sum, t, dpsi = _margin_exp_buffer(xs, wn, y, scale, m2, m3)
        values = torch.log(s_sum).add_(m).sub_(t)
        if valid is None:  # every row counts: the row weight is a number
            rw = 1.0 / x.shape[0] if reduction == "mean" else 1.0
            out = values if reduction == "none" else values.sum().mul_(rw)
        else:
            rw = valid.to(x.dtype)
            if reduction == "mean":
                rw = rw / rw.sum().clamp_min(1.0)
            values = torch.where(valid, values, torch.zeros((), dtype=values.dtype, device=values.device))
            out = values if reduction == "none" else torch.dot(values, rw)
        ctx.rw = rw if valid is None else None
        ctx.save_for_backward(xs, wn, inv_x, norm_x, inv_w, norm_w, s_sum, y, dpsi,
                              None if valid is None else rw)
        ctx.e = e  # not saved: the backward overwrites it
        ctx.options = (scale, m2, m3)
        return out

    @staticmethod
    @once_differentiable("margin_softmax_loss")
    def backward(ctx, grad_out):  # type: ignore[override]
        with no_autocast(grad_out):
            xs, wn, inv_x, norm_x, inv_w, norm_w, s_sum, y, dpsi, rw = ctx.saved_tensors
            if rw is None:
                rw = ctx.rw
            s = ctx.options[0]
            e = ctx.e
            ctx.e = None
            if e is None:  # a second backward through a retained graph
                e = _margin_exp_buffer(xs, wn, y, *ctx.options)[0]
            k = grad_out * (rw * s)  # s g_i: the row's weight times the incoming gradient, times s
            col = y.unsqueeze(1)
            # G = s g_i E_ik / S_i, the target column s g_i (p_iy - 1) psi'(c_i); in E's buffer
            rs = (k / s_sum).unsqueeze(1)
            gy = (e.gather(1, col) * rs).sub_(k.unsqueeze(-1) if k.dim() else k).mul_(dpsi.unsqueeze(1))
            gmat = e.mul_(rs).scatter_(1, col, gy)
            grad_x = grad_w = None
            if ctx.needs_input_grad[0]:
                gxn = gmat @ wn  # d/d(normalize(x)); xs = s·normalize(x)
                xn = xs / s
                # backward of x / max(||x||, eps): inv (g - xn <xn, g>) where ||x|| > eps
                dot = (xn * gxn).sum(dim=1).masked_fill_(norm_x <= NORM_EPS, 0.0)
                grad_x = gxn.addcmul_(xn, dot.unsqueeze(1), value=-1.0).mul_(inv_x.unsqueeze(1))
            if ctx.needs_input_grad[1]:
                grad_wn = gmat.t() @ xs
                del gmat, e
                # backward of w / max(||w||, eps) (xs carries s: divide it out),
                # inv (g - wn <wn, g>) where ||w|| > eps
                inv_ws = inv_w * (1.0 / s)
                coef_w = (wn * grad_wn).sum(dim=1).masked_fill_(norm_w <= NORM_EPS, 0.0)
                grad_w = grad_wn.addcmul_(wn, coef_w.unsqueeze(1), value=-1.0).mul_(inv_ws.unsqueeze(1))
        return grad_x, grad_w, None, None, None, None, None, None


# --------------------------------------------------------------------------------------
# public loss
# --------------------------------------------------------------------------------------


def margin_softmax_loss(
    embeddings: Tensor,
    target: Tensor,
    weight: Tensor,
    *,
    scale: float = 64.0,
    margin: Sequence[float] = (1.0, 0.5, 0.0),
    variant: str = "paper",
    interclass_filtering_threshold: float = 0.0,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Additive/multiplicative angular margin softmax (ArcFace, CosFace, combined) on a cosine head.

    ``L_i = logsumexp_k z_ik - z_{i,y_i}`` with ``z_ik = s·c_ik`` (``k != y_i``),
    ``z_{i,y_i} = s·psi(c_{i,y_i})``, ``c_ik = clamp(<normalize(x_i), normalize(w_k)>, -1, 1)`` and
    ``psi(c) = cos(m1·arccos c + m2) - m3``; ``x = embeddings``, ``w = weight``, ``s = scale``,
    ``(m1, m2, m3) = margin``, ``y = target``. ArcFace is ``(1, m, 0)``:
    ``psi = c cos m - sqrt(1 - c^2) sin m`` (``c`` clamped to ``[-1 + 1e-6, 1 - 1e-6]`` in the root);
    CosFace is ``(1, 0, m)``: ``psi = c - m``; ``(1, 0, 0)`` is the plain cosine softmax
    (the ``cosine_softmax`` registry entry). ``interclass_filtering_threshold > 0`` (An et al. 2022)
    sets non-target cosines above it to 0. ``normalize(v) = v / max(||v||, 1e-12)``.

    Variants: ``"paper"`` (default) uses the exact gradient of ``psi``, and for ArcFace
    (``m1 = 1``, ``m2 > 0``) with ``theta + m2 > pi`` (``c <= -cos m2``) the authors' monotone
    fallback ``psi = c - m2 sin m2 - m3``; ``m1 != 1`` is allowed (no fallback; ``psi`` is then not
    monotone near ``pi``). ``"reference"`` reproduces insightface's ``arcface_torch``: the ArcFace
    target logit ``s·cos(theta + m2)`` (no fallback) is straight-through (backward as ``s·c``, so
    ``dL/dc_ik = s (p_ik - [k = y_i]) / B``) and the per-sample loss is capped in the forward pass
    only, ``-log max(p_{i,y_i}, 1e-30) = min(L_i, 69.0776)``; margins other than ``(1, m2, 0)`` and
    ``(1, 0, m3)`` raise ``ValueError`` (the reference silently ignores the others).

    Shapes: ``embeddings (N, D)``, ``target (N,)`` integer ids, ``weight (C, D)``; ``"none"`` gives
    ``(N,)``. Unit: the row, weight 0 where ``target == ignore_index`` (``"mean"`` divides by the
    number of other rows; all ignored: an attached 0). Computed in float32 (float64 if an input is
    float64); half inputs are upcast first, and inside ``torch.autocast`` the forward and backward
    still run in float32 (gradients come back in each input's dtype). The ``N x C`` logits exist
    once (see the module notes). ``C >= 2`` (one class: ``ValueError``). No per-class mask: for
    rows whose candidate classes differ, mask :func:`margin_logits` with ``-inf`` as described
    there.

    Papers: J. Deng, J. Guo, N. Xue, S. Zafeiriou, *ArcFace: Additive Angular Margin Loss for Deep
    Face Recognition*, CVPR 2019, arXiv:1801.07698; H. Wang et al., *CosFace: Large Margin Cosine
    Loss for Deep Face Recognition*, CVPR 2018, arXiv:1801.09414. Defaults ``s = 64``,
    ``m = (1, 0.5, 0)`` are insightface's base configuration (its WebFace42M configs use CosFace
    ``m3 = 0.4``).

    >>> import torch, torch.nn.functional as F, losses
    >>> x, w, y = torch.randn(4, 3), torch.randn(5, 3), torch.tensor([0, 2, 2, 4])
    >>> cos = F.normalize(x, dim=1) @ F.normalize(w, dim=1).T
    >>> loss = losses.margin_softmax_loss(x, y, w, scale=16.0, margin=(1.0, 0.0, 0.0))
    >>> bool(torch.isclose(loss, F.cross_entropy(16.0 * cos, y), atol=1e-5))
    True
    """
    fn = "margin_softmax_loss"
    s, m, thr = check_margin_hparams(fn, scale=scale, margin=margin, variant=variant,
                                     interclass_filtering_threshold=interclass_filtering_threshold)
    check_reduction(fn, reduction)
    check_head_inputs(fn, embeddings, target, weight)
    check_softmax_classes(fn, weight.shape[0], arg="weight.shape[0] (the number of classes C)")
    check_ids_in_range(fn, target, weight.shape[0], ignore_index)
    check_finite(fn, "embeddings", embeddings)
    check_finite(fn, "weight", weight)
    dtype = compute_dtype(embeddings, weight)
    valid = target != ignore_index
    if variant == "paper" and thr == 0.0 and m[0] == 1.0 and embeddings.shape[0] > 0:
        with no_autocast(embeddings, weight):
            if all_kept(valid):  # no ignored row (seen on the host): no zeroing, ids as they are
                return _MarginSoftmaxFunction.apply(upcast(embeddings, dtype), upcast(weight, dtype), target.long(),
                                                    None, s, m[1], m[2], reduction)
            y = torch.where(valid, target, torch.zeros_like(target)).long()
            return _MarginSoftmaxFunction.apply(upcast(drop_rows(embeddings, valid), dtype), upcast(weight, dtype),
                                                y, valid, s, m[1], m[2], reduction)
    y = torch.where(valid, target, torch.zeros_like(target)).long()
    with no_autocast(embeddings, weight):
        values = margin_row_losses(upcast(drop_rows(embeddings, valid), dtype), upcast(weight, dtype), y, valid,
                                   scale=s, margin=m, variant=variant, threshold=thr)
        return reduce_loss(values, valid.to(dtype), reduction)


def cosine_logits(embeddings: Tensor, weight: Tensor, scale: float) -> Tensor:
    """``scale·normalize(embeddings) @ normalize(weight).T`` in the compute dtype (no margin)."""
    dtype = compute_dtype(embeddings, weight)
    with no_autocast(embeddings, weight):
        xn = F.normalize(upcast(embeddings, dtype), dim=1, eps=NORM_EPS)
        wn = F.normalize(upcast(weight, dtype), dim=1, eps=NORM_EPS)
        return scale * matmul(xn, wn.t())


class MarginSoftmaxLoss(nn.Module):
    """Additive-angular-margin (ArcFace / CosFace) softmax as a module, owning the class centres; the
    maths is :func:`losses.margin_softmax_loss`.

    Args:
        embedding_dim: the feature size ``D``.
        num_classes: the number of classes ``C >= 2``.
        scale: the logit scale ``s`` (default 64.0).
        margin: ``(m1, m2, m3)`` of ``cos(m1 * theta + m2) - m3`` on the target cosine (default
            ``(1.0, 0.5, 0.0)``, ArcFace).
        variant: ``"paper"`` (default) or ``"reference"``.
        interclass_filtering_threshold: non-target cosines above it become 0 when ``> 0``
            (default 0.0, off).
        ignore_index: target id whose rows are skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    ``forward(embeddings, target)``: ``embeddings (N, D)`` (``D = embedding_dim``, else
    ``ValueError``), ``target`` ids ``(N,)``. Returns a scalar for ``"mean"``/``"sum"``, ``(N,)``
    for ``"none"``. Forward and backward work inside ``torch.autocast`` (maths in float32).

    Parameters: ``weight (C, D)``, the class centres, initialised from ``N(0, 0.01^2)``.

    ``.logits(embeddings)`` returns ``scale·cos`` over all classes without the margin (for
    evaluation); it may be masked with ``-inf`` before a cross-entropy (see :func:`margin_logits`),
    the loss itself takes no mask. With ``margin=(1.0, 0.0, 0.0)`` it is the ``cosine_softmax``
    registry entry (NormFace: F. Wang et al., *NormFace: L2 Hypersphere Embedding for Face
    Verification*, ACM MM 2017, arXiv:1704.06369). ArcFace: arXiv:1801.07698.

    >>> import torch, losses
    >>> head = losses.MarginSoftmaxLoss(8, 5)
    >>> head(torch.randn(3, 8), torch.tensor([0, 1, 4])).shape
    torch.Size([])
    """

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        *,
        scale: float = 64.0,
        margin: Tuple[float, float, float] = (1.0, 0.5, 0.0),
        variant: str = "paper",
        interclass_filtering_threshold: float = 0.0,
        ignore_index: int = -100,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        fn = "MarginSoftmaxLoss"
        check_head_sizes(fn, embedding_dim, num_classes)
        check_softmax_classes(fn, num_classes, arg="num_classes")
        s, m, thr = check_margin_hparams(fn, scale=scale, margin=margin, variant=variant,
                                         interclass_filtering_threshold=interclass_filtering_threshold)
        check_reduction(fn, reduction)
        self.embedding_dim = embedding_dim
        self.num_classes = num_classes
        self.scale = s
        self.margin = m
        self.variant = variant
        self.interclass_filtering_threshold = thr
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction
        self.weight = nn.Parameter(torch.empty(num_classes, embedding_dim).normal_(0.0, 0.01))

    def forward(self, embeddings: Tensor, target: Tensor) -> Tensor:
        """The margin softmax loss of the embeddings against the owned centres.

        Args:
            embeddings: floating features ``(N, embedding_dim)``.
            target: integer class ids ``(N,)``.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-row losses ``(N,)`` (``"none"``).
        """
        check_head_embeddings("margin_softmax_loss", type(self).__name__, embeddings, self.embedding_dim)
        return margin_softmax_loss(
            embeddings, target, self.weight, scale=self.scale, margin=self.margin, variant=self.variant,
            interclass_filtering_threshold=self.interclass_filtering_threshold,
            ignore_index=self.ignore_index, reduction=self.reduction,
        )

    def logits(self, embeddings: Tensor) -> Tensor:
        """``scale·cos(embeddings, weight)`` of shape ``(N, C)``, no margin."""
        name = type(self).__name__
        check_head_embeddings(name + ".logits", name, embeddings, self.embedding_dim)
        return cosine_logits(embeddings, self.weight, self.scale)

    extra_repr = auto_extra_repr


register(
    "margin_softmax",
    function=margin_softmax_loss,
    module=MarginSoftmaxLoss,
    inputs="embeddings",
    unit="row",
    unit_weights=id_unit_weights,
    arxiv="1801.07698",
    paper="J. Deng et al., ArcFace: Additive Angular Margin Loss for Deep Face Recognition, CVPR 2019",
    owns_head=True,
    softmax=True,
    example_kwargs={"embedding_dim": 8, "num_classes": 5},
)
register(
    "cosine_softmax",
    function=margin_softmax_loss,
    module=MarginSoftmaxLoss,
    inputs="embeddings",
    unit="row",
    unit_weights=id_unit_weights,
    arxiv="1704.06369",
    paper="F. Wang et al., NormFace: L2 Hypersphere Embedding for Face Verification, ACM MM 2017 "
          "(margin softmax with margin (1, 0, 0))",
    owns_head=True,
    softmax=True,
    example_kwargs={"embedding_dim": 8, "num_classes": 5, "margin": (1.0, 0.0, 0.0)},
    function_kwargs={"margin": (1.0, 0.0, 0.0)},
)
