"""Triton row kernels for the softmax cross-entropy family and the Z-loss (GPU; CPU through
Triton's interpreter for tests).

One program handles one row of the ``(M, C)`` logits (any row stride, unit column stride) and walks
it in blocks of ``BLOCK`` columns, in float32 registers whatever the input dtype:

**Softmax rows** (:func:`softmax_rows`), for class ids ``y`` and per row::

    x_k   = cap * tanh(o_k / cap) (when soft-capping; -inf stays -inf) + shift_k (when shifting)
    lse   = log sum_k exp(x_k)                      (online: a running max and a rescaled sum)
    loss  = (1 - eps) w_y (lse - x_y) + eps (lse W - sum_fin w_k x_k) / n
            (W = sum of w_k over the n finite classes of the row; eps = label smoothing)

and 0 (and ``lse = 0``) for a row whose id is ``ignore_index``. The forward reads the row once and
writes two numbers per row (the loss and ``lse``; with smoothing also ``W / n`` and ``1 / n``). The backward reads
the row once more and writes the gradient once, in the input's dtype::

    dL/do_k = [ g (p_k ((1 - eps) w_y + eps W / n) - (1 - eps) w_y [k = y] - eps w_k [x_k finite] / n)
                + g_lse p_k ] * dx_k/do_k,        p_k = exp(x_k - lse)

with ``g`` the incoming gradient of the row's loss and ``g_lse`` that of its ``lse`` (the log-Z
penalty ``coef * lse^2`` is added outside, from ``lse``). Ignored rows get exact zeros. Optionally
the gradient is written over the logits themselves (no second ``(M, C)`` buffer).

**Z-loss rows** (:func:`z_loss_rows`): the row's mean and centred variance in one read (block means
and sums of squared deviations, merged across blocks with Chan's formula), then
``z = (o_y - mu) / sqrt(v + eps)``, ``loss = softplus(a (b - z)) / a``; the backward writes
``g s [z (o_k - mu) / (C sigma^2) + 1 / (C sigma) - [k = y] / sigma]`` with ``s = sigmoid(a (b - z))``.

``tanh`` is computed from one ``exp`` (``1 - 2 / (exp(2u) + 1)``): its absolute error is about one
float32 spacing of 1, so a capped logit is off by at most ``cap * 1.2e-7``.

Under ``torch.compile`` the launches go through custom operators (``losses::softmax_rows_fwd`` and
friends, with shape-only fake implementations), so a compiled model does not break its graph here.
"""

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

import triton
import triton.language as tl


__all__ = ["softmax_rows", "z_loss_rows"]


# --------------------------------------------------------------------------------------
# kernels (plain functions; jitted or interpreted on first use)
# --------------------------------------------------------------------------------------


def _softmax_fwd(X, stride_x, Y, W, SHIFT, LOSS, LSE, AUX, C, ignore_index, cap, eps,
                 HAS_W: tl.constexpr, HAS_SHIFT: tl.constexpr, HAS_CAP: tl.constexpr, SMOOTH: tl.constexpr,
                 BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(Y + row).to(tl.int64)
    if y == ignore_index:
        tl.store(LOSS + row, 0.0)
        tl.store(LSE + row, 0.0)
        if SMOOTH:
            tl.store(AUX + row * 2, 0.0)
            tl.store(AUX + row * 2 + 1, 0.0)
        return
    y = tl.minimum(tl.maximum(y, 0), C - 1)  # an id out of range (data checks off) reads inside the row
    x_row = X + row * stride_x
    m = -float("inf")
    s = 0.0
    wx = 0.0
    wsum = 0.0
    nfin = 0.0
    for start in range(0, C, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < C
        x = tl.load(x_row + cols, mask=inside, other=-float("inf")).to(tl.float32)
        if HAS_CAP:
            t = 1.0 - 2.0 / (tl.exp(2.0 * x / cap) + 1.0)
            x = tl.where(x == -float("inf"), x, cap * t)
        if HAS_SHIFT:
            x = x + tl.load(SHIFT + cols, mask=inside, other=0.0).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), 0)
        m = m_new
        if SMOOTH:
            fin = x > -float("inf")
            if HAS_W:
                w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
            else:
                w = tl.where(inside, 1.0, 0.0)
            wx += tl.sum(w * tl.where(fin, x, 0.0), 0)
            wsum += tl.sum(tl.where(fin, w, 0.0), 0)
            nfin += tl.sum(tl.where(fin, 1.0, 0.0), 0)
    lse = tl.where(m == -float("inf"), 0.0, m) + tl.log(s)
    xy = tl.load(x_row + y).to(tl.float32)
    if HAS_CAP:
        ty = 1.0 - 2.0 / (tl.exp(2.0 * xy / cap) + 1.0)
        xy = tl.where(xy == -float("inf"), xy, cap * ty)
    if HAS_SHIFT:
        xy = xy + tl.load(SHIFT + y).to(tl.float32)
    if HAS_W:
        wy = tl.load(W + y).to(tl.float32)
    else:
        wy = 1.0
    loss = wy * (lse - xy)
    if SMOOTH:
        n = tl.maximum(nfin, 1.0)
        loss = (1.0 - eps) * loss + eps * (lse * wsum - wx) / n
        tl.store(AUX + row * 2, wsum / n)
        tl.store(AUX + row * 2 + 1, 1.0 / n)
    tl.store(LOSS + row, loss)
    tl.store(LSE + row, lse)


def _softmax_bwd(X, stride_x, Y, W, SHIFT, LSE, AUX, G, stride_g, GL, stride_gl, OUT, stride_o, C, ignore_index,
                 cap, eps, HAS_W: tl.constexpr, HAS_SHIFT: tl.constexpr, HAS_CAP: tl.constexpr,
                 SMOOTH: tl.constexpr, HAS_G: tl.constexpr, HAS_GL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(Y + row).to(tl.int64)
    x_row = X + row * stride_x
    o_row = OUT + row * stride_o
    if y == ignore_index:
        for start in range(0, C, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            tl.store(o_row + cols, tl.zeros([BLOCK], dtype=tl.float32).to(OUT.dtype.element_ty), mask=cols < C)
        return
    y = tl.minimum(tl.maximum(y, 0), C - 1)
    lse = tl.load(LSE + row)
    if HAS_G:
        g = tl.load(G + row * stride_g).to(tl.float32)
    else:
        g = 0.0
    if HAS_GL:
        gl = tl.load(GL + row * stride_gl).to(tl.float32)
    else:
        gl = 0.0
    if HAS_W:
        wy = tl.load(W + y).to(tl.float32)
    else:
        wy = 1.0
    at_target = g * wy
    a = g * wy
    if SMOOTH:
        at_target = g * (1.0 - eps) * wy
        a = g * ((1.0 - eps) * wy + eps * tl.load(AUX + row * 2))
        nfin_inv = g * eps * tl.load(AUX + row * 2 + 1)  # g eps / n
    a = a + gl
    for start in range(0, C, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < C
        raw = tl.load(x_row + cols, mask=inside, other=-float("inf")).to(tl.float32)
        x = raw
        if HAS_CAP:
            t = 1.0 - 2.0 / (tl.exp(2.0 * raw / cap) + 1.0)
            x = tl.where(raw == -float("inf"), raw, cap * t)
        if HAS_SHIFT:
            x = x + tl.load(SHIFT + cols, mask=inside, other=0.0).to(tl.float32)
        p = tl.exp(x - lse)
        grad = a * p - tl.where(cols == y, at_target, 0.0)
        if SMOOTH:
            if HAS_W:
                w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
            else:
                w = 1.0
            grad = grad - tl.where(x > -float("inf"), nfin_inv * w, 0.0)
        if HAS_CAP:
            grad = grad * (1.0 - t * t)
        grad = tl.where(raw == -float("inf"), 0.0, grad)
        tl.store(o_row + cols, grad.to(OUT.dtype.element_ty), mask=inside)


def _zloss_fwd(X, stride_x, Y, LOSS, STATS, C, ignore_index, a, b, eps, BLOCK: tl.constexpr):
    # STATS (M, 4): mu, 1/sigma, z, sigmoid(a (b - z))
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(Y + row).to(tl.int64)
    if y == ignore_index:
        tl.store(LOSS + row, 0.0)
        return
    y = tl.minimum(tl.maximum(y, 0), C - 1)
    x_row = X + row * stride_x
    n_a = 0.0
    mean_a = 0.0
    m2_a = 0.0
    for start in range(0, C, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < C
        x = tl.load(x_row + cols, mask=inside, other=0.0).to(tl.float32)
        cnt = tl.minimum(C - start, BLOCK).to(tl.float32)
        mb = tl.sum(x, 0) / cnt
        d = tl.where(inside, x - mb, 0.0)
        m2b = tl.sum(d * d, 0)
        n = n_a + cnt
        delta = mb - mean_a
        mean_a = mean_a + delta * (cnt / n)
        m2_a = m2_a + m2b + delta * delta * (n_a * cnt / n)
        n_a = n
    var = m2_a / C
    inv_sigma = 1.0 / tl.sqrt(var + eps)
    xy = tl.load(x_row + y).to(tl.float32)
    z = (xy - mean_a) * inv_sigma
    t = a * (b - z)
    e = tl.exp(-tl.abs(t))
    log1p_e = tl.where(e < 1e-4, e * (1.0 - e * (0.5 - e / 3.0)), tl.log(1.0 + e))
    loss = (tl.maximum(t, 0.0) + log1p_e) / a
    sig = tl.where(t >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    tl.store(LOSS + row, loss)
    tl.store(STATS + row * 4 + 0, mean_a)
    tl.store(STATS + row * 4 + 1, inv_sigma)
    tl.store(STATS + row * 4 + 2, z)
    tl.store(STATS + row * 4 + 3, sig)


def _zloss_bwd(X, stride_x, Y, STATS, G, stride_g, OUT, stride_o, C, ignore_index, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(Y + row).to(tl.int64)
    o_row = OUT + row * stride_o
    if y == ignore_index:
        for start in range(0, C, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            tl.store(o_row + cols, tl.zeros([BLOCK], dtype=tl.float32).to(OUT.dtype.element_ty), mask=cols < C)
        return
    y = tl.minimum(tl.maximum(y, 0), C - 1)
    x_row = X + row * stride_x
    mu = tl.load(STATS + row * 4 + 0)
    inv_sigma = tl.load(STATS + row * 4 + 1)
    z = tl.load(STATS + row * 4 + 2)
    gs = tl.load(G + row * stride_g).to(tl.float32) * tl.load(STATS + row * 4 + 3)
    coef = gs * z * inv_sigma * inv_sigma / C
    offset = gs * inv_sigma / C
    at_target = gs * inv_sigma
    for start in range(0, C, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < C
        x = tl.load(x_row + cols, mask=inside, other=0.0).to(tl.float32)
        grad = coef * (x - mu) + offset - tl.where(cols == y, at_target, 0.0)
        tl.store(o_row + cols, grad.to(OUT.dtype.element_ty), mask=inside)


_RAW = {"softmax_fwd": _softmax_fwd, "softmax_bwd": _softmax_bwd, "zloss_fwd": _zloss_fwd, "zloss_bwd": _zloss_bwd}
_JIT: dict = {}


def _kernel(name: str):
    """The kernel ``name``, jitted on first use (an interpreted function where Triton runs in
    interpreter mode)."""
    if name not in _JIT:
        _JIT[name] = triton.jit(_RAW[name])
    return _JIT[name]


def _config(c: int, itemsize: int) -> Tuple[int, int]:
    """``(BLOCK, num_warps)`` for rows of ``c`` columns of ``itemsize``-byte elements."""
    block = min(triton.next_power_of_2(max(c, 1)), 16384 if itemsize <= 2 else 8192)
    block = max(block, 16)
    warps = 4 if block <= 2048 else (8 if block <= 4096 else 16)
    return block, warps


#: set by benchmarks to try other block sizes: ``(BLOCK, num_warps)`` or None (the heuristic)
override_config: Optional[Tuple[int, int]] = None


def _launch(name: str, x: Tensor, grid_rows: int, *args, **meta) -> None:
    if grid_rows == 0:
        return
    block, warps = override_config or _config(x.shape[1], x.element_size())
    on_cpu = x.device.type == "cpu"
    kern = _kernel(name)
    if on_cpu:
        kern[(grid_rows,)](*args, BLOCK=block, **meta)
    else:
        with torch.cuda.device(x.device):
            kern[(grid_rows,)](*args, BLOCK=block, num_warps=warps, **meta)


def _rows2d(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _null(x: Tensor) -> Tensor:
    return torch.empty(1, dtype=torch.float32, device=x.device)


# --------------------------------------------------------------------------------------
# launchers
# --------------------------------------------------------------------------------------


def _softmax_fwd_impl(x: Tensor, y: Tensor, w: Optional[Tensor], shift: Optional[Tensor], cap: float,
                      eps: float, ignore_index: int) -> Tuple[Tensor, Tensor, Tensor]:
    m, c = x.shape
    loss = torch.empty(m, dtype=torch.float32, device=x.device)
    lse = torch.empty(m, dtype=torch.float32, device=x.device)
    aux = torch.empty((m if eps > 0 else 0, 2), dtype=torch.float32, device=x.device)
    _launch("softmax_fwd", x, m, x, x.stride(0), y, w if w is not None else _null(x),
            shift if shift is not None else _null(x), loss, lse, aux if eps > 0 else _null(x), c, ignore_index,
            float(cap), float(eps), HAS_W=w is not None, HAS_SHIFT=shift is not None, HAS_CAP=cap > 0,
            SMOOTH=eps > 0)
    return loss, lse, aux


def _softmax_bwd_impl(x: Tensor, y: Tensor, w: Optional[Tensor], shift: Optional[Tensor], lse: Tensor, aux: Tensor,
                      g: Optional[Tensor], gl: Optional[Tensor], cap: float, eps: float, ignore_index: int,
                      out: Tensor) -> None:
    m, c = x.shape
    _launch("softmax_bwd", x, m, x, x.stride(0), y, w if w is not None else _null(x),
            shift if shift is not None else _null(x), lse, aux if eps > 0 else _null(x),
            g if g is not None else _null(x), 0 if g is None else g.stride(0),
            gl if gl is not None else _null(x), 0 if gl is None else gl.stride(0), out, out.stride(0), c,
            ignore_index, float(cap), float(eps), HAS_W=w is not None, HAS_SHIFT=shift is not None,
            HAS_CAP=cap > 0, SMOOTH=eps > 0, HAS_G=g is not None, HAS_GL=gl is not None)


def _zloss_fwd_impl(x: Tensor, y: Tensor, a: float, b: float, eps: float, ignore_index: int) -> Tuple[Tensor, Tensor]:
    m, c = x.shape
    loss = torch.empty(m, dtype=torch.float32, device=x.device)
    stats = torch.zeros(m, 4, dtype=torch.float32, device=x.device)
    _launch("zloss_fwd", x, m, x, x.stride(0), y, loss, stats, c, ignore_index, float(a), float(b), float(eps))
    return loss, stats


def _zloss_bwd_impl(x: Tensor, y: Tensor, stats: Tensor, g: Tensor, ignore_index: int, out: Tensor) -> None:
    m, c = x.shape
    _launch("zloss_bwd", x, m, x, x.stride(0), y, stats, g, g.stride(0), out, out.stride(0), c, ignore_index)


# --------------------------------------------------------------------------------------
# custom operators (what torch.compile sees)
# --------------------------------------------------------------------------------------

_OPS: dict = {}


def _ops() -> dict:
    """The custom operators, registered on first use (``torch.library.custom_op``, torch >= 2.4)."""
    if _OPS:
        return _OPS
    lib = torch.library

    @lib.custom_op("losses::softmax_rows_fwd", mutates_args=())
    def softmax_rows_fwd(x: Tensor, y: Tensor, w: Optional[Tensor], shift: Optional[Tensor], cap: float, eps: float,
                         ignore_index: int) -> Tuple[Tensor, Tensor, Tensor]:
        return _softmax_fwd_impl(x, y, w, shift, cap, eps, ignore_index)

    @softmax_rows_fwd.register_fake
    def _(x, y, w, shift, cap, eps, ignore_index):
        m = x.shape[0]
        f = dict(dtype=torch.float32, device=x.device)
        return x.new_empty(m, **f), x.new_empty(m, **f), x.new_empty((m if eps > 0 else 0, 2), **f)

    @lib.custom_op("losses::softmax_rows_bwd", mutates_args=())
    def softmax_rows_bwd(x: Tensor, y: Tensor, w: Optional[Tensor], shift: Optional[Tensor], lse: Tensor,
                         aux: Tensor, g: Optional[Tensor], gl: Optional[Tensor], cap: float, eps: float,
                         ignore_index: int) -> Tensor:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _softmax_bwd_impl(x, y, w, shift, lse, aux, g, gl, cap, eps, ignore_index, out)
        return out

    @softmax_rows_bwd.register_fake
    def _(x, y, w, shift, lse, aux, g, gl, cap, eps, ignore_index):
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)

    @lib.custom_op("losses::z_loss_rows_fwd", mutates_args=())
    def z_loss_rows_fwd(x: Tensor, y: Tensor, a: float, b: float, eps: float, ignore_index: int) -> Tuple[Tensor, Tensor]:
        return _zloss_fwd_impl(x, y, a, b, eps, ignore_index)

    @z_loss_rows_fwd.register_fake
    def _(x, y, a, b, eps, ignore_index):
        m = x.shape[0]
        return (torch.empty(m, dtype=torch.float32, device=x.device),
                torch.empty(m, 4, dtype=torch.float32, device=x.device))

    @lib.custom_op("losses::z_loss_rows_bwd", mutates_args=())
    def z_loss_rows_bwd(x: Tensor, y: Tensor, stats: Tensor, g: Tensor, ignore_index: int) -> Tensor:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _zloss_bwd_impl(x, y, stats, g, ignore_index, out)
        return out

    @z_loss_rows_bwd.register_fake
    def _(x, y, stats, g, ignore_index):
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)

    _OPS.update(softmax_fwd=softmax_rows_fwd, softmax_bwd=softmax_rows_bwd, zloss_fwd=z_loss_rows_fwd,
                zloss_bwd=z_loss_rows_bwd)
    return _OPS


_ops()


def _compiling() -> bool:
    try:
        return torch.compiler.is_compiling()
    except AttributeError:  # pragma: no cover
        return False


# --------------------------------------------------------------------------------------
# autograd
# --------------------------------------------------------------------------------------


class _SoftmaxRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, w, shift, cap, eps, ignore_index, inplace):
        if _compiling():
            loss, lse, aux = _ops()["softmax_fwd"](x, y, w, shift, cap, eps, ignore_index)
        else:
            loss, lse, aux = _softmax_fwd_impl(x, y, w, shift, cap, eps, ignore_index)
        ctx.save_for_backward(x, y, w, shift, lse, aux)
        ctx.opts = (cap, eps, ignore_index, inplace and not _compiling())
        return loss, lse

    @staticmethod
    def backward(ctx, g, gl):
        x, y, w, shift, lse, aux = ctx.saved_tensors
        cap, eps, ignore_index, inplace = ctx.opts
        if _compiling() or not inplace:
            if _compiling():
                grad = _ops()["softmax_bwd"](x, y, w, shift, lse, aux, g, gl, cap, eps, ignore_index)
            else:
                grad = torch.empty(x.shape, dtype=x.dtype, device=x.device)
                _softmax_bwd_impl(x, y, w, shift, lse, aux, g, gl, cap, eps, ignore_index, grad)
        else:
            _softmax_bwd_impl(x, y, w, shift, lse, aux, g, gl, cap, eps, ignore_index, x)
            grad = x
        return grad, None, None, None, None, None, None, None


class _ZLossRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, a, b, eps, ignore_index):
        if _compiling():
            loss, stats = _ops()["zloss_fwd"](x, y, a, b, eps, ignore_index)
        else:
            loss, stats = _zloss_fwd_impl(x, y, a, b, eps, ignore_index)
        ctx.save_for_backward(x, y, stats)
        ctx.ignore_index = ignore_index
        return loss

    @staticmethod
    def backward(ctx, g):
        x, y, stats = ctx.saved_tensors
        if _compiling():
            grad = _ops()["zloss_bwd"](x, y, stats, g, ctx.ignore_index)
        else:
            grad = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            _zloss_bwd_impl(x, y, stats, g, ctx.ignore_index, grad)
        return grad, None, None, None, None, None


def softmax_rows(x: Tensor, y: Tensor, *, weight: Optional[Tensor] = None, shift: Optional[Tensor] = None,
                 softcap: Optional[float] = None, label_smoothing: float = 0.0, ignore_index: int = -100,
                 inplace: bool = False) -> Tuple[Tensor, Tensor]:
    """Per-row ``(loss, lse)`` (float32, ``(M,)``) of the logits ``x (M, C)`` against the ids ``y (M,)``;
    the maths is the module docstring's. ``weight``, ``shift``: ``(C,)``; ``inplace``: the backward
    writes the gradient over ``x``'s storage (``x`` must not be needed after the backward)."""
    x = _rows2d(x)
    y = y.contiguous()
    w = None if weight is None else weight.to(device=x.device, dtype=torch.float32).contiguous()
    sh = None if shift is None else shift.to(device=x.device, dtype=torch.float32).contiguous()
    return _SoftmaxRows.apply(x, y, w, sh, float(softcap or 0.0), float(label_smoothing), int(ignore_index),
                              bool(inplace))


def z_loss_rows(x: Tensor, y: Tensor, *, a: float, b: float, eps: float, ignore_index: int = -100) -> Tensor:
    """Per-row Z-loss (float32, ``(M,)``) of ``x (M, C)`` against the ids ``y (M,)``, 0 where
    ``y == ignore_index``; the maths is the module docstring's."""
    return _ZLossRows.apply(_rows2d(x), y.contiguous(), float(a), float(b), float(eps), int(ignore_index))
