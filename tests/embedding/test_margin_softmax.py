"""Margin softmax (ArcFace / CosFace / combined margins), docs/losses/partial_fc.md: float64 loop oracle,
gradcheck, the section's test facts, errors and the validation switch."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch
import torch.nn.functional as F

import losses
from tests._helpers import weighted_reduce
from losses.embedding.margin import target_transform
from tests._helpers.rows import EMBEDDINGS, HEAD_KWARGS, entry

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "margin_softmax": entry("margin_softmax_loss", "MarginSoftmaxLoss", EMBEDDINGS, unit="row", owns_head=True,
          example=HEAD_KWARGS),
    "cosine_softmax": entry("margin_softmax_loss", "MarginSoftmaxLoss", EMBEDDINGS, unit="row", owns_head=True,
          example={**HEAD_KWARGS, "margin": (1.0, 0.0, 0.0)}),
}

CAP = 30 * math.log(10)  # -log(1e-30) = 69.0776


# --------------------------------------------------------------------------------------
# the oracle: explicit loops in float64, straight from docs/losses/partial_fc.md
# --------------------------------------------------------------------------------------


def _psi_oracle(c, margin, variant):
    """psi(c) = cos(m1 arccos c + m2) - m3 on one scalar tensor (arccos form, not the library's)."""
    m1, m2, m3 = margin
    if variant == "reference":
        value = torch.cos(torch.acos(c.detach()) + m2) - m3
        return c + (value - c).detach()  # straight-through: gradient of c
    if m1 == 1.0 and m2 > 0 and float(c.detach()) <= -math.cos(m2):
        return c - m2 * math.sin(m2) - m3  # ArcFace's monotone fallback
    return torch.cos(m1 * torch.acos(c) + m2) - m3


def oracle_rows(x, w, y, *, scale=64.0, margin=(1.0, 0.5, 0.0), variant="paper", threshold=0.0,
                ignore_index=-100):
    """Per-row losses as a list of scalar tensors (autograd-able), 0 for ignored rows."""
    rows = []
    n, d = x.shape
    for i in range(n):
        if int(y[i]) == ignore_index:
            rows.append(x.sum() * 0.0)
            continue
        yi = int(y[i])
        nx = torch.sqrt(sum(x[i, j] ** 2 for j in range(d))).clamp_min(1e-12)
        logits = []
        for k in range(w.shape[0]):
            nw = torch.sqrt(sum(w[k, j] ** 2 for j in range(d))).clamp_min(1e-12)
            c = (sum(x[i, j] * w[k, j] for j in range(d)) / (nx * nw)).clamp(-1.0, 1.0)
            if k == yi:
                logits.append(scale * _psi_oracle(c, margin, variant))
            else:
                if threshold > 0 and float(c.detach()) > threshold:
                    c = c * 0.0
                logits.append(scale * c)
        top = max(float(v.detach()) for v in logits)
        lse = top + torch.log(sum(torch.exp(v - top) for v in logits))
        loss = lse - logits[yi]
        if variant == "reference":
            loss = loss + (loss.clamp(max=CAP) - loss).detach()  # forward-only cap
        rows.append(loss)
    return rows


def oracle(x, w, y, reduction="mean", **kw):
    rows = torch.stack(oracle_rows(x, w, y, **kw))
    valid = (y != kw.get("ignore_index", -100)).double()
    return weighted_reduce(rows, valid, reduction)


def _inputs(n=5, c=7, d=3, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)
    w = torch.randn(c, d, generator=g, dtype=torch.float64).to(dtype)
    y = torch.randint(0, c, (n,), generator=g)
    return x, w, y


def _target_cos(x, w, y):
    return (F.normalize(x, dim=1) * F.normalize(w[y], dim=1)).sum(1)


def _inputs_with_target_cos(n, c, d, seed, low=-0.8, high=0.95, threshold=None):
    """Random inputs whose target cosines lie in (low, high) (away from the ArcFace kinks) and,
    with ``threshold``, whose non-target cosines keep 0.05 away from it."""
    for s in range(seed, seed + 10_000):
        x, w, y = _inputs(n, c, d, s)
        cy = _target_cos(x, w, y)
        if not bool(((cy > low) & (cy < high)).all()):
            continue
        if threshold is not None:
            cos = F.normalize(x, dim=1) @ F.normalize(w, dim=1).T
            if bool(((cos - threshold).abs() < 0.05).any()):
                continue
        return x, w, y
    raise AssertionError("no suitable inputs")


PAPER_CONFIGS = {
    "cosine": dict(margin=(1.0, 0.0, 0.0)),
    "arcface": dict(margin=(1.0, 0.5, 0.0)),
    "cosface": dict(margin=(1.0, 0.0, 0.35)),
    "combined": dict(margin=(1.2, 0.3, 0.1)),
    "negative_m2": dict(margin=(1.0, -0.2, 0.0)),
    "filtered": dict(margin=(1.0, 0.5, 0.0), threshold=0.3),
}
REFERENCE_CONFIGS = {
    "ref_arcface": dict(margin=(1.0, 0.5, 0.0), variant="reference"),
    "ref_cosface": dict(margin=(1.0, 0.0, 0.35), variant="reference"),
    "ref_filtered": dict(margin=(1.0, 0.5, 0.0), variant="reference", threshold=0.2),
}


def _call(x, w, y, reduction="mean", **kw):
    kw = dict(kw)
    thr = kw.pop("threshold", 0.0)
    return losses.margin_softmax_loss(x, y, w, interclass_filtering_threshold=thr, reduction=reduction, **kw)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("name", list(PAPER_CONFIGS) + list(REFERENCE_CONFIGS))
def test_matches_float64_loop_oracle(name, reduction):
    kw = {**PAPER_CONFIGS, **REFERENCE_CONFIGS}[name]
    x, w, y = _inputs(5, 7, 3, seed=1)
    y[2] = -100  # an ignored row
    # make one row hit the ArcFace fallback (theta + m > pi) and one row pass the cap (s = 64)
    w[y[0]] = -x[0] + 0.05 * w[y[0]]
    xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    got = _call(xs, ws, y, reduction, scale=64.0, **kw)
    xo, wo = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    expected = oracle(xo, wo, y, reduction, scale=64.0, **kw)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    assert got.dtype == torch.float64
    g_got = torch.autograd.grad(got.sum(), (xs, ws))
    g_exp = torch.autograd.grad(expected.sum(), (xo, wo))
    for a, b in zip(g_got, g_exp):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_oracle_inputs_reach_fallback_and_cap():
    """The oracle test's data really exercises the fallback and the cap."""
    x, w, y = _inputs(5, 7, 3, seed=1)
    w[y[0]] = -x[0] + 0.05 * w[y[0]]
    assert float(_target_cos(x, w, y)[0]) <= -math.cos(0.5)
    rows = losses.margin_softmax_loss(x, y, w, variant="reference", reduction="none")
    assert float(rows.max()) == pytest.approx(CAP, abs=1e-9)


@pytest.mark.parametrize("shape", [(1, 3, 4), (3, 5, 2), (3, 3, 5)])
@pytest.mark.parametrize("name", list(PAPER_CONFIGS) + ["ref_cosface"])
def test_gradcheck(name, shape):
    kw = {**PAPER_CONFIGS, **REFERENCE_CONFIGS}[name]
    n, c, d = shape
    x, w, y = _inputs_with_target_cos(n, c, d, seed=7, threshold=kw.get("threshold"))
    x.requires_grad_(True)
    w.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: _call(a, b, y, "none", scale=3.0, **kw), (x, w))


def test_paper_arcface_gradient_matches_finite_differences():
    """docs/losses/partial_fc.md test fact: fp64, target cosines in (-0.8, 0.95), central differences at s = 64."""
    x, w, y = _inputs_with_target_cos(6, 5, 4, seed=3)
    cy = _target_cos(x, w, y)
    assert bool(((cy > -0.8) & (cy < 0.95)).all())
    f = lambda a, b: losses.margin_softmax_loss(a, y, b)  # noqa: E731
    xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    gx, gw = torch.autograd.grad(f(xs, ws), (xs, ws))
    h = 1e-6
    for tensor, grad, which in ((x, gx, 0), (w, gw, 1)):
        fd = torch.zeros_like(tensor)
        for idx in range(tensor.numel()):
            plus, minus = tensor.clone(), tensor.clone()
            plus.view(-1)[idx] += h
            minus.view(-1)[idx] -= h
            args_p = (plus, w) if which == 0 else (x, plus)
            args_m = (minus, w) if which == 0 else (x, minus)
            fd.view(-1)[idx] = (f(*args_p) - f(*args_m)) / (2 * h)
        torch.testing.assert_close(grad, fd, rtol=1e-5, atol=1e-7)


def test_psi_derivative_matches_finite_differences_on_a_grid():
    c = torch.linspace(-0.79, 0.949, 101, dtype=torch.float64)
    for margin in [(1.0, 0.5, 0.0), (1.0, 0.3, 0.2), (1.3, 0.2, 0.1), (0.8, 0.0, 0.0)]:
        cs = c.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(target_transform(cs, margin, "paper").sum(), cs)
        h = 1e-6
        fd = (target_transform(c + h, margin, "paper") - target_transform(c - h, margin, "paper")) / (2 * h)
        torch.testing.assert_close(g, fd, rtol=1e-6, atol=1e-8)
        m1, m2, m3 = margin
        torch.testing.assert_close(target_transform(c, margin, "paper"), torch.cos(m1 * torch.acos(c) + m2) - m3)


def test_arcface_fallback_below_pi_minus_m():
    """c <= -cos m: psi = c - m sin m (value and slope 1); the reference variant keeps cos(theta + m)."""
    m = 0.5
    c = torch.tensor([-0.99, -0.95, -math.cos(m)], dtype=torch.float64, requires_grad=True)
    psi = target_transform(c, (1.0, m, 0.0), "paper")
    torch.testing.assert_close(psi, c.detach() - m * math.sin(m))
    (g,) = torch.autograd.grad(psi.sum(), c)
    torch.testing.assert_close(g, torch.ones_like(g))
    ref = target_transform(c, (1.0, m, 0.0), "reference")
    torch.testing.assert_close(ref, torch.cos(torch.acos(c.detach()) + m))
    # just above the threshold the exact ArcFace value is used
    c2 = torch.tensor([-math.cos(m) + 1e-3], dtype=torch.float64)
    torch.testing.assert_close(target_transform(c2, (1.0, m, 0.0), "paper"), torch.cos(torch.acos(c2) + m))


def test_cosine_margin_is_cross_entropy_on_scaled_cosine():
    """docs/losses/partial_fc.md: margin = (1, 0, 0) gives CE on s·cos (value and gradients); also the registry preset."""
    x, w, y = _inputs(5, 7, 3, seed=4)
    xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    got = losses.margin_softmax_loss(xs, y, ws, scale=10.0, margin=(1.0, 0.0, 0.0))
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    ref = F.cross_entropy(10.0 * F.normalize(xr, dim=1) @ F.normalize(wr, dim=1).T, y)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(got, (xs, ws)), torch.autograd.grad(ref, (xr, wr))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    spec = losses.get_loss_spec("cosine_softmax")
    assert spec.function_kwargs == {"margin": (1.0, 0.0, 0.0)}
    module = spec.create(**{**spec.example_kwargs, "embedding_dim": 3, "num_classes": 7, "scale": 10.0}).double()
    assert module.margin == (1.0, 0.0, 0.0)
    with torch.no_grad():
        module.weight.copy_(w)
    torch.testing.assert_close(module(x, y), ref.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("margin", [(1.0, 0.5, 0.0), (1.0, 0.0, 0.35), (1.15, 0.25, 0.05)])
def test_paper_equals_cross_entropy_on_margin_logits(margin):
    """An independent route: materialised margin logits + F.cross_entropy (values and gradients)."""
    x, w, y = _inputs(6, 9, 4, seed=5, dtype=torch.float32)
    y[1] = -100
    xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    got = losses.margin_softmax_loss(xs, y, ws, margin=margin, interclass_filtering_threshold=0.4)
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    cos = F.normalize(xr, dim=1) @ F.normalize(wr, dim=1).T
    logits = losses.margin_logits(cos, y, margin=margin, interclass_filtering_threshold=0.4)
    ref = F.cross_entropy(logits, y)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(torch.autograd.grad(got, (xs, ws)), torch.autograd.grad(ref, (xr, wr))):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_margin_logits_values():
    cos = torch.tensor([[0.5, 0.2, 0.9], [0.1, -0.3, 0.7]], dtype=torch.float64)
    y = torch.tensor([0, -100])
    out = losses.margin_logits(cos, y, scale=2.0, margin=(1.0, 0.5, 0.0), interclass_filtering_threshold=0.8)
    expected = torch.tensor([[2 * math.cos(math.acos(0.5) + 0.5), 0.4, 0.0], [0.2, -0.6, 1.4]], dtype=torch.float64)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reference_loss_is_capped_cross_entropy(dtype):
    """docs/losses/partial_fc.md: the "reference" loss equals mean_i min(CE_i, 69.0776) (CE_i on the margin logits)."""
    x, w, y = _inputs(6, 5, 4, seed=8, dtype=dtype)
    # rows 0 and 1 far from their centres and close to another: CE > 69 at s = 64
    for i in (0, 1):
        w[y[i]] = -x[i]
        w[(y[i] + 1) % 5] = x[i]
    loss = losses.margin_softmax_loss(x, y, w, variant="reference")
    cos = F.normalize(x.double(), dim=1) @ F.normalize(w.double(), dim=1).T
    ce = F.cross_entropy(losses.margin_logits(cos, y, variant="reference"), y, reduction="none")
    assert int((ce > 69.0776).sum()) >= 2
    expected = ce.clamp(max=69.0776).mean()
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5 if dtype == torch.float32 else 1e-6, atol=1e-5)


def test_reference_gradient_is_straight_through_and_uncapped():
    """dL/dc_ik = s (p_ik - [k = y_i]) / B with p from the margin logits, also on capped rows."""
    x, w, y = _inputs(6, 5, 4, seed=8)
    w[y[0]] = -x[0]
    w[(y[0] + 1) % 5] = x[0]
    s, B = 64.0, x.shape[0]
    xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss = losses.margin_softmax_loss(xs, y, ws, scale=s, variant="reference")
    assert float(losses.margin_softmax_loss(x, y, w, scale=s, variant="reference", reduction="none")[0]) == \
        pytest.approx(CAP)
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    cos = F.normalize(xr, dim=1) @ F.normalize(wr, dim=1).T
    with torch.no_grad():
        p = torch.softmax(losses.margin_logits(cos, y, scale=s, variant="reference"), dim=1)
        coef = s * (p - F.one_hot(y, 5).double()) / B
    surrogate = (coef * cos).sum()  # its gradient is the stated dL/dc chained through normalisation
    for a, b in zip(torch.autograd.grad(loss, (xs, ws)), torch.autograd.grad(surrogate, (xr, wr))):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_logits_have_no_margin():
    torch.manual_seed(0)
    module = losses.MarginSoftmaxLoss(4, 6, scale=8.0, margin=(1.0, 0.5, 0.0)).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    y = torch.tensor([1, 5, 0])
    logits = module.logits(x)
    w = module.weight.detach()
    expected = 8.0 * torch.stack([torch.stack([(x[i] @ w[k]) / (x[i].norm() * w[k].norm()) for k in range(6)])
                                  for i in range(3)])
    torch.testing.assert_close(logits, expected.detach(), rtol=1e-12, atol=1e-12)
    # the loss, with margin, is larger than CE on these logits
    assert float(module(x, y).detach()) > float(F.cross_entropy(logits.detach(), y))


def test_module_equals_function_and_owns_weight():
    torch.manual_seed(0)
    kw = dict(scale=16.0, margin=(1.0, 0.3, 0.1), variant="paper", interclass_filtering_threshold=0.5,
              ignore_index=-1, reduction="sum")
    module = losses.MarginSoftmaxLoss(5, 4, **kw)
    x, y = torch.randn(3, 5), torch.tensor([0, -1, 3])
    expected = losses.margin_softmax_loss(x, y, module.weight, **kw)
    torch.testing.assert_close(module(x, y), expected, rtol=0, atol=0)
    assert [n for n, _ in module.named_parameters()] == ["weight"]
    assert module.weight.shape == (4, 5)
    r = repr(module)
    for part in ("MarginSoftmaxLoss(", "embedding_dim=5", "num_classes=4", "scale=16.0", "margin=(1.0, 0.3, 0.1)",
                 "variant='paper'", "interclass_filtering_threshold=0.5", "ignore_index=-1", "reduction='sum'"):
        assert part in r
    for other in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        torch.testing.assert_close(other(x, y), expected, rtol=0, atol=0)


def test_weight_init_is_normal_with_std_001():
    torch.manual_seed(0)
    w = losses.MarginSoftmaxLoss(64, 500).weight.detach()
    assert abs(float(w.mean())) < 1e-3
    assert float(w.std()) == pytest.approx(0.01, rel=0.03)


def test_half_precision_and_float64():
    x, w, y = _inputs(4, 5, 6, seed=2, dtype=torch.float32)
    ref = losses.margin_softmax_loss(x, y, w)
    for dtype in (torch.float16, torch.bfloat16):
        xh = x.to(dtype).requires_grad_(True)
        out = losses.margin_softmax_loss(xh, y, w.to(dtype))
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, losses.margin_softmax_loss(xh.detach().float(), y, w.to(dtype).float()))
        (g,) = torch.autograd.grad(out, xh)
        assert g.dtype == dtype
    out64 = losses.margin_softmax_loss(x.double(), y, w)  # mixed: float64 wins
    assert out64.dtype == torch.float64
    torch.testing.assert_close(out64.float(), ref, rtol=1e-5, atol=1e-5)


def test_extreme_and_degenerate_inputs_are_finite():
    x, w, y = _inputs(4, 5, 6, seed=2, dtype=torch.float32)
    cases = {
        "large": (x * 1e4, w * 1e4),
        "zero_features": (torch.zeros_like(x), w),
        "zero_centres": (x, torch.zeros_like(w)),
        "parallel": (w[y].clone(), w),
        "antiparallel": (-w[y].clone(), w),
    }
    for name, (a, b) in cases.items():
        for variant in ("paper", "reference"):
            a_, b_ = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
            out = losses.margin_softmax_loss(a_, y, b_, variant=variant)
            grads = torch.autograd.grad(out, (a_, b_))
            assert torch.isfinite(out), (name, variant)
            assert all(torch.isfinite(g).all() for g in grads), (name, variant)


def test_one_class_batch_and_empty_batch():
    x, w, _ = _inputs(4, 5, 3, seed=2)
    y = torch.full((4,), 2)
    xs = x.clone().requires_grad_(True)
    out = losses.margin_softmax_loss(xs, y, w, reduction="none")
    torch.testing.assert_close(out, torch.stack(oracle_rows(x, w, y)), rtol=1e-10, atol=1e-10)
    empty = torch.zeros(0, 3, dtype=torch.float64, requires_grad=True)
    ws = w.clone().requires_grad_(True)
    out = losses.margin_softmax_loss(empty, torch.zeros(0, dtype=torch.long), ws)
    assert out.item() == 0.0
    gx, gw = torch.autograd.grad(out, (empty, ws))
    assert gx.shape == (0, 3) and torch.all(gw == 0)
    assert losses.margin_softmax_loss(empty, torch.zeros(0, dtype=torch.long), w, reduction="none").shape == (0,)


def test_all_ignored_is_attached_zero():
    x, w, _ = _inputs(3, 5, 3, seed=2)
    xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    for reduction in ("mean", "sum"):
        out = losses.margin_softmax_loss(xs, torch.full((3,), -100), ws, reduction=reduction)
        assert out.item() == 0.0 and out.grad_fn is not None
        gx, gw = torch.autograd.grad(out, (xs, ws))
        assert torch.all(gx == 0) and torch.all(gw == 0)


def test_target_dtypes():
    x, w, y = _inputs(4, 5, 3, seed=2)
    ref = losses.margin_softmax_loss(x, y, w)
    for dtype in (torch.int8, torch.int16, torch.int32, torch.uint8):
        torch.testing.assert_close(losses.margin_softmax_loss(x, y.to(dtype), w), ref, rtol=0, atol=0)


# --------------------------------------------------------------------------------------
# errors and the validation switch
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, pattern", [
    (dict(scale=0.0), r"^margin_softmax_loss: scale must be finite and satisfy scale > 0"),
    (dict(scale=float("nan")), r"^margin_softmax_loss: scale must be finite"),
    (dict(margin=(1.0, 0.5)), r"^margin_softmax_loss: margin must be a triple \(m1, m2, m3\)"),
    (dict(margin=0.5), r"^margin_softmax_loss: margin must be a triple"),
    (dict(margin=(0.0, 0.5, 0.0)), r"^margin_softmax_loss: margin\[0\] \(m1\) must be finite"),
    (dict(margin=(1.0, 4.0, 0.0)), r"^margin_softmax_loss: margin\[1\] \(m2\) must be finite"),
    (dict(variant="insightface"), r"^margin_softmax_loss: variant must be one of 'paper', 'reference'"),
    (dict(variant="reference", margin=(1.0, 0.5, 0.2)),
     r"^margin_softmax_loss: variant='reference' supports only ArcFace \(1, m2, 0\) and CosFace \(1, 0, m3\)"),
    (dict(variant="reference", margin=(1.2, 0.0, 0.0)), r"^margin_softmax_loss: variant='reference' supports only"),
    (dict(interclass_filtering_threshold=1.5), r"^margin_softmax_loss: interclass_filtering_threshold must be"),
    (dict(interclass_filtering_threshold=-0.1), r"^margin_softmax_loss: interclass_filtering_threshold must be"),
    (dict(reduction="elementwise_mean"), r"^margin_softmax_loss: reduction must be one of"),
])
def test_bad_hyperparameters(kw, pattern):
    x, w, y = _inputs(3, 4, 2, seed=0)
    with pytest.raises(ValueError, match=pattern):
        losses.margin_softmax_loss(x, y, w, **kw)
    if "reduction" not in kw:
        with pytest.raises(ValueError, match=pattern.replace("margin_softmax_loss", "MarginSoftmaxLoss")):
            losses.MarginSoftmaxLoss(2, 4, **kw)


def test_bad_shapes_and_types():
    x, w, y = _inputs(3, 4, 2, seed=0)
    fn = losses.margin_softmax_loss
    with pytest.raises(ValueError, match=r"^margin_softmax_loss: embeddings must have shape \(N, D\)"):
        fn(x[0], y[:1], w)
    with pytest.raises(ValueError, match=r"^margin_softmax_loss: target must have shape \(3,\)"):
        fn(x, y[:2], w)
    with pytest.raises(ValueError, match=r"^margin_softmax_loss: weight must have shape \(C, 2\)"):
        fn(x, y, torch.randn(4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^margin_softmax_loss: weight must have shape"):
        fn(x, y, torch.randn(0, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"^margin_softmax_loss: target must hold integer class ids \(got torch.float"):
        fn(x, y.double(), w)
    with pytest.raises(TypeError, match=r"^margin_softmax_loss: target must hold integer class ids \(got torch.bool"):
        fn(x, y > 0, w)
    with pytest.raises(TypeError, match=r"^margin_softmax_loss: embeddings must be a floating-point tensor"):
        fn(x.long(), y, w)
    with pytest.raises(ValueError, match=r"^MarginSoftmaxLoss: num_classes must be a positive int"):
        losses.MarginSoftmaxLoss(4, 0)


def test_data_errors_and_validation_switch():
    x, w, y = _inputs(3, 4, 2, seed=0)
    bad_y = torch.tensor([0, -3, 4])
    with pytest.raises(ValueError, match=re_escape(
            "margin_softmax_loss: target has class ids outside [0, 4) (got min=-3, max=4); "
            "check num_classes or set ignore_index")):
        losses.margin_softmax_loss(x, bad_y, w)
    nan_x = x.clone()
    nan_x[1, 0] = float("nan")
    with pytest.raises(ValueError, match=r"^margin_softmax_loss: embeddings contains NaN or infinite values \(got 1 NaN\)"):
        losses.margin_softmax_loss(nan_x, y, w)
    inf_w = w.clone()
    inf_w[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"^margin_softmax_loss: weight contains NaN or infinite values \(got 1 \+inf\)"):
        losses.margin_softmax_loss(x, y, inf_w)
    with losses.validation(False):
        losses.margin_softmax_loss(nan_x, y, w)  # no data checks
        losses.margin_softmax_loss(x, y, inf_w)
        # shape checks stay on
        with pytest.raises(ValueError, match="target must have shape"):
            losses.margin_softmax_loss(x, y[:2], w)
    # ignore_index rows are not range-checked
    ok = losses.margin_softmax_loss(x, torch.tensor([0, -100, 3]), w)
    assert torch.isfinite(ok)


def re_escape(s):
    import re

    return "^" + re.escape(s) + "$"
