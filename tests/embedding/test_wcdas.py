"""WCDAS (docs/losses/wcdas.md): loop oracle, gradcheck, test facts, module state, errors."""

from __future__ import annotations

import copy
import io
import math
import pickle

import pytest
import torch
import torch.nn.functional as F

import losses
from tests._helpers import assert_gradcheck, randn, weighted_reduce
from losses.embedding.wcdas import G_MAX
from tests._helpers.rows import EMBEDDINGS, HEAD_KWARGS, entry

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "wcdas": entry("wcdas_loss", "WCDASLoss", EMBEDDINGS, unit="row", owns_head=True, example=HEAD_KWARGS),
}
EXPECTED_HELPERS = ("wcdas_logits",)

IGN = -100


# --------------------------------------------------------------------------------------
# independent float64 oracle: loops over the textbook wrapped Cauchy density
# --------------------------------------------------------------------------------------


def wcdas_logits_oracle(x, w, g, s, *, variant="paper"):
    pi = 3.14 if variant == "reference" else math.pi
    rows = []
    for i in range(x.shape[0]):
        xi = x[i] / torch.clamp(torch.linalg.vector_norm(x[i]), min=1e-12)
        row = []
        for k in range(w.shape[0]):
            wk = w[k] / torch.clamp(torch.linalg.vector_norm(w[k]), min=1e-12)
            c = torch.clamp(torch.dot(xi, wk), -1.0, 1.0)
            gk = g[k] if variant == "reference" else torch.clamp(g[k], max=math.log((1 - 1e-6) / 1e-6))
            rho = 1.0 / (1.0 + torch.exp(-gk))
            row.append(s * (1 - rho * rho) / (2 * pi * (1 + rho * rho - 2 * rho * c)))
        rows.append(torch.stack(row))
    return torch.stack(rows)


def wcdas_loss_oracle(x, y, w, g, s, *, variant="paper", reduction="mean", ignore_index=IGN):
    z = wcdas_logits_oracle(x, w, g, s, variant=variant)
    values = []
    for i in range(x.shape[0]):
        if int(y[i]) == ignore_index:
            values.append(z[i, 0] * 0)
            continue
        m = z[i].max().detach()
        lse = m + torch.log(sum(torch.exp(z[i, k] - m) for k in range(z.shape[1])))
        values.append(lse - z[i, int(y[i])])
    valid = torch.tensor([float(int(t) != ignore_index) for t in y], dtype=torch.float64)
    return weighted_reduce(torch.stack(values), valid, reduction)


def head(n=5, c=7, d=3, seed=0):
    x = randn(n, d, seed=seed)
    w = randn(c, d, seed=seed + 1)
    g = randn(c, seed=seed + 2) * 1.5
    return x, w, g


# --------------------------------------------------------------------------------------
# value and gradient against the oracle
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["paper", "reference"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("scale_kind", ["float", "tensor"])
def test_loss_matches_loop_oracle(variant, reduction, scale_kind):
    x, w, g = head()
    x[3] = 0.0  # a zero embedding: c = 0
    leaves = [x.requires_grad_(True), w.requires_grad_(True), g.requires_grad_(True)]
    s = 3.7 if scale_kind == "float" else torch.tensor(3.7, dtype=torch.float64, requires_grad=True)
    if scale_kind == "tensor":
        leaves.append(s)
    y = torch.tensor([6, 0, IGN, 2, 6])
    out = losses.wcdas_loss(x, y, w, g, s, variant=variant, reduction=reduction)
    ref = wcdas_loss_oracle(x, y, w, g, s, variant=variant, reduction=reduction)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    if reduction == "none":
        assert out[2].item() == 0.0
        out, ref = (out * torch.arange(1.0, 6.0, dtype=torch.float64)).sum(), (ref * torch.arange(1.0, 6.0)).sum()
    for a, b in zip(torch.autograd.grad(out, leaves), torch.autograd.grad(ref, leaves)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("variant", ["paper", "reference"])
def test_logits_match_loop_oracle(variant):
    x, w, g = head(n=4, c=5, d=6, seed=3)
    out = losses.wcdas_logits(x, w, g, 2.5, variant=variant)
    assert out.shape == (4, 5)
    torch.testing.assert_close(out, wcdas_logits_oracle(x, w, g, 2.5, variant=variant), rtol=1e-10, atol=1e-12)


def test_float32_matches_float64_oracle():
    x, w, g = head(seed=4)
    y = torch.tensor([0, 1, 2, 3, 4])
    out = losses.wcdas_loss(x.float(), y, w.float(), g.float(), 16.0)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), wcdas_loss_oracle(x, y, w, g, 16.0), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------
# gradcheck: embeddings, W, concentration logits, scale, scale logit
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["paper", "reference"])
@pytest.mark.parametrize("n,c", [(1, 3), (3, 5)])
def test_gradcheck(variant, n, c):
    x, w, g = head(n=n, c=c, d=4, seed=5 + n)
    s = torch.tensor(2.0, dtype=torch.float64)
    y = torch.arange(n) % c
    inputs = tuple(t.requires_grad_(True) for t in (x, w, g, s))
    assert torch.autograd.gradcheck(
        lambda *a: losses.wcdas_loss(a[0], y, a[1], a[2], a[3], variant=variant), inputs)
    s_hat = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    assert_gradcheck(
        lambda sh: losses.wcdas_loss(x, y, w, g, 1 + F.softplus(sh), variant=variant), s_hat)


@pytest.mark.parametrize("scale", [None, 8.0])
def test_gradcheck_module_parameters(scale):
    from torch.func import functional_call

    torch.manual_seed(0)
    m = losses.WCDASLoss(4, 5, concentration_init=-0.5, scale=scale).double()
    x = randn(3, 4, seed=9).requires_grad_(True)
    y = torch.tensor([4, 0, 2])
    names = [n for n, _ in m.named_parameters()]
    assert names == (["weight", "concentration_logit", "scale_logit"] if scale is None
                     else ["weight", "concentration_logit"])
    params = tuple(p.detach().clone().requires_grad_(True) for _, p in m.named_parameters())
    assert torch.autograd.gradcheck(lambda x_, *p: functional_call(m, dict(zip(names, p)), (x_, y)),
                                    (x,) + params)


# --------------------------------------------------------------------------------------
# test facts (docs/losses/wcdas.md)
# --------------------------------------------------------------------------------------


def test_rho_to_zero_limits():
    x, w, _ = head(n=6, c=5, d=4, seed=10)
    x.requires_grad_(True)
    g = torch.full((5,), -60.0, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3, 4, 0])
    s = 7.0
    z = losses.wcdas_logits(x, w, g, s)
    torch.testing.assert_close(z, torch.full_like(z, s / (2 * math.pi)), rtol=1e-12, atol=0)
    out = losses.wcdas_loss(x, y, w, g, s)
    assert out.item() == pytest.approx(math.log(5), rel=1e-12)
    (gx,) = torch.autograd.grad(out, x)
    assert gx.abs().max() < 1e-20
    # and the approach: the gradient shrinks as g decreases
    norms = []
    for g0 in (-1.0, -5.0, -10.0):
        out = losses.wcdas_loss(x, y, w, torch.full((5,), g0, dtype=torch.float64), s)
        norms.append(torch.autograd.grad(out, x)[0].norm().item())
    assert norms[0] > norms[1] > norms[2] > 0


@pytest.mark.parametrize("g0", [-2.0, 0.0, 1.0, 5.0])
def test_logits_increase_strictly_in_cosine_between_the_bounds(g0):
    s = 3.0
    theta = torch.linspace(math.pi, 0.0, 201, dtype=torch.float64)
    x = torch.stack([torch.cos(theta), torch.sin(theta)], dim=1)  # c = cos(theta) from -1 to 1
    w = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    g = torch.tensor([g0], dtype=torch.float64)
    z = losses.wcdas_logits(x, w, g, s)[:, 0]
    assert torch.all(z[1:] > z[:-1])
    rho = 1 / (1 + math.exp(-g0))
    lo, hi = s * (1 - rho) / (2 * math.pi * (1 + rho)), s * (1 + rho) / (2 * math.pi * (1 - rho))
    assert z[0].item() == pytest.approx(lo, rel=1e-12) and z[-1].item() == pytest.approx(hi, rel=1e-12)
    assert torch.all(z >= lo * (1 - 1e-12)) and torch.all(z <= hi * (1 + 1e-12))


def test_reference_over_paper_is_pi_over_3_14():
    x, w, g = head(n=6, c=5, d=4, seed=11)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        ratio = (losses.wcdas_logits(x.to(dtype), w.to(dtype), g.to(dtype), 5.0, variant="reference")
                 / losses.wcdas_logits(x.to(dtype), w.to(dtype), g.to(dtype), 5.0))
        torch.testing.assert_close(ratio, torch.full_like(ratio, math.pi / 3.14), rtol=tol, atol=0)
    assert math.pi / 3.14 == pytest.approx(1.000507, abs=1e-6)


def test_concentration_clamp_when_rho_near_one():
    # axis-aligned unit rows: the fp32 and fp64 cosines of x with its own class are exactly 1
    # (random rows round to 1 - 6e-8 on some BLAS builds, where the logit is ~1e6 times steeper)
    w = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.6, 0.0, 0.8]])
    x = w[[0, 1, 2]].clone().requires_grad_(True)  # c = 1 exactly on the target
    g = torch.tensor([30.0, 17.5, G_MAX + 1.0, 0.0], requires_grad=True)
    s = torch.tensor(2.0, requires_grad=True)
    y = torch.tensor([0, 1, 2])
    z = losses.wcdas_logits(x, w, g, s)
    assert torch.isfinite(z).all()
    bound = 2.0 * (2 - 1e-6) / (2 * math.pi * 1e-6)  # s (1 + rho) / (2 pi (1 - rho)) ~ 3.2e5 s
    assert z.max().item() <= bound * (1 + 1e-4) and z.max().item() > 0.9 * bound
    out = losses.wcdas_loss(x, y, w, g, s)
    grads = torch.autograd.grad(out, (x, g, s))
    assert torch.isfinite(out) and all(torch.isfinite(t).all() for t in grads)
    assert grads[1][0].item() == 0.0 and grads[1][2].item() == 0.0  # clamped: no gradient
    # the clamped g gives the same logits as g = log((1 - delta) / delta)
    g_clamped = g.detach().clamp(max=G_MAX)
    torch.testing.assert_close(losses.wcdas_logits(x, w, g_clamped, s), z, rtol=0, atol=0)
    # fp64 oracle with the clamp applied agrees
    torch.testing.assert_close(z.double(), wcdas_logits_oracle(x.double(), w.double(), g.double(), 2.0),
                               rtol=1e-3, atol=0)


def test_zero_embedding_has_cosine_zero():
    w = randn(4, 3, seed=13)
    g = randn(4, seed=14)
    x = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    z = losses.wcdas_logits(x, w, g, 2.0)
    rho = torch.sigmoid(g)
    expected = 2.0 * (1 - rho ** 2) / (2 * math.pi * (1 + rho ** 2))
    torch.testing.assert_close(z, expected.expand(2, 4), rtol=1e-12, atol=0)
    (gx,) = torch.autograd.grad(losses.wcdas_loss(x, torch.tensor([0, 3]), w, g, 2.0), x)
    assert torch.isfinite(gx).all()


def test_all_ignored_is_attached_zero():
    x, w, g = (t.requires_grad_(True) for t in head(n=3, c=4, d=2, seed=15))
    s = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    y = torch.full((3,), IGN)
    for reduction in ("mean", "sum"):
        out = losses.wcdas_loss(x, y, w, g, s, reduction=reduction)
        assert out.item() == 0.0 and out.grad_fn is not None
        for t in torch.autograd.grad(out, (x, w, g, s)):
            assert t is not None and torch.all(t == 0)
    assert torch.all(losses.wcdas_loss(x, y, w, g, s, reduction="none") == 0)


# --------------------------------------------------------------------------------------
# module: parameters, state_dict round trip (trainable and fixed s)
# --------------------------------------------------------------------------------------


def test_module_parameters_and_helpers():
    torch.manual_seed(0)
    m = losses.WCDASLoss(6, 4)
    assert m.weight.shape == (4, 6) and m.weight.abs().max() <= 1 / math.sqrt(6)  # nn.Linear init
    assert torch.all(m.concentration_logit == 0.0) and m.concentration_logit.shape == (4,)
    assert m.scale_logit.shape == () and m.scale_logit.item() == 0.0 and m.scale is None
    assert m.effective_scale().item() == pytest.approx(1 + math.log(2), rel=1e-7)  # ~1.693
    torch.testing.assert_close(m.concentration(), torch.full((4,), 0.5))
    fixed = losses.WCDASLoss(6, 4, concentration_init=1.0, scale=250.0)
    assert fixed.scale_logit is None and fixed.effective_scale().item() == 250.0
    assert "scale" in dict(fixed.named_buffers()) and "scale" in fixed.state_dict()
    assert [n for n, _ in fixed.named_parameters()] == ["weight", "concentration_logit"]
    torch.testing.assert_close(fixed.concentration(), torch.full((4,), 1 / (1 + math.exp(-1.0))))
    with torch.no_grad():
        fixed.concentration_logit[0] = 40.0
    assert fixed.concentration()[0].item() == pytest.approx(1 - 1e-6, abs=1e-7)  # clamped
    ref = losses.WCDASLoss(6, 4, variant="reference")
    with torch.no_grad():
        ref.concentration_logit[0] = 40.0
    assert ref.concentration()[0].item() == 1.0  # the reference does not clamp
    x = randn(5, 6, seed=16).float()
    y = torch.tensor([0, 1, 2, 3, IGN])
    for mod in (m, fixed, ref):
        torch.testing.assert_close(mod.logits(x), losses.wcdas_logits(
            x, mod.weight, mod.concentration_logit, mod.effective_scale(), variant=mod.variant), rtol=0, atol=0)
        torch.testing.assert_close(mod(x, y), losses.wcdas_loss(
            x, y, mod.weight, mod.concentration_logit, mod.effective_scale(), variant=mod.variant), rtol=0, atol=0)
    r = repr(fixed)
    assert "WCDASLoss(" in r and "scale=250.0" in r and "concentration_init=1.0" in r
    assert "scale=None" in repr(m)
    for other in (copy.deepcopy(fixed), pickle.loads(pickle.dumps(fixed))):
        torch.testing.assert_close(other(x, y), fixed(x, y), rtol=0, atol=0)


@pytest.mark.parametrize("scale", [None, 30.0])
def test_state_dict_round_trip(scale):
    torch.manual_seed(1)
    src = losses.WCDASLoss(5, 3, concentration_init=-1.0, scale=scale)
    opt = torch.optim.SGD(src.parameters(), lr=0.5)
    x = randn(6, 5, seed=17).float()
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    for _ in range(3):  # train a little so every parameter moves away from its init
        opt.zero_grad()
        src(x, y).backward()
        opt.step()
    assert torch.all(src.concentration_logit != -1.0)
    if scale is None:
        assert src.scale_logit.item() != 0.0
    torch.manual_seed(2)
    dst = losses.WCDASLoss(5, 3, concentration_init=-1.0, scale=scale)
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    dst.load_state_dict(torch.load(buf, weights_only=True))
    torch.testing.assert_close(dst.effective_scale(), src.effective_scale(), rtol=0, atol=0)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    a, b = src(xa, y), dst(xb, y)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    for ga, gb in zip(torch.autograd.grad(a, [xa, *src.parameters()]), torch.autograd.grad(b, [xb, *dst.parameters()])):
        torch.testing.assert_close(ga, gb, rtol=0, atol=0)
    # a trainable-scale state does not silently load into a fixed-scale module (and vice versa)
    other = losses.WCDASLoss(5, 3, scale=None if scale is not None else 1.0)
    with pytest.raises(RuntimeError):
        other.load_state_dict(src.state_dict())


def test_module_to_float64_moves_the_fixed_scale():
    m = losses.WCDASLoss(3, 2, scale=4.0).to(torch.float64)
    assert m.scale.dtype == torch.float64 and m.weight.dtype == torch.float64
    out = m(randn(2, 3, seed=0), torch.tensor([0, 1]))
    assert out.dtype == torch.float64


# --------------------------------------------------------------------------------------
# dtypes: half inputs and autocast compute in float32
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_float32(dtype):
    x, w, g = head(n=5, c=4, d=6, seed=18)
    xh, wh, gh = (t.to(dtype).requires_grad_(True) for t in (x, w, g))
    y = torch.tensor([0, 1, 2, 3, 0])
    out = losses.wcdas_loss(xh, y, wh, gh, 10.0)
    assert out.dtype == torch.float32
    ref = losses.wcdas_loss(xh.detach().float(), y, wh.detach().float(), gh.detach().float(), 10.0)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    assert all(t.dtype == dtype for t in torch.autograd.grad(out, (xh, wh, gh)))
    assert losses.wcdas_logits(xh, wh, gh, 10.0).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_computes_in_float32(dtype):
    torch.manual_seed(0)
    m = losses.WCDASLoss(6, 4, concentration_init=2.0)
    x = randn(5, 6, seed=19).float()
    y = torch.tensor([0, 1, 2, 3, 0])
    ref, ref_logits = m(x, y), m.logits(x)
    with torch.autocast("cpu", dtype=dtype):
        out, logits = m(x, y), m.logits(x)
    assert out.dtype == torch.float32 and logits.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------
# errors and validation
# --------------------------------------------------------------------------------------


def test_errors():
    x, w, g = head(n=4, c=5, d=3, seed=20)
    y = torch.tensor([0, 1, 2, 4])
    with pytest.raises(ValueError, match=r"^wcdas_loss: reduction must be one of 'none', 'mean', 'sum'"):
        losses.wcdas_loss(x, y, w, g, 1.0, reduction="avg")
    with pytest.raises(ValueError, match=r"^wcdas_loss: variant must be one of"):
        losses.wcdas_loss(x, y, w, g, 1.0, variant="code")
    with pytest.raises(ValueError, match=r"^wcdas_logits: weight must have shape \(C, 3\)"):
        losses.wcdas_logits(x, w[:, :2], g, 1.0)
    with pytest.raises(ValueError, match=r"^wcdas_loss: concentration_logit must have shape \(5,\)"):
        losses.wcdas_loss(x, y, w, g[:4], 1.0)
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match=r"^wcdas_loss: scale must be finite and satisfy scale > 0"):
            losses.wcdas_loss(x, y, w, g, bad)
        if math.isfinite(bad):
            with pytest.raises(ValueError, match=r"^WCDASLoss: scale must be finite and satisfy scale > 0"):
                losses.WCDASLoss(3, 5, scale=bad)
    for bad in (0.0, -1.0):  # the same rule for a tensor scale (a 0-dim tensor, e.g. a learnt s)
        for fn, args in (("wcdas_loss", (x, y, w, g)), ("wcdas_logits", (x, w, g))):
            with pytest.raises(ValueError, match=rf"^{fn}: scale must be finite and satisfy scale > 0 \(got "):
                getattr(losses, fn)(*args, torch.tensor(bad, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^wcdas_loss: scale must be a scalar"):
        losses.wcdas_loss(x, y, w, g, torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^wcdas_loss: embeddings must have shape \(N, D\)"):
        losses.wcdas_loss(x[0], y[:1], w, g, 1.0)
    with pytest.raises(ValueError, match=r"^wcdas_loss: target must have shape \(4,\)"):
        losses.wcdas_loss(x, y[:2], w, g, 1.0)
    with pytest.raises(TypeError, match=r"^wcdas_loss: target must hold integer class ids"):
        losses.wcdas_loss(x, y.float(), w, g, 1.0)
    with pytest.raises(ValueError, match=r"^WCDASLoss: embedding_dim must be a positive int"):
        losses.WCDASLoss(0, 5)
    with pytest.raises(ValueError, match=r"^WCDASLoss: concentration_init must be finite"):
        losses.WCDASLoss(3, 5, concentration_init=math.nan)


def test_data_checks_and_validation_switch():
    x, w, g = head(n=4, c=5, d=3, seed=21)
    with pytest.raises(ValueError, match=r"^wcdas_loss: target has class ids outside \[0, 5\) \(got min=0, max=5\)"):
        losses.wcdas_loss(x, torch.tensor([0, 5, 1, 2]), w, g, 1.0)
    with pytest.raises(ValueError, match=r"^wcdas_loss: target has class ids outside \[0, 5\)"):
        losses.wcdas_loss(x, torch.tensor([0, -2, 1, 2]), w, g, 1.0)
    y = torch.tensor([0, 1, 2, 3])
    for name in ("embeddings", "weight", "concentration_logit", "scale"):
        args = {"embeddings": x.clone(), "weight": w.clone(), "concentration_logit": g.clone(),
                "scale": torch.tensor(1.0, dtype=torch.float64)}
        args[name].view(-1)[0] = math.nan
        with pytest.raises(ValueError, match=rf"^wcdas_loss: {name} contains NaN or infinite values"):
            losses.wcdas_loss(args["embeddings"], y, args["weight"], args["concentration_logit"], args["scale"])
        with losses.validation(False):
            losses.wcdas_loss(args["embeddings"], y, args["weight"], args["concentration_logit"], args["scale"])
    with losses.validation(False):  # exactly the data checks go: shapes and hyperparameters stay
        with pytest.raises(ValueError, match=r"^wcdas_loss: concentration_logit must have shape"):
            losses.wcdas_loss(x, y, w, g[:3], 1.0)
        with pytest.raises(ValueError, match=r"^wcdas_loss: scale must be finite and satisfy scale > 0"):
            losses.wcdas_loss(x, y, w, g, -1.0)
        with pytest.raises(ValueError, match=r"^wcdas_loss: reduction must be one of"):
            losses.wcdas_loss(x, y, w, g, 1.0, reduction="avg")


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_integer_ids_of_any_dtype(dtype):
    x, w, g = head(n=5, c=7, d=3, seed=22)
    y = torch.tensor([6, 0, 3, 2, 6])
    torch.testing.assert_close(losses.wcdas_loss(x, y.to(dtype), w, g, 2.0),
                               wcdas_loss_oracle(x, y, w, g, 2.0), rtol=1e-10, atol=1e-12)


def test_doctests_run():
    import doctest

    from losses.embedding import wcdas

    res = doctest.testmod(wcdas)
    assert res.attempted > 0 and res.failed == 0
