"""The N-D input layouts the per-family tests run a loss at, the positions inside them, and the
seeded random inputs they are filled with.

A logits loss takes ``input (N, C, d1, ..., dk)`` and ``target (N, d1, ..., dk)``; one
``reduction="none"`` value belongs to each position ``(n, d1, ..., dk)``. The loop oracles walk
the positions in C order (the order of the ``"none"`` output) and read the ``C`` logits there.
"""

from __future__ import annotations

import itertools
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

#: Shapes every logits loss is checked at: ``(N, C)`` and a 2-D spatial layout ``(N, C, d1, d2)``.
LOGIT_SHAPES: List[Tuple[int, ...]] = [(5, 7), (5, 7, 3, 2)]

#: The three reductions, in the order the tests parametrize them.
REDUCTIONS: Tuple[str, ...] = ("none", "mean", "sum")


def positions(x: Tensor) -> List[Tuple[int, ...]]:
    """``(n, d1, ..., dk)`` index tuples of an ``(N, C, d1, ..., dk)`` tensor, in C order of the
    ``reduction="none"`` output."""
    return list(itertools.product(range(x.shape[0]), *[range(s) for s in x.shape[2:]]))


def logits_at(x: Tensor, pos: Sequence[int]) -> List[Tensor]:
    """The ``C`` logits of ``x (N, C, ...)`` at position ``pos = (n, d1, ..., dk)``, as 0-d tensors
    (graph-attached, so a loop oracle built from them is differentiable)."""
    n, sp = pos[0], tuple(pos[1:])
    return [x[(n, k) + sp] for k in range(x.shape[1])]


def position_shape(x: Tensor) -> Tuple[int, ...]:
    """The ``reduction="none"`` shape ``(N, d1, ..., dk)`` of an ``(N, C, d1, ..., dk)`` input."""
    return (x.shape[0],) + tuple(x.shape[2:])


def logits_and_ids(shape: Sequence[int], seed: int, *, scale: float = 1.0, ignore_at: Optional[int] = None,
                   ignore_index: int = -100, dtype: torch.dtype = torch.float64) -> Tuple[Tensor, Tensor]:
    """Random logits ``(N, C, ...)`` (float64 normal times ``scale``, then cast to ``dtype``) and
    class ids ``(N, ...)`` drawn from one generator seeded with ``seed``; the id at flat index
    ``ignore_at`` (if given) is ``ignore_index``."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tuple(shape), generator=g, dtype=torch.float64) * scale).to(dtype)
    t = torch.randint(0, shape[1], (shape[0],) + tuple(shape[2:]), generator=g)
    if ignore_at is not None:
        t.view(-1)[ignore_at] = ignore_index
    return x, t


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """Standard normal values of ``shape`` from a fresh generator seeded with ``seed``."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
