"""Shared machinery for every loss: validation switch, error format, dtype rules, reduction.

Everything here is private API used by the loss families; the public names
(:func:`set_validation`, :func:`validation`, :func:`is_validation_enabled`,
:class:`ExperimentalWarning`) are re-exported from :mod:`losses`.

Conventions implemented once here (``docs/conventions.md``):

* **Errors** read ``"<function>: <problem> (got <value>); <hint>"``. Bad hyperparameters,
  shapes or data raise :class:`ValueError`; a wrong target kind raises :class:`TypeError`.
* **Data checks** (label range, NaN/+inf, values outside [0, 1], ...) need a host sync. They
  run by default and are switched off by ``losses.set_validation(False)`` or the context
  manager ``losses.validation(False)`` (for CUDA graphs and ``torch.compile``). Checks on
  shapes, dtypes and hyperparameters never sync and always run.
* **Dtypes.** Compute in float64 if any floating input is float64, else float32; half inputs
  are upcast before any arithmetic and the loss is returned in the compute dtype.
* **Reduction.** Each loss computes per-unit values ``v`` and unit weights ``w >= 0``;
  ``"none"`` returns ``v`` (0 where ``w == 0``), ``"sum"`` returns ``sum(w * v)`` and
  ``"mean"`` returns ``sum(w * v) / sum(w)``; when ``sum(w) == 0`` the result is an exact,
  graph-attached 0 with zero gradients.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator, Optional, Sequence

import torch
from torch import Tensor

__all__ = [
    "ExperimentalWarning",
    "set_validation",
    "is_validation_enabled",
    "validation",
]

REDUCTIONS = ("none", "mean", "sum")


class ExperimentalWarning(UserWarning):
    """Warning emitted by experimental losses whose formula or API may still change."""


# --------------------------------------------------------------------------------------
# validation switch
# --------------------------------------------------------------------------------------

_VALIDATION = True


def set_validation(enabled: bool) -> None:
    """Turn the data checks (those that need a host sync) on or off, process-wide.

    Shape, dtype and hyperparameter checks are free and always run. Turn data checks off for
    CUDA graphs and ``torch.compile``; invalid data then gives undefined (possibly NaN) results.
    """
    global _VALIDATION
    if not isinstance(enabled, bool):
        raise TypeError(
            f"set_validation: enabled must be a bool (got {type(enabled).__name__}); "
            "pass True or False"
        )
    _VALIDATION = enabled


def is_validation_enabled() -> bool:
    """Whether the data checks run (see :func:`set_validation`)."""
    return _VALIDATION


@contextlib.contextmanager
def validation(enabled: bool) -> Iterator[None]:
    """Context manager that sets the data-check switch and restores the previous value.

    >>> import losses
    >>> with losses.validation(False):
    ...     losses.is_validation_enabled()
    False
    >>> losses.is_validation_enabled()
    True
    """
    previous = _VALIDATION
    set_validation(enabled)
    try:
        yield
    finally:
        set_validation(previous)


def _checking() -> bool:
    # Data checks are skipped while torch.compile / dynamo traces, whatever the switch says:
    # a host sync inside a compiled graph would force a graph break on every call.
    if not _VALIDATION:
        return False
    try:
        return not torch.compiler.is_compiling()
    except AttributeError:  # pragma: no cover - very old torch
        return True


# --------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------


def fmt(fn: str, problem: str, got: object, hint: str) -> str:
    """The library's error format: ``"<function>: <problem> (got <value>); <hint>"``."""
    return f"{fn}: {problem} (got {got}); {hint}"


def value_error(fn: str, problem: str, got: object, hint: str) -> ValueError:
    return ValueError(fmt(fn, problem, got, hint))


def type_error(fn: str, problem: str, got: object, hint: str) -> TypeError:
    return TypeError(fmt(fn, problem, got, hint))


# --------------------------------------------------------------------------------------
# argument checks (free: no host sync)
# --------------------------------------------------------------------------------------


def check_reduction(fn: str, reduction: str, allowed: Sequence[str] = REDUCTIONS) -> None:
    if reduction not in allowed:
        if tuple(allowed) == ("mean",) and reduction in REDUCTIONS:
            raise value_error(
                fn,
                "batch-level loss; only reduction='mean' is supported",
                repr(reduction),
                "compute per-sample terms yourself if needed",
            )
        raise value_error(
            fn,
            "reduction must be one of " + ", ".join(repr(r) for r in allowed),
            repr(reduction),
            "use 'none', 'mean' or 'sum'" if tuple(allowed) == REDUCTIONS else "use 'mean'",
        )


def check_tensor(fn: str, name: str, x: object) -> Tensor:
    if not isinstance(x, Tensor):
        raise type_error(fn, f"{name} must be a torch.Tensor", type(x).__name__, "convert it with torch.as_tensor")
    return x


def check_floating(fn: str, name: str, x: object) -> Tensor:
    check_tensor(fn, name, x)
    if not x.is_floating_point():
        raise type_error(
            fn,
            f"{name} must be a floating-point tensor",
            str(x.dtype),
            f"cast it with {name}.float()",
        )
    return x


def check_integer_target(fn: str, target: object, *, name: str = "target") -> Tensor:
    check_tensor(fn, name, target)
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise type_error(
            fn,
            f"{name} must hold integer class ids",
            str(target.dtype),
            f"pass {name}.long(); this loss does not take soft or boolean targets",
        )
    return target


def check_choice(fn: str, name: str, value: object, choices: Sequence[object]) -> None:
    if value not in choices:
        raise value_error(
            fn,
            f"{name} must be one of " + ", ".join(repr(c) for c in choices),
            repr(value),
            f"pick a supported {name}",
        )


def check_number(
    fn: str,
    name: str,
    value: object,
    *,
    low: Optional[float] = None,
    high: Optional[float] = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
    hint: str = "",
) -> float:
    """A finite real hyperparameter within [low, high] (bounds optional, inclusive by default)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, Tensor) and value.numel() == 1 and not value.requires_grad:
            value = float(value)
        else:
            raise type_error(fn, f"{name} must be a real number", type(value).__name__, hint or f"pass a float {name}")
    v = float(value)
    bad = not math.isfinite(v)
    if low is not None:
        bad = bad or (v < low if low_inclusive else v <= low)
    if high is not None:
        bad = bad or (v > high if high_inclusive else v >= high)
    if bad:
        lo = "" if low is None else (f"{name} >= {low}" if low_inclusive else f"{name} > {low}")
        hi = "" if high is None else (f"{name} <= {high}" if high_inclusive else f"{name} < {high}")
        need = " and ".join(s for s in (lo, hi) if s) or f"a finite {name}"
        raise value_error(fn, f"{name} must be finite and satisfy {need}", value, hint or f"choose {need}")
    return v


# --------------------------------------------------------------------------------------
# data checks (host sync; skipped when validation is off)
# --------------------------------------------------------------------------------------


def check_finite(fn: str, name: str, x: Tensor, *, allow_neg_inf: bool = False) -> None:
    """NaN or +inf anywhere (and -inf unless it is a documented mask) raises ValueError."""
    if not _checking() or not x.is_floating_point() or x.numel() == 0:
        return
    # one-pass screen: a sum of finite values is finite unless it overflows, and any NaN or
    # +-inf makes it non-finite; only then run the full (several-pass) check below
    if bool(torch.isfinite(x.detach().sum(dtype=torch.float64 if x.dtype == torch.float64 else torch.float32))):
        return
    if allow_neg_inf:
        bad = torch.isnan(x) | (x == math.inf)
    else:
        bad = ~torch.isfinite(x)
    if bool(bad.any()):
        n_nan = int(torch.isnan(x).sum())
        n_pinf = int((x == math.inf).sum())
        n_ninf = 0 if allow_neg_inf else int((x == -math.inf).sum())
        parts = [f"{n_nan} NaN"] if n_nan else []
        if n_pinf:
            parts.append(f"{n_pinf} +inf")
        if n_ninf:
            parts.append(f"{n_ninf} -inf")
        what = "NaN or +inf" if allow_neg_inf else "NaN or infinite values"
        raise value_error(
            fn,
            f"{name} contains {what}",
            ", ".join(parts),
            "check the model output for overflow or divergence"
            + ("; -inf is allowed as a mask" if allow_neg_inf else ""),
        )


def check_ids_in_range(
    fn: str,
    target: Tensor,
    num_classes: int,
    ignore_index: Optional[int],
    *,
    name: str = "target",
    hint: str = "check num_classes or set ignore_index",
) -> None:
    """Ids outside ``[0, num_classes)`` other than ``ignore_index`` raise ValueError."""
    if not _checking() or target.numel() == 0:
        return
    valid = target != ignore_index if ignore_index is not None else torch.ones_like(target, dtype=torch.bool)
    bad = valid & ((target < 0) | (target >= num_classes))
    if bool(bad.any()):
        t = target[valid]
        raise value_error(
            fn,
            f"{name} has class ids outside [0, {num_classes})",
            f"min={int(t.min())}, max={int(t.max())}",
            hint,
        )


def check_unit_interval(fn: str, name: str, x: Tensor, *, hint: str = "") -> None:
    """Values outside [0, 1] (or NaN) raise ValueError (data check)."""
    if not _checking() or x.numel() == 0:
        return
    bad = ~((x >= 0) & (x <= 1))
    if bool(bad.any()):
        xf = x.detach().float()
        raise value_error(
            fn,
            f"{name} must lie in [0, 1]",
            f"min={float(xf.nan_to_num(nan=float('nan')).min())}, max={float(xf.max())}"
            if not bool(torch.isnan(xf).any())
            else "NaN",
            hint or f"pass probabilities in [0, 1] as {name}",
        )


# --------------------------------------------------------------------------------------
# dtypes and shapes
# --------------------------------------------------------------------------------------


def compute_dtype(*tensors: Optional[Tensor]) -> torch.dtype:
    """float64 if any floating tensor is float64, else float32 (half inputs are upcast)."""
    for t in tensors:
        if isinstance(t, Tensor) and t.dtype == torch.float64:
            return torch.float64
    return torch.float32


def upcast(x: Tensor, dtype: torch.dtype) -> Tensor:
    return x if x.dtype == dtype else x.to(dtype)


def move_class_dim_last(input: Tensor) -> Tensor:
    """``(N, C, d1..dk) -> (N*d1*..*dk, C)``; ``(N, C)`` and ``(C,)``-less inputs pass through."""
    if input.dim() <= 2:
        return input
    c = input.shape[1]
    return input.movedim(1, -1).reshape(-1, c)


def flatten_logits_and_target(fn: str, input: Tensor, target: Tensor) -> tuple[Tensor, Tensor, tuple[int, ...]]:
    """Check ``F.cross_entropy``-style shapes and flatten to ``(M, C)`` and ``(M,)``.

    ``input`` is ``(N, C)`` or ``(N, C, d1, ..., dk)`` (classes on dim 1); ``target`` holds ids
    shaped ``(N,)`` or ``(N, d1, ..., dk)``. Returns the flattened pair and the ``"none"``
    output shape ``(N, d1, ..., dk)``.
    """
    if input.dim() < 2:
        raise value_error(
            fn,
            "input must have shape (N, C) or (N, C, d1, ..., dk) with classes on dim 1",
            f"shape {tuple(input.shape)}",
            "add a batch dimension with input.unsqueeze(0)",
        )
    expected = (input.shape[0],) + tuple(input.shape[2:])
    if tuple(target.shape) != expected:
        raise value_error(
            fn,
            f"target shape must be {expected} for input of shape {tuple(input.shape)}",
            f"shape {tuple(target.shape)}",
            "classes go on dim 1 of input and target holds one id per position",
        )
    return move_class_dim_last(input), target.reshape(-1), expected


# --------------------------------------------------------------------------------------
# reduction
# --------------------------------------------------------------------------------------


class _ZeroAnchor(torch.autograd.Function):
    """An exact scalar 0 whose backward gives each input a zero gradient as a stride-0 expanded
    view (O(1) memory), so that attaching it never costs a full-size zeros tensor."""

    @staticmethod
    def forward(ctx, *tensors: Tensor) -> Tensor:  # noqa: D102
        ctx.meta = [(t.shape, t.dtype, t.device) for t in tensors]
        first = tensors[0]
        return torch.zeros((), dtype=first.dtype, device=first.device)

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: D102
        return tuple(torch.zeros((), dtype=dt, device=dev).expand(shape) for shape, dt, dev in ctx.meta)


def attached_zero(*tensors: Optional[Tensor], dtype: Optional[torch.dtype] = None) -> Tensor:
    """An exact 0 attached to the graph of every given tensor (zero, not ``None``, gradients)."""
    floats = [t for t in tensors if isinstance(t, Tensor) and t.is_floating_point()]
    if not floats:
        raise RuntimeError("attached_zero needs at least one floating tensor")
    out = _ZeroAnchor.apply(*floats)
    return out if dtype is None else out.to(dtype)


def reduce_loss(
    values: Tensor,
    weights: Optional[Tensor],
    reduction: str,
    *,
    anchors: Sequence[Optional[Tensor]] = (),
) -> Tensor:
    """The single reduction used by every loss (the unit-weight rule, docs/conventions.md unit-weight rule).

    ``values`` are per-unit losses; ``weights`` (same shape, ``>= 0``; ``None`` = all ones)
    are unit weights. ``"none"`` returns ``values`` with exact zeros where ``weights == 0``;
    ``"sum"`` returns ``sum(weights * values)``; ``"mean"`` divides that by ``sum(weights)``,
    and gives an exact graph-attached 0 when ``sum(weights) == 0``. ``anchors`` are further
    differentiable tensors (parameters, other inputs) that must receive zero (not ``None``)
    gradients even when no unit contributes. No host sync.
    """
    if weights is not None:
        keep = weights > 0
        values = torch.where(keep, values, torch.zeros((), dtype=values.dtype, device=values.device))
    extra = attached_zero(*anchors).to(values.dtype) if any(
        isinstance(a, Tensor) and a.is_floating_point() for a in anchors
    ) else None
    if reduction == "none":
        return values if extra is None else values + extra
    if weights is None:
        total = values.sum()
        out = total if reduction == "sum" else total / max(values.numel(), 1)
    else:
        w = weights.to(values.dtype)
        total = (w * values).sum()
        if reduction == "sum":
            out = total
        else:
            denom = w.sum()
            out = total / torch.where(denom > 0, denom, torch.ones_like(denom))
    return out if extra is None else out + extra


Reducer = Callable[[Tensor, Optional[Tensor], str], Tensor]
