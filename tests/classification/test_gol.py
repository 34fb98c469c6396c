"""GOL (docs/losses/gol.md): loop oracle, gradcheck, gradient facts, variants, errors, validation."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch
import torch.nn.functional as F

import losses
from tests._helpers.rows import LOGITS, entry
from tests.classification._hints import raise_and_follow

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "gol": entry("gumbel_bce_loss", "GumbelBCELoss", LOGITS, unit="element"),
}
EXPECTED_HELPERS = ("gumbel_activation", "gumbel_prior_bias", "GOLLoss")

FLOOR = -50.0


# --------------------------------------------------------------------------------------
# fp64 loop oracles, written from the formulas (python floats, one element at a time): each
# element gives (value, d value / d q); the gradient is the analytic one of the same formula
# --------------------------------------------------------------------------------------


def _clamped(q, lo, hi):
    inside = True
    if lo is not None and q < lo:
        q, inside = lo, False
    if hi is not None and q > hi:
        q, inside = hi, False
    if q < FLOOR:
        q, inside = FLOOR, False
    return q, inside


def _paper_elem(q, y, lo, hi):
    q, inside = _clamped(q, lo, hi)
    u = math.exp(-q)
    if q <= 20.0:
        log1m = math.log(-math.expm1(-u))  # log(1 - eta)
        r = u * math.exp(-u) / (-math.expm1(-u))  # d/dq of -log(1 - eta)
    else:
        log1m = -q - u / 2
        r = 1 - u / 2
    value = y * u - (1 - y) * log1m
    grad = (-y * u + (1 - y) * r) if inside else 0.0
    return value, grad


def _reference_elem(q, y, lo, hi):
    # probability-space BCE as torch computes it: log terms clamped at -100, backward divides
    # by max(eta (1 - eta), 1e-12)
    q, inside = _clamped(q, lo, hi)
    u = math.exp(-q)
    eta = math.exp(-u)
    log_eta = max(math.log(eta), -100.0) if eta > 0 else -100.0
    log_1m = max(math.log(1 - eta), -100.0) if eta < 1 else -100.0
    value = -(y * log_eta + (1 - y) * log_1m)
    grad = (eta - y) / max(eta * (1 - eta), 1e-12) * eta * u if inside else 0.0
    return value, grad


def oracle(x, target, *, label_smoothing=0.0, variant="paper", clamp=None, weight=None, ignore_index=-100,
           reduction="mean"):
    """Returns (loss, gradient of loss.sum() w.r.t. x)."""
    n, c = x.shape[:2]
    xs = x.detach().reshape(n, c, -1).tolist()
    s = len(xs[0][0])
    soft = target.is_floating_point()
    ys = target.reshape(n, c, -1).tolist() if soft else None
    ts = None if soft else target.reshape(n, -1).tolist()
    if weight is None:
        ws = [[[1.0] * s for _ in range(c)] for _ in range(n)]
    elif weight.dim() == 1:
        ws = [[[float(weight[j])] * s for j in range(c)] for _ in range(n)]
    else:
        ws = weight.reshape(n, c, -1).tolist()
    if variant == "paper":
        lo, hi = clamp if clamp is not None else (None, None)
    else:
        lo, hi = clamp if clamp is not None else (-4.0, 10.0)
    elem = _paper_elem if variant == "paper" else _reference_elem
    vals = [[[0.0] * s for _ in range(c)] for _ in range(n)]
    grads = [[[0.0] * s for _ in range(c)] for _ in range(n)]
    count = 0
    for i in range(n):
        for k in range(s):
            if not soft and ts[i][k] == ignore_index:
                continue
            for j in range(c):
                y = ys[i][j][k] if soft else (1.0 if ts[i][k] == j else 0.0)
                y = y * (1 - label_smoothing) + label_smoothing / c
                v, g = elem(xs[i][j][k], y, lo, hi)
                vals[i][j][k] = v * ws[i][j][k]
                grads[i][j][k] = g * ws[i][j][k]
                count += 1
    v = torch.tensor(vals, dtype=torch.float64).reshape(x.shape)
    g = torch.tensor(grads, dtype=torch.float64).reshape(x.shape)
    if reduction == "none":
        if variant == "reference":
            g = torch.where((v >= 0) & (v <= 20), g, torch.zeros_like(g))
            v = v.clamp(0, 20)
        return v, g
    total = v.sum()
    if reduction == "mean":
        total = total / max(count, 1)
        g = g / max(count, 1)
    if variant == "reference" and not (0 <= float(total) <= 20):
        total, g = total.clamp(0, 20), torch.zeros_like(g)
    return total, g


def _inputs(shape, *, low=-4.0, high=6.0, seed=0, soft=False, ignore=True):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(shape, generator=g, dtype=torch.float64) * (high - low) + low).requires_grad_(True)
    n, c = shape[:2]
    if soft:
        t = torch.rand(shape, generator=g, dtype=torch.float64)
    else:
        t = torch.randint(0, c, (n,) + tuple(shape[2:]), generator=g)
        if ignore:
            t.view(-1)[1] = -100
    return x, t


def _check_against_oracle(x, t, rtol=1e-10, atol=1e-13, **kw):
    got = losses.gumbel_bce_loss(x, t, **kw)
    ref, g_ref = oracle(x, t, **kw)
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)
    g_got = torch.autograd.grad(got.sum(), x)[0]
    torch.testing.assert_close(g_got, g_ref, rtol=rtol, atol=atol)


# --------------------------------------------------------------------------------------
# value and gradient against the oracle
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 7), (5, 7, 3, 2)])
@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_paper_matches_oracle(shape, soft, reduction):
    x, t = _inputs(shape, low=-6.0, high=25.0, soft=soft)  # covers both branches (q > 20)
    _check_against_oracle(x, t, reduction=reduction)


@pytest.mark.parametrize("shape", [(5, 7), (5, 7, 3, 2)])
@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("weight_kind", [None, "class", "element"])
def test_paper_options_match_oracle(shape, soft, weight_kind):
    x, t = _inputs(shape, seed=1, soft=soft)
    g = torch.Generator().manual_seed(3)
    weight = None
    if weight_kind == "class":
        weight = torch.rand(shape[1], generator=g, dtype=torch.float64) + 0.5
    elif weight_kind == "element":
        weight = torch.rand(shape, generator=g, dtype=torch.float64) + 0.5
    for reduction in ("none", "mean", "sum"):
        for eps in (0.0, 0.1):
            for clamp in (None, (-2.0, 1.5), (-math.inf, math.inf)):
                _check_against_oracle(x, t, reduction=reduction, label_smoothing=eps, clamp=clamp, weight=weight)


@pytest.mark.parametrize("shape", [(5, 7), (5, 7, 3, 2)])
@pytest.mark.parametrize("soft", [False, True])
def test_reference_matches_oracle(shape, soft):
    # q in [-3.2, 12]: probability-space gradients are the analytic ones here (eta (1 - eta) > 1e-12),
    # q > 10 is clamped (zero gradient)
    x, t = _inputs(shape, low=-3.2, high=12.0, seed=2, soft=soft)
    weight = torch.linspace(0.5, 1.5, shape[1], dtype=torch.float64)
    for reduction in ("none", "mean", "sum"):
        for eps in (0.0, 0.2):
            _check_against_oracle(x, t, variant="reference", reduction=reduction, label_smoothing=eps)
        _check_against_oracle(x, t, variant="reference", reduction=reduction, weight=weight, clamp=(-3.0, 5.0))


def test_fp32_close_to_fp64():
    x, t = _inputs((5, 7, 3), low=-8.0, high=90.0, seed=4)  # beyond the fp32 cap (85) too
    for reduction in ("none", "sum"):
        ref = losses.gumbel_bce_loss(x, t, reduction=reduction)
        x32 = x.detach().float().requires_grad_(True)
        got = losses.gumbel_bce_loss(x32, t, reduction=reduction)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), ref.detach(), rtol=1e-5, atol=1e-6)
        g32 = torch.autograd.grad(got.sum(), x32)[0]
        g64 = torch.autograd.grad(ref.sum(), x)[0]
        torch.testing.assert_close(g32.double(), g64, rtol=1e-5, atol=1e-6)


def test_integer_fast_path_equals_dense_one_hot_path():
    """The sparse id path (plain one-hot, in-place kernel) against float one-hot targets (dense)."""
    x, t = _inputs((6, 9, 2), low=-60.0, high=800.0, seed=5, ignore=False)
    y = F.one_hot(t, 9).movedim(-1, 1).double()
    for reduction in ("none", "mean", "sum"):
        a = losses.gumbel_bce_loss(x, t, reduction=reduction)
        b = losses.gumbel_bce_loss(x, y, reduction=reduction)
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        ga = torch.autograd.grad(a.sum(), x)[0]
        gb = torch.autograd.grad(b.sum(), x)[0]
        torch.testing.assert_close(ga, gb, rtol=1e-12, atol=1e-12)


def test_ignored_rows():
    x, t = _inputs((4, 5), seed=6, ignore=False)
    t[2] = -100
    none = losses.gumbel_bce_loss(x, t, reduction="none")
    assert torch.all(none[2] == 0)
    mean = losses.gumbel_bce_loss(x, t)
    torch.testing.assert_close(mean, none.sum() / 15)  # 3 valid rows x 5 classes
    g = torch.autograd.grad(mean, x)[0]
    assert torch.all(g[2] == 0)
    # a custom ignore_index inside the usual id range
    t2 = t.clone()
    t2[2] = 255
    torch.testing.assert_close(losses.gumbel_bce_loss(x, t2, ignore_index=255), mean)


# An all-ignored batch ("mean" / "sum": an exact, graph-attached 0 with zero gradients): the
# contract's "all_ignored" property (tests/test_contract.py), with +-inf inputs too.


def test_empty_batch_and_one_class():
    x = torch.zeros(0, 4, requires_grad=True)
    out = losses.gumbel_bce_loss(x, torch.zeros(0, dtype=torch.long))
    assert out.item() == 0.0
    (g,) = torch.autograd.grad(out, x)
    assert g.shape == (0, 4)
    x1 = torch.randn(3, 1, dtype=torch.float64, requires_grad=True)
    t1 = torch.zeros(3, dtype=torch.long)
    _check_against_oracle(x1, t1, reduction="mean")


# --------------------------------------------------------------------------------------
# gradcheck (fp64, small odd shapes, away from the floor and clamp edges)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,c", [(1, 3), (3, 5)])
def test_gradcheck(n, c):
    g = torch.Generator().manual_seed(n * 10 + c)
    x = (torch.rand(n, c, 2, generator=g, dtype=torch.float64) * 10 - 3).requires_grad_(True)
    t = torch.randint(0, c, (n, 2), generator=g)
    y = torch.rand(n, c, 2, generator=g, dtype=torch.float64)
    w = torch.rand(c, generator=g, dtype=torch.float64) + 0.5
    for reduction in ("none", "mean", "sum"):
        for kw in ({}, {"label_smoothing": 0.1, "weight": w}, {"clamp": (-3.5, 7.5)}):
            for target in (t, y):
                assert torch.autograd.gradcheck(
                    lambda z: losses.gumbel_bce_loss(z, target, reduction=reduction, **kw), (x,))
        xr = (torch.rand(n, c, generator=g, dtype=torch.float64) * 11 - 2.5).requires_grad_(True)
        assert torch.autograd.gradcheck(
            lambda z: losses.gumbel_bce_loss(z, t[:, 0], variant="reference", reduction=reduction), (xr,))


def test_gradcheck_differentiable_weight():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(5, generator=g, dtype=torch.float64) + 0.5).requires_grad_(True)
    t = torch.tensor([0, 4, -100])
    assert torch.autograd.gradcheck(lambda a, b: losses.gumbel_bce_loss(a, t, weight=b), (x, w))
    # and it matches the non-differentiable-weight path
    ref = losses.gumbel_bce_loss(x, t, weight=w.detach())
    torch.testing.assert_close(losses.gumbel_bce_loss(x, t, weight=w), ref)


# --------------------------------------------------------------------------------------
# gradient facts (docs/losses/gol.md)
# --------------------------------------------------------------------------------------


def test_positive_target_value_and_gradient():
    q = torch.tensor([-40.0, -3.0, -0.5, 0.0, 2.0, 15.0, 30.0], dtype=torch.float64, requires_grad=True)
    x = q.view(-1, 1)
    out = losses.gumbel_bce_loss(x, torch.zeros(7, dtype=torch.long), reduction="none").view(-1)
    torch.testing.assert_close(out, torch.exp(-q), rtol=1e-13, atol=0)
    (g,) = torch.autograd.grad(out.sum(), q)
    torch.testing.assert_close(g, -torch.exp(-q.detach()), rtol=1e-13, atol=0)


def test_negative_target_gradient_tends_to_one():
    q = torch.tensor([-3.0, -1.0, 0.0, 1.0, 5.0, 20.0, 21.0, 50.0, 100.0, 1e4], dtype=torch.float64,
                     requires_grad=True)
    y = torch.zeros(10, 1, dtype=torch.float64)
    out = losses.gumbel_bce_loss(q.view(-1, 1), y, reduction="none").view(-1)
    (g,) = torch.autograd.grad(out.sum(), q)
    qd = q.detach()
    u = torch.exp(-qd)
    eta = torch.exp(-u)
    expected = u * eta / (-torch.expm1(-u))
    expected = torch.where(qd > 30, torch.ones_like(qd), expected)
    # accurate to a few ulp of u (relative accuracy degrades where the gradient is tiny)
    torch.testing.assert_close(g, expected, rtol=1e-12, atol=1e-15)
    assert g[-1] == 1.0 and g[-2] == 1.0
    # value: -log(1 - eta) = q + u/2 for large q, also beyond the internal caps (fp32 85, fp64 700)
    for dtype, big in ((torch.float64, [800.0, 1e4]), (torch.float32, [90.0, 1e4])):
        xb = torch.tensor(big, dtype=dtype).view(-1, 1)
        vb = losses.gumbel_bce_loss(xb, torch.zeros_like(xb), reduction="none").view(-1)
        torch.testing.assert_close(vb, xb.view(-1))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_negative_target_value_is_exact_in_float64_where_it_is_tiny(smoothing):
    """``-log(1 - eta)`` for a label 0 at negative logits is ``~eta = exp(-e^{-q})``, tiny but
    representable (6.2e-176 at q = -6): float64 gives it to 1e-12 relative, not 0 (``-expm1(-u)``
    rounds to 1 below q ~ -3.6), through the class-id and the dense-target paths."""
    q = [-1.0, -2.0, -3.0, -3.5, -3.7, -4.0, -6.0, 0.0, 0.3, 2.0]
    x = torch.tensor([q], dtype=torch.float64)
    truth = torch.tensor([[-math.log1p(-math.exp(-math.exp(-v))) for v in q]], dtype=torch.float64)
    ids = torch.tensor([len(q) - 1])  # the last class is the positive; the others have label eps/C
    y = torch.zeros_like(x)
    y[0, -1] = 1.0
    if smoothing:
        y = y * (1 - smoothing) + smoothing / len(q)
    expected = y * torch.exp(-x) + (1 - y) * truth
    for target in (ids, y):
        got = losses.gumbel_bce_loss(x, target, label_smoothing=smoothing if target is ids else 0.0,
                                     reduction="none")
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)


def test_activation_and_prior_bias():
    assert losses.gumbel_activation(torch.tensor(0.0, dtype=torch.float64)).item() == pytest.approx(math.exp(-1),
                                                                                                    rel=1e-15)
    q = torch.linspace(-60, 60, 301, dtype=torch.float64)
    eta = losses.gumbel_activation(q)
    assert torch.all(eta[1:] >= eta[:-1]) and eta[0] == 0 and eta[-1] == 1
    torch.testing.assert_close(eta[100:], torch.exp(-torch.exp(-q[100:])))
    # the loss is -y log eta - (1-y) log(1 - eta)
    x = torch.linspace(-2, 4, 12, dtype=torch.float64).view(3, 4)
    y = torch.rand(3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    e = losses.gumbel_activation(x)
    torch.testing.assert_close(losses.gumbel_bce_loss(x, y, reduction="none"),
                               -(y * torch.log(e) + (1 - y) * torch.log1p(-e)))
    # finite gradient far below the floor; half stays half
    z = torch.tensor([-1e4, 0.0], requires_grad=True)
    (gz,) = torch.autograd.grad(losses.gumbel_activation(z).sum(), z)
    assert torch.isfinite(gz).all() and gz[0] == 0
    assert losses.gumbel_activation(torch.zeros(2, dtype=torch.float16)).dtype == torch.float16
    for p in (1e-4, 0.01, 0.5, 0.9):
        b = losses.gumbel_prior_bias(p)
        assert losses.gumbel_activation(torch.tensor(b, dtype=torch.float64)).item() == pytest.approx(p, rel=1e-12)
    assert losses.gumbel_activation(torch.tensor(-2.0, dtype=torch.float64)).item() == pytest.approx(
        math.exp(-math.exp(2)))
    assert abs(losses.gumbel_activation(torch.tensor(-2.0)).item() - 6.2e-4) < 1e-5
    with pytest.raises(ValueError, match=r"^gumbel_prior_bias: prior must be"):
        losses.gumbel_prior_bias(1.0)
    with pytest.raises(ValueError, match=r"^gumbel_prior_bias: prior must be"):
        losses.gumbel_prior_bias(0.0)
    with pytest.raises(TypeError, match=r"^gumbel_activation: input must be a floating-point tensor"):
        losses.gumbel_activation(torch.tensor([1, 2]))


def test_floor_at_minus_fifty():
    q = torch.tensor([[-80.0, -1e4], [-49.0, -60.0]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([[1.0, 0.3], [1.0, 0.0]], dtype=torch.float64)
    for target in (y, torch.tensor([0, 0])):
        out = losses.gumbel_bce_loss(q, target, reduction="none", label_smoothing=0.0)
        (g,) = torch.autograd.grad(out.sum(), q)
        assert torch.isfinite(out).all()
        assert out[0, 0].item() == pytest.approx(math.exp(50.0), rel=1e-14)  # floored, y = 1
        assert g[0, 0] == 0 and g[0, 1] == 0 and g[1, 1] == 0
        assert g[1, 0].item() == pytest.approx(-math.exp(49.0) * (1.0 if target.dtype == torch.long else 1.0))
    # with smoothing the background targets are > 0: still zero gradient below the floor
    out = losses.gumbel_bce_loss(q, torch.tensor([1, 1]), label_smoothing=0.2, reduction="sum")
    (g,) = torch.autograd.grad(out, q)
    assert g[0, 0] == 0 and g[0, 1] == 0 and g[1, 1] == 0


def test_variants_agree_in_float64():
    g = torch.Generator().manual_seed(11)
    x = (torch.rand(6, 7, 3, generator=g, dtype=torch.float64) * 12.9 - 2.9).requires_grad_(True)
    t = torch.randint(0, 7, (6, 3), generator=g)
    y = torch.rand(6, 7, 3, generator=g, dtype=torch.float64)
    for target in (t, y):
        for reduction in ("none", "mean"):
            a = losses.gumbel_bce_loss(x, target, reduction=reduction)
            b = losses.gumbel_bce_loss(x, target, reduction=reduction, variant="reference")
            assert float(b.detach().max()) <= 20
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
            ga = torch.autograd.grad(a.sum(), x)[0]
            gb = torch.autograd.grad(b.sum(), x)[0]
            torch.testing.assert_close(ga, gb, rtol=0, atol=1e-6)


def test_reference_gradient_collapse_below_minus_3_3():
    """y = 1, q in (-4, -3.32): the reference gradient is eta/1e-12 times the analytic -e^{-q}."""
    for q0 in (-3.5, -3.9):
        x = torch.tensor([[q0, 5.0, 5.0, 5.0]], dtype=torch.float64, requires_grad=True)
        out = losses.gumbel_bce_loss(x, torch.tensor([0]), variant="reference")
        assert out.item() < 20
        (g,) = torch.autograd.grad(out, x)
        u = math.exp(-q0)
        eta = math.exp(-u)
        analytic = -u / 4
        # (torch's 1e-12 is a float32 constant: 9.99999996e-13)
        assert g[0, 0].item() == pytest.approx(analytic * eta / 1e-12, rel=1e-7)
        if q0 == -3.5:
            assert analytic / g[0, 0].item() == pytest.approx(240.9, rel=1e-3)
    # the paper variant keeps the analytic gradient
    x = torch.tensor([[-3.5, 5.0, 5.0, 5.0]], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(losses.gumbel_bce_loss(x, torch.tensor([0])), x)
    assert g[0, 0].item() == pytest.approx(-math.exp(3.5) / 4, rel=1e-13)


def test_reference_clamps():
    # logit clamp [-4, 10] (zero gradient outside) and the reduced value clamped to [0, 20]
    x = torch.tensor([[12.0, -6.0]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    out = losses.gumbel_bce_loss(x, y, variant="reference", reduction="none")
    u10 = math.exp(-10.0)
    assert out[0, 0].item() == pytest.approx(-math.log(-math.expm1(-u10)), rel=1e-9)
    (g,) = torch.autograd.grad(out.sum(), x)
    assert torch.all(g == 0)
    # clamp=(-inf, inf) disables it
    out2 = losses.gumbel_bce_loss(x, y, variant="reference", reduction="none", clamp=(-math.inf, math.inf))
    assert out2[0, 0].item() == pytest.approx(-math.log(-math.expm1(-math.exp(-12.0))), rel=1e-6)
    # a large reduced value is clamped to 20 (gradient 0)
    xb = torch.tensor([[-3.9, 0.0]], dtype=torch.float64, requires_grad=True)
    big = losses.gumbel_bce_loss(xb, torch.tensor([0]), variant="reference", reduction="sum")
    assert big.item() == 20.0
    assert torch.all(torch.autograd.grad(big, xb)[0] == 0)
    # paper variant: the same clamp override
    xp = torch.tensor([[12.0, -6.0]], dtype=torch.float64, requires_grad=True)
    outp = losses.gumbel_bce_loss(xp, y, reduction="none", clamp=(-4.0, 10.0))
    torch.testing.assert_close(outp, out)
    assert torch.all(torch.autograd.grad(outp.sum(), xp)[0] == 0)


def test_reference_under_autocast():
    x = torch.randn(4, 5)
    t = torch.tensor([0, 1, 2, 3])
    ref = losses.gumbel_bce_loss(x, t, variant="reference")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = losses.gumbel_bce_loss(x, t, variant="reference")
        out_p = losses.gumbel_bce_loss(x, t)
    assert out.dtype == torch.float32 and out_p.dtype == torch.float32
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(out_p, losses.gumbel_bce_loss(x, t))


def test_retain_graph_second_backward_and_no_double_backward():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 3, -100])
    for reduction in ("mean", "none"):
        out = losses.gumbel_bce_loss(x, t, reduction=reduction).sum()
        g1 = torch.autograd.grad(out, x, retain_graph=True)[0].clone()
        g2 = torch.autograd.grad(out * 2, x)[0]
        torch.testing.assert_close(g2, 2 * g1, rtol=1e-14, atol=0)
    out = losses.gumbel_bce_loss(x, t)
    with pytest.raises(RuntimeError, match=r"^gumbel_bce_loss: no second derivative"):  # never silently wrong
        torch.autograd.grad(out, x, create_graph=True)


def test_no_grad_input():
    x = torch.randn(3, 4)
    t = torch.tensor([0, 3, 1])
    with torch.no_grad():
        a = losses.gumbel_bce_loss(x, t)
    b = losses.gumbel_bce_loss(x.requires_grad_(True), t)
    torch.testing.assert_close(a, b.detach())


# --------------------------------------------------------------------------------------
# errors and validation
# --------------------------------------------------------------------------------------


def test_errors():
    fn = losses.gumbel_bce_loss
    x = torch.randn(4, 3)
    t = torch.tensor([0, 1, 2, 0])
    with pytest.raises(ValueError, match=r"^gumbel_bce_loss: label_smoothing must be finite"):
        fn(x, t, label_smoothing=1.0)
    with pytest.raises(ValueError, match=r"^gumbel_bce_loss: label_smoothing must be finite"):
        fn(x, t, label_smoothing=-0.1)
    with pytest.raises(ValueError, match=r"^gumbel_bce_loss: variant must be one of 'paper', 'reference'"):
        fn(x, t, variant="authors")
    for bad in ((1.0,), (2.0, 1.0), (0.0, 0.0), (math.nan, 1.0), ("a", 1.0), 3.0):
        with pytest.raises(ValueError, match=r"^gumbel_bce_loss: clamp must be a pair"):
            fn(x, t, clamp=bad)
    with pytest.raises(ValueError, match=r"^gumbel_bce_loss: reduction must be one of"):
        fn(x, t, reduction="elementwise_mean")
    with pytest.raises(TypeError, match=r"^gumbel_bce_loss: input must be a floating-point tensor"):
        fn(torch.ones(4, 3, dtype=torch.long), t)
    with pytest.raises(TypeError, match=r"^gumbel_bce_loss: target must hold integer class ids or float labels"):
        fn(x, t.bool())
    # one logit per element (no class dimension) takes float labels, not class ids
    with pytest.raises(TypeError, match=r"^gumbel_bce_loss: input of shape \(3,\) has no class dimension"):
        fn(torch.randn(3), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"^gumbel_bce_loss: integer target shape must be \(4,\)"):
        fn(x, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"^gumbel_bce_loss: float target must have the input's shape"):
        fn(x, torch.rand(4, 2))
    for variant in ("paper", "reference"):
        with pytest.raises(ValueError, match=r"^gumbel_bce_loss: target has class ids outside \[0, 3\)"):
            fn(x, torch.tensor([0, 1, 3, 0]), variant=variant)
        with pytest.raises(ValueError, match=r"^gumbel_bce_loss: target has class ids outside"):
            fn(x, torch.tensor([0, -1, 2, 0]), variant=variant)
        with pytest.raises(ValueError, match=r"^gumbel_bce_loss: target must lie in \[0, 1\]"):
            fn(x, torch.full((4, 3), 1.5), variant=variant)
        with pytest.raises(ValueError, match=r"^gumbel_bce_loss: target contains NaN"):
            fn(x, torch.full((4, 3), math.nan), variant=variant)
    for bad_value, what in ((math.nan, "1 NaN"), (math.inf, r"1 \+inf")):  # -inf: probability 0
        xb = x.clone()
        xb[1, 2] = bad_value
        with pytest.raises(ValueError, match=rf"^gumbel_bce_loss: input contains NaN or \+inf \(got {what}\)"):
            fn(xb, t)
    with pytest.raises(ValueError, match=r"^gumbel_bce_loss: weight must have shape \(3,\)"):
        fn(x, t, weight=torch.ones(4))
    with pytest.raises(ValueError, match=r"^gumbel_bce_loss: weight contains NaN"):
        fn(x, t, weight=torch.tensor([1.0, math.nan, 1.0]))
    with pytest.raises(ValueError, match=r"^GumbelBCELoss: label_smoothing must be finite"):
        losses.GumbelBCELoss(label_smoothing=1.0)
    with pytest.raises(ValueError, match=r"^GumbelBCELoss: clamp must be a pair"):
        losses.GumbelBCELoss(clamp=(1.0, 0.0))
    with pytest.raises(ValueError, match=r"^GumbelBCELoss: variant must be one of"):
        losses.GumbelBCELoss(variant="x")


def test_validation_off_skips_only_data_checks():
    x = torch.randn(4, 3)
    xb = x.clone()
    xb[0, 0] = math.nan
    with losses.validation(False):
        assert torch.isnan(losses.gumbel_bce_loss(xb, torch.tensor([0, 1, 2, 0])))
        losses.gumbel_bce_loss(x, torch.full((4, 3), 1.5))  # no range check
        out = losses.gumbel_bce_loss(x, torch.tensor([0, 1, 7, 0]))  # out-of-range id: undefined, no crash
        assert out.shape == ()
        # shape / hyperparameter checks still run
        with pytest.raises(ValueError, match="label_smoothing"):
            losses.gumbel_bce_loss(x, torch.tensor([0, 1, 2, 0]), label_smoothing=2.0)
        with pytest.raises(ValueError, match="integer target shape"):
            losses.gumbel_bce_loss(x, torch.tensor([0, 1]))


# --------------------------------------------------------------------------------------
# module
# --------------------------------------------------------------------------------------


def test_module():
    assert losses.GOLLoss is losses.GumbelBCELoss
    w = torch.tensor([1.0, 2.0, 0.5])
    m = losses.GumbelBCELoss(label_smoothing=0.1, variant="reference", clamp=(-3.0, 8.0), weight=w,
                             ignore_index=7, reduction="sum")
    r = repr(m)
    for s in ("label_smoothing=0.1", "variant='reference'", "clamp=(-3.0, 8.0)", "ignore_index=7",
              "reduction='sum'"):
        assert s in r
    x = torch.randn(4, 3, dtype=torch.float64)
    t = torch.tensor([0, 7, 2, 1])
    expected = losses.gumbel_bce_loss(x, t, label_smoothing=0.1, variant="reference", clamp=(-3.0, 8.0), weight=w,
                                      ignore_index=7, reduction="sum")
    torch.testing.assert_close(m(x, t), expected)
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        torch.testing.assert_close(other(x, t), expected)
    fresh = losses.GumbelBCELoss(label_smoothing=0.1, variant="reference", clamp=(-3.0, 8.0), weight=torch.ones(3),
                                 ignore_index=7, reduction="sum")
    fresh.load_state_dict(m.state_dict())
    torch.testing.assert_close(fresh(x, t), expected)
    assert isinstance(losses.create_loss("gol"), losses.GumbelBCELoss)
    spec = losses.get_loss_spec("gol")
    assert spec.arxiv == "2207.10936" and spec.unit == "element" and spec.inputs == ("input", "target")


# --------------------------------------------------------------------------------------
# one logit per element (no class dimension), as F.binary_cross_entropy_with_logits takes it
# --------------------------------------------------------------------------------------


def _gol_formula(x, y, w=None):
    """``y u - (1 - y) log(1 - exp(-u))``, ``u = exp(-x)``, in float64 from torch's own ops."""
    u = torch.exp(-x)
    v = y * u - (1 - y) * torch.log(-torch.expm1(-u))
    return v if w is None else v * w


@pytest.mark.parametrize("shape", [(), (7,), (3, 4, 5)], ids=["scalar", "N", "N_d1_d2"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("variant", ["paper", "reference"])
def test_float_labels_any_shape(shape, weighted, reduction, variant):
    """Float labels shaped like the logits, any shape: the formula in float64 (value and
    gradient), every element one unit; ``()`` / ``(N,)`` equal the same logits as ``(M, 1)``."""
    g = torch.Generator().manual_seed(8)
    x = (2 * torch.randn(shape, generator=g, dtype=torch.float64)).clamp(-2.5, 6.0)  # inside the reference clamp
    t = torch.rand(shape, generator=g, dtype=torch.float64)
    w = (torch.rand(shape, generator=g, dtype=torch.float64) + 0.1) if weighted else None
    xr = x.clone().requires_grad_(True)
    v = _gol_formula(xr, t, w)
    ref = v if reduction == "none" else (v.sum() if reduction == "sum" else v.sum() / max(v.numel(), 1))
    if variant == "reference":
        ref = ref.clamp(0.0, 20.0)  # the reference's clamp of the reduced (or element-wise) result
    (g_ref,) = torch.autograd.grad(ref.sum(), xr)
    for f in (lambda a, b: losses.gumbel_bce_loss(a, b, weight=w, reduction=reduction, variant=variant),
              losses.GumbelBCELoss(weight=w, reduction=reduction, variant=variant)):
        xa = x.clone().requires_grad_(True)
        out = f(xa, t)
        assert out.shape == ref.shape and out.dtype == torch.float64
        tol = 1e-12 if variant == "paper" else 1e-9  # the reference goes through probabilities
        torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
        (gx,) = torch.autograd.grad(out.sum(), xa)
        torch.testing.assert_close(gx, g_ref, rtol=tol * 10, atol=tol * 10)
    if len(shape) < 2:
        col = losses.gumbel_bce_loss(x.reshape(-1, 1), t.reshape(-1, 1), label_smoothing=0.1, reduction=reduction,
                                     variant=variant, weight=None if w is None else w.reshape(-1, 1))
        out = losses.gumbel_bce_loss(x, t, label_smoothing=0.1, reduction=reduction, variant=variant, weight=w)
        torch.testing.assert_close(out, col.reshape(out.shape), rtol=0, atol=0)


def test_one_logit_per_element_weight_and_errors():
    x = torch.randn(4, dtype=torch.float64)
    t = torch.rand(4, dtype=torch.float64)
    w1 = torch.tensor([3.0], dtype=torch.float64)  # the one channel's weight
    torch.testing.assert_close(losses.gumbel_bce_loss(x, t, weight=w1, reduction="sum"),
                               3.0 * _gol_formula(x, t).sum(), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"^gumbel_bce_loss: float target must have the input's shape \(4,\)"):
        losses.gumbel_bce_loss(x, t[:3])
    with pytest.raises(ValueError, match=r"^gumbel_bce_loss: weight must have the input's shape \(4,\) or "
                                         r"shape \(1,\)"):
        losses.gumbel_bce_loss(x, t, weight=torch.ones(2))
    with pytest.raises(ValueError, match=r"^gumbel_bce_loss: target must lie in \[0, 1\]"):
        losses.gumbel_bce_loss(x, t + 1)


def test_class_id_hint_works_when_followed():
    """Class ids with one logit per element: the hint casts 0/1 labels to the logits' dtype."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(6, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 2, (6,), generator=g)
    for f in (losses.gumbel_bce_loss, losses.GumbelBCELoss()):
        new_target = raise_and_follow(lambda: f(x, ids), TypeError, "target.to(input.dtype)", x, ids)
        torch.testing.assert_close(f(x, new_target), _gol_formula(x, ids.double()).mean(), rtol=1e-12, atol=1e-12)
