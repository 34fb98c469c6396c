"""Value-and-gradient comparison of a loss against its float64 oracle, and a gradcheck wrapper.

The per-family tests compare the library's value *and* its gradient with an independent float64
computation written from the formula (the oracle is differentiated by autograd through its
loops): :func:`value_and_grads` evaluates either side on fresh leaves, :func:`assert_value_and_grad`
compares two graph-attached outputs and their gradients, :func:`assert_gradcheck` runs
``torch.autograd.gradcheck`` in float64.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, Tuple

import torch
from torch import Tensor


def _fresh(x: Tensor) -> Tensor:
    return x.detach().clone().requires_grad_(True)


def value_and_grads(fn: Callable[..., Any], leaves: Sequence[Tensor], *args: Any, weights: Any = None,
                    **kwargs: Any) -> Tuple[Tensor, ...]:
    """``fn(*leaves, *args, **kwargs)`` on fresh copies of ``leaves``; returns the detached value
    followed by the gradients of ``Σ weights · value`` (``weights`` default: ones) with respect to
    each leaf. A tuple output (a loss that returns extra statistics) is compared by its first
    element."""
    fresh = [_fresh(x) for x in leaves]
    out = fn(*fresh, *args, **kwargs)
    if isinstance(out, tuple):
        out = out[0]
    w = torch.ones_like(out) if weights is None else weights
    grads = torch.autograd.grad((out * w).sum(), fresh)
    return (out.detach(),) + tuple(grads)


def value_and_grad(fn: Callable[..., Any], x: Tensor, *args: Any, weights: Any = None,
                   **kwargs: Any) -> Tuple[Tensor, Tensor]:
    """:func:`value_and_grads` with one leaf, the first argument: ``(value, d(Σ w·value)/dx)``."""
    out, g = value_and_grads(fn, (x,), *args, weights=weights, **kwargs)
    return out, g


def assert_value_and_grad(got: Tensor, expected: Tensor, leaves: Sequence[Tensor], rtol: float = 1e-10,
                          atol: float = 1e-12) -> None:
    """``got == expected`` and their gradients (of the sum) with respect to ``leaves`` agree, a
    ``None`` gradient counting as zeros."""
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol)
    g1 = torch.autograd.grad(got.sum(), leaves, allow_unused=True)
    g2 = torch.autograd.grad(expected.sum(), leaves, allow_unused=True)
    for a, b, leaf in zip(g1, g2, leaves):
        a = torch.zeros_like(leaf) if a is None else a
        b = torch.zeros_like(leaf) if b is None else b
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def assert_gradcheck(fn: Callable[..., Tensor], *inputs: Tensor, **kwargs: Any) -> None:
    """``torch.autograd.gradcheck(fn, inputs)`` (float64 leaves, default tolerances unless given)."""
    assert torch.autograd.gradcheck(fn, tuple(inputs), **kwargs)
