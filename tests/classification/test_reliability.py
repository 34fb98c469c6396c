"""Reliability rules of the classification losses (docs/conventions.md): ``-inf`` masks,
ignored positions holding +-inf, degenerate inputs, data checks under ``torch.compile``, one
exception type per mistake, mixed precision (CPU bf16 autocast) and float64 exactness.

Every value is compared with a float64 loop oracle written from the formulas (plain Python
floats, independent of the library's kernels)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import losses
from losses import _core

NINF = -math.inf
INF = math.inf


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", losses.ExperimentalWarning)
        return fn(*args, **kwargs)


def adv(input, target, **kw):
    """The adversarial comp-sum loss with ``input_adv = input + 0.5`` (a shift: smooth term 0)."""
    kw.setdefault("nu", 1.0)
    return _quiet(losses.adversarial_comp_sum_loss, input, input + 0.5, target, **kw)


# --------------------------------------------------------------------------------------
# float64 loop oracles (rows are Python lists; -inf entries are absent classes)
# --------------------------------------------------------------------------------------


def _lse(row):
    fin = [v for v in row if v != NINF]
    m = max(fin)
    return m + math.log(math.fsum(math.exp(v - m) for v in fin))


def ce_row(row, y, eps=0.0, w=None):
    """CE with label smoothing spread over the finite classes; class weights ``w``."""
    fin = [k for k, v in enumerate(row) if v != NINF]
    lse = _lse(row)
    w = w or [1.0] * len(row)
    nll = INF if row[y] == NINF else lse - row[y]
    val = (1 - eps) * w[y] * nll
    if eps:
        val += eps / len(fin) * math.fsum(w[k] * (lse - row[k]) for k in fin)
    return val


def ce_soft_row(row, q, eps=0.0):
    fin = [k for k, v in enumerate(row) if v != NINF]
    lse = _lse(row)
    qq = [(1 - eps) * q[k] + (eps / len(fin) if k in fin else 0.0) for k in range(len(row))]
    return math.fsum(qq[k] * (INF if row[k] == NINF else lse - row[k]) for k in range(len(row)) if qq[k] != 0)


def softmax_row(row):
    lse = _lse(row)
    return [0.0 if v == NINF else math.exp(v - lse) for v in row]


def comp_sum_row(row, y, tau):
    ce = INF if row[y] == NINF else _lse(row) - row[y]
    if tau == 1.0:
        return ce
    if ce == INF:
        return INF if tau < 1 else 1.0 / (tau - 1.0)
    return math.expm1((1 - tau) * ce) / (1 - tau)


def entmax_row(row, alpha):
    """entmax_alpha over the finite entries by 300 bisection steps (exact to float64)."""
    fin = [k for k, v in enumerate(row) if v != NINF]
    m = max(row[k] for k in fin)
    x = {k: (alpha - 1) * (row[k] - m) for k in fin}
    lo, hi = -1.0, 0.0
    for _ in range(300):
        mid = (lo + hi) / 2
        if math.fsum(max(x[k] - mid, 0.0) ** (1 / (alpha - 1)) for k in fin) >= 1:
            lo = mid
        else:
            hi = mid
    tau = (lo + hi) / 2
    p = [0.0] * len(row)
    for k in fin:
        p[k] = max(x[k] - tau, 0.0) ** (1 / (alpha - 1))
    s = math.fsum(p)
    return [v / s for v in p]


def fy_row(row, y, alpha):
    p = entmax_row(row, alpha)
    h = (1 - math.fsum(v ** alpha for v in p)) / (alpha * (alpha - 1))
    z_y = row[y]
    if z_y == NINF:
        return INF
    return math.fsum(p[k] * row[k] for k in range(len(row)) if p[k] > 0) + h - z_y


FY = {"sparsemax": (losses.sparsemax_loss, 2.0), "entmax15": (losses.entmax15_loss, 1.5),
      "entmax_bisect": (lambda x, t, **kw: losses.entmax_bisect_loss(x, t, alpha=1.3, **kw), 1.3)}


def _masked_batch(seed=0, n=4, c=6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, generator=g, dtype=torch.float64) * 2
    t = torch.tensor([0, 3, 5, 2])[:n]
    mask = torch.zeros(n, c, dtype=torch.bool)
    mask[0, [1, 4]] = True
    mask[1, [0]] = True
    mask[2, [1, 2, 3, 4]] = True  # two classes left
    mask[3, [0, 1, 3, 4, 5]] = True  # only the target left
    return x.masked_fill(mask, NINF), t, mask


# --------------------------------------------------------------------------------------
# 1. -inf masks: value = the loss without those classes, gradient exactly 0 there
# --------------------------------------------------------------------------------------

MASK_CASES = {
    "ce": (lambda x, t, **kw: losses.cross_entropy_loss(x, t, **kw), lambda r, y: ce_row(r, y)),
    "ce_smooth": (lambda x, t, **kw: losses.cross_entropy_loss(x, t, label_smoothing=0.2, **kw),
                  lambda r, y: ce_row(r, y, eps=0.2)),
    "ce_smooth_weight": (
        lambda x, t, **kw: losses.cross_entropy_loss(
            x, t, label_smoothing=0.3, weight=torch.tensor([1.0, 2.0, 0.5, 1.5, 3.0, 0.25], dtype=torch.float64),
            **kw),
        lambda r, y: ce_row(r, y, eps=0.3, w=[1.0, 2.0, 0.5, 1.5, 3.0, 0.25])),
    "logz": (lambda x, t, **kw: losses.cross_entropy_with_logz_penalty(x, t, coef=0.1, **kw),
             lambda r, y: ce_row(r, y) + 0.1 * _lse(r) ** 2),
    "comp_sum_0": (lambda x, t, **kw: losses.comp_sum_loss(x, t, tau=0.0, **kw), lambda r, y: comp_sum_row(r, y, 0.0)),
    "comp_sum_05": (lambda x, t, **kw: losses.comp_sum_loss(x, t, tau=0.5, **kw),
                    lambda r, y: comp_sum_row(r, y, 0.5)),
    "comp_sum_17": (lambda x, t, **kw: losses.comp_sum_loss(x, t, tau=1.7, **kw),
                    lambda r, y: comp_sum_row(r, y, 1.7)),
    "adversarial": (lambda x, t, **kw: adv(x, t, tau=0.5, **kw), lambda r, y: comp_sum_row(r, y, 0.5)),
    **{name: (fn, (lambda a: lambda r, y: fy_row(r, y, a))(alpha)) for name, (fn, alpha) in FY.items()},
}


@pytest.mark.parametrize("case", list(MASK_CASES))
def test_minus_inf_mask_equals_loss_without_the_class(case):
    fn, oracle = MASK_CASES[case]
    x, t, mask = _masked_batch()
    x.requires_grad_(True)
    out = fn(x, t, reduction="none")  # validation ON (default): -inf is accepted as a mask
    expected = torch.tensor([oracle(x[i].tolist(), int(t[i])) for i in range(x.shape[0])], dtype=torch.float64)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    (g,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(g).all()
    assert torch.all(g[mask] == 0)
    # the unmasked gradient equals the gradient of the same loss on the reduced rows
    for i in range(x.shape[0]):
        keep = ~mask[i]
        xi = x.detach()[i, keep].unsqueeze(0).requires_grad_(True)
        ti = torch.tensor([int(keep[: int(t[i])].sum())])
        if xi.shape[1] == 1:  # only the target is left
            if case == "logz":  # CE part 0, penalty coef * x_y^2 with gradient 2 coef x_y
                xy = x[i, int(t[i])].item()
                assert out[i].item() == pytest.approx(0.1 * xy * xy, rel=1e-12)
                assert g[i, int(t[i])].item() == pytest.approx(0.2 * xy, rel=1e-12)
            else:  # the loss is 0 with zero gradient
                assert out[i].item() == pytest.approx(0.0, abs=1e-15) and torch.all(g[i] == 0)
            continue
        kw = {}
        if case == "ce_smooth_weight":
            w = torch.tensor([1.0, 2.0, 0.5, 1.5, 3.0, 0.25], dtype=torch.float64)[keep]
            gi = torch.autograd.grad(losses.cross_entropy_loss(xi, ti, label_smoothing=0.3, weight=w,
                                                               reduction="sum"), xi)[0]
        else:
            gi = torch.autograd.grad(fn(xi, ti, reduction="sum", **kw), xi)[0]
        torch.testing.assert_close(g[i, keep], gi[0], rtol=1e-9, atol=1e-12)


def test_minus_inf_mask_n_d_input_and_soft_targets():
    x, t, mask = _masked_batch(seed=1)
    # (N, C, d) layout: classes on dim 1
    x3 = torch.stack([x, x.flip(0)], dim=-1).requires_grad_(True)
    t3 = torch.stack([t, t.flip(0)], dim=-1)
    out = losses.cross_entropy_loss(x3, t3, label_smoothing=0.1, reduction="none")
    for i in range(4):
        for d in range(2):
            assert out[i, d].item() == pytest.approx(ce_row(x3[i, :, d].tolist(), int(t3[i, d]), eps=0.1), rel=1e-12)
    # soft targets with no mass on masked classes; smoothing only over unmasked ones
    q = torch.rand(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).masked_fill(mask, 0.0)
    q = q / q.sum(1, keepdim=True)
    xs = x.clone().requires_grad_(True)
    for eps in (0.0, 0.25):
        out = losses.cross_entropy_loss(xs, q, label_smoothing=eps, reduction="none")
        expected = [ce_soft_row(xs[i].tolist(), q[i].tolist(), eps) for i in range(4)]
        torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), rtol=1e-10, atol=1e-12)
        (g,) = torch.autograd.grad(out.sum(), xs)
        assert torch.all(g[mask] == 0) and torch.isfinite(g).all()
    # entmax soft targets: the FY loss ignores masked classes with zero target mass
    for name, (fn, alpha) in FY.items():
        out = fn(xs, q, reduction="none")
        assert torch.isfinite(out).all()
        (g,) = torch.autograd.grad(out.sum(), xs)
        assert torch.all(g[mask] == 0)
    # the standalone log-Z penalty takes log Z over the unmasked classes
    pen = losses.logz_penalty(xs, coef=0.5, reduction="none")
    torch.testing.assert_close(pen, torch.tensor([0.5 * _lse(r) ** 2 for r in xs.tolist()], dtype=torch.float64),
                               rtol=1e-12, atol=0)
    (g,) = torch.autograd.grad(pen.sum(), xs)
    assert torch.all(g[mask] == 0)


def test_target_on_a_masked_class():
    x = torch.tensor([[1.0, NINF, 0.5, -0.3], [0.2, 0.1, 0.3, 2.0]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1, 3])
    p0 = torch.tensor(softmax_row(x[0].tolist()), dtype=torch.float64)
    e1 = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    for fn in (losses.cross_entropy_loss, lambda a, b, **k: losses.cross_entropy_with_logz_penalty(a, b, coef=0.0, **k),
               lambda a, b, **k: losses.comp_sum_loss(a, b, tau=1.0, **k)):
        out = fn(x, y, reduction="none")
        assert out[0].item() == INF and math.isfinite(out[1].item())
        (g,) = torch.autograd.grad(out.sum(), x)
        torch.testing.assert_close(g[0], p0 - e1, rtol=0, atol=1e-12)  # finite: p - e_y
    # comp-sum: tau < 1 gives +inf with +-inf (never NaN) entries; tau > 1 the finite limit 1/(tau - 1)
    out = losses.comp_sum_loss(x, y, tau=0.5, reduction="none")
    assert out[0].item() == INF
    (g,) = torch.autograd.grad(out.sum(), x)
    assert not torch.isnan(g).any()
    assert torch.equal(g[0], torch.tensor([INF, -INF, INF, INF], dtype=torch.float64))
    out = losses.comp_sum_loss(x, y, tau=1.5, reduction="none")
    assert out[0].item() == pytest.approx(2.0, rel=1e-15)
    (g,) = torch.autograd.grad(out.sum(), x)
    assert torch.all(g[0] == 0)
    # soft target with mass on the masked class: +inf, finite gradient
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    out = losses.cross_entropy_loss(x, q, reduction="none")
    assert out[0].item() == INF
    (g,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(g).all()


ROW_FNS = {
    "cross_entropy_loss": losses.cross_entropy_loss,
    "cross_entropy_with_logz_penalty": losses.cross_entropy_with_logz_penalty,
    "comp_sum_loss": losses.comp_sum_loss,
    "adversarial_comp_sum_loss": adv,
    "sparsemax_loss": losses.sparsemax_loss,
    "dice_semimetric_loss": losses.dice_semimetric_loss,
}


@pytest.mark.parametrize("name", list(ROW_FNS))
def test_row_without_finite_logit_is_a_data_check(name):
    fn = ROW_FNS[name]
    x = torch.randn(5, 4)
    x[3] = NINF
    y = torch.tensor([0, 1, 2, 3, 0])
    with pytest.raises(ValueError, match=rf"^{name}: row 3 of input has no finite score \(got all -inf\); "
                                         r"unmask at least one class per row"):
        fn(x, y)
    y[3] = -100  # an ignored (padding) row may be fully masked
    out = fn(x, y)
    assert torch.isfinite(out)
    for bad in (math.nan, INF):  # NaN and +inf stay errors
        xb = torch.randn(5, 4)
        xb[1, 1] = bad
        with pytest.raises(ValueError, match=rf"^{name}: input contains NaN or \+inf"):
            fn(xb, torch.tensor([0, 1, 2, 3, 0]))
    x[3] = 0.0
    x[3, 0] = NINF
    with losses.validation(False):  # the check is a data check
        fn(torch.full((2, 4), NINF), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"row 0 of input has no finite score"):
        if name == "cross_entropy_loss":
            fn(torch.full((2, 4), NINF), torch.full((2, 4), 0.25))  # soft targets: every row is active
        else:
            fn(torch.full((2, 4), NINF), torch.tensor([0, 1]))


def test_z_loss_rejects_minus_inf_and_names_the_alternative():
    x = torch.randn(3, 5)
    x[0, 1] = NINF
    with pytest.raises(ValueError, match=r"^z_loss: input contains NaN or infinite values \(got 1 -inf\); "
                                         r"z_loss standardises the logits over all C classes.*cross_entropy_loss"):
        losses.z_loss(x, torch.tensor([0, 1, 2]))
    x[0, 1] = math.nan
    with pytest.raises(ValueError, match=r"^z_loss: input contains NaN .*overflow or divergence"):
        losses.z_loss(x, torch.tensor([0, 1, 2]))


def test_gol_and_bce_define_minus_inf_as_probability_zero():
    x = torch.tensor([[NINF, 0.5, -1.0], [0.3, NINF, 2.0]], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 0])  # row 0: target on -inf; row 1: -inf on a negative
    # BCE: label 0 -> 0, label > 0 -> +inf; gradient 0 there
    out = losses.bce_with_logits_loss(x, t, reduction="none")
    assert out[0, 0].item() == INF and out[1, 1].item() == 0.0
    y = torch.nn.functional.one_hot(t, 3).double()
    for i in range(2):
        for k in range(3):
            v = x[i, k].item()
            exp = (0.0 if y[i, k] == 0 else INF) if v == NINF else (
                max(v, 0) + math.log1p(math.exp(-abs(v))) - y[i, k].item() * v)
            assert out[i, k].item() == pytest.approx(exp, rel=1e-14) or out[i, k].item() == exp
    (g,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(g).all() and g[0, 0] == 0 and g[1, 1] == 0
    xs = torch.tensor([[NINF, 0.5, -1.0]], dtype=torch.float64)
    assert losses.bce_with_logits_loss(xs, torch.tensor([0])).item() == INF
    assert losses.bce_with_logits_loss(xs, torch.tensor([1]), label_smoothing=0.1).item() == INF
    # GOL: -inf is evaluated at the -50 floor: label 0 costs 0, label y costs y e^50; gradient 0
    out = losses.gumbel_bce_loss(x, t, reduction="none")
    assert out[0, 0].item() == pytest.approx(math.exp(50.0), rel=1e-14)
    assert out[1, 1].item() == pytest.approx(0.0, abs=1e-300)
    (g,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(g).all() and g[0, 0] == 0 and g[1, 1] == 0
    out_s = losses.gumbel_bce_loss(x, t, label_smoothing=0.3, reduction="none")
    yt = 1 - 0.3 + 0.1
    assert out_s[0, 0].item() == pytest.approx(yt * math.exp(50.0), rel=1e-12)
    assert out_s[1, 1].item() == pytest.approx(0.1 * math.exp(50.0), rel=1e-12)
    (g,) = torch.autograd.grad(out_s.sum(), x)
    assert g[0, 0] == 0 and g[1, 1] == 0
    x32 = x.detach().float()
    torch.testing.assert_close(losses.gumbel_bce_loss(x32, t, reduction="none"),
                               losses.gumbel_bce_loss(x32.clamp(min=-50.0), t, reduction="none"), rtol=0, atol=0)


def test_dice_minus_inf_is_probability_zero():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, 6, generator=g, dtype=torch.float64)
    x[0, 1, :3] = NINF
    x[1, 3, 2] = NINF
    t = torch.randint(0, 4, (2, 6), generator=g)
    t[0, :3] = 0
    x.requires_grad_(True)
    p = torch.zeros_like(x)
    for b in range(2):
        for s in range(6):
            p[b, :, s] = torch.tensor(softmax_row(x[b, :, s].tolist()), dtype=torch.float64)
    for fn in (losses.dice_semimetric_loss, losses.jaccard_metric_loss, losses.soft_dice_loss):
        out = fn(x, t, smooth=0.5)
        torch.testing.assert_close(out, fn(p, t, activation="none", smooth=0.5), rtol=1e-12, atol=0)
        (gx,) = torch.autograd.grad(out, x)
        assert torch.isfinite(gx).all() and torch.all(gx[x.detach() == NINF] == 0)
        out = fn(x, t, activation="sigmoid")
        (gx,) = torch.autograd.grad(out, x)
        assert torch.isfinite(gx).all() and torch.all(gx[x.detach() == NINF] == 0)


# --------------------------------------------------------------------------------------
# 2. all-ignored batches holding +-inf (validation off): exact 0, exactly zero gradients
# --------------------------------------------------------------------------------------

IGNORED = {
    "z_loss": lambda x, t, r: losses.z_loss(x, t, reduction=r),
    "logz": lambda x, t, r: losses.cross_entropy_with_logz_penalty(x, t, coef=0.1, reduction=r),
    "logz_penalty": lambda x, t, r: losses.logz_penalty(x, mask=t != -100, reduction=r),
    "sparsemax": lambda x, t, r: losses.sparsemax_loss(x, t, reduction=r),
    "sparsemax_k": lambda x, t, r: losses.sparsemax_loss(x, t, k=2, reduction=r),
    "entmax15": lambda x, t, r: losses.entmax15_loss(x, t, reduction=r),
    "entmax_bisect": lambda x, t, r: losses.entmax_bisect_loss(x, t, reduction=r),
    "comp_sum_05": lambda x, t, r: losses.comp_sum_loss(x, t, tau=0.5, reduction=r),
    "comp_sum_2": lambda x, t, r: losses.comp_sum_loss(x, t, tau=2.0, reduction=r),
    "ce": lambda x, t, r: losses.cross_entropy_loss(x, t, reduction=r),
    "ce_smooth_weight": lambda x, t, r: losses.cross_entropy_loss(
        x, t, label_smoothing=0.1, weight=torch.ones(x.shape[1], dtype=x.dtype), reduction=r),
    "adversarial": lambda x, t, r: adv(x, t, tau=0.5, reduction=r),
    "bce": lambda x, t, r: losses.bce_with_logits_loss(x, t, reduction=r),
    "gol": lambda x, t, r: losses.gumbel_bce_loss(x, t, reduction=r),
    "gol_smooth": lambda x, t, r: losses.gumbel_bce_loss(x, t, label_smoothing=0.1, reduction=r),
    "dice": lambda x, t, r: losses.dice_semimetric_loss(x, t, reduction=r),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(IGNORED))
def test_all_ignored_with_infinities_gives_exact_zero_and_zero_gradients(name, dtype):
    fn = IGNORED[name]
    x = torch.randn(4, 5, dtype=torch.float64)
    x[0, 1], x[1, 3], x[2] = INF, NINF, INF
    x[3] = NINF
    x = x.to(dtype).requires_grad_(True)
    t = torch.full((4,), -100)
    with losses.validation(False):
        for red in ("mean", "sum"):
            out = fn(x, t, red)
            assert out.item() == 0.0 and out.grad_fn is not None
            (g,) = torch.autograd.grad(out, x)
            assert torch.all(g == 0), g
        # some rows valid: the ignored ones (holding +-inf) still give exact zero gradients
        tv = torch.tensor([-100, -100, -100, -100])
        xv = torch.cat([x.detach(), torch.randn(2, 5, dtype=dtype)]).requires_grad_(True)
        tv = torch.cat([tv, torch.tensor([1, 2])])
        out = fn(xv, tv, "mean")
        assert torch.isfinite(out)
        (g,) = torch.autograd.grad(out, xv)
        assert torch.all(g[:4] == 0) and torch.isfinite(g).all()


# --------------------------------------------------------------------------------------
# 3. degenerate inputs
# --------------------------------------------------------------------------------------

SOFTMAX_FAMILY = {
    "cross_entropy_loss": losses.cross_entropy_loss,
    "cross_entropy_with_logz_penalty": losses.cross_entropy_with_logz_penalty,
    "comp_sum_loss": losses.comp_sum_loss,
    "adversarial_comp_sum_loss": adv,
    "sparsemax_loss": losses.sparsemax_loss,
    "entmax15_loss": losses.entmax15_loss,
    "entmax_bisect_loss": losses.entmax_bisect_loss,
}


@pytest.mark.parametrize("name", list(SOFTMAX_FAMILY))
def test_one_logit_is_refused_with_a_pointer_to_bce(name):
    with pytest.raises(ValueError, match=rf"^{name}: a softmax over a single class .*\(got C=1\); "
                                         r".*bce_with_logits_loss"):
        SOFTMAX_FAMILY[name](torch.randn(4, 1), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=rf"^{name}: a softmax over a single class"):
        SOFTMAX_FAMILY[name](torch.randn(4, 1, 3), torch.zeros(4, 3, dtype=torch.long))


def test_other_degenerate_inputs():
    with pytest.raises(ValueError, match=r"^dice_semimetric_loss: a softmax over a single class .*"
                                         r"activation='sigmoid'"):
        losses.dice_semimetric_loss(torch.randn(2, 1, 4), torch.zeros(2, 4, dtype=torch.long))
    losses.dice_semimetric_loss(torch.randn(2, 1, 4), torch.zeros(2, 4, dtype=torch.long), activation="sigmoid")
    with pytest.raises(ValueError, match=r"^z_loss: needs at least 3 classes \(got C=2\)"):
        losses.z_loss(torch.randn(4, 2), torch.zeros(4, dtype=torch.long))
    # the element-wise losses are fine with one logit
    assert torch.isfinite(losses.bce_with_logits_loss(torch.randn(4, 1), torch.zeros(4, dtype=torch.long)))
    assert torch.isfinite(losses.gumbel_bce_loss(torch.randn(4, 1), torch.zeros(4, dtype=torch.long)))


def test_soft_targets_must_sum_to_one():
    x = torch.randn(3, 4, dtype=torch.float64)
    q = torch.full((3, 4), 0.25, dtype=torch.float64)
    q[1] = torch.tensor([0.3, 0.3, 0.2, 0.202])  # row sum 1.002
    with pytest.raises(ValueError, match=r"^cross_entropy_loss: float target must be a distribution over dim 1 "
                                         r"\(non-negative, summing to 1 within 0.001\) \(got min=0.2, max \|row sum - 1\|"
                                         r"=0.002\); normalise it"):
        losses.cross_entropy_loss(x, q)
    q[1, 3] = 0.2009  # within 1e-3 relative: accepted
    torch.testing.assert_close(losses.cross_entropy_loss(x, q, reduction="none"),
                               torch.tensor([ce_soft_row(x[i].tolist(), q[i].tolist()) for i in range(3)],
                                            dtype=torch.float64), rtol=1e-12, atol=0)
    q[1, 3] = 0.5
    with losses.validation(False):
        losses.cross_entropy_loss(x, q)
    with pytest.raises(ValueError, match=r"^sparsemax_loss: float target must be a distribution over dim 1"):
        losses.sparsemax_loss(x, q)


WEIGHTED = {
    "cross_entropy_loss": lambda x, t, w: losses.cross_entropy_loss(x, t, weight=w),
    "bce_with_logits_loss": lambda x, t, w: losses.bce_with_logits_loss(x, t, weight=w),
    "gumbel_bce_loss": lambda x, t, w: losses.gumbel_bce_loss(x, t, weight=w),
    "dice_semimetric_loss": lambda x, t, w: losses.dice_semimetric_loss(x, t, weight=w),
    "jaccard_metric_loss": lambda x, t, w: losses.jaccard_metric_loss(x, t, weight=w),
}


@pytest.mark.parametrize("name", list(WEIGHTED))
def test_class_weights_negative_or_all_zero_are_refused(name):
    fn = WEIGHTED[name]
    x, t = torch.randn(3, 4), torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=rf"^{name}: weight must be non-negative \(got min=-0.5\)"):
        fn(x, t, torch.tensor([1.0, -0.5, 1.0, 1.0]))
    with pytest.raises(ValueError, match=rf"^{name}: weight is zero for every class, so nothing would be trained"):
        fn(x, t, torch.zeros(4))
    with pytest.raises(TypeError, match=rf"^{name}: weight must be a real-valued tensor"):
        fn(x, t, torch.ones(4, dtype=torch.bool))
    torch.testing.assert_close(fn(x, t, torch.tensor([1, 0, 2, 1])), fn(x, t, torch.tensor([1.0, 0.0, 2.0, 1.0])))
    assert torch.isfinite(fn(x, t, torch.tensor([1.0, 0.0, 2.0, 1.0])))
    with losses.validation(False):  # data checks
        fn(x, t, torch.zeros(4))
    for mod, kw in ((losses.CrossEntropyLoss, {}), (losses.GumbelBCELoss, {})):
        with pytest.raises(ValueError, match="weight is zero for every class"):
            mod(weight=torch.zeros(4), **kw)(x, t)


# --------------------------------------------------------------------------------------
# 4. data checks under torch.compile: one warning per process
# --------------------------------------------------------------------------------------


def test_compile_with_validation_on_warns_once():
    torch._dynamo.reset()
    previous = _core._COMPILE_WARNED
    _core._COMPILE_WARNED = False
    try:
        x, t = torch.randn(4, 5), torch.tensor([0, 1, 2, 3])
        f = torch.compile(lambda a, b: losses.cross_entropy_loss(a, b) + losses.z_loss(a, b), backend="eager")
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            out = f(x, t)
            out2 = f(x + 1, t)
        msgs = [str(w.message) for w in rec if issubclass(w.category, UserWarning)
                and "data checks are skipped" in str(w.message)]
        assert len(msgs) == 1 and "losses.validation(False)" in msgs[0]
        torch.testing.assert_close(out, losses.cross_entropy_loss(x, t) + losses.z_loss(x, t))
        assert torch.isfinite(out2)
        # once per process: a second compiled function does not warn again
        g = torch.compile(lambda a, b: losses.comp_sum_loss(a, b, tau=0.5), backend="eager")
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            g(x, t)
        assert not [w for w in rec if "data checks are skipped" in str(w.message)]
        # fullgraph=True still compiles (the warning needs no graph break), and the once-flag
        # flipping does not force a recompilation
        _core._COMPILE_WARNED = False
        torch._dynamo.reset()
        from torch._dynamo.testing import CompileCounter

        counter = CompileCounter()
        k = torch.compile(lambda a, b: losses.cross_entropy_loss(a, b, label_smoothing=0.1), backend=counter,
                          fullgraph=True)
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            k(x, t)
            k(x * 2, t)
        assert len([w for w in rec if "data checks are skipped" in str(w.message)]) == 1
        assert counter.frame_count == 1
        # validation off: no warning at all
        _core._COMPILE_WARNED = False
        h = torch.compile(lambda a, b: losses.sparsemax_loss(a, b), backend="eager")
        with losses.validation(False), warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            h(x, t)
        assert not [w for w in rec if "data checks are skipped" in str(w.message)]
        # eager calls do not warn
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            losses.cross_entropy_loss(x, t)
        assert not [w for w in rec if "data checks are skipped" in str(w.message)]
    finally:
        _core._COMPILE_WARNED = previous
        torch._dynamo.reset()


# --------------------------------------------------------------------------------------
# 5. one exception type per mistake
# --------------------------------------------------------------------------------------

FLOAT_LABELS = {
    "z_loss": losses.z_loss,
    "cross_entropy_with_logz_penalty": losses.cross_entropy_with_logz_penalty,
    "comp_sum_loss": losses.comp_sum_loss,
    "adversarial_comp_sum_loss": adv,
    "cross_entropy_loss": losses.cross_entropy_loss,
    "bce_with_logits_loss": losses.bce_with_logits_loss,
    "gumbel_bce_loss": losses.gumbel_bce_loss,
    "sparsemax_loss": losses.sparsemax_loss,
    "entmax15_loss": losses.entmax15_loss,
    "entmax_bisect_loss": losses.entmax_bisect_loss,
    "dice_semimetric_loss": losses.dice_semimetric_loss,
    "jaccard_metric_loss": losses.jaccard_metric_loss,
    "soft_dice_loss": losses.soft_dice_loss,
}


@pytest.mark.parametrize("name", list(FLOAT_LABELS))
def test_float_labels_are_a_type_error_without_a_corrupting_hint(name):
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match=rf"^{name}: ") as info:
        FLOAT_LABELS[name](x, torch.tensor([0.0, 1.0, 2.0]))
    assert ".long()" not in str(info.value)
    with pytest.raises(TypeError, match=rf"^{name}: "):
        FLOAT_LABELS[name](x, torch.tensor([True, False, True]))


def test_soft_targets_to_an_id_only_loss_never_suggest_casting():
    q = torch.softmax(torch.randn(3, 4), 1)
    for fn in (losses.z_loss, losses.comp_sum_loss, losses.cross_entropy_with_logz_penalty):
        with pytest.raises(TypeError, match=r"must hold integer class ids") as info:
            fn(torch.randn(3, 4), q)
        assert ".long()" not in str(info.value) and "cross_entropy_loss" in str(info.value)


def test_wrong_kind_of_flag_int_or_seed_is_a_type_error():
    x, t = torch.randn(3, 4), torch.tensor([0, 1, 2])
    cases = [
        (lambda: losses.cross_entropy_with_logz_penalty(x, t, return_penalty=1), "return_penalty must be a bool"),
        (lambda: losses.CrossEntropyWithLogZPenalty(return_penalty="yes"), "return_penalty must be a bool"),
        (lambda: losses.dice_semimetric_loss(x, t, log_loss=0), "log_loss must be a bool"),
        (lambda: losses.SoftDiceLoss(gather_distributed=1), "gather_distributed must be a bool"),
        (lambda: losses.sparsemax_loss(x, t, k=2.0), "k must be None or a positive int"),
        (lambda: losses.entmax_bisect(x, n_iter=10.0), "n_iter must be a positive int"),
        (lambda: _quiet(losses.AdversarialCompSumLoss, nu=1.0, seed=1.5), "seed must be an int or None"),
        (lambda: _quiet(losses.AdversarialCompSumLoss, nu=1.0, steps=2.0), "steps must be an integer >= 0"),
    ]
    for call, msg in cases:
        with pytest.raises(TypeError, match=msg):
            call()
    with pytest.raises(ValueError, match=r"k must be None or a positive int \(got 0\)"):
        losses.sparsemax_loss(x, t, k=0)
    with pytest.raises(ValueError, match=r"steps must be an integer >= 0 \(got -1\)"):
        _quiet(losses.AdversarialCompSumLoss, nu=1.0, steps=-1)


def test_core_checkers():
    assert _core.check_bool("f", "flag", True) is True
    with pytest.raises(TypeError, match=r"^f: flag must be a bool \(got 1\); pass True or False$"):
        _core.check_bool("f", "flag", 1)
    assert _core.check_int("f", "n", 3, low=1) == 3
    assert _core.check_seed("f", None) is None and _core.check_seed("f", 7) == 7
    for bad in (1.0, True, "3", None):
        with pytest.raises(TypeError, match=r"^f: n must be a positive int"):
            _core.check_int("f", "n", bad, low=1)
    with pytest.raises(ValueError, match=r"^f: n must be a positive int \(got 0\)"):
        _core.check_int("f", "n", 0, low=1)
    for bad in (1.5, "0", False, torch.tensor(3.0), torch.tensor(True)):
        with pytest.raises(TypeError, match=r"^f: seed must be an int or None"):
            _core.check_seed("f", bad)
    # integers as torch takes them: a one-element integer tensor, a NumPy integer
    assert _core.check_seed("f", torch.tensor(3)) == 3 and type(_core.check_seed("f", torch.tensor(3))) is int


# --------------------------------------------------------------------------------------
# 6. mixed precision: forward and backward inside CPU bf16 autocast
# --------------------------------------------------------------------------------------


def _autocast_cases():
    t = torch.tensor([0, 1, 2, 3, 1])
    q = torch.softmax(torch.randn(5, 4, generator=torch.Generator().manual_seed(2)), 1)
    t2 = torch.tensor([[0, 1, 2], [3, 1, 0], [2, 2, 1], [0, 3, 3], [1, 0, 2]])
    return {
        "z_loss": (losses.z_loss, t, {}), "ZLoss": (losses.ZLoss(), t, {}),
        "logz": (losses.cross_entropy_with_logz_penalty, t, {}),
        "CrossEntropyWithLogZPenalty": (losses.CrossEntropyWithLogZPenalty(coef=0.1), t, {}),
        "logz_penalty": (lambda x, _t: losses.logz_penalty(x, coef=0.1), t, {}),
        "sparsemax": (losses.sparsemax_loss, t, {}), "SparsemaxLoss": (losses.SparsemaxLoss(k=2), t, {}),
        "entmax15": (losses.entmax15_loss, q, {}), "Entmax15Loss": (losses.Entmax15Loss(), t, {}),
        "entmax_bisect": (losses.entmax_bisect_loss, t, {}), "EntmaxBisectLoss": (losses.EntmaxBisectLoss(), t, {}),
        "comp_sum": (losses.comp_sum_loss, t, {"tau": 0.5}), "CompSumLoss": (losses.CompSumLoss(tau=1.5), t, {}),
        "adversarial": (lambda x, y: _quiet(losses.adversarial_comp_sum_loss, x, x.flip(0), y, nu=0.5), t, {}),
        "ce": (losses.cross_entropy_loss, t, {"label_smoothing": 0.1}), "ce_soft": (losses.cross_entropy_loss, q, {}),
        "CrossEntropyLoss": (losses.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 1.0, 0.5])), t, {}),
        "bce": (losses.bce_with_logits_loss, t, {}), "BCEWithLogitsLoss": (losses.BCEWithLogitsLoss(), q, {}),
        "gol": (losses.gumbel_bce_loss, t, {}), "gol_reference": (losses.gumbel_bce_loss, t, {"variant": "reference"}),
        "GumbelBCELoss": (losses.GumbelBCELoss(label_smoothing=0.1), t, {}),
        "entmax_bisect_alpha": (lambda x, y: losses.entmax_bisect_loss(x, y, alpha=torch.tensor(1.3)), t, {}),
        "dice": (losses.dice_semimetric_loss, t2, {}), "JaccardMetricLoss": (losses.JaccardMetricLoss(), t2, {}),
        "DiceSemimetricLoss": (losses.DiceSemimetricLoss(aggregate="class"), t2, {}),
        "SoftDiceLoss": (losses.SoftDiceLoss(aggregate="image"), t2, {}),
    }


@pytest.mark.parametrize("case", list(_autocast_cases()))
def test_forward_and_backward_under_cpu_bf16_autocast(case):
    fn, t, kw = _autocast_cases()[case]
    g = torch.Generator().manual_seed(11)
    spatial = t.dim() == 2 and not t.is_floating_point()
    shape = (5, 4, 3) if spatial else (5, 4)
    feats = torch.randn(5, 6, generator=g)
    head = torch.nn.Linear(6, 4 * (3 if spatial else 1))
    # a head inside autocast produces bf16 logits; the loss runs in float32 and backpropagates
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = head(feats).reshape(shape)
        assert logits.dtype == torch.bfloat16
        out = fn(logits, t, **kw)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    out.sum().backward()
    assert head.weight.grad.dtype == torch.float32 and torch.isfinite(head.weight.grad).all()
    ref = fn(logits.detach().float(), t, **kw)
    torch.testing.assert_close(out.detach(), ref, rtol=1e-6, atol=1e-7)
    # float32 inputs inside autocast give the float32 result and gradient (not a bf16 one)
    x = torch.randn(shape, generator=g).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn(x, t, **kw)
        (gx,) = torch.autograd.grad(out.sum(), x)
    x2 = x.detach().clone().requires_grad_(True)
    ref = fn(x2, t, **kw)
    (gr,) = torch.autograd.grad(ref.sum(), x2)
    assert out.dtype == torch.float32 and gx.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(gx, gr, rtol=1e-5, atol=1e-7)


def test_adversarial_module_and_gumbel_activation_under_autocast():
    g = torch.Generator().manual_seed(8)
    x, t = torch.rand(5, 6, generator=g), torch.tensor([0, 1, 2, 3, 1])
    model = torch.nn.Linear(6, 4)
    loss_fn = _quiet(losses.AdversarialCompSumLoss, nu=1.0, tau=0.5, steps=2, seed=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = loss_fn(model, x, t)
    assert out.dtype == torch.float32 and torch.isfinite(out)
    out.backward()
    assert model.weight.grad.dtype == torch.float32 and torch.isfinite(model.weight.grad).all()
    q = torch.randn(3, 4, generator=g).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eta = losses.gumbel_activation(q)
        (gq,) = torch.autograd.grad(eta.sum(), q)
    torch.testing.assert_close(eta, torch.exp(-torch.exp(-q.detach())), rtol=1e-6, atol=0)
    assert gq.dtype == torch.float32 and torch.isfinite(gq).all()


@pytest.mark.parametrize("mapping", ["sparsemax", "entmax15", "entmax_bisect"])
def test_mappings_return_the_input_dtype_and_compute_in_float32(mapping):
    fn = getattr(losses, mapping)
    x = torch.randn(6, 9, generator=torch.Generator().manual_seed(4))
    for dtype in (torch.bfloat16, torch.float16):
        xh = x.to(dtype).requires_grad_(True)
        p = fn(xh)
        assert p.dtype == dtype
        torch.testing.assert_close(p, fn(xh.detach().float()).to(dtype), rtol=0, atol=0)
        (gx,) = torch.autograd.grad(p.float().pow(2).sum(), xh)
        assert gx.dtype == dtype and torch.isfinite(gx).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        head = torch.nn.Linear(9, 9)
        z = head(x)
        p = fn(z, dim=1)
        assert p.dtype == torch.bfloat16
        p.float().pow(2).sum().backward()
    assert torch.isfinite(head.weight.grad).all()
    assert fn(x.double()).dtype == torch.float64 and fn(x).dtype == torch.float32
    # the modules' predict_proba stays in the loss's compute dtype (float32 for half logits)
    module = {"sparsemax": losses.SparsemaxLoss(), "entmax15": losses.Entmax15Loss(),
              "entmax_bisect": losses.EntmaxBisectLoss()}[mapping]
    pp = module.predict_proba(x.to(torch.bfloat16))
    assert pp.dtype == torch.float32
    torch.testing.assert_close(pp, fn(x.to(torch.bfloat16).float(), dim=1), rtol=0, atol=0)


# --------------------------------------------------------------------------------------
# 7. float64 exact to 1e-12 at large magnitudes (no float32-tuned shortcuts)
# --------------------------------------------------------------------------------------


def _big_logits():
    return torch.tensor([[35.0, -42.0, 58.0, 0.5], [-60.0, 31.5, 44.0, -33.0], [47.0, 47.5, -30.0, 59.0]],
                        dtype=torch.float64)


def test_bce_float64_is_exact_at_large_logits():
    x = _big_logits().requires_grad_(True)
    t = torch.tensor([2, 1, 0])
    out = losses.bce_with_logits_loss(x, t, reduction="none")
    y = torch.nn.functional.one_hot(t, 4).double()
    for i in range(3):
        for k in range(4):
            v, yy = x[i, k].item(), y[i, k].item()
            # y = 1: log(1 + e^-v); y = 0: v + log(1 + e^-v) (exact; F.softplus linearises above 20)
            # (written without cancellation: y = 1 at v = 58 is e^-58, not 58 - 58)
            exp = math.log1p(math.exp(-abs(v))) + (1 - yy) * max(v, 0) + yy * max(-v, 0)
            assert out[i, k].item() == pytest.approx(exp, rel=1e-13, abs=0)
    (g,) = torch.autograd.grad(out.sum(), x)
    # sigmoid(v) - y, as sigmoid(v) (y = 0) or -sigmoid(-v) (y = 1): no 1 - 1 at v = 58
    sig = [[(1 - yy) / (1 + math.exp(-v)) - yy / (1 + math.exp(v)) for v, yy in zip(row, yrow)]
           for row, yrow in zip(x.tolist(), y.tolist())]
    torch.testing.assert_close(g, torch.tensor(sig, dtype=torch.float64), rtol=1e-12, atol=0)


def _neg_log1m_exp_neg(u):
    """-log(1 - exp(-u)) to full float64 precision: log1p when exp(-u) is small, expm1 otherwise."""
    eta = math.exp(-u)
    return -math.log1p(-eta) if eta < 0.5 else -math.log(-math.expm1(-u))


def test_gol_float64_is_exact_everywhere():
    q = torch.tensor([[-4.0, -3.0, -2.5, -1.0], [0.0, 2.0, 30.0, 45.0], [60.0, -0.5, 12.0, 21.0]],
                     dtype=torch.float64, requires_grad=True)
    t = torch.tensor([2, 3, 0])
    for eps in (0.0, 0.2):
        out = losses.gumbel_bce_loss(q, t, label_smoothing=eps, reduction="none")
        (g,) = torch.autograd.grad(out.sum(), q)
        for i in range(3):
            for k in range(4):
                v = q[i, k].item()
                y = (1 - eps) * (k == int(t[i])) + eps / 4
                u = math.exp(-v)
                b = _neg_log1m_exp_neg(u)  # -log(1 - eta), eta = exp(-u)
                val = y * u + (1 - y) * b
                grad = -y * u + (1 - y) * u / math.expm1(u)
                assert out[i, k].item() == pytest.approx(val, rel=1e-12, abs=0), (i, k, eps)
                assert g[i, k].item() == pytest.approx(grad, rel=1e-12, abs=0), (i, k, eps)
    # dense soft / multi-hot labels
    y = torch.rand(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    y[0, 0], y[1, 3] = 1.0, 0.0
    out = losses.gumbel_bce_loss(q, y, reduction="none")
    (g,) = torch.autograd.grad(out.sum(), q)
    for i in range(3):
        for k in range(4):
            v, yy = q[i, k].item(), y[i, k].item()
            u = math.exp(-v)
            assert out[i, k].item() == pytest.approx(yy * u + (1 - yy) * _neg_log1m_exp_neg(u), rel=1e-12, abs=0)
            assert g[i, k].item() == pytest.approx(-yy * u + (1 - yy) * u / math.expm1(u), rel=1e-12, abs=0)


def test_softmax_family_float64_exact_at_large_logits():
    x = _big_logits()
    t = torch.tensor([1, 3, 2])  # O(1)..O(100) losses (no catastrophic 1 - p_y)
    rows = x.tolist()
    torch.testing.assert_close(losses.cross_entropy_loss(x, t, label_smoothing=0.1, reduction="none"),
                               torch.tensor([ce_row(r, int(y), eps=0.1) for r, y in zip(rows, t)],
                                            dtype=torch.float64), rtol=1e-12, atol=0)
    torch.testing.assert_close(losses.cross_entropy_with_logz_penalty(x, t, coef=1e-2, reduction="none"),
                               torch.tensor([ce_row(r, int(y)) + 1e-2 * _lse(r) ** 2 for r, y in zip(rows, t)],
                                            dtype=torch.float64), rtol=1e-12, atol=0)
    for tau in (0.0, 0.9, 1.0, 1.5):
        torch.testing.assert_close(losses.comp_sum_loss(x, t, tau=tau, reduction="none"),
                                   torch.tensor([comp_sum_row(r, int(y), tau) for r, y in zip(rows, t)],
                                                dtype=torch.float64), rtol=1e-12, atol=0)
    for a, b in ((1.0, 0.0), (2.0, 1.5)):
        expected = []
        for r, y in zip(rows, t.tolist()):
            mu = math.fsum(r) / 4
            v = math.fsum((o - mu) ** 2 for o in r) / 4
            z = (r[y] - mu) / math.sqrt(v + 1e-6)
            arg = a * (b - z)
            expected.append((max(arg, 0) + math.log1p(math.exp(-abs(arg)))) / a)
        torch.testing.assert_close(losses.z_loss(x, t, a=a, b=b, reduction="none"),
                                   torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)
    for name, (fn, alpha) in FY.items():
        torch.testing.assert_close(fn(x, t, reduction="none"),
                                   torch.tensor([fy_row(r, int(y), alpha) for r, y in zip(rows, t)],
                                                dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_one_exception_type_per_mistake_across_the_library():
    """Argument checks of every family use the shared checkers: wrong kind -> TypeError,
    wrong value -> ValueError."""
    pos, neg = torch.randn(2, 1), torch.randn(2, 3)
    s, t = torch.randn(2, 4), torch.tensor([0, 1])
    kind = [
        (lambda: losses.PartialFCLoss(2, 5, seed=1.5), r"^PartialFCLoss: seed must be an int or None"),
        (lambda: losses.PartialFCLoss(2, 5, distributed=1), r"^PartialFCLoss: distributed must be a bool"),
        (lambda: losses.PartialFCLoss(2.0, 5), r"^PartialFCLoss: embedding_dim must be a positive int"),
        (lambda: losses.DecoupledSoftmaxLoss(seed="0"), r"^DecoupledSoftmaxLoss: seed must be an int or None"),
        (lambda: losses.SoftTopKLoss(k=2, seed=2.0), r"^SoftTopKLoss: seed must be an int or None"),
        (lambda: losses.decoupled_softmax_loss(s, t, weighted=1), r"^decoupled_softmax_loss: weighted must be a bool"),
        (lambda: losses.soft_topk_loss(s, t, k=2, n_iter=3.0), r"^soft_topk_loss: n_iter must be an int >= 1"),
        (lambda: losses.psl_loss(pos, neg, bounded_scores=None), r"^psl_loss: bounded_scores must be a bool"),
        (lambda: losses.MarginSoftmaxLoss(4, 3.0), r"^MarginSoftmaxLoss: num_classes must be a positive int"),
        (lambda: losses.WCDASLoss(True, 5), r"^WCDASLoss: embedding_dim must be a positive int"),
        (lambda: losses.NBCSoftmaxLoss(3, 5.0), r"^NBCSoftmaxLoss: num_classes must be a positive int"),
        (lambda: losses.LinearCrossEntropyLoss(3, 7, chunk_size=2.0),
         r"^LinearCrossEntropyLoss: chunk_size must be a positive int or None"),
        (lambda: losses.linear_cross_entropy(torch.randn(2, 3), t, torch.randn(4, 3), chunk_size="2"),
         r"^linear_cross_entropy: chunk_size must be a positive int or None"),
        (lambda: losses.margin_softmax_loss(torch.randn(2, 3), t.float(), torch.randn(4, 3)),
         r"^margin_softmax_loss: target must hold integer class ids"),
    ]
    for call, pattern in kind:
        with pytest.raises(TypeError, match=pattern) as info:
            call()
        assert ".long()" not in str(info.value)
    value = [
        (lambda: losses.PartialFCLoss(0, 5), r"^PartialFCLoss: embedding_dim must be a positive int \(got 0\)"),
        (lambda: losses.NBCSoftmaxLoss(3, 0), r"^NBCSoftmaxLoss: num_classes must be a positive int \(got 0\)"),
        (lambda: losses.soft_topk_loss(s, t, k=2, n_iter=0), r"^soft_topk_loss: n_iter must be an int >= 1"),
        (lambda: losses.LinearCrossEntropyLoss(3, 7, chunk_size=0), r"^LinearCrossEntropyLoss: chunk_size must be"),
    ]
    for call, pattern in value:
        with pytest.raises(ValueError, match=pattern):
            call()


SOFT_TARGET_LOSSES = ["cross_entropy_loss", "bce_with_logits_loss", "gumbel_bce_loss", "sparsemax_loss", "entmax15_loss",
                      "dice_semimetric_loss", "jaccard_metric_loss", "soft_dice_loss"]


@pytest.mark.parametrize("fn_name", SOFT_TARGET_LOSSES)
def test_float64_soft_target_makes_the_loss_float64(fn_name):
    """The dtype rule counts every floating input: float32 logits with float64 soft targets are
    computed in float64 (the target is not rounded to float32), equal to the all-float64 loss."""
    fn = getattr(losses, fn_name)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4, 5, generator=g)
    q = torch.softmax(torch.randn(4, 5, generator=g, dtype=torch.float64), dim=1)
    leaf = x.clone().requires_grad_()
    out = fn(leaf, q)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, fn(x.double(), q), rtol=1e-12, atol=0)
    out.backward()
    assert leaf.grad.dtype == torch.float32


@pytest.mark.parametrize("fn_name", ["bce_with_logits_loss", "gumbel_bce_loss"])
@pytest.mark.parametrize("n", [0, 3])
def test_class_ids_with_zero_classes_are_a_value_error(fn_name, n):
    # (0, 0) logits once gave NaN (BCE) or a ZeroDivisionError (GOL)
    fn = getattr(losses, fn_name)
    for reduction in ("none", "mean", "sum"):
        with pytest.raises(ValueError, match=rf"^{fn_name}: input needs at least one class on dim 1 for class ids"):
            fn(torch.zeros(n, 0), torch.zeros(n, dtype=torch.long), reduction=reduction)


@pytest.mark.parametrize("fn_name", ["sparsemax", "entmax15", "entmax_bisect"])
def test_mappings_of_an_empty_dim_are_empty_like_softmax(fn_name):
    fn = getattr(losses, fn_name)
    for shape, dim in (((3, 0), -1), ((0, 4), -1), ((2, 0, 3), 1)):
        x = torch.zeros(shape, requires_grad=True)
        p = fn(x, dim=dim)
        assert p.shape == torch.softmax(x, dim=dim).shape == shape
        p.sum().backward()
        assert x.grad.shape == shape
