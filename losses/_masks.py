"""``-inf`` as "this candidate does not exist" (``docs/conventions.md``, masks).

The candidate losses (decoupled softmax, InfoNCE, soft top-k) and the sampled-negative losses
(PSL, sampled softmax, BPR) accept ``-inf`` scores with data checks on: a ``-inf`` entry is a
candidate (negative) that is not there, exactly as a mask. NaN and ``+inf`` are still rejected.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._core import _checking, value_error

__all__ = ["check_finite_or_masked"]


def check_finite_or_masked(fn: str, name: str, x: Tensor) -> None:
    """Data check: NaN or ``+inf`` in ``x`` raise ``ValueError``; ``-inf`` (a mask) passes."""
    if not _checking() or not x.is_floating_point() or x.numel() == 0:
        return
    # one-pass screen: the sum is finite unless some entry is non-finite (or it overflows)
    if bool(torch.isfinite(x.detach().sum(dtype=torch.float64 if x.dtype == torch.float64 else torch.float32))):
        return
    n_nan = int(torch.isnan(x).sum())
    n_pinf = int((x == math.inf).sum())
    if n_nan or n_pinf:
        parts = ([f"{n_nan} NaN"] if n_nan else []) + ([f"{n_pinf} +inf"] if n_pinf else [])
        raise value_error(fn, f"{name} contains NaN or infinite values", ", ".join(parts),
                          "check the model output for overflow or divergence; -inf is allowed and marks a "
                          "candidate that does not exist")
