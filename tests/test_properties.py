"""Property-based test over the whole registry (docs/conventions.md, reliability rules).

For every registered loss Hypothesis draws a batch shape (N from 0, C from 1), a dtype (fp32, fp64,
bf16, fp16), a magnitude up to 1e4, masks (``-inf`` logits / scores, ``mask=``, ``neg_mask``),
ignored positions and, where the loss takes them, class weights and a few hyperparameters. Each
draw must give either

* a documented error: ``ValueError`` or ``TypeError`` whose message starts with ``"<function>:"``;
* or a finite value and finite gradients (in the inputs' own dtypes), except the documented exact
  infinities (comp-sum with tau < 1 overflowing to +inf, never NaN; a sparsemax-family target at
  ``-inf``, which the strategies never draw), with
  - the module equal to its functional form, and
  - ``"sum"`` / ``"mean"`` consistent with the registry's unit weights:
    ``sum == sum(w * none)``, ``mean == sum / sum(w)`` (0 when ``sum(w) == 0``).

Profiles: ``ci`` (default; derandomised, fixed examples, a couple of minutes single-process on two
CPU cores) and ``long`` (many more random examples), chosen with
``LOSSES_HYPOTHESIS_PROFILE=long``.
"""

from __future__ import annotations

import inspect
import math
import os

import pytest
import torch

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import losses  # noqa: F401
from tests.reliability_utils import (
    BY_NAME,
    CLASS_WEIGHTED,
    class_kwargs,
    LOGIT_POSITION_MASK,
    LOGIT_SOFTMAX,
    NAMES,
    assert_documented_error,
    build,
    call,
    float_leaves,
    function_of_module,
    grads_of,
    reductions_for,
)

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture,
             HealthCheck.filter_too_much]
settings.register_profile("ci", max_examples=50, derandomize=True, deadline=None, database=None,
                          print_blob=True, suppress_health_check=_SUPPRESS)
settings.register_profile("long", max_examples=400, deadline=None, print_blob=True,
                          suppress_health_check=_SUPPRESS)
PROFILE = os.environ.get("LOSSES_HYPOTHESIS_PROFILE", "ci")
if PROFILE not in ("ci", "long"):
    raise ValueError(f"test_properties: unknown LOSSES_HYPOTHESIS_PROFILE (got {PROFILE!r}); use 'ci' or 'long'")

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
MAGNITUDES = [1.0, 1e-2, 10.0, 1e2, 1e3, 1e4]
#: Logits losses with a ``mask=`` of positions (registry ``masks``): drawn on (N, C, H, W).
DICE = LOGIT_POSITION_MASK


class Case:
    """One drawn example: forward args / keywords, constructor keywords, and what it allows."""

    def __init__(self, args, fwd=None, ctor=None, may_be_inf=False):
        self.args = tuple(args)
        self.fwd = dict(fwd or {})
        self.ctor = dict(ctor or {})
        self.may_be_inf = may_be_inf


def _sizes(high):
    """Batch sizes 0..high, drawn uniformly (plain integers favour the 0 boundary), shrinking
    towards 3."""
    return st.sampled_from([3, 1, 2] + list(range(4, high + 1)) + [0])


def _values(g, shape, magnitude, dtype):
    x = torch.rand(shape, generator=g, dtype=torch.float64).mul_(2).sub_(1).mul_(magnitude)
    return x.to(dtype)


def _weight_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _ids(g, shape, c, p_ignore):
    t = torch.randint(0, max(c, 1), shape, generator=g)
    ignore = torch.rand(shape, generator=g) < p_ignore
    return t.masked_fill(ignore, -100)


def _draw_logits(data, spec, g, dtype, magnitude):
    name = spec.name
    n = data.draw(_sizes(6), label="N")
    c = data.draw(st.integers(1, 6), label="C")
    spatial = data.draw(st.sampled_from([(), (2,)]), label="spatial") if name not in DICE else ()
    ctor = class_kwargs(spec, c)  # per-class tensors the module needs (e.g. a class prior), for C classes
    fwd = {}
    if name in DICE:
        h, w = data.draw(st.integers(1, 3), label="H"), data.draw(st.integers(1, 3), label="W")
        x = _values(g, (n, c, h, w), magnitude, dtype)
        t = _ids(g, (n, h, w), c, data.draw(st.sampled_from([0.0, 0.3, 1.0]), label="p_ignore"))
        if data.draw(st.booleans(), label="mask"):
            fwd["mask"] = torch.rand((n, h, w), generator=g) < 0.7
        if "aggregate" in inspect.signature(spec.module.__init__).parameters:
            ctor["aggregate"] = data.draw(st.sampled_from(["dataset", "image", "class"]), label="aggregate")
    else:
        x = _values(g, (n, c) + spatial, magnitude, dtype)
        t = _ids(g, (n,) + spatial, c, data.draw(st.sampled_from([0.0, 0.3, 1.0]), label="p_ignore"))
        if name in LOGIT_SOFTMAX and data.draw(st.booleans(), label="neg_inf_mask"):
            mask = torch.rand(x.shape, generator=g) < 0.3
            # never on the target (a target at -inf is its own documented case)
            safe = t.clamp_min(0).unsqueeze(1)
            if n > 0:
                mask.scatter_(1, safe, False)
            x = x.masked_fill(mask, -math.inf)
    if name in CLASS_WEIGHTED and data.draw(st.booleans(), label="class_weight"):
        ctor["weight"] = (torch.rand(c, generator=g, dtype=torch.float64) * 2 + 0.05).to(_weight_dtype(dtype))
    may_be_inf = False
    if spec.documented_inf:  # registry: an exact +inf (never NaN) is documented on extreme inputs
        may_be_inf = True
        if "tau" in inspect.signature(spec.module.__init__).parameters:  # comp-sum: only for tau < 1
            tau = data.draw(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0]), label="tau")
            ctor["tau"] = tau
            may_be_inf = tau < 1  # exp((1 - tau) * ce) leaves the float range: +inf, never NaN
    return Case((x, t), fwd, ctor, may_be_inf)


def _draw_model(data, spec, g, dtype, magnitude):
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]), label="model_dtype")
    n = data.draw(_sizes(5), label="N")
    c = data.draw(st.integers(1, 5), label="C")
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, c)).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(_values(g, p.shape, min(magnitude, 1e2), dtype))
    x = torch.rand(n, 6, generator=g, dtype=torch.float64).to(dtype)
    t = _ids(g, (n,), c, data.draw(st.sampled_from([0.0, 0.3, 1.0]), label="p_ignore"))
    ctor = {"steps": 1, "seed": 0, "tau": data.draw(st.sampled_from([0.5, 1.0, 2.0]), label="tau")}
    return Case((model, x, t), {}, ctor, may_be_inf=ctor["tau"] < 1)


def _draw_embeddings(data, spec, g, dtype, magnitude):
    n = data.draw(_sizes(8), label="N")
    d = data.draw(st.integers(1, 6), label="D")
    c = data.draw(st.integers(1, 6), label="C")
    x = _values(g, (n, d), magnitude, dtype)
    if data.draw(st.booleans(), label="zero_row") and n > 0:
        x[0] = 0
    t = _ids(g, (n,), c, data.draw(st.sampled_from([0.0, 0.3, 1.0]), label="p_ignore"))
    ctor = {}
    if spec.owns_head:
        ctor = {"embedding_dim": d, "num_classes": c}
    return Case((x, t), {}, ctor)


def _draw_scores(data, spec, g, dtype, magnitude):
    b = data.draw(_sizes(5), label="B")
    l_ = data.draw(st.integers(1, 8), label="L")
    s = _values(g, (b, l_), magnitude, dtype)
    kind = data.draw(st.sampled_from(["bool", "ids"]), label="target_kind")
    if kind == "bool":
        target = torch.rand((b, l_), generator=g) < 0.3
        positives = target
    else:
        target = _ids(g, (b,), l_, data.draw(st.sampled_from([0.0, 0.3]), label="p_ignore"))
        positives = torch.zeros((b, l_), dtype=torch.bool)
        rows = torch.nonzero(target >= 0).flatten()
        positives[rows, target[rows]] = True
    fwd = {}
    how = data.draw(st.sampled_from(["none", "mask", "neg_inf"]), label="mask_kind")
    if how != "none":
        mask = (torch.rand((b, l_), generator=g) < 0.3) & ~positives
        if how == "mask":
            fwd["mask"] = mask
        else:
            s = s.masked_fill(mask, -math.inf)
    return Case((s, target), fwd, {})


def _draw_pairs(data, spec, g, dtype, magnitude):
    b = data.draw(_sizes(5), label="B")
    l_ = data.draw(st.integers(1, 6), label="L")
    mag = data.draw(st.sampled_from([1.0, magnitude]), label="pair_magnitude")
    pos = _values(g, (b,), mag, dtype)
    neg = _values(g, (b, l_), mag, dtype)
    fwd = {}
    if data.draw(st.booleans(), label="neg_mask"):
        fwd["neg_mask"] = torch.rand((b, l_), generator=g) < 0.6
    return Case((pos, neg), fwd, {})


DRAW = {"input": _draw_logits, "model": _draw_model, "embeddings": _draw_embeddings,
        "scores": _draw_scores, "pos_scores": _draw_pairs}


def _leafify(args):
    return tuple(a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point()
                 else a for a in args)


def _module(spec, case, reduction, dtype):
    module = build(spec, **{**case.ctor, "reduction": reduction})
    if dtype == torch.float64:
        module = module.to(torch.float64)
    return module


def _check_finite(spec, case, out, grads, leaves, fp32_grads):
    """Finite value and gradients (in the leaves' dtypes). A half-precision gradient may overflow
    to +-inf only where the same gradient computed on the fp32-upcast inputs is itself beyond
    the half range (the exact value cannot be represented; nothing to fix)."""
    if case.may_be_inf:
        assert not torch.isnan(out).any(), f"NaN value {out}"
        assert not (out == -math.inf).any(), f"-inf value {out}"
    else:
        assert torch.isfinite(out).all(), f"non-finite value {out}"
    if case.may_be_inf and spec.inputs[0] == "model":
        # tau < 1: the logits' gradient reaches +-inf or near the float32 maximum (never NaN; the
        # comp_sum entry checks that). Back through the user's model, +inf and -inf (or two
        # overflowing products) meet in the parameters' and inputs' gradients: NaN by arithmetic
        return
    ref = None
    for i, (leaf, gr) in enumerate(zip(leaves, grads)):
        if gr is None:
            continue
        assert gr.dtype == leaf.dtype, f"gradient in {gr.dtype} for a {leaf.dtype} leaf"
        if case.may_be_inf:
            assert not torch.isnan(gr).any(), "NaN gradient"
            continue
        bad = ~torch.isfinite(gr)
        if bad.any() and leaf.dtype in (torch.float16, torch.bfloat16):
            ref = fp32_grads() if ref is None else ref
            big = torch.finfo(leaf.dtype).max / 2
            r = ref[i]
            assert r is not None and torch.isfinite(r).all(), "non-finite fp32 gradient"
            assert torch.all(r[bad].abs() >= big), (
                f"{leaf.dtype} gradient overflowed where the fp32 gradient is representable: "
                f"{r[bad].tolist()}")
            continue
        assert not bad.any(), f"non-finite gradient for a {tuple(leaf.shape)} leaf"


def _tolerance(values):
    rtol = 1e-10 if values.dtype == torch.float64 else 2e-5
    return rtol


@pytest.mark.parametrize("name", NAMES)
@settings(settings.get_profile(PROFILE))
@given(data=st.data())
def test_registry_property(name, data):
    spec = BY_NAME[name]
    seed = data.draw(st.integers(0, 2 ** 31 - 1), label="seed")
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    magnitude = data.draw(st.sampled_from(MAGNITUDES), label="magnitude")
    g = torch.Generator().manual_seed(seed)
    case = DRAW[spec.inputs[0]](data, spec, g, dtype, magnitude)
    event(f"dtype {str(dtype).replace('torch.', '')}")
    if any(isinstance(a, torch.Tensor) and a.dim() > 0 and a.shape[0] == 0 for a in case.args):
        event("empty batch")
    if any(isinstance(a, torch.Tensor) and a.is_floating_point() and (a == -math.inf).any() for a in case.args):
        event("-inf entries")
    compute_dtype = torch.float64 if dtype == torch.float64 else torch.float32

    # 1. the "mean" call: a documented error, or a finite value and gradient
    args = _leafify(case.args)
    try:
        module = _module(spec, case, "mean", compute_dtype)
        out = call(module, args, case.fwd)
    except (ValueError, TypeError) as exc:
        assert_documented_error(spec, exc)
        event(f"documented {type(exc).__name__}")
        return
    event("value")
    assert out.shape == ()
    leaves = float_leaves(module, args)
    grads = grads_of(out, leaves)

    def fp32_grads():
        up = tuple(a.detach().float().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point()
                   and a.dtype in (torch.float16, torch.bfloat16) else a for a in case.args)
        up = _leafify(up)
        m = _module(spec, case, "mean", compute_dtype)
        o = call(m, up, case.fwd)
        return grads_of(o, float_leaves(m, up))

    _check_finite(spec, case, out, grads, leaves, fp32_grads)

    # 2. module == function (same inputs, the module's own tensors)
    expected = function_of_module(spec, module, args, case.fwd)
    if expected is not None:
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6, equal_nan=False)

    # 3. "sum" / "mean" consistent with the registry's unit weights
    if spec.unit_weights is None or "none" not in reductions_for(spec):
        return
    none = call(_module(spec, case, "none", compute_dtype), _leafify(case.args), case.fwd)
    total = call(_module(spec, case, "sum", compute_dtype), _leafify(case.args), case.fwd)
    w = spec.unit_weights(*case.args, **{**spec.example_kwargs, **case.ctor, **case.fwd}).to(torch.float64)
    assert none.shape == w.shape, (tuple(none.shape), tuple(w.shape))
    assert torch.all(none[w == 0] == 0), "'none' must be 0 where the unit weight is 0"
    if not torch.isfinite(none).all():
        assert case.may_be_inf and not torch.isnan(none).any()
        return
    nd = none.detach().double()
    total, out = float(total.detach()), float(out.detach())
    ref_sum = float((w * nd).sum())
    rtol = _tolerance(none)
    atol = rtol * float((w * nd.abs()).sum()) + 1e-12
    assert abs(total - ref_sum) <= atol + rtol * abs(ref_sum), (total, ref_sum)
    wsum = float(w.sum())
    if spec.weighted_mean and "weight" in case.ctor:
        # F.cross_entropy's class-weighted mean: "none" already carries weight[target], and the
        # mean divides by the summed weight of the valid targets
        t = case.args[1]
        valid = t != -100
        wsum = float(case.ctor["weight"].double()[t[valid]].sum())
    ref_mean = float(ref_sum) / wsum if wsum > 0 else 0.0
    matol = (atol / wsum if wsum > 0 else 0.0) + 1e-12
    assert abs(out - ref_mean) <= matol + rtol * abs(ref_mean), (out, ref_mean)
    if wsum == 0:
        assert out == 0.0 and total == 0.0
