"""Optimisers for modules whose loss gives some parameters a sparse gradient.

A loss that owns class centres can return their gradient as a sparse tensor holding only the rows
it used (``PartialFCLoss(sparse_grad=True)``: the sampled centres). Dense optimisers such as AdamW
reject sparse gradients, and Lightning's automatic optimisation takes a single optimiser, so
:func:`build_optimizer` splits the parameters: the dense ones go to the module's optimiser as
before, the sparse ones to an optimiser that updates only the rows present in the gradient, and
:class:`DenseSparseOptimizer` presents the two as one ``torch.optim.Optimizer`` (one ``step``, one
``zero_grad``, one ``state_dict``, and ``param_groups`` that a learning-rate scheduler drives for
both).

The sparse parameters' optimiser: ``torch.optim.SparseAdam`` (beside AdamW; it has no weight decay)
or ``torch.optim.SGD`` without momentum or weight decay (beside SGD). Either leaves a row that is
not in the gradient exactly where it is, which is the point of the sparse gradient: an unsampled
centre is not moved, and the update costs the sampled rows only.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch import nn

__all__ = ["DenseSparseOptimizer", "WarmupCosine", "build_optimizer", "reset_parameter_state", "resolve_total_steps",
           "sparse_gradient_parameters"]


def sparse_gradient_parameters(module: nn.Module) -> List[nn.Parameter]:
    """The parameters of every submodule with ``sparse_grad = True`` (e.g. ``PartialFCLoss``)."""
    out: Dict[int, nn.Parameter] = {}
    for sub in module.modules():
        if getattr(sub, "sparse_grad", False) is True:
            for p in sub.parameters():
                out[id(p)] = p
    return list(out.values())


class DenseSparseOptimizer(torch.optim.Optimizer):
    """Two optimisers as one: ``dense`` for parameters with dense gradients and ``sparse`` for those
    with sparse gradients.

    ``param_groups`` is the list of both optimisers' groups (the same dict objects), so a
    learning-rate scheduler built on this optimiser sets the rate of both; ``step(closure)`` calls
    the closure once, then steps both; ``state_dict()`` is ``{"dense": ..., "sparse": ...}`` and
    ``load_state_dict`` restores both (a checkpoint resumes exactly).
    """

    def __init__(self, dense: torch.optim.Optimizer, sparse: torch.optim.Optimizer) -> None:
        for name, opt in (("dense", dense), ("sparse", sparse)):
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError(f"DenseSparseOptimizer: {name} must be a torch.optim.Optimizer "
                                f"(got {type(opt).__name__})")
        self.dense, self.sparse = dense, sparse
        self._joined = False
        params = [p for g in dense.param_groups + sparse.param_groups for p in g["params"]]
        super().__init__(params, {})
        self._alias_groups()
        self._joined = True

    def _alias_groups(self) -> None:
        self.param_groups = self.dense.param_groups + self.sparse.param_groups

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.dense.step()
        self.sparse.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.dense.zero_grad(set_to_none=set_to_none)
        self.sparse.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> Dict[str, Any]:  # type: ignore[override]
        return {"dense": self.dense.state_dict(), "sparse": self.sparse.state_dict()}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:  # type: ignore[override]
        if not isinstance(state_dict, dict) or set(state_dict) != {"dense", "sparse"}:
            raise ValueError("DenseSparseOptimizer: state_dict must have the keys 'dense' and 'sparse' "
                             f"(got {sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__})")
        self.dense.load_state_dict(state_dict["dense"])
        self.sparse.load_state_dict(state_dict["sparse"])
        self._alias_groups()  # loading replaces the inner group dicts

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        if not getattr(self, "_joined", False):  # Optimizer.__init__ registering the union
            return super().add_param_group(param_group)
        raise NotImplementedError("DenseSparseOptimizer: add the group to .dense or .sparse")

    def __repr__(self) -> str:
        return f"DenseSparseOptimizer(dense={self.dense!r}, sparse={self.sparse!r})"


def reset_parameter_state(optimizer: Any, param: torch.Tensor) -> bool:
    """Forget ``param``'s optimiser state (moments, step count) so that its next update starts
    fresh; ``optimizer`` may be a Lightning ``LightningOptimizer`` wrapper and/or a
    :class:`DenseSparseOptimizer` (whose state lives in its two inner optimisers, not in its own
    ``.state``). Returns whether any state was dropped."""
    opt = getattr(optimizer, "optimizer", optimizer)
    inner = [opt.dense, opt.sparse] if isinstance(opt, DenseSparseOptimizer) else [opt]
    dropped = False
    for o in inner:
        dropped = o.state.pop(param, None) is not None or dropped
    return dropped


def build_optimizer(module: nn.Module, groups: Sequence[Dict[str, Any]], *, optimizer: str = "adamw",
                    lr: float, weight_decay: float = 0.0, momentum: float = 0.0) -> torch.optim.Optimizer:
    """The module's optimiser over ``groups`` (``[{"params": [...], ...}]``): AdamW, or SGD with
    ``momentum``; parameters with sparse gradients (:func:`sparse_gradient_parameters`) are taken out
    of their groups (keeping each group's other keys, e.g. its ``lr``) and given SparseAdam (beside
    AdamW) or plain SGD (beside SGD), the two joined in a :class:`DenseSparseOptimizer`."""
    if optimizer not in ("adamw", "sgd"):
        raise ValueError(f"build_optimizer: optimizer must be 'adamw' or 'sgd' (got {optimizer!r})")
    sparse_ids = {id(p) for p in sparse_gradient_parameters(module)}
    dense_groups, sparse_groups = [], []
    for g in groups:
        ps = list(g["params"])
        rest = {k: v for k, v in g.items() if k != "params"}
        d = [p for p in ps if id(p) not in sparse_ids]
        s = [p for p in ps if id(p) in sparse_ids]
        if d:
            dense_groups.append({**rest, "params": d})
        if s:  # the group's own rate and name carry over; the other keys are the dense optimiser's
            sparse_groups.append({"params": s, **{k: rest[k] for k in ("lr", "name") if k in rest}})

    def dense_opt(gs):
        if optimizer == "sgd":
            return torch.optim.SGD(gs, lr=lr, momentum=momentum, weight_decay=weight_decay)
        return torch.optim.AdamW(gs, lr=lr, weight_decay=weight_decay)

    if not sparse_groups:
        return dense_opt(dense_groups)
    sparse = (torch.optim.SGD(sparse_groups, lr=lr) if optimizer == "sgd"
              else torch.optim.SparseAdam(sparse_groups, lr=lr))
    if not dense_groups:
        return sparse
    return DenseSparseOptimizer(dense_opt(dense_groups), sparse)


class WarmupCosine(torch.optim.lr_scheduler.LRScheduler):
    """Linear warmup, then cosine decay, stepped once per optimiser step.

    The rate of each parameter group at step ``t`` (0-based) is ``base_lr * f(t)`` with

    * ``f(t) = (t + 1) / W`` for ``t < W`` (``W`` warmup steps; the base rate at the last one);
    * then ``f(t) = r + (1 - r) (1 + cos(pi p)) / 2`` with ``p = (t - W) / (T - W)`` clipped to
      ``[0, 1]`` and ``r = min_lr_ratio``: from the base rate down to ``r`` times it at step
      ``T = total_steps``, and there after it.

    ``W`` is ``warmup_steps``, or ``warmup_fraction * T`` rounded down when that is given (a share of
    the run, so that a shortened run keeps the shape). ``total_steps=None`` is filled in from the
    trainer (``trainer.estimated_stepping_batches``: ``max_steps`` or the epochs' optimiser steps)
    when the CLI attaches the scheduler (``lightning_modules.cli``, :func:`resolve_total_steps`),
    before the first step.

    Args:
        optimizer: the optimiser whose groups it drives.
        warmup_steps: steps of linear warmup (``>= 0``; 0: none).
        total_steps: the step at which the decay ends (more than the warmup), or ``None``.
        min_lr_ratio: the final rate as a share of the base rate, in ``[0, 1]``.
        warmup_fraction: ``None``, or the warmup as a share of ``total_steps`` in ``[0, 1)``
            (then ``warmup_steps`` must stay 0).
        last_epoch: the index of the last step taken (``-1``: a fresh start), as every torch scheduler.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int = 0, total_steps: Optional[int] = None,
                 min_lr_ratio: float = 0.0, warmup_fraction: Optional[float] = None, last_epoch: int = -1) -> None:
        for name, value in (("warmup_steps", warmup_steps), ("total_steps", total_steps)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"WarmupCosine: {name} must be an int >= 0 (got {value!r})")
        if isinstance(min_lr_ratio, bool) or not isinstance(min_lr_ratio, (int, float)) or not 0 <= min_lr_ratio <= 1:
            raise ValueError(f"WarmupCosine: min_lr_ratio must be in [0, 1] (got {min_lr_ratio!r})")
        if warmup_fraction is not None:
            if isinstance(warmup_fraction, bool) or not isinstance(warmup_fraction, (int, float)) \
                    or not 0 <= warmup_fraction < 1:
                raise ValueError(f"WarmupCosine: warmup_fraction must be in [0, 1) or None (got {warmup_fraction!r})")
            if warmup_steps:
                raise ValueError("WarmupCosine: give warmup_steps or warmup_fraction, not both "
                                 f"(got {warmup_steps} and {warmup_fraction})")
        self.warmup_steps, self.total_steps, self.min_lr_ratio = int(warmup_steps), None, float(min_lr_ratio)
        self.warmup_fraction = None if warmup_fraction is None else float(warmup_fraction)
        if total_steps is not None:
            self._set_total(total_steps)
        super().__init__(optimizer, last_epoch)

    def _set_total(self, total_steps: int) -> None:
        if self.warmup_fraction is not None:
            self.warmup_steps = int(self.warmup_fraction * total_steps)
        if total_steps <= self.warmup_steps:
            raise ValueError(f"WarmupCosine: total_steps must exceed the warmup (got {total_steps} <= "
                             f"{self.warmup_steps}); the decay needs at least one step: shorten the warmup or "
                             "train longer")
        self.total_steps = int(total_steps)

    def set_total_steps(self, total_steps: int) -> None:
        """Fix ``total_steps`` (and a fractional warmup) and set the groups' current rate from it."""
        self._set_total(total_steps)
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def factor(self, step: int) -> float:
        """``f(step)``: the share of the base rate at optimiser step ``step``."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.total_steps is None:
            return 1.0
        progress = min(1.0, max(0.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps)))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def get_lr(self) -> List[float]:  # noqa: D102
        f = self.factor(self.last_epoch)
        return [base * f for base in self.base_lrs]


def resolve_total_steps(scheduler: Any, trainer: Any) -> None:
    """A scheduler with ``total_steps=None`` and a ``set_total_steps`` method (:class:`WarmupCosine`)
    gets ``trainer.estimated_stepping_batches``."""
    if getattr(scheduler, "total_steps", 0) is None and callable(getattr(scheduler, "set_total_steps", None)) \
            and trainer is not None:
        scheduler.set_total_steps(int(trainer.estimated_stepping_batches))
