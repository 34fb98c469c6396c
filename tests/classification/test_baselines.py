"""Baselines (docs/conventions.md "Baselines"): cross_entropy_loss and bce_with_logits_loss against float64
loop oracles, gradcheck, the all-ignored rule, errors and the validation switch."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch
import torch.nn.functional as F

import losses
from tests._helpers import LOGIT_SHAPES, REDUCTIONS, assert_gradcheck, logits_and_ids, logits_at, loop_reduce
from tests._helpers import position_shape, positions, value_and_grad
from tests._helpers.rows import LOGITS, entry
from tests.classification._hints import raise_and_follow

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "cross_entropy": entry("cross_entropy_loss", "CrossEntropyLoss", LOGITS, unit="position"),
    "bce_with_logits": entry("bce_with_logits_loss", "BCEWithLogitsLoss", LOGITS, unit="element"),
}


def _lse(vals):
    m = max(float(v.detach()) for v in vals if float(v.detach()) != -math.inf)
    return m + torch.log(sum(torch.exp(v - m) for v in vals))


# --------------------------------------------------------------------------------------
# cross-entropy loop oracle
# --------------------------------------------------------------------------------------


def ce_loop(x, target, *, label_smoothing=0.0, weight=None, ignore_index=-100, reduction="mean"):
    C = x.shape[1]
    w = [1.0] * C if weight is None else [float(v) for v in weight]
    eps = label_smoothing
    vals, denom = [], []
    soft = target.is_floating_point()
    for pos in positions(x):
        n, sp = pos[0], tuple(pos[1:])
        o = logits_at(x, pos)
        lse = _lse(o)
        lp = [ok - lse for ok in o]
        if soft:
            q = [target[(n, k) + sp] for k in range(C)]
            qs = [(1 - eps) * q[k] + eps / C for k in range(C)]
            vals.append(-sum(w[k] * qs[k] * lp[k] for k in range(C) if qs[k] != 0))
            denom.append(1.0)
            continue
        y = int(target[pos])
        if y == ignore_index:
            vals.append(torch.zeros((), dtype=torch.float64))
            denom.append(0.0)
            continue
        v = (1 - eps) * w[y] * (-lp[y])
        if eps > 0:
            v = v + eps / C * sum(w[k] * (-lp[k]) for k in range(C))
        vals.append(v)
        denom.append(w[y])
    # the values carry the class weight already: "sum" adds them, "mean" divides by the weights' sum
    return loop_reduce(vals, [1.0] * len(vals), position_shape(x), reduction, mean_weights=denom)


def _ce_inputs(shape, seed, *, ignore_some=True, soft=False):
    if not soft:
        return logits_and_ids(shape, seed, scale=2.0, ignore_at=0 if ignore_some else None)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    return x, torch.softmax(torch.randn(shape, generator=g, dtype=torch.float64), 1)


CLASS_WEIGHT = torch.tensor([0.5, 2.0, 1.0, 0.1, 3.0, 1.5, 0.7], dtype=torch.float64)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", LOGIT_SHAPES)
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("use_weight", [False, True])
def test_ce_hard_ids_match_loop_oracle(shape, reduction, smoothing, use_weight):
    x, t = _ce_inputs(shape, seed=1)
    w = CLASS_WEIGHT if use_weight else None
    up = None
    if reduction == "none":
        up = torch.rand((shape[0],) + shape[2:], generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    kw = dict(label_smoothing=smoothing, weight=w, reduction=reduction)
    out, g = value_and_grad(losses.cross_entropy_loss, x, t, weights=up, **kw)
    ref, g_ref = value_and_grad(ce_loop, x, t, weights=up, **kw)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)
    if reduction == "none":
        assert torch.all(out.view(-1)[0] == 0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", LOGIT_SHAPES)
@pytest.mark.parametrize("smoothing,use_weight", [(0.0, False), (0.3, True)])
def test_ce_soft_targets_match_loop_oracle(shape, reduction, smoothing, use_weight):
    x, q = _ce_inputs(shape, seed=2, soft=True)
    w = CLASS_WEIGHT if use_weight else None
    kw = dict(label_smoothing=smoothing, weight=w, reduction=reduction)
    out, g = value_and_grad(losses.cross_entropy_loss, x, q, **kw)
    ref, g_ref = value_and_grad(ce_loop, x, q, **kw)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


def test_ce_matches_torch_where_torch_is_defined():
    x, t = _ce_inputs((6, 7, 2), seed=3)
    for kw in ({}, {"label_smoothing": 0.1}, {"weight": CLASS_WEIGHT}, {"ignore_index": 2}):
        tt = t.clamp_min(0) if "ignore_index" in kw else t
        for reduction in ("none", "mean", "sum"):
            ours = losses.cross_entropy_loss(x, tt, reduction=reduction, **kw)
            theirs = F.cross_entropy(x, tt, reduction=reduction, **kw)
            torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-14)


def test_ce_custom_ignore_index_and_neg_inf_masks():
    x, t = _ce_inputs((6, 5), seed=4, ignore_some=False)
    t[1] = 3
    out = losses.cross_entropy_loss(x, t, ignore_index=3, reduction="none")
    ref = ce_loop(x, t, ignore_index=3, reduction="none")
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=0)
    assert out[1] == 0
    # -inf logits act as masks (the target's own logit stays finite)
    xm = x.clone()
    xm[:, 4] = -math.inf
    tm = t.clamp_max(3)
    out, g = value_and_grad(losses.cross_entropy_loss, xm, tm)
    ref, g_ref = value_and_grad(ce_loop, xm, tm)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-15)
    assert torch.all(g[:, 4] == 0)


def test_ce_all_ignored_is_zero_where_torch_gives_nan():
    x = torch.randn(4, 5, 2, dtype=torch.float64, requires_grad=True)
    t = torch.full((4, 2), -100)
    assert torch.isnan(F.cross_entropy(x, t))
    for kw in ({}, {"weight": CLASS_WEIGHT[:5]}, {"label_smoothing": 0.2}):
        for reduction in ("mean", "sum"):
            out = losses.cross_entropy_loss(x, t, reduction=reduction, **kw)
            assert out.item() == 0.0 and out.grad_fn is not None
            (g,) = torch.autograd.grad(out, [x])
            assert torch.equal(g, torch.zeros_like(x))
        assert torch.equal(losses.cross_entropy_loss(x, t, reduction="none", **kw), torch.zeros(4, 2, dtype=torch.float64))
    empty = torch.randn(0, 5, requires_grad=True)
    out = losses.cross_entropy_loss(empty, torch.zeros(0, dtype=torch.long))
    assert out.item() == 0.0


@pytest.mark.parametrize("shape", [(1, 3), (3, 5), (3, 5, 2)])
def test_ce_gradcheck(shape):
    x, t = _ce_inputs(shape, seed=5, ignore_some=False)
    x.requires_grad_(True)
    w = torch.linspace(0.5, 2.0, shape[1], dtype=torch.float64)
    assert_gradcheck(
        lambda a: losses.cross_entropy_loss(a, t, label_smoothing=0.1, weight=w, reduction="none"), x)
    assert_gradcheck(lambda a: losses.cross_entropy_loss(a, t, weight=w), x)
    _, q = _ce_inputs(shape, seed=6, soft=True)
    q.requires_grad_(True)
    assert_gradcheck(lambda a, b: losses.cross_entropy_loss(a, b, label_smoothing=0.2), x, q)


def test_ce_dtypes():
    # fp16 / bf16 inputs: the contract's "dtypes" property (tests/test_contract.py)
    x, t = _ce_inputs((4, 6), seed=7)
    x32 = x.float()
    assert losses.cross_entropy_loss(x32, t, weight=CLASS_WEIGHT[:6]).dtype == torch.float64
    torch.testing.assert_close(losses.cross_entropy_loss(x32, t.to(torch.int32)), losses.cross_entropy_loss(x32, t),
                               rtol=0, atol=0)


def test_ce_module():
    x, t = _ce_inputs((5, 7), seed=8)
    m = losses.CrossEntropyLoss(label_smoothing=0.1, weight=CLASS_WEIGHT, reduction="sum")
    assert torch.equal(m(x, t), losses.cross_entropy_loss(x, t, label_smoothing=0.1, weight=CLASS_WEIGHT,
                                                          reduction="sum"))
    assert "weight" in m.state_dict()
    assert m.to(torch.float32).weight.dtype == torch.float32
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert torch.equal(other(x, t), m(x, t))
    assert repr(m) == "CrossEntropyLoss(label_smoothing=0.1, ignore_index=-100, reduction='sum')"


def test_ce_errors():
    fn = losses.cross_entropy_loss
    x = torch.randn(3, 4)
    t = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=r"^cross_entropy_loss: label_smoothing must be finite and satisfy "
                                         r"label_smoothing >= 0.0 and label_smoothing <= 1.0 \(got 1.5\)"):
        fn(x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match=r"^cross_entropy_loss: label_smoothing must be finite"):
        fn(x, t, label_smoothing=-0.1)
    with pytest.raises(ValueError, match=r"^cross_entropy_loss: reduction must be one of"):
        fn(x, t, reduction="batchmean")
    with pytest.raises(ValueError, match=r"^cross_entropy_loss: input must have shape \(N, C\)"):
        fn(torch.randn(4), torch.tensor(1))
    with pytest.raises(ValueError, match=r"^cross_entropy_loss: weight must have shape \(4,\), one per class "
                                         r"\(got shape \(3,\)\)"):
        fn(x, t, weight=torch.ones(3))
    with pytest.raises(ValueError, match=r"^cross_entropy_loss: weight contains NaN"):
        fn(x, t, weight=torch.tensor([1.0, math.nan, 1.0, 1.0]))
    with pytest.raises(ValueError, match=r"^cross_entropy_loss: float target must have the input's shape"):
        fn(x, torch.rand(3, 5))
    with pytest.raises(TypeError, match=r"^cross_entropy_loss: target must hold integer class ids or float "
                                        r"probabilities \(got torch.bool\)"):
        fn(x, t > 0)
    with pytest.raises(TypeError, match=r"^cross_entropy_loss: input must be a floating-point tensor"):
        fn(x.long(), t)
    with pytest.raises(ValueError, match=r"^cross_entropy_loss: target shape must be \(3,\)"):
        fn(x, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"^cross_entropy_loss: target has class ids outside \[0, 4\) "
                                         r"\(got min=0, max=4\)"):
        fn(x, torch.tensor([0, 4, 1]))
    for bad in (math.nan, math.inf):
        xb = x.clone()
        xb[0, 0] = bad
        with pytest.raises(ValueError, match=r"^cross_entropy_loss: input contains NaN or \+inf"):
            fn(xb, t)
    with pytest.raises(ValueError, match=r"^cross_entropy_loss: target must lie in \[0, 1\]"):
        fn(x, torch.full((3, 4), 1.5))
    with pytest.raises(ValueError, match=r"^cross_entropy_loss: target contains NaN"):
        fn(x, torch.full((3, 4), math.nan))
    with pytest.raises(ValueError, match=r"^CrossEntropyLoss: label_smoothing must be finite"):
        losses.CrossEntropyLoss(label_smoothing=2.0)


def test_ce_validation_off_skips_only_data_checks():
    x = torch.randn(3, 4)
    t = torch.tensor([0, 1, 2])
    xb = x.clone()
    xb[0, 0] = math.nan
    with losses.validation(False):
        out = losses.cross_entropy_loss(xb, t, reduction="none")
        assert torch.isnan(out[0]) and torch.isfinite(out[1:]).all()
        q = torch.full((3, 4), 0.5)  # not a distribution and not checked
        torch.testing.assert_close(losses.cross_entropy_loss(x, q), F.cross_entropy(x, q))
        with pytest.raises(ValueError, match="label_smoothing"):
            losses.cross_entropy_loss(x, t, label_smoothing=3.0)
        with pytest.raises(ValueError, match="weight must have shape"):
            losses.cross_entropy_loss(x, t, weight=torch.ones(2))
    with pytest.raises(ValueError, match="target must lie in"):
        losses.cross_entropy_loss(x, torch.full((3, 4), 1.5))


# --------------------------------------------------------------------------------------
# binary cross-entropy
# --------------------------------------------------------------------------------------


def bce_loop(x, target, *, label_smoothing=0.0, weight=None, ignore_index=-100, reduction="mean"):
    C = x.shape[1]
    vals, units = [], []
    for pos in positions(x):
        n, sp = pos[0], tuple(pos[1:])
        if target.is_floating_point():
            ys = [target[(n, k) + sp] for k in range(C)]
            keep = True
        else:
            y = int(target[pos])
            keep = y != ignore_index
            ys = [1.0 if k == y else 0.0 for k in range(C)]
        for k in range(C):
            idx = (n, k) + sp
            if not keep:
                vals.append(torch.zeros((), dtype=torch.float64))
                units.append(0.0)
                continue
            yk = ys[k] * (1 - label_smoothing) + label_smoothing / C
            o = x[idx]
            v = -(yk * F.logsigmoid(o) + (1 - yk) * F.logsigmoid(-o))
            if weight is not None:
                v = v * (weight[k] if weight.dim() == 1 else weight[idx])
            vals.append(v)
            units.append(1.0)
    if reduction == "none":
        # loop order above is (position, class); rearrange to the input layout
        out = torch.stack(vals).reshape((x.shape[0],) + tuple(x.shape[2:]) + (C,))
        return out.movedim(-1, 1)
    total = sum(vals, torch.zeros((), dtype=torch.float64))
    if reduction == "sum":
        return total
    return total / sum(units) if sum(units) > 0 else total * 0


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", LOGIT_SHAPES)
@pytest.mark.parametrize("target_kind", ["ids", "float"])
@pytest.mark.parametrize("smoothing,weight_kind", [(0.0, None), (0.2, "class"), (0.1, "element")])
def test_bce_matches_loop_oracle(shape, reduction, target_kind, smoothing, weight_kind):
    g = torch.Generator().manual_seed(10)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    if target_kind == "ids":
        t = torch.randint(0, shape[1], (shape[0],) + shape[2:], generator=g)
        t.view(-1)[1] = -100
    else:
        t = torch.rand(shape, generator=g, dtype=torch.float64)
        t[0] = (t[0] > 0.5).double()  # some hard multi-hot labels too
    w = None
    if weight_kind == "class":
        w = CLASS_WEIGHT
    elif weight_kind == "element":
        w = torch.rand(shape, generator=g, dtype=torch.float64) + 0.5
    up = torch.rand(shape, generator=g, dtype=torch.float64) if reduction == "none" else None
    kw = dict(label_smoothing=smoothing, weight=w, reduction=reduction)
    out, gr = value_and_grad(losses.bce_with_logits_loss, x, t, weights=up, **kw)
    ref, g_ref = value_and_grad(bce_loop, x, t, weights=up, **kw)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gr, g_ref, rtol=1e-10, atol=1e-12)


def test_bce_matches_torch_on_float_targets():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4, 5, 3, generator=g, dtype=torch.float64)
    y = torch.rand(4, 5, 3, generator=g, dtype=torch.float64)
    for reduction in ("none", "mean", "sum"):
        torch.testing.assert_close(losses.bce_with_logits_loss(x, y, reduction=reduction),
                                   F.binary_cross_entropy_with_logits(x, y, reduction=reduction),
                                   rtol=1e-12, atol=1e-14)


def test_weighted_mean_helper_is_the_formula():
    """The one class-weighted reduction of the softmax losses (losses._core.reduce_weighted_values):
    "none" = w·l (0 where ignored), "sum" = Σ w·l, "mean" = Σ w·l / Σ w, and an exact attached 0
    with zero gradients when every unit is ignored."""
    from losses._core import reduce_weighted_values

    g = torch.Generator().manual_seed(12)
    l = torch.rand(7, generator=g, dtype=torch.float64)
    w = torch.rand(7, generator=g, dtype=torch.float64)
    w[2] = 0.0  # an ignored unit
    lr = l.clone().requires_grad_(True)
    wl = w * lr
    assert reduce_weighted_values(wl, w, "none") is wl
    torch.testing.assert_close(reduce_weighted_values(wl, w, "sum"), (w * l).sum(), rtol=0, atol=0)
    mean = reduce_weighted_values(wl, w, "mean")
    torch.testing.assert_close(mean, (w * l).sum() / w.sum(), rtol=1e-15, atol=0)
    (gl,) = torch.autograd.grad(mean, lr)
    torch.testing.assert_close(gl, w / w.sum(), rtol=1e-15, atol=0)
    zero_w = torch.zeros(7, dtype=torch.float64)
    lr = l.clone().requires_grad_(True)
    out = reduce_weighted_values(zero_w * lr, zero_w, "mean")
    assert out.item() == 0.0 and out.grad_fn is not None
    (gl,) = torch.autograd.grad(out, lr)
    assert torch.all(gl == 0)


# --------------------------------------------------------------------------------------
# BCE without a class dimension, as F.binary_cross_entropy_with_logits
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (7,), (3, 4, 5)], ids=["scalar", "N", "N_d1_d2"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_bce_any_shape_equals_torch(shape, weighted, reduction):
    """Float labels shaped like the logits, any shape: the value and both gradients (logits and
    labels) of F.binary_cross_entropy_with_logits in float64, the reduction over every element;
    the function and the module alike."""
    g = torch.Generator().manual_seed(3)
    x = 4 * torch.randn(shape, generator=g, dtype=torch.float64)
    t = torch.rand(shape, generator=g, dtype=torch.float64)
    w = (torch.rand(shape, generator=g, dtype=torch.float64) + 0.1) if weighted else None
    xr, tr = x.clone().requires_grad_(True), t.clone().requires_grad_(True)
    ref = F.binary_cross_entropy_with_logits(xr, tr, weight=w, reduction=reduction)
    ref_g = torch.autograd.grad(ref.sum(), (xr, tr))
    for f in (lambda a, b: losses.bce_with_logits_loss(a, b, weight=w, reduction=reduction),
              losses.BCEWithLogitsLoss(weight=w, reduction=reduction)):
        xa, ta = x.clone().requires_grad_(True), t.clone().requires_grad_(True)
        out = f(xa, ta)
        assert out.shape == ref.shape and out.dtype == torch.float64
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
        for got, want in zip(torch.autograd.grad(out.sum(), (xa, ta)), ref_g):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_bce_one_logit_per_sample_weight_smoothing_and_dtypes():
    g = torch.Generator().manual_seed(4)
    x = 3 * torch.randn(6, generator=g, dtype=torch.float64)
    t = torch.randint(0, 2, (6,), generator=g).double()
    # a (1,) weight is the one channel's weight, broadcast as torch does
    w1 = torch.tensor([2.5], dtype=torch.float64)
    for reduction in REDUCTIONS:
        torch.testing.assert_close(losses.bce_with_logits_loss(x, t, weight=w1, reduction=reduction),
                                   F.binary_cross_entropy_with_logits(x, t, weight=w1, reduction=reduction),
                                   rtol=0, atol=1e-12)
    # each element is one channel (C = 1), as for (N, 1): smoothing maps y -> y (1 - eps) + eps
    for reduction in REDUCTIONS:
        out = losses.bce_with_logits_loss(x, t, label_smoothing=0.2, reduction=reduction)
        as_column = losses.bce_with_logits_loss(x[:, None], t[:, None], label_smoothing=0.2, reduction=reduction)
        torch.testing.assert_close(out, as_column.reshape(out.shape), rtol=0, atol=0)
        torch.testing.assert_close(out, F.binary_cross_entropy_with_logits(x, 0.8 * t + 0.2, reduction=reduction),
                                   rtol=0, atol=1e-12)
    # half logits and labels are computed (and returned) in float32, as elsewhere
    out = losses.bce_with_logits_loss(x.half(), t.half())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, F.binary_cross_entropy_with_logits(x.half().float(), t.float()),
                               rtol=1e-6, atol=1e-6)
    # an empty batch: the library's exact, attached 0 (torch gives NaN for the mean)
    xe = torch.zeros(0, requires_grad=True)
    out = losses.bce_with_logits_loss(xe, torch.zeros(0))
    assert float(out.detach()) == 0.0
    out.backward()
    assert xe.grad.shape == (0,)


def test_bce_one_logit_per_sample_errors():
    fn = losses.bce_with_logits_loss
    x = torch.randn(4)
    with pytest.raises(ValueError, match=r"^bce_with_logits_loss: float target must have the input's shape \(4,\)"):
        fn(x, torch.rand(3))
    with pytest.raises(ValueError, match=r"^bce_with_logits_loss: weight must have the input's shape \(4,\) or "
                                         r"shape \(1,\)"):
        fn(x, torch.rand(4), weight=torch.ones(2))
    with pytest.raises(ValueError, match=r"^bce_with_logits_loss: target must lie in \[0, 1\]"):
        fn(x, torch.tensor([0.0, 1.0, 2.0, 0.0]))
    with pytest.raises(TypeError, match=r"^bce_with_logits_loss: input of shape \(4,\) has no class dimension"):
        fn(x, torch.tensor([True, False, True, True]))


def test_bce_class_id_hint_works_when_followed():
    """Class ids with one logit per sample: the hint casts 0/1 labels to the logits' dtype."""
    g = torch.Generator().manual_seed(5)
    for shape in [(5,), ()]:
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        t = torch.randint(0, 2, shape, generator=g)
        for f in (losses.bce_with_logits_loss, losses.BCEWithLogitsLoss()):
            out = raise_and_follow(lambda: f(x, t), TypeError, "target.to(input.dtype)", x, t)
            out = f(x, out)  # the hint is the target to pass
            torch.testing.assert_close(out, F.binary_cross_entropy_with_logits(x, t.double()), rtol=0, atol=1e-12)


@pytest.mark.parametrize("fn", ["cross_entropy_loss", "focal_loss", "comp_sum_loss", "logit_adjusted_loss"])
@pytest.mark.parametrize("shape", [(6, 1), (3, 1, 2, 2)], ids=["N_1", "N_1_d1_d2"])
def test_single_class_hint_works_when_followed(fn, shape):
    """One logit per sample given to a softmax loss: the hint's BCE call runs on the same tensors and
    is F.binary_cross_entropy_with_logits of the 0/1 labels."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    t = torch.randint(0, 2, (shape[0],) + shape[2:], generator=g)
    extra = (torch.ones(1),) if fn == "logit_adjusted_loss" else ()
    code = "losses.bce_with_logits_loss(input.squeeze(1), target.to(input.dtype))"
    out = raise_and_follow(lambda: getattr(losses, fn)(x, t, *extra), ValueError, code, x, t)
    torch.testing.assert_close(out, F.binary_cross_entropy_with_logits(x.squeeze(1), t.double()), rtol=0, atol=1e-12)


def test_missing_class_dim_hints_work_when_followed():
    """Logits without a class dimension given to a softmax loss: each case's hint, applied."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, generator=g, dtype=torch.float64)
    ce = losses.cross_entropy_loss
    # one sample's C logits and its id: a batch dimension on both
    t = torch.tensor(3)
    both = ("input.unsqueeze(0)", "target.unsqueeze(0)")
    for f in (ce, losses.focal_loss, losses.comp_sum_loss):
        xb, tb = raise_and_follow(lambda: f(x, t), ValueError, both, x, t)
        torch.testing.assert_close(f(xb, tb), f(x[None], t[None]))
    torch.testing.assert_close(ce(xb, tb), F.cross_entropy(x[None], t[None]))
    # one sample's distribution over C classes: the same
    q = torch.softmax(torch.randn(5, generator=g, dtype=torch.float64), 0)
    xb, qb = raise_and_follow(lambda: ce(x, q), ValueError, both, x, q)
    torch.testing.assert_close(ce(xb, qb), F.cross_entropy(x[None], q[None]))
    # one logit per sample with 0/1 ids: the binary loss
    ids = torch.randint(0, 2, (5,), generator=g)
    for f in (ce, losses.focal_loss, losses.comp_sum_loss, losses.CrossEntropyLoss()):
        out = raise_and_follow(lambda: f(x, ids), ValueError,
                               "losses.bce_with_logits_loss(input, target.to(input.dtype))", x, ids)
        torch.testing.assert_close(out, F.binary_cross_entropy_with_logits(x, ids.double()), rtol=0, atol=1e-12)


def test_bce_extreme_logits():
    x = torch.tensor([[1e4, -1e4, 0.0]], requires_grad=True)
    out = losses.bce_with_logits_loss(x, torch.tensor([1]), reduction="none")
    torch.testing.assert_close(out, torch.tensor([[1e4, 1e4, math.log(2)]]), rtol=1e-6, atol=1e-6)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    # an all-ignored batch: the contract's "all_ignored" property (tests/test_contract.py)


@pytest.mark.parametrize("shape", [(1, 3), (3, 5), (3, 5, 2)])
def test_bce_gradcheck(shape):
    g = torch.Generator().manual_seed(12)
    x = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.rand(shape, generator=g, dtype=torch.float64).clamp(0.05, 0.95).requires_grad_(True)
    w = (torch.rand(shape, generator=g, dtype=torch.float64) + 0.5).requires_grad_(True)
    assert_gradcheck(
        lambda a, b, c: losses.bce_with_logits_loss(a, b, weight=c, label_smoothing=0.1, reduction="none"), x, y, w)
    t = torch.randint(0, shape[1], (shape[0],) + shape[2:], generator=g)
    assert_gradcheck(lambda a: losses.bce_with_logits_loss(a, t), x)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("shape", [(5, 4), (3, 4, 2)])
def test_bce_learnt_class_weights_get_the_oracles_gradient(shape, smoothing, reduction):
    """Integer ids with a reduced output take the fused path; ``(C,)`` class weights that require grad
    get the loop oracle's gradient there too (as in the elementwise path), an all-ignored batch exact
    zeros (not ``None``)."""
    g = torch.Generator().manual_seed(13)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    t = torch.randint(0, shape[1], (shape[0],) + shape[2:], generator=g)
    t.view(-1)[1] = -100
    w = (torch.rand(shape[1], generator=g, dtype=torch.float64) + 0.5).requires_grad_(True)
    xs = x.clone().requires_grad_(True)
    kw = dict(label_smoothing=smoothing, reduction=reduction)
    gx, gw = torch.autograd.grad(losses.bce_with_logits_loss(xs, t, weight=w, **kw), [xs, w])
    rx, rw = torch.autograd.grad(bce_loop(xs, t, weight=w, **kw), [xs, w])
    torch.testing.assert_close(gx, rx, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gw, rw, rtol=1e-10, atol=1e-12)
    assert_gradcheck(lambda a, c: losses.bce_with_logits_loss(a, t, weight=c, **kw), xs, w)
    gx, gw = torch.autograd.grad(losses.bce_with_logits_loss(xs, torch.full_like(t, -100), weight=w, **kw), [xs, w])
    assert torch.equal(gw, torch.zeros_like(w)) and torch.equal(gx, torch.zeros_like(x))


def test_bce_module():
    g = torch.Generator().manual_seed(13)
    x = torch.randn(4, 5, generator=g)
    t = torch.randint(0, 5, (4,), generator=g)
    # fp16 inputs: the contract's "dtypes" property (tests/test_contract.py)
    m = losses.BCEWithLogitsLoss(label_smoothing=0.1, weight=torch.ones(5) * 2)
    assert torch.equal(m(x, t), losses.bce_with_logits_loss(x, t, label_smoothing=0.1, weight=torch.ones(5) * 2))
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert torch.equal(other(x, t), m(x, t))


def test_bce_errors_and_validation():
    fn = losses.bce_with_logits_loss
    x = torch.randn(3, 4)
    t = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=r"^bce_with_logits_loss: label_smoothing must be finite and satisfy "
                                         r"label_smoothing >= 0.0 and label_smoothing < 1.0 \(got 1.0\)"):
        fn(x, t, label_smoothing=1.0)
    with pytest.raises(TypeError, match=r"^bce_with_logits_loss: target must hold integer class ids or float "
                                        r"labels in \[0, 1\] \(got torch.bool\)"):
        fn(x, torch.ones(3, 4, dtype=torch.bool))
    # float labels shaped like the ids are the wrong kind (TypeError); other float shapes are ValueError
    with pytest.raises(TypeError, match=r"^bce_with_logits_loss: target has the shape of class ids \(3,\)"):
        fn(x, torch.rand(3))
    with pytest.raises(ValueError, match=r"^bce_with_logits_loss: float target must have the input's shape"):
        fn(x, torch.rand(3, 5))
    with pytest.raises(ValueError, match=r"^bce_with_logits_loss: integer target shape must be \(3,\)"):
        fn(x, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"^bce_with_logits_loss: target has class ids outside \[0, 4\)"):
        fn(x, torch.tensor([0, 1, 5]))
    with pytest.raises(ValueError, match=r"^bce_with_logits_loss: weight must have shape \(4,\) or the input's shape"):
        fn(x, t, weight=torch.ones(2))
    with pytest.raises(ValueError, match=r"^bce_with_logits_loss: target must lie in \[0, 1\]"):
        fn(x, torch.full((3, 4), -0.5))
    # one logit per element (no class dimension) takes float labels, not class ids
    with pytest.raises(TypeError, match=r"^bce_with_logits_loss: input of shape \(3,\) has no class dimension"):
        fn(torch.randn(3), torch.tensor([0, 1, 2]))
    for bad in (math.nan, math.inf):  # -inf is probability 0 (tested in test_reliability.py)
        xb = x.clone()
        xb[1, 1] = bad
        with pytest.raises(ValueError, match=r"^bce_with_logits_loss: input contains NaN or \+inf"):
            fn(xb, t)
    with pytest.raises(ValueError, match=r"^BCEWithLogitsLoss: label_smoothing must be finite"):
        losses.BCEWithLogitsLoss(label_smoothing=1.0)
    xb = x.clone()
    xb[1, 1] = math.nan
    with losses.validation(False):
        out = fn(xb, t, reduction="none")
        assert torch.isnan(out[1, 1]) and torch.isfinite(out[0]).all()
        fn(x, torch.full((3, 4), -0.5))  # unchecked
        with pytest.raises(ValueError, match="integer target shape"):
            fn(x, torch.tensor([0, 1]))
