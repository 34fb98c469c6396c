"""The library's own contract checks, for any registered loss: yours too.

:func:`check_loss` runs on one registry entry the checks that every built-in loss passes in the
project's contract tests (``tests/test_contract.py``), on the entry's example inputs
(``example_kwargs`` / ``example_inputs`` of :func:`losses.register`), and raises
:class:`AssertionError` naming the property and the entry that failed::

    >>> import losses
    >>> from losses.testing import check_loss
    >>> check_loss("cross_entropy", properties=["reductions", "all_ignored"])

The properties (:data:`PROPERTIES`):

* ``"reductions"``: ``"none"`` is 0 where the unit weight is 0, ``"sum" == Σ w·none`` and
  ``"mean" == Σ w·none / Σ w`` with the declared ``unit_weights`` (float64, rtol 1e-10); an
  unknown reduction is a ``ValueError``; batch-level losses (``unit="batch"``) accept only
  ``"mean"``.
* ``"all_ignored"``: every unit ignored gives an exact, graph-attached 0 with zero (not ``None``)
  gradients, also when the inputs hold ``±inf`` (under ``losses.validation(False)``).
* ``"finite"``: finite values and gradients on random, extreme (x1e4) and constant inputs
  (documented exact infinities: no NaN).
* ``"dtypes"``: fp16 / bf16 inputs give an fp32 loss equal to the fp32 result on the upcast
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
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from ._core import NO_SECOND_DERIVATIVE, ExperimentalWarning, validation
from ._registry import LossSpec, get_loss_spec

__all__ = [
    "check_loss", "PROPERTIES", "DEFAULT_PROPERTIES", "AUTOCAST_TOL", "MODEL_AUTOCAST_TOL", "build", "example", "call",
    "float_leaves",
]

#: Every property :func:`check_loss` knows, in the order it runs them.
PROPERTIES: Tuple[str, ...] = (
    "reductions", "all_ignored", "finite", "dtypes", "autocast", "module_function", "serialization",
    "double_backward", "compile",
)
#: What ``check_loss(name)`` runs when ``properties`` is ``None`` (``"compile"`` is opt-in: it is slow).
DEFAULT_PROPERTIES: Tuple[str, ...] = tuple(p for p in PROPERTIES if p != "compile")

#: Inside autocast the loss's maths runs in fp32 (as ``F.cross_entropy``): equal to the fp32 run
#: up to summation order; a model argument runs in bf16 itself, hence the wider tolerance.
AUTOCAST_TOL = {"rtol": 1e-5, "atol": 1e-6}
MODEL_AUTOCAST_TOL = {"rtol": 3e-2, "atol": 3e-2}


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
    for what, case_args in _reduction_cases(spec, args):
        _check_unit_weights(spec, case_args, kwargs, what)


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


def _check_unit_weights(spec: LossSpec, args: tuple, kwargs: dict, what: str) -> None:
    none = call(build(spec, reduction="none"), args, kwargs)
    total = call(build(spec, reduction="sum"), args, kwargs)
    mean = call(build(spec, reduction="mean"), args, kwargs)
    w = spec.unit_weights(*args, **{**spec.example_kwargs, **kwargs}).to(none.dtype)
    assert none.shape == w.shape, (
        f"{what}: 'none' output shape {tuple(none.shape)} != unit weights shape {tuple(w.shape)}")
    assert total.shape == () and mean.shape == (), (
        f"{what}: 'sum' / 'mean' not scalars: {tuple(total.shape)}, {tuple(mean.shape)}")
    assert bool(torch.all(none[w == 0] == 0)), (
        f"{what}: 'none' is not 0 where the unit weight is 0: {none[w == 0].tolist()}")
    _close(total, (w * none).sum(), f"{what}: 'sum' != sum(w * none)", rtol=1e-10, atol=1e-12)
    _close(mean, (w * none).sum() / w.sum(), f"{what}: 'mean' != sum(w * none) / sum(w)", rtol=1e-10, atol=1e-12)


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
