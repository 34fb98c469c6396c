"""Final-logit soft-capping (``softcap``) on the softmax cross-entropy paths: ``cross_entropy_loss``,
``cross_entropy_with_logz_penalty`` and the chunked ``linear_cross_entropy``.

Oracle: float64 loops written from the formula ``z -> c * tanh(z / c)``, then
``logsumexp(z) - z_y`` (+ label smoothing, + ``coef * logsumexp(z)^2``); gradients by autograd on
the oracle and by ``gradcheck``.
"""

from __future__ import annotations

import math

import pytest
import torch

import losses


def _oracle_row(z, y, cap, *, eps=0.0, coef=0.0):
    """One row, explicit loops over classes, float64 Python arithmetic on tensors."""
    c = len(z)
    capped = [cap * torch.tanh(z[k] / cap) if cap is not None else z[k] for k in range(c)]
    m = max(float(v.detach()) for v in capped)
    lse = m + torch.log(sum(torch.exp(v - m) for v in capped))
    mean = sum(capped) / c
    return (1 - eps) * (lse - capped[y]) + eps * (lse - mean) + coef * lse * lse


def _oracle(z, y, cap, *, eps=0.0, coef=0.0, ignore_index=-100):
    vals, n = [], 0
    for i in range(z.shape[0]):
        if int(y[i]) == ignore_index:
            continue
        vals.append(_oracle_row(z[i], int(y[i]), cap, eps=eps, coef=coef))
        n += 1
    return sum(vals) / n


def _data(n=5, c=7, d=3, seed=0, scale=20.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, c, generator=g, dtype=torch.float64) * scale).requires_grad_()
    y = torch.randint(c, (n,), generator=g)
    y[1] = -100
    return x, y


@pytest.mark.parametrize("cap", [None, 3.0, 30.0])
def test_cross_entropy_softcap_matches_loop_oracle(cap):
    x, y = _data()
    got = losses.cross_entropy_loss(x, y, softcap=cap)
    (g_got,) = torch.autograd.grad(got, x)
    x2 = x.detach().clone().requires_grad_()
    ref = _oracle(x2, y, cap)
    (g_ref,) = torch.autograd.grad(ref, x2)
    assert torch.allclose(got, ref, rtol=1e-12, atol=0)
    assert torch.allclose(g_got, g_ref, rtol=1e-10, atol=1e-14)
    if cap is not None:  # capping changes the value for logits of this size
        assert not torch.isclose(got, losses.cross_entropy_loss(x, y))


def test_cross_entropy_softcap_label_smoothing_and_module():
    x, y = _data(seed=1)
    got = losses.cross_entropy_loss(x, y, softcap=4.0, label_smoothing=0.2)
    ref = _oracle(x.detach(), y, 4.0, eps=0.2)
    assert torch.allclose(got, ref, rtol=1e-12)
    mod = losses.CrossEntropyLoss(softcap=4.0, label_smoothing=0.2)
    assert torch.equal(mod(x, y), got)
    assert "softcap=4.0" in repr(mod)


def test_cross_entropy_softcap_keeps_minus_inf_masks():
    x, y = _data(seed=2)
    x = x.detach().clone()
    x[0, 3] = -math.inf
    y[0] = 0
    x.requires_grad_()
    got = losses.cross_entropy_loss(x, y, softcap=5.0)
    (g,) = torch.autograd.grad(got, x)
    keep = [k for k in range(x.shape[1]) if k != 3]
    row0 = _oracle_row(x.detach()[0, keep], 0, 5.0)
    rest = [_oracle_row(x.detach()[i], int(y[i]), 5.0) for i in range(2, x.shape[0])]
    ref = (row0 + sum(rest)) / (1 + len(rest))
    assert torch.allclose(got, ref, rtol=1e-12)
    assert g[0, 3] == 0 and torch.isfinite(g).all()


@pytest.mark.parametrize("cap", [2.0, 30.0])
def test_logz_penalty_softcap_matches_loop_oracle(cap):
    x, y = _data(seed=3)
    got, pen = losses.cross_entropy_with_logz_penalty(x, y, coef=1e-2, softcap=cap, return_penalty=True)
    (g_got,) = torch.autograd.grad(got, x)
    x2 = x.detach().clone().requires_grad_()
    ref = _oracle(x2, y, cap, coef=1e-2)
    (g_ref,) = torch.autograd.grad(ref, x2)
    assert torch.allclose(got, ref, rtol=1e-12)
    assert torch.allclose(g_got, g_ref, rtol=1e-10, atol=1e-14)
    lse = torch.logsumexp(cap * torch.tanh(x.detach() / cap), 1)[y != -100]
    assert torch.allclose(pen, 1e-2 * (lse ** 2).mean(), rtol=1e-12)
    mod = losses.CrossEntropyWithLogZPenalty(coef=1e-2, softcap=cap)
    assert torch.equal(mod(x, y), got)


@pytest.mark.parametrize("chunk", [1, 3, 7, None])
@pytest.mark.parametrize("eps,coef", [(0.0, 0.0), (0.1, 1e-2)])
def test_linear_cross_entropy_softcap_matches_loop_oracle(chunk, eps, coef):
    g = torch.Generator().manual_seed(4)
    e = (torch.randn(6, 4, generator=g, dtype=torch.float64) * 3).requires_grad_()
    w = (torch.randn(7, 4, generator=g, dtype=torch.float64) * 3).requires_grad_()
    b = torch.randn(7, generator=g, dtype=torch.float64).requires_grad_()
    y = torch.randint(7, (6,), generator=g)
    y[2] = -100
    got = losses.linear_cross_entropy(e, y, w, bias=b, chunk_size=chunk, label_smoothing=eps, logz_coef=coef,
                                      softcap=2.5)
    grads = torch.autograd.grad(got, (e, w, b))
    leaves = [t.detach().clone().requires_grad_() for t in (e, w, b)]
    z = leaves[0] @ leaves[1].T + leaves[2]
    ref = _oracle(z, y, 2.5, eps=eps, coef=coef)
    refs = torch.autograd.grad(ref, leaves)
    assert torch.allclose(got, ref, rtol=1e-12)
    for a, r in zip(grads, refs):
        assert torch.allclose(a, r, rtol=1e-10, atol=1e-13)


def test_linear_cross_entropy_module_softcap_logits():
    mod = losses.LinearCrossEntropyLoss(4, 9, softcap=1.5).double()
    e = torch.randn(5, 4, dtype=torch.float64) * 4
    y = torch.tensor([0, 8, 3, 3, 1])
    logits = mod.logits(e)
    assert logits.abs().max() < 1.5
    assert torch.allclose(mod(e, y), torch.nn.functional.cross_entropy(logits, y), rtol=1e-12)


def test_softcap_gradchecks():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 5, generator=g, dtype=torch.float64).mul(3).requires_grad_()
    y = torch.tensor([0, 4, 2])
    assert torch.autograd.gradcheck(lambda t: losses.cross_entropy_loss(t, y, softcap=2.0), (x,))
    assert torch.autograd.gradcheck(
        lambda t: losses.cross_entropy_with_logz_penalty(t, y, coef=0.1, softcap=2.0), (x,))
    e = torch.randn(3, 2, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(5, 2, generator=g, dtype=torch.float64).mul(2).requires_grad_()
    bias = torch.randn(5, generator=g, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, b, c: losses.linear_cross_entropy(a, y, b, bias=c, chunk_size=2, label_smoothing=0.1,
                                                    logz_coef=0.1, softcap=1.5), (e, w, bias))


def test_softcap_fp32_matches_fp64():
    x, y = _data(seed=6)
    got = losses.cross_entropy_loss(x.detach().float(), y, softcap=3.0)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), losses.cross_entropy_loss(x.detach(), y, softcap=3.0), rtol=1e-5)


@pytest.mark.parametrize("call", [
    lambda cap: losses.cross_entropy_loss(torch.zeros(2, 3), torch.tensor([0, 1]), softcap=cap),
    lambda cap: losses.cross_entropy_with_logz_penalty(torch.zeros(2, 3), torch.tensor([0, 1]), softcap=cap),
    lambda cap: losses.linear_cross_entropy(torch.zeros(2, 3), torch.tensor([0, 1]), torch.zeros(4, 3), softcap=cap),
    lambda cap: losses.CrossEntropyLoss(softcap=cap),
    lambda cap: losses.CrossEntropyWithLogZPenalty(softcap=cap),
    lambda cap: losses.LinearCrossEntropyLoss(3, 4, softcap=cap),
])
def test_softcap_errors(call):
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match=r"^\w+: softcap must be a positive finite float"):
            call(bad)
    for bad in (True, "30", [1.0]):
        with pytest.raises(TypeError, match=r"^\w+: softcap must be None or a positive float"):
            call(bad)
