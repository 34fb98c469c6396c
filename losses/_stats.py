"""The statistics a loss can return from the pass that computes it (``return_stats=True``)."""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

__all__ = ["LossStats", "token_stats"]


class LossStats(NamedTuple):
    """A loss and what a language-model (or many-class) training loop logs next to it, from the
    same pass over the logits: nothing is recomputed.

    Fields:
        loss: the loss, reduced as asked (differentiable).
        lse: ``log Z = logsumexp_k z_k`` per row ``(N,)``, float32 or wider, detached; 0 on
            ignored rows (soft-capped logits when ``softcap`` is set).
        penalty: the log-Z penalty part ``logz_coef * (log Z)^2`` of the loss, reduced like the
            loss (already included in it; 0 when ``logz_coef == 0``), detached.
        accuracy: the share of non-ignored rows whose largest logit is the target (ties: the
            first largest class), a detached scalar; 0 when every row is ignored.
        count: the number of non-ignored rows (an integer tensor), e.g. to weight ``accuracy``
            over micro-batches.
    """

    loss: Tensor
    lse: Tensor
    penalty: Tensor
    accuracy: Tensor
    count: Tensor


def token_stats(loss: Tensor, lse: Tensor, penalty: Tensor, pred: Tensor, target: Tensor,
                valid: Tensor, shape: Optional[Tuple[int, ...]] = None) -> LossStats:
    """Assemble :class:`LossStats` from per-row ``lse``, the reduced ``penalty``, the per-row
    predicted class ``pred`` and the ``valid`` mask (all of one flat batch of rows); ``shape``: the
    positions' shape the per-row ``lse`` is returned in (N-D inputs)."""
    count = valid.sum()
    hits = ((pred == target) & valid).sum().to(torch.float32)
    accuracy = hits / torch.clamp(count, min=1).to(torch.float32)
    zero = torch.zeros((), dtype=lse.dtype, device=lse.device)
    lse = torch.where(valid, lse, zero).detach()
    return LossStats(loss, lse if shape is None else lse.reshape(shape), penalty.detach(), accuracy.detach(), count)
