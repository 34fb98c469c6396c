"""A fused C kernel for the Dice family's per-class sums on CPU (soft Dice, Dice semimetric, Jaccard
metric through softmax or sigmoid, float32).

Why it exists. The Dice losses need, per (image, class), ``|x| = sum_s x``, the label mass
``|y| = sum_s y`` and ``A = sum_s a(x, y)`` (``a = x + y - 2xy``, or ``|x - y|``), with
``x = softmax(z)`` over the classes at every position. In PyTorch that is a softmax over a
non-last dimension, then two or three element-wise passes and reductions, and the backward as many
again: each pass reads and writes the whole ``(B, C, d1, ..., dk)`` map. This kernel reads the
logits once and writes ``x`` once (kept for the backward), and its backward reads ``x`` (and the
labels) once and writes the gradient once.

What it computes, per block of 64 positions of one image (the vector loops' trip count):

1. softmax: ``m = max_c z_c`` per position (reached first by class ``k``), ``e_c = exp(z_c - m)``,
   ``x_c = e_c / sum_c e_c``, and ``rest = sum_{c != k} e_c``, so that ``1 - x_k = rest / sum e``
   has no cancellation (for the other classes ``x_c <= 1/2``, so ``1 - x_c`` has none either).
   Sigmoid: ``x = 1 / (1 + e)`` or ``e / (1 + e)`` with ``e = exp(-|z|)``, and ``1 - x`` the other
   one.
2. the terms ``x``, ``y`` (a kept position's label: 1 at the id, or the float label) and ``a``,
   written from ``x`` and ``1 - x``: ``a = y (1 - x) + (1 - y) x`` (= ``x + y - 2xy``; ``1 - x`` at
   the id), or ``|x - y|`` as ``|(1 - y) - (1 - x)|`` where ``y >= 1/2``. A confident prediction's
   small loss keeps its relative precision, which a float32 ``1 - x`` rounds away. Summed in 16
   float lanes within the block and in float64 across blocks.

``exp`` is computed in float: ``v = n ln 2 + r`` (Cody-Waite, ``|r| <= ln 2 / 2``), a degree-6
polynomial for ``e^r`` and ``2^n`` from the exponent bits; for the ``v <= 0`` the kernel needs its
error is below one float spacing of the float64 value (0.98 at most over 3 million points, on each
variant; the tests bound it by 1.5), and ``exp`` of
``-inf`` (or of anything below ``ln`` of the smallest normal float, -87.34) is 0.

Dropped positions (an ignored id, ``mask`` False) are not read: their ``x`` is 0, as are their
terms and gradient. Positions are split into chunks of 4096 per image, each chunk's sums kept
apart and added in chunk order at the end, so the sums are the same whatever the number of
threads (chunks are spread over ``torch.get_num_threads()`` POSIX threads when the map is large
enough to pay for them: :data:`PARALLEL_MIN`).

A NaN or ``+inf`` logit at a kept position (or a kept position whose logits are all ``-inf``), or a
kept id out of range, makes the call return a status instead: the caller then runs its PyTorch
path, which gives the same values (or raises the same error) as without this kernel.

The body is compiled three times under GCC on x86-64 (AVX-512, AVX2 + FMA, and the baseline), and
the first that the CPU supports is used (:func:`variant`); other compilers build the baseline
only. Built and loaded as :mod:`losses.kernels.entmax_native` is (the shared builder in
``losses/kernels/_native.py``); ``LOSSES_NATIVE=0``, no compiler, or float64 inputs: the PyTorch path runs.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _native

__all__: list = []

#: positions per block (the kernel's vector trip count); maps with fewer positions per image than
#: this take the PyTorch path (a (B, C) input would otherwise fill 1 of every 64 lanes)
BLOCK = 64

#: elements (B x C x positions) above which the chunks are split over ``torch.get_num_threads()``
PARALLEL_MIN = 1 << 18

_BODY = _native.EXP_C + r"""
static inline float exp_neg_@V@(float v) {
    float w = v < -87.33654f ? -87.33654f : v; /* ln of the smallest normal float */
    float r;
    float n = exp_reduce_@V@(w, &r);
    float p = (exp_poly_@V@(r) + 1.0f) * exp2i_@V@(n);
    return v < -87.33654f ? 0.0f : p;
}

/* z where the lane mask km is all ones, else +0 (bit operations: the loops vectorise with SSE2 too,
   where GCC does not if-convert a float select on a float comparison) */
static inline float keep_@V@(float z, int32_t km) {
    int32_t b;
    memcpy(&b, &z, sizeof b);
    b &= km;
    float r;
    memcpy(&r, &b, sizeof r);
    return r;
}

/* a where the mask is all ones, else b */
static inline float pick_@V@(int32_t mask, float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    ia = (ia & mask) | (ib & ~mask);
    float r;
    memcpy(&r, &ia, sizeof r);
    return r;
}

/* the kernel's exp over an array (for the tests) */
void dice_exp_@V@(const float* in, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = exp_neg_@V@(in[i]);
}

static inline double lanesum_@V@(const float* restrict a) {
    float acc[LANES];
    for (int v = 0; v < LANES; ++v) acc[v] = a[v];
    for (int l0 = LANES; l0 < BL; l0 += LANES)
        for (int v = 0; v < LANES; ++v) acc[v] += a[l0 + v];
    double s = 0.0;
    for (int v = 0; v < LANES; ++v) s += acc[v];
    return s;
}

static inline void exp_row_@V@(const float* restrict zc, float* restrict xc, const int32_t* restrict km,
                               const float* restrict m, float* restrict den, float* restrict rest,
                               const int32_t* restrict am, int32_t ci) {
    for (int l = 0; l < BL; ++l) {
        float e = exp_neg_@V@(keep_@V@(zc[l], km[l]) - m[l]);
        xc[l] = e;
        den[l] += e;
        rest[l] += am[l] == ci ? 0.0f : e;
    }
}

/* one block of BL positions (class c of z at z + c * zs, likewise x and y); adds the block's
   sums to P (C, 3); returns 1 on a non-finite kept logit */
static int fwd_block_@V@(const float* restrict z, int64_t zs, const float* restrict y, int64_t ys,
                         float* restrict x, int64_t xs, const float* restrict kf, const int32_t* restrict km,
                         const int32_t* restrict tt, int64_t C, int sigmoid, int soft_form, double* restrict P) {
    float m[BL], den[BL], rest[BL], inv[BL], comp[BL], ta[BL], ty[BL];
    int32_t am[BL];
    int bad = 0;
    if (!sigmoid) {
        /* m: the max over the classes, am: the first class that reaches it; rest: the sum of
           the other classes' exponentials, so that 1 - x_am = rest / sum e without cancellation
           (1 - x_c of every other class is at least 1/2: no cancellation either) */
        for (int l = 0; l < BL; ++l) { m[l] = -INFINITY; am[l] = 0; den[l] = 0.0f; rest[l] = 0.0f; }
        for (int64_t c = 0; c < C; ++c) {
            const float* restrict zc = z + c * zs;
            const int32_t ci = (int32_t)c;
            int nb = 0; /* (a loop-local flag: an outer one keeps the loop from vectorising) */
            for (int l = 0; l < BL; ++l) {
                float v = keep_@V@(zc[l], km[l]);
                nb |= !(v < INFINITY);
                int32_t gt = -(int32_t)(v > m[l]);
                am[l] = (ci & gt) | (am[l] & ~gt);
                m[l] = v > m[l] ? v : m[l];
            }
            bad |= nb;
        }
        int nb = 0;
        for (int l = 0; l < BL; ++l) nb |= !(m[l] > -INFINITY);
        bad |= nb;
        if (bad) return 1;
        for (int64_t c = 0; c < C; ++c) exp_row_@V@(z + c * zs, x + c * xs, km, m, den, rest, am, (int32_t)c);
        for (int l = 0; l < BL; ++l) { inv[l] = kf[l] / den[l]; rest[l] = rest[l] * inv[l]; }
    }
    for (int64_t c = 0; c < C; ++c) {
        const float* restrict zc = z + c * zs;
        float* restrict xc = x + c * xs;
        const int32_t ci = (int32_t)c;
        if (sigmoid) {
            /* x = sigmoid(z), comp = 1 - x = sigmoid(-z), both from e = exp(-|z|) */
            int32_t flag[BL]; /* (a flag per lane: an OR over the loop kept it from vectorising) */
            for (int l = 0; l < BL; ++l) {
                float v = keep_@V@(zc[l], km[l]);
                flag[l] = !(v < INFINITY);
                float e = exp_neg_@V@(-fabsf(v)), d = 1.0f / (1.0f + e), lo = e * d;
                int32_t pos = -(int32_t)(v >= 0.0f);
                xc[l] = pick_@V@(pos, d, lo) * kf[l];
                comp[l] = pick_@V@(pos, lo, d) * kf[l];
            }
            int nb = 0;
            for (int l = 0; l < BL; ++l) nb |= flag[l];
            bad |= nb;
        } else {
            for (int l = 0; l < BL; ++l) {
                float xv = xc[l] * inv[l];
                xc[l] = xv;
                comp[l] = am[l] == ci ? rest[l] : 1.0f - xv;
            }
        }
        if (y) {
            const float* restrict yc = y + c * ys;
            if (soft_form) { /* x + y - 2xy = y (1 - x) + (1 - y) x */
                for (int l = 0; l < BL; ++l) {
                    float yv = yc[l] * kf[l];
                    ty[l] = yv;
                    ta[l] = yv * comp[l] + (1.0f - yv) * xc[l];
                }
            } else { /* |x - y|, from (1 - y) - (1 - x) where y >= 1/2 (1 - y is exact there) */
                for (int l = 0; l < BL; ++l) {
                    float yv = yc[l] * kf[l];
                    ty[l] = yv;
                    ta[l] = fabsf(yv >= 0.5f ? (1.0f - yv) - comp[l] : xc[l] - yv);
                }
            }
        } else {
            for (int l = 0; l < BL; ++l) {
                int on = tt[l] == ci;
                ty[l] = on ? 1.0f : 0.0f;
                ta[l] = on ? comp[l] : xc[l];
            }
        }
        P[c * 3] += lanesum_@V@(xc);
        P[c * 3 + 1] += lanesum_@V@(ta);
        P[c * 3 + 2] += lanesum_@V@(ty);
    }
    return bad;
}

/* the gradient of one block: u = dL/dx per class and position, then through the activation */
static void bwd_block_@V@(const float* restrict x, int64_t xs, const float* restrict y, int64_t ys,
                          float* restrict dz, int64_t ds, const int32_t* restrict tt, int64_t C,
                          int sigmoid, int soft_form, const float* restrict gx, const float* restrict ga,
                          float* restrict u) {
    float dot[BL];
    for (int l = 0; l < BL; ++l) dot[l] = 0.0f;
    for (int64_t c = 0; c < C; ++c) {
        const float* restrict xc = x + c * xs;
        float* restrict uc = u + c * BL;
        const float off = gx[c] + ga[c], on = gx[c] - ga[c], gac = ga[c], gxc = gx[c];
        const int32_t ci = (int32_t)c;
        if (!y) {
            for (int l = 0; l < BL; ++l) uc[l] = tt[l] == ci ? on : off;
        } else if (soft_form) {
            const float* restrict yc = y + c * ys;
            for (int l = 0; l < BL; ++l) uc[l] = gxc + gac * (1.0f - 2.0f * yc[l]);
        } else {
            const float* restrict yc = y + c * ys;
            for (int l = 0; l < BL; ++l) {
                float d = xc[l] - yc[l];
                uc[l] = gxc + (d > 0.0f ? gac : (d < 0.0f ? -gac : 0.0f));
            }
        }
        if (!sigmoid)
            for (int l = 0; l < BL; ++l) dot[l] += xc[l] * uc[l];
    }
    for (int64_t c = 0; c < C; ++c) {
        const float* restrict xc = x + c * xs;
        const float* restrict uc = u + c * BL;
        float* restrict dc = dz + c * ds;
        if (sigmoid) {
            for (int l = 0; l < BL; ++l) dc[l] = uc[l] * (1.0f - xc[l]) * xc[l];
        } else {
            for (int l = 0; l < BL; ++l) dc[l] = xc[l] * (uc[l] - dot[l]);
        }
    }
}

static void job_@V@(job_t* J) {
    const int64_t C = J->C, S = J->S;
    /* padded copies of a chunk's last, partial block: z (or x), y, x (or dz), and u */
    float* scratch = (float*)malloc(sizeof(float) * (size_t)(4 * C * BL));
    if (!scratch) { J->status = ST_MEMORY; return; }
    float* ipad = scratch; float* ypad = scratch + C * BL; float* opad = scratch + 2 * C * BL;
    float* u = scratch + 3 * C * BL;
    int bad = 0, badid = 0;
    for (int64_t j = J->j0; j < J->jobs && !bad; j += J->jstep) {
        int64_t b = j / J->nchunk, s_begin = (j % J->nchunk) * CHUNK;
        int64_t s_end = s_begin + CHUNK < S ? s_begin + CHUNK : S;
        double* P = J->part ? J->part + j * C * 3 : NULL;
        if (P) for (int64_t i = 0; i < C * 3; ++i) P[i] = 0.0;
        for (int64_t s0 = s_begin; s0 < s_end && !bad; s0 += BL) {
            int64_t n = s_end - s0 < BL ? s_end - s0 : BL;
            const float* ib = J->in + b * C * S + s0; int64_t is = S;
            float* ob = J->out + b * C * S + s0; int64_t os = S;
            const float* yb = J->y ? J->y + b * C * S + s0 : NULL; int64_t ys = S;
            if (n < BL) {
                for (int64_t c = 0; c < C; ++c)
                    for (int l = 0; l < BL; ++l) ipad[c * BL + l] = l < n ? ib[c * S + l] : 0.0f;
                if (yb) {
                    for (int64_t c = 0; c < C; ++c)
                        for (int l = 0; l < BL; ++l) ypad[c * BL + l] = l < n ? yb[c * S + l] : 0.0f;
                    yb = ypad; ys = BL;
                }
                ib = ipad; is = BL; ob = opad; os = BL;
            }
            float kf[BL];
            int32_t km[BL], tt[BL];
            const uint8_t* kp = J->keep ? J->keep + b * S + s0 : NULL;
            const int64_t* ip = J->ids ? J->ids + b * S + s0 : NULL;
            for (int l = 0; l < BL; ++l) kf[l] = l < n ? 1.0f : 0.0f;
            if (kp)
                for (int l = 0; l < n; ++l) kf[l] = kp[l] ? 1.0f : 0.0f;
            for (int l = 0; l < BL; ++l) km[l] = -(int32_t)(kf[l] != 0.0f);
            for (int l = 0; l < BL; ++l) tt[l] = -1;
            if (ip) {
                int nb = 0;
                for (int l = 0; l < n; ++l) {
                    int64_t t = ip[l];
                    int in = t >= 0 && t < C, kept = kf[l] != 0.0f;
                    nb |= kept && !in;
                    tt[l] = kept && in ? (int32_t)t : -1;
                }
                badid |= nb;
            }
            if (P)
                bad = fwd_block_@V@(ib, is, yb, ys, ob, os, kf, km, tt, C, J->sigmoid, J->soft_form, P);
            else
                bwd_block_@V@(ib, is, yb, ys, ob, os, tt, C, J->sigmoid, J->soft_form, J->gx + b * C,
                              J->ga + b * C, u);
            if (n < BL && !bad)
                for (int64_t c = 0; c < C; ++c)
                    for (int64_t l = 0; l < n; ++l) J->out[b * C * S + c * S + s0 + l] = opad[c * BL + l];
        }
    }
    free(scratch);
    J->status = bad ? ST_NONFINITE : (badid ? ST_ID : ST_OK);
}

static void* run_@V@(void* arg) { job_@V@((job_t*)arg); return NULL; }

static int launch_@V@(job_t* base, int threads) {
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    if (threads > base->jobs) threads = (int)(base->jobs > 0 ? base->jobs : 1);
    job_t js[64]; pthread_t tid[64]; int started[64];
    for (int t = 0; t < threads; ++t) { js[t] = *base; js[t].j0 = t; js[t].jstep = threads; started[t] = 0; }
    for (int t = 1; t < threads; ++t) started[t] = pthread_create(&tid[t], NULL, run_@V@, &js[t]) == 0;
    job_@V@(&js[0]);
    for (int t = 1; t < threads; ++t) { if (started[t]) pthread_join(tid[t], NULL); else job_@V@(&js[t]); }
    int status = ST_OK;
    for (int t = 0; t < threads; ++t) if (js[t].status > status) status = js[t].status;
    return status;
}

int dice_forward_@V@(const float* z, const int64_t* ids, const float* y, const uint8_t* keep, int64_t B,
                     int64_t C, int64_t S, int sigmoid, int soft_form, int threads, float* x, double* sums) {
    int64_t nchunk = (S + CHUNK - 1) / CHUNK, jobs = B * nchunk;
    double* part = (double*)malloc(sizeof(double) * (size_t)(jobs * C * 3 > 0 ? jobs * C * 3 : 1));
    if (!part) return ST_MEMORY;
    job_t J = {z, ids, y, keep, C, S, sigmoid, soft_form, x, part, NULL, NULL, 0, 1, jobs, nchunk, 0};
    int status = launch_@V@(&J, threads);
    if (status == ST_OK) {
        for (int64_t i = 0; i < B * C * 3; ++i) sums[i] = 0.0;
        for (int64_t j = 0; j < jobs; ++j) {
            int64_t b = j / nchunk;
            for (int64_t i = 0; i < C * 3; ++i) sums[b * C * 3 + i] += part[j * C * 3 + i];
        }
    }
    free(part);
    return status;
}

int dice_backward_@V@(const float* x, const int64_t* ids, const float* y, const uint8_t* keep, int64_t B,
                      int64_t C, int64_t S, int sigmoid, int soft_form, int threads, const float* gx,
                      const float* ga, float* dz) {
    int64_t nchunk = (S + CHUNK - 1) / CHUNK, jobs = B * nchunk;
    job_t J = {x, ids, y, keep, C, S, sigmoid, soft_form, dz, NULL, gx, ga, 0, 1, jobs, nchunk, 0};
    return launch_@V@(&J, threads);
}
"""

_HEAD = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#define ST_OK 0
#define ST_NONFINITE 1
#define ST_MEMORY 3
#define ST_ID 4
#define BL 64       /* positions per block */
#define LANES 16    /* float accumulators per class within a block */
#define CHUNK 4096  /* positions per job, a multiple of BL: the sums do not depend on the threads */

typedef struct {
    const float* in; const int64_t* ids; const float* y; const uint8_t* keep;
    int64_t C, S; int sigmoid, soft_form;
    float* out; double* part; /* forward: x and the chunks' sums (jobs, C, 3); backward: dz, NULL */
    const float* gx; const float* ga;
    int64_t j0, jstep, jobs, nchunk;
    int status;
} job_t;
"""

_SOURCE = _native.isa_source(_HEAD, _BODY, "dice")

_FLAGS = ["-O3", "-fPIC", "-shared", "-pthread", "-std=c99", "-fno-math-errno", "-fno-trapping-math"]

#: set to False (e.g. by a test) to run the PyTorch path even where the kernel is built
enabled = True

#: the variant in use: "avx512", "avx2" or "base" (set when the library loads)
_variant: str = "base"
_NAMES = _native.ISA_NAMES


def _declare(lib: ctypes.CDLL) -> str:
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    lib.dice_variant.argtypes = []
    lib.dice_variant.restype = i32
    for name in _NAMES:
        fn = getattr(lib, f"dice_forward_{name}", None)
        if fn is None:
            continue
        fn.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, i32, i32, i32, ptr, ptr]
        fn.restype = i32
        fn = getattr(lib, f"dice_backward_{name}")
        fn.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, i32, i32, i32, ptr, ptr, ptr]
        fn.restype = i32
        fn = getattr(lib, f"dice_exp_{name}")
        fn.argtypes = [ptr, ptr, i64]
        fn.restype = None
    global _variant
    _variant = _NAMES[lib.dice_variant()]
    return _variant


_KERNEL = _native.NativeLibrary("dice_stats", _SOURCE, _FLAGS, _declare)


def library() -> Optional[ctypes.CDLL]:
    """The loaded kernel, built on first use; ``None`` where it cannot be (see :func:`available`)."""
    return _KERNEL.load()


def available() -> Tuple[bool, str]:
    """``(True, where (variant))`` when the kernel is built and loaded, else ``(False, why not)``."""
    return library() is not None, _KERNEL.why


def ready() -> bool:
    """Whether the kernel is built and enabled (builds it on the first call)."""
    return enabled and library() is not None


def variant() -> str:
    """The instruction-set variant in use (``"avx512"``, ``"avx2"`` or ``"base"``)."""
    library()
    return _variant


def variants() -> Tuple[str, ...]:
    """Every variant this CPU can run, best first (a test runs them all)."""
    lib = library()
    if lib is None:
        return ()
    return tuple(n for n in reversed(_NAMES[: _NAMES.index(_variant) + 1])
                 if getattr(lib, f"dice_forward_{n}", None) is not None)


def usable(z: Tensor) -> bool:
    """Whether the kernel can take logits ``z (B, C, S)``: on CPU, float32, at least :data:`BLOCK`
    positions per image, and the kernel built and enabled."""
    return (z.device.type == "cpu" and z.dtype == torch.float32 and z.dim() == 3 and z.shape[0] > 0
            and z.shape[1] > 0 and z.shape[2] >= BLOCK and ready())


def _threads(z: Tensor) -> int:
    return max(1, torch.get_num_threads()) if z.numel() >= PARALLEL_MIN else 1


def _ptr(t: Optional[Tensor]):
    return None if t is None else t.data_ptr()


def _labels(ids: Optional[Tensor], y: Optional[Tensor], keep: Optional[Tensor], b: int, c: int, s: int):
    """The labels and keep flags as the kernel reads them: contiguous int64 ids ``(B, S)``, float
    labels ``(B, C, S)``, keep flags ``(B, S)`` uint8 (no copy where they already are)."""
    if ids is not None:
        ids = ids.reshape(b, s).contiguous()
        if ids.dtype != torch.int64:
            ids = ids.long()
    if y is not None:
        y = y.reshape(b, c, s).contiguous()
    flags = None if keep is None else keep.reshape(b, s).contiguous().view(torch.uint8)
    return ids, y, flags


def forward(z: Tensor, ids: Optional[Tensor], y: Optional[Tensor], keep: Optional[Tensor], sigmoid: bool,
            soft_form: bool, which: Optional[str] = None) -> Optional[Tuple[Tensor, Tensor]]:
    """``(x (B, C, S), sums (B, C, 3) float64)`` with ``sums[..., 0] = |x|``, ``[..., 1] = A``,
    ``[..., 2] = |y|`` over the kept positions, or ``None`` when the kernel cannot decide (a
    non-finite kept logit, a kept id out of range). ``ids (B, S)`` integer or ``y (B, C, S)``
    float32 labels (one of them); ``keep (B, S)`` bool or ``None`` (all kept); ``soft_form``: ``A``
    sums ``x + y - 2xy`` (else ``|x - y|``; with ids the two agree). ``which``: a variant (tests)."""
    lib = library()
    z = z.contiguous()
    b, c, s = z.shape
    ids, y, flags = _labels(ids, y, keep, b, c, s)
    x = torch.empty_like(z)
    sums = torch.empty(b, c, 3, dtype=torch.float64)
    fn = getattr(lib, f"dice_forward_{which or _variant}")
    st = fn(z.data_ptr(), _ptr(ids), _ptr(y), _ptr(flags), b, c, s, int(sigmoid), int(soft_form), _threads(z),
            x.data_ptr(), sums.data_ptr())
    if st != 0:
        return None
    return x, sums


def backward(x: Tensor, ids: Optional[Tensor], y: Optional[Tensor], keep: Optional[Tensor], sigmoid: bool,
             soft_form: bool, g_x: Tensor, g_a: Tensor, which: Optional[str] = None) -> Tensor:
    """``dL/dz (B, C, S)`` from the saved ``x`` (0 at dropped positions) and the gradients
    ``g_x, g_a (B, C)`` of ``|x|`` and ``A`` (other arguments as in :func:`forward`)."""
    lib = library()
    b, c, s = x.shape
    ids, y, flags = _labels(ids, y, keep, b, c, s)
    g_x = g_x.to(torch.float32).contiguous()
    g_a = g_a.to(torch.float32).contiguous()
    dz = torch.empty_like(x)
    fn = getattr(lib, f"dice_backward_{which or _variant}")
    st = fn(x.data_ptr(), _ptr(ids), _ptr(y), _ptr(flags), b, c, s, int(sigmoid), int(soft_form), _threads(x),
            g_x.data_ptr(), g_a.data_ptr(), dz.data_ptr())
    if st != 0:  # only a failed allocation can stop the backward (its inputs were checked forward)
        raise MemoryError("dice backward kernel: out of memory")
    return dz


def exp_neg(v: Tensor, which: Optional[str] = None) -> Tensor:
    """The kernel's float ``exp`` applied to a float32 tensor of values ``<= 0`` or ``-inf`` (tests)."""
    lib = library()
    v = v.to(torch.float32).contiguous()
    out = torch.empty_like(v)
    getattr(lib, f"dice_exp_{which or _variant}")(v.data_ptr(), out.data_ptr(), v.numel())
    return out
