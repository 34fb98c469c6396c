"""A small C kernel for GOL (the Gumbel binary cross-entropy) of class ids on the CPU.

Why it exists. GOL's value and gradient per element need ``u = exp(-q)``, ``-log(1 - exp(-u))``
and ``u / expm1(u)``. In eager PyTorch that is about ten operator passes over the ``(M, C)``
logits, among them ``tanh`` (or ``expm1`` / ``log1p``), whose vectorised cost differs by processor:
on an AMD EPYC one ``torch.tanh`` over 256,000 floats cost about five ``F.cross_entropy`` steps of
the same size, and GOL at ``(256, 1e3)`` took 3.7x ``F.cross_entropy``. This kernel computes value
and gradient in one pass with its own vectorised ``exp`` and ``log`` (polynomials after range
reduction, the same on every processor), and never builds the one-hot labels.

What it computes, per kept row of a contiguous float32 ``(M, C)`` matrix with ids ``y`` (labels
``lab_k = (1 - eps) [k = y] + eps / C``, weights ``w_k``, ``q = max(x, -50)``)::

    u = exp(-q);  om = 1 - exp(-u)  (a Taylor polynomial below u = 0.5: no cancellation)
    l_k = w_k (lab_k u + (1 - lab_k) b),  b = -log(om)   (b = q above q = 80, where u underflows)
    g_k = scale w_k ((1 - lab_k) r - lab_k u),  r = u exp(-u) / om   (r = 1 above q = 80)

and ``g_k = 0`` below the -50 floor; each row's ``sum_k l_k`` (float lanes, then float64) goes to
``rows[m]``; ignored rows get 0 and a zero gradient without being read. The ``exp`` is the Dice
kernel's (Cody-Waite reduction, degree-6 polynomial, under one float spacing); ``log`` is
``k ln 2 + 2 atanh(s)`` with ``s = (m - 1)/(m + 1)`` on the mantissa ``m`` in ``[0.71, 1.41)``
(a degree-9 odd series, error below 1e-9 relative). GCC compiles the loop in AVX-512, AVX2 + FMA
and baseline copies (:func:`losses.kernels._native.isa_source`) and the CPU's best one runs. Rows
are split over ``torch.get_num_threads()`` POSIX threads when the matrix is large; each row's sum
is the same for any thread count.

Built on first use like the other C kernels (``losses/kernels/_native.py``; ``LOSSES_NATIVE=0``
switches it off); without it the PyTorch path gives the same values to float32 rounding.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _native

__all__: list = []

#: elements above which the rows are split over ``torch.get_num_threads()`` threads
PARALLEL_MIN = 1 << 18

_HEAD = r"""
#include <stdint.h>
#include <string.h>
#include <pthread.h>

#define LANES 16

typedef struct {
    const float* x; const int64_t* ids; const float* w;
    int64_t C, r0, r1, ignore;
    float eps, scale;
    float* grad; double* rows; float* scratch; /* scratch: C floats of this job's own */
} job_t;
"""

_BODY = r"""
static inline float exp_@V@(float v) {
    float w = v < -87.33654f ? -87.33654f : (v > 88.0f ? 88.0f : v);
    float n = (w * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* nearest integer */
    float r = w - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    p = p * scale;
    return v < -87.33654f ? 0.0f : p;
}

/* log of a positive normal float: k ln 2 + 2 atanh((m - 1)/(m + 1)), m in [0.71, 1.41) */
static inline float log_@V@(float x) {
    int32_t bits;
    memcpy(&bits, &x, sizeof bits);
    int32_t k = ((bits >> 23) & 0xff) - 127;
    int32_t mb = (bits & 0x007fffff) | 0x3f800000;
    float m;
    memcpy(&m, &mb, sizeof m);
    int32_t big = m > 1.41421356f;
    m = big ? 0.5f * m : m;
    float kf = (float)(k + big);
    float s = (m - 1.0f) / (m + 1.0f);
    float s2 = s * s;
    float p = 0.22222222f;
    p = p * s2 + 0.28571429f;
    p = p * s2 + 0.4f;
    p = p * s2 + 0.66666667f;
    p = p * s2 + 2.0f;
    return kf * 0.693359375f + (kf * -2.12194440e-4f + s * p);
}

/* value (returned) and gradient (*g) of one element at label lab */
static inline float gol_@V@(float x, float lab, float scale, float* g) {
    float q = x < -50.0f ? -50.0f : x;
    float u = exp_@V@(-q);
    float e2 = exp_@V@(-u);
    float t = 1.0f / 40320.0f;
    t = 1.0f / 5040.0f - u * t;
    t = 1.0f / 720.0f - u * t;
    t = 1.0f / 120.0f - u * t;
    t = 1.0f / 24.0f - u * t;
    t = 1.0f / 6.0f - u * t;
    t = 0.5f - u * t;
    t = u * (1.0f - u * t);
    float om = u < 0.5f ? t : 1.0f - e2;
    int32_t far = q > 80.0f;
    float om_safe = far ? 1.0f : om;
    float b = far ? q : -log_@V@(om_safe);
    float r = far ? 1.0f : u * e2 / om_safe;
    float gv = (1.0f - lab) * r - lab * u;
    *g = x >= -50.0f ? scale * gv : 0.0f;
    return lab * u + (1.0f - lab) * b;
}

static void rows_@V@(const job_t* j) {
    const int64_t C = j->C;
    const float off = j->eps / (float)C, on = 1.0f - j->eps + off, scale = j->scale;
    const float* restrict w = j->w;
    float* restrict lr = j->scratch;
    for (int64_t m = j->r0; m < j->r1; ++m) {
        const int64_t y = j->ids[m];
        float* restrict gr = j->grad + m * C;
        if (y == j->ignore) {
            memset(gr, 0, (size_t)C * sizeof(float));
            j->rows[m] = 0.0;
            continue;
        }
        const float* restrict xr = j->x + m * C;
        const int32_t yi = (int32_t)y, Ci = (int32_t)C; /* int32 lanes: SSE2 has no 64-bit compare */
        for (int32_t k = 0; k < Ci; ++k) {  /* one vectorised pass: gradient and element values */
            float gk;
            const float lk = gol_@V@(xr[k], k == yi ? on : off, scale, &gk);
            gr[k] = gk * w[k];
            lr[k] = lk * w[k];
        }
        float acc[LANES];
        for (int v = 0; v < LANES; ++v) acc[v] = 0.0f;
        int64_t k = 0;
        for (; k + LANES <= C; k += LANES)
            for (int v = 0; v < LANES; ++v) acc[v] += lr[k + v];
        double s = 0.0;
        for (; k < C; ++k) s += (double)lr[k];
        for (int v = 0; v < LANES; ++v) s += (double)acc[v];
        j->rows[m] = s;
    }
}

static void* run_@V@(void* p) {
    rows_@V@((const job_t*)p);
    return NULL;
}

/* rows[m] = sum_k l_mk and grad = g (M, C), w the (C,) weights (ones without), scratch threads x C
   floats; returns 0, or 1 when a thread could not start (its rows are then done in this thread) */
int gol_forward_@V@(const float* x, const int64_t* ids, const float* w, int64_t M, int64_t C, int64_t ignore,
                     float eps, float scale, float* grad, double* rows, float* scratch, int threads) {
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    if (threads > M) threads = (int)(M > 0 ? M : 1);
    job_t jobs[64];
    pthread_t tid[64];
    int started[64];
    for (int t = 0; t < threads; ++t) {
        job_t jb = {x, ids, w, C, M * t / threads, M * (t + 1) / threads, ignore, eps, scale, grad, rows,
                    scratch + (size_t)t * (size_t)C};
        jobs[t] = jb;
        started[t] = 0;
    }
    for (int t = 1; t < threads; ++t) started[t] = pthread_create(&tid[t], NULL, run_@V@, &jobs[t]) == 0;
    rows_@V@(&jobs[0]);
    int status = 0;
    for (int t = 1; t < threads; ++t) {
        if (started[t]) pthread_join(tid[t], NULL);
        else { rows_@V@(&jobs[t]); status = 1; }
    }
    return status;
}

void gol_exp_@V@(const float* in, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = exp_@V@(in[i]);
}

void gol_log_@V@(const float* in, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = log_@V@(in[i]);
}
"""

_SOURCE = _native.isa_source(_HEAD, _BODY, "gol")

_FLAGS = ["-O3", "-fPIC", "-shared", "-pthread", "-std=c99", "-fno-math-errno", "-fno-trapping-math"]

#: set to False (e.g. by a test) to run the PyTorch path even where the kernel is built
enabled = True

_variant: str = "base"


def _declare(lib: ctypes.CDLL) -> str:
    i64, i32, ptr, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
    lib.gol_variant.argtypes = []
    lib.gol_variant.restype = i32
    for name in _native.ISA_NAMES:
        fn = getattr(lib, f"gol_forward_{name}", None)
        if fn is None:
            continue
        fn.argtypes = [ptr, ptr, ptr, i64, i64, i64, f32, f32, ptr, ptr, ptr, i32]
        fn.restype = i32
        for aux in ("exp", "log"):
            f = getattr(lib, f"gol_{aux}_{name}")
            f.argtypes = [ptr, ptr, i64]
            f.restype = None
    global _variant
    _variant = _native.ISA_NAMES[lib.gol_variant()]
    return _variant


_KERNEL = _native.NativeLibrary("gol_elementwise", _SOURCE, _FLAGS, _declare)


def library() -> Optional[ctypes.CDLL]:
    """The loaded kernel, built on first use; ``None`` where it cannot be (see :func:`available`)."""
    return _KERNEL.load()


def available() -> Tuple[bool, str]:
    """``(True, where (variant))`` when the kernel is built and loaded, else ``(False, why not)``."""
    return library() is not None, _KERNEL.why


def ready() -> bool:
    """Whether the kernel is built and enabled (builds it on the first call)."""
    return enabled and library() is not None


def variants() -> Tuple[str, ...]:
    """Every variant this CPU can run, best first (a test runs them all)."""
    lib = library()
    if lib is None:
        return ()
    names = _native.ISA_NAMES
    return tuple(n for n in reversed(names[: names.index(_variant) + 1])
                 if getattr(lib, f"gol_forward_{n}", None) is not None)


def usable(x: Tensor) -> bool:
    """Whether the kernel can take the logits ``x``: a CPU float32 ``(M, C)`` matrix, kernel built
    and enabled."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and ready()


def forward(x: Tensor, ids: Tensor, weight: Optional[Tensor], eps: float, ignore_index: int, scale: float,
            which: Optional[str] = None) -> Tuple[Tensor, Tensor]:
    """``(rows (M,) float64, grad (M, C) float32)``: each kept row's summed loss and the gradient
    times ``scale`` (see the module docstring). ``which`` forces a variant (tests)."""
    lib = library()
    assert lib is not None
    x = x.contiguous()
    ids = ids.to(torch.int64).contiguous()
    m, c = x.shape
    w = torch.ones(c, dtype=torch.float32) if weight is None else weight.to(torch.float32).contiguous()
    grad = torch.empty_like(x)
    rows = torch.empty(m, dtype=torch.float64)
    threads = max(1, min(64, torch.get_num_threads())) if x.numel() >= PARALLEL_MIN else 1
    scratch = torch.empty(threads * c, dtype=torch.float32)
    fn = getattr(lib, f"gol_forward_{which or _variant}")
    fn(x.data_ptr(), ids.data_ptr(), w.data_ptr(), m, c, int(ignore_index), float(eps), float(scale),
       grad.data_ptr(), rows.data_ptr(), scratch.data_ptr(), threads)
    return rows, grad


def unary(name: str, v: Tensor, which: Optional[str] = None) -> Tensor:
    """The kernel's own ``exp`` or ``log`` over a float32 tensor (tests)."""
    lib = library()
    assert lib is not None
    v = v.to(torch.float32).contiguous()
    out = torch.empty_like(v)
    getattr(lib, f"gol_{name}_{which or _variant}")(v.data_ptr(), out.data_ptr(), v.numel())
    return out
