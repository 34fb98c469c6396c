"""Helpers shared by the registry-wide reliability tests (``tests/test_contract_reliability.py``,
``tests/test_properties.py``, ``tests/test_cuda.py``): build a registered module, make its
example inputs and call it (the public kit's :func:`losses.testing.build`, :func:`~losses.testing.example`,
:func:`~losses.testing.call` and :func:`~losses.testing.float_leaves`, re-exported here), and call its
functional form with the module's own tensors.

The rules these tests hold are written up in ``docs/conventions.md`` (masks, mixed precision,
degenerate inputs, exception types, resumable randomness).
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Dict, Optional, Sequence, Tuple

import torch

import losses
from losses.testing import build, call, example, float_leaves  # noqa: F401  (re-exported)

SPECS = losses.list_losses()
NAMES = [s.name for s in SPECS]
BY_NAME = {s.name: s for s in SPECS}

# Every list below is read from the registry records (``losses.register``), never written by
# name, so a new entry joins the checks its record declares.

#: Logits losses whose ``-inf`` logits remove a class (registry ``masks`` holds ``"neg_inf"``).
LOGIT_SOFTMAX = tuple(n for n in NAMES if BY_NAME[n].kind == "logits" and "neg_inf" in BY_NAME[n].masks)
#: Candidate (scores) losses that take ``mask=`` (and ``-inf`` scores) to exclude candidates.
CANDIDATE_SOFTMAX = tuple(n for n in NAMES if BY_NAME[n].kind == "scores" and "mask" in BY_NAME[n].masks)
#: Logits losses with an explicit ``mask=`` of positions (the Dice family).
LOGIT_POSITION_MASK = tuple(n for n in NAMES if BY_NAME[n].kind == "logits" and "mask" in BY_NAME[n].masks)
#: Losses that normalise over the classes of logits (also through a model): one class is an error.
CLASS_SOFTMAX = tuple(n for n in NAMES if BY_NAME[n].softmax and BY_NAME[n].kind in ("logits", "model"))
#: Logits losses that also take class probabilities (checked to sum to 1).
SOFT_TARGETS = tuple(n for n in NAMES if BY_NAME[n].soft_targets)
#: Losses that take a per-class ``weight=``.
CLASS_WEIGHTED = tuple(n for n in NAMES if BY_NAME[n].class_weight)
#: Losses whose target holds class ids only: a float target is a ``TypeError``.
ID_TARGETS = tuple(n for n in NAMES if BY_NAME[n].inputs[-1] == "target" and (
    BY_NAME[n].kind in ("embeddings", "model") or (BY_NAME[n].kind == "logits" and not BY_NAME[n].dense_targets)))
#: Entries with a documented exact +inf on extreme inputs.
DOCUMENTED_INF = frozenset(n for n in NAMES if BY_NAME[n].documented_inf)
#: Modules that own a generator (``seed=``); their state_dict must carry it.
SEEDED = tuple(n for n in NAMES if BY_NAME[n].seeded)


def _bool_flags():
    out = []
    for n in NAMES:
        for key, p in inspect.signature(BY_NAME[n].module.__init__).parameters.items():
            if isinstance(p.default, bool) or p.annotation in ("bool", "Optional[bool]", bool):
                out.append((n, key))
    return out


#: Every constructor flag (a ``bool`` keyword) of every entry: a non-bool value is a ``TypeError``.
FLAGS = _bool_flags()


def per_class_args(spec) -> Tuple[str, ...]:
    """The entry's required per-class tensors: registry ``tensor_args`` without a default in the
    constructor (e.g. a class prior), which fix the number of classes the module takes."""
    params = inspect.signature(spec.module.__init__).parameters
    return tuple(a for a in spec.tensor_args if params[a].default is inspect.Parameter.empty)


def class_kwargs(spec, c: int, keep: Optional[torch.Tensor] = None) -> Dict[str, Any]:
    """Constructor keywords of the entry's required per-class tensors for ``c`` classes: the example
    values where they have ``c`` entries, else ``1, 2, ..., c`` (positive and distinct); ``keep``
    (bool ``(c,)``) keeps those classes only, for the loss on an input with classes removed."""
    out: Dict[str, Any] = {}
    for name in per_class_args(spec):
        example_value = spec.example_kwargs.get(name)
        v = None if example_value is None else torch.as_tensor(example_value, dtype=torch.float64)
        if v is None or v.dim() != 1 or v.numel() != c:
            v = torch.arange(1, c + 1, dtype=torch.float64)
        out[name] = v if keep is None else v[keep]
    return out


def grads_of(out, leaves):
    return torch.autograd.grad(out, leaves, allow_unused=True)


def reductions_for(spec) -> Tuple[str, ...]:
    return ("mean",) if spec.unit == "batch" else ("none", "mean", "sum")


def prefixes(spec) -> Tuple[str, ...]:
    """Names an error of this loss may start with: the function's, or the module's when the
    constructor rejects a keyword."""
    return (spec.function.__name__ + ":", spec.module.__name__ + ":")


def assert_documented_error(spec, exc: BaseException, kinds=(ValueError, TypeError)) -> None:
    """``exc`` is one of ``kinds`` and reads ``"<function>: <problem> ..."``."""
    assert isinstance(exc, kinds), f"{type(exc).__name__} is not one of {[k.__name__ for k in kinds]}: {exc}"
    msg = str(exc)
    assert msg.startswith(prefixes(spec)), f"message does not start with {prefixes(spec)}: {msg!r}"


def function_of_module(spec, module, args: Sequence[Any], kwargs: Dict[str, Any]):
    """The functional form called with the module's own hyperparameters and tensors; equal to
    ``module(*args, **kwargs)``. ``None`` where the module does more than call its function
    (the adversarial loss runs PGD first). Call it after the module (Partial FC reuses the
    module's ``last_index``)."""
    name = spec.name
    fn = spec.function
    red = {"ignore_index": getattr(module, "ignore_index", -100), "reduction": module.reduction}
    if spec.inputs[0] == "model":
        return None
    if name in ("margin_softmax", "cosine_softmax"):
        emb, t = args
        return fn(emb, t, module.weight, scale=module.scale, margin=tuple(module.margin), variant=module.variant,
                  interclass_filtering_threshold=module.interclass_filtering_threshold, **red)
    if name == "partial_fc":
        emb, t = args
        return fn(emb, t, module.weight, sample_rate=module.sample_rate, scale=module.scale,
                  margin=tuple(module.margin), variant=module.variant,
                  interclass_filtering_threshold=module.interclass_filtering_threshold,
                  index=module.last_index, **red)
    if name == "wcdas":
        emb, t = args
        return fn(emb, t, module.weight, module.concentration_logit, module.effective_scale(),
                  variant=module.variant, **red)
    if name == "nbc_softmax":
        emb, t = args
        return fn(emb, t, module.classifier.weight, scale=module.scale, nbc_weight=module.nbc_weight,
                  variant=module.variant, bias=module.classifier.bias, **red)
    if name == "linear_cross_entropy":
        emb, t = args
        return fn(emb, t, module.weight, bias=module.bias, chunk_size=module.chunk_size,
                  label_smoothing=module.label_smoothing, logz_coef=module.logz_coef, **red)
    params = inspect.signature(fn).parameters
    # keyword-only hyperparameters, and required tensors after the forward inputs (e.g. a class
    # prior the module keeps as a buffer), passed by name
    after_inputs = list(params)[len(args):]
    fkw = {k: getattr(module, k) for k in params
           if (params[k].kind is params[k].KEYWORD_ONLY or (params[k].kind is params[k].POSITIONAL_OR_KEYWORD
                                                             and k in after_inputs))
           and hasattr(module, k) and k not in ("generator",)}
    fkw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in fkw.items()}
    fkw.update(spec.function_kwargs)
    fkw.update(kwargs)
    return fn(*args, **fkw)


def detach_clone(args, dtype: Optional[torch.dtype] = None, requires_grad: bool = True):
    """Fresh leaves with the same values (optionally cast); non-tensors pass through."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            b = a.detach().clone()
            if dtype is not None:
                b = b.to(dtype)
            out.append(b.requires_grad_(requires_grad))
        else:
            out.append(a)
    return tuple(out)


_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z_0-9]*: ")


def has_prefix(msg: str) -> bool:
    return bool(_PREFIX.match(msg))
