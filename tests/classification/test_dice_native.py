"""The Dice family's fused C kernel (losses/kernels/dice_native.py).

The kernel serves float32 CPU maps with at least 64 positions per image through softmax or sigmoid.
Every case here is checked against the PyTorch path in float64 (which test_dice.py checks against
the loop oracle written from the formulas) and against the PyTorch path in float32 with the kernel
switched off; the kernel's entry points are also checked one variant (AVX-512 / AVX2 / baseline)
at a time against float64 autograd.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest
import torch

import losses
from losses.kernels import dice_native as native

pytestmark = pytest.mark.skipif(not native.available()[0], reason="the Dice kernel is not built here: "
                                + native.available()[1])

FUNCS = {
    "dice": losses.dice_semimetric_loss,
    "jaccard": losses.jaccard_metric_loss,
    "soft_dice": losses.soft_dice_loss,
}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _case(shape, target, *, seed=0, ignore=False, masked=False, neg_inf=False):
    """float32 logits of ``shape`` (B, C, ...) with ids / one-hot / soft labels and optional ignored
    ids, a mask and -inf logits (a class missing at some positions)."""
    g = torch.Generator().manual_seed(seed)
    b, c = shape[:2]
    spatial = shape[2:]
    z = torch.randn(shape, generator=g) * 3
    ids = torch.randint(0, c, (b,) + spatial, generator=g)
    if neg_inf:
        gone = torch.rand((b,) + spatial, generator=g) < 0.3
        z[:, 0][gone] = float("-inf")
        ids = torch.where(gone & (ids == 0), torch.ones_like(ids), ids)
    if target == "ids":
        y = ids.clone()
        if ignore:
            y[torch.rand(y.shape, generator=g) < 0.2] = -100
    elif target == "onehot":
        y = torch.nn.functional.one_hot(ids, c).movedim(-1, 1).float()
    else:
        y = torch.rand(shape, generator=g)
        if neg_inf:
            y[:, 0] = torch.where(z[:, 0] == float("-inf"), torch.zeros_like(y[:, 0]), y[:, 0])
    mask = (torch.rand((b,) + spatial, generator=g) > 0.25) if masked else None
    return z, y, mask


def _run(fn, z, y, mask, **kw):
    z = z.detach().clone().requires_grad_(True)
    gen = torch.Generator().manual_seed(7)
    out = fn(z, y, mask=mask, **kw)
    w = (torch.rand(out.shape, generator=gen, dtype=torch.float64) + 0.5).to(out.dtype)  # for "none"
    (g,) = torch.autograd.grad((out * w).sum(), z)
    return out.detach(), g


def _compare(fn, z, y, mask, monkeypatch, **kw):
    got, g_got = _run(fn, z, y, mask, **kw)
    ref64, g64 = _run(fn, z.double(), y.double() if y.is_floating_point() else y, mask, **kw)
    monkeypatch.setattr(native, "enabled", False)
    ref32, g32 = _run(fn, z, y, mask, **kw)
    monkeypatch.setattr(native, "enabled", True)
    assert torch.isfinite(got).all() and torch.isfinite(g_got).all()
    torch.testing.assert_close(got.double(), ref64, rtol=2e-5, atol=1e-6)
    torch.testing.assert_close(g_got.double(), g64, rtol=1e-4, atol=2e-6 * g64.abs().max().item() + 1e-9)
    # at least as close to float64 as the float32 PyTorch path, to rounding (a few float spacings)
    err_k = (got.double() - ref64).abs().max().item()
    err_t = (ref32.double() - ref64).abs().max().item()
    assert err_k <= max(4 * err_t, 4e-7 * ref64.abs().max().item() + 1e-9), (err_k, err_t)


SHAPES = [(4, 5, 10, 13), (2, 3, 64), (2, 4, 9, 8, 7)]  # tails of 2, 0 and 56 positions per block


@pytest.mark.parametrize("kind,target,activation", list(itertools.product(
    FUNCS, ["ids", "onehot", "soft"], ["softmax", "sigmoid"])))
def test_kernel_matches_the_float64_path(kind, target, activation, monkeypatch):
    assert native.usable(torch.zeros(1, 2, 64))
    for i, shape in enumerate(SHAPES):
        z, y, _ = _case(shape, target, seed=i)
        _compare(FUNCS[kind], z, y, None, monkeypatch, activation=activation)


@pytest.mark.parametrize("kind", list(FUNCS))
@pytest.mark.parametrize("aggregate", ["dataset", "image", "class"])
def test_ignored_ids_mask_weights_and_aggregates(kind, aggregate, monkeypatch):
    weight = torch.tensor([0.5, 2.0, 1.0, 0.0, 3.0])
    for target, ignore, masked, neg_inf in [("ids", True, False, False), ("ids", True, True, True),
                                            ("soft", False, True, False), ("onehot", False, True, True)]:
        z, y, mask = _case((3, 5, 11, 12), target, seed=3, ignore=ignore, masked=masked, neg_inf=neg_inf)
        for reduction in ["mean", "sum", "none"]:
            _compare(FUNCS[kind], z, y, mask, monkeypatch, aggregate=aggregate, weight=weight, reduction=reduction)
    z, y, _ = _case((3, 5, 11, 12), "soft", seed=4)
    _compare(FUNCS[kind], z, y, None, monkeypatch, aggregate=aggregate, active_classes="present", log_loss=True,
             smooth=0.0)


def test_the_kernel_runs_for_the_public_losses():
    """The float32 map goes through the kernel (its Function is in the graph); float64, the
    "none" activation, maps of under 64 positions and a switched-off kernel do not."""
    z, y, _ = _case((2, 4, 16, 16), "ids")

    def grad_fn_names(z_, **kw):
        out = losses.soft_dice_loss(z_.requires_grad_(True), y, **kw)
        names, todo = set(), [out.grad_fn]
        while todo:
            node = todo.pop()
            if node is None:
                continue
            names.add(type(node).__name__)
            todo.extend(f for f, _ in node.next_functions)
        return names

    assert any("DiceStatsNative" in n for n in grad_fn_names(z.clone()))
    assert not any("DiceStatsNative" in n for n in grad_fn_names(z.double()))
    assert not any("DiceStatsNative" in n for n in grad_fn_names(z.softmax(1).detach(), activation="none"))
    y_small = y[:, :7, :9]  # 63 positions per image
    small = z[:, :, :7, :9].clone().requires_grad_(True)
    out = losses.soft_dice_loss(small, y_small)
    assert "DiceStatsNative" not in type(out.grad_fn).__name__
    native_was = native.enabled
    try:
        native.enabled = False
        assert not any("DiceStatsNative" in n for n in grad_fn_names(z.clone()))
    finally:
        native.enabled = native_was
    assert not native.usable(torch.zeros(2, 4, 63)) and not native.usable(torch.zeros(2, 4, 64, dtype=torch.float64))


def test_each_variant_against_float64_autograd():
    """The forward sums and the backward of every instruction-set variant this CPU runs, for ids
    (with and without dropped positions) and float labels in both forms, through softmax and
    sigmoid, against float64 autograd of the same sums."""
    g = torch.Generator().manual_seed(5)
    b, c, s = 3, 5, 200  # 3 full blocks and a tail of 8
    z = torch.randn(b, c, s, generator=g) * 4
    z[0, 1, :50] = float("-inf")
    t = torch.randint(0, c, (b, s), generator=g)
    t[0, :50] = torch.where(t[0, :50] == 1, torch.zeros_like(t[0, :50]), t[0, :50])
    keep = torch.rand(b, s, generator=g) > 0.3
    y_soft = torch.rand(b, c, s, generator=g)
    y_soft[0, 1, :50] = 0
    onehot = torch.nn.functional.one_hot(t, c).movedim(-1, 1).double()
    gx = torch.randn(b, c, generator=g)
    ga = torch.randn(b, c, generator=g)
    assert native.variants()[0] == native.variant() and native.variants()[-1] == "base"
    for which, sig, kp in itertools.product(native.variants(), [False, True], [None, keep]):
        k = torch.ones(b, 1, s, dtype=torch.float64) if kp is None else kp.unsqueeze(1).double()
        zd = z.double().requires_grad_(True)
        xd = torch.sigmoid(zd) if sig else torch.softmax(zd, 1)
        for labels, soft_form in [("ids", True), ("soft", True), ("soft", False)]:
            yd = onehot if labels == "ids" else y_soft.double()
            a = xd + yd - 2 * xd * yd if soft_form else (xd - yd).abs()
            ref = torch.stack([(xd * k).sum(-1), (a * k).sum(-1), (yd * k).sum(-1)], -1)
            (gref,) = torch.autograd.grad((ref[..., 0] * gx).sum() + (ref[..., 1] * ga).sum(), zd,
                                          retain_graph=True)
            ids = t if labels == "ids" else None
            y = None if labels == "ids" else y_soft
            x, sums = native.forward(z, ids, y, kp, sig, soft_form, which=which)
            torch.testing.assert_close(sums, ref.detach(), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(x.double(), (xd * k).detach(), rtol=0, atol=3e-7)
            dz = native.backward(x, ids, y, kp, sig, soft_form, gx, ga, which=which)
            torch.testing.assert_close(dz.double(), gref, rtol=0, atol=2e-6 * gref.abs().max().item())


def test_the_targets_one_minus_x_has_no_cancellation():
    """``1 - x`` of the most probable class is summed from the other classes' exponentials: a
    confident prediction keeps its relative precision with ids, one-hot labels (both forms of the
    term) and through sigmoid (the PyTorch float32 path rounds ``1 - x`` to float spacings of 1)."""
    z = torch.full((1, 3, 64), -12.0)
    z[0, 0] = 6.0
    t = torch.zeros(1, 64, dtype=torch.long)
    onehot = torch.nn.functional.one_hot(t, 3).movedim(-1, 1).float().contiguous()
    exact = (1 - torch.softmax(z.double(), 1)[0, 0]).sum().item()  # 1.9e-6
    for ids, y, soft_form in [(t, None, True), (None, onehot, True), (None, onehot, False)]:
        _, sums = native.forward(z, ids, y, None, False, soft_form)
        assert abs(sums[0, 0, 1].item() - exact) / exact < 1e-6, (ids is None, soft_form)
    zs = torch.full((1, 1, 64), 17.0)
    _, sums = native.forward(zs, None, torch.ones(1, 1, 64), None, True, False)
    exact = 64 * torch.sigmoid(torch.tensor(-17.0, dtype=torch.float64)).item()
    assert abs(sums[0, 0, 1].item() - exact) / exact < 1e-6
    loss = losses.dice_semimetric_loss(z.reshape(1, 3, 8, 8), t.reshape(1, 8, 8), smooth=0.0, reduction="none")
    ref = losses.dice_semimetric_loss(z.double().reshape(1, 3, 8, 8), t.reshape(1, 8, 8), smooth=0.0,
                                      reduction="none")
    assert abs(loss[0].item() - ref[0].item()) / ref[0].item() < 1e-5  # loss 1.5e-8


def test_exp_within_one_and_a_half_float_spacings():
    v = -torch.linspace(0, 87.3, 1_000_001, dtype=torch.float64).float()
    ref = torch.exp(v.double())
    spacing = (torch.nextafter(ref.float(), torch.tensor(float("inf"))).double() - ref.float().double())
    for which in native.variants():
        out = native.exp_neg(v, which).double()
        assert ((out - ref).abs() / spacing).max().item() < 1.5, which
        edge = native.exp_neg(torch.tensor([float("-inf"), -88.0, -1e30, -0.0, 0.0]), which)
        assert edge.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize("bad", ["nan", "posinf", "all_neg_inf", "id"])
def test_the_kernel_declines_and_the_pytorch_path_decides(bad, monkeypatch):
    """A NaN / +inf logit or a position whose logits are all -inf where kept, or a kept id out of
    range: the kernel returns no result, and the loss is what the PyTorch path gives (an error
    with the data checks on; the same values with them off)."""
    z, y, _ = _case((2, 4, 10, 10), "ids", seed=2)
    if bad == "nan":
        z[1, 2, 3, 4] = float("nan")
    elif bad == "posinf":
        z[0, 1, 0, 0] = float("inf")
    elif bad == "all_neg_inf":
        z[0, :, 5, 5] = float("-inf")
    else:
        y[1, 9, 9] = 4
    zz = z.reshape(2, 4, 100)
    assert native.forward(zz, y.reshape(2, 100), None, None, False, True) is None
    with pytest.raises(ValueError):
        losses.dice_semimetric_loss(z, y)
    with losses.validation(False):
        got = losses.dice_semimetric_loss(z, y, reduction="none")
        monkeypatch.setattr(native, "enabled", False)
        ref = losses.dice_semimetric_loss(z, y, reduction="none")
    torch.testing.assert_close(got, ref, equal_nan=True)
    if bad == "nan":
        assert torch.isnan(got).any()


def test_dropped_positions_are_not_read():
    """NaN / +inf logits at ignored ids or masked positions do not reach the result."""
    z, y, mask = _case((2, 4, 10, 10), "ids", seed=6, masked=True)
    y[0, 0, :] = -100
    z[0, :, 0, :] = float("nan")
    z[1][:, ~mask[1]] = float("inf")
    zc = z.clone().requires_grad_(True)
    with losses.validation(False):  # (the data checks refuse non-finite logits anywhere)
        out = losses.jaccard_metric_loss(zc, y, mask=mask)
    (g,) = torch.autograd.grad(out, zc)
    assert torch.isfinite(out) and torch.isfinite(g).all()
    assert (g[0, :, 0, :] == 0).all() and (g[1][:, ~mask[1]] == 0).all()
    zf = torch.where(torch.isfinite(z), z, torch.zeros_like(z)).double().requires_grad_(True)
    ref = losses.jaccard_metric_loss(zf, y, mask=mask)
    torch.testing.assert_close(out.double(), ref, rtol=2e-5, atol=1e-6)


def test_sums_do_not_depend_on_the_thread_count():
    z, y, _ = _case((2, 4, 64, 64, 17), "ids", seed=8)  # 557,056 elements: above PARALLEL_MIN
    assert z.numel() >= native.PARALLEL_MIN
    zz, t = z.reshape(2, 4, -1), y.reshape(2, -1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert native._threads(zz) == 1
        x1, s1 = native.forward(zz, t, None, None, False, True)
        d1 = native.backward(x1, t, None, None, False, True, torch.ones(2, 4), torch.ones(2, 4))
        torch.set_num_threads(3)
        assert native._threads(zz) == 3
        x3, s3 = native.forward(zz, t, None, None, False, True)
        d3 = native.backward(x3, t, None, None, False, True, torch.ones(2, 4), torch.ones(2, 4))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(s1, s3) and torch.equal(x1, x3) and torch.equal(d1, d3)


def test_autocast_channels_last_and_no_double_backward():
    z, y, _ = _case((2, 5, 12, 12), "ids", seed=9)
    zb = z.to(memory_format=torch.channels_last).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = losses.soft_dice_loss(zb, y)
    assert out.dtype == torch.float32
    (g,) = torch.autograd.grad(out, zb)
    ref = losses.soft_dice_loss(z.double().requires_grad_(True), y)
    torch.testing.assert_close(out.double(), ref, rtol=2e-5, atol=1e-6)
    assert torch.isfinite(g).all()
    zc = z.clone().requires_grad_(True)
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(losses.soft_dice_loss(zc, y), zc, create_graph=True)


def test_native_kernels_reports_the_dice_kernel():
    status = losses.native_kernels()
    in_use, detail = status["dice_stats"]
    assert in_use and native.variant() in detail
    code = "import losses; print(losses.native_kernels()['dice_stats'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                         env=dict(os.environ, LOSSES_NATIVE="0"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(False, 'disabled by LOSSES_NATIVE=0')"


def test_the_precision_benchmark_script(tmp_path):
    """benchmarks/dice_precision.py on a small map: the kernel's float32 error stays at rounding
    level where the loss is small, and the report is written."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        import dice_precision
    finally:
        sys.path.pop(0)
    rows = dice_precision.measure(margins=(2.0, 18.0), shape=(2, 11, 16, 16))
    assert [r["margin"] for r in rows] == [2.0, 18.0] and rows[1]["loss"] < 1e-5
    assert rows[1]["kernel, ids"] < 1e-6 and rows[1]["kernel, one-hot"] < 1e-6
    assert rows[1]["PyTorch path, ids"] > 100 * rows[1]["kernel, ids"]
    path = dice_precision.write(rows, str(tmp_path), shape=(2, 11, 16, 16))
    text = open(path).read()
    assert text.count("\n| ") == 3 and "kernel, ids" in text and "2x11x16x16 maps" in text
