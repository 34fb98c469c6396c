"""Precision helpers shared by the losses: exact softplus and an autocast-proof matmul.

* :func:`softplus` is ``max(x, 0) + log1p(exp(-|x|))`` (``docs/conventions.md``, Numerics),
  evaluated as ``logaddexp(x, 0)``. Unlike ``torch.nn.functional.softplus`` it has no linear
  cut-off above ``threshold=20`` (which costs up to ``exp(-20) ~ 2e-9`` absolute in float64),
  and its gradient is ``sigmoid(x)`` everywhere, ``1/2`` at 0 included.
* :func:`matmul` is ``a @ b`` for 2-D tensors whose backward also runs with autocast off: the
  backward of a plain ``@`` re-enters autocast when ``loss.backward()`` is called inside an
  autocast region and would then compute the gradients in bfloat16/float16.

The autocast guard itself is :func:`losses._core.no_autocast`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._core import no_autocast

__all__ = ["softplus", "matmul"]


def softplus(x: Tensor) -> Tensor:
    """``log(1 + e^x) = max(x, 0) + log1p(e^{-|x|})``, exact in every dtype (no cut-off)."""
    return torch.logaddexp(x, torch.zeros((), dtype=x.dtype, device=x.device))


class _MatMul(torch.autograd.Function):
    """``a @ b`` (2-D) computed, forward and backward, with autocast off."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(a, b)
        with no_autocast(a, b):
            return a @ b

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        a, b = ctx.saved_tensors
        with no_autocast(grad):
            ga = grad @ b.mT if ctx.needs_input_grad[0] else None
            gb = a.mT @ grad if ctx.needs_input_grad[1] else None
        return ga, gb


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for 2-D ``a``, ``b`` of one dtype, in that dtype even inside ``torch.autocast``
    (forward and backward; twice differentiable)."""
    return _MatMul.apply(a, b)
