"""The Triton row kernels (losses/kernels/triton_rows.py) against the float64 PyTorch path.

Without a GPU the kernels run on CPU tensors through Triton's interpreter (tests/conftest.py sets
``TRITON_INTERPRET=1`` before torch is imported on a machine without an NVIDIA device, and each
kernel call here sits inside ``losses.kernels.interpret()``); with a GPU the same tests run on CUDA
tensors through the compiled kernels. Shapes are small (the interpreter runs one row at a time);
``BLOCK = 32`` cases walk rows in several blocks with a ragged last one.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys

import pytest
import torch

import losses
from losses import kernels

if not kernels.triton_status()[0]:  # pragma: no cover - triton ships with every CUDA build of torch
    pytest.skip("triton does not import here", allow_module_level=True)

from losses.kernels import triton_rows  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
if not CUDA and not kernels.interpreter_ready():  # pragma: no cover - conftest sets TRITON_INTERPRET=1
    pytest.skip("Triton is not in interpreter mode (run with TRITON_INTERPRET=1)", allow_module_level=True)

# the interpreter runs the kernels' arithmetic in NumPy, which warns where IEEE gives the intended
# inf / 0 (exp overflow, division by 0 in masked lanes)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DTYPES = {"fp32": (torch.float32, 2e-5, 2e-5), "bf16": (torch.bfloat16, 2e-5, 1e-2), "fp16": (torch.float16, 2e-5, 2e-3)}


@contextlib.contextmanager
def on_kernel(block=None, vector_sums=None):
    """The kernel path for the calls inside (interpreted on CPU), with an optional block size and
    choice of the softmax forward's accumulators."""
    previous = triton_rows.override_config, triton_rows.vector_sums
    triton_rows.override_config = None if block is None else (block, 4)
    if vector_sums is not None:
        triton_rows.vector_sums = vector_sums
    try:
        with kernels.interpret(not CUDA):
            yield
    finally:
        triton_rows.override_config, triton_rows.vector_sums = previous


def _logits(m, c, dtype, seed=0, scale=3.0, extra=()):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((m, c) + tuple(extra), generator=g, dtype=torch.float64) * scale
    return x.to(dtype).to(torch.float64)  # values exactly representable in dtype


def _compare(fn, x64, dtype, val_tol, grad_tol, block=None, seed=1, **kwargs):
    """``fn(x, **kwargs)`` on the kernel path (input in ``dtype`` on DEV) against ``fn`` on the
    float64 PyTorch path (CPU): the values, and the gradients for a random incoming gradient."""
    xk = x64.to(DEV, dtype).requires_grad_(True)
    with on_kernel(block):
        out = fn(xk, **{k: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()})
    xr = x64.clone().requires_grad_(True)
    ref = fn(xr, **kwargs)
    outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
    g = torch.Generator().manual_seed(seed)
    total_k, total_r = 0.0, 0.0
    for o, r in zip(outs, refs):
        assert o.dtype == torch.float32, o.dtype  # the kernel path computes and returns float32
        assert o.shape == r.shape
        finite = torch.isfinite(r)
        assert torch.equal(torch.isfinite(o.cpu()), finite), (o, r)
        torch.testing.assert_close(o.cpu().double()[finite], r[finite], rtol=val_tol, atol=val_tol)
        w = torch.randn(r.shape, generator=g, dtype=torch.float64)
        total_k = total_k + (o.cpu().double()[finite] * w[finite]).sum()
        total_r = total_r + (r[finite] * w[finite]).sum()
    total_k.backward()
    total_r.backward()
    assert xk.grad.dtype == dtype
    torch.testing.assert_close(xk.grad.cpu().double(), xr.grad, rtol=grad_tol, atol=grad_tol)
    return out


def _target(m, c, seed=2, ignored=(), extra=()):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, c, (m,) + tuple(extra), generator=g)
    for i in ignored:
        y.view(-1)[i] = -100
    return y


# ---------------------------------------------------------------------------------------------
# cross-entropy family
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,reduction,block", [("fp32", "mean", None), ("fp32", "sum", 32), ("fp32", "none", 32),
                                                   ("bf16", "mean", 32), ("bf16", "none", None), ("fp16", "sum", 32),
                                                   ("fp16", "mean", None)])
def test_cross_entropy_matches_float64(dtype, reduction, block):
    dt, vt, gt = DTYPES[dtype]
    x = _logits(6, 77, dt)
    y = _target(6, 77, ignored=(2,))
    _compare(losses.cross_entropy_loss, x, dt, vt, gt, block, target=y, reduction=reduction)


@pytest.mark.parametrize("vector_sums", [False, True])
def test_both_forward_accumulators_agree(vector_sums):
    x = _logits(6, 100, torch.float32, seed=60)
    x[0, 50:] = -math.inf
    x[1, 0] = 60.0  # a confident row: the non-target mass keeps its precision either way
    y = _target(6, 100, seed=61, ignored=(3,))
    xk = x.float().to(DEV).requires_grad_(True)
    with on_kernel(32, vector_sums):
        v = losses.cross_entropy_with_logz_penalty(xk, y.to(DEV), coef=0.1, reduction="none")
    v.sum().backward()
    xr = x.clone().requires_grad_(True)
    r = losses.cross_entropy_with_logz_penalty(xr, y, coef=0.1, reduction="none")
    r.sum().backward()
    torch.testing.assert_close(v.detach().cpu().double(), r.detach(), rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(xk.grad.cpu().double(), xr.grad, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_logz_penalty_return_stats_on_the_kernel_path(reduction):
    """``return_stats=True`` on the kernel path (per-row kernel, reduced after): the same loss,
    log Z, penalty, accuracy and count as the PyTorch path, gradients included; N-D positions."""
    x = _logits(6, 40, torch.float32, seed=62).float().reshape(3, 2, 40).transpose(1, 2).contiguous()
    y = _target(6, 40, seed=63, ignored=(4,)).reshape(3, 2)
    xk = x.detach().clone().to(DEV).requires_grad_(True)
    with on_kernel():
        assert kernels.use_triton(xk)
        st = losses.cross_entropy_with_logz_penalty(xk, y.to(DEV), coef=0.1, reduction=reduction, return_stats=True)
    st.loss.sum().backward()
    xr = x.detach().clone().requires_grad_(True)
    ref = losses.cross_entropy_with_logz_penalty(xr, y, coef=0.1, reduction=reduction, return_stats=True)
    ref.loss.sum().backward()
    for got, want in zip(st, ref):
        torch.testing.assert_close(got.detach().cpu().double(), want.detach().double(), rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(xk.grad.cpu(), xr.grad, rtol=2e-5, atol=2e-6)
    assert st.lse.shape == y.shape and int(st.count) == 5


@pytest.mark.parametrize("block", [None, 32])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("softcap", [None, 4.0])
def test_cross_entropy_options(block, smoothing, weighted, softcap):
    x = _logits(5, 45, torch.float32, seed=3)
    x[1, 7] = -math.inf  # a masked class
    x[3, :20] = -math.inf
    y = _target(5, 45, seed=4, ignored=(4,))
    y[3] = 30  # a kept class of the masked row
    w = torch.rand(45, generator=torch.Generator().manual_seed(5), dtype=torch.float64) + 0.1
    kw = dict(target=y, label_smoothing=smoothing, softcap=softcap, weight=w.float() if weighted else None)
    for reduction in ("mean", "none"):
        _compare(losses.cross_entropy_loss, x, torch.float32, 2e-5, 2e-5, block, reduction=reduction, **kw)


def test_cross_entropy_target_on_a_masked_class_is_inf_with_finite_gradient():
    x = _logits(3, 20, torch.float32, seed=6)
    x[0, 4] = -math.inf
    y = torch.tensor([4, 1, 2])
    xk = x.float().to(DEV).requires_grad_(True)
    with on_kernel():
        v = losses.cross_entropy_loss(xk, y.to(DEV), reduction="none")
    assert math.isinf(float(v[0])) and float(v[0]) > 0 and torch.isfinite(v[1:]).all()
    v[1:].sum().backward()
    assert torch.isfinite(xk.grad).all()


def test_all_ignored_batch_is_an_exact_zero_with_zero_gradients():
    x = _logits(4, 30, torch.float32).float().to(DEV).requires_grad_(True)
    y = torch.full((4,), -100, device=DEV)
    with on_kernel():
        loss = losses.cross_entropy_loss(x, y)
    assert float(loss) == 0.0
    loss.backward()
    assert torch.count_nonzero(x.grad) == 0


def test_ignored_rows_holding_inf_give_zero_gradients_without_validation():
    x = _logits(4, 30, torch.float32).float()
    x[1] = math.inf
    x[2, 3] = math.nan
    xk = x.to(DEV).requires_grad_(True)
    y = torch.tensor([3, -100, -100, 5], device=DEV)
    with on_kernel(), losses.validation(False):
        loss = losses.cross_entropy_loss(xk, y)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(xk.grad).all()
    assert torch.count_nonzero(xk.grad[1:3]) == 0
    ref = losses.cross_entropy_loss(x[[0, 3]].double(), y[[0, 3]].cpu())
    torch.testing.assert_close(loss.cpu().double(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cross_entropy_n_d_input(dtype):
    dt, vt, gt = DTYPES[dtype]
    x = _logits(2, 11, dt, extra=(3, 5))
    y = _target(2, 11, extra=(3, 5), ignored=(4,))
    _compare(losses.cross_entropy_loss, x, dt, vt, gt, 16, target=y)


def test_inplace_backward_writes_the_gradient_over_the_logits():
    x = _logits(5, 40, torch.float32).float()
    y = _target(5, 40, ignored=(1,))
    ref_x = x.double().requires_grad_(True)
    losses.cross_entropy_loss(ref_x, y, label_smoothing=0.1).backward()
    h = x.to(DEV).requires_grad_(True)
    logits = h * 1.0  # a non-leaf, as a model's output is
    with on_kernel():
        loss = losses.CrossEntropyLoss(label_smoothing=0.1, inplace_backward=True)(logits, y.to(DEV))
    loss.backward()
    torch.testing.assert_close(h.grad.cpu().double(), ref_x.grad, rtol=2e-5, atol=2e-5)
    # the logits' storage now holds the gradient: the documented price of the option
    torch.testing.assert_close(logits.detach().cpu().double(), ref_x.grad, rtol=2e-5, atol=2e-5)
    assert "inplace_backward=True" in repr(losses.CrossEntropyLoss(inplace_backward=True))
    assert "inplace_backward" not in repr(losses.CrossEntropyLoss())


def test_inplace_backward_must_be_a_bool():
    with pytest.raises(TypeError, match="inplace_backward"):
        losses.cross_entropy_loss(torch.randn(2, 3), torch.tensor([0, 1]), inplace_backward=1)
    with pytest.raises(TypeError, match="inplace_backward"):
        losses.CrossEntropyWithLogZPenalty(inplace_backward="yes")


@pytest.mark.parametrize("block", [None, 32])
def test_logit_adjusted_and_balanced_softmax(block):
    x = _logits(6, 50, torch.float32, seed=7)
    y = _target(6, 50, seed=8, ignored=(0,))
    counts = torch.arange(1, 51, dtype=torch.float64)
    prior = counts / counts.sum()
    _compare(losses.logit_adjusted_loss, x, torch.float32, 2e-5, 2e-5, block, target=y, class_prior=prior, tau=1.5)
    _compare(losses.balanced_softmax_loss, x, torch.float32, 2e-5, 2e-5, block, target=y, class_counts=counts)


@pytest.mark.parametrize("dtype,block", [("fp32", 32), ("bf16", None), ("fp16", 32)])
def test_logz_penalty_with_its_penalty(dtype, block):
    dt, vt, gt = DTYPES[dtype]
    x = _logits(6, 70, dt, seed=9)
    y = _target(6, 70, seed=10, ignored=(3,))
    out = _compare(losses.cross_entropy_with_logz_penalty, x, dt, vt, gt, block, target=y, coef=0.05,
                   return_penalty=True)
    assert isinstance(out, tuple) and out[1] > 0


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_logz_penalty_softcap_and_masks(reduction):
    x = _logits(5, 33, torch.float32, seed=11)
    x[2, 5:9] = -math.inf
    y = _target(5, 33, seed=12, ignored=(1,))
    y[2] = 0
    _compare(losses.cross_entropy_with_logz_penalty, x, torch.float32, 2e-5, 2e-5, 16, target=y, coef=1e-2,
             softcap=3.0, reduction=reduction)


@pytest.mark.parametrize("tau,block", [(0.0, 32), (0.5, None), (1.0, 32), (1.5, 32), (2.0, None)])
def test_comp_sum_matches_float64(tau, block):
    x = _logits(6, 40, torch.float32, seed=20)
    x[2, 3] = -math.inf
    y = _target(6, 40, seed=21, ignored=(4,))
    for reduction in ("mean", "none"):
        _compare(losses.comp_sum_loss, x, torch.float32, 2e-5, 2e-5, block, target=y, tau=tau, reduction=reduction)
    for dtype in ("bf16", "fp16"):
        dt, vt, gt = DTYPES[dtype]
        _compare(losses.comp_sum_loss, x.to(dt).double(), dt, vt, gt, block, target=y, tau=tau)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0])
@pytest.mark.parametrize("weighted", [False, True])
def test_focal_matches_float64(gamma, weighted):
    x = _logits(6, 40, torch.float32, seed=22)
    x[0, :] = -5.0
    x[0, 7] = 30.0  # p_y = 1 to float precision: value and gradient 0 (the limit)
    y = _target(6, 40, seed=23, ignored=(3,))
    y[0] = 7
    alpha = torch.rand(40, generator=torch.Generator().manual_seed(24)).float() + 0.1 if weighted else None
    for reduction in ("mean", "sum", "none"):
        _compare(losses.focal_loss, x, torch.float32, 2e-5, 2e-5, 16, target=y, gamma=gamma, alpha=alpha,
                 reduction=reduction)
    _compare(losses.focal_loss, x.bfloat16().double(), torch.bfloat16, *DTYPES["bf16"][1:], None, target=y, gamma=gamma,
             alpha=alpha)


@pytest.mark.parametrize("name,kw", [("cross_entropy_loss", {}), ("comp_sum_loss", {"tau": 0.5}),
                                     ("comp_sum_loss", {"tau": 1.5}), ("focal_loss", {"gamma": 2.0}),
                                     ("cross_entropy_with_logz_penalty", {"coef": 0.1})])
def test_target_on_a_masked_class_gives_the_documented_limits(name, kw):
    """Value +inf (or comp-sum's 1/(tau - 1) for tau > 1) and the PyTorch path's gradient (finite
    softmax - onehot where documented; +-inf entries for comp-sum with tau < 1)."""
    x = _logits(3, 20, torch.float32, seed=6)
    x[0, 4] = -math.inf
    x[1, 9] = -math.inf
    y = torch.tensor([4, 1, 2])
    fn = getattr(losses, name)
    xk = x.float().to(DEV).requires_grad_(True)
    with on_kernel():
        v = fn(xk, y.to(DEV), reduction="none", **kw)
    xr = x.clone().requires_grad_(True)
    r = fn(xr, y, reduction="none", **kw)
    assert torch.equal(v.detach().cpu().double(), r.detach()) or torch.allclose(v.detach().cpu().double(), r.detach())
    v.sum().backward()
    r.sum().backward()
    assert not torch.isnan(xk.grad).any()
    torch.testing.assert_close(xk.grad.cpu().double(), xr.grad, rtol=2e-5, atol=2e-5)


def test_confident_rows_keep_their_relative_precision():
    """ce = log(1 + u) from the non-target mass u = 49 exp(-32): the loss (6e-13) and its target
    gradient -u/(1 + u) keep float32's relative precision (logsumexp(x) - x_y cancels: even float64
    F.cross_entropy is off by 6e-4 relative here)."""
    x = torch.zeros(2, 50, dtype=torch.float64)
    x[:, 0] = 32.0
    y = torch.tensor([0, 0])
    ref = torch.full((2,), math.log1p(49 * math.exp(-32.0)), dtype=torch.float64)
    xk = x.float().to(DEV).requires_grad_(True)
    with on_kernel():
        v = losses.cross_entropy_loss(xk, y.to(DEV), reduction="none")
    v.sum().backward()
    torch.testing.assert_close(v.detach().cpu().double(), ref, rtol=1e-5, atol=0)
    torch.testing.assert_close(xk.grad[:, 0].cpu().double(), -49 * torch.exp(torch.tensor(-32.0, dtype=torch.float64))
                               * torch.ones(2, dtype=torch.float64), rtol=1e-5, atol=0)


# ---------------------------------------------------------------------------------------------
# element-wise binary losses (BCE, GOL) of class ids
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bce_with_logits_loss", "gumbel_bce_loss"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("block", [None, 32])
def test_binary_losses_match_float64(name, reduction, block):
    x = _logits(6, 45, torch.float32, seed=30, scale=6.0)
    x[1, 3] = -math.inf  # probability 0: label 0 costs 0, gradient 0
    x[2, 5] = -60.0  # below GOL's -50 floor
    x[3, 8] = 40.0
    y = _target(6, 45, seed=31, ignored=(4,))
    y[1] = 0
    w = torch.rand(45, generator=torch.Generator().manual_seed(32)) + 0.1
    fn = getattr(losses, name)
    for kw in ({}, {"weight": w}, {"label_smoothing": 0.1} if name == "gumbel_bce_loss" else {"label_smoothing": 0.0}):
        _compare(fn, x, torch.float32, 2e-5, 2e-5, block, target=y, reduction=reduction, **kw)
    _compare(fn, x.bfloat16().double(), torch.bfloat16, *DTYPES["bf16"][1:], block, target=y, reduction=reduction)


def test_binary_losses_with_smoothing_on_minus_inf_are_inf_as_on_the_pytorch_path():
    x = _logits(3, 10, torch.float32)
    x[0, 2] = -math.inf
    y = torch.tensor([1, 2, 3])
    xk = x.float().to(DEV)
    with on_kernel():
        v = losses.bce_with_logits_loss(xk, y.to(DEV), label_smoothing=0.1)
    assert math.isinf(float(v)) and math.isinf(float(losses.bce_with_logits_loss(x, y, label_smoothing=0.1)))


def test_binary_losses_outside_the_kernel_take_the_pytorch_path():
    """reduction "none", float labels, the reference GOL variant, a clamp or element-wise weights:
    the PyTorch path (the same values as without the kernel)."""
    x = _logits(4, 12, torch.float32).float()
    y = torch.tensor([1, 2, -100, 3])
    soft = torch.rand(4, 12)
    dev = lambda *ts: [t.to(DEV) for t in ts]  # noqa: E731
    for call in (lambda f, x, y, s: f(x, y, reduction="none"), lambda f, x, y, s: f(x, s)):
        for name in ("bce_with_logits_loss", "gumbel_bce_loss"):
            fn = getattr(losses, name)
            with on_kernel():
                got = call(fn, *dev(x, y, soft))
            torch.testing.assert_close(got.cpu(), call(fn, x, y, soft))
    for kw in ({"variant": "reference"}, {"clamp": (-4.0, 10.0)}):
        with on_kernel():
            got = losses.gumbel_bce_loss(*dev(x, y), **kw)
        torch.testing.assert_close(got.cpu(), losses.gumbel_bce_loss(x, y, **kw))
    w = torch.rand(4, 12)
    with on_kernel():
        got = losses.gumbel_bce_loss(*dev(x, y), weight=w.to(DEV))
    torch.testing.assert_close(got.cpu(), losses.gumbel_bce_loss(x, y, weight=w))


# ---------------------------------------------------------------------------------------------
# sparsemax and entmax-1.5 (Fenchel-Young losses of class ids)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sparsemax_loss", "entmax15_loss"])
@pytest.mark.parametrize("reduction,dtype", [("mean", "fp32"), ("sum", "bf16"), ("none", "fp32")])
def test_sparse_losses_match_float64(name, reduction, dtype):
    dt, vt, gt = DTYPES[dtype]
    x = _logits(7, 300, dt, seed=50, scale=1.5)
    x[1, 5:40] = -math.inf  # masks
    x[2, :] = 0.0  # a uniform row: every class in the support
    x[2, 9] = 3.0  # ... then a one-hot one: the loss 0 at the target
    y = _target(7, 300, seed=51, ignored=(4,))
    y[2] = 9
    fn = getattr(losses, name)
    _compare(fn, x.to(dt).double(), dt, 2e-5 if dtype == "fp32" else 1e-4, gt, None, target=y, reduction=reduction)


def test_sparse_losses_ties_and_masked_targets():
    x = torch.zeros(3, 17, dtype=torch.float64)
    x[0, :4] = 1.0  # four tied maxima
    x[1] = torch.linspace(-2, 2, 17, dtype=torch.float64)
    x[2, 3] = -math.inf
    y = torch.tensor([0, 16, 3])
    for name in ("sparsemax_loss", "entmax15_loss"):
        _compare(getattr(losses, name), x, torch.float32, 2e-5, 2e-5, None, target=y, reduction="none")


def test_sparse_losses_wider_than_the_kernel_take_the_pytorch_path(monkeypatch):
    monkeypatch.setattr(sys.modules["losses.classification.sparsemax"], "_FY_MAX", 16)
    x = _logits(3, 40, torch.float32, seed=52).float()
    y = torch.tensor([1, 2, 3])
    with on_kernel():
        got = losses.sparsemax_loss(x.to(DEV), y.to(DEV))
    torch.testing.assert_close(got.cpu(), losses.sparsemax_loss(x, y))


# ---------------------------------------------------------------------------------------------
# the LM head: linear cross-entropy
# ---------------------------------------------------------------------------------------------

LINEAR_OPTIONS = [{}, {"label_smoothing": 0.1}, {"softcap": 3.0}, {"logz_coef": 0.01},
                  {"label_smoothing": 0.2, "softcap": 2.0}]


@pytest.mark.parametrize("kw,dtype,tol,bias", [(kw, dt, tol, (i + j) % 2 == 1) for i, kw in enumerate(LINEAR_OPTIONS)
                                               for j, (dt, tol) in enumerate([(torch.bfloat16, 5e-3),
                                                                              (torch.float16, 5e-4)])],
                         ids=lambda v: (",".join(v) or "plain") if isinstance(v, dict) else str(v))
def test_linear_cross_entropy_matches_float64(kw, dtype, tol, bias):
    """Chunks of 32 of 70 classes (a ragged last one), one ignored row: the loss and the three
    gradients against float64 on the same (rounded) inputs; the half-precision chunk logits set the
    tolerance, as they would for a materialised ``x @ W.T``."""
    g = torch.Generator().manual_seed(40)
    n, h, v = 12, 16, 70
    x = torch.randn(n, h, generator=g).to(dtype)
    w = (torch.randn(v, h, generator=g) / 4).to(dtype)
    b = (torch.randn(v, generator=g) / 3).to(dtype) if bias else None
    y = torch.randint(0, v, (n,), generator=g)
    y[3] = -100
    ks = [t.to(DEV).clone().requires_grad_(True) if t is not None else None for t in (x, w, b)]
    with on_kernel():
        loss = losses.linear_cross_entropy(ks[0], y.to(DEV), ks[1], bias=ks[2], chunk_size=32, **kw)
    loss.backward()
    rs = [t.double().requires_grad_(True) if t is not None else None for t in (x, w, b)]
    ref = losses.linear_cross_entropy(rs[0], y, rs[1], bias=rs[2], **kw)
    ref.backward()
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.cpu().double(), ref, rtol=tol, atol=tol)
    for k, r in zip(ks, rs):
        if k is not None:
            assert k.grad.dtype == dtype
            torch.testing.assert_close(k.grad.cpu().double(), r.grad, rtol=tol, atol=tol)


def test_linear_cross_entropy_reductions_and_ignored_rows():
    g = torch.Generator().manual_seed(41)
    x = torch.randn(6, 8, generator=g).bfloat16()
    w = torch.randn(40, 8, generator=g).bfloat16()
    y = torch.tensor([1, -100, 39, 0, -100, 7])
    x[1] = float("nan")  # an ignored row's content never reaches the value or the gradients
    for reduction in ("mean", "sum", "none"):
        xk, wk = x.to(DEV).clone().requires_grad_(True), w.to(DEV).clone().requires_grad_(True)
        with on_kernel(), losses.validation(False):
            out = losses.linear_cross_entropy(xk, y.to(DEV), wk, reduction=reduction, chunk_size=16)
        out.sum().backward()
        keep = y != -100
        ref = losses.linear_cross_entropy(x[keep].double(), y[keep], w.double(), reduction=reduction)
        got = out.cpu().double()[keep.to(out.device).cpu()] if reduction == "none" else out.cpu().double()
        torch.testing.assert_close(got, ref, rtol=5e-3, atol=5e-3)
        assert torch.isfinite(wk.grad).all() and torch.count_nonzero(xk.grad[~keep.to(DEV)]) == 0
    xk, wk = x.to(DEV).clone().requires_grad_(True), w.to(DEV).clone().requires_grad_(True)
    with on_kernel(), losses.validation(False):
        out = losses.linear_cross_entropy(xk, torch.full((6,), -100, device=DEV), wk)
    out.backward()
    assert float(out) == 0.0 and torch.count_nonzero(wk.grad) == 0


def test_linear_cross_entropy_float32_keeps_its_path():
    """float32 (or mixed) inputs keep the float32 chunked path: the GPU path is for half precision."""
    from losses.kernels import triton_linear

    calls = []
    real = triton_linear.linear_cross_entropy_rows
    x, w, y = torch.randn(4, 8, device=DEV), torch.randn(10, 8, device=DEV), torch.tensor([1, 2, 3, 4], device=DEV)
    try:
        triton_linear.linear_cross_entropy_rows = lambda *a, **k: calls.append(1) or real(*a, **k)
        with on_kernel():
            losses.linear_cross_entropy(x, y, w)
            losses.linear_cross_entropy(x.bfloat16(), y, w)
            assert calls == []
            losses.linear_cross_entropy(x.bfloat16(), y, w.bfloat16())
            assert calls == [1]
    finally:
        triton_linear.linear_cross_entropy_rows = real


# ---------------------------------------------------------------------------------------------
# Z-loss
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,block,reduction", [("fp32", 32, "mean"), ("fp32", None, "none"), ("bf16", 32, "none"),
                                                   ("fp16", None, "mean")])
def test_z_loss_matches_float64(dtype, block, reduction):
    dt, vt, gt = DTYPES[dtype]
    x = _logits(7, 61, dt, seed=13) + 20.0  # an offset: the one-read variance must not cancel
    x = x.to(dt).double()
    y = _target(7, 61, seed=14, ignored=(5,))
    _compare(losses.z_loss, x, dt, vt, gt, block, target=y, a=2.0, b=1.5, reduction=reduction)


def test_z_loss_constant_rows_and_n_d():
    x = torch.zeros(2, 5, 3, dtype=torch.float64)
    x[1] = _logits(5, 3, torch.float32, seed=15)
    y = torch.tensor([[1, 2, 0], [4, -100, 3]])
    _compare(losses.z_loss, x, torch.float32, 2e-5, 2e-5, None, target=y)


# ---------------------------------------------------------------------------------------------
# dispatch, reporting, compile
# ---------------------------------------------------------------------------------------------


def test_dispatch_rule():
    x = torch.randn(3, 4, device=DEV)
    assert kernels.use_triton(x) == CUDA  # CPU tensors only inside interpret()
    with on_kernel():
        assert kernels.use_triton(x)
        assert not kernels.use_triton(x.double())  # float64 keeps the exact PyTorch path
        assert not kernels.use_triton(x.to(torch.int64))


def test_losses_triton_0_forces_the_pytorch_path(monkeypatch):
    calls = []
    real = triton_rows.softmax_reduced
    monkeypatch.setattr(triton_rows, "softmax_reduced", lambda *a, **k: calls.append(1) or real(*a, **k))
    x, y = torch.randn(3, 9, device=DEV), torch.tensor([1, 2, 3], device=DEV)
    with on_kernel():
        losses.cross_entropy_loss(x, y)
        assert calls == [1]
        monkeypatch.setenv("LOSSES_TRITON", "0")
        assert not kernels.use_triton(x)
        losses.cross_entropy_loss(x, y)
        assert calls == [1]
    assert all(not used and "LOSSES_TRITON=0" in why for used, why in kernels.report().values())


def test_native_kernels_reports_the_triton_kernels():
    report = losses.native_kernels()
    for name in ("softmax_rows", "z_loss_rows"):  # the C kernels are reported beside them
        used, detail = report[name]
        assert used == CUDA
        assert "triton" in detail


def test_interpret_needs_the_interpreter_mode():
    code = ("import os; os.environ.pop('TRITON_INTERPRET', None)\n"
            "import losses, losses.kernels as k\n"
            "try:\n    k.interpret().__enter__()\nexcept RuntimeError as e:\n    print('refused:', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "refused:" in out.stdout and "TRITON_INTERPRET=1" in out.stdout, out.stderr[-2000:]


def test_compiled_step_goes_through_the_custom_operators():
    """torch.compile traces the loss into one graph: the kernels are custom operators with fake
    implementations (aot_eager: the same graph inductor would get, without a C++ build)."""
    torch._dynamo.reset()
    x = _logits(4, 24, torch.float32, seed=16).float().to(DEV)
    y = _target(4, 24, seed=17, ignored=(2,)).to(DEV)

    def step(x, y):
        loss, pen = losses.cross_entropy_with_logz_penalty(x, y, coef=1e-2, return_penalty=True)
        return (loss + losses.z_loss(x, y) + losses.cross_entropy_loss(x, y, label_smoothing=0.1)
                + losses.focal_loss(x, y) + losses.gumbel_bce_loss(x, y) + losses.cross_entropy_loss(x, y, reduction="none").sum()
                + losses.sparsemax_loss(x, y) + losses.entmax15_loss(x, y, reduction="sum"))

    xk = x.clone().requires_grad_(True)
    xe = x.clone().requires_grad_(True)
    with on_kernel(), losses.validation(False):
        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
        out = compiled(xk, y)
        out.backward()
        ref = step(xe, y)
        ref.backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(xk.grad, xe.grad)
