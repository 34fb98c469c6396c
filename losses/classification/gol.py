"""GOL: the Gumbel optimised loss (binary cross-entropy through the Gumbel CDF).

Alexandridis, Deng, Nguyen, Luo, *Long-tailed Instance Segmentation using Gumbel Optimized Loss*,
ECCV 2022, arXiv:2207.10936 (docs/losses/gol.md).

The activation is the Gumbel CDF ``eta(q) = exp(-exp(-q))``; the loss is the element-wise binary
cross-entropy of ``eta(input)`` against one-hot (or soft / multi-hot) targets, evaluated in log
space. The ``"paper"`` variant runs through a custom :class:`torch.autograd.Function` whose forward
also writes the gradient, so the backward is a single multiplication.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._core import (
    check_logits_dim,
    once_differentiable,
    set_at_index,
    check_ignore_index,
    _compiling,
    auto_extra_repr,
    check_choice,
    check_class_weight,
    check_finite,
    check_floating,
    check_number,
    check_reduction,
    check_tensor,
    compute_dtype,
    no_autocast,
    reduce_loss,
    type_error,
    upcast,
    value_error,
)
from .._registry import element_unit_weights, register
from .. import kernels
from ..kernels import rows_native
from ._targets import binary_kernel, broadcast_class_weight, elementwise_targets, integer_targets, one_channel

__all__ = [
    "gumbel_activation",
    "gumbel_prior_bias",
    "gumbel_bce_loss",
    "GumbelBCELoss",
    "GOLLoss",
]

#: logits are floored here before exponentiating (zero gradient below), docs/losses/gol.md
_FLOOR = -50.0
#: the reference's logit clamp
_REFERENCE_CLAMP = (-4.0, 10.0)
#: the reference clamps the reduced loss to this range
_REFERENCE_RESULT_RANGE = (0.0, 20.0)
_VARIANTS = ("paper", "reference")
_LN2 = math.log(2.0)


def _cap(dtype: torch.dtype) -> float:
    # Logits are kept <= cap while computing h = exp(-q)/2 and t = tanh(h): h stays a normal
    # number and 1/t stays finite. Above the cap the exact values are recovered in closed form
    # (-log(1 - eta) = q + u/2 rounds to q; its derivative 1 - u/2 rounds to 1); the y*u terms
    # there are below 1e-36 (fp32) / 1e-304 (fp64).
    return 700.0 if dtype == torch.float64 else 85.0


# --------------------------------------------------------------------------------------
# public helpers
# --------------------------------------------------------------------------------------


def gumbel_activation(input: Tensor) -> Tensor:
    r"""The Gumbel CDF ``eta(q) = exp(-exp(-q))`` applied element-wise (GOL's activation).

    Increasing in ``q``, ``eta(0) = exp(-1)``; it replaces the sigmoid of a one-vs-all classifier
    (Alexandridis et al., ECCV 2022, arXiv:2207.10936). ``input`` is floored at -50 before
    exponentiating (the value there is already exactly 0; the gradient below is 0), so
    ``-inf``/large negative logits give 0 with a finite gradient. Half inputs are computed in
    float32 and returned in the input dtype (as :func:`torch.sigmoid`).

    >>> import torch, losses
    >>> round(float(losses.gumbel_activation(torch.tensor(0.0))), 6)  # exp(-1)
    0.367879
    """
    fn = "gumbel_activation"
    check_floating(fn, "input", input)
    check_finite(fn, "input", input, allow_neg_inf=True, neg_inf_note="-inf is allowed (probability 0)")
    dtype = compute_dtype(input)
    q = upcast(input, dtype).clamp(min=_FLOOR)
    return torch.exp(-torch.exp(-q)).to(input.dtype)


def gumbel_prior_bias(prior: float) -> float:
    r"""The classifier bias ``b = -log(-log p)`` whose Gumbel activation is the prior ``p``.

    Initialising the bias this way makes ``gumbel_activation(b) == p`` at the start of
    training (the GOL detection configs use ``b = -2``, i.e. ``p = exp(-e^2) ~ 6.2e-4``).

    >>> import losses
    >>> round(losses.gumbel_prior_bias(0.01), 4)
    -1.5272
    """
    p = check_number("gumbel_prior_bias", "prior", prior, low=0.0, high=1.0, low_inclusive=False,
                     high_inclusive=False, hint="pass a probability strictly between 0 and 1")
    return -math.log(-math.log(p))


# --------------------------------------------------------------------------------------
# the paper variant: log space, fused value + gradient
# --------------------------------------------------------------------------------------


#: Taylor coefficients of tanh(h)/h in powers of h^2 (h^0 .. h^14), used below _TANH_SERIES_END
_TANH_SERIES = (1.0, -1.0 / 3.0, 2.0 / 15.0, -17.0 / 315.0, 62.0 / 2835.0, -1382.0 / 155925.0,
                21844.0 / 6081075.0, -929569.0 / 638512875.0)
_TANH_SERIES_END = 0.4


def _tanh_nonneg(h: Tensor) -> Tensor:
    """``tanh(h)`` for ``h >= 0`` from one ``exp``: ``(1 - e)/(1 + e)`` with ``e = exp(-2h)`` for
    ``h >= 0.4`` (there ``1 - e >= 0.55``, no cancellation) and the odd Taylor series to ``h^15``
    below (truncation below 1e-9 relative at 0.4), within 2.2 ulp of the float64 ``tanh`` over float32.

    Used while ``torch.compile`` traces the float32 loss: inductor fuses the whole chain into one
    kernel, where the vectorised ``tanh`` cost about 4.6x a vectorised ``exp`` per element and was
    the largest single term of the compiled step. Eagerly ``torch.tanh`` stays (one pass; the
    series would be a dozen)."""
    e = torch.exp(h * -2.0)
    big = (1.0 - e) / (1.0 + e)
    h2 = h * h
    p = h2 * _TANH_SERIES[-1] + _TANH_SERIES[-2]
    for c in reversed(_TANH_SERIES[:-2]):
        p = p * h2 + c
    return torch.where(h < _TANH_SERIES_END, h * p, big)


def _half_u_and_tanh(x: Tensor, lo: float, hi: float) -> Tuple[Tensor, Tensor]:
    """``h = u/2 = exp(-q)/2`` and ``t = tanh(h)`` for ``q = clamp(x, lo, hi)`` (kept <= the cap).

    Everything else follows from ``h`` and ``t`` without ``expm1``/``log1p`` (not vectorised on
    CPU): ``eta = (1 - t)/(1 + t)``, ``1 - eta = 2t/(1 + t)``, so
    ``b = -log(1 - eta) = log((1 + t)/(2t))`` and ``r = db/dq = u eta/(1 - eta) = h/t - h``.
    Both are accurate to a few ulp of ``max(b, 1)`` and ``u`` respectively.
    """
    cap = _cap(x.dtype)
    top, bottom = min(hi, cap), min(lo, cap)
    h = torch.rsub(x, -_LN2).clamp_(-top - _LN2, -bottom - _LN2).exp_()
    if _compiling() and h.dtype == torch.float32:
        return h, _tanh_nonneg(h)
    return h, torch.tanh(h)


def _b_from_t_(t: Tensor, x: Tensor, lo: float, hi: float) -> Tensor:
    """In place: ``t -> b = -log(1 - eta) = log(1/2 + 1/(2t))``, exact above the cap (``b >= q``)."""
    b = t.reciprocal_().mul_(0.5).add_(0.5).log_()
    if hi > _cap(x.dtype):
        q = x if (lo <= 0.0 and math.isinf(hi)) else x.clamp(lo, hi)
        b = torch.maximum(b, q, out=b)
    return b


def _terms_exact(x: Tensor, lo: float, hi: float) -> Tuple[Tensor, Tensor, Tensor]:
    """Float64: ``u``, ``b`` and ``r`` from ``expm1`` / ``log1p`` directly (no tanh shortcut), exact
    to a few ulp of each quantity itself: ``b = -log(1 - eta)`` as ``-log(-expm1(-u))`` where
    ``eta = e^{-u} >= 1/2`` and as ``-log1p(-eta)`` where ``eta < 1/2`` (``q < log(1/log 2)``: there
    ``-expm1(-u)`` rounds to 1 once ``eta`` is below the float64 epsilon, ``q < -3.6``, and the value
    would be 0 instead of ``~eta``), ``r = u / expm1(u)``; above the cap ``b = q`` (the ``u/2``
    correction is below 1e-304) and ``r = 1``."""
    q = x.clamp(lo, hi)
    u = torch.exp(-q)
    cap = _cap(x.dtype)
    uc = torch.exp(-q.clamp(max=cap))
    b = torch.where(q > cap, q, torch.where(uc > _LN2, -torch.log1p(-torch.exp(-uc)), -torch.log(-torch.expm1(-uc))))
    r = uc / torch.expm1(uc)
    return u, b, r


def _terms(x: Tensor, lo: float, hi: float) -> Tuple[Tensor, Tensor, Tensor]:
    """Fresh tensors ``u = e^{-q}``, ``b = -log(1 - eta(q))`` and ``r = db/dq`` (clamped ``q``).

    Float32 uses the vectorised tanh forms below (a few ulp of ``max(b, 1)`` and of ``u``);
    float64 uses :func:`_terms_exact` so that it is exact to ~1e-15 relative everywhere."""
    if x.dtype == torch.float64:
        return _terms_exact(x, lo, hi)
    h, t = _half_u_and_tanh(x, lo, hi)
    r = torch.div(h, t).sub_(h)
    b = _b_from_t_(t, x, lo, hi)
    return h.mul_(2.0), b, r


def _grad_mask(x: Tensor, lo: float, hi: float, raw_hi: float) -> Tensor:
    """True where the gradient is 0: logits below the floor / outside the clamp."""
    if raw_hi < _FLOOR:
        return torch.ones_like(x, dtype=torch.bool)
    out = x < lo
    if not math.isinf(hi):
        out |= x > hi
    return out


def _paper_forward(x: Tensor, y: Optional[Tensor], ids: Optional[Tensor], valid: Optional[Tensor],
                   w: Optional[Tensor], smoothing: float, lo: float, hi: float, reduction: str,
                   need_grad: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """Value and d(value)/dx of the paper variant (no autograd).

    Either ``y`` (dense targets shaped like ``x``) or ``ids``/``valid`` (``(N, *)`` class ids and
    their validity; target ``1 - eps + eps/C`` at the id, ``eps/C`` elsewhere) is given. ``w`` is
    ``None`` or broadcastable to ``x``. For ``"none"`` the gradient is element-wise.
    """
    if (ids is not None and valid is None and w is None and smoothing == 0.0 and reduction != "none" and lo == -math.inf
            and hi == math.inf and x.dtype == torch.float32 and x.dim() == 2):
        out = _fast_ids_forward(x, ids, reduction, need_grad)
        if out is not None:
            return out
    if ids is not None and valid is None:
        valid = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
    raw_hi = hi
    lo = max(lo, _FLOOR)
    hi = max(hi, lo)
    c = x.shape[1]
    if y is not None:
        # dense targets: l = b + y (u - b), dl/dq = r - y (u + r)
        u, b, r = _terms(x, lo, hi)
        values = torch.lerp(b, u, y)
        grad = None
        if need_grad:
            grad = torch.lerp(r, u.neg_(), y)  # (1 - y) r - y u, exact at y = 1 (no cancellation)
            grad.masked_fill_(_grad_mask(x, lo, hi, raw_hi), 0.0)
        del u, b, r
        if w is not None:
            values = values.mul_(w)
            if grad is not None:
                grad = grad.mul_(w)
        if reduction == "none":
            return values, grad
        total = values.sum()
        if reduction == "mean":
            scale = 1.0 / max(values.numel(), 1)
            total = total * scale
            if grad is not None:
                grad = grad.mul_(scale)
        return total, grad

    # class ids: the dense background has target s = eps/C; each id's entry is replaced below
    assert ids is not None and valid is not None
    s = smoothing / c
    y_t = 1.0 - smoothing + s
    # ids are valid or ignored (validated); an ignored row's id is any in-range index
    idx = ids.clamp(0, c - 1).unsqueeze(1)
    vmask = valid.to(x.dtype)
    vb = vmask.unsqueeze(1)
    if reduction == "mean":
        # denominator: non-ignored elements (at least C when any row is valid, else use 1)
        inv = vmask.sum().mul_(c).clamp_(min=1.0).reciprocal_()
        row_scale = vb * inv
    else:
        inv = None
        row_scale = vb
    x_t = x.gather(1, idx)
    # the fused tanh hot path is float32-only; float64 takes the exact terms
    fast = s == 0.0 and lo == _FLOOR and math.isinf(hi) and x.dtype != torch.float64
    # exact value and gradient at the ids (target y_t = 1 - eps + eps/C)
    if fast:
        # y_t = 1: l = u, dl/dq = -u (0 below the floor)
        val_t = x_t.clamp(min=_FLOOR).neg_().exp_()
        g_t = val_t.neg().masked_fill_(x_t < _FLOOR, 0.0)
    else:
        u_t, b_t, r_t = _terms(x_t, lo, hi)
        # lerp is exact at y_t = 1 (b + y (u - b) would cancel: b ~ q, u ~ e^-q)
        val_t = torch.lerp(b_t, u_t, y_t)
        g_t = torch.lerp(r_t, -u_t, y_t).masked_fill_(_grad_mask(x_t, lo, hi, raw_hi), 0.0)
    w_t = None
    if w is not None:
        w_t = w.expand_as(x).gather(1, idx)
        val_t = val_t * w_t
        g_t = g_t * w_t
    grad = None
    if fast:
        # the hot path (plain one-hot ids): two buffers, everything in place; below the floor
        # t == 1, so r = h/t - h is exactly 0 and no mask is needed
        cap = _cap(x.dtype)
        # one read of the logits decides whether the clamp to [floor, cap] and the closed form
        # above the cap are identities (typical logits): then both passes are skipped
        inside = x.device.type == "cpu" and not _compiling() and x.numel() > 0
        if inside:
            lo_x, hi_x = torch.aminmax(x)
            inside = bool(lo_x >= _FLOOR) and bool(hi_x <= cap)
        if inside:
            h = torch.rsub(x, -_LN2).exp_()
            t = torch.tanh(h)
        else:
            h, t = _half_u_and_tanh(x, lo, hi)
        if need_grad:
            grad = h.mul_(-row_scale).addcdiv_(h, t, value=-1.0)  # row_scale * (h/t - h)
        del h
        if inside:
            # b = log(1/2 + 1/(2t)) in two passes; b >= q holds in exact arithmetic, and below the
            # cap the closed form's maximum(b, q) only guards rounding, which it is left to
            values = torch.addcdiv(_HALF[x.dtype], _ONE[x.dtype], t, value=0.5, out=t).log_()
        else:
            values = _b_from_t_(t, x, lo, hi)
    else:
        u, b, r = _terms(x, lo, hi)
        values = b if s == 0.0 else torch.lerp(b, u, s)
        if need_grad:
            grad = r if s == 0.0 else r.mul_(1.0 - s).add_(u, alpha=-s)
            grad.masked_fill_(_grad_mask(x, lo, hi, raw_hi), 0.0).mul_(row_scale)
        del u, b, r
    if grad is not None:
        if w is not None:
            grad = grad.mul_(w)
        grad = set_at_index(grad, idx, g_t.mul_(row_scale))
    if reduction == "none":
        if w is not None:
            values = values.mul_(w)
        return set_at_index(values.mul_(vb), idx, val_t.mul_(vb)), grad
    # background sum over the valid rows with each id's own entry set to 0 first, then the ids'
    # values added: subtracting the background entry afterwards would cancel (at a confident
    # positive the background entry is ~x_t while the id's value is ~e^-x_t)
    class_w = w is not None and w.shape[0] == 1 and all(d == 1 for d in w.shape[2:])
    if w is not None and not class_w:
        values = values.mul_(w)
    values = set_at_index(values, idx, 0.0)
    rows = torch.einsum("nc...,c->n...", values, w.reshape(-1)) if class_w else values.sum(1)
    del values
    rows = rows + val_t.squeeze(1)
    total = torch.dot(rows.reshape(-1), vmask.reshape(-1))
    if inv is not None:
        total = total * inv
    return total, grad


def _fast_ids_forward(x: Tensor, ids: Tensor, reduction: str, need_grad: bool) -> Optional[Tuple[Tensor, Optional[Tensor]]]:
    """Value and gradient for the common call: float32 ``(N, C)`` logits on CPU, every id valid
    (``ids`` in range), no weight, no smoothing, no clamp, a reduced output; ``None`` when a value
    comes out non-finite (a logit above ~88, where ``u/2`` underflows, or NaN / ``+inf``): the
    general path then applies the closed form above the cap.

    The same maths as the hot path of :func:`_paper_forward`, with fewer operator calls and one
    pass fewer: the floor is a clamp of the exponent (below it ``t = 1`` exactly, so the value and
    the gradient are exactly 0, as the general path's), instead of a range check of the logits;
    between the cap (85) and the overflow of ``1/t`` ``t = tanh(h) = h`` to the last bit, so
    ``log(1/2 + 1/(2t))`` and ``h/t - h`` are the closed form's ``q`` and ``1 - u/2`` to a few ulp.
    The scale is a Python number; the ids' exact values ``u = e^{-x}`` replace their background
    entries (a replacement, not a subtraction) and one ``sum`` reduces; ``1/2 + 1/(2t)`` is one
    ``addcdiv`` against a ``(C,)`` row of halves (with a 0-dim constant it ran as a broadcast loop
    about 4x slower than one elementwise pass)."""
    if x.device.type != "cpu" or _compiling() or x.numel() == 0:
        return None
    n, c = x.shape
    scale = 1.0 / (n * c) if reduction == "mean" else 1.0
    idx = ids.clamp(0, c - 1).unsqueeze(1)  # out-of-range ids (unchecked with validation off) must not crash
    x_t = x.gather(1, idx)
    below = x_t < _FLOOR
    val_t = x_t.clamp_(min=_FLOOR).neg_().exp_()  # l = u at the id (y = 1)
    h = torch.rsub(x, -_LN2).clamp_(max=-_FLOOR - _LN2).exp_()  # u / 2 = exp(-max(x, floor)) / 2
    t = torch.tanh(h)
    grad = None
    if need_grad:
        # scale * (h/t - h) in the background, -scale * u at the ids (0 below the floor)
        grad = h.mul_(-scale).addcdiv_(h, t, value=-1.0)
        grad.scatter_(1, idx, val_t.mul(-scale).masked_fill_(below, 0.0))
    del h
    half = torch.full((c,), 0.5, dtype=x.dtype)
    values = torch.addcdiv(half, half, t, out=t).log_()  # b = log(1/2 + 1/(2t))
    total = values.scatter_(1, idx, val_t).sum()
    if not math.isfinite(total.item()):
        return None
    if reduction == "mean":
        total = total.mul_(scale)
    return total, grad


_HALF = {torch.float32: torch.tensor(0.5, dtype=torch.float32)}
_ONE = {torch.float32: torch.tensor(1.0, dtype=torch.float32)}


def _gol_native(fn: str, input: Tensor, target: Tensor, eps: float, weight: Optional[Tensor], ignore_index: int,
                reduction: str) -> Optional[Tensor]:
    """GOL through the CPU kernel where it applies (float32 ``(N, C)`` logits, class ids, a mean or
    sum, ``(C,)`` or no weights, eagerly), else ``None``; the checks are the PyTorch path's."""
    if (input.dim() != 2 or input.device.type != "cpu" or _compiling() or not rows_native.ready()
            or (weight is not None and (not isinstance(weight, Tensor) or weight.dim() != 1 or weight.requires_grad))
            or compute_dtype(input, weight) != torch.float32):
        return None
    ids, valid = integer_targets(fn, input, target, ignore_index)
    check_class_weight(fn, weight, input.shape[1])
    check_finite(fn, "input", input, allow_neg_inf=True, neg_inf_note="-inf is allowed (probability 0)")
    with no_autocast(input.device.type):
        return rows_native.run("gol", upcast(input, torch.float32), ids, reduction, weight=weight, params=(eps,),
                                   ignore_index=ignore_index, units_per_row=input.shape[1])


class _GumbelBCEFunction(torch.autograd.Function):
    """Forward computes the loss and its input gradient; backward scales that gradient in place
    (one pass, no allocation). A second backward through a retained graph recomputes it."""

    @staticmethod
    def forward(ctx, x, y, ids, valid, w, smoothing, lo, hi, reduction, grad_mode=True):  # type: ignore[override]
        # grad_mode: torch.is_grad_enabled() at the call (inside forward it is always off)
        need_grad = grad_mode and bool(ctx.needs_input_grad[0])
        with no_autocast(x.device.type), torch.no_grad():
            out, grad = _paper_forward(x, y, ids, valid, w, smoothing, lo, hi, reduction, need_grad)
        if need_grad:
            ctx.save_for_backward(x, y, ids, valid, w)
            ctx.grad = grad
            ctx.options = (smoothing, lo, hi, reduction)
        return out

    @staticmethod
    @once_differentiable("gumbel_bce_loss")
    def backward(ctx, grad_out):  # type: ignore[override]
        grad = ctx.grad
        if grad is not None:
            ctx.grad = None  # hand the buffer over to autograd
            if not (grad_out.dim() == 0 and grad_out.device.type == "cpu" and not _compiling()
                    and grad_out.item() == 1.0):
                grad = grad.mul_(grad_out)  # (loss.backward() seeds 1: nothing to scale)
        else:
            x, y, ids, valid, w = ctx.saved_tensors
            with no_autocast(x.device.type), torch.no_grad():
                _, grad = _paper_forward(x, y, ids, valid, w, *ctx.options, True)
            grad = grad * grad_out
        return grad, None, None, None, None, None, None, None, None, None


# --------------------------------------------------------------------------------------
# the loss
# --------------------------------------------------------------------------------------


def _check_clamp(fn: str, clamp: object) -> Optional[Tuple[float, float]]:
    if clamp is None:
        return None
    ok = isinstance(clamp, (tuple, list)) and len(clamp) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in clamp)
    if ok:
        lo, hi = float(clamp[0]), float(clamp[1])
        ok = not (math.isnan(lo) or math.isnan(hi)) and lo < hi and lo != math.inf and hi != -math.inf
    if not ok:
        raise value_error(fn, "clamp must be a pair (lo, hi) of numbers with lo < hi", repr(clamp),
                          "pass e.g. (-4.0, 10.0), or (-inf, inf) to disable the clamp")
    return lo, hi


def gumbel_bce_loss(
    input: Tensor,
    target: Tensor,
    *,
    label_smoothing: float = 0.0,
    variant: str = "paper",
    clamp: Optional[Tuple[float, float]] = None,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""GOL: element-wise binary cross-entropy through the Gumbel CDF ``eta(q) = exp(-exp(-q))``.

    With ``q = input`` (logits, classes on dim 1), ``u = exp(-q)`` and targets ``y`` in [0, 1]::

        l = -y log eta(q) - (1 - y) log(1 - eta(q)) = y u - (1 - y) log(1 - exp(-u))

    evaluated in log space: ``log eta = -u`` and ``log(1 - eta) = log(-expm1(-u))`` (``= -q - u/2``
    for large ``q``). ``q`` is floored at -50 before exponentiating (zero gradient below).
    Gradients: ``dl/dq = -y u + (1 - y) u eta / (1 - eta)``, i.e. ``-exp(-q)`` for ``y = 1`` and
    ``-> 1`` for ``y = 0`` as ``q -> inf``.

    Numerics of the ``"paper"`` variant: ``expm1``/``log1p`` are not vectorised on CPU, so the
    same quantities are computed from ``h = u/2`` and ``t = tanh(h)``: ``1 - eta = 2t/(1 + t)``,
    ``-log(1 - eta) = log(1/2 + 1/(2t))`` and ``u eta/(1 - eta) = h/t - h``; above ``q = 85``
    (float32) / ``700`` (float64) the exact large-``q`` forms are used. Values are accurate to a
    few ulp of ``max(l, 1)``, gradients to a few ulp of ``u`` (relative accuracy degrades only
    where the ``y = 0`` gradient is below ~1e-3, i.e. ``q < -2``). Float64 does not use these
    forms: it evaluates ``-log(1 - eta)`` with ``expm1`` / ``log1p`` (whichever is exact at that
    ``eta``) and ``u / expm1(u)`` directly, exact to ~1e-15 relative at every ``q`` (values down to
    the smallest float64, e.g. ``6.2e-176`` at ``q = -6``). A custom autograd function
    computes value and gradient in one forward sweep (two buffers, in place) and its backward
    is a single in-place scaling; it does not support double backward.

    Paper: K. P. Alexandridis, J. Deng, A. Nguyen, S. Luo, *Long-tailed Instance Segmentation
    using Gumbel Optimized Loss*, ECCV 2022, arXiv:2207.10936.

    Args:
        input: logits ``(N, C)`` or ``(N, C, d1..dk)``, or ``()`` / ``(N,)`` (one logit per element,
            with float labels of the same shape; each element is one channel, ``C = 1``, as for
            ``(N, 1)``; class ids then raise ``TypeError``), any floating dtype (computed in float32, or
            float64 if an input is float64; never under autocast: inside ``torch.autocast`` the
            forward and backward still run in float32). **-inf** means probability 0; GOL is a
            per-class sigmoid-like loss, so nothing is removed: ``-inf`` is evaluated at the
            -50 floor (``eta ~ 0``), i.e. an element with label 0 costs 0, one with label ``y``
            costs ``y e^50`` (about ``5.2e21 y``), and the gradient there is 0. NaN and
            ``+inf`` raise ``ValueError`` (data check). Ignored rows are zeroed before the maths
            (exactly zero gradients even when they hold ``+-inf``, validation off).
        target: integer ids ``(N,)`` / ``(N, d1..dk)`` (one-hot encoded over dim 1; a position
            whose id is ``ignore_index`` drops its whole row of ``C`` elements) or float labels in
            [0, 1] shaped like ``input`` (soft / multi-hot; ``ignore_index`` does not apply).
            Background is an ordinary channel (the reference uses ``C + 1`` channels, background
            last).
        label_smoothing: ``eps`` in [0, 1): ``y <- y (1 - eps) + eps / C``.
        variant: ``"paper"`` (default): log-space evaluation, no clamp. ``"reference"``: as the
            authors' code: ``q`` clamped to [-4, 10] (zero gradient outside), ``eta`` in probability
            space through :func:`torch.nn.functional.binary_cross_entropy` (log terms clamped at
            -100; its backward divides by ``max(eta (1 - eta), 1e-12)``), and the result after
            reduction (element-wise for ``"none"``) clamped to [0, 20]. Consequence: for ``y = 1``
            and ``q`` in (-4, ~-3.32) the reference's gradient is ``eta / 1e-12`` times the
            analytic ``-exp(-q)`` (x1/240 at ``q = -3.5``, ~2e-12 at ``q = -4``), effectively zero
            below ``q ~ -3.6``. In float64 both variants agree to 1e-6 for ``q`` in [-2.9, 10] while
            the reduced value stays <= 20.
        clamp: ``(lo, hi)`` overrides the logit clamp of either variant (zero gradient outside);
            ``(-inf, inf)`` disables it. The -50 floor always applies.
        weight: ``(C,)`` class weights or a tensor shaped like ``input`` (e.g. DropLoss weights),
            finite and non-negative (``(C,)`` weights not all zero; data checks); it scales the values; the unit weight stays 1 (as in
            :func:`torch.nn.functional.binary_cross_entropy_with_logits`). The reference ignores its
            class weights; that is not reproduced.
        ignore_index: id whose rows are ignored (integer targets only).
        reduction: ``"none"`` gives the input's shape; ``"mean"`` divides the sum by the number of
            non-ignored elements; ``"sum"``.

    Unit: the element (weight 1, 0 in ignored rows). Defaults follow the paper; the detection
    recipe additionally needs DropLoss, repeat-factor sampling, a normalised mask head and a
    classifier bias of -2 (``eta_0 ~ 6.2e-4``, see :func:`gumbel_prior_bias`).

    >>> import torch, losses
    >>> x = torch.tensor([[0.0, 1.0, -1.0]])
    >>> round(float(losses.gumbel_bce_loss(x, torch.tensor([0]), reduction="sum")), 4)  # 1 + 1.1783 + 0.0683
    2.2466
    """
    fn = "gumbel_bce_loss"
    check_floating(fn, "input", input)
    check_tensor(fn, "target", target)
    check_reduction(fn, reduction)
    check_choice(fn, "variant", variant, _VARIANTS)
    smoothing = check_number(fn, "label_smoothing", label_smoothing, low=0.0, high=1.0, high_inclusive=False)
    clamp_ = _check_clamp(fn, clamp)
    if input.dim() < 2:  # one logit per element: one channel, C = 1
        x, t, w = one_channel(fn, input, target, weight)
        out = gumbel_bce_loss(x, t, label_smoothing=smoothing, variant=variant, clamp=clamp, weight=w,
                              reduction=reduction)
        return out.reshape(input.shape) if reduction == "none" else out
    check_logits_dim(fn, input, target)
    if target.dtype == torch.bool or target.is_complex():
        raise type_error(fn, "target must hold integer class ids or float labels in [0, 1]", str(target.dtype),
                         "pass target.float() for multi-hot labels")
    dtype = compute_dtype(input, weight, target if target.is_floating_point() else None)
    if (variant == "paper" and clamp_ is None and reduction != "none" and not target.is_floating_point()
            and (weight is None or (isinstance(weight, Tensor) and weight.dim() == 1))
            and dtype == torch.float32 and kernels.use_triton(input)):  # one fused row kernel (losses/kernels/)
        return binary_kernel(fn, "gol", input, target, smoothing, weight, ignore_index, reduction)
    if variant == "paper" and clamp_ is None and reduction != "none" and not target.is_floating_point():
        done = _gol_native(fn, input, target, smoothing, weight, ignore_index, reduction)
        if done is not None:  # the CPU kernel (losses/kernels/rows_native.py)
            return done
    if variant == "reference" or target.is_floating_point():
        y, unit = elementwise_targets(fn, input, target, label_smoothing=smoothing, ignore_index=ignore_index,
                                      dtype=dtype)
        ids = valid = None
    else:
        y = unit = None
        ids, valid = integer_targets(fn, input, target, ignore_index)
    w = broadcast_class_weight(fn, weight, input, dtype)
    # -inf: probability 0 (the -50 floor)
    finite = check_finite(fn, "input", input, allow_neg_inf=True, neg_inf_note="-inf is allowed (probability 0)")
    x = upcast(input, dtype)
    # ignored rows are zeroed unless a data check just verified that every logit is finite
    # (or, on CPU outside torch.compile, no row is ignored: the zeroing is then an identity)
    if (valid is not None and x.device.type == "cpu" and not _compiling()
            and (valid.numel() == 0 or bool(valid.all()))):
        valid = None  # every id is valid (None selects the fast path of _paper_forward)
    elif not finite and valid is not None:
        x = torch.where(valid.unsqueeze(1), x, torch.zeros((), dtype=dtype, device=x.device))
    elif not finite and unit is not None and not target.is_floating_point():
        x = torch.where(unit > 0, x, torch.zeros((), dtype=dtype, device=x.device))

    if variant == "reference":
        lo, hi = clamp_ if clamp_ is not None else _REFERENCE_CLAMP
        with no_autocast(x.device.type):
            q = x.clamp(lo, hi)
            if lo < _FLOOR:
                q = q.clamp(min=_FLOOR)
            eta = torch.exp(-torch.exp(-q))
            values = F.binary_cross_entropy(eta, y, reduction="none")
            if w is not None:
                values = values * w
            out = reduce_loss(values, unit, reduction)
            return out.clamp(*_REFERENCE_RESULT_RANGE)

    lo, hi = clamp_ if clamp_ is not None else (-math.inf, math.inf)
    if w is not None and w.requires_grad:
        # differentiable weights: let autograd multiply them in
        values = _GumbelBCEFunction.apply(x, y, ids, valid, None, smoothing, lo, hi, "none")
        if unit is None:
            unit = (torch.ones_like(x) if valid is None else valid.unsqueeze(1).expand_as(x).to(dtype))
        return reduce_loss(values * w, unit, reduction)
    return _GumbelBCEFunction.apply(x, y, ids, valid, None if w is None else w.detach(), smoothing, lo, hi,
                                    reduction, torch.is_grad_enabled())


class GumbelBCELoss(nn.Module):
    """Gumbel (GOL) binary cross-entropy as a module (arXiv:2207.10936); the maths is
    :func:`losses.gumbel_bce_loss`. Alias ``GOLLoss``; registry name ``"gol"``.

    Args:
        label_smoothing: ``eps`` in ``[0, 1)``: ``y <- y (1 - eps) + eps / C`` (default 0.0).
        variant: ``"paper"`` (default, log-space, no clamp) or ``"reference"`` (the authors' code).
        clamp: optional ``(lo, hi)`` logit clamp overriding the variant's (default None).
        weight: optional ``(C,)`` class weights or weights shaped like ``input``, stored as the
            buffer ``weight`` (default None).
        ignore_index: target id whose whole row of ``C`` elements is skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    ``forward(input, target)``: ``input (N, C)`` or ``(N, C, d1..dk)`` logits, ``target`` ids
    ``(N,)`` / ``(N, d1..dk)`` (one-hot over dim 1) or float labels in ``[0, 1]`` shaped like
    ``input`` (also for ``input`` ``()`` / ``(N,)``, one logit per element). Returns a scalar for
    ``"mean"``/``"sum"``, the input's shape for ``"none"``.

    Buffers: ``weight`` (or None).

    >>> import torch, losses
    >>> loss = losses.GumbelBCELoss(label_smoothing=0.1)
    >>> float(loss(torch.zeros(2, 3), torch.tensor([0, 2]))) > 0
    True
    """

    def __init__(
        self,
        *,
        label_smoothing: float = 0.0,
        variant: str = "paper",
        clamp: Optional[Tuple[float, float]] = None,
        weight: Optional[Tensor] = None,
        ignore_index: int = -100,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        fn = "GumbelBCELoss"
        check_reduction(fn, reduction)
        check_choice(fn, "variant", variant, _VARIANTS)
        self.label_smoothing = check_number(fn, "label_smoothing", label_smoothing, low=0.0, high=1.0,
                                            high_inclusive=False)
        self.variant = variant
        self.clamp = _check_clamp(fn, clamp)
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction
        self.register_buffer("weight", None if weight is None else torch.as_tensor(weight))

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The GOL loss of ``input`` against ``target``.

        Args:
            input: logits ``(N, C)`` or ``(N, C, d1..dk)``.
            target: class ids ``(N,)`` / ``(N, d1..dk)``, or float labels shaped like ``input``.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-element losses ``(N, C, d1..dk)`` (``"none"``).
        """
        return gumbel_bce_loss(input, target, label_smoothing=self.label_smoothing, variant=self.variant,
                               clamp=self.clamp, weight=self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction)

    extra_repr = auto_extra_repr


GOLLoss = GumbelBCELoss


register(
    "gol",
    function=gumbel_bce_loss,
    module=GumbelBCELoss,
    inputs="logits",
    unit="element",
    unit_weights=element_unit_weights,
    arxiv="2207.10936",
    paper="Alexandridis et al., Long-tailed Instance Segmentation using Gumbel Optimized Loss, ECCV 2022",
    dense_targets=True,
    class_weight=True,
    tensor_args=("weight",),
)
