"""Precision helpers shared by the losses: exact softplus and the autocast guard.

* :func:`softplus` is ``max(x, 0) + log1p(exp(-|x|))`` (``docs/conventions.md``, Numerics),
  evaluated as ``logaddexp(x, 0)``. Unlike ``torch.nn.functional.softplus`` it has no linear
  cut-off above ``threshold=20`` (which costs up to ``exp(-20) ~ 2e-9`` absolute in float64),
  and its gradient is ``sigmoid(x)`` everywhere, ``1/2`` at 0 included.
* :func:`matmul` is ``a @ b`` for 2-D tensors whose backward also runs with autocast off: the
  backward of a plain ``@`` re-enters autocast when ``loss.backward()`` is called inside an
  autocast region and would then compute the gradients in bfloat16/float16.
* :func:`no_autocast` switches ``torch.autocast`` off for the device of the given tensors, so that
  a loss called inside an autocast region runs its maths in float32 (or float64) as the
  docstrings state, as ``F.cross_entropy`` does under autocast: the inputs keep their dtypes,
  the loss upcasts them itself, and autograd returns each input's gradient in its own dtype.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["softplus", "no_autocast", "matmul"]


def softplus(x: Tensor) -> Tensor:
    """``log(1 + e^x) = max(x, 0) + log1p(e^{-|x|})``, exact in every dtype (no cut-off)."""
    return torch.logaddexp(x, torch.zeros((), dtype=x.dtype, device=x.device))


def no_autocast(*tensors: Optional[Tensor]) -> torch.autocast:
    """``torch.autocast(enabled=False)`` for the device type of the first tensor (CPU if none);
    a plain context manager, so ``torch.compile(fullgraph=True)`` traces through it."""
    dev = next((t.device.type for t in tensors if isinstance(t, Tensor)), "cpu")
    return torch.autocast(device_type=dev, enabled=False)


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
