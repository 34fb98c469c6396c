"""Shared machinery for every loss: validation switch, error format, dtype rules, reduction.

Everything here is private API used by the loss families; the public names
(:func:`set_validation`, :func:`validation`, :func:`is_validation_enabled`,
:class:`ExperimentalWarning`) are re-exported from :mod:`losses`.

Conventions implemented once here (``docs/conventions.md``):

* **Errors** read ``"<function>: <problem> (got <value>); <hint>"``. One exception type per
  mistake, the same in every loss: a wrong *kind* of argument (float labels where class ids are
  expected, a non-bool flag, a non-integer size or seed, a non-tensor) is :class:`TypeError`
  (:func:`check_bool`, :func:`check_int`, :func:`check_seed`, :func:`check_integer_target`,
  :func:`check_class_target`); a wrong value, shape or data is :class:`ValueError`. Hints never
  suggest a fix that would silently corrupt the data (e.g. casting soft targets to ids).
* **Data checks** (label range, NaN/+inf, values outside [0, 1], rows without a finite score,
  soft targets that do not sum to 1, negative or all-zero class weights, ...) need a host sync.
  They run by default and are switched off by ``losses.set_validation(False)`` or the context
  manager ``losses.validation(False)`` (for CUDA graphs and ``torch.compile``). While
  ``torch.compile`` traces a call they cannot run; if validation is on at that point a
  ``UserWarning`` naming ``losses.validation(False)`` is given once per process. Checks on
  shapes, dtypes and hyperparameters never sync and always run.
* **Masks.** In the softmax-family losses ``-inf`` logits mean "this class does not exist for
  this row" (:func:`check_masked_logits`); ignored positions are replaced by 0 *before* the
  maths (:func:`zero_rows`), so that +-inf there never turns into NaN gradients.
* **Degenerate inputs** that would train nothing are errors: one logit for a softmax-family loss
  (:func:`check_softmax_classes`), soft targets not summing to 1 (:func:`check_distribution`),
  class weights with a negative entry or all zero (:func:`check_class_weight`).
* **Dtypes.** Compute in float64 if any floating input is float64, else float32; half inputs
  are upcast before any arithmetic and the loss is returned in the compute dtype. Under
  ``torch.autocast`` the maths runs with autocast switched off (:func:`no_autocast`), in those
  dtypes, as ``F.cross_entropy`` does.
* **Reduction.** Each loss computes per-unit values ``v`` and unit weights ``w >= 0``;
  ``"none"`` returns ``v`` (0 where ``w == 0``), ``"sum"`` returns ``sum(w * v)`` and
  ``"mean"`` returns ``sum(w * v) / sum(w)``; when ``sum(w) == 0`` the result is an exact,
  graph-attached 0 with zero gradients (:func:`reduce_loss`). ``F.cross_entropy``'s class-weighted
  form, whose ``"none"`` values already carry the weight, is :func:`reduce_weighted_values`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import operator
import warnings
from typing import Iterator, Optional, Sequence, Union

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


_COMPILE_WARNED = False

#: the warning given (once per process) when validation is on but a data check is skipped
#: because torch.compile / dynamo is tracing the call
COMPILE_WARNING = (
    "losses: data checks are skipped while torch.compile traces a loss (they need a host sync), "
    "so this compiled step is NOT validated although validation is on; run the loss eagerly to "
    "check the data, or turn the checks off explicitly with losses.validation(False) / "
    "losses.set_validation(False) around compiled code"
)


def _compiling() -> bool:
    try:
        return torch.compiler.is_compiling()
    except AttributeError:  # pragma: no cover - very old torch
        return False


def add_at_target(grad: Tensor, y: Tensor, value: Tensor) -> Tensor:
    """``grad (M, C)`` with ``value`` (``(M,)``, or a shape that broadcasts to it) added at column
    ``y (M,)`` of each row, in place where that is cheap.

    Eagerly this is ``scatter_add_`` (it touches ``M`` entries). While ``torch.compile`` traces it
    is an element-wise ``where(arange(C) == y, grad + value, grad)``: inductor fuses that into the
    kernel that writes ``grad`` (and into whatever masking follows), where an in-place scatter
    would end that kernel and make every later element-wise step one more pass over ``(M, C)``."""
    if _compiling():
        cols = torch.arange(grad.shape[1], device=grad.device)
        v = value.reshape(-1, 1) if value.dim() > 0 else value
        return torch.where(cols == y.unsqueeze(1), grad + v, grad)
    v = value.reshape(-1, 1) if value.dim() > 0 else value.reshape(1, 1)
    return grad.scatter_add_(1, y.unsqueeze(1), v.to(grad.dtype).expand(y.shape[0], 1))


def set_at_index(x: Tensor, index: Tensor, value: Union[Tensor, float]) -> Tensor:
    """``x.scatter_(1, index, value)`` for ``index`` shaped like ``x`` with dim 1 of size 1 (one
    column per row, e.g. ``ids.unsqueeze(1)``); ``value`` a number or shaped like ``index``.

    Eagerly the in-place scatter (it touches one entry per row). While ``torch.compile`` traces it,
    an element-wise ``where(arange(C) == index, value, x)`` instead, so inductor keeps ``x`` in
    registers and fuses the replacement into the kernel that computes ``x`` (and into a reduction
    that follows), rather than storing ``x`` to memory for the scatter."""
    if _compiling():
        shape = [1] * x.dim()
        shape[1] = x.shape[1]
        cols = torch.arange(x.shape[1], device=x.device).reshape(shape)
        return torch.where(cols == index, value, x)
    return x.scatter_(1, index, value)


def _emit_compile_warning(ctx: object = None) -> None:
    global _COMPILE_WARNED
    if not _COMPILE_WARNED:
        _COMPILE_WARNED = True
        warnings.warn(COMPILE_WARNING, UserWarning, stacklevel=2)


def _warn_compile_unchecked() -> None:
    # Called while dynamo traces. ``comptime`` runs the callback for real at trace time, without
    # a graph break (so ``fullgraph=True`` still works) and without dynamo guarding on the
    # once-flag (no recompilation when it flips); outside dynamo it is a no-op. torch._dynamo
    # is necessarily imported while tracing, so this import costs nothing then.
    try:
        from torch._dynamo.comptime import comptime
    except ImportError:  # pragma: no cover - torch without dynamo
        return
    comptime(_emit_compile_warning)


def _checking() -> bool:
    """Whether a data check (host sync) runs now: validation is on and the call is eager.

    While torch.compile / dynamo traces, the checks are skipped whatever the switch says (a host
    sync inside a compiled graph would force a graph break on every call). If validation is on
    at that point, a ``UserWarning`` naming ``losses.validation(False)`` is given once per
    process, so that no one believes a compiled step is checked when it is not.
    """
    if not _VALIDATION:
        return False
    if _compiling():
        _warn_compile_unchecked()
        return False
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
    """Class ids: a float, complex or bool tensor is the wrong kind (``TypeError``).

    The hint never suggests casting (``.long()`` on soft targets would silently corrupt them).
    """
    check_tensor(fn, name, target)
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise type_error(
            fn,
            f"{name} must hold integer class ids",
            str(target.dtype),
            f"this loss takes integer class ids, not probabilities, soft labels or masks; pass the "
            f"labels as an integer tensor (if {name} is a distribution, use a loss that accepts "
            f"soft targets, e.g. cross_entropy_loss)",
        )
    return target


def check_class_target(fn: str, input: Tensor, target: object, *, soft: bool = True,
                       soft_name: str = "probabilities") -> bool:
    """Kind and shape of a classification target for ``input (N, C, d1..dk)``.

    Integer ids ``(N, d1..dk)`` return ``False``; with ``soft=True`` a floating tensor shaped like
    ``input`` returns ``True``. A floating tensor shaped like the ids (float labels where ids are
    expected) and a bool or complex tensor are the wrong kind (``TypeError``); any other float
    shape is a ``ValueError``. The id shape itself is checked by the caller.
    """
    check_tensor(fn, "target", target)
    ids_shape = (input.shape[0],) + tuple(input.shape[2:]) if input.dim() >= 1 else ()
    kinds = f"integer class ids or float {soft_name}" if soft else "integer class ids"
    if target.dtype == torch.bool or target.is_complex():
        raise type_error(fn, f"target must hold {kinds}", str(target.dtype),
                         "pass the class ids as an integer tensor" + (
                             f", or {soft_name} as a float tensor shaped like input" if soft else ""))
    if not target.is_floating_point():
        return False
    if soft and tuple(target.shape) == tuple(input.shape):
        return True
    if tuple(target.shape) == ids_shape:
        raise type_error(
            fn,
            f"target has the shape of class ids {ids_shape} but a floating-point dtype",
            str(target.dtype),
            "class ids must be an integer tensor (e.g. torch.long)"
            + (f"; {soft_name} must have the input's shape {tuple(input.shape)}" if soft else ""),
        )
    if not soft:
        check_integer_target(fn, target)
    raise value_error(
        fn,
        f"float target must have the input's shape {tuple(input.shape)}",
        f"shape {tuple(target.shape)}",
        f"pass {soft_name} shaped like input, or integer class ids of shape {ids_shape}",
    )


def check_bool(fn: str, name: str, value: object, *, allow_none: bool = False) -> Optional[bool]:
    """A flag must be a Python ``bool`` (``TypeError`` otherwise, e.g. for 0/1 or "yes");
    ``None`` passes when ``allow_none`` (a per-variant default)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        raise type_error(fn, f"{name} must be {'None or ' if allow_none else ''}a bool", repr(value),
                         f"pass True or False{' (or None for the variant default)' if allow_none else ''}")
    return value


def check_int(
    fn: str,
    name: str,
    value: object,
    *,
    low: Optional[int] = None,
    allow_none: bool = False,
    what: str = "",
    hint: str = "",
) -> Optional[int]:
    """An integer hyperparameter, returned as a Python ``int``.

    Accepts what torch's own integer arguments accept: a Python ``int``, a NumPy integer and a
    one-element integer tensor (e.g. ``y[0]``), anything that implements ``__index__``. A bool
    (Python, NumPy or tensor), a float (``6.0`` included), a string or a tensor of another size is
    ``TypeError``; an integer below ``low`` is ``ValueError``. ``None`` passes when ``allow_none``.
    ``what`` phrases the requirement (default: "an int", "a positive int", "an int >= low",
    "... or None")."""
    if value is None and allow_none:
        return None
    if not what:
        what = "an int" if low is None else ("a positive int" if low == 1 else f"an int >= {low}")
        if allow_none:
            what += " or None"
    index = as_index(value)
    if index is None:
        raise type_error(fn, f"{name} must be {what}", repr(value), hint or f"pass {name} as a Python int")
    if low is not None and index < low:
        raise value_error(fn, f"{name} must be {what}", repr(value), hint or f"pass {name} >= {low}")
    return index


def as_index(value: object) -> Optional[int]:
    """``value`` as a Python ``int`` if it is an integer the way ``operator.index`` sees one (a Python
    or NumPy integer, a one-element integer tensor), else ``None``. Bools of every kind are not
    integers here: ``True`` as a class id or a count is almost always a mistake."""
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        return None
    if isinstance(value, Tensor):
        if value.numel() != 1 or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def as_class_vector(fn: str, name: str, value: object, *, example: str, what: str) -> Tensor:
    """A per-class constructor vector (class counts, a class prior) given as a tensor or a list of
    numbers: a list becomes a float64 tensor (counts stay exact); any other kind, and a bool or
    complex tensor, is ``TypeError``. ``example`` is a sample list such as ``"[500, 120, 8]"``,
    ``what`` names the values in the hints (e.g. "the number of training samples of each class")."""
    if isinstance(value, (list, tuple)):
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            raise type_error(fn, f"{name} must be a tensor or a list of numbers", repr(value),
                             f"pass {what}, e.g. {example}")
        return torch.tensor(value, dtype=torch.float64)
    if not isinstance(value, Tensor):
        raise type_error(fn, f"{name} must be a tensor or a list of numbers", type(value).__name__,
                         f"pass {what}, e.g. torch.tensor({example})")
    if value.dtype == torch.bool or value.is_complex():
        raise type_error(fn, f"{name} must be real-valued", str(value.dtype), f"pass {what} as a real tensor")
    return value


def check_ignore_index(fn: str, ignore_index: object) -> int:
    """``ignore_index`` is an integer id (``TypeError`` for a float, bool, string or ``None``): a float
    such as ``-100.0`` would compare equal to integer ids but is rejected like in every other loss."""
    return check_int(fn, "ignore_index", ignore_index,
                     hint="pass an integer id such as -100 (the id of the rows or positions to skip)")


def check_seed(fn: str, seed: object) -> Optional[int]:
    """``None`` (the global RNG) or an integer seed; anything else is ``TypeError``."""
    return check_int(fn, "seed", seed, allow_none=True,
                     hint="pass an integer seed for a private generator, or None for the global RNG")


def check_softmax_classes(fn: str, c: int, *, arg: Optional[str] = None) -> None:
    """A softmax over one class is identically 1: the loss is 0 and trains nothing.

    ``arg`` names the argument that fixes the class count (a head's ``num_classes``, a weight's rows);
    without it the count came from the logits' class dimension."""
    if c != 1:
        return
    if arg is None:
        raise value_error(
            fn,
            "a softmax over a single class is identically 1, so this loss is 0 and trains nothing",
            "C=1",
            "for a binary task with 0/1 labels use one logit per sample: "
            "losses.bce_with_logits_loss(input.squeeze(1), target.to(input.dtype)); or pass two classes",
        )
    raise value_error(
        fn,
        f"{arg} must be >= 2 for a softmax over classes; with one class the loss is identically 0",
        c,
        "for a single yes/no output use one logit with losses.bce_with_logits_loss",
    )


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


def check_finite(fn: str, name: str, x: Tensor, *, allow_neg_inf: bool = False,
                 hint: Optional[str] = None, neg_inf_note: str = "-inf is allowed as a mask") -> bool:
    """NaN or +inf anywhere (and -inf unless it is a documented mask) raises ValueError.

    Returns True only when the check ran and found every value finite (callers may then skip
    their sanitising passes); False when it was skipped or ``-inf`` entries are present.

    ``hint`` replaces the default hint when the only offending values are ``-inf`` (used where
    ``-inf`` has a documented alternative); ``neg_inf_note`` says what ``-inf`` means where it
    is allowed."""
    if not _checking() or not x.is_floating_point():
        return False
    if x.numel() == 0:
        return True
    # one-pass screen: a sum of finite values is finite unless it overflows, and any NaN or
    # +-inf makes it non-finite; only then run the full (several-pass) check below
    if bool(torch.isfinite(x.detach().sum(dtype=torch.float64 if x.dtype == torch.float64 else torch.float32))):
        return True
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
            hint if (hint is not None and not n_nan and not n_pinf) else
            "check the model output for overflow or divergence"
            + (f"; {neg_inf_note}" if allow_neg_inf else ""),
        )
    return bool(torch.isfinite(x).all()) if not allow_neg_inf else False


def check_masked_logits(fn: str, name: str, x: Tensor, *, active: Optional[Tensor] = None,
                        class_dim: int = 1) -> bool:
    """Logits where ``-inf`` is a mask: NaN or +inf raise; so does an active row (a position
    along every dim but ``class_dim``) without a finite score. ``active`` (bool, the row shape,
    ``None`` = all rows) exempts ignored rows. Data check; one sum when everything is finite.

    Returns True only when the check ran and every entry is finite (no mask, nothing to
    sanitise), else False."""
    if not _checking() or not x.is_floating_point():
        return False
    if x.numel() == 0:
        return True
    if bool(torch.isfinite(x.detach().sum(dtype=torch.float64 if x.dtype == torch.float64 else torch.float32))):
        return True
    check_finite(fn, name, x, allow_neg_inf=True)
    dead = (x == -math.inf).all(dim=class_dim)
    if active is not None:
        dead = dead & active.reshape(dead.shape)
    if bool(dead.any()):
        row = int(torch.nonzero(dead.reshape(-1))[0, 0])
        raise value_error(fn, f"row {row} of {name} has no finite score", "all -inf",
                          "unmask at least one class per row")
    return False


def check_class_weight(fn: str, weight: object, c: int, *, name: str = "weight",
                       allow_shape: Optional[tuple] = None) -> Optional[Tensor]:
    """Class weights ``(C,)`` (or ``allow_shape``, e.g. per element): a real tensor (bool or
    complex is ``TypeError``; integers are fine); finite, non-negative and, for ``(C,)``, not all
    zero (data checks)."""
    if weight is None:
        return None
    check_tensor(fn, name, weight)
    shape = tuple(weight.shape)
    if shape != (c,) and (allow_shape is None or shape != tuple(allow_shape)):
        raise value_error(
            fn,
            f"{name} must have shape ({c},), one per class" if allow_shape is None else
            f"{name} must have shape ({c},) or the input's shape {tuple(allow_shape)}",
            f"shape {shape}",
            "pass a 1-D tensor of class weights" if allow_shape is None else
            "pass one weight per class or one per element",
        )
    if weight.dtype == torch.bool or weight.is_complex():
        raise type_error(fn, f"{name} must be a real-valued tensor", str(weight.dtype),
                         f"pass {name} as a float tensor of per-class weights")
    check_finite(fn, name, weight)
    if _checking() and weight.numel() > 0:
        if bool((weight < 0).any()):
            raise value_error(fn, f"{name} must be non-negative", f"min={float(weight.min())}",
                              "class weights are >= 0; use 0 to drop a class")
        if shape == (c,) and not bool((weight > 0).any()):
            raise value_error(fn, f"{name} is zero for every class, so nothing would be trained", "all 0",
                              "give at least one class a positive weight")
    return weight


def check_distribution(fn: str, name: str, q: Tensor, *, dim: int = 1, tol: float = 1e-3,
                       hint: str = "") -> None:
    """Soft targets: non-negative and summing to 1 along ``dim`` within ``tol`` (relative to the
    expected sum 1). Data check."""
    if not _checking() or q.numel() == 0:
        return
    qd = q.detach()
    err = (qd.sum(dim=dim, dtype=torch.float64) - 1).abs()
    if bool((qd < 0).any()) or bool((err > tol).any()):
        raise value_error(
            fn,
            f"float {name} must be a distribution over dim {dim} (non-negative, summing to 1 within {tol:g})",
            f"min={float(qd.min()):.4g}, max |row sum - 1|={float(err.max()):.3g}",
            hint or f"normalise it ({name} / {name}.sum({dim}, keepdim=True)) or pass integer class ids",
        )


#: ``check_ids_in_range``'s ``ignore_index`` for ids of which none is skipped (e.g. a class index).
NO_IGNORE = object()


def check_ids_in_range(
    fn: str,
    target: Tensor,
    num_classes: int,
    ignore_index: object,
    *,
    name: str = "target",
    hint: str = "check num_classes or set ignore_index",
) -> None:
    """Ids outside ``[0, num_classes)`` other than ``ignore_index`` raise ValueError; a non-integer
    ``ignore_index`` is ``TypeError`` (a configuration check, made even without data checks);
    ``NO_IGNORE``: every id must be in range."""
    if ignore_index is not NO_IGNORE:
        check_ignore_index(fn, ignore_index)
    if not _checking() or target.numel() == 0:
        return
    valid = target != ignore_index if ignore_index is not NO_IGNORE else torch.ones_like(target, dtype=torch.bool)
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


def no_autocast(*where: object):
    """A context that switches autocast off, so that a loss called inside an autocast region runs
    its maths in the dtypes chosen by :func:`compute_dtype` (float32 or wider), as
    ``F.cross_entropy`` does under autocast: the inputs keep their dtypes, the loss upcasts them
    itself, and autograd returns each input's gradient in its own dtype.

    ``where``: a device type (``"cuda"``) or tensors; the first one given (a string, or a tensor's
    device type) is used, CPU if none. A plain context manager, so ``torch.compile(fullgraph=True)``
    traces through it."""
    dev = "cpu"
    for w in where:
        if isinstance(w, str):
            dev = w
            break
        if isinstance(w, Tensor):
            dev = w.device.type
            break
    if not _compiling():
        try:
            if not torch.is_autocast_enabled(dev):  # nothing to switch off (eager): no context to build
                return contextlib.nullcontext()
        except (RuntimeError, TypeError):  # pragma: no cover - device type without autocast support
            pass
    try:
        return torch.autocast(device_type=dev, enabled=False)
    except RuntimeError:  # pragma: no cover - device type without autocast support
        return contextlib.nullcontext()


def zero_rows(x: Tensor, keep: Tensor, *, verified_finite: bool = False) -> Tensor:
    """``x (M, C)`` with the rows where ``keep (M,)`` is False replaced by 0 *before* any maths,
    so that ignored positions holding +-inf or NaN give exactly zero (not NaN) gradients.

    ``verified_finite`` (a data check just found every entry finite) skips the pass: finite
    ignored rows cannot produce NaN. So does a batch without ignored rows on CPU outside
    ``torch.compile`` (one look at ``keep``; a host sync is free there): replacing no row is an
    identity, and skipping it saves a pass over ``(M, C)`` forward and another backward. Otherwise
    (GPU or compiled, with validation off or ``-inf`` masks present) the rows are always replaced,
    with no host sync."""
    if verified_finite or all_kept(keep):
        return x
    return torch.where(keep.unsqueeze(1), x, torch.zeros((), dtype=x.dtype, device=x.device))


def all_kept(keep: Tensor) -> bool:
    """True when ``keep`` (bool) is known to be all True without a device sync: on CPU outside
    ``torch.compile`` one look at it (a host read is free there). False when some entry is False,
    or on another device / while compiling, where it is not looked at. Losses use it to take their
    no-ignored-position path (no zeroing pass, no weighted reduction)."""
    return keep.device.type == "cpu" and not _compiling() and (keep.numel() == 0 or bool(keep.all()))


def move_class_dim_last(input: Tensor) -> Tensor:
    """``(N, C, d1..dk) -> (N*d1*..*dk, C)``; ``(N, C)`` and ``(C,)``-less inputs pass through."""
    if input.dim() <= 2:
        return input
    c = input.shape[1]
    return input.movedim(1, -1).reshape(-1, c)


#: the advice for one logit per sample given to a loss over classes (a softmax, or class ids)
BINARY_HINT = ("for one logit per sample (a binary task) with 0/1 labels use "
               "losses.bce_with_logits_loss(input, target.to(input.dtype))")


def check_logits_dim(fn: str, input: Tensor, target: object = None) -> None:
    """``input`` must have ``F.cross_entropy``'s layout, ``(N, C)`` or ``(N, C, d1, ..., dk)`` with
    the classes on dim 1 (``ValueError`` otherwise). With ``target`` the hint fits it: ``(C,)``
    logits of one sample with a 0-dim id or a ``(C,)`` distribution get a batch dimension on both;
    one logit per sample (``target`` shaped like ``input``) is sent to the binary loss."""
    if input.dim() >= 2:
        return
    one_sample = "add a batch dimension to both: input.unsqueeze(0) and target.unsqueeze(0)"
    if input.dim() == 1 and isinstance(target, Tensor) and target.dim() == 0:
        hint = one_sample
    elif (input.dim() == 1 and isinstance(target, Tensor) and target.is_floating_point()
          and target.shape == input.shape):
        hint = f"for the C classes of one sample {one_sample}; {BINARY_HINT}"
    elif isinstance(target, Tensor) and target.shape == input.shape:
        hint = BINARY_HINT
    elif target is None:  # a loss without a target
        hint = "add a batch dimension with input.unsqueeze(0)"
    else:
        hint = f"for the C classes of one sample {one_sample}"
    raise value_error(fn, "input must have shape (N, C) or (N, C, d1, ..., dk) with classes on dim 1",
                      f"shape {tuple(input.shape)}", hint)


def flatten_logits_and_target(fn: str, input: Tensor, target: Tensor) -> tuple[Tensor, Tensor, tuple[int, ...]]:
    """Check ``F.cross_entropy``-style shapes and flatten to ``(M, C)`` and ``(M,)``.

    ``input`` is ``(N, C)`` or ``(N, C, d1, ..., dk)`` (classes on dim 1); ``target`` holds ids
    shaped ``(N,)`` or ``(N, d1, ..., dk)``. Returns the flattened pair and the ``"none"``
    output shape ``(N, d1, ..., dk)``.
    """
    check_logits_dim(fn, input, target)
    expected = check_target_shape(fn, input, target)
    return move_class_dim_last(input), target.reshape(-1), expected


def check_target_shape(fn: str, input: Tensor, target: Tensor, *, name: str = "target") -> tuple[int, ...]:
    """``target`` must hold one id per position of ``input (N, C, d1..dk)``: shape ``(N, d1..dk)``
    (``ValueError`` naming ``name`` otherwise). Returns that shape."""
    expected = (input.shape[0],) + tuple(input.shape[2:])
    if tuple(target.shape) != expected:
        raise value_error(
            fn,
            f"{name} shape must be {expected} for input of shape {tuple(input.shape)}",
            f"shape {tuple(target.shape)}",
            "classes go on dim 1 of input and target holds one id per position",
        )
    return expected


# --------------------------------------------------------------------------------------
# first-order-only autograd Functions
# --------------------------------------------------------------------------------------


#: the words of the error a backward without a second derivative raises under ``create_graph=True``
NO_SECOND_DERIVATIVE = "no second derivative"


def once_differentiable(loss_name: str):
    """Decorator for the ``backward`` of a ``torch.autograd.Function`` that has no second
    derivative: the gradients are computed without a graph, and a backward run with
    ``create_graph=True`` raises ``RuntimeError("<loss_name>: no second derivative, ...")``.

    ``torch.autograd.function.once_differentiable`` refuses a double backward only when some
    ``grad_output`` requires grad. A loss's backward normally receives a constant ``grad_output``
    (from ``.mean()`` or ``.sum()``), so with torch's decorator a gradient penalty, a
    Hessian-vector product or a MAML-style outer step through the loss silently treated this
    loss's gradient as a constant (its second derivative as 0). Grad mode is on inside a backward
    exactly when it runs with ``create_graph=True``, whose purpose is to differentiate the
    gradients again, so that is refused here, loudly. While ``torch.compile`` traces the backward
    nothing is checked (compiled graphs have no double backward through a custom Function)."""
    msg = (f"{loss_name}: {NO_SECOND_DERIVATIVE}, so a backward through this loss cannot run with "
           "create_graph=True (a gradient penalty, a Hessian-vector product or a MAML-style outer step); "
           "run the backward without create_graph, or write that term with a loss built from "
           "differentiable torch ops (e.g. F.cross_entropy)")

    def decorate(backward):
        @functools.wraps(backward)
        def wrapper(ctx, *grads):
            if torch.is_grad_enabled() and not _compiling():
                raise RuntimeError(msg)
            with torch.no_grad():
                return backward(ctx, *grads)

        return wrapper

    return decorate


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


def reduce_weighted_values(values: Tensor, unit: Tensor, reduction: str) -> Tensor:
    r"""``F.cross_entropy``'s class-weighted reduction, for values that already carry their weight.

    ``values`` are the per-unit losses times their unit weight, ``w_{y_i} l_i``, and exactly 0 at
    ignored units (what ``F.cross_entropy(..., weight=w, ignore_index=..., reduction="none")``
    returns); ``unit`` (same shape) holds the unit weights ``w_{y_i}`` (1 without class weights),
    0 at ignored units. Then

    * ``"none"``: ``values`` as they are (``w_{y_i} l_i``, 0 at ignored units);
    * ``"sum"``: :math:`\sum_i w_{y_i} l_i`;
    * ``"mean"``: :math:`\sum_i w_{y_i} l_i \,/\, \sum_i w_{y_i}` over the non-ignored units, and
      when that denominator is 0 (every unit ignored, or an empty batch) the exact 0 of the
      numerator divided by 1, attached to the graph through ``values`` (zero gradients).

    The rule of :func:`reduce_loss` with ``values / unit`` as the per-unit loss, except that
    ``"none"`` keeps the weight in the values (as ``F.cross_entropy`` does). No host sync.
    """
    if reduction == "none":
        return values
    total = values.sum()
    if reduction == "sum":
        return total
    denom = unit.sum()
    return total / torch.where(denom > 0, denom, torch.ones_like(denom))


# --------------------------------------------------------------------------------------
# module repr
# --------------------------------------------------------------------------------------


def auto_extra_repr(module: torch.nn.Module) -> str:
    """``extra_repr`` of a loss module, derived from its constructor: ``name=value`` for each
    keyword argument of ``type(module).__init__``, in signature order, read from the attribute of
    the same name (``repr`` of the value).

    Skipped: arguments without such an attribute, the module's own tensors (its parameters and
    buffers, also when unset: ``weight``), the names in the class attribute ``_repr_skip``
    (``process_group``), and those in ``_repr_omit_none`` while their value is ``None``
    (``softcap``, shown only when set), and those in ``_repr_omit_false`` while their value is
    ``False`` (``inplace_backward``, shown only when switched on).
    A class whose stored value is not the argument (``bias`` becomes a parameter) maps the name
    to the shown value in a method ``_repr_values(self) -> dict``.

    Use it as ``extra_repr = auto_extra_repr`` in the class body.

    >>> import losses
    >>> losses.CompSumLoss(tau=0.5)
    CompSumLoss(tau=0.5, ignore_index=-100, reduction='mean')
    """
    values = getattr(module, "_repr_values", dict)()
    omit_none = getattr(module, "_repr_omit_none", ())
    omit_false = getattr(module, "_repr_omit_false", ())
    skip = getattr(module, "_repr_skip", ())
    owned = set(module._parameters) | set(module._buffers)
    parts = []
    for name, param in inspect.signature(type(module).__init__).parameters.items():
        if name == "self" or name in skip or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name in values:
            value = values[name]
        elif name in owned or not hasattr(module, name):
            continue
        else:
            value = getattr(module, name)
        if isinstance(value, Tensor) or (value is None and name in omit_none) or (value is False and name in omit_false):
            continue
        parts.append(f"{name}={value!r}")
    return ", ".join(parts)
