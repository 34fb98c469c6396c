"""The code paths a loss takes only while ``torch.compile`` traces it.

Under compile a loss cannot look at its data on the host, so some losses take a different, but
mathematically equal, path there: the target column is written with an element-wise ``where``
instead of an in-place scatter (``add_at_target``, ``set_at_index``: inductor fuses the ``where``
into the kernel that computes the tensor, the scatter would end that kernel), and the binary
cross-entropy runs through a Function whose value and gradient are each one element-wise
expression. These tests compile the losses on inputs that reach those paths (ignored rows,
``-inf`` logits, label smoothing, class weights, soft targets, N-D inputs, every reduction) and
compare values and gradients with the eager path, which the family's own tests check against
float64 references. They compile with ``aot_eager`` (dynamo traces the same Python, so the
compile-only branches run) and once with inductor (the log-Z penalty); inductor compiles GOL, the
Z-loss and cross-entropy in tests/test_contract.py, and every one of these losses in the performance
suite's ``compiled`` run (``benchmarks/perf_losses.py --suite compiled``).
"""

from __future__ import annotations

import math

import pytest
import torch

import losses
from losses._core import add_at_target, set_at_index
from losses.classification.baselines import _BCEElementwiseFunction


def _compiled_matches_eager(fn, x: torch.Tensor, *args, backend: str = "aot_eager", **kwargs) -> None:
    torch._dynamo.reset()
    x1 = x.detach().clone().requires_grad_(True)
    x2 = x.detach().clone().requires_grad_(True)
    with losses.validation(False):
        eager = fn(x1, *args, **kwargs)
        compiled = torch.compile(lambda z: fn(z, *args, **kwargs), backend=backend, fullgraph=False)(x2)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6, equal_nan=True)
    eager.sum().backward() if eager.dim() else eager.backward()
    compiled.sum().backward() if compiled.dim() else compiled.backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-4, atol=1e-6)


def test_add_at_target_compiled_equals_scatter():
    g = torch.Generator().manual_seed(0)
    grad = torch.randn(7, 11, generator=g)
    y = torch.randint(0, 11, (7,), generator=g)
    for value in (torch.randn(7, generator=g), torch.tensor(-0.25)):
        eager = add_at_target(grad.clone(), y, value)
        ref = grad.clone()
        ref[torch.arange(7), y] += value
        torch.testing.assert_close(eager, ref)
        torch._dynamo.reset()
        compiled = torch.compile(lambda a, b, v: add_at_target(a.clone(), b, v), backend="aot_eager",
                                 fullgraph=True)(grad, y, value)
        torch.testing.assert_close(compiled, ref)


@pytest.mark.parametrize("shape", [(5, 9), (4, 6, 3)])
def test_set_at_index_compiled_equals_scatter(shape):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=g)
    index_shape = (shape[0], 1) + shape[2:]
    index = torch.randint(0, shape[1], index_shape, generator=g)
    for value in (0.0, torch.randn(*index_shape, generator=g)):
        ref = x.clone().scatter_(1, index, value)
        torch._dynamo.reset()
        compiled = torch.compile(lambda a, i: set_at_index(a.clone(), i, value), backend="aot_eager",
                                 fullgraph=True)(x, index)
        torch.testing.assert_close(compiled, ref)


def _ids_with_ignored(n: int, c: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, c, (n,), generator=g)
    y[1] = -100
    y[-1] = -100
    return y


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_bce_with_logits_compiled_ids(reduction):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 10, generator=g) * 4
    x[0, 3] = -math.inf  # a class that does not exist for this row
    x[1, :] = math.inf  # an ignored row holding garbage
    y = _ids_with_ignored(6, 10, 3)
    y[0] = 5
    w = torch.rand(10, generator=g) + 0.5
    _compiled_matches_eager(losses.bce_with_logits_loss, x, y, reduction=reduction, weight=w,
                            label_smoothing=0.1)


def test_bce_with_logits_compiled_soft_targets_and_ids():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(8, 12, generator=g) * 3
    soft = torch.rand(8, 12, generator=g)
    _compiled_matches_eager(losses.bce_with_logits_loss, x, soft)
    y = _ids_with_ignored(8, 12, 5)
    x[2, 7] = -math.inf
    _compiled_matches_eager(losses.bce_with_logits_loss, x, y)


def test_bce_elementwise_function_values_gradients_and_second_derivative():
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(4, 5, generator=g, dtype=torch.float64) * 5).requires_grad_(True)
    y = torch.rand(4, 5, generator=g, dtype=torch.float64).requires_grad_(True)
    ref = torch.clamp(x, min=0) - x * y + torch.log1p(torch.exp(-x.abs()))
    torch.testing.assert_close(_BCEElementwiseFunction.apply(x, y), ref)
    assert torch.autograd.gradcheck(_BCEElementwiseFunction.apply, (x, y))
    assert torch.autograd.gradgradcheck(_BCEElementwiseFunction.apply, (x, y))
    # -inf: probability fixed at 0; the value is 0 against y = 0 and +inf against y > 0, no NaN
    # anywhere, and the gradients there are 0
    xi = torch.tensor([[-math.inf, 0.5]], dtype=torch.float64, requires_grad=True)
    yi = torch.tensor([[0.0, 1.0]], dtype=torch.float64, requires_grad=True)
    v = _BCEElementwiseFunction.apply(xi, yi)
    assert v[0, 0].item() == 0.0
    v.sum().backward()
    assert xi.grad[0, 0].item() == 0.0 and yi.grad[0, 0].item() == 0.0
    assert torch.isfinite(xi.grad).all() and torch.isfinite(yi.grad).all()
    assert _BCEElementwiseFunction.apply(xi.detach(), torch.ones(1, 2, dtype=torch.float64))[0, 0].item() == math.inf


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_gol_compiled_ids(reduction):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 10, generator=g) * 3
    x[1, :] = math.nan  # an ignored row holding garbage
    y = _ids_with_ignored(6, 10, 8)
    _compiled_matches_eager(losses.gumbel_bce_loss, x, y, reduction=reduction)


def test_gol_compiled_plain_and_nd():
    g = torch.Generator().manual_seed(9)
    x = torch.randn(16, 40, generator=g) * 2
    y = torch.randint(0, 40, (16,), generator=g)
    _compiled_matches_eager(losses.gumbel_bce_loss, x, y)
    x3 = torch.randn(3, 7, 4, generator=g)
    y3 = torch.randint(0, 7, (3, 4), generator=g)
    y3[0, 1] = -100
    _compiled_matches_eager(losses.gumbel_bce_loss, x3, y3, reduction="sum")


@pytest.mark.parametrize("name", ["logz_penalty", "z_loss"])
def test_logz_and_z_loss_compiled_ids(name):
    fn = losses.get_loss_spec(name).function
    g = torch.Generator().manual_seed(10)
    x = torch.randn(6, 10, generator=g) * 3
    if name == "logz_penalty":  # a softmax: -inf removes the class (the Z-loss standardises, and refuses -inf)
        x[0, 2] = -math.inf
    y = _ids_with_ignored(6, 10, 11)
    y[0] = 4
    for reduction in ("mean", "sum", "none"):
        _compiled_matches_eager(fn, x, y, reduction=reduction)


def test_logz_penalty_compiled_inductor_with_penalty_part():
    g = torch.Generator().manual_seed(12)
    x = torch.randn(16, 50, generator=g) * 2
    y = _ids_with_ignored(16, 50, 13)

    def both(z, t):
        loss, pen = losses.cross_entropy_with_logz_penalty(z, t, coef=1e-2, return_penalty=True)
        return loss + 3.0 * pen

    _compiled_matches_eager(both, x, y, backend="inductor")


def test_gol_compiled_tanh_within_a_few_ulp():
    from losses.classification.gol import _tanh_nonneg

    h = torch.cat([torch.logspace(-38, 2, 200_001, dtype=torch.float64),
                   torch.linspace(0, 1.5, 150_001, dtype=torch.float64)]).float()
    ref = torch.tanh(h.double())
    ulp = (torch.nextafter(ref.float(), torch.tensor(math.inf)).double() - ref.float().double()).clamp_min(1e-45)
    err = (_tanh_nonneg(h).double() - ref).abs() / ulp
    assert err.max().item() <= 2.5, (err.max().item(), h[err.argmax()].item())
    assert _tanh_nonneg(torch.tensor([0.0])).item() == 0.0
    assert _tanh_nonneg(torch.tensor([100.0])).item() == 1.0
