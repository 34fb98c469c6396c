"""The comp-sum kernel shared by the comp-sum loss (``comp_sum.py``) and the smooth adversarial
comp-sum loss (``adversarial.py``): the per-row value ``Phi^tau(1/p_y - 1)`` and its log-space
backward (docs/losses/comp_sum.md).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from .._core import _compiling, once_differentiable
from ._targets import finite_row_max, reduced_sum, row_exp, row_max_exp, row_max_logsum

__all__ = ["CompSumFunction"]


def _grad(x: Tensor, y: Tensor, m: Tensor, log_s: Tensor, r: Tensor, log_g, tau_below_one: bool) -> Tensor:
    """``|g| p_y^(tau-1) (p - e_y)`` per row (the sign of ``g`` is applied by the caller), with
    ``log|g|`` a tensor or a number folded into the exponent."""
    k = (r - log_s) + log_g
    grad = torch.sub(x, (m - k).unsqueeze(1)).exp_()  # |g| exp(r + lp_j): two passes
    if tau_below_one:  # only then can r (and k) be +inf
        grad.masked_fill_(x == float("-inf"), 0.0)  # masks: exp(-inf + inf) is NaN, the answer 0
    idx = y.unsqueeze(1)
    grad.scatter_(1, idx, 0.0)
    others = grad.sum(dim=1, keepdim=True)  # |g| exp(r + logsumexp_{j != y} lp_j)
    return grad.scatter_(1, idx, -others)


def _target_mask(x: Tensor, y: Tensor) -> Tensor:
    """``(M, C)`` bool, True at each row's target column: a broadcast comparison, which a compiler
    fuses into the pass that reads it (no scatter, no materialised one-hot)."""
    return torch.arange(x.shape[1], device=x.device).unsqueeze(0) == y.unsqueeze(1)


def _others_mass(x: Tensor, y: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(m, log_s, log_so, ce)`` from one reduction over the logits that skips the target: the row max
    ``m``, ``log_so = log sum_{k != y} exp(x_k - m)`` (the non-target mass, summed without the
    target term), then ``log_s = log sum_k exp(x_k - m) = logaddexp(x_y - m, log_so)`` and
    ``ce = -log p_y = log(1 + u) = softplus(log u)`` with ``log u = log_so + m - x_y``, precise as
    ``p_y -> 1`` too. Used under ``torch.compile``: the forward's value needs the non-target mass,
    so the compiler computes it there, in the reduction that cross-entropy's forward also makes, and
    the backward (:func:`_grad_from_others`) is one element-wise pass with no reduction of its own
    (with ``log_s`` alone the compiler puts a second exponential reduction into the backward)."""
    m = finite_row_max(x)
    xo = torch.where(_target_mask(x, y), float("-inf"), x)
    log_so = torch.exp(xo - m.unsqueeze(1)).sum(dim=1).log()
    x_y = x.gather(1, y.unsqueeze(1)).squeeze(1)
    log_s = torch.logaddexp(x_y - m, log_so)
    ce = torch.nn.functional.softplus(log_so + (m - x_y))
    return m, log_s, log_so, ce


def _grad_from_others(x: Tensor, y: Tensor, m: Tensor, log_s: Tensor, log_so: Tensor, r: Tensor, log_g,
                      tau_below_one: bool) -> Tensor:
    """:func:`_grad` with the non-target mass ``log_so`` taken from the forward: one element-wise
    pass (``exp(x_j - m + k)`` off the target, ``-exp(k + log_so)`` at it), no reduction."""
    k = (r - log_s) + log_g
    grad = torch.exp(x - (m - k).unsqueeze(1))
    if tau_below_one:
        grad = torch.where(x == float("-inf"), torch.zeros((), dtype=grad.dtype, device=grad.device), grad)
    others = torch.exp(k + log_so).unsqueeze(1)
    return torch.where(_target_mask(x, y), -others, grad)


def _seed_grad(x: Tensor, y: Tensor, m: Tensor, log_s: Tensor, r: Tensor, divisor: int, tau_below_one: bool,
               tau_one: bool, e: Optional[Tensor] = None, s_sum: Optional[Tensor] = None) -> Tensor:
    """The gradient of the reduced loss for an incoming gradient of 1 (``g = 1/divisor``). At
    ``tau = 1`` (``r = 0``) it is ``(p - e_y) / divisor`` from ``E = exp(x - m)`` (the forward's
    buffer, passed as ``e`` / ``s_sum``, or rebuilt) scaled per row by ``1/(S divisor)``: one
    pass instead of the two of :func:`_grad`."""
    if tau_one:
        if e is None:
            e, s_sum = row_exp(x, m)
        assert s_sum is not None
        grad = e.mul_(s_sum.reciprocal().mul_(1.0 / divisor).unsqueeze(1))
        idx = y.unsqueeze(1)
        grad.scatter_(1, idx, 0.0)
        return grad.scatter_(1, idx, -grad.sum(dim=1, keepdim=True))
    return _grad(x, y, m, log_s, r, -math.log(divisor), tau_below_one)


class CompSumFunction(torch.autograd.Function):
    """Per-row ``Phi^tau(1/p_y - 1)`` with the log-space backward of docs/losses/comp_sum.md.

    Forward: ``ce = logsumexp(h) - h_y``; ``ce`` if ``tau == 1`` else
    ``expm1((1 - tau) ce) / (1 - tau)``. Backward, with ``r = (1 - tau) ce``:
    ``exp(r + lp_j)`` for ``j != y`` and ``-exp(r + logsumexp_{j != y} lp_j)`` at ``y``, i.e.
    ``p_y^(tau-1) (p - e_y)``. The upstream gradient is folded into the exponent as
    ``log|g|`` (so a zero upstream gradient gives exact zeros, never ``inf * 0``); entries may
    be +-inf but never NaN. The target entry is minus the sum of the others, summed without
    the target term, so it does not cancel when ``p_y -> 1``. ``-inf`` logits (masks) get an
    exact 0, also when ``r = +inf`` (a target on a masked class with ``tau < 1``), where
    ``exp(-inf + inf)`` would be NaN.
    """

    @staticmethod
    def forward(ctx, x: Tensor, y: Tensor, tau: float, divisor: Optional[int] = None,
                grad_mode: bool = True) -> Tensor:
        # grad_mode: torch.is_grad_enabled() at the call (inside forward it is always off)
        fused = (divisor is not None and grad_mode and ctx.needs_input_grad[0] and x.device.type == "cpu" and not _compiling())
        e = None
        ctx.tau_one = tau == 1.0 and x.shape[1] > 0
        log_so = None
        if fused and ctx.tau_one:
            # the exp(x - m) buffer kept: the gradient is that buffer scaled per row
            m, e, s_sum = row_max_exp(x)
            log_s = s_sum.log()
        elif _compiling():
            # traced: the non-target mass joins the forward's reduction, the backward is one pass
            m, log_s, log_so, ce = _others_mass(x, y)
        else:
            m, log_s = row_max_logsum(x)
        if log_so is None:
            x_y = x.gather(1, y.unsqueeze(1)).squeeze(1)
            ce = ((m - x_y) + log_s).clamp_min(0)
        if tau == 1.0:
            r = torch.zeros_like(ce)
            value = ce
        else:
            r = (1.0 - tau) * ce
            value = torch.expm1(r) / (1.0 - tau)
        ctx.save_for_backward(x, y, m, log_s, r, log_so)
        ctx.tau_below_one = tau < 1.0
        ctx.divisor = divisor
        ctx.grad = None
        ctx.fused = fused
        if fused:
            # reduced on CPU, eagerly: the gradient for loss.backward()'s seed of 1 is written now
            # (g = 1/divisor > 0 folded in as a number); the backward hands it over unless its
            # incoming gradient differs from 1
            ctx.grad = _seed_grad(x, y, m, log_s, r, divisor, ctx.tau_below_one, ctx.tau_one, e,
                                  s_sum if e is not None else None)
        return reduced_sum(value, divisor)

    @staticmethod
    @once_differentiable("comp_sum_loss")
    def backward(ctx, g: Tensor):
        grad = ctx.grad
        ctx.grad = None  # hand the buffer over to autograd (a second backward recomputes it)
        x, y, m, log_s, r, log_so = ctx.saved_tensors
        if ctx.fused and g.item() == 1.0:
            if grad is None:  # a second backward through a retained graph: the same arithmetic
                grad = _seed_grad(x, y, m, log_s, r, ctx.divisor, ctx.tau_below_one, ctx.tau_one)
            return grad, None, None, None, None
        if ctx.divisor is not None:  # reduced in the forward (no ignored row): one scalar gradient
            g = g / ctx.divisor
        if log_so is not None:
            grad = _grad_from_others(x, y, m, log_s, log_so, r, torch.log(g.abs()), ctx.tau_below_one)
        else:
            grad = _grad(x, y, m, log_s, r, torch.log(g.abs()), ctx.tau_below_one)  # -inf where g == 0
        if g.dim() == 0:  # one sign for every row (the fused reduction runs eagerly on CPU only)
            if not bool(g >= 0):
                grad.neg_()  # g < 0 (g == 0 left every entry 0 already)
        else:
            grad.mul_(torch.sign(g).unsqueeze(1))
        return grad, None, None, None, None
