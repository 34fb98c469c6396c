"""Contract tests run over every registered loss (docs/conventions.md, docs/contributing.md "How a loss is
tested"). A family joins them by registering; per-family maths lives in its own test file."""

from __future__ import annotations

import copy
import inspect
import io
import math
import pickle
import re
import warnings

import pytest
import torch

import losses
from losses._registry import INPUT_KINDS

SPECS = losses.list_losses()
NAMES = [s.name for s in SPECS]
BY_NAME = {s.name: s for s in SPECS}

#: Documented exact infinities (docs/conventions.md): comp-sum with tau < 1 overflows to +inf on
#: logits x1e4; the registry example uses tau = 0.5.
DOCUMENTED_INF = {"comp_sum"}

#: Every name the registry must hold (docs/conventions.md, Registry).
EXPECTED_NAMES = {
    # classification
    "z_loss", "logz_penalty", "sparsemax", "entmax15", "entmax_bisect", "comp_sum", "adversarial_comp_sum",
    "gol", "dice_semimetric", "jaccard_metric", "cross_entropy", "bce_with_logits", "soft_dice",
    # embedding and ranking
    "opl", "psl", "sampled_softmax", "bpr", "decoupled_softmax", "infonce", "soft_topk", "nbc_softmax",
    "wcdas", "margin_softmax", "cosine_softmax", "partial_fc",
    # many-class path (docs/losses/linear_cross_entropy.md)
    "linear_cross_entropy",
}


def build(spec, **overrides):
    kwargs = {**spec.example_kwargs, **overrides}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", losses.ExperimentalWarning)
        torch.manual_seed(0)
        return spec.create(**kwargs)


def example(spec, case="random", dtype=torch.float32, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    args, kwargs = spec.example_inputs(generator=g, dtype=dtype, case=case)
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point() and requires_grad:
            a = a.detach().clone().requires_grad_(True)
        out.append(a)
    return tuple(out), dict(kwargs)


def call(module, args, kwargs):
    # losses that draw from the global RNG (seed=None) are reproducible call to call
    torch.manual_seed(1234)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", losses.ExperimentalWarning)
        return module(*args, **kwargs)


def float_leaves(module, args):
    """Differentiable leaves: floating inputs and the loss's own parameters."""
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    leaves += [p for p in module.parameters() if p.requires_grad]
    return leaves


def grads_of(out, leaves):
    return torch.autograd.grad(out, leaves, allow_unused=True)


def reductions_for(spec):
    return ("mean",) if spec.unit == "batch" else ("none", "mean", "sum")


# --------------------------------------------------------------------------------------
# registry metadata
# --------------------------------------------------------------------------------------


def test_expected_names_registered():
    missing = EXPECTED_NAMES - set(NAMES)
    assert not missing, f"not registered: {sorted(missing)}"


@pytest.mark.parametrize("name", NAMES)
def test_registry_metadata(name):
    spec = BY_NAME[name]
    assert spec.inputs in INPUT_KINDS.values()
    assert spec.arxiv == "" or re.fullmatch(r"\d{4}\.\d{4,5}", spec.arxiv), spec.arxiv
    assert callable(spec.function) and isinstance(spec.module, type)
    assert issubclass(spec.module, torch.nn.Module)
    assert getattr(losses, spec.function.__name__) is spec.function
    assert getattr(losses, spec.module.__name__) is spec.module
    assert spec.function.__name__ in losses.functional.__all__
    # every constructor keyword spelled out (LightningCLI validates and prints them)
    for cls in (spec.module,):
        params = inspect.signature(cls.__init__).parameters.values()
        assert not any(p.kind is p.VAR_KEYWORD for p in params), f"{cls.__name__} takes **kwargs"
        assert not any(p.kind is p.VAR_POSITIONAL for p in params), f"{cls.__name__} takes *args"
    # function: reduction keyword-only with default "mean"
    sig = inspect.signature(spec.function)
    if "reduction" in sig.parameters:
        p = sig.parameters["reduction"]
        assert p.kind is p.KEYWORD_ONLY and p.default == "mean"
    if "ignore_index" in sig.parameters:
        assert sig.parameters["ignore_index"].default == -100
    assert spec.function.__doc__ and len(spec.function.__doc__) > 200, "docstring with formula and paper"
    if spec.arxiv:
        assert spec.arxiv in spec.function.__doc__ or spec.arxiv in (spec.module.__doc__ or ""), \
            "docstring cites the paper's arXiv id"
    assert spec.owns_head == hasattr(spec.module, "logits")
    module = build(spec)
    assert isinstance(module, spec.module)
    assert isinstance(losses.create_loss(name, **spec.example_kwargs), spec.module) if not spec.experimental else True


def test_unknown_name_is_a_clear_error():
    with pytest.raises(ValueError, match=r"^get_loss_spec: unknown loss name \(got 'nope'\)"):
        losses.create_loss("nope")


# --------------------------------------------------------------------------------------
# reductions and unit weights (the unit-weight rule, docs/conventions.md)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_reductions_follow_unit_weights(name):
    spec = BY_NAME[name]
    args, kwargs = example(spec, dtype=torch.float64)
    if spec.unit == "batch":
        out = call(build(spec, reduction="mean"), args, kwargs)
        assert out.shape == () and torch.isfinite(out)
        for bad in ("none", "sum"):
            with pytest.raises(ValueError, match="batch-level loss; only reduction='mean' is supported"):
                call(build(spec, reduction=bad), args, kwargs)
        return
    none = call(build(spec, reduction="none"), args, kwargs)
    total = call(build(spec, reduction="sum"), args, kwargs)
    mean = call(build(spec, reduction="mean"), args, kwargs)
    w = spec.unit_weights(*args, **{**spec.example_kwargs, **kwargs}).to(none.dtype)
    assert none.shape == w.shape, (none.shape, w.shape)
    assert total.shape == () and mean.shape == ()
    assert torch.all(none[w == 0] == 0)
    torch.testing.assert_close(total, (w * none).sum(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(mean, (w * none).sum() / w.sum(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_bad_reduction_is_a_clear_error(name):
    spec = BY_NAME[name]
    with pytest.raises(ValueError, match="reduction"):
        args, kwargs = example(spec)
        call(build(spec, reduction="elementwise_mean"), args, kwargs)


@pytest.mark.parametrize("name", NAMES)
def test_all_ignored_batch_is_attached_zero(name):
    spec = BY_NAME[name]
    module = build(spec)
    args, kwargs = example(spec, case="ignored")
    for reduction in reductions_for(spec):
        if reduction == "none":
            continue
        module = build(spec, reduction=reduction)
        out = call(module, args, kwargs)
        assert out.shape == ()
        assert out.item() == 0.0
        assert out.grad_fn is not None
        leaves = float_leaves(module, args)
        grads = grads_of(out, leaves)
        for leaf, g in zip(leaves, grads):
            assert g is not None, "zero (not None) gradients"
            assert torch.all(g == 0)


# --------------------------------------------------------------------------------------
# numerics (finite extremes, docs/conventions.md, half precision, docs/conventions.md)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["random", "extreme"])
@pytest.mark.parametrize("name", NAMES)
def test_finite_values_and_gradients(name, case):
    spec = BY_NAME[name]
    module = build(spec)
    args, kwargs = example(spec, case=case)
    out = call(module, args, kwargs)
    leaves = float_leaves(module, args)
    grads = grads_of(out, leaves)
    if case == "extreme" and name in DOCUMENTED_INF:
        assert not torch.isnan(out).any()
        assert all(g is None or not torch.isnan(g).any() for g in grads)
        return
    assert torch.isfinite(out).all(), out
    for g in grads:
        if g is not None:
            assert torch.isfinite(g).all()


@pytest.mark.parametrize("name", NAMES)
def test_constant_inputs_are_finite(name):
    """All-equal logits / zero features / equal scores (a zero-initialised head)."""
    spec = BY_NAME[name]
    module = build(spec)
    args, kwargs = example(spec)
    if spec.inputs[0] == "model":
        with torch.no_grad():
            for p in args[0].parameters():
                p.zero_()
    else:
        args = (torch.zeros_like(args[0]).requires_grad_(True),) + args[1:]
    out = call(module, args, kwargs)
    assert torch.isfinite(out).all()
    for g in grads_of(out, float_leaves(module, args)):
        if g is not None:
            assert torch.isfinite(g).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", NAMES)
def test_half_precision_matches_upcast_fp32(name, dtype):
    spec = BY_NAME[name]
    args, kwargs = example(spec, dtype=dtype)
    module = build(spec)
    if spec.inputs[0] == "model":
        # the model itself runs in half precision; the loss must still come back in float32
        out = call(module, args, kwargs)
        assert out.dtype == torch.float32 and torch.isfinite(out)
        return
    out = call(module, args, kwargs)
    assert out.dtype == torch.float32
    up = tuple(a.detach().float().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point()
               else a for a in args)
    up_kwargs = {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                 for k, v in kwargs.items()}
    ref = call(build(spec), up, up_kwargs)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    g_half = grads_of(out, [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad])
    for a, g in zip([a for a in args if isinstance(a, torch.Tensor) and a.requires_grad], g_half):
        if g is not None:
            assert g.dtype == a.dtype


@pytest.mark.parametrize("name", NAMES)
def test_float64_inputs_compute_in_float64(name):
    spec = BY_NAME[name]
    module = build(spec).to(torch.float64)
    for t in list(module.parameters()) + [b for b in module.buffers() if b.is_floating_point()]:
        assert t.dtype == torch.float64
    args, kwargs = example(spec, dtype=torch.float64)
    out = call(module, args, kwargs)
    assert out.dtype == torch.float64


# --------------------------------------------------------------------------------------
# modules (modules, docs/conventions.md)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [s.name for s in SPECS if not s.owns_head and s.inputs[0] != "model"])
def test_module_equals_function(name):
    spec = BY_NAME[name]
    args, kwargs = example(spec, dtype=torch.float64)
    fn_params = inspect.signature(spec.function).parameters
    fkw = {k: v for k, v in spec.example_kwargs.items() if k in fn_params}
    fkw.update(spec.function_kwargs)
    expected = spec.function(*args, **fkw, **kwargs)
    got = call(build(spec), args, kwargs)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_repr_deepcopy_pickle(name):
    spec = BY_NAME[name]
    module = build(spec)
    assert spec.module.__name__ in repr(module)
    copies = [copy.deepcopy(module), pickle.loads(pickle.dumps(module))]
    args, kwargs = example(spec)
    ref = call(module, args, kwargs)
    for other in copies:
        args2, kwargs2 = example(spec)
        torch.testing.assert_close(call(other, args2, kwargs2), ref, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip(name):
    spec = BY_NAME[name]
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
        leaves = float_leaves(m, args)
        results.append((out, grads_of(out, leaves)))
    for out, grads in results[1:]:
        torch.testing.assert_close(out, results[0][0], rtol=0, atol=0)
        for g, g0 in zip(grads, results[0][1]):
            if g0 is None:
                assert g is None
            else:
                torch.testing.assert_close(g, g0, rtol=0, atol=0)


# --------------------------------------------------------------------------------------
# torch.compile (device and compile, docs/conventions.md; once per registry entry with inductor, as docs/conventions.md CI sizing says)
# --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_torch_compile_inductor_matches_eager(name):
    spec = BY_NAME[name]
    torch._dynamo.reset()
    args, kwargs = example(spec)
    module = build(spec)
    with losses.validation(False):
        eager = call(module, args, kwargs)
        eager_grads = grads_of(eager, float_leaves(module, args))
        compiled = torch.compile(module, backend="inductor")
        args2, kwargs2 = example(spec)
        out = call(compiled, args2, kwargs2)
        grads = grads_of(out, float_leaves(module, args2))
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
    for g, g0 in zip(grads, eager_grads):
        if g0 is not None:
            torch.testing.assert_close(g, g0, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------------------
# validation switch (validation, docs/conventions.md)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [s.name for s in SPECS if s.inputs[0] not in ("model",)])
def test_nan_input_is_rejected_only_with_validation_on(name):
    spec = BY_NAME[name]
    args, kwargs = example(spec, requires_grad=False)
    first = args[0].clone()
    first.view(-1)[0] = math.nan
    bad = (first,) + args[1:]
    with pytest.raises(ValueError, match=r"^[a-z_0-9]+: .*NaN"):
        call(build(spec), bad, kwargs)
    with losses.validation(False):
        call(build(spec), bad, kwargs)  # no check, no exception


def test_create_loss_applies_registry_presets():
    """``cosine_softmax`` is margin softmax with the (1, 0, 0) margin even without example kwargs."""
    m = losses.create_loss("cosine_softmax", embedding_dim=8, num_classes=5)
    assert tuple(m.margin) == (1.0, 0.0, 0.0)
    m2 = losses.create_loss("cosine_softmax", embedding_dim=8, num_classes=5, margin=(1.0, 0.0, 0.2))
    assert tuple(m2.margin) == (1.0, 0.0, 0.2)
