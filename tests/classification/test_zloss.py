"""Z-loss (docs/losses/z_loss.md) and the PaLM log-Z penalty (docs/losses/z_loss.md): loop oracles, gradcheck, the gradient
facts, edge cases, errors and the validation switch."""

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

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "z_loss": entry("z_loss", "ZLoss", LOGITS, unit="position"),
    "logz_penalty": entry("cross_entropy_with_logz_penalty", "CrossEntropyWithLogZPenalty", LOGITS, unit="position"),
}
EXPECTED_HELPERS = ("logz_penalty",)

# --------------------------------------------------------------------------------------
# float64 loop oracles written straight from the formulas
# --------------------------------------------------------------------------------------


def zloss_loop(x, t, *, a=1.0, b=0.0, eps=1e-6, ignore_index=-100, reduction="mean"):
    vals, ws = [], []
    C = x.shape[1]
    for pos in positions(x):
        c = int(t[pos])
        if c == ignore_index:
            vals.append(torch.zeros((), dtype=torch.float64))
            ws.append(0.0)
            continue
        o = logits_at(x, pos)
        mu = sum(o) / C
        v = sum((ok - mu) ** 2 for ok in o) / C
        sigma = torch.sqrt(v + eps)
        z_c = (o[c] - mu) / sigma
        arg = a * (b - z_c)
        vals.append(torch.log1p(torch.exp(arg)) / a)
        ws.append(1.0)
    return loop_reduce(vals, ws, position_shape(x), reduction)


def logz_loop(x, t=None, *, coef=1e-4, ignore_index=-100, mask=None, reduction="mean", with_ce=True):
    vals, ws, pens = [], [], []
    for pos in positions(x):
        o = logits_at(x, pos)
        m = max(float(ok.detach()) for ok in o)
        lse = m + torch.log(sum(torch.exp(ok - m) for ok in o))
        keep = True
        if with_ce:
            c = int(t[pos])
            keep = c != ignore_index
        elif mask is not None:
            keep = bool(mask[pos])
        if not keep:
            vals.append(torch.zeros((), dtype=torch.float64))
            pens.append(torch.zeros((), dtype=torch.float64))
            ws.append(0.0)
            continue
        pen = coef * lse ** 2
        vals.append((lse - o[c] + pen) if with_ce else pen)
        pens.append(pen)
        ws.append(1.0)
    shape = position_shape(x)
    return loop_reduce(vals, ws, shape, reduction), loop_reduce(pens, ws, shape, reduction)


def _inputs(shape, seed, *, ignore_some=True, scale=2.0, dtype=torch.float64):
    return logits_and_ids(shape, seed, scale=scale, ignore_at=1 if ignore_some else None, dtype=dtype)



# --------------------------------------------------------------------------------------
# Z-loss: oracle, gradcheck
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", LOGIT_SHAPES)
@pytest.mark.parametrize("abe", [(1.0, 0.0, 1e-6), (2.5, 1.3, 1e-3), (0.7, -0.5, 0.25)])
def test_zloss_matches_loop_oracle_fp64(shape, reduction, abe):
    a, b, eps = abe
    x, t = _inputs(shape, seed=1)
    w = torch.rand((shape[0],) + shape[2:], generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    weights = w if reduction == "none" else None
    out, g = value_and_grad(losses.z_loss, x, t, a=a, b=b, eps=eps, reduction=reduction, weights=weights)
    ref, g_ref = value_and_grad(zloss_loop, x, t, a=a, b=b, eps=eps, reduction=reduction, weights=weights)
    assert out.dtype == torch.float64 and out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


def test_zloss_fp32_matches_fp64_oracle():
    x, t = _inputs((5, 7, 3), seed=2, dtype=torch.float32)
    out, g = value_and_grad(losses.z_loss, x, t, a=1.5, b=0.5)
    ref, g_ref = value_and_grad(zloss_loop, x.double(), t, a=1.5, b=0.5)
    assert out.dtype == torch.float32 and g.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-5, atol=1e-6)


def test_zloss_custom_ignore_index():
    x, t = _inputs((6, 5), seed=3, ignore_some=False)
    t[0] = 2
    t[3] = 2
    out = losses.z_loss(x, t, ignore_index=2, reduction="none")
    ref = zloss_loop(x, t, ignore_index=2, reduction="none")
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=0)
    assert out[0] == 0 and out[3] == 0
    n_valid = int((t != 2).sum())
    assert 0 < n_valid <= 4
    torch.testing.assert_close(losses.z_loss(x, t, ignore_index=2), ref.sum() / n_valid, rtol=1e-12, atol=0)


@pytest.mark.parametrize("shape", [(1, 3), (3, 5), (3, 5, 2)])
@pytest.mark.parametrize("abe", [(1.0, 0.0, 1e-6), (2.0, 0.8, 0.1)])
def test_zloss_gradcheck(shape, abe):
    a, b, eps = abe
    x, t = _inputs(shape, seed=4, ignore_some=False)
    x.requires_grad_(True)
    for reduction in ("sum", "none"):
        assert_gradcheck(
            lambda inp: losses.z_loss(inp, t, a=a, b=b, eps=eps, reduction=reduction), x)


def test_zloss_double_backward_is_refused():
    x, t = _inputs((3, 5), seed=5)
    x.requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"^z_loss: no second derivative"):
        torch.autograd.grad(losses.z_loss(x, t), [x], create_graph=True)


# --------------------------------------------------------------------------------------
# Z-loss: gradient facts (docs/losses/z_loss.md)
# --------------------------------------------------------------------------------------


def _z_stats(x, t, eps):
    C = x.shape[1]
    mu = x.mean(1, keepdim=True)
    v = ((x - mu) ** 2).mean(1, keepdim=True)
    sigma = torch.sqrt(v + eps)
    z = (x - mu) / sigma
    z_c = z.gather(1, t[:, None])
    return C, mu, v, sigma, z, z_c


@pytest.mark.parametrize("abe", [(1.0, 0.0, 1e-6), (3.0, 2.0, 0.5), (0.5, -1.0, 2.0)])
def test_zloss_closed_form_gradient(abe):
    a, b, eps = abe
    x, t = _inputs((6, 7), seed=6, ignore_some=False)
    _, g = value_and_grad(losses.z_loss, x, t, a=a, b=b, eps=eps, reduction="sum")
    C, mu, v, sigma, z, z_c = _z_stats(x, t, eps)
    s = torch.sigmoid(a * (b - z_c))
    delta = F.one_hot(t, C).double()
    expected = -s * ((delta - 1.0 / C) / sigma - z_c * z / (C * sigma))
    torch.testing.assert_close(g, expected, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("eps", [1e-6, 0.3, 5.0])
def test_zloss_gradient_rows_sum_to_zero_and_radial_identity(eps):
    a, b = 1.7, 0.4
    x, t = _inputs((8, 9), seed=7, ignore_some=False)
    _, g = value_and_grad(losses.z_loss, x, t, a=a, b=b, eps=eps, reduction="sum")
    torch.testing.assert_close(g.sum(1), torch.zeros(8, dtype=torch.float64), rtol=0, atol=1e-13)
    C, mu, v, sigma, z, z_c = _z_stats(x, t, eps)
    radial = (g * (x - mu)).sum(1, keepdim=True)
    expected = -torch.sigmoid(a * (b - z_c)) * z_c * eps / (v + eps)
    torch.testing.assert_close(radial, expected, rtol=1e-9, atol=1e-14)
    if eps >= 0.3:  # the identity is not trivially ~0 here
        assert expected.abs().max() > 1e-3


@pytest.mark.parametrize("lam,beta", [(3.0, 0.0), (0.2, 7.5), (1.0, -1e3), (50.0, 12.0)])
def test_zloss_shift_and_scale_invariance(lam, beta):
    x, t = _inputs((5, 6, 2), seed=8)
    for eps, rtol in ((1e-14, 1e-9), (1e-6, 1e-4)):
        base = losses.z_loss(x, t, a=2.0, b=0.5, eps=eps, reduction="none")
        moved = losses.z_loss(lam * x + beta, t, a=2.0, b=0.5, eps=eps, reduction="none")
        torch.testing.assert_close(moved, base, rtol=rtol, atol=1e-12)
    # gradients scale as 1/lambda (chain rule of an invariant function)
    _, g0 = value_and_grad(losses.z_loss, x, t, eps=1e-14, reduction="sum")
    _, g1 = value_and_grad(losses.z_loss, lam * x + beta, t, eps=1e-14, reduction="sum")
    torch.testing.assert_close(g1 * lam, g0, rtol=1e-7, atol=1e-9)


def test_zloss_scale_invariance_breaks_when_v_is_below_eps():
    x, t = _inputs((4, 5), seed=9, ignore_some=False)
    tiny = losses.z_loss(1e-9 * x, t, reduction="none")  # v ~ 1e-18 << eps: z -> 0, L -> log 2
    torch.testing.assert_close(tiny, torch.full_like(tiny, math.log(2.0)), rtol=1e-5, atol=0)
    base = losses.z_loss(x, t, reduction="none")
    assert (tiny - base).abs().min() > 0.05  # far from the scale-invariant value


@pytest.mark.parametrize("a,b", [(1.0, 0.0), (2.0, 1.5), (0.5, -3.0), (4.0, 10.0)])
@pytest.mark.parametrize("C", [3, 7])
def test_zloss_all_equal_logits(a, b, C):
    eps = 1e-6
    x = torch.full((4, C), 0.37, dtype=torch.float64)
    t = torch.tensor([0, 1, C - 1, 2])
    out, g = value_and_grad(losses.z_loss, x, t, a=a, b=b, eps=eps, reduction="sum")
    expected = math.log1p(math.exp(a * b)) / a
    torch.testing.assert_close(out, torch.tensor(4 * expected, dtype=torch.float64), rtol=1e-12, atol=0)
    # z = 0: dL/do_k = -sigmoid(ab) (delta_kc - 1/C) / sqrt(eps), finite and O(eps^-1/2)
    s = 1.0 / (1.0 + math.exp(-a * b))
    expected_g = -s * (F.one_hot(t, C).double() - 1.0 / C) / math.sqrt(eps)
    assert torch.isfinite(g).all()
    torch.testing.assert_close(g, expected_g, rtol=1e-9, atol=0)


def test_zloss_default_zero_head_is_log2_fp32():
    x = torch.zeros(3, 10, requires_grad=True)
    out = losses.z_loss(x, torch.tensor([1, 2, 3]))
    assert out.dtype == torch.float32
    assert abs(float(out.detach()) - math.log(2.0)) < 1e-6
    out.backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().max() > 1.0  # of order eps^-1/2


@pytest.mark.parametrize("C", [3, 5, 10])
def test_zloss_target_z_score_is_at_most_sqrt_c_minus_1(C):
    # a one-hot logit vector attains z_c = sqrt(C - 1): the largest possible target z-score
    x = torch.zeros(1, C, dtype=torch.float64)
    x[0, 0] = 4.0
    a, b = 1.0, math.sqrt(C - 1)
    out = losses.z_loss(x, torch.tensor([0]), a=a, b=b, eps=1e-15)
    torch.testing.assert_close(out, torch.tensor(math.log(2.0), dtype=torch.float64), rtol=1e-9, atol=0)
    # random logits never exceed it
    xr, tr = _inputs((200, C), seed=C, ignore_some=False)
    _, _, _, _, _, z_c = _z_stats(xr, tr, 0.0)
    assert float(z_c.max()) <= math.sqrt(C - 1) + 1e-12


def test_zloss_extreme_logits_finite_fp32():
    x, t = _inputs((6, 5), seed=10, dtype=torch.float32)
    out, g = value_and_grad(losses.z_loss, x * 1e4, t)
    ref = zloss_loop(x.double() * 1e4, t)
    assert torch.isfinite(out) and torch.isfinite(g).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)


def test_zloss_integer_target_dtypes():
    # fp16 / bf16 / float64 inputs: the contract's "dtypes" property (tests/test_contract.py)
    x, t = _inputs((4, 6), seed=11, dtype=torch.float32)
    t32 = t.to(torch.int32)
    torch.testing.assert_close(losses.z_loss(x, t32), losses.z_loss(x, t), rtol=0, atol=0)


def test_zloss_all_ignored_none_and_empty_batch():
    # "mean" / "sum" of an all-ignored batch: the contract's "all_ignored" property
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    t = torch.full((4,), -100)
    none = losses.z_loss(x, t, reduction="none")
    assert torch.equal(none, torch.zeros(4, dtype=torch.float64))
    empty = torch.randn(0, 5, requires_grad=True)
    out = losses.z_loss(empty, torch.zeros(0, dtype=torch.long))
    assert out.item() == 0.0
    (g,) = torch.autograd.grad(out, [empty])
    assert g.shape == (0, 5)


def test_zloss_one_class_batch():
    x, _ = _inputs((6, 4), seed=12)
    t = torch.full((6,), 3)
    out, g = value_and_grad(losses.z_loss, x, t)
    ref, g_ref = value_and_grad(zloss_loop, x, t)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=0)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-14)


def test_zloss_module():
    x, t = _inputs((5, 7, 2), seed=13)
    m = losses.ZLoss(a=2.0, b=0.3, eps=1e-4, reduction="sum", ignore_index=-1)
    t2 = t.clone()
    t2[t2 == -100] = -1
    torch.testing.assert_close(m(x, t2), losses.z_loss(x, t2, a=2.0, b=0.3, eps=1e-4, reduction="sum",
                                                       ignore_index=-1), rtol=0, atol=0)
    assert repr(m) == "ZLoss(a=2.0, b=0.3, eps=0.0001, ignore_index=-1, reduction='sum')"
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        torch.testing.assert_close(other(x, t2), m(x, t2), rtol=0, atol=0)
    assert isinstance(losses.create_loss("z_loss"), losses.ZLoss)


# --------------------------------------------------------------------------------------
# Z-loss: errors and the validation switch
# --------------------------------------------------------------------------------------


C2_MESSAGE = ("z_loss: needs at least 3 classes (got C=2); with C=2 the target z-score is always ±1, so the "
              "loss is constant and its gradient zero — use binary_cross_entropy_with_logits")


def test_zloss_two_classes_message_exact():
    with pytest.raises(ValueError) as info:
        losses.z_loss(torch.randn(4, 2), torch.tensor([0, 1, 0, 1]))
    assert str(info.value) == C2_MESSAGE
    with pytest.raises(ValueError, match=r"^z_loss: needs at least 3 classes \(got C=1\)"):
        losses.z_loss(torch.randn(4, 1), torch.zeros(4, dtype=torch.long))
    with losses.validation(False):  # a shape check, not a data check
        with pytest.raises(ValueError, match=r"^z_loss: needs at least 3 classes"):
            losses.z_loss(torch.randn(4, 2, 3), torch.zeros(4, 3, dtype=torch.long))


@pytest.mark.parametrize("kw,pattern", [
    ({"a": 0.0}, r"^z_loss: a must be finite and satisfy a > 0"),
    ({"a": -1.0}, r"^z_loss: a must be finite and satisfy a > 0"),
    ({"a": math.nan}, r"^z_loss: a must be finite"),
    ({"eps": 0.0}, r"^z_loss: eps must be finite and satisfy eps > 0"),
    ({"eps": -1e-6}, r"^z_loss: eps must be finite and satisfy eps > 0"),
    ({"b": math.inf}, r"^z_loss: b must be finite"),
    ({"reduction": "batchmean"}, r"^z_loss: reduction must be one of"),
])
def test_zloss_bad_hyperparameters(kw, pattern):
    with pytest.raises(ValueError, match=pattern):
        losses.z_loss(torch.randn(3, 4), torch.tensor([0, 1, 2]), **kw)
    module_kw = {k: v for k, v in kw.items()}
    with pytest.raises(ValueError, match=pattern.replace("z_loss", "ZLoss")):
        losses.ZLoss(**module_kw)


def test_zloss_bad_inputs():
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match=r"^z_loss: target must hold integer class ids \(got torch.float32\)"):
        losses.z_loss(x, torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(TypeError, match=r"^z_loss: target must hold integer class ids \(got torch.bool\)"):
        losses.z_loss(x, torch.tensor([True, False, True]))
    with pytest.raises(TypeError, match=r"^z_loss: input must be a floating-point tensor"):
        losses.z_loss(torch.ones(3, 4, dtype=torch.long), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"^z_loss: input must have shape \(N, C\)"):
        losses.z_loss(torch.randn(4), torch.tensor(0))
    with pytest.raises(ValueError, match=r"^z_loss: target shape must be \(3,\)"):
        losses.z_loss(x, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"^z_loss: target has class ids outside \[0, 4\) \(got min=0, max=4\)"):
        losses.z_loss(x, torch.tensor([0, 4, 1]))
    with pytest.raises(ValueError, match=r"^z_loss: target has class ids outside \[0, 4\) \(got min=-1"):
        losses.z_loss(x, torch.tensor([-1, 2, 1]))
    for bad, what in ((math.nan, "1 NaN"), (math.inf, r"1 \+inf"), (-math.inf, "1 -inf")):
        xb = x.clone()
        xb[1, 2] = bad
        with pytest.raises(ValueError, match=rf"^z_loss: input contains NaN or infinite values \(got {what}\)"):
            losses.z_loss(xb, torch.tensor([0, 1, 2]))


def test_zloss_validation_off_skips_only_data_checks():
    x = torch.randn(3, 4)
    xb = x.clone()
    xb[0, 0] = math.nan
    t = torch.tensor([0, 1, 2])
    with losses.validation(False):
        out = losses.z_loss(xb, t, reduction="none")  # no data check: NaN propagates to its row
        assert torch.isnan(out[0]) and torch.isfinite(out[1:]).all()
        with pytest.raises(TypeError):
            losses.z_loss(x, t.float())
        with pytest.raises(ValueError, match="a must be finite"):
            losses.z_loss(x, t, a=0.0)
        with pytest.raises(ValueError, match="target shape"):
            losses.z_loss(x, t[:2])
    with pytest.raises(ValueError, match="NaN"):
        losses.z_loss(xb, t)


# --------------------------------------------------------------------------------------
# log-Z penalty (docs/losses/z_loss.md)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", LOGIT_SHAPES)
@pytest.mark.parametrize("coef", [0.0, 1e-4, 0.3])
def test_ce_logz_matches_loop_oracle(shape, reduction, coef):
    x, t = _inputs(shape, seed=20, scale=4.0)
    x = x + 3.0  # log Z well away from 0 so the penalty matters
    w = torch.rand((shape[0],) + shape[2:], generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    weights = w if reduction == "none" else None
    out, g = value_and_grad(losses.cross_entropy_with_logz_penalty, x, t, coef=coef, reduction=reduction,
                            weights=weights)
    ref, g_ref = value_and_grad(lambda *a, **k: logz_loop(*a, **k)[0], x, t, coef=coef, reduction=reduction,
                                weights=weights)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)
    loss, pen = losses.cross_entropy_with_logz_penalty(x, t, coef=coef, reduction=reduction, return_penalty=True)
    ref_loss, ref_pen = logz_loop(x, t, coef=coef, reduction=reduction)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(pen, ref_pen, rtol=1e-10, atol=1e-12)


def test_ce_logz_with_zero_coef_is_cross_entropy():
    x, t = _inputs((5, 7, 3), seed=21)
    for reduction in REDUCTIONS:
        out, g = value_and_grad(losses.cross_entropy_with_logz_penalty, x, t, coef=0.0, reduction=reduction)
        ref, g_ref = value_and_grad(F.cross_entropy, x, t, reduction=reduction)
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("coef", [1e-4, 0.05, 2.0])
def test_ce_logz_gradient_fact(coef):
    x, t = _inputs((6, 8), seed=22, ignore_some=False, scale=3.0)
    x = x - 4.0  # negative log Z too, so (1 + 2 kappa log Z) can change sign at coef=2
    _, g = value_and_grad(losses.cross_entropy_with_logz_penalty, x, t, coef=coef, reduction="sum")
    lse = torch.logsumexp(x, 1, keepdim=True)
    expected = (1 + 2 * coef * lse) * torch.softmax(x, 1) - F.one_hot(t, 8).double()
    torch.testing.assert_close(g, expected, rtol=1e-10, atol=1e-13)


def test_ce_logz_penalty_output_is_differentiable():
    x, t = _inputs((4, 5), seed=23, ignore_some=False)
    x.requires_grad_(True)
    _, pen = losses.cross_entropy_with_logz_penalty(x, t, coef=0.1, return_penalty=True)
    (g,) = torch.autograd.grad(pen, [x])
    lse = torch.logsumexp(x.detach(), 1, keepdim=True)
    torch.testing.assert_close(g, 2 * 0.1 * lse * torch.softmax(x.detach(), 1) / 4, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("shape", [(1, 3), (3, 5), (3, 5, 2)])
def test_ce_logz_gradcheck(shape):
    x, t = _inputs(shape, seed=24, ignore_some=False)
    x.requires_grad_(True)
    assert_gradcheck(
        lambda inp: losses.cross_entropy_with_logz_penalty(inp, t, coef=0.2, reduction="none"), x)
    assert_gradcheck(
        lambda inp: sum(losses.cross_entropy_with_logz_penalty(inp, t, coef=0.2, return_penalty=True)), x)
    assert_gradcheck(lambda inp: losses.logz_penalty(inp, coef=0.3, reduction="none"), x)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", LOGIT_SHAPES)
def test_logz_penalty_matches_loop_oracle(shape, reduction):
    x, _ = _inputs(shape, seed=25, scale=3.0)
    mask = torch.rand((shape[0],) + shape[2:], generator=torch.Generator().manual_seed(3)) > 0.3
    for m in (None, mask):
        out, g = value_and_grad(losses.logz_penalty, x, coef=0.02, mask=m, reduction=reduction)
        ref, g_ref = value_and_grad(lambda *a, **k: logz_loop(*a, **k)[0], x, coef=0.02, mask=m,
                                    reduction=reduction, with_ce=False)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-13)
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-13)


def test_logz_penalty_gradient_fact_and_extremes():
    x, _ = _inputs((5, 6), seed=26, scale=3.0)
    _, g = value_and_grad(losses.logz_penalty, x, coef=0.5, reduction="sum")
    lse = torch.logsumexp(x, 1, keepdim=True)
    torch.testing.assert_close(g, 2 * 0.5 * lse * torch.softmax(x, 1), rtol=1e-10, atol=1e-14)
    # x1e4 logits in fp32: finite, equal to the fp64 oracle
    x32 = (x * 1e4).float()
    out, g32 = value_and_grad(losses.logz_penalty, x32, coef=1e-4)
    assert torch.isfinite(out) and torch.isfinite(g32).all()
    ref = logz_loop(x32.double(), coef=1e-4, with_ce=False)[0]
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=0)
    # all masked: attached zero with zero gradients
    xr = x.clone().requires_grad_(True)
    out = losses.logz_penalty(xr, mask=torch.zeros(5, dtype=torch.bool))
    assert out.item() == 0.0
    (g0,) = torch.autograd.grad(out, [xr])
    assert torch.equal(g0, torch.zeros_like(xr))


def test_ce_logz_extremes_ignored_half():
    x, t = _inputs((6, 5), seed=27, dtype=torch.float32)
    out, g = value_and_grad(losses.cross_entropy_with_logz_penalty, x * 1e4, t)
    assert torch.isfinite(out) and torch.isfinite(g).all()
    ref = logz_loop((x * 1e4).double(), t)[0]
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=0)
    xr = x.clone().requires_grad_(True)
    for reduction in ("mean", "sum"):
        out = losses.cross_entropy_with_logz_penalty(xr, torch.full((6,), -100), reduction=reduction)
        assert out.item() == 0.0 and out.grad_fn is not None
        (g0,) = torch.autograd.grad(out, [xr])
        assert torch.equal(g0, torch.zeros_like(xr))
    xh = x.half().requires_grad_(True)
    out = losses.cross_entropy_with_logz_penalty(xh, t, coef=0.1)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, losses.cross_entropy_with_logz_penalty(xh.detach().float(), t, coef=0.1),
                               rtol=1e-6, atol=1e-6)
    out.backward()
    assert xh.grad.dtype == torch.float16


def test_logz_module_and_registry():
    x, t = _inputs((5, 7), seed=28)
    m = losses.CrossEntropyWithLogZPenalty(coef=0.01, reduction="sum", return_penalty=True)
    loss, pen = m(x, t)
    ref_loss, ref_pen = losses.cross_entropy_with_logz_penalty(x, t, coef=0.01, reduction="sum",
                                                               return_penalty=True)
    assert torch.equal(loss, ref_loss) and torch.equal(pen, ref_pen)
    assert repr(m) == ("CrossEntropyWithLogZPenalty(coef=0.01, ignore_index=-100, reduction='sum', "
                       "return_penalty=True)")
    spec = losses.get_loss_spec("logz_penalty")
    assert spec.function is losses.cross_entropy_with_logz_penalty
    assert spec.module is losses.CrossEntropyWithLogZPenalty
    assert losses.get_loss_spec("z_loss").module is losses.ZLoss
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert torch.equal(other(x, t)[0], loss)


def test_docstrings_point_to_each_other():
    assert "logz_penalty" in losses.z_loss.__doc__ and "not** the PaLM" in losses.z_loss.__doc__
    for fn in (losses.logz_penalty, losses.cross_entropy_with_logz_penalty):
        assert "z_loss" in fn.__doc__ and "not** the de Brébisson–Vincent" in fn.__doc__
    assert "1604.08859" in losses.z_loss.__doc__
    assert "2204.02311" in losses.cross_entropy_with_logz_penalty.__doc__


def test_logz_errors():
    x = torch.randn(3, 4)
    t = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=r"^cross_entropy_with_logz_penalty: coef must be finite and satisfy "
                                         r"coef >= 0.0 \(got -0.1\)"):
        losses.cross_entropy_with_logz_penalty(x, t, coef=-0.1)
    with pytest.raises(ValueError, match=r"^logz_penalty: coef must be finite and satisfy coef >= 0.0"):
        losses.logz_penalty(x, coef=-1.0)
    with pytest.raises(ValueError, match=r"^CrossEntropyWithLogZPenalty: coef must be finite"):
        losses.CrossEntropyWithLogZPenalty(coef=-1.0)
    with pytest.raises(TypeError, match=r"^cross_entropy_with_logz_penalty: target must hold integer class ids"):
        losses.cross_entropy_with_logz_penalty(x, t.float())
    with pytest.raises(TypeError, match=r"^cross_entropy_with_logz_penalty: return_penalty must be a bool"):
        losses.cross_entropy_with_logz_penalty(x, t, return_penalty=1)
    with pytest.raises(ValueError, match=r"^cross_entropy_with_logz_penalty: target has class ids outside"):
        losses.cross_entropy_with_logz_penalty(x, torch.tensor([0, 1, 9]))
    with pytest.raises(ValueError, match=r"^cross_entropy_with_logz_penalty: target shape must be"):
        losses.cross_entropy_with_logz_penalty(x, t[:2])
    with pytest.raises(ValueError, match=r"^cross_entropy_with_logz_penalty: reduction must be one of"):
        losses.cross_entropy_with_logz_penalty(x, t, reduction="avg")
    with pytest.raises(TypeError, match=r"^logz_penalty: mask must be a bool tensor"):
        losses.logz_penalty(x, mask=torch.ones(3))
    with pytest.raises(ValueError, match=r"^logz_penalty: mask shape must be \(3,\)"):
        losses.logz_penalty(x, mask=torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^logz_penalty: input must have shape \(N, C\)"):
        losses.logz_penalty(torch.randn(4))
    with pytest.raises(ValueError, match=r"^logz_penalty: reduction must be one of"):
        losses.logz_penalty(x, reduction="avg")
    xb = x.clone()
    xb[0, 1] = math.nan
    with pytest.raises(ValueError, match=r"^cross_entropy_with_logz_penalty: input contains NaN"):
        losses.cross_entropy_with_logz_penalty(xb, t)
    with pytest.raises(ValueError, match=r"^logz_penalty: input contains NaN"):
        losses.logz_penalty(xb)
    with losses.validation(False):
        assert torch.isnan(losses.cross_entropy_with_logz_penalty(xb, t))
        assert torch.isnan(losses.logz_penalty(xb))
        with pytest.raises(ValueError, match="coef must be finite"):
            losses.logz_penalty(x, coef=-1.0)


def test_logz_penalty_return_stats_from_the_same_call():
    """``return_stats=True``: the loss as without it, per-position log Z (0 where ignored), the
    penalty part reduced like the loss, the token accuracy and count; N-D positions keep their shape."""
    torch.manual_seed(3)
    x = torch.randn(5, 7, 3, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 7, (5, 3))
    y[1, 2] = -100
    keep = y != -100
    lse = torch.logsumexp(x, 1)
    for reduction in ("none", "mean", "sum"):
        st = losses.cross_entropy_with_logz_penalty(x, y, coef=0.01, reduction=reduction, return_stats=True)
        assert isinstance(st, losses.LossStats)
        loss, pen = losses.cross_entropy_with_logz_penalty(x, y, coef=0.01, reduction=reduction, return_penalty=True)
        assert torch.allclose(st.loss, loss, rtol=1e-12) and torch.allclose(st.penalty, pen, rtol=1e-12)
        assert st.lse.shape == y.shape and torch.allclose(st.lse[keep], lse[keep], rtol=1e-12)
        assert float(st.lse[1, 2]) == 0.0 and int(st.count) == int(keep.sum())
        assert float(st.accuracy) == pytest.approx(float((x.argmax(1) == y)[keep].double().mean()))
    with pytest.raises(ValueError, match=r"^cross_entropy_with_logz_penalty: return_stats and return_penalty"):
        losses.cross_entropy_with_logz_penalty(x, y, return_stats=True, return_penalty=True)
