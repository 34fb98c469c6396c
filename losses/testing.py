"""The library's own contract checks, for any registered loss: yours too.

:func:`check_loss` runs on one registry entry the checks that every built-in loss passes in the
project's contract tests (``tests/test_contract.py``), on the entry's example inputs
(``example_kwargs`` / ``example_inputs`` of :func:`losses.register`), and raises
:class:`AssertionError` naming the property and the entry that failed::

    >>> import losses
    >>> from losses.testing import check_loss
    >>> check_loss("cross_entropy", properties=["reductions", "all_ignored"])

From a shell, ``python -m losses.testing <registry-name | module.path | file.py> ...`` imports the
module (so that its ``losses.register`` calls run), checks the entries it registers and prints one
``PASS`` / ``FAIL`` line per property with its time; the exit status is 1 when a property fails
(:func:`main`; ``--properties gradients,reductions`` for a subset).

The properties (:data:`PROPERTIES`):

* ``"reductions"``: ``"none"`` is 0 where the unit weight is 0, ``"sum" == Σ w·none`` and
  ``"mean" == Σ w·none / Σ w`` with the declared ``unit_weights`` (float64, rtol 1e-10), on the
  example inputs, with the first id ignored, and (``class_weight=True``) with random class weights,
  where a ``weighted_mean`` entry's ``"mean"`` divides by ``Σ w·weight[target]`` (as
  ``F.cross_entropy``); an unknown reduction is a ``ValueError``; batch-level losses
  (``unit="batch"``) accept only ``"mean"``.
* ``"all_ignored"``: every unit ignored gives an exact, graph-attached 0 with zero (not ``None``)
  gradients, also when the inputs hold ``±inf`` (under ``losses.validation(False)``).
* ``"finite"``: finite values and gradients on random, extreme (x1e4) and constant inputs
  (documented exact infinities: no NaN).
* ``"gradients"``: the first-order gradients are the derivative of the value:
  ``torch.autograd.gradcheck`` in float64 (:data:`GRADCHECK_TOL`: central differences of step
  1e-6, atol 1e-5, rtol 1e-3; fast mode, the Jacobian along random directions) for every
  reduction the entry allows, w.r.t. its floating inputs and its own trainable parameters
  (through ``torch.func.functional_call``), on the example inputs, with random class weights
  (``class_weight=True``), with the first id ignored (losses with ``ignore_index``) and, for
  ``"logits"`` entries with an ``(N, C)`` example, the same values in the N-D layout
  ``(N/2, C, 2)`` (run where the loss accepts it). Each evaluation builds a fresh module with the
  global RNG reset, so random losses draw the same numbers every time. ``inputs="model"``
  entries are checked w.r.t. the model's parameters (and the loss's own), not the data the model
  takes: such a loss may feed the model inputs it derives from the data and treats as constants
  (``adversarial_comp_sum``'s PGD perturbation is detached by design, as adversarial training
  does), so its gradient in the data is not the derivative of its value. In the parameters it is:
  the registry example's L-inf steps move by ``sign(gradient)``, locally constant in the
  parameters (with ``norm="l2"`` the perturbation follows the parameters smoothly, and this
  check would fail by design). Catches a term detached by mistake (``.detach()``, ``.item()``, a
  ``no_grad`` block) and a wrong hand-written backward; a bug that moves a gradient by less than
  ``rtol`` of its size along random directions is below its resolution.* ``"dtypes"``: fp16 / bf16 inputs give an fp32 loss equal to the fp32 result on the upcast
  inputs (1e-6) with gradients in the input dtype; float64 stays float64 (``module.to(float64)``
  moves every parameter and buffer).
* ``"autocast"``: forward and backward under CPU bf16 ``torch.autocast`` give the fp32 value
  and gradients, in fp32 and the leaves' dtypes.
* ``"module_function"``: the module equals its functional form exactly (entries without an
  owned head whose ``forward`` does not take a model; skipped for the others).
* ``"serialization"``: ``repr``, ``deepcopy``, pickle, and the ``state_dict`` round trip (in
  memory and through ``torch.save`` / ``torch.load(weights_only=True)``) give identical outputs
  and gradients.
* ``"double_backward"``: a backward with ``create_graph=True`` either raises a
  ``RuntimeError`` that says the loss has no second derivative, or gives gradients whose
  derivative along a random direction (the Hessian-vector product) equals central finite
  differences of the first-order gradient (float64, rtol 1e-5): never a second derivative
  silently dropped (gradients detached, or differentiable but wrong).
* ``"compile"`` (not run by default): ``torch.compile(module, backend=compile_backend)`` with
  validation off matches eager (1e-5; gradients 1e-4).

This module imports only torch (and the rest of ``losses``); it needs no test runner.
"""

from __future__ import annotations

import copy
import inspect
import io
import math
import pickle
import re
import sys
import time
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn
from torch.autograd.gradcheck import GradcheckError

from ._core import NO_SECOND_DERIVATIVE, ExperimentalWarning, validation
from ._registry import LossSpec, get_loss_spec

__all__ = [
    "check_loss", "PROPERTIES", "DEFAULT_PROPERTIES", "AUTOCAST_TOL", "MODEL_AUTOCAST_TOL", "GRADCHECK_TOL", "build",
    "example", "call", "float_leaves", "class_weight_kwargs", "main",
]

#: Every property :func:`check_loss` knows, in the order it runs them.
PROPERTIES: Tuple[str, ...] = (
    "reductions", "all_ignored", "finite", "gradients", "dtypes", "autocast", "module_function", "serialization",
    "double_backward", "compile",
)
#: What ``check_loss(name)`` runs when ``properties`` is ``None`` (``"compile"`` is opt-in: it is slow).
DEFAULT_PROPERTIES: Tuple[str, ...] = tuple(p for p in PROPERTIES if p != "compile")

#: Inside autocast the loss's maths runs in fp32 (as ``F.cross_entropy``): equal to the fp32 run
#: up to summation order; a model argument runs in bf16 itself, hence the wider tolerance.
AUTOCAST_TOL = {"rtol": 1e-5, "atol": 1e-6}
MODEL_AUTOCAST_TOL = {"rtol": 3e-2, "atol": 3e-2}

#: The ``"gradients"`` property: ``torch.autograd.gradcheck`` in float64 (central differences of
#: step ``eps``; ``fast_mode``: the Jacobian projected on random directions, compared within
#: ``atol + rtol * |numerical|``). The example inputs are random, so away from the kinks of
#: non-smooth losses (sparsemax, hinges) by far more than ``eps``.
GRADCHECK_TOL = {"eps": 1e-6, "atol": 1e-5, "rtol": 1e-3}


# --------------------------------------------------------------------------------------
# helpers (also used by the project's contract tests)
# --------------------------------------------------------------------------------------


def build(spec: LossSpec, **overrides: Any) -> nn.Module:
    """The registered module with its ``example_kwargs`` (and ``overrides``), built reproducibly
    (global seed 0) with the experimental warning silenced."""
    kwargs = {**spec.example_kwargs, **overrides}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        torch.manual_seed(0)
        return spec.create(**kwargs)


def example(spec: LossSpec, case: str = "random", dtype: torch.dtype = torch.float32, seed: int = 0,
            requires_grad: bool = True) -> Tuple[tuple, dict]:
    """The entry's example ``forward`` inputs ``(args, kwargs)``; floating tensors as fresh leaves."""
    g = torch.Generator().manual_seed(seed)
    args, kwargs = spec.example_inputs(generator=g, dtype=dtype, case=case)
    out = []
    for a in args:
        if isinstance(a, Tensor) and a.is_floating_point() and requires_grad:
            a = a.detach().clone().requires_grad_(True)
        out.append(a)
    return tuple(out), dict(kwargs)


def call(module: Callable[..., Tensor], args: Sequence[Any], kwargs: Optional[Dict[str, Any]] = None) -> Tensor:
    """``module(*args, **kwargs)`` with the global RNG reset (losses with ``seed=None`` draw the
    same numbers call to call) and the experimental warning silenced."""
    torch.manual_seed(1234)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        return module(*args, **(kwargs or {}))


def float_leaves(module: nn.Module, args: Sequence[Any]) -> List[Tensor]:
    """Differentiable leaves: floating tensor inputs, a model argument's parameters, and the
    loss's own parameters."""
    leaves: List[Tensor] = []
    for a in args:
        if isinstance(a, Tensor) and a.requires_grad:
            leaves.append(a)
        elif isinstance(a, nn.Module):
            leaves += [p for p in a.parameters() if p.requires_grad]
    leaves += [p for p in module.parameters() if p.requires_grad]
    return leaves


def _grads(out: Tensor, leaves: Sequence[Tensor]):
    return torch.autograd.grad(out, list(leaves), allow_unused=True)


def _close(actual: Tensor, expected: Tensor, what: str, **tol: float) -> None:
    try:
        torch.testing.assert_close(actual, expected, **tol)
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}") from None


def _reductions_for(spec: LossSpec) -> Tuple[str, ...]:
    return ("mean",) if spec.unit == "batch" else ("none", "mean", "sum")


def _is_model_kind(spec: LossSpec) -> bool:
    return spec.inputs[0] == "model"


def _detach_clone(args: Sequence[Any], dtype: Optional[torch.dtype] = None) -> tuple:
    out = []
    for a in args:
        if isinstance(a, Tensor) and a.is_floating_point():
            b = a.detach().clone()
            out.append((b if dtype is None else b.to(dtype)).requires_grad_(True))
        else:
            out.append(a)
    return tuple(out)


# --------------------------------------------------------------------------------------
# the properties
# --------------------------------------------------------------------------------------


def _check_reductions(spec: LossSpec, **_: Any) -> None:
    args, kwargs = example(spec, dtype=torch.float64)
    try:
        call(build(spec, reduction="elementwise_mean"), *example(spec))
    except ValueError as exc:
        assert "reduction" in str(exc), f"the error for reduction='elementwise_mean' does not name it: {exc}"
    else:
        raise AssertionError("reduction='elementwise_mean' is accepted; expected a ValueError")
    if spec.unit == "batch":
        out = call(build(spec, reduction="mean"), args, kwargs)
        assert out.shape == () and bool(torch.isfinite(out)), f"'mean' is not a finite scalar: {out}"
        for bad in ("none", "sum"):
            try:
                call(build(spec, reduction=bad), args, kwargs)
            except ValueError as exc:
                assert "batch-level loss; only reduction='mean' is supported" in str(exc), (
                    f"reduction={bad!r}: the error does not say 'batch-level loss; only reduction='mean' is "
                    f"supported': {exc}")
            else:
                raise AssertionError(f"batch-level loss accepts reduction={bad!r}; expected a ValueError")
        return
    weighted = class_weight_kwargs(spec, args)
    for what, case_args in _reduction_cases(spec, args):
        _check_unit_weights(spec, case_args, kwargs, what, {})
        if weighted:
            _check_unit_weights(spec, case_args, kwargs, f"{what}, with class weights", weighted)


def _reduction_cases(spec: LossSpec, args: tuple) -> List[Tuple[str, tuple]]:
    """The example inputs, and (for losses with ``ignore_index`` and integer ids as the last
    argument) the same inputs with the first id ignored, so that a ``"mean"`` that counts
    ignored units, or a ``"none"`` that does not zero them, is caught."""
    cases = [("example inputs", args)]
    ignore_index = getattr(build(spec), "ignore_index", None)
    ids = args[-1]
    if (isinstance(ignore_index, int) and spec.inputs[-1] == "target" and isinstance(ids, Tensor)
            and not ids.is_floating_point() and ids.dtype != torch.bool and ids.numel() > 1):
        ids = ids.clone()
        ids.view(-1)[0] = ignore_index
        cases.append(("example inputs with the first id ignored", args[:-1] + (ids,)))
    return cases


def class_weight_kwargs(spec: LossSpec, args: Sequence[Any], seed: int = 7) -> Dict[str, Tensor]:
    """``{"weight": w}``: random positive float64 class weights ``(C,)`` (in ``[0.25, 1.75)``) for an
    entry registered with ``class_weight=True`` (its module takes ``weight=``); ``{}`` for the
    others. ``C`` is the class dimension of the logits (``args[0].shape[1]``) or, for other kinds,
    the ``num_classes`` of ``example_kwargs``."""
    if not spec.class_weight:
        return {}
    if spec.kind == "logits" and isinstance(args[0], Tensor) and args[0].dim() >= 2:
        c = int(args[0].shape[1])
    elif isinstance(spec.example_kwargs.get("num_classes"), int):
        c = int(spec.example_kwargs["num_classes"])
    else:
        raise AssertionError("class_weight=True but the number of classes is unknown: the inputs are not logits "
                             "(N, C, ...) and example_kwargs has no num_classes")
    g = torch.Generator().manual_seed(seed)
    return {"weight": torch.rand(c, generator=g, dtype=torch.float64) * 1.5 + 0.25}


def _mean_weights(spec: LossSpec, w: Tensor, args: tuple, ctor: Dict[str, Any]) -> Tensor:
    """The weights of the ``"mean"`` denominator: the unit weights ``w``, times ``weight[target]``
    for a ``weighted_mean`` entry given class weights and class ids (``F.cross_entropy``'s
    weighted mean: ``"none"`` already carries ``weight[target]``, and the mean divides by the summed
    class weights of the valid targets). Float targets keep ``w`` (as ``F.cross_entropy`` with
    probabilities)."""
    weight = ctor.get("weight")
    ids = args[-1]
    if not (spec.weighted_mean and isinstance(weight, Tensor) and isinstance(ids, Tensor)
            and not ids.is_floating_point()):
        return w
    per_id = weight.to(w.dtype)[ids.clamp_min(0).long()]
    assert per_id.shape == w.shape, (
        f"weighted_mean: weight[target] {tuple(per_id.shape)} is not shaped like the unit weights {tuple(w.shape)}")
    return w * per_id


def _check_unit_weights(spec: LossSpec, args: tuple, kwargs: dict, what: str, ctor: Dict[str, Any]) -> None:
    none = call(build(spec, reduction="none", **ctor), args, kwargs)
    total = call(build(spec, reduction="sum", **ctor), args, kwargs)
    mean = call(build(spec, reduction="mean", **ctor), args, kwargs)
    w = spec.unit_weights(*args, **{**spec.example_kwargs, **ctor, **kwargs}).to(none.dtype)
    assert none.shape == w.shape, (
        f"{what}: 'none' output shape {tuple(none.shape)} != unit weights shape {tuple(w.shape)}")
    assert total.shape == () and mean.shape == (), (
        f"{what}: 'sum' / 'mean' not scalars: {tuple(total.shape)}, {tuple(mean.shape)}")
    assert bool(torch.all(none[w == 0] == 0)), (
        f"{what}: 'none' is not 0 where the unit weight is 0: {none[w == 0].tolist()}")
    _close(total, (w * none).sum(), f"{what}: 'sum' != sum(w * none)", rtol=1e-10, atol=1e-12)
    wm = _mean_weights(spec, w, args, ctor)
    den = "sum(w * weight[target])" if wm is not w else "sum(w)"
    _close(mean, (w * none).sum() / wm.sum(), f"{what}: 'mean' != sum(w * none) / {den}", rtol=1e-10, atol=1e-12)


def _with_infs(t: Tensor) -> Tensor:
    t = t.detach().clone()
    flat = t.view(-1)
    flat[0] = math.inf
    if flat.numel() > 1:
        flat[-1] = -math.inf
    return t.requires_grad_(True)


def _check_zero(out: Tensor, leaves: Sequence[Tensor], what: str) -> None:
    assert out.shape == (), f"{what}: not a scalar ({tuple(out.shape)})"
    assert out.item() == 0.0, f"{what}: {out.item()} instead of an exact 0"
    assert out.grad_fn is not None, f"{what}: the 0 is not graph-attached"
    for leaf, g in zip(leaves, _grads(out, leaves)):
        assert g is not None, f"{what}: None gradient for a {tuple(leaf.shape)} leaf (expected zeros)"
        assert not bool(torch.isnan(g).any()), f"{what}: NaN gradient for a {tuple(leaf.shape)} leaf"
        assert bool(torch.all(g == 0)), f"{what}: nonzero gradient for a {tuple(leaf.shape)} leaf"


def _check_all_ignored(spec: LossSpec, **_: Any) -> None:
    for reduction in _reductions_for(spec):
        if reduction == "none":
            continue
        args, kwargs = example(spec, case="ignored")
        module = build(spec, reduction=reduction)
        out = call(module, args, kwargs)
        _check_zero(out, float_leaves(module, args), f"reduction={reduction!r}")
        if _is_model_kind(spec):  # the model's outputs would carry the infinities
            continue
        inf_args = tuple(_with_infs(a) if isinstance(a, Tensor) and a.is_floating_point() else a for a in args)
        module = build(spec, reduction=reduction)
        with validation(False):
            out = call(module, inf_args, kwargs)
        _check_zero(out, float_leaves(module, inf_args), f"reduction={reduction!r} with +-inf inputs")


def _check_finite(spec: LossSpec, documented_inf: bool = False, **_: Any) -> None:
    for case in ("random", "extreme", "constant"):
        module = build(spec)
        args, kwargs = example(spec, case="random" if case == "constant" else case)
        if case == "constant":  # all-equal logits / zero features / equal scores (a zero-initialised head)
            if _is_model_kind(spec):
                with torch.no_grad():
                    for p in args[0].parameters():
                        p.zero_()
            else:
                args = (torch.zeros_like(args[0]).requires_grad_(True),) + args[1:]
        out = call(module, args, kwargs)
        grads = _grads(out, float_leaves(module, args))
        if case == "extreme" and documented_inf:
            assert not bool(torch.isnan(out).any()), f"{case} inputs: NaN value"
            assert all(g is None or not bool(torch.isnan(g).any()) for g in grads), f"{case} inputs: NaN gradient"
            continue
        assert bool(torch.isfinite(out).all()), f"{case} inputs: non-finite value {out}"
        for g in grads:
            assert g is None or bool(torch.isfinite(g).all()), f"{case} inputs: non-finite gradient"


class _LossAndModel(nn.Module):
    """The loss and a model argument as one module, so that ``torch.func.functional_call`` swaps
    the parameters of both (the loss's own and the model's) for one call; ``forward`` is the loss's."""

    def __init__(self, loss: nn.Module, model: Optional[nn.Module]) -> None:
        super().__init__()
        self.loss = loss
        if model is not None:
            self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        return self.loss(*args, **kwargs)


def _nd_logits(spec: LossSpec, args: tuple, kwargs: dict) -> Optional[tuple]:
    """The example ``(N, C)`` logits and their ``(N,)`` ids (or ``(N, C)`` float targets) as the same
    values in the N-D layout ``(N/2, C, 2)`` / ``(N/2, 2)``: for a ``"logits"`` entry whose example is
    2-D with an even ``N`` and no tensor keywords (which would need the layout too), and whose
    loss accepts that layout (a ``ValueError`` / ``TypeError`` there: not run); else ``None``."""
    if spec.kind != "logits" or len(args) != 2 or any(isinstance(v, Tensor) for v in kwargs.values()):
        return None
    x, t = args
    if not (isinstance(x, Tensor) and isinstance(t, Tensor) and x.dim() == 2 and x.shape[0] % 2 == 0):
        return None
    n, c = x.shape
    x_nd = x.detach().reshape(n // 2, 2, c).transpose(1, 2).contiguous()
    if t.shape == (n,):
        t_nd = t.reshape(n // 2, 2)
    elif t.shape == (n, c):
        t_nd = t.detach().reshape(n // 2, 2, c).transpose(1, 2).contiguous()
    else:
        return None
    try:
        with torch.no_grad():
            call(build(spec), (x_nd, t_nd), kwargs)
    except (ValueError, TypeError):
        return None
    return x_nd, t_nd


def _gradient_cases(spec: LossSpec, args: tuple, kwargs: dict) -> List[Tuple[str, tuple, Dict[str, Any]]]:
    """``(what, forward args, constructor overrides)`` the ``"gradients"`` property checks: the
    example inputs; with random class weights (``class_weight=True``); with the first id ignored
    (``ignore_index`` and class ids; with the class weights where there are some); the N-D logits
    layout (:func:`_nd_logits`)."""
    weighted = class_weight_kwargs(spec, args)
    cases: List[Tuple[str, tuple, Dict[str, Any]]] = [("example inputs", args, {})]
    if weighted:
        cases.append(("example inputs with class weights", args, weighted))
    for what, case_args in _reduction_cases(spec, args)[1:]:
        cases.append((what + (" and class weights" if weighted else ""), case_args, weighted))
    nd = _nd_logits(spec, args, kwargs)
    if nd is not None:
        cases.append((f"N-D logits {tuple(nd[0].shape)}", nd, {}))
    return cases


def _check_gradients(spec: LossSpec, **_: Any) -> None:
    """float64 ``torch.autograd.gradcheck`` (fast mode, :data:`GRADCHECK_TOL`) of the module, for
    every reduction it allows, w.r.t. its floating inputs (``inputs="model"``: the model's
    parameters instead, see the module docs) and its own trainable parameters, on each case of
    :func:`_gradient_cases`. Every evaluation builds a fresh module (a seeded one draws the same
    numbers) under :func:`call` (the global RNG reset), so gradcheck's repeated calls see the
    same randomness."""
    args, kwargs = example(spec, dtype=torch.float64)
    model_kind = _is_model_kind(spec)
    model = args[0] if model_kind else None
    for what, case_args, ctor in _gradient_cases(spec, args, kwargs):
        inputs = [] if model_kind else [
            i for i, a in enumerate(case_args) if isinstance(a, Tensor) and a.is_floating_point()]
        holder = _LossAndModel(build(spec, **ctor).to(torch.float64), model)
        params = [(n, p) for n, p in holder.named_parameters() if p.requires_grad]
        leaves = tuple([case_args[i].detach().clone().requires_grad_(True) for i in inputs]
                       + [p.detach().clone().to(torch.float64).requires_grad_(True) for _, p in params])
        names = ([f"{spec.inputs[i]!r} (argument {i})" for i in inputs]
                 + [f"the {'model' if n.startswith('model.') else 'loss'}'s parameter {n.split('.', 1)[1]!r}"
                    for n, _ in params])
        assert leaves, f"{what}: nothing to differentiate (no floating input, no trainable parameter)"
        for reduction in _reductions_for(spec):

            def fn(*values: Tensor, reduction: str = reduction) -> Tensor:
                fwd = list(case_args)
                for i, v in zip(inputs, values):
                    fwd[i] = v
                own = dict(zip((n for n, _ in params), values[len(inputs):]))
                loss = build(spec, reduction=reduction, **ctor).to(torch.float64)  # fresh: same random draws
                one = _LossAndModel(loss, model)
                return call(lambda *a, **k: torch.func.functional_call(one, own, a, k), fwd, kwargs)

            try:
                torch.autograd.gradcheck(fn, leaves, fast_mode=True, **GRADCHECK_TOL)
            except GradcheckError as exc:
                msg = str(exc)
                wrt = re.search(r"with respect to input (\d+)", msg)
                leaf = names[int(wrt.group(1))] if wrt and int(wrt.group(1)) < len(names) else "an input"
                tol = ", ".join(f"{k}={v:g}" for k, v in GRADCHECK_TOL.items())
                nums = " ".join(ln.strip() for ln in msg.splitlines() if ln.startswith(("numerical", "analytical")))
                raise AssertionError(
                    f"{what}, reduction={reduction!r}: the gradient w.r.t. {leaf} differs from central finite "
                    f"differences of the value (float64 gradcheck, fast mode, {tol}; {nums or msg[:300]}): "
                    "a term detached from the graph, or a hand-written backward that is wrong") from None


def _upcast(x: Any) -> Any:
    return x.detach().float().requires_grad_(True) if isinstance(x, Tensor) and x.is_floating_point() else x


def _check_dtypes(spec: LossSpec, **_: Any) -> None:
    for dtype in (torch.float16, torch.bfloat16):
        args, kwargs = example(spec, dtype=dtype)
        out = call(build(spec), args, kwargs)
        assert out.dtype == torch.float32, f"{dtype} inputs give a {out.dtype} loss, expected torch.float32"
        if _is_model_kind(spec):  # the model itself runs in half precision
            assert bool(torch.isfinite(out)), f"{dtype} model: non-finite loss {out}"
            continue
        up = tuple(_upcast(a) for a in args)
        up_kwargs = {k: (v.float() if isinstance(v, Tensor) and v.is_floating_point() else v)
                     for k, v in kwargs.items()}
        ref = call(build(spec), up, up_kwargs)
        _close(out, ref, f"{dtype} inputs != the fp32 result on the upcast inputs", rtol=1e-6, atol=1e-6)
        inputs = [a for a in args if isinstance(a, Tensor) and a.requires_grad]
        for a, g in zip(inputs, _grads(out, inputs)):
            assert g is None or g.dtype == a.dtype, f"{dtype} input: gradient in {g.dtype}"
    module = build(spec).to(torch.float64)
    for t in list(module.parameters()) + [b for b in module.buffers() if b.is_floating_point()]:
        assert t.dtype == torch.float64, f"module.to(float64) leaves a {t.dtype} parameter or buffer"
    args, kwargs = example(spec, dtype=torch.float64)
    out = call(module, args, kwargs)
    assert out.dtype == torch.float64, f"float64 inputs give a {out.dtype} loss"


def _check_leaf_grads(leaves: Sequence[Tensor], grads: Sequence[Optional[Tensor]], what: str) -> None:
    assert grads[0] is not None, f"{what}: no gradient reaches the first input"
    for leaf, g in zip(leaves, grads):
        if g is None:
            continue
        assert g.dtype == leaf.dtype, f"{what}: gradient in {g.dtype} for a {leaf.dtype} leaf"
        assert bool(torch.isfinite(g).all()), f"{what}: non-finite gradient"


def _check_autocast(spec: LossSpec, **_: Any) -> None:
    model_kind = _is_model_kind(spec)
    args, kwargs = example(spec)
    ref_module = build(spec)
    ref_args = _detach_clone(args)
    if model_kind:
        ref_args = (copy.deepcopy(args[0]),) + ref_args[1:]
    ref = call(ref_module, ref_args, kwargs)

    module = build(spec)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = call(module, args, kwargs)
    leaves = float_leaves(module, args)
    grads = _grads(out, leaves)
    assert out.dtype == torch.float32, f"loss computed in {out.dtype}, not float32, under bf16 autocast"
    assert bool(torch.isfinite(out).all()), f"non-finite loss under bf16 autocast: {out}"
    _check_leaf_grads(leaves, grads, "backward after bf16 autocast")
    _close(out, ref.to(out.dtype), "the value under bf16 autocast != the fp32 value",
           **(MODEL_AUTOCAST_TOL if model_kind else AUTOCAST_TOL))
    if not model_kind:  # and the gradients are the fp32 gradients
        for g, g0 in zip(grads, _grads(ref, float_leaves(ref_module, ref_args))):
            if g0 is not None and g is not None:
                _close(g, g0, "a gradient under bf16 autocast != the fp32 gradient", **AUTOCAST_TOL)

    args2, kwargs2 = example(spec)
    module2 = build(spec)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out2 = call(module2, args2, kwargs2)
        leaves2 = float_leaves(module2, args2)
        grads2 = _grads(out2, leaves2)
    assert out2.dtype == torch.float32 and bool(torch.isfinite(out2).all()), (
        f"forward and backward inside bf16 autocast: {out2.dtype} {out2}")
    _check_leaf_grads(leaves2, grads2, "backward inside bf16 autocast")


def _check_module_function(spec: LossSpec, **_: Any) -> None:
    if spec.owns_head or _is_model_kind(spec):
        return  # the function needs the module's own tensors (or the module runs more than it)
    args, kwargs = example(spec, dtype=torch.float64)
    fn_params = inspect.signature(spec.function).parameters
    fkw = {k: v for k, v in spec.example_kwargs.items() if k in fn_params}
    fkw.update(spec.function_kwargs)
    expected = spec.function(*args, **fkw, **kwargs)
    got = call(build(spec), args, kwargs)
    _close(got, expected, f"{spec.module.__name__} != {spec.function.__name__}", rtol=0, atol=0)


def _check_serialization(spec: LossSpec, **_: Any) -> None:
    module = build(spec)
    assert spec.module.__name__ in repr(module), f"repr {repr(module)!r} does not name {spec.module.__name__}"
    args, kwargs = example(spec)
    ref = call(module, args, kwargs)
    for how, other in (("deepcopy", copy.deepcopy(module)), ("pickle", pickle.loads(pickle.dumps(module)))):
        args2, kwargs2 = example(spec)
        _close(call(other, args2, kwargs2), ref, f"the {how} gives another value", rtol=0, atol=0)

    source = build(spec)
    with torch.no_grad():  # make the source differ from a fresh default init
        for p in source.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(5), dtype=p.dtype))
    fresh = build(spec)
    torch.manual_seed(123)
    fresh.load_state_dict(copy.deepcopy(source.state_dict()))
    buf = io.BytesIO()
    torch.save(source.state_dict(), buf)
    buf.seek(0)
    from_disk = build(spec)
    from_disk.load_state_dict(torch.load(buf, weights_only=True))
    results = []
    for m in (source, fresh, from_disk):
        args, kwargs = example(spec)
        out = call(m, args, kwargs)
        results.append((out, _grads(out, float_leaves(m, args))))
    for how, (out, grads) in zip(("state_dict", "torch.save state_dict"), results[1:]):
        _close(out, results[0][0], f"a module loaded from the {how} gives another value", rtol=0, atol=0)
        for g, g0 in zip(grads, results[0][1]):
            if g0 is None:
                assert g is None, f"a module loaded from the {how}: a gradient where the source has none"
            else:
                _close(g, g0, f"a module loaded from the {how} gives another gradient", rtol=0, atol=0)


def _check_double_backward(spec: LossSpec, **_: Any) -> None:
    args, kwargs = example(spec, dtype=torch.float64)

    def first_order(shift: float, directions: Optional[Sequence[Tensor]], create_graph: bool):
        module = build(spec).to(torch.float64)  # fresh: a seeded module draws the same numbers
        leaves = float_leaves(module, args)
        if directions is not None:
            with torch.no_grad():  # shift the inputs in place (restored below), the module's own
                for leaf, v in zip(leaves, directions):
                    leaf.add_(shift * v)
        try:
            out = call(module, args, kwargs)
            grads = torch.autograd.grad(out, leaves, create_graph=create_graph, allow_unused=True)
        finally:
            if directions is not None:
                own = {id(p) for p in module.parameters()}
                with torch.no_grad():  # the arguments (inputs, a model's parameters) are reused
                    for leaf, v in zip(leaves, directions):
                        if id(leaf) not in own:
                            leaf.sub_(shift * v)
        return leaves, grads

    try:
        leaves, grads = first_order(0.0, None, True)
    except RuntimeError as exc:
        if NO_SECOND_DERIVATIVE in str(exc):
            return  # refused, loudly: documented
        raise
    g = torch.Generator().manual_seed(0)
    directions = [torch.randn(leaf.shape, dtype=leaf.dtype, generator=g) for leaf in leaves]
    dot = sum(((gr * v).sum() for gr, v in zip(grads, directions) if gr is not None and gr.requires_grad),
              torch.zeros((), dtype=torch.float64))
    if dot.requires_grad:
        hvp = torch.autograd.grad(dot, leaves, allow_unused=True)
    else:
        hvp = (None,) * len(leaves)
    h = 1e-5
    _, plus = first_order(h, directions, False)
    _, minus = first_order(-h, directions, False)
    for leaf, got, gp, gm in zip(leaves, hvp, plus, minus):
        if gp is None and gm is None:
            continue
        fd = ((gp if gp is not None else 0.0) - (gm if gm is not None else 0.0)) / (2 * h)
        got = torch.zeros_like(leaf) if got is None else got
        scale = float(fd.abs().max()) + 1e-8
        err = float((got - fd).abs().max()) / scale
        assert err < 1e-5, (
            f"create_graph=True: the second derivative along a random direction differs from finite "
            f"differences of the gradient (max relative error {err:.2e}; gradients "
            f"{'detached' if not dot.requires_grad else 'differentiable'}); a loss without a second "
            f"derivative must raise RuntimeError saying {NO_SECOND_DERIVATIVE!r}")


def _check_compile(spec: LossSpec, compile_backend: str = "aot_eager", **_: Any) -> None:
    torch._dynamo.reset()
    args, kwargs = example(spec)
    module = build(spec)
    with validation(False):
        eager = call(module, args, kwargs)
        eager_grads = _grads(eager, float_leaves(module, args))
        compiled = torch.compile(module, backend=compile_backend)
        args2, kwargs2 = example(spec)
        out = call(compiled, args2, kwargs2)
        grads = _grads(out, float_leaves(module, args2))
    _close(out, eager, f"torch.compile(backend={compile_backend!r}) != eager", rtol=1e-5, atol=1e-5)
    for g, g0 in zip(grads, eager_grads):
        if g0 is not None:
            assert g is not None, f"torch.compile(backend={compile_backend!r}): a gradient is missing"
            _close(g, g0, f"torch.compile(backend={compile_backend!r}): gradient != eager", rtol=1e-4, atol=1e-5)


_CHECKS: Dict[str, Callable[..., None]] = {
    "reductions": _check_reductions,
    "all_ignored": _check_all_ignored,
    "finite": _check_finite,
    "gradients": _check_gradients,
    "dtypes": _check_dtypes,
    "autocast": _check_autocast,
    "module_function": _check_module_function,
    "serialization": _check_serialization,
    "double_backward": _check_double_backward,
    "compile": _check_compile,
}


def check_loss(
    name_or_spec: Union[str, LossSpec],
    *,
    properties: Optional[Iterable[str]] = None,
    compile_backend: str = "aot_eager",
    documented_inf: Optional[bool] = None,
) -> None:
    """Run the contract checks on one registry entry; return ``None`` if it passes them all.

    Args:
        name_or_spec: a registry name or a :class:`~losses.LossSpec` (from
            :func:`losses.get_loss_spec` or :func:`losses.register`).
        properties: which checks to run (names in :data:`PROPERTIES`); ``None``: every one but
            ``"compile"`` (:data:`DEFAULT_PROPERTIES`).
        compile_backend: the ``torch.compile`` backend of the ``"compile"`` check
            (``"aot_eager"``: tests the graph capture and the autograd trace without a C++
            compiler; ``"inductor"`` also compiles kernels).
        documented_inf: the loss documents an exact ``+inf`` on extreme inputs (then the
            ``"finite"`` check asks only for no NaN there); ``None``: the entry's registry
            record (``documented_inf=`` of :func:`losses.register`).

    Raises:
        AssertionError: ``"check_loss: property '<property>' failed for '<name>': <what>"``,
            with the original error chained when the loss raised one.
        ValueError: an unknown property name.

    The global RNG state is restored afterwards (the checks seed it for reproducible calls).
    """
    spec = name_or_spec if isinstance(name_or_spec, LossSpec) else get_loss_spec(name_or_spec)
    if properties is None:
        wanted = DEFAULT_PROPERTIES
    else:
        if isinstance(properties, str):
            raise TypeError(f"check_loss: properties must be a list of names (got {properties!r}); "
                            f"e.g. properties=[{properties!r}]")
        wanted = tuple(properties)
        unknown = [p for p in wanted if p not in _CHECKS]
        if unknown:
            raise ValueError(f"check_loss: unknown properties (got {unknown}); choose from {list(PROPERTIES)}")
    if documented_inf is None:
        documented_inf = spec.documented_inf
    for prop in wanted:
        with torch.random.fork_rng(devices=[]):
            try:
                _CHECKS[prop](spec, compile_backend=compile_backend, documented_inf=documented_inf)
            except Exception as exc:  # noqa: BLE001 - reported as a failed property, cause chained
                what = str(exc) if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {exc}"
                raise AssertionError(f"check_loss: property {prop!r} failed for {spec.name!r}: {what}") from exc


# --------------------------------------------------------------------------------------
# python -m losses.testing <registry-name | module.path | file.py> ...
# --------------------------------------------------------------------------------------

_USAGE = """usage: python -m losses.testing [--properties P1,P2,...] TARGET [TARGET ...]

Run the contract checks (losses.testing.check_loss) on registry entries, one line per property.
TARGET is a registry name (e.g. focal), a module path (e.g. my_project.losses) or a .py file: the
module is imported, so that its losses.register calls run, and every entry it registers is checked
(for a module imported already, e.g. a library family, the entries whose function or module class
it defines). --properties: a comma-separated subset of {props} (default: all but compile).
Exit status: 0 when every property holds, 1 when one fails, 2 for a usage error."""


def _entries_of(target: str) -> List[str]:
    """The registry names ``target`` stands for: a registry name, or the entries a module (a dotted
    path or a ``.py`` file) registers when imported."""
    import importlib
    import importlib.util
    import os

    from ._registry import loss_names

    before = loss_names()
    if target in before:
        return [target]
    if target.endswith(".py"):
        if not os.path.isfile(target):
            raise ValueError(f"no such file (got {target!r}); pass a .py file, a module path or a registry name")
        mod_name = "_losses_testing_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(target))[0])
        file_spec = importlib.util.spec_from_file_location(mod_name, target)
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[mod_name] = module  # importable by name while it runs (pickle, dataclasses)
        file_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            if exc.name is None or not target.startswith(exc.name):
                raise  # the module exists and imports a missing one: show that
            raise ValueError(f"neither a registry name nor an importable module (got {target!r}); registry names: "
                             f"{before}") from None
    new = [n for n in loss_names() if n not in before]
    if new:
        return new
    from ._registry import list_losses

    own = [s.name for s in list_losses()
           if module.__name__ in (s.function.__module__, s.module.__module__)]
    if not own:
        raise ValueError(f"{target!r} registers no loss (none new after importing it, none defined in it); "
                         "call losses.register in it, or pass a registry name")
    return own


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m losses.testing TARGET ...``: check the entries, one ``PASS`` / ``FAIL`` line per
    property with its time; returns the exit status (0 all pass, 1 a failure, 2 a usage error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = _USAGE.format(props=", ".join(PROPERTIES))
    props: Sequence[str] = DEFAULT_PROPERTIES
    targets: List[str] = []
    while argv:
        arg = argv.pop(0)
        if arg in ("-h", "--help"):
            print(usage)
            return 0
        if arg == "--properties" or arg.startswith("--properties="):
            value = arg.split("=", 1)[1] if "=" in arg else (argv.pop(0) if argv else "")
            props = [p.strip() for p in value.split(",") if p.strip()]
            unknown = [p for p in props if p not in _CHECKS]
            if unknown or not props:
                print(f"losses.testing: unknown properties (got {unknown or value!r}); choose from {list(PROPERTIES)}",
                      file=sys.stderr)
                return 2
        elif arg.startswith("-"):
            print(f"losses.testing: unknown option {arg!r}\n{usage}", file=sys.stderr)
            return 2
        else:
            targets.append(arg)
    if not targets:
        print(usage, file=sys.stderr)
        return 2
    names: List[str] = []
    for target in targets:
        try:
            names += [n for n in _entries_of(target) if n not in names]
        except ValueError as exc:
            print(f"losses.testing: {exc}", file=sys.stderr)
            return 2
    failed = 0
    width = max(len(n) for n in names)
    for name in names:
        for prop in props:
            start = time.perf_counter()
            try:
                check_loss(name, properties=[prop])
            except AssertionError as exc:
                failed += 1
                what = str(exc).split(": ", 1)[-1] if str(exc).startswith("check_loss:") else str(exc)
                print(f"FAIL  {name:<{width}}  {prop:<16} {time.perf_counter() - start:6.2f} s  {what}", flush=True)
            else:
                print(f"PASS  {name:<{width}}  {prop:<16} {time.perf_counter() - start:6.2f} s", flush=True)
    total = len(names) * len(props)
    print(f"{total - failed} of {total} checks passed ({', '.join(names)})")
    return 1 if failed else 0


# The package imports this module (``losses.testing``) before ``python -m losses.testing`` runs
# the file again as ``__main__``; the command runs the imported module's ``main`` (one copy of the
# kit), so runpy's warning about the double import says nothing useful.
warnings.filterwarnings("ignore", message=r"'losses\.testing' found in sys\.modules", category=RuntimeWarning)

if __name__ == "__main__":
    from losses.testing import main as _main

    sys.exit(_main())
