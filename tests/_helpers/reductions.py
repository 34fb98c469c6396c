"""Reference reductions for the loop oracles: ``"none"``, ``"mean"`` and ``"sum"`` computed from
per-unit values and unit weights ``w`` the way docs/conventions.md states them
(``"sum" == Σ w·none``, ``"mean" == Σ w·none / Σ w``, an all-zero ``w`` gives a graph-attached 0).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor


def loop_reduce(values: Sequence[Tensor], weights: Sequence[float], shape: Tuple[int, ...], reduction: str,
                *, mean_weights: Optional[Sequence[float]] = None) -> Tensor:
    """Reduce a Python list of 0-d float64 unit values (one per position, in output order) with
    their weights, summing in list order.

    ``mean_weights`` (default: ``weights``) is the ``"mean"`` denominator where it differs from the
    weights of the sum (cross-entropy with class weights: the values carry ``w_y`` already, the
    mean divides by ``Σ w_y``)."""
    if reduction == "none":
        return torch.stack(list(values)).reshape(shape) if len(values) else torch.zeros(shape, dtype=torch.float64)
    total = sum((w * v for v, w in zip(values, weights)), torch.zeros((), dtype=torch.float64))
    if reduction == "sum":
        return total
    denominator = sum(weights if mean_weights is None else mean_weights)
    return total / denominator if denominator > 0 else total * 0


def weighted_reduce(values: Tensor, weights: Tensor, reduction: str) -> Tensor:
    """Reduce a tensor of unit values with a tensor of unit weights of the same shape."""
    if reduction == "none":
        return values
    total = (weights * values).sum()
    if reduction == "sum":
        return total
    return total / weights.sum() if float(weights.sum()) > 0 else (values * 0).sum()
