"""linear_cross_entropy (docs/losses/linear_cross_entropy.md): chunked == materialised, loop oracle, gradcheck, errors."""

import math

import pytest
import torch
import torch.nn.functional as F

import losses
from tests._helpers.rows import EMBEDDINGS, HEAD_KWARGS, entry

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "linear_cross_entropy": entry("linear_cross_entropy", "LinearCrossEntropyLoss", EMBEDDINGS, unit="row", owns_head=True,
          example=HEAD_KWARGS),
}


def loop_oracle(x, y, w, b, eps=0.0, coef=0.0, ignore_index=-100):
    """Explicit float64 loops straight from the formula; returns per-row losses (list)."""
    n, d = x.shape
    c = w.shape[0]
    out = []
    for i in range(n):
        if int(y[i]) == ignore_index:
            out.append(0.0)
            continue
        z = []
        for k in range(c):
            s = sum(float(x[i, j]) * float(w[k, j]) for j in range(d))
            z.append(s + (float(b[k]) if b is not None else 0.0))
        m = max(z)
        lse = m + math.log(sum(math.exp(v - m) for v in z))
        yi = int(y[i])
        out.append((1 - eps) * (lse - z[yi]) + eps * (lse - sum(z) / c) + coef * lse * lse)
    return out


def make(n=5, c=7, d=3, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype)
    w = torch.randn(c, d, generator=g, dtype=dtype)
    b = torch.randn(c, generator=g, dtype=dtype)
    y = torch.randint(0, c, (n,), generator=g)
    return x, y, w, b


@pytest.mark.parametrize("eps,coef", [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-2), (0.3, 0.2)])
@pytest.mark.parametrize("chunk_size", [1, 3, 7, None])
def test_matches_loop_oracle(eps, coef, chunk_size):
    x, y, w, b = make()
    y[2] = -100
    got = losses.linear_cross_entropy(x, y, w, bias=b, chunk_size=chunk_size, label_smoothing=eps,
                                      logz_coef=coef, reduction="none")
    ref = torch.tensor(loop_oracle(x, y, w, b, eps, coef), dtype=torch.float64)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    mean = losses.linear_cross_entropy(x, y, w, bias=b, chunk_size=chunk_size, label_smoothing=eps, logz_coef=coef)
    torch.testing.assert_close(mean, ref.sum() / 4, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 5, 11, 64, None])
@pytest.mark.parametrize("with_bias", [True, False])
def test_chunked_equals_materialised_fp32(chunk_size, with_bias):
    """Values and gradients equal F.cross_entropy on the materialised logits (1e-5 fp32)."""
    x, y, w, b = make(n=9, c=11, d=6, dtype=torch.float32, seed=1)
    y[0] = -100
    b = b if with_bias else None
    leaves = [t.clone().requires_grad_(True) for t in (x, w) + ((b,) if with_bias else ())]
    got = losses.linear_cross_entropy(leaves[0], y, leaves[1], bias=leaves[2] if with_bias else None,
                                      chunk_size=chunk_size)
    g_got = torch.autograd.grad(got, leaves)
    leaves2 = [t.clone().requires_grad_(True) for t in leaves]
    z = leaves2[0] @ leaves2[1].T + (leaves2[2] if with_bias else 0)
    ref = F.cross_entropy(z, y)
    g_ref = torch.autograd.grad(ref, leaves2)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for a, r in zip(g_got, g_ref):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)


def test_float64_gradients_match_materialised_to_1e10():
    x, y, w, b = make(n=6, c=13, d=4)
    leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
    got = losses.linear_cross_entropy(leaves[0], y, leaves[1], bias=leaves[2], chunk_size=5, reduction="sum")
    g = torch.autograd.grad(got, leaves)
    leaves2 = [t.clone().requires_grad_(True) for t in (x, w, b)]
    ref = F.cross_entropy(leaves2[0] @ leaves2[1].T + leaves2[2], y, reduction="sum")
    g2 = torch.autograd.grad(ref, leaves2)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    for a, r in zip(g, g2):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("n,c", [(1, 3), (3, 5)])
def test_gradcheck(n, c):
    x, y, w, b = make(n=n, c=c, d=3)
    inputs = tuple(t.clone().requires_grad_(True) for t in (x, w, b))
    assert torch.autograd.gradcheck(
        lambda x_, w_, b_: losses.linear_cross_entropy(x_, y, w_, bias=b_, chunk_size=2, label_smoothing=0.1,
                                                       logz_coef=0.05),
        inputs,
    )


def test_double_backward_is_not_claimed():
    x, y, w, b = make()
    x.requires_grad_(True)
    loss = losses.linear_cross_entropy(x, y, w, bias=b)
    with pytest.raises(RuntimeError, match=r"^linear_cross_entropy_loss: no second derivative"):
        torch.autograd.grad(loss, x, create_graph=True)
    (g,) = torch.autograd.grad(losses.linear_cross_entropy(x, y, w, bias=b), x)  # first order still works
    assert not g.requires_grad


def test_large_logits_are_finite():
    x, y, w, b = make(dtype=torch.float32)
    x = (x * 1e3).requires_grad_(True)
    loss = losses.linear_cross_entropy(x, y, w * 10, bias=b, chunk_size=2)
    (g,) = torch.autograd.grad(loss, x)
    assert torch.isfinite(loss) and torch.isfinite(g).all()
    torch.testing.assert_close(loss, F.cross_entropy(x.detach() @ (w * 10).T + b, y), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_give_fp32_loss_equal_to_upcast(dtype):
    x, y, w, b = make(dtype=torch.float32)
    xh, wh = x.to(dtype).requires_grad_(True), w.to(dtype).requires_grad_(True)
    loss = losses.linear_cross_entropy(xh, y, wh, chunk_size=3)
    assert loss.dtype == torch.float32
    ref = losses.linear_cross_entropy(xh.detach().float(), y, wh.detach().float(), chunk_size=3)
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    gx, gw = torch.autograd.grad(loss, (xh, wh))
    assert gx.dtype == dtype and gw.dtype == dtype


def test_all_ignored_is_attached_zero():
    x, y, w, b = make()
    leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
    y = torch.full_like(y, -100)
    loss = losses.linear_cross_entropy(leaves[0], y, leaves[1], bias=leaves[2])
    assert loss.item() == 0.0 and loss.grad_fn is not None
    for g in torch.autograd.grad(loss, leaves):
        assert torch.all(g == 0)


def test_empty_batch():
    w = torch.randn(4, 3, requires_grad=True)
    loss = losses.linear_cross_entropy(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), w)
    assert loss.item() == 0.0
    (g,) = torch.autograd.grad(loss, w)
    assert torch.all(g == 0)


def test_errors():
    x, y, w, b = make()
    fn = "linear_cross_entropy"
    with pytest.raises(ValueError, match=rf"^{fn}: target has class ids outside \[0, 7\) \(got min=0, max=7\)"):
        losses.linear_cross_entropy(x, torch.tensor([0, 1, 2, 3, 7]), w)
    with pytest.raises(ValueError, match=rf"^{fn}: weight must have shape \(C, 3\)"):
        losses.linear_cross_entropy(x, y, w[:, :2])
    with pytest.raises(ValueError, match=rf"^{fn}: target must have shape \(5,\)"):
        losses.linear_cross_entropy(x, y[:3], w)
    with pytest.raises(ValueError, match=rf"^{fn}: embeddings must have shape \(N, D\)"):
        losses.linear_cross_entropy(x[0], y, w)
    with pytest.raises(TypeError, match=rf"^{fn}: target must hold integer class ids"):
        losses.linear_cross_entropy(x, y.double(), w)
    with pytest.raises(ValueError, match=rf"^{fn}: chunk_size must be a positive int"):
        losses.linear_cross_entropy(x, y, w, chunk_size=0)
    with pytest.raises(ValueError, match=rf"^{fn}: bias must have shape \(7,\)"):
        losses.linear_cross_entropy(x, y, w, bias=b[:3])
    bad = x.clone()
    bad[1, 1] = float("nan")
    with pytest.raises(ValueError, match=rf"^{fn}: embeddings contains NaN"):
        losses.linear_cross_entropy(bad, y, w)
    with losses.validation(False):  # data checks off: no exception (result undefined)
        losses.linear_cross_entropy(bad, y, w)


def test_module_logits_state_dict_and_function():
    torch.manual_seed(0)
    m = losses.LinearCrossEntropyLoss(3, 7, chunk_size=2)
    x, y, _, _ = make(dtype=torch.float32)
    torch.testing.assert_close(m.logits(x), x @ m.weight.T + m.bias)
    torch.testing.assert_close(m(x, y), losses.linear_cross_entropy(x, y, m.weight, bias=m.bias, chunk_size=2))
    torch.testing.assert_close(m(x, y), F.cross_entropy(m.logits(x), y))
    m2 = losses.LinearCrossEntropyLoss(3, 7, chunk_size=2)
    m2.load_state_dict(m.state_dict())
    torch.testing.assert_close(m2(x, y), m(x, y), rtol=0, atol=0)
    nb = losses.LinearCrossEntropyLoss(3, 7, bias=False)
    assert nb.bias is None and set(nb.state_dict()) == {"weight"}
    with pytest.raises(ValueError, match="^LinearCrossEntropyLoss: num_classes must be a positive int"):
        losses.LinearCrossEntropyLoss(3, 0)


@pytest.mark.parametrize("eps", [0.0, 0.2])
@pytest.mark.parametrize("cap", [None, 3.0])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_class_weight_equals_f_cross_entropy_with_weight(eps, cap, reduction):
    """``class_weight=`` is ``F.cross_entropy``'s ``weight`` (label smoothing included; "mean"
    divides by the targets' weights), value and gradients in float64, chunked; the penalty part is
    weighted by the target's class weight."""
    torch.manual_seed(1)
    n, d, c = 7, 5, 11
    x = torch.randn(n, d, dtype=torch.float64, requires_grad=True)
    w = torch.randn(c, d, dtype=torch.float64, requires_grad=True)
    b = torch.randn(c, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, c, (n,))
    y[2] = -100
    cw = torch.rand(c, dtype=torch.float64) + 0.1
    z = x @ w.T + b
    zc = z if cap is None else cap * torch.tanh(z / cap)
    ref = torch.nn.functional.cross_entropy(zc, y, weight=cw, label_smoothing=eps, reduction=reduction)
    got = losses.linear_cross_entropy(x, y, w, bias=b, class_weight=cw, label_smoothing=eps, reduction=reduction,
                                      softcap=cap, chunk_size=4)
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-12)
    for g, r in zip(torch.autograd.grad(got.sum(), [x, w, b]), torch.autograd.grad(ref.sum(), [x, w, b])):
        assert torch.allclose(g, r, rtol=1e-10, atol=1e-12)
    module = losses.LinearCrossEntropyLoss(d, c, class_weight=cw, label_smoothing=eps, reduction=reduction,
                                           softcap=cap).double()
    with torch.no_grad():
        module.weight.copy_(w)
        module.bias.copy_(b)
    assert torch.allclose(module(x, y), ref, rtol=1e-12, atol=1e-12)


def test_class_weight_with_the_penalty_gradcheck_and_errors():
    torch.manual_seed(2)
    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 8, 3, -100, 5, 5])
    cw = torch.rand(9, dtype=torch.float64) + 0.1
    assert torch.autograd.gradcheck(lambda a, b: losses.linear_cross_entropy(
        a, y, b, class_weight=cw, label_smoothing=0.1, logz_coef=0.1, softcap=2.0, chunk_size=4), (x, w))
    with pytest.raises(ValueError, match=r"^linear_cross_entropy: class_weight must have shape \(9,\)"):
        losses.linear_cross_entropy(x, y, w, class_weight=torch.ones(3))
    with pytest.raises(ValueError, match=r"^linear_cross_entropy: class_weight must be non-negative"):
        losses.linear_cross_entropy(x, y, w, class_weight=-torch.ones(9))


def test_return_stats_from_the_chunked_pass():
    """``return_stats=True``: the same loss, per-row log Z, the penalty part reduced like the loss,
    the token accuracy from the running argmax over chunks (ties: the first class), the count."""
    torch.manual_seed(4)
    x = torch.randn(9, 4, dtype=torch.float64)
    w = torch.randn(13, 4, dtype=torch.float64)
    w[7] = w[2]  # a tie across two chunks: the first class wins, as argmax
    y = torch.randint(0, 13, (9,))
    y[0] = -100
    z = x @ w.T
    keep = y != -100
    for reduction in ("none", "mean", "sum"):
        st = losses.linear_cross_entropy(x, y, w, logz_coef=0.01, reduction=reduction, chunk_size=5, return_stats=True)
        assert isinstance(st, losses.LossStats)
        ref = losses.linear_cross_entropy(x, y, w, logz_coef=0.01, reduction=reduction, chunk_size=5)
        assert torch.equal(st.loss, ref)
        lse = torch.logsumexp(z, 1)
        assert torch.allclose(st.lse[keep], lse[keep], rtol=1e-12) and float(st.lse[0]) == 0.0
        pen = torch.where(keep, 0.01 * lse ** 2, torch.zeros_like(lse))
        want = pen if reduction == "none" else pen.sum() if reduction == "sum" else pen.sum() / keep.sum()
        assert torch.allclose(st.penalty, want, rtol=1e-12)
        assert float(st.accuracy) == pytest.approx(float((z.argmax(1) == y)[keep].double().mean()))
        assert int(st.count) == 8
