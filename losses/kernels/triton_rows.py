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

from typing import Optional, Tuple

import torch
from torch import Tensor

import triton
import triton.language as tl


__all__ = ["softmax_rows", "softmax_reduced", "z_loss_rows", "binary_reduced", "fenchel_young_rows"]


# --------------------------------------------------------------------------------------
# kernels (plain functions; jitted or interpreted on first use)
# --------------------------------------------------------------------------------------


@triton.jit
def _zero_row(o_row, C, BLOCK: tl.constexpr):
    # an ignored row's gradient: exact zeros, in blocks
    for start in range(0, C, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        tl.store(o_row + cols, tl.zeros([BLOCK], dtype=tl.float32).to(o_row.dtype.element_ty), mask=cols < C)


@triton.jit
def _tanh(u):
    # tanh from one exp: 1 - 2 / (exp(2u) + 1) (about one float32 spacing of 1 absolute error)
    return 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)


@triton.jit
def _log1p(z):
    # log(1 + z) for z > -1 to a few float32 ulps: log(w) z / (w - 1) with w = 1 + z rounded
    # (Goldberg's correction), z itself where w rounds to 1
    w = 1.0 + z
    return tl.where(w == 1.0, z, tl.log(w) * (z / (w - 1.0)))


@triton.jit
def _expm1(v):
    # exp(v) - 1: a degree-9 Taylor polynomial for |v| < 0.5 (error < 3e-10), exp(v) - 1 beyond
    p = v * (1.0 + v * (0.5 + v * (1.0 / 6.0 + v * (1.0 / 24.0 + v * (1.0 / 120.0 + v * (
        1.0 / 720.0 + v * (1.0 / 5040.0 + v * (1.0 / 40320.0 + v * (1.0 / 362880.0)))))))))
    return tl.where(tl.abs(v) < 0.5, p, tl.exp(v) - 1.0)


def _softmax_fwd(X, stride_x, Y, W, SHIFT, LOSS, LSE, AUX, C, ignore_index, cap, eps, hyper,
                 HAS_W: tl.constexpr, HAS_SHIFT: tl.constexpr, HAS_CAP: tl.constexpr, SMOOTH: tl.constexpr,
                 MODE: tl.constexpr, VEC: tl.constexpr, BLOCK: tl.constexpr):
    # AUX (M, 3): the non-target probability mass, then W / n and 1 / n (smoothing) or the row's
    # gradient factor f'(ce) (MODE 1 comp-sum, 2 focal)
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(Y + row).to(tl.int64)
    if y == ignore_index:
        tl.store(LOSS + row, 0.0)
        tl.store(LSE + row, 0.0)
        tl.store(AUX + row * 3, 0.0)
        tl.store(AUX + row * 3 + 1, 0.0)
        tl.store(AUX + row * 3 + 2, 0.0)
        return
    y = tl.minimum(tl.maximum(y, 0), C - 1)  # an id out of range (data checks off) reads inside the row
    x_row = X + row * stride_x
    xy = tl.load(x_row + y).to(tl.float32)
    if HAS_CAP:
        ty = _tanh(xy / cap)
        xy = tl.where(xy == -float("inf"), xy, cap * ty)
    if HAS_SHIFT:
        xy = xy + tl.load(SHIFT + y).to(tl.float32)
    m = -float("inf")
    s = 0.0
    so = 0.0  # the same sum without the target: ce and the target's gradient without cancellation
    s_v = tl.zeros([BLOCK], dtype=tl.float32)
    so_v = tl.zeros([BLOCK], dtype=tl.float32)
    wx = 0.0
    wsum = 0.0
    nfin = 0.0
    for start in range(0, C, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < C
        x = tl.load(x_row + cols, mask=inside, other=-float("inf")).to(tl.float32)
        if HAS_CAP:
            t = _tanh(x / cap)
            x = tl.where(x == -float("inf"), x, cap * t)
        if HAS_SHIFT:
            x = x + tl.load(SHIFT + cols, mask=inside, other=0.0).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        r = tl.exp(m - m_safe)
        e = tl.exp(x - m_safe)
        if VEC:  # per-lane sums, rescaled by the block's scalar factor: one reduction per block
            s_v = s_v * r + e
            so_v = so_v * r + tl.where(cols == y, 0.0, e)
        else:
            s = s * r + tl.sum(e, 0)
            so = so * r + tl.sum(tl.where(cols == y, 0.0, e), 0)
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
    if VEC:
        s = tl.sum(s_v, 0)
        so = tl.sum(so_v, 0)
    m0 = tl.where(m == -float("inf"), 0.0, m)
    lse = m0 + tl.log(s)
    # ce = -log p_y = log(1 + u), u = exp(log so + m - x_y): exact as p_y -> 1 (u tiny)
    lu = tl.log(so) + (m0 - xy)
    eu = tl.exp(-tl.abs(lu))
    ce = tl.maximum(lu, 0.0) + _log1p(eu)
    if HAS_W:
        wy = tl.load(W + y).to(tl.float32)
    else:
        wy = 1.0
    loss = wy * ce
    if SMOOTH:
        n = tl.maximum(nfin, 1.0)
        loss = (1.0 - eps) * loss + eps * (lse * wsum - wx) / n
        tl.store(AUX + row * 3 + 1, wsum / n)
        tl.store(AUX + row * 3 + 2, 1.0 / n)
    if MODE == 1:  # comp-sum, hyper = 1 - tau: f = expm1(v) / (1 - tau), f' = exp(v), v = (1 - tau) ce
        v = hyper * ce
        ev = tl.exp(v)
        loss = wy * (_expm1(v) / hyper)
        tl.store(AUX + row * 3 + 1, ev)
    if MODE == 2:  # focal, hyper = gamma > 0: f = u^gamma ce, u = 1 - p_y = -expm1(-ce)
        pe = tl.exp(-ce)
        u = -_expm1(-ce)
        lnu = tl.log(u)
        ug = tl.where(u > 0.0, tl.exp(hyper * lnu), 0.0)
        d = tl.where(u > 0.0, hyper * tl.exp((hyper - 1.0) * lnu) * pe * ce, 0.0)
        loss = wy * (ug * ce)
        tl.store(AUX + row * 3 + 1, tl.where(ce == float("inf"), 1.0, d + ug))
    tl.store(AUX + row * 3, so / s)
    tl.store(LOSS + row, loss)
    tl.store(LSE + row, lse)


def _softmax_bwd(X, stride_x, Y, W, SHIFT, LSE, AUX, G, stride_g, GL, stride_gl, SCALE, OUT, stride_o, C,
                 ignore_index, cap, eps, coef, HAS_W: tl.constexpr, HAS_SHIFT: tl.constexpr, HAS_CAP: tl.constexpr,
                 SMOOTH: tl.constexpr, HAS_G: tl.constexpr, HAS_GL: tl.constexpr, REDUCED: tl.constexpr,
                 MODE: tl.constexpr, BLOCK: tl.constexpr):
    # REDUCED: G and GL are the incoming gradients of the reduced loss and penalty (scalars), SCALE
    # the reduction's 1 / denominator; the row's lse gradient is then 2 coef lse (g + g_pen) scale.
    # Otherwise G and GL are per-row gradients of the row losses and of the row lse.
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(Y + row).to(tl.int64)
    x_row = X + row * stride_x
    o_row = OUT + row * stride_o
    if y == ignore_index:
        _zero_row(o_row, C, BLOCK)
        return
    y = tl.minimum(tl.maximum(y, 0), C - 1)
    lse = tl.load(LSE + row)
    po = tl.load(AUX + row * 3)
    if HAS_G:
        g = tl.load(G + row * stride_g).to(tl.float32)
    else:
        g = 0.0
    if HAS_GL:
        gl = tl.load(GL + row * stride_gl).to(tl.float32)
    else:
        gl = 0.0
    if REDUCED:
        sc = tl.load(SCALE)
        g = g * sc
        gl = 2.0 * coef * lse * (g + gl * sc)
    if MODE != 0:
        g = g * tl.load(AUX + row * 3 + 1)
    if HAS_W:
        wy = tl.load(W + y).to(tl.float32)
    else:
        wy = 1.0
    # dL/dx_k = at_target (p_k - [k = y]) + extra p_k (- the smoothing's eps w_k / n term)
    at_target = g * wy
    extra = gl
    if SMOOTH:
        at_target = g * (1.0 - eps) * wy
        extra = extra + g * eps * tl.load(AUX + row * 3 + 1)
        nfin_inv = g * eps * tl.load(AUX + row * 3 + 2)  # g eps / n
    a = at_target + extra
    for start in range(0, C, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < C
        raw = tl.load(x_row + cols, mask=inside, other=-float("inf")).to(tl.float32)
        x = raw
        if HAS_CAP:
            t = _tanh(raw / cap)
            x = tl.where(raw == -float("inf"), raw, cap * t)
        if HAS_SHIFT:
            x = x + tl.load(SHIFT + cols, mask=inside, other=0.0).to(tl.float32)
        p = tl.exp(x - lse)
        is_y = cols == y
        # at the target, p_y - 1 is written as -(the non-target mass): no cancellation
        grad = tl.where(is_y, extra * p - at_target * po, a * p)
        if SMOOTH:
            if HAS_W:
                w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
            else:
                w = 1.0
            grad = grad - tl.where(x > -float("inf"), nfin_inv * w, 0.0)
        if HAS_CAP:
            grad = grad * tl.where(raw == -float("inf"), 1.0, 1.0 - t * t)
        grad = tl.where((raw == -float("inf")) & (cols != y), 0.0, grad)  # masked classes: exactly 0
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
    loss = (tl.maximum(t, 0.0) + _log1p(e)) / a
    sig = tl.where(t >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    tl.store(LOSS + row, loss)
    tl.store(STATS + row * 4 + 0, mean_a)
    tl.store(STATS + row * 4 + 1, inv_sigma)
    tl.store(STATS + row * 4 + 2, z)
    tl.store(STATS + row * 4 + 3, sig)


def _zloss_bwd(X, stride_x, Y, STATS, G, stride_g, SCALE, OUT, stride_o, C, ignore_index, REDUCED: tl.constexpr,
               BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(Y + row).to(tl.int64)
    o_row = OUT + row * stride_o
    if y == ignore_index:
        _zero_row(o_row, C, BLOCK)
        return
    y = tl.minimum(tl.maximum(y, 0), C - 1)
    x_row = X + row * stride_x
    mu = tl.load(STATS + row * 4 + 0)
    inv_sigma = tl.load(STATS + row * 4 + 1)
    z = tl.load(STATS + row * 4 + 2)
    gs = tl.load(G + row * stride_g).to(tl.float32) * tl.load(STATS + row * 4 + 3)
    if REDUCED:
        gs = gs * tl.load(SCALE)
    coef = gs * z * inv_sigma * inv_sigma / C
    offset = gs * inv_sigma / C
    at_target = gs * inv_sigma
    for start in range(0, C, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < C
        x = tl.load(x_row + cols, mask=inside, other=0.0).to(tl.float32)
        grad = coef * (x - mu) + offset - tl.where(cols == y, at_target, 0.0)
        tl.store(o_row + cols, grad.to(OUT.dtype.element_ty), mask=inside)


def _binary_fwd(X, stride_x, Y, W, LOSS, C, ignore_index, eps, KIND: tl.constexpr, HAS_W: tl.constexpr,
                BLOCK: tl.constexpr):
    # one row of C independent binary losses against the one-hot labels of id y, smoothed:
    # lab_k = (1 - eps) [k = y] + eps / C; KIND 0: BCE softplus(x) - lab x; KIND 1: GOL
    # lab u - (1 - lab) log(1 - exp(-u)), u = exp(-max(x, -50)). LOSS[row] = sum_k w_k l_k.
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(Y + row).to(tl.int64)
    if y == ignore_index:
        tl.store(LOSS + row, 0.0)
        return
    x_row = X + row * stride_x
    off = eps / C
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, C, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < C
        x = tl.load(x_row + cols, mask=inside, other=0.0).to(tl.float32)
        lab = tl.where(cols == y, 1.0 - eps + off, off)
        if KIND == 0:
            z = tl.exp(-tl.abs(x))
            l = _log1p(z) + tl.where(x > 0, (1.0 - lab) * x, -lab * tl.where(x == -float("inf"), 0.0, x))
            l = tl.where(x == -float("inf"), tl.where(lab > 0, float("inf"), 0.0), l)
        else:
            u = tl.exp(-tl.maximum(x, -50.0))
            l = lab * u - (1.0 - lab) * tl.log(-_expm1(-u))
        if HAS_W:
            l = l * tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
        acc += tl.where(inside, l, 0.0)
    tl.store(LOSS + row, tl.sum(acc, 0))


def _binary_bwd(X, stride_x, Y, W, G, SCALE, OUT, stride_o, C, ignore_index, eps, KIND: tl.constexpr,
                HAS_W: tl.constexpr, BLOCK: tl.constexpr):
    # G: the reduced loss's incoming gradient (a scalar), SCALE the reduction's 1 / denominator
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(Y + row).to(tl.int64)
    o_row = OUT + row * stride_o
    if y == ignore_index:
        _zero_row(o_row, C, BLOCK)
        return
    x_row = X + row * stride_x
    g = tl.load(G).to(tl.float32) * tl.load(SCALE)
    off = eps / C
    for start in range(0, C, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < C
        x = tl.load(x_row + cols, mask=inside, other=0.0).to(tl.float32)
        lab = tl.where(cols == y, 1.0 - eps + off, off)
        if KIND == 0:
            z = tl.exp(-tl.abs(x))
            sig = tl.where(x >= 0, 1.0 / (1.0 + z), z / (1.0 + z))
            d = tl.where(x == -float("inf"), 0.0, sig - lab)
        else:
            u = tl.exp(-tl.maximum(x, -50.0))
            d = tl.where(x > -50.0, (1.0 - lab) * (u / _expm1(u)) - lab * u, 0.0)
        if HAS_W:
            d = d * tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(o_row + cols, (g * d).to(OUT.dtype.element_ty), mask=inside)


def _fy_fwd(X, stride_x, Y, LOSS, STATS, C, ignore_index, ENTMAX: tl.constexpr, ITERS: tl.constexpr,
            BLOCK: tl.constexpr):
    # the Fenchel-Young loss of sparsemax (ENTMAX False) or entmax-1.5 for class ids, one row in
    # registers (C <= BLOCK). Shifted scores z' = z - max; x = z' (sparsemax) or z'/2 (entmax-1.5);
    # the threshold tau in [-1, 0] solves sum [x - tau]_+^k = 1 (k = 1, 2): ITERS bisection steps
    # (to float32 resolution), then the closed form on {x > tau_lo}. STATS (M, 2): max, tau.
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(Y + row).to(tl.int64)
    if y == ignore_index:
        tl.store(LOSS + row, 0.0)
        tl.store(STATS + row * 2, 0.0)
        tl.store(STATS + row * 2 + 1, 0.0)
        return
    cols = tl.arange(0, BLOCK)
    z = tl.load(X + row * stride_x + cols, mask=cols < C, other=-float("inf")).to(tl.float32)
    m = tl.max(z, 0)
    m = tl.where(m == -float("inf"), 0.0, m)
    zs = z - m
    if ENTMAX:
        x = zs * 0.5
    else:
        x = zs
    lo = -1.0
    hi = 0.0
    for _ in range(ITERS):
        mid = 0.5 * (lo + hi)
        d = tl.maximum(x - mid, 0.0)
        if ENTMAX:
            f = tl.sum(d * d, 0)
        else:
            f = tl.sum(d, 0)
        above = f > 1.0
        lo = tl.where(above, mid, lo)
        hi = tl.where(above, hi, mid)
    sup = x > lo
    n = tl.maximum(tl.sum(tl.where(sup, 1.0, 0.0), 0), 1.0)
    s1 = tl.sum(tl.where(sup, x, 0.0), 0)
    if ENTMAX:
        mean = s1 / n
        dev = tl.where(sup, x - mean, 0.0)
        tau = mean - tl.sqrt(tl.maximum(1.0 - tl.sum(dev * dev, 0), 0.0) / n)
    else:
        tau = (s1 - 1.0) / n
    tau = tl.minimum(tl.maximum(tau, lo), hi)
    d = tl.maximum(x - tau, 0.0)
    zy = tl.sum(tl.where(cols == y, zs, 0.0), 0)
    if ENTMAX:
        p = d * d
        omega = 2.0 * (tau * tl.sum(p, 0) + 1.0) + (2.0 / 3.0) * (tl.sum(p * d, 0) - 1.0)
    else:
        omega = (tau * tl.sum(d, 0) + 1.0) + 0.5 * (tl.sum(d * d, 0) - 1.0)
    tl.store(LOSS + row, tl.maximum(omega - zy, 0.0))
    tl.store(STATS + row * 2, m)
    tl.store(STATS + row * 2 + 1, tau)


def _fy_bwd(X, stride_x, Y, STATS, G, stride_g, SCALE, OUT, stride_o, C, ignore_index, ENTMAX: tl.constexpr,
            REDUCED: tl.constexpr, BLOCK: tl.constexpr):
    # dL/dz = g (p* - e_y), p* from the saved max and threshold
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(Y + row).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < C
    o_row = OUT + row * stride_o
    if y == ignore_index:
        tl.store(o_row + cols, tl.zeros([BLOCK], dtype=tl.float32).to(OUT.dtype.element_ty), mask=inside)
        return
    g = tl.load(G + row * stride_g).to(tl.float32)
    if REDUCED:
        g = g * tl.load(SCALE)
    z = tl.load(X + row * stride_x + cols, mask=inside, other=-float("inf")).to(tl.float32)
    zs = z - tl.load(STATS + row * 2)
    tau = tl.load(STATS + row * 2 + 1)
    if ENTMAX:
        d = tl.maximum(zs * 0.5 - tau, 0.0)
        p = d * d
    else:
        p = tl.maximum(zs - tau, 0.0)
    grad = g * (p - tl.where(cols == y, 1.0, 0.0))
    tl.store(o_row + cols, grad.to(OUT.dtype.element_ty), mask=inside)


def _reduce(LOSS, LSE, Y, W, OUT, M, C, ignore_index, coef, units, MEAN: tl.constexpr, HAS_W: tl.constexpr,
            HAS_PEN: tl.constexpr, BLOCK: tl.constexpr):
    # one program: OUT = [(sum of row losses + coef sum lse^2) * scale, coef sum lse^2 * scale, scale]
    # with scale = 1 / (sum of the kept rows' unit weights) for a mean (1 when that sum is 0: an
    # all-ignored batch gives an exact 0), 1 for a sum
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    pen = tl.zeros([BLOCK], dtype=tl.float32)
    den = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, M, BLOCK):
        r = start + tl.arange(0, BLOCK)
        inside = r < M
        acc += tl.load(LOSS + r, mask=inside, other=0.0)
        if HAS_PEN:
            s = tl.load(LSE + r, mask=inside, other=0.0)  # 0 on ignored rows
            pen += s * s
        if MEAN:
            y = tl.load(Y + r, mask=inside, other=ignore_index).to(tl.int64)
            kept = inside & (y != ignore_index)
            if HAS_W:  # the unit weight w_y (softmax losses)
                den += tl.load(W + tl.minimum(tl.maximum(y, 0), C - 1), mask=kept, other=0.0)
            else:
                den += tl.where(kept, 1.0, 0.0)
    total = tl.sum(acc, 0)
    penalty = coef * tl.sum(pen, 0)
    scale = 1.0
    if MEAN:
        d = tl.sum(den, 0) * units  # units: C for the binary losses (the unit is the element)
        scale = tl.where(d > 0, 1.0 / d, 1.0)
    tl.store(OUT, (total + penalty) * scale)
    tl.store(OUT + 1, penalty * scale)
    tl.store(OUT + 2, scale)


_RAW = {"softmax_fwd": _softmax_fwd, "softmax_bwd": _softmax_bwd, "zloss_fwd": _zloss_fwd, "zloss_bwd": _zloss_bwd,
        "reduce": _reduce, "binary_fwd": _binary_fwd, "binary_bwd": _binary_bwd, "fy_fwd": _fy_fwd, "fy_bwd": _fy_bwd}
_JIT: dict = {}


def _kernel(name: str):
    """The kernel ``name``, jitted on first use (an interpreted function where Triton runs in
    interpreter mode)."""
    if name not in _JIT:
        _JIT[name] = triton.jit(_RAW[name])
    return _JIT[name]


def _config(c: int, itemsize: int) -> Tuple[int, int]:
    """``(BLOCK, num_warps)`` for rows of ``c`` columns of ``itemsize``-byte elements. Chosen from
    the configs group of ``benchmarks/perf_gpu.py`` on an H200 (cross-entropy forward + backward
    at (8192, 128256): bf16 best at 8192 / 8 warps, fp32 at 8192 / 16; at (256, 1e5) fp32 the
    choices were within 5% of each other)."""
    block = max(16, min(triton.next_power_of_2(max(c, 1)), 8192))
    if block <= 2048:
        warps = 4
    elif block <= 4096 or itemsize <= 2:
        warps = 8
    else:
        warps = 16
    return block, warps


#: set by benchmarks to try other block sizes: ``(BLOCK, num_warps)`` or None (the heuristic)
override_config: Optional[Tuple[int, int]] = None
#: the softmax forward keeps per-lane sums (one block reduction per block instead of three);
#: benchmarks/perf_gpu.py's configs group times both
vector_sums = False
_DUMMY: dict = {}


def _launch(name: str, x: Tensor, grid_rows: int, *args, block: Optional[int] = None, warps: int = 4,
            **meta) -> None:
    if grid_rows == 0 and name != "reduce":
        return
    if block is not None:
        blk = block
    else:
        blk, warps = override_config or _config(x.shape[1], x.element_size())
    kern = _kernel(name)
    if x.device.type == "cpu":  # Triton's interpreter (losses.kernels.interpret())
        kern[(max(grid_rows, 1),)](*args, BLOCK=blk, **meta)
    elif x.device.index == torch.cuda.current_device():
        kern[(max(grid_rows, 1),)](*args, BLOCK=blk, num_warps=warps, **meta)
    else:
        with torch.cuda.device(x.device):
            kern[(max(grid_rows, 1),)](*args, BLOCK=blk, num_warps=warps, **meta)


def _rows2d(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _null(x: Tensor) -> Tensor:
    """A one-element float32 tensor on ``x``'s device for the pointer of an absent operand (never read)."""
    t = _DUMMY.get(x.device)
    if t is None:
        t = _DUMMY[x.device] = torch.zeros(1, dtype=torch.float32, device=x.device)
    return t


def _opt(t: Optional[Tensor], x: Tensor) -> Tensor:
    return t if t is not None else _null(x)


# --------------------------------------------------------------------------------------
# launchers
# --------------------------------------------------------------------------------------


def _softmax_fwd_impl(x: Tensor, y: Tensor, w: Optional[Tensor], shift: Optional[Tensor], cap: float,
                      eps: float, ignore_index: int, mode: int, hyper: float) -> Tuple[Tensor, Tensor, Tensor]:
    m, c = x.shape
    loss = torch.empty(m, dtype=torch.float32, device=x.device)
    lse = torch.empty(m, dtype=torch.float32, device=x.device)
    aux = torch.empty((m, 3), dtype=torch.float32, device=x.device)
    _launch("softmax_fwd", x, m, x, x.stride(0), y, _opt(w, x), _opt(shift, x), loss, lse, aux, c, ignore_index,
            float(cap), float(eps), float(hyper), HAS_W=w is not None, HAS_SHIFT=shift is not None, HAS_CAP=cap > 0,
            SMOOTH=eps > 0, MODE=mode, VEC=vector_sums)
    return loss, lse, aux


def _reduce_impl(loss: Tensor, lse: Optional[Tensor], y: Tensor, w: Optional[Tensor], c: int, ignore_index: int,
                 coef: float, mean: bool, units: float = 1.0) -> Tensor:
    """``[loss, penalty, scale]`` (float32, ``(3,)``) of the row losses: one launch. ``w``: the
    class weights whose ``w_y`` is a row's unit weight; ``units``: units per kept row."""
    out = torch.empty(3, dtype=torch.float32, device=loss.device)
    m = loss.shape[0]
    block = max(16, min(1024, triton.next_power_of_2(max(m, 1))))
    _launch("reduce", loss.view(-1, 1), 1, loss, _opt(lse, loss), y, _opt(w, loss), out, m, c, ignore_index,
            float(coef), float(units), block=block, MEAN=mean, HAS_W=w is not None,
            HAS_PEN=lse is not None and coef > 0)
    return out


#: the widest row the Fenchel-Young kernel holds in registers (C <= this; the losses' own check
#: is ``losses.classification.sparsemax._FY_MAX``)
FY_MAX_CLASSES = 32768


def _fy_block(c: int) -> Tuple[int, int]:
    blk = max(16, triton.next_power_of_2(max(c, 1)))
    return blk, max(4, min(32, blk // 1024))


def _fy_fwd_impl(x: Tensor, y: Tensor, entmax: bool, ignore_index: int) -> Tuple[Tensor, Tensor]:
    m, c = x.shape
    loss = torch.empty(m, dtype=torch.float32, device=x.device)
    stats = torch.empty(m, 2, dtype=torch.float32, device=x.device)
    blk, warps = _fy_block(c)
    _launch("fy_fwd", x, m, x, x.stride(0), y, loss, stats, c, ignore_index, block=blk, warps=warps, ENTMAX=entmax,
            ITERS=30)
    return loss, stats


def _fy_bwd_impl(x: Tensor, y: Tensor, stats: Tensor, g: Tensor, scale: Optional[Tensor], entmax: bool,
                 ignore_index: int, out: Tensor) -> None:
    m, c = x.shape
    blk, warps = _fy_block(c)
    _launch("fy_bwd", x, m, x, x.stride(0), y, stats, g, 0 if g.dim() == 0 else g.stride(0), _opt(scale, x), out,
            out.stride(0), c, ignore_index, block=blk, warps=warps, ENTMAX=entmax, REDUCED=scale is not None)


def _binary_fwd_impl(x: Tensor, y: Tensor, w: Optional[Tensor], eps: float, ignore_index: int, kind: int) -> Tensor:
    m, c = x.shape
    loss = torch.empty(m, dtype=torch.float32, device=x.device)
    _launch("binary_fwd", x, m, x, x.stride(0), y, _opt(w, x), loss, c, ignore_index, float(eps), KIND=kind,
            HAS_W=w is not None)
    return loss


def _binary_bwd_impl(x: Tensor, y: Tensor, w: Optional[Tensor], g: Tensor, scale: Tensor, eps: float,
                     ignore_index: int, kind: int, out: Tensor) -> None:
    m, c = x.shape
    _launch("binary_bwd", x, m, x, x.stride(0), y, _opt(w, x), g, scale, out, out.stride(0), c, ignore_index,
            float(eps), KIND=kind, HAS_W=w is not None)


def _softmax_bwd_impl(x: Tensor, y: Tensor, w: Optional[Tensor], shift: Optional[Tensor], lse: Tensor, aux: Tensor,
                      g: Optional[Tensor], gl: Optional[Tensor], scale: Optional[Tensor], cap: float, eps: float,
                      coef: float, ignore_index: int, mode: int, out: Tensor) -> None:
    m, c = x.shape
    _launch("softmax_bwd", x, m, x, x.stride(0), y, _opt(w, x), _opt(shift, x), lse, aux,
            _opt(g, x), 0 if g is None or g.dim() == 0 else g.stride(0), _opt(gl, x),
            0 if gl is None or gl.dim() == 0 else gl.stride(0), _opt(scale, x), out, out.stride(0), c,
            ignore_index, float(cap), float(eps), float(coef), HAS_W=w is not None, HAS_SHIFT=shift is not None,
            HAS_CAP=cap > 0, SMOOTH=eps > 0, HAS_G=g is not None, HAS_GL=gl is not None, REDUCED=scale is not None,
            MODE=mode)


def _zloss_fwd_impl(x: Tensor, y: Tensor, a: float, b: float, eps: float, ignore_index: int) -> Tuple[Tensor, Tensor]:
    m, c = x.shape
    loss = torch.empty(m, dtype=torch.float32, device=x.device)
    stats = torch.empty(m, 4, dtype=torch.float32, device=x.device)
    _launch("zloss_fwd", x, m, x, x.stride(0), y, loss, stats, c, ignore_index, float(a), float(b), float(eps))
    return loss, stats


def _zloss_bwd_impl(x: Tensor, y: Tensor, stats: Tensor, g: Tensor, scale: Optional[Tensor], ignore_index: int,
                    out: Tensor) -> None:
    m, c = x.shape
    _launch("zloss_bwd", x, m, x, x.stride(0), y, stats, g, 0 if g.dim() == 0 else g.stride(0), _opt(scale, x), out,
            out.stride(0), c, ignore_index, REDUCED=scale is not None)


# --------------------------------------------------------------------------------------
# custom operators (what torch.compile sees)
# --------------------------------------------------------------------------------------

_OPS: dict = {}


def _ops() -> dict:
    """The custom operators, registered once (``torch.library.custom_op``, torch >= 2.4)."""
    if _OPS:
        return _OPS
    lib = torch.library
    f32 = torch.float32

    @lib.custom_op("losses::softmax_rows_fwd", mutates_args=())
    def softmax_rows_fwd(x: Tensor, y: Tensor, w: Optional[Tensor], shift: Optional[Tensor], cap: float, eps: float,
                         ignore_index: int, mode: int, hyper: float) -> Tuple[Tensor, Tensor, Tensor]:
        return _softmax_fwd_impl(x, y, w, shift, cap, eps, ignore_index, mode, hyper)

    @softmax_rows_fwd.register_fake
    def _(x, y, w, shift, cap, eps, ignore_index, mode, hyper):
        m = x.shape[0]
        return (x.new_empty(m, dtype=f32), x.new_empty(m, dtype=f32), x.new_empty((m, 3), dtype=f32))

    @lib.custom_op("losses::rows_reduce", mutates_args=())
    def rows_reduce(loss: Tensor, lse: Optional[Tensor], y: Tensor, w: Optional[Tensor], c: int, ignore_index: int,
                    coef: float, mean: bool, units: float) -> Tensor:
        return _reduce_impl(loss, lse, y, w, c, ignore_index, coef, mean, units)

    @rows_reduce.register_fake
    def _(loss, lse, y, w, c, ignore_index, coef, mean, units):
        return loss.new_empty(3, dtype=f32)

    @lib.custom_op("losses::binary_rows_fwd", mutates_args=())
    def binary_rows_fwd(x: Tensor, y: Tensor, w: Optional[Tensor], eps: float, ignore_index: int, kind: int) -> Tensor:
        return _binary_fwd_impl(x, y, w, eps, ignore_index, kind)

    @binary_rows_fwd.register_fake
    def _(x, y, w, eps, ignore_index, kind):
        return x.new_empty(x.shape[0], dtype=f32)

    @lib.custom_op("losses::binary_rows_bwd", mutates_args=())
    def binary_rows_bwd(x: Tensor, y: Tensor, w: Optional[Tensor], g: Tensor, scale: Tensor, eps: float,
                        ignore_index: int, kind: int) -> Tensor:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _binary_bwd_impl(x, y, w, g, scale, eps, ignore_index, kind, out)
        return out

    @binary_rows_bwd.register_fake
    def _(x, y, w, g, scale, eps, ignore_index, kind):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @lib.custom_op("losses::softmax_rows_bwd", mutates_args=())
    def softmax_rows_bwd(x: Tensor, y: Tensor, w: Optional[Tensor], shift: Optional[Tensor], lse: Tensor,
                         aux: Tensor, g: Optional[Tensor], gl: Optional[Tensor], scale: Optional[Tensor], cap: float,
                         eps: float, coef: float, ignore_index: int, mode: int) -> Tensor:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _softmax_bwd_impl(x, y, w, shift, lse, aux, g, gl, scale, cap, eps, coef, ignore_index, mode, out)
        return out

    @softmax_rows_bwd.register_fake
    def _(x, y, w, shift, lse, aux, g, gl, scale, cap, eps, coef, ignore_index, mode):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @lib.custom_op("losses::z_loss_rows_fwd", mutates_args=())
    def z_loss_rows_fwd(x: Tensor, y: Tensor, a: float, b: float, eps: float, ignore_index: int) -> Tuple[Tensor, Tensor]:
        return _zloss_fwd_impl(x, y, a, b, eps, ignore_index)

    @z_loss_rows_fwd.register_fake
    def _(x, y, a, b, eps, ignore_index):
        m = x.shape[0]
        return x.new_empty(m, dtype=f32), x.new_empty((m, 4), dtype=f32)

    @lib.custom_op("losses::z_loss_rows_bwd", mutates_args=())
    def z_loss_rows_bwd(x: Tensor, y: Tensor, stats: Tensor, g: Tensor, scale: Optional[Tensor],
                        ignore_index: int) -> Tensor:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _zloss_bwd_impl(x, y, stats, g, scale, ignore_index, out)
        return out

    @z_loss_rows_bwd.register_fake
    def _(x, y, stats, g, scale, ignore_index):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @lib.custom_op("losses::fy_rows_fwd", mutates_args=())
    def fy_rows_fwd(x: Tensor, y: Tensor, entmax: bool, ignore_index: int) -> Tuple[Tensor, Tensor]:
        return _fy_fwd_impl(x, y, entmax, ignore_index)

    @fy_rows_fwd.register_fake
    def _(x, y, entmax, ignore_index):
        return x.new_empty(x.shape[0], dtype=f32), x.new_empty((x.shape[0], 2), dtype=f32)

    @lib.custom_op("losses::fy_rows_bwd", mutates_args=())
    def fy_rows_bwd(x: Tensor, y: Tensor, stats: Tensor, g: Tensor, scale: Optional[Tensor], entmax: bool,
                    ignore_index: int) -> Tensor:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _fy_bwd_impl(x, y, stats, g, scale, entmax, ignore_index, out)
        return out

    @fy_rows_bwd.register_fake
    def _(x, y, stats, g, scale, entmax, ignore_index):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    _OPS.update(binary_fwd=binary_rows_fwd, binary_bwd=binary_rows_bwd, fy_fwd=fy_rows_fwd, fy_bwd=fy_rows_bwd)
    _OPS.update(softmax_fwd=softmax_rows_fwd, reduce=rows_reduce, softmax_bwd=softmax_rows_bwd,
                zloss_fwd=z_loss_rows_fwd, zloss_bwd=z_loss_rows_bwd)
    return _OPS


_ops()


def _compiling() -> bool:
    try:
        return torch.compiler.is_compiling()
    except AttributeError:  # pragma: no cover
        return False


def _call(name: str, impl, *args):
    """The custom operator ``name`` while torch.compile traces, else the launcher directly (no
    dispatcher cost in eager mode)."""
    return _OPS[name](*args) if _compiling() else impl(*args)


def _softmax_bwd_call(x, y, w, shift, lse, aux, g, gl, scale, opts):
    cap, eps, coef, ignore_index, mode, inplace = opts
    if _compiling():
        return _OPS["softmax_bwd"](x, y, w, shift, lse, aux, g, gl, scale, cap, eps, coef, ignore_index, mode)
    # in place: a new tensor over the logits' storage, which autograd takes as the gradient
    grad = x.detach() if inplace else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _softmax_bwd_impl(x, y, w, shift, lse, aux, g, gl, scale, cap, eps, coef, ignore_index, mode, grad)
    return grad


# --------------------------------------------------------------------------------------
# autograd
# --------------------------------------------------------------------------------------


class _SoftmaxRows(torch.autograd.Function):
    """Per-row ``(loss, lse)``: reduction ``"none"``."""

    @staticmethod
    def forward(ctx, x, y, w, shift, opts, hyper):
        cap, eps, _, ignore_index, mode, _ = opts
        loss, lse, aux = _call("softmax_fwd", _softmax_fwd_impl, x, y, w, shift, cap, eps, ignore_index, mode, hyper)
        ctx.save_for_backward(x, y, w, shift, lse, aux)
        ctx.opts = opts
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros launched
        return loss, lse

    @staticmethod
    def backward(ctx, g, gl):
        x, y, w, shift, lse, aux = ctx.saved_tensors
        return _softmax_bwd_call(x, y, w, shift, lse, aux, g, gl, None, ctx.opts), None, None, None, None, None


class _SoftmaxReduced(torch.autograd.Function):
    """``(loss, penalty)`` reduced to scalars (``"mean"`` / ``"sum"``): the row kernel and one
    reduction launch; the backward is one launch."""

    @staticmethod
    def forward(ctx, x, y, w, shift, opts, hyper, mean):
        cap, eps, coef, ignore_index, mode, _ = opts
        rows, lse, aux = _call("softmax_fwd", _softmax_fwd_impl, x, y, w, shift, cap, eps, ignore_index, mode, hyper)
        out = _call("reduce", _reduce_impl, rows, lse, y, w, x.shape[1], ignore_index, coef, mean, 1.0)
        ctx.save_for_backward(x, y, w, shift, lse, aux, out[2])
        ctx.opts = opts
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros launched
        return out[0], out[1]

    @staticmethod
    def backward(ctx, g, gp):
        x, y, w, shift, lse, aux, scale = ctx.saved_tensors
        return _softmax_bwd_call(x, y, w, shift, lse, aux, g, gp, scale, ctx.opts), None, None, None, None, None, None


class _ZLossRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, a, b, eps, ignore_index, reduce, mean):
        rows, stats = _call("zloss_fwd", _zloss_fwd_impl, x, y, a, b, eps, ignore_index)
        scale = None
        if reduce:
            out = _call("reduce", _reduce_impl, rows, None, y, None, x.shape[1], ignore_index, 0.0, mean, 1.0)
            rows, scale = out[0], out[2]
        ctx.save_for_backward(x, y, stats, scale)
        ctx.ignore_index = ignore_index
        return rows

    @staticmethod
    def backward(ctx, g):
        x, y, stats, scale = ctx.saved_tensors
        if _compiling():
            grad = _OPS["zloss_bwd"](x, y, stats, g, scale, ctx.ignore_index)
        else:
            grad = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            _zloss_bwd_impl(x, y, stats, g, scale, ctx.ignore_index, grad)
        return grad, None, None, None, None, None, None, None


class _BinaryReduced(torch.autograd.Function):
    """The element-wise binary losses of one-hot labels, reduced: row kernel + one reduction launch;
    the backward is one launch."""

    @staticmethod
    def forward(ctx, x, y, w, eps, ignore_index, kind, mean):
        rows = _call("binary_fwd", _binary_fwd_impl, x, y, w, eps, ignore_index, kind)
        out = _call("reduce", _reduce_impl, rows, None, y, None, x.shape[1], ignore_index, 0.0, mean,
                    float(x.shape[1]))
        ctx.save_for_backward(x, y, w, out[2])
        ctx.opts = (eps, ignore_index, kind)
        return out[0]

    @staticmethod
    def backward(ctx, g):
        x, y, w, scale = ctx.saved_tensors
        eps, ignore_index, kind = ctx.opts
        if _compiling():
            grad = _OPS["binary_bwd"](x, y, w, g, scale, eps, ignore_index, kind)
        else:
            grad = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            _binary_bwd_impl(x, y, w, g, scale, eps, ignore_index, kind, grad)
        return grad, None, None, None, None, None, None


class _FYRows(torch.autograd.Function):
    """Sparsemax / entmax-1.5 Fenchel-Young losses of ids: per row, or reduced by one more launch."""

    @staticmethod
    def forward(ctx, x, y, entmax, ignore_index, reduce, mean):
        rows, stats = _call("fy_fwd", _fy_fwd_impl, x, y, entmax, ignore_index)
        scale = None
        if reduce:
            out = _call("reduce", _reduce_impl, rows, None, y, None, x.shape[1], ignore_index, 0.0, mean, 1.0)
            rows, scale = out[0], out[2]
        ctx.save_for_backward(x, y, stats, scale)
        ctx.opts = (entmax, ignore_index)
        return rows

    @staticmethod
    def backward(ctx, g):
        x, y, stats, scale = ctx.saved_tensors
        entmax, ignore_index = ctx.opts
        if _compiling():
            grad = _OPS["fy_bwd"](x, y, stats, g, scale, entmax, ignore_index)
        else:
            grad = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            _fy_bwd_impl(x, y, stats, g.contiguous() if g.dim() else g, scale, entmax, ignore_index, grad)
        return grad, None, None, None, None, None


def _prepare(x: Tensor, y: Tensor, weight: Optional[Tensor], shift: Optional[Tensor]):
    x = _rows2d(x)
    y = y if y.is_contiguous() else y.contiguous()
    w = None if weight is None else weight.to(device=x.device, dtype=torch.float32).contiguous()
    sh = None if shift is None else shift.to(device=x.device, dtype=torch.float32).contiguous()
    return x, y, w, sh


#: the row transforms f(ce) of the softmax kernel: the loss of a row is w_y f(ce), its gradient
#: w_y f'(ce) (p - e_y)
MODES = {"ce": 0, "comp_sum": 1, "focal": 2}


def _opts(softcap, label_smoothing, coef, ignore_index, mode, inplace):
    if mode not in MODES:
        raise ValueError(f"softmax rows: mode must be one of {sorted(MODES)} (got {mode!r})")
    if MODES[mode] and label_smoothing:
        raise ValueError("softmax rows: label smoothing applies to mode 'ce' only")
    return (float(softcap or 0.0), float(label_smoothing), float(coef), int(ignore_index), MODES[mode], bool(inplace))


def softmax_rows(x: Tensor, y: Tensor, *, weight: Optional[Tensor] = None, shift: Optional[Tensor] = None,
                 softcap: Optional[float] = None, label_smoothing: float = 0.0, ignore_index: int = -100,
                 mode: str = "ce", hyper: float = 0.0, inplace: bool = False) -> Tuple[Tensor, Tensor]:
    """Per-row ``(loss, lse)`` (float32, ``(M,)``) of the logits ``x (M, C)`` against the ids ``y (M,)``;
    the maths is the module docstring's. ``weight``, ``shift``: ``(C,)``; ``mode``: ``"ce"``,
    ``"comp_sum"`` (``hyper = 1 - tau``, nonzero) or ``"focal"`` (``hyper = gamma > 0``); ``inplace``:
    the backward writes the gradient over ``x``'s storage (``x`` must not be needed after the backward)."""
    x, y, w, sh = _prepare(x, y, weight, shift)
    return _SoftmaxRows.apply(x, y, w, sh, _opts(softcap, label_smoothing, 0.0, ignore_index, mode, inplace),
                              float(hyper))


def softmax_reduced(x: Tensor, y: Tensor, *, reduction: str, weight: Optional[Tensor] = None,
                    shift: Optional[Tensor] = None, softcap: Optional[float] = None, label_smoothing: float = 0.0,
                    coef: float = 0.0, ignore_index: int = -100, mode: str = "ce", hyper: float = 0.0,
                    inplace: bool = False) -> Tuple[Tensor, Tensor]:
    """``(loss, penalty)`` scalars: the ``"mean"`` (over the kept rows' unit weights ``w_y``; an exact
    0 when there are none) or ``"sum"`` of the row losses plus ``coef * lse^2`` per kept row, and
    the penalty part alone, reduced the same way (arguments as :func:`softmax_rows`)."""
    x, y, w, sh = _prepare(x, y, weight, shift)
    return _SoftmaxReduced.apply(x, y, w, sh, _opts(softcap, label_smoothing, coef, ignore_index, mode, inplace),
                                 float(hyper), reduction == "mean")


def softmax_loss(x: Tensor, y: Tensor, reduction: str, **options) -> Tensor:
    """The loss alone: per row (``"none"``, :func:`softmax_rows`'s first output) or the reduced
    scalar (:func:`softmax_reduced`'s first output); ``options`` as theirs."""
    if reduction == "none":
        return softmax_rows(x, y, **options)[0]
    return softmax_reduced(x, y, reduction=reduction, **options)[0]


def z_loss_rows(x: Tensor, y: Tensor, *, a: float, b: float, eps: float, ignore_index: int = -100,
                reduction: str = "none") -> Tensor:
    """The Z-loss of ``x (M, C)`` against the ids ``y (M,)``: per row (float32, ``(M,)``, 0 where
    ``y == ignore_index``) for ``"none"``, else their sum or their mean over the kept rows."""
    x, y, _, _ = _prepare(x, y, None, None)
    return _ZLossRows.apply(x, y, float(a), float(b), float(eps), int(ignore_index), reduction != "none",
                            reduction == "mean")


BINARY_KINDS = {"bce": 0, "gol": 1}


def binary_reduced(x: Tensor, y: Tensor, *, kind: str, reduction: str, weight: Optional[Tensor] = None,
                   label_smoothing: float = 0.0, ignore_index: int = -100) -> Tensor:
    """The ``"mean"`` (over the ``C`` elements of every kept row) or ``"sum"`` of an element-wise
    binary loss (``kind``: ``"bce"``, or ``"gol"`` for the Gumbel loss with its -50 floor) of the
    logits ``x (M, C)`` against the one-hot labels of the ids ``y (M,)``, smoothed by
    ``label_smoothing``, each element scaled by ``weight[k]`` (``(C,)``)."""
    x, y, w, _ = _prepare(x, y, weight, None)
    return _BinaryReduced.apply(x, y, w, float(label_smoothing), int(ignore_index), BINARY_KINDS[kind],
                                reduction == "mean")


def fenchel_young_rows(x: Tensor, y: Tensor, *, entmax: bool, reduction: str, ignore_index: int = -100) -> Tensor:
    """The sparsemax (``entmax=False``) or entmax-1.5 Fenchel-Young loss of ``x (M, C)`` (``C <=``
    :data:`FY_MAX_CLASSES`) against the ids ``y (M,)``: per row (float32, 0 on ignored rows) for
    ``"none"``, else their sum or mean over the kept rows. Gradient ``p* - e_y``."""
    x, y, _, _ = _prepare(x, y, None, None)
    return _FYRows.apply(x, y, bool(entmax), int(ignore_index), reduction != "none", reduction == "mean")
