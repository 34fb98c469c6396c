"""The comp-sum kernel shared by the comp-sum loss (``comp_sum.py``) and the smooth adversarial
comp-sum loss (``adversarial.py``): the per-row value ``Phi^tau(1/p_y - 1)`` and its log-space
backward (docs/losses/comp_sum.md).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._core import once_differentiable
from ._targets import reduced_sum, row_max_logsum

__all__ = ["CompSumFunction"]


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
    def forward(ctx, x: Tensor, y: Tensor, tau: float, divisor: Optional[int] = None) -> Tensor:
        m, log_s = row_max_logsum(x)
        x_y = x.gather(1, y.unsqueeze(1)).squeeze(1)
        ce = ((m - x_y) + log_s).clamp_min(0)
        if tau == 1.0:
            r = torch.zeros_like(ce)
            value = ce
        else:
            r = (1.0 - tau) * ce
            value = torch.expm1(r) / (1.0 - tau)
        ctx.save_for_backward(x, y, m, log_s, r)
        ctx.tau_below_one = tau < 1.0
        ctx.divisor = divisor
        return reduced_sum(value, divisor)

    @staticmethod
    @once_differentiable("comp_sum_loss")
    def backward(ctx, g: Tensor):
        x, y, m, log_s, r = ctx.saved_tensors
        if ctx.divisor is not None:  # reduced in the forward (no ignored row): one scalar gradient
            g = g / ctx.divisor
        k = (r - log_s) + torch.log(g.abs())  # -inf where g == 0
        grad = torch.sub(x, (m - k).unsqueeze(1)).exp_()  # |g| exp(r + lp_j): two passes
        if ctx.tau_below_one:  # only then can r (and k) be +inf
            grad.masked_fill_(x == float("-inf"), 0.0)  # masks: exp(-inf + inf) is NaN, the answer 0
        idx = y.unsqueeze(1)
        grad.scatter_(1, idx, 0.0)
        others = grad.sum(dim=1, keepdim=True)  # |g| exp(r + logsumexp_{j != y} lp_j)
        grad.scatter_(1, idx, -others)
        if g.dim() == 0:  # one sign for every row (the fused reduction runs eagerly on CPU only)
            if not bool(g >= 0):
                grad.neg_()  # g < 0 (g == 0 left every entry 0 already)
        else:
            grad.mul_(torch.sign(g).unsqueeze(1))
        return grad, None, None, None
