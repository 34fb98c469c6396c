"""The CPU kernel of GOL, the log-Z penalty, comp-sum and the Z-loss (losses/kernels/rows_native.py)
against the float64 PyTorch paths, on every instruction-set variant this CPU runs."""

from __future__ import annotations

import math

import pytest
import torch

import losses
from losses.kernels import rows_native as native

if not native.ready():  # pragma: no cover - no C compiler on this machine
    pytest.skip(f"the GOL kernel is not built here: {native.available()[1]}", allow_module_level=True)

VARIANTS = native.variants()


def _inputs(m=9, c=133, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, c, generator=g, dtype=torch.float64) * 6).float().double()
    x[1, 3] = -math.inf  # probability 0: the -50 floor, zero gradient
    x[2, 5] = -60.0  # below the floor
    x[2, 6] = -50.0  # at the floor: its gradient is kept
    x[3, 7] = 85.0  # beyond q = 80: b = q
    x[3, 8] = 120.0
    x[4, 9] = 1e-4  # u close to 1: the polynomial / exp boundary region
    x[4, 10] = math.log(2.0)  # u = 0.5
    y = torch.randint(0, c, (m,), generator=g)
    y[5] = -100
    y[1] = 3  # a label on the -inf logit: its value e^50, its gradient 0 (below the floor)
    y[2] = 6  # a label on the logit at the floor: its gradient -u = -e^50 is kept
    return x, y


def _pytorch(x, y, **kw):
    native.enabled = False
    try:
        xr = x.clone().requires_grad_(True)
        out = losses.gumbel_bce_loss(xr, y, **kw)
        out.backward()
        return out.detach(), xr.grad
    finally:
        native.enabled = True


@pytest.mark.parametrize("which", VARIANTS)
def test_exp_and_log_to_float32_precision(which):
    v = torch.linspace(-87.0, 88.0, 200_001)
    e = native.unary("exp", v, which).double()
    ref = torch.exp(v.double())
    assert float(((e - ref).abs() / ref).max()) < 2.5e-7
    x = torch.logspace(-37, 38, 200_001)
    lg = native.unary("log", x, which).double()
    ref = torch.log(x.double())
    assert float(((lg - ref).abs() / ref.abs().clamp_min(1.0)).max()) < 2e-7
    near = torch.linspace(0.5, 2.0, 100_001)
    assert float((native.unary("log", near, which).double() - torch.log(near.double())).abs().max()) < 1.2e-7


@pytest.mark.parametrize("which", VARIANTS)
@pytest.mark.parametrize("kw", [{}, {"label_smoothing": 0.1}, {"weight": "rand"}, {"reduction": "sum"}],
                         ids=["plain", "smoothing", "weight", "sum"])
def test_values_and_gradients_match_float64(which, kw):
    x, y = _inputs()
    if kw.get("weight") == "rand":
        kw = {"weight": torch.rand(x.shape[1], generator=torch.Generator().manual_seed(1)).double() + 0.1}
    ref, ref_grad = _pytorch(x, y, **kw)
    eps = kw.get("label_smoothing", 0.0)
    w = kw.get("weight")
    kept = int((y != -100).sum()) * x.shape[1]
    scale = 1.0 if kw.get("reduction") == "sum" else 1.0 / kept
    rows, grad = native.forward("gol", x.float(), y, scale, weight=None if w is None else w.float(), params=(eps,),
                                which=which)
    assert rows.dtype == torch.float64 and grad.dtype == torch.float32
    torch.testing.assert_close(rows.sum() * scale, ref, rtol=2e-6, atol=0)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=2e-5, atol=2e-7 * float(ref_grad.abs().max()))
    assert float(rows[5]) == 0.0 and torch.count_nonzero(grad[5]) == 0  # the ignored row
    assert float(grad[1, 3]) == 0.0 and float(grad[2, 5]) == 0.0 and float(grad[2, 6]) != 0.0  # floor


def test_the_loss_takes_the_kernel_and_agrees_with_the_pytorch_path(monkeypatch):
    x, y = _inputs(seed=2)
    calls = []
    real = native.forward
    monkeypatch.setattr(native, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    xk = x.float().requires_grad_(True)
    out = losses.gumbel_bce_loss(xk, y, label_smoothing=0.05)
    out.backward(retain_graph=True)
    first = xk.grad.clone()
    out.backward()  # a second backward through the retained graph runs the kernel again
    assert calls == [1, 1]
    torch.testing.assert_close(xk.grad, 2 * first)
    ref, ref_grad = _pytorch(x, y, label_smoothing=0.05)
    torch.testing.assert_close(out.double(), ref, rtol=2e-6, atol=0)
    torch.testing.assert_close(first.double(), ref_grad, rtol=2e-5, atol=1e-9)
    (2.5 * losses.gumbel_bce_loss(xk.detach().requires_grad_(True), y)).backward()  # a scaled seed


def test_cases_outside_the_kernel_keep_the_pytorch_path(monkeypatch):
    calls = []
    real = native.forward
    monkeypatch.setattr(native, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(4, 6, 3)
    y = torch.randint(0, 6, (4, 3))
    losses.gumbel_bce_loss(x, y)  # N-D
    x2, y2 = torch.randn(4, 6), torch.tensor([1, 2, 3, 4])
    losses.gumbel_bce_loss(x2, y2, reduction="none")
    losses.gumbel_bce_loss(x2, torch.rand(4, 6))  # float labels
    losses.gumbel_bce_loss(x2, y2, variant="reference")
    losses.gumbel_bce_loss(x2, y2, clamp=(-4.0, 10.0))
    losses.gumbel_bce_loss(x2.double(), y2)
    losses.gumbel_bce_loss(x2, y2, weight=torch.rand(6, requires_grad=True))
    assert calls == []
    losses.gumbel_bce_loss(x2, y2, weight=torch.rand(6))
    assert calls == [1]


def test_all_rows_ignored_is_an_exact_zero():
    x = torch.randn(3, 7, requires_grad=True)
    out = losses.gumbel_bce_loss(x, torch.full((3,), -100))
    out.backward()
    assert float(out) == 0.0 and torch.count_nonzero(x.grad) == 0


def test_rows_do_not_depend_on_the_thread_count():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(300, 1000, generator=g) * 4  # above PARALLEL_MIN: split over threads
    y = torch.randint(0, 1000, (300,), generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        r1, g1 = native.forward("gol", x, y, 1e-3, params=(0.1,))
        torch.set_num_threads(3)
        r3, g3 = native.forward("gol", x, y, 1e-3, params=(0.1,))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(r1, r3) and torch.equal(g1, g3)


def test_losses_native_0_and_the_report():
    used, detail = losses.native_kernels()["loss_rows"]
    assert used and detail.startswith("built with") and detail.endswith(f"({VARIANTS[0]})")


# ---------------------------------------------------------------------------------------------
# the softmax rows (log-Z penalty, comp-sum) and the Z-loss
# ---------------------------------------------------------------------------------------------

SOFTMAX_CASES = [("cross_entropy_with_logz_penalty", {"coef": 1e-2}), ("comp_sum_loss", {"tau": 0.5}),
                 ("comp_sum_loss", {"tau": 1.0}), ("comp_sum_loss", {"tau": 1.7}), ("z_loss", {"a": 2.0, "b": 1.5})]


def _loss_pair(name, kw, x, y, reduction="mean"):
    """The loss through the kernel (float32) and through the float64 PyTorch path, with gradients."""
    fn = getattr(losses, name)
    xk = x.float().requires_grad_(True)
    out = fn(xk, y, reduction=reduction, **kw)
    g = torch.rand(out.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64) + 0.5
    (out.double() * g).sum().backward()
    native.enabled = False
    try:
        xr = x.clone().requires_grad_(True)
        ref = fn(xr, y, reduction=reduction, **kw)
        (ref * g).sum().backward()
    finally:
        native.enabled = True
    return out, xk.grad, ref, xr.grad


@pytest.mark.parametrize("name,kw", SOFTMAX_CASES, ids=lambda v: v if isinstance(v, str) else ",".join(map(str, v.values())))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_softmax_rows_and_z_loss_match_float64(name, kw, reduction, monkeypatch):
    calls = []
    real = native.forward
    monkeypatch.setattr(native, "forward", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(11, 77, generator=g, dtype=torch.float64) * 3).float().double()
    x[4, 0] = 40.0  # a confident row
    if name != "z_loss":
        x[2, 10:30] = -math.inf  # masks
    y = torch.randint(0, 77, (11,), generator=g)
    y[6] = -100
    out, grad, ref, ref_grad = _loss_pair(name, kw, x, y, reduction)
    assert calls  # the kernel ran
    finite = torch.isfinite(ref)
    torch.testing.assert_close(out.double()[finite], ref[finite], rtol=3e-6, atol=1e-12)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=2e-5, atol=2e-7)
    assert torch.count_nonzero(grad[6]) == 0


@pytest.mark.parametrize("which", VARIANTS)
def test_every_variant_gives_the_same_rows(which):
    g = torch.Generator().manual_seed(8)
    x = torch.randn(5, 203, generator=g) * 2
    y = torch.randint(0, 203, (5,), generator=g)
    for kind, params in (("logz", (1e-3,)), ("comp_sum", (0.3,)), ("z_loss", (1.0, 0.0, 1e-6))):
        r, gr = native.forward(kind, x, y, 0.2, params=params, which=which)
        r0, g0 = native.forward(kind, x, y, 0.2, params=params, which="base")
        torch.testing.assert_close(r, r0, rtol=2e-6, atol=0)
        torch.testing.assert_close(gr, g0, rtol=2e-5, atol=1e-8)


def test_masked_targets_keep_the_documented_limits():
    """log-Z: +inf with a finite gradient; comp-sum tau < 1: the kernel hands the batch back and the
    PyTorch path gives its +inf and +-inf entries; tau > 1: 1 / (tau - 1) with zero gradient."""
    x = torch.randn(3, 9, dtype=torch.float64)
    x[0, 4] = -math.inf
    y = torch.tensor([4, 1, 2])
    out, grad, ref, ref_grad = _loss_pair("cross_entropy_with_logz_penalty", {"coef": 0.1}, x, y, "sum")
    assert math.isinf(float(out)) and torch.isfinite(grad).all()
    torch.testing.assert_close(grad.double(), ref_grad, rtol=2e-5, atol=1e-7)
    assert native.forward("comp_sum", x.float(), y, 1.0, params=(0.5,)) is None
    out, grad, ref, ref_grad = _loss_pair("comp_sum_loss", {"tau": 0.5}, x, y, "sum")
    assert math.isinf(float(out)) and torch.equal(torch.isinf(grad), torch.isinf(ref_grad))
    rows, g = native.forward("comp_sum", x.float(), y, 1.0, params=(1.5,))
    assert float(rows[0]) == pytest.approx(2.0) and torch.count_nonzero(g[0]) == 0


def test_a_row_without_a_finite_logit_goes_back_to_the_pytorch_path():
    x = torch.randn(3, 9)
    x[1] = -math.inf
    y = torch.tensor([4, 1, 2])
    assert native.forward("logz", x, y, 1.0, params=(0.1,)) is None
    with pytest.raises(ValueError, match="no finite score"):
        losses.cross_entropy_with_logz_penalty(x, y)
