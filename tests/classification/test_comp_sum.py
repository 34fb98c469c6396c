"""Comp-sum losses (docs/losses/comp_sum.md): loop oracle, gradcheck, the table values, continuity at tau = 1,
the documented infinities, the gradient fact, errors and the validation switch."""

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
    "comp_sum": entry("comp_sum_loss", "CompSumLoss", LOGITS, unit="position", example={"tau": 0.5}),
}

TAUS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0]


def comp_sum_loop(x, t, *, tau=1.0, ignore_index=-100, reduction="mean"):
    """Phi^tau(sum_{y' != y} exp(h_y' - h_y)) with Phi written literally, position by position."""
    C = x.shape[1]
    vals, ws = [], []
    for pos in positions(x):
        y = int(t[pos])
        if y == ignore_index:
            vals.append(torch.zeros((), dtype=torch.float64))
            ws.append(0.0)
            continue
        h = logits_at(x, pos)
        u = sum((torch.exp(h[k] - h[y]) for k in range(C) if k != y), torch.zeros((), dtype=torch.float64))
        if tau == 1.0:
            vals.append(torch.log(1 + u))
        else:
            vals.append(((1 + u) ** (1 - tau) - 1) / (1 - tau))
        ws.append(1.0)
    return loop_reduce(vals, ws, position_shape(x), reduction)


def _inputs(shape, seed, *, ignore_some=True, scale=1.5, dtype=torch.float64):
    return logits_and_ids(shape, seed, scale=scale, ignore_at=2 if ignore_some else None, dtype=dtype)


# --------------------------------------------------------------------------------------
# oracle, gradcheck
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", LOGIT_SHAPES)
@pytest.mark.parametrize("tau", TAUS)
def test_matches_loop_oracle_fp64(shape, reduction, tau):
    x, t = _inputs(shape, seed=1)
    w = torch.rand((shape[0],) + shape[2:], generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    weights = w - 0.3 if reduction == "none" else None  # negative upstream gradients too
    out, g = value_and_grad(losses.comp_sum_loss, x, t, tau=tau, reduction=reduction, weights=weights)
    ref, g_ref = value_and_grad(comp_sum_loop, x, t, tau=tau, reduction=reduction, weights=weights)
    assert out.shape == ref.shape and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("tau", [0.0, 0.7, 1.0, 2.0])
def test_fp32_matches_fp64_oracle(tau):
    x, t = _inputs((5, 7, 3), seed=2, dtype=torch.float32)
    out, g = value_and_grad(losses.comp_sum_loss, x, t, tau=tau)
    ref, g_ref = value_and_grad(comp_sum_loop, x.double(), t, tau=tau)
    assert out.dtype == torch.float32 and g.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape", [(1, 3), (3, 5), (3, 5, 2)])
@pytest.mark.parametrize("tau", [0.0, 0.5, 1.0, 1.7, 2.0])
def test_gradcheck(shape, tau):
    x, t = _inputs(shape, seed=3, ignore_some=False)
    x.requires_grad_(True)
    assert_gradcheck(lambda inp: losses.comp_sum_loss(inp, t, tau=tau, reduction="none"), x)
    assert_gradcheck(lambda inp: losses.comp_sum_loss(inp, t, tau=tau), x)


def test_tau_one_is_cross_entropy():
    x, t = _inputs((5, 7, 3), seed=4)
    for reduction in ("none", "mean", "sum"):
        out, g = value_and_grad(losses.comp_sum_loss, x, t, tau=1.0, reduction=reduction)
        ref, g_ref = value_and_grad(F.cross_entropy, x, t, reduction=reduction)
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-14)
    assert losses.CompSumLoss().tau == 1.0  # default tau = 1


# --------------------------------------------------------------------------------------
# the table (docs/losses/comp_sum.md) and continuity at tau = 1
# --------------------------------------------------------------------------------------


def _p_y(x, t):
    return torch.softmax(x, 1).gather(1, t[:, None]).squeeze(1)


def test_table_values():
    x, t = _inputs((40, 6), seed=5, ignore_some=False, scale=2.5)
    p_y = _p_y(x, t)

    def val(tau):
        return losses.comp_sum_loss(x, t, tau=tau, reduction="none")

    torch.testing.assert_close(val(0.0), 1 / p_y - 1, rtol=1e-12, atol=1e-14)
    hy = x.gather(1, t[:, None])
    sum_exp = torch.where(F.one_hot(t, 6).bool(), torch.zeros_like(x), torch.exp(x - hy)).sum(1)
    torch.testing.assert_close(val(0.0), sum_exp, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(val(1.0), -torch.log(p_y), rtol=1e-12, atol=1e-14)
    for q in (0.1, 0.3, 0.7, 0.95):
        torch.testing.assert_close(val(1.0 + q), (1 - p_y ** q) / q, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(val(2.0), 1 - p_y, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(val(3.0), (1 - p_y ** 2) / 2, rtol=1e-12, atol=1e-14)  # tau > 2 allowed


def test_continuity_at_tau_one():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(60, 5, generator=g, dtype=torch.float64) * torch.linspace(0.1, 20, 60, dtype=torch.float64)[:, None]
    t = torch.randint(0, 5, (60,), generator=g)
    ce = F.cross_entropy(x, t, reduction="none")
    assert ce.max() > 20  # covers large ce as well
    for tau in (1 - 1e-9, 1 + 1e-9):
        v = losses.comp_sum_loss(x, t, tau=tau, reduction="none")
        assert torch.all((v - ce).abs() <= 1e-8 * (1 + ce ** 2))


# --------------------------------------------------------------------------------------
# gradient facts and documented infinities
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", TAUS)
def test_gradient_fact(tau):
    x, t = _inputs((8, 6), seed=7, ignore_some=False, scale=2.0)
    _, g = value_and_grad(losses.comp_sum_loss, x, t, tau=tau, reduction="sum")
    p = torch.softmax(x, 1)
    p_y = p.gather(1, t[:, None])
    e_y = F.one_hot(t, 6).double()
    torch.testing.assert_close(g, p_y ** (tau - 1) * (p - e_y), rtol=1e-10, atol=1e-14)
    special = {0.0: (p - e_y) / p_y, 1.0: p - e_y, 2.0: p_y * (p - e_y)}
    if tau in special:
        torch.testing.assert_close(g, special[tau], rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(g.sum(1), torch.zeros(8, dtype=torch.float64), rtol=0, atol=1e-12 * (1 + g.abs().max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tau", [0.0, 0.5])
def test_extreme_logits_give_documented_infinities(dtype, tau):
    x = torch.tensor([[1.0, 0.3, -1.0]], dtype=dtype) * 1e4
    t = torch.tensor([2])
    for reduction in ("none", "mean", "sum"):
        out, g = value_and_grad(losses.comp_sum_loss, x, t, tau=tau, reduction=reduction)
        assert torch.all(out == math.inf)
        assert torch.equal(g, torch.tensor([[math.inf, math.inf, -math.inf]], dtype=dtype))
        assert out.dtype == dtype


def test_float32_overflow_threshold_and_float64_beyond_it():
    tau = 0.5
    bound = (88.72 + math.log(1 - tau)) / (1 - tau)  # ce above which float32 overflows
    t = torch.tensor([1])
    below = torch.tensor([[0.0, -(bound - 1.0)]])
    above = torch.tensor([[0.0, -(bound + 1.0)]])
    assert torch.isfinite(losses.comp_sum_loss(below, t, tau=tau))
    assert losses.comp_sum_loss(above, t, tau=tau) == math.inf
    out, g = value_and_grad(losses.comp_sum_loss, above.double(), t, tau=tau)
    ref, g_ref = value_and_grad(comp_sum_loop, above.double(), t, tau=tau)
    assert torch.isfinite(out) and out > 1e38
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=0)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=0)


def test_never_nan_on_extreme_logits_and_ignored_rows():
    g = torch.Generator().manual_seed(8)
    for dtype in (torch.float32, torch.float64):
        x = (torch.randn(12, 5, generator=g, dtype=torch.float64) * 1e4).to(dtype)
        t = torch.randint(0, 5, (12,), generator=g)
        t[::3] = -100  # ignored rows whose value would be +inf
        for tau in (0.0, 0.3, 1.0, 2.0, 4.0):
            for reduction in ("none", "mean", "sum"):
                out, grad = value_and_grad(losses.comp_sum_loss, x, t, tau=tau, reduction=reduction)
                assert not torch.isnan(out).any() and not torch.isnan(grad).any()
                # ignored rows: exact zero value (for "none") and exact zero gradient
                assert torch.all(grad[::3] == 0)
                if reduction == "none":
                    assert torch.all(out[::3] == 0)
            if tau >= 1:
                assert torch.isfinite(losses.comp_sum_loss(x, t, tau=tau))


def test_zero_upstream_gradient_on_overflowing_row_is_zero():
    x = torch.tensor([[1.0, 0.3, -1.0], [0.5, 0.1, 0.2]]) * 1e4
    t = torch.tensor([2, 0])
    out, g = value_and_grad(losses.comp_sum_loss, x, t, tau=0.0, reduction="none",
                   weights=torch.tensor([0.0, 1.0]))
    assert out[0] == math.inf
    assert torch.equal(g[0], torch.zeros(3))
    assert torch.isfinite(g[1]).all()


def test_target_gradient_does_not_cancel_when_p_y_is_one():
    # p_y = 1 - 2e-17: the target entry -(1 - p_y) p_y^(tau-1) is resolved to full relative precision
    x = torch.tensor([[40.0, 0.0, 0.0]], dtype=torch.float64)
    t = torch.tensor([0])
    one_minus_p = 2 * math.exp(-40.0) / (1 + 2 * math.exp(-40.0))
    for tau in (0.0, 1.0, 2.0):
        _, g = value_and_grad(losses.comp_sum_loss, x, t, tau=tau, reduction="sum")
        expected = -one_minus_p * (1 - one_minus_p) ** (tau - 1)
        assert g[0, 0] < 0
        assert abs(float(g[0, 0]) - expected) <= 1e-12 * abs(expected)


# --------------------------------------------------------------------------------------
# dtypes, empty / ignored batches, module
# --------------------------------------------------------------------------------------


def test_integer_target_dtypes():
    # fp16 / bf16 inputs at the registry's tau = 0.5: the contract's "dtypes" property (tests/test_contract.py)
    x, t = _inputs((4, 6), seed=9, dtype=torch.float32)
    for it in (torch.int8, torch.int32):
        tt = torch.where(t < 0, torch.full_like(t, -100), t).to(it) if it != torch.int8 else t.clamp_min(0).to(it)
        ref_t = tt.long()
        torch.testing.assert_close(losses.comp_sum_loss(x, tt, tau=0.5), losses.comp_sum_loss(x, ref_t, tau=0.5),
                                   rtol=0, atol=0)


def test_empty_and_one_class_batches():
    # an all-ignored batch at the registry's tau = 0.5: the contract's "all_ignored" property
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    empty = torch.randn(0, 5, requires_grad=True)
    out = losses.comp_sum_loss(empty, torch.zeros(0, dtype=torch.long))
    assert out.item() == 0.0
    # one class in the batch; C = 1 (the loss would be identically 0) is a degenerate-input error
    t = torch.full((4,), 2)
    torch.testing.assert_close(losses.comp_sum_loss(x, t, tau=0.3), comp_sum_loop(x, t, tau=0.3), rtol=1e-10, atol=0)
    one = torch.randn(3, 1, requires_grad=True)
    for tau in (0.0, 1.0, 2.0):
        with pytest.raises(ValueError, match=r"^comp_sum_loss: a softmax over a single class .*bce_with_logits"):
            losses.comp_sum_loss(one, torch.zeros(3, dtype=torch.long), tau=tau)


def test_module():
    x, t = _inputs((5, 7, 2), seed=10)
    m = losses.CompSumLoss(tau=0.25, reduction="sum")
    assert torch.equal(m(x, t), losses.comp_sum_loss(x, t, tau=0.25, reduction="sum"))
    assert repr(m) == "CompSumLoss(tau=0.25, ignore_index=-100, reduction='sum')"
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert torch.equal(other(x, t), m(x, t))
    spec = losses.get_loss_spec("comp_sum")
    assert spec.example_kwargs == {"tau": 0.5} and spec.unit == "position" and spec.arxiv == "2304.07288"
    assert losses.create_loss("comp_sum", tau=0.5).tau == 0.5


# --------------------------------------------------------------------------------------
# errors and validation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [-0.1, -1.0, math.nan, math.inf, -math.inf])
def test_bad_tau(tau):
    with pytest.raises(ValueError, match=r"^comp_sum_loss: tau must be finite and satisfy tau >= 0.0 \(got "):
        losses.comp_sum_loss(torch.randn(2, 3), torch.tensor([0, 1]), tau=tau)
    with pytest.raises(ValueError, match=r"^CompSumLoss: tau must be finite"):
        losses.CompSumLoss(tau=tau)


def test_bad_inputs():
    x = torch.randn(3, 4)
    t = torch.tensor([0, 1, 2])
    with pytest.raises(TypeError, match=r"^comp_sum_loss: tau must be a real number"):
        losses.comp_sum_loss(x, t, tau="1")
    with pytest.raises(TypeError, match=r"^comp_sum_loss: target must hold integer class ids \(got torch.float32\)"):
        losses.comp_sum_loss(x, t.float())
    with pytest.raises(TypeError, match=r"^comp_sum_loss: target must hold integer class ids \(got torch.bool\)"):
        losses.comp_sum_loss(x, t > 0)
    with pytest.raises(TypeError, match=r"^comp_sum_loss: input must be a floating-point tensor"):
        losses.comp_sum_loss(x.long(), t)
    with pytest.raises(ValueError, match=r"^comp_sum_loss: reduction must be one of"):
        losses.comp_sum_loss(x, t, reduction="elementwise_mean")
    with pytest.raises(ValueError, match=r"^CompSumLoss: reduction must be one of"):
        losses.CompSumLoss(reduction="avg")
    with pytest.raises(ValueError, match=r"^comp_sum_loss: input must have shape \(N, C\)"):
        losses.comp_sum_loss(torch.randn(4), torch.tensor(1))
    with pytest.raises(ValueError, match=r"^comp_sum_loss: target shape must be \(3,\)"):
        losses.comp_sum_loss(x, torch.tensor([[0, 1, 2]]))
    with pytest.raises(ValueError, match=r"^comp_sum_loss: input needs at least one class"):
        losses.comp_sum_loss(torch.randn(3, 0), t)
    with pytest.raises(ValueError, match=r"^comp_sum_loss: target has class ids outside \[0, 4\) \(got min=0, max=7\)"):
        losses.comp_sum_loss(x, torch.tensor([0, 7, 2]))
    for bad in (math.nan, math.inf):  # -inf is a mask (tests/classification/test_reliability.py)
        xb = x.clone()
        xb[2, 3] = bad
        with pytest.raises(ValueError, match=r"^comp_sum_loss: input contains NaN or \+inf"):
            losses.comp_sum_loss(xb, t)


def test_validation_off_skips_only_data_checks():
    x = torch.randn(3, 4)
    t = torch.tensor([0, 1, 2])
    xb = x.clone()
    xb[1, 0] = math.nan
    with losses.validation(False):
        out = losses.comp_sum_loss(xb, t, tau=0.5, reduction="none")
        assert torch.isnan(out[1]) and torch.isfinite(out[[0, 2]]).all()
        with pytest.raises(ValueError, match="tau must be finite"):
            losses.comp_sum_loss(x, t, tau=-1.0)
        with pytest.raises(TypeError, match="target must hold integer class ids"):
            losses.comp_sum_loss(x, t.float())
        with pytest.raises(ValueError, match="target shape"):
            losses.comp_sum_loss(x, t[:1])
    with pytest.raises(ValueError, match="NaN"):
        losses.comp_sum_loss(xb, t)


# --------------------------------------------------------------------------------------
# the traced path (torch.compile): the non-target mass in the forward's reduction
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [0.0, 1.0, 2.0])
def test_compiled_path_matches_the_oracle_fp64(tau):
    # aot_eager traces the same Python as inductor (the forward takes the traced branch), without C++ builds
    torch._dynamo.reset()
    x, t = _inputs((6, 5, 3), seed=11)
    x = x.detach().clone()
    x[0, 1, 0] = -math.inf  # a masked class
    x[1, :, 1] = torch.tensor([40.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)  # p_y -> 1 at target 0
    t[1, 1] = 0
    t[0, 0] = 0  # the target is not the masked class
    for reduction in REDUCTIONS:
        fn = torch.compile(lambda a, b: losses.comp_sum_loss(a, b, tau=tau, reduction=reduction),
                           backend="aot_eager", fullgraph=True)
        weights = None if reduction != "none" else torch.linspace(-0.5, 1.0, 18, dtype=torch.float64).reshape(6, 3)
        out, g = value_and_grad(fn, x, t, weights=weights)
        ref, g_ref = value_and_grad(comp_sum_loop, x, t, tau=tau, reduction=reduction, weights=weights)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)
        assert g[0, 1, 0] == 0  # the masked class: an exact zero
    # the target entry at p_y -> 1 keeps its relative precision (no cancellation)
    one_minus_p = 4 * math.exp(-40.0) / (1 + 4 * math.exp(-40.0))
    fn = torch.compile(lambda a, b: losses.comp_sum_loss(a, b, tau=tau, reduction="sum"), backend="aot_eager")
    _, g = value_and_grad(fn, x, t)
    expected = -one_minus_p * (1 - one_minus_p) ** (tau - 1)
    assert abs(float(g[1, 0, 1]) - expected) <= 1e-12 * abs(expected)


def test_compiled_path_extreme_logits_and_masked_targets():
    torch._dynamo.reset()
    x = torch.tensor([[1.0, 0.3, -1.0], [0.5, 0.1, 0.2], [0.0, -math.inf, 1.0]]) * 1e4
    t = torch.tensor([2, 0, 1])  # row 2: the target is a masked class
    with losses.validation(False):
        for tau in (0.0, 0.5, 1.0, 2.0):
            fn = torch.compile(lambda a, b: losses.comp_sum_loss(a, b, tau=tau, reduction="none"), backend="aot_eager")
            eager = lambda a, b: losses.comp_sum_loss(a, b, tau=tau, reduction="none")  # noqa: E731
            out, g = value_and_grad(fn, x, t, weights=torch.tensor([1.0, 1.0, 1.0]))
            ref, g_ref = value_and_grad(eager, x, t, weights=torch.tensor([1.0, 1.0, 1.0]))
            assert torch.equal(out.isnan(), ref.isnan()) and not out[:2].isnan().any()
            torch.testing.assert_close(out[:2], ref[:2], rtol=1e-6, atol=0)
            torch.testing.assert_close(g[:2], g_ref[:2], rtol=1e-6, atol=0)
            assert not g[:2].isnan().any()
