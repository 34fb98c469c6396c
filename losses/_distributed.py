"""Distributed helpers shared by the losses (docs/conventions.md "Distributed").

Functional forms are single-process. Modules with ``gather_distributed=True`` all-gather their
batch with :func:`all_gather_with_grad`, whose backward *sums* the incoming gradients over
ranks and returns this rank's slice. With the loss computed identically on every rank over the
global batch, each rank's input therefore receives ``world_size`` x its single-process
gradient, which DDP's ``1/world_size`` averaging of the backbone turns back into the
single-process step (docs/conventions.md, distributed (d)).

Everything works without an initialised process group (then it is the identity), on gloo (CPU)
and NCCL (GPU).
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "is_distributed",
    "world_size",
    "rank",
    "all_gather_with_grad",
    "all_gather_no_grad",
    "all_reduce_with_grad",
    "check_equal_batch_sizes",
]


def is_distributed(group: Optional[object] = None) -> bool:
    """True when a process group is initialised with more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def world_size(group: Optional[object] = None) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def rank(group: Optional[object] = None) -> int:
    return dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0


def check_equal_batch_sizes(fn: str, n: int, group: Optional[object] = None, *, device=None) -> None:
    """Unequal per-rank batch sizes raise ValueError on every rank (one small all-gather)."""
    if not is_distributed(group):
        return
    t = torch.tensor([n], dtype=torch.long, device=device)
    sizes = [torch.zeros_like(t) for _ in range(world_size(group))]
    dist.all_gather(sizes, t, group=group)
    sizes_l = [int(s) for s in sizes]
    if len(set(sizes_l)) != 1:
        raise ValueError(
            f"{fn}: every rank must pass the same batch size (got {sizes_l}); "
            "use drop_last=True in the DataLoader or pad the last batch"
        )


class _AllGatherSumBackward(torch.autograd.Function):
    """Concatenate every rank's ``x`` along dim 0; backward all-reduces (sums) the gradient of
    the gathered tensor over ranks and returns this rank's slice (a reduce-scatter written with
    all-reduce, which every backend, gloo included, supports)."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Optional[object]) -> Tensor:  # noqa: D102
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        ctx.n = x.shape[0]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: D102
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad.narrow(0, ctx.rank * ctx.n, ctx.n), None


class _AllReduceSum(torch.autograd.Function):
    """Sum over ranks; the gradient of every rank's input is the sum of the incoming gradients."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Optional[object]) -> Tensor:  # noqa: D102
        ctx.group = group
        y = x.detach().clone()
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=group)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: D102
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None


def all_gather_with_grad(x: Tensor, group: Optional[object] = None, *, fn: str = "all_gather") -> Tensor:
    """Concatenate ``x`` from every rank along dim 0; backward sums gradients over ranks.

    Without an initialised multi-rank process group this returns ``x`` unchanged.
    """
    if not is_distributed(group):
        return x
    check_equal_batch_sizes(fn, x.shape[0], group, device=x.device)
    return _AllGatherSumBackward.apply(x, group)


def all_gather_no_grad(x: Tensor, group: Optional[object] = None, *, fn: str = "all_gather") -> Tensor:
    """Concatenate ``x`` (e.g. labels) from every rank along dim 0, without gradient."""
    if not is_distributed(group):
        return x
    check_equal_batch_sizes(fn, x.shape[0], group, device=x.device)
    parts: List[Tensor] = [torch.empty_like(x) for _ in range(world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=0)


def all_reduce_with_grad(x: Tensor, op: str = "sum", group: Optional[object] = None) -> Tensor:
    """All-reduce (``"sum"`` with a gradient that is all-reduced too; ``"max"`` without gradient)."""
    if not is_distributed(group):
        return x
    if op == "sum":
        return _AllReduceSum.apply(x, group)
    if op == "max":
        y = x.detach().clone()
        dist.all_reduce(y, op=dist.ReduceOp.MAX, group=group)
        return y
    raise ValueError(f"all_reduce_with_grad: op must be 'sum' or 'max' (got {op!r}); pick one of them")
