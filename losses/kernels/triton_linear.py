"""The LM head on the GPU: linear cross-entropy with half-precision matmuls and no full logits.

For hidden states ``x (N, H)`` and a head ``W (V, H)`` (bfloat16 or float16, on a CUDA device; CPU
through Triton's interpreter in tests) the loss of :func:`losses.linear_cross_entropy` is computed
over class chunks ``W_c`` of ``V_c`` rows:

* forward: ``Z_c = x @ W_c^T (+ b_c)`` on the tensor cores (float32 accumulation, the chunk stored
  in the input dtype, as a materialised ``x @ W.T`` would be), then one Triton pass over ``Z_c``
  that merges the chunk into each row's running max, sum of exponentials, non-target sum, sum of
  logits (label smoothing) and picks the target logit. Only ``O(N)`` float32 numbers survive a
  chunk.
* backward: each chunk's logits are computed again (``Z_c``), one Triton pass turns them in place
  into ``dZ_c = (g (1 + 2 coef lse) p - g eps / V - g (1 - eps) [k = y]) * dcap`` (in the input
  dtype), then ``dW_c = dZ_c^T x`` is written once (float32 accumulation over all ``N`` rows inside
  the matmul: no accumulation across chunks in a half-precision buffer) and
  ``dx += dZ_c W_c`` accumulates in a float32 buffer.

So the head costs four matmuls of ``N x H x V`` (one forward, three backward) where a materialised
``x @ W.T`` + ``F.cross_entropy`` costs three and keeps ``N x V`` logits (and their float32
softmax) alive: the fourth is the price of never holding the logits and of exact, float32-
accumulated gradients. Extra memory: one ``N x V_c`` chunk and a float32 ``N x H`` buffer.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

import triton
import triton.language as tl

from .triton_rows import _compiling, _tanh

__all__ = ["linear_cross_entropy_rows", "chunk_columns"]

#: bytes of one chunk of logits (N x V_c in the input dtype)
CHUNK_BYTES = 64 << 20


def _merge(Z, stride_z, Y, STATS, start, VC, ignore_index, cap, HAS_CAP: tl.constexpr, SMOOTH: tl.constexpr,
           BLOCK: tl.constexpr):
    # STATS (N, 5) float32: running max, sum of exp(z - max), the same without the target, the
    # target logit, the sum of the logits (smoothing); all after soft-capping
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(Y + row).to(tl.int64)
    yl = y - start
    st = STATS + row * 5
    m = tl.load(st)
    s = tl.load(st + 1)
    so = tl.load(st + 2)
    zs = tl.load(st + 4)
    z_row = Z + row * stride_z
    for c0 in range(0, VC, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        inside = cols < VC
        z = tl.load(z_row + cols, mask=inside, other=-float("inf")).to(tl.float32)
        if HAS_CAP:
            t = _tanh(z / cap)
            z = tl.where(inside, cap * t, z)
        m_new = tl.maximum(m, tl.max(z, 0))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        r = tl.exp(m - m_safe)
        e = tl.exp(z - m_safe)
        s = s * r + tl.sum(e, 0)
        so = so * r + tl.sum(tl.where(cols == yl, 0.0, e), 0)
        m = m_new
        if SMOOTH:
            zs += tl.sum(tl.where(inside, z, 0.0), 0)
    tl.store(st, m)
    tl.store(st + 1, s)
    tl.store(st + 2, so)
    if SMOOTH:
        tl.store(st + 4, zs)
    hit = (yl >= 0) & (yl < VC) & (y != ignore_index)
    zy = tl.load(z_row + tl.minimum(tl.maximum(yl, 0), VC - 1)).to(tl.float32)
    if HAS_CAP:
        zy = cap * _tanh(zy / cap)
    tl.store(st + 3, zy, mask=hit)


def _grad(Z, stride_z, Y, LSE, G, start, VC, V, ignore_index, cap, eps, coef, HAS_CAP: tl.constexpr,
          BLOCK: tl.constexpr):
    # Z_c -> dZ_c in place; G: the row's incoming gradient (0 on ignored rows)
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(Y + row).to(tl.int64)
    z_row = Z + row * stride_z
    g = tl.load(G + row)
    g = tl.where(y == ignore_index, 0.0, g)
    yl = y - start
    lse = tl.load(LSE + row)
    g_soft = g * (1.0 + 2.0 * coef * lse)
    g_eps = g * eps / V
    g_y = g * (1.0 - eps)
    for c0 in range(0, VC, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        inside = cols < VC
        z = tl.load(z_row + cols, mask=inside, other=0.0).to(tl.float32)
        if HAS_CAP:
            t = _tanh(z / cap)
            z = cap * t
        d = g_soft * tl.exp(z - lse) - g_eps - tl.where(cols == yl, g_y, 0.0)
        if HAS_CAP:
            d = d * (1.0 - t * t)
        tl.store(z_row + cols, d.to(Z.dtype.element_ty), mask=inside)


_KERNELS: dict = {}


def _kernel(name):
    if name not in _KERNELS:
        _KERNELS[name] = triton.jit({"merge": _merge, "grad": _grad}[name])
    return _KERNELS[name]


def chunk_columns(n: int, v: int, itemsize: int, chunk_size: Optional[int] = None) -> int:
    """Classes per chunk: ``chunk_size`` if given, else about :data:`CHUNK_BYTES` of logits, a
    multiple of 256, at least 256 and at most ``v``."""
    if chunk_size is not None:
        return max(1, min(v, chunk_size))
    c = CHUNK_BYTES // max(1, n * itemsize)
    return max(1, min(v, max(256, (c // 256) * 256)))


def _row_launch(name: str, z: Tensor, n: int, *args, **meta) -> None:
    # one program per row; the chunk's columns in blocks of up to 4096
    blk = max(16, min(4096, triton.next_power_of_2(max(1, z.shape[1]))))
    kern = _kernel(name)
    if n == 0:
        return
    if z.device.type == "cpu":
        kern[(n,)](*args, BLOCK=blk, **meta)
    else:
        with torch.cuda.device(z.device):
            kern[(n,)](*args, BLOCK=blk, num_warps=8 if blk >= 2048 else 4, **meta)


def _mm_acc(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """``acc += a @ b`` with ``acc`` float32 and ``a``, ``b`` half: the matmul in half precision with a
    float32 result where the device supports it (``torch.addmm(..., out_dtype)``), else in float32."""
    if a.is_cuda:
        try:
            torch.addmm(acc, a, b, torch.float32, out=acc)
            return
        except (RuntimeError, TypeError):  # torch < 2.8: no out_dtype
            pass
    acc.addmm_(a.float(), b.float())


def _logits(x: Tensor, w: Tensor, b: Optional[Tensor], start: int, stop: int) -> Tensor:
    if b is None:
        return x @ w[start:stop].T
    return torch.addmm(b[start:stop].to(x.dtype), x, w[start:stop].T)


def _forward_impl(x: Tensor, w: Tensor, b: Optional[Tensor], y: Tensor, chunk: int, cap: float, eps: float,
                  ignore_index: int) -> Tensor:
    """``STATS (N, 5)``: max, sum, non-target sum, target logit, sum of logits (see :func:`_merge`)."""
    n, v = x.shape[0], w.shape[0]
    stats = torch.zeros(n, 5, dtype=torch.float32, device=x.device)
    stats[:, 0] = -float("inf")
    for start in range(0, v, chunk):
        stop = min(v, start + chunk)
        z = _logits(x, w, b, start, stop)
        _row_launch("merge", z, n, z, z.stride(0), y, stats, start, stop - start, ignore_index, float(cap),
                    HAS_CAP=cap > 0, SMOOTH=eps > 0)
    return stats


def _backward_impl(x: Tensor, w: Tensor, b: Optional[Tensor], y: Tensor, lse: Tensor, g: Tensor, chunk: int,
                   cap: float, eps: float, coef: float, ignore_index: int, need: Tuple[bool, bool, bool]):
    n, v = x.shape[0], w.shape[0]
    gx = torch.zeros(x.shape, dtype=torch.float32, device=x.device) if need[0] else None
    gw = torch.empty(w.shape, dtype=w.dtype, device=w.device) if need[1] else None
    gb = torch.empty(v, dtype=torch.float32, device=x.device) if need[2] else None
    for start in range(0, v, chunk):
        stop = min(v, start + chunk)
        z = _logits(x, w, b, start, stop)
        _row_launch("grad", z, n, z, z.stride(0), y, lse, g, start, stop - start, v, ignore_index, float(cap),
                    float(eps), float(coef), HAS_CAP=cap > 0)
        if gw is not None:
            torch.mm(z.T, x, out=gw[start:stop])
        if gx is not None:
            _mm_acc(gx, z, w[start:stop])
        if gb is not None:
            gb[start:stop] = z.sum(dim=0, dtype=torch.float32)
    return (None if gx is None else gx.to(x.dtype), gw, None if gb is None else gb.to(b.dtype))


class _LinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, y, chunk, cap, eps, coef, ignore_index):
        if _compiling():
            stats = _ops()["fwd"](x, w, b, y, chunk, cap, eps, ignore_index)
        else:
            stats = _forward_impl(x, w, b, y, chunk, cap, eps, ignore_index)
        m, s, so, zy, zs = stats.unbind(1)
        m0 = torch.where(m == -float("inf"), torch.zeros_like(m), m)
        lse = m0 + torch.log(s)
        # ce = log(1 + (non-target mass) / exp(z_y)), exact as p_y -> 1
        ce = torch.nn.functional.softplus(torch.log(so) + (m0 - zy), beta=1.0, threshold=1e9)
        loss = (1.0 - eps) * ce + coef * lse * lse
        if eps > 0:
            loss = loss + eps * (lse - zs / w.shape[0])
        loss = torch.where(y == ignore_index, torch.zeros_like(loss), loss)
        ctx.save_for_backward(x, w, b, y, lse)
        ctx.opts = (chunk, cap, eps, coef, ignore_index)
        return loss

    @staticmethod
    def backward(ctx, g):
        x, w, b, y, lse = ctx.saved_tensors
        chunk, cap, eps, coef, ignore_index = ctx.opts
        need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], b is not None and ctx.needs_input_grad[2])
        g = g.float().contiguous()
        if _compiling():
            gx, gw, gb = _ops()["bwd"](x, w, b, y, lse, g, chunk, cap, eps, coef, ignore_index, list(need))
            gx, gw, gb = (t if n else None for t, n in zip((gx, gw, gb), need))
        else:
            gx, gw, gb = _backward_impl(x, w, b, y, lse, g, chunk, cap, eps, coef, ignore_index, need)
        return gx, gw, gb, None, None, None, None, None, None


_OPS: dict = {}


def _ops() -> dict:
    if _OPS:
        return _OPS
    lib = torch.library

    @lib.custom_op("losses::linear_ce_fwd", mutates_args=())
    def linear_ce_fwd(x: Tensor, w: Tensor, b: Optional[Tensor], y: Tensor, chunk: int, cap: float, eps: float,
                      ignore_index: int) -> Tensor:
        return _forward_impl(x, w, b, y, chunk, cap, eps, ignore_index)

    @linear_ce_fwd.register_fake
    def _(x, w, b, y, chunk, cap, eps, ignore_index):
        return x.new_empty((x.shape[0], 5), dtype=torch.float32)

    @lib.custom_op("losses::linear_ce_bwd", mutates_args=())
    def linear_ce_bwd(x: Tensor, w: Tensor, b: Optional[Tensor], y: Tensor, lse: Tensor, g: Tensor, chunk: int,
                      cap: float, eps: float, coef: float, ignore_index: int,
                      need: list[bool]) -> Tuple[Tensor, Tensor, Tensor]:
        gx, gw, gb = _backward_impl(x, w, b, y, lse, g, chunk, cap, eps, coef, ignore_index, tuple(need))
        return (gx if gx is not None else x.new_zeros(x.shape), gw if gw is not None else w.new_zeros(w.shape),
                gb if gb is not None else x.new_zeros(w.shape[0]))

    @linear_ce_bwd.register_fake
    def _(x, w, b, y, lse, g, chunk, cap, eps, coef, ignore_index, need):
        return torch.empty_like(x), torch.empty_like(w), x.new_empty(w.shape[0])

    _OPS.update(fwd=linear_ce_fwd, bwd=linear_ce_bwd)
    return _OPS


_ops()


def linear_cross_entropy_rows(x: Tensor, w: Tensor, b: Optional[Tensor], y: Tensor, *, chunk: int,
                              softcap: Optional[float], label_smoothing: float, logz_coef: float,
                              ignore_index: int) -> Tensor:
    """Per-row losses ``(N,)`` (float32; 0 on ignored rows) of the linear head; see the module
    docstring. ``x (N, H)``, ``w (V, H)`` and ``b (V,)`` share one half-precision dtype."""
    return _LinearCE.apply(x.contiguous(), w.contiguous(), None if b is None else b.contiguous(), y.contiguous(),
                           int(chunk), float(softcap or 0.0), float(label_smoothing), float(logz_coef),
                           int(ignore_index))
