"""A small C kernel for the position losses of class ids on the CPU: GOL, the log-Z penalty
(cross-entropy + ``coef * lse^2``), comp-sum and the Z-loss, value and gradient in one call.

Why it exists. In eager PyTorch each of these losses is a chain of operator passes over the
``(M, C)`` logits (GOL about ten, one of them ``tanh``; the softmax losses five or six, plus a
Python autograd Function), and the per-element cost of vectorised transcendentals differs by
processor: on an AMD EPYC one ``torch.tanh`` over 256,000 floats cost about five
``F.cross_entropy`` steps of that size, so GOL took 3.7x ``F.cross_entropy`` at ``(256, 1e3)`` and
the softmax losses 1.3-1.4x there, against their 1.2x-1.5x targets. This kernel makes one to three
passes per row with its own vectorised ``exp`` and ``log`` (polynomials after range reduction, the
same arithmetic on every processor; compiled with ``-ffp-contract=fast``, so the AVX2 and AVX-512
copies evaluate each ``a * b + c`` as one fused multiply-add, one rounding instead of two: about
a quarter of GOL's time on an AMD EPYC, and results that differ from the baseline copy's by float32
rounding only) and writes the gradient for the reduced loss (``scale`` =
1 / the mean's denominator, or 1 for a sum) while it computes the value.

Per kept row ``x`` of a contiguous float32 ``(M, C)`` matrix with id ``y``:

* **GOL** (``kind`` 0; labels ``lab_k = (1 - eps) [k = y] + eps / C``, weights ``w_k``,
  ``q = max(x, -50)``): ``u = exp(-q)``, ``om = 1 - exp(-u)`` (a Taylor polynomial below
  ``u = 0.25``: no cancellation), ``l_k = w_k (lab_k u - (1 - lab_k) log om)`` (``q`` itself above
  ``q = 80``), gradient ``scale w_k ((1 - lab_k) u e^{-u} / om - lab_k u)``, 0 below the -50 floor.
  Without weights the row's value is summed as ``off U + (1 - off) B + (on - off)(u_y - b_y)``
  with ``U = sum_k u_k`` and ``B = sum_k -log om_k``, and ``B`` needs no log per element: each lane
  multiplies its ``om`` values into a mantissa in ``[1, 2)`` and an integer exponent (every
  ``om >= 1.8e-35``, so each product stays a normal float), one float64 log per lane at the end;
  the two exponentials are specialised to their ranges (no clamps where none can act) and, for
  ``u < 0.25``, ``om`` is the exponential polynomial's own ``expm1`` part. On an AMD EPYC at
  ``(256, 1000)`` this path took 327 microseconds against 441 with a log and two general
  exponentials per element, with row sums nearer the float64 value.
* **softmax rows** (``kind`` 1 log-Z penalty with ``coef``; 2 comp-sum with ``tau``): one pass
  for the max, one writing ``e_k = exp(x_k - m)`` and summing it without the target (``so``) and
  with it (``s``), one scaling it into the gradient. ``ce = log1p(so / e_y)`` (exact as
  ``p_y -> 1``; ``lse - x_y`` where ``e_y`` underflows), ``lse = m + log s``; log-Z: ``ce + coef lse^2``, gradient
  ``scale ((1 + 2 coef lse) p - e_y)``; comp-sum: ``expm1((1 - tau) ce) / (1 - tau)`` (``ce`` at
  ``tau = 1``), gradient ``scale exp((1 - tau) ce) (p - e_y)``; at the target ``p_y - 1`` is
  written ``-so / s``. ``-inf`` logits are masks (``exp`` gives 0).
* **Z-loss** (``kind`` 3, ``a``, ``b``, ``eps``): the row mean and the centred variance in two
  passes, ``z = (x_y - mu) / sqrt(v + eps)``, ``softplus(a (b - z)) / a``, and the closed-form
  gradient in a third.

Row scalars are float64; each row's value goes to ``rows[m]`` (float64), ignored rows get 0 and a
zero gradient without being read. A row the kernel does not define the same way as the PyTorch
path (no finite logit, a NaN or ``+inf`` maximum, comp-sum with ``tau < 1`` whose gradient factor
``exp((1 - tau) ce)`` exceeds ``e^80``, e.g. a target whose logit is ``-inf``) makes the call return 2, and the caller runs the PyTorch path for the batch. GCC
compiles the code in AVX-512, AVX2 + FMA and baseline copies
(:func:`losses.kernels._native.isa_source`) and the CPU's best one runs; rows are split over
``torch.get_num_threads()`` POSIX threads on large inputs, each row's results independent of the
thread count. Built on first use like the other C kernels (``losses/kernels/_native.py``;
``LOSSES_NATIVE=0`` switches it off); without it the PyTorch paths give the same values to float32
rounding.
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

KINDS = {"gol": 0, "logz": 1, "comp_sum": 2, "z_loss": 3}

_HEAD = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <pthread.h>

#define LANES 16

typedef struct {
    const float* x; const int64_t* ids; const float* w;
    int64_t C, r0, r1, ignore;
    int kind;
    double p0, p1, p2, scale;
    float* grad; double* rows; float* scratch; /* scratch: C floats of this job's own */
    int status;
} job_t;
"""

_BODY = _native.EXP_C + r"""
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

/* GOL: value (returned) and gradient (*g) of one element at label lab */
static inline float gol_@V@(float x, float lab, float scale, float* g) {
    float q = x < -50.0f ? -50.0f : x;
    float u = exp_@V@(-q);
    float e2 = exp_@V@(-u);
    float t = 1.0f / 5040.0f;
    t = 1.0f / 720.0f - u * t;
    t = 1.0f / 120.0f - u * t;
    t = 1.0f / 24.0f - u * t;
    t = 1.0f / 6.0f - u * t;
    t = 0.5f - u * t;
    t = u * (1.0f - u * t);
    float om = u < 0.25f ? t : 1.0f - e2;
    int32_t far = q > 80.0f;
    float om_safe = far ? 1.0f : om;
    float b = far ? q : -log_@V@(om_safe);
    float r = far ? 1.0f : u * e2 / om_safe;
    float gv = (1.0f - lab) * r - lab * u;
    *g = x >= -50.0f ? scale * gv : 0.0f;
    return lab * u + (1.0f - lab) * b;
}

/* GOL's parts of one element at label 0, without its value's log: u = exp(-qc), om = 1 - exp(-u)
   (returned through *om_out), the gradient factor *r_out = u exp(-u) / om and *extra = q - qc,
   with q = max(x, -50) and qc = min(q, 80): the element's value is b = -log om + extra (above
   q = 80, b = q + u/2 + ... with u < 2e-35, so evaluating at 80 and adding q - 80 is exact in
   float32). Both exponentials are exp_@V@'s arithmetic specialised to their ranges: -qc lies in
   [-80, 50] (no clamp: 2^n stays normal), -u is clamped at -87.34 below (exp(-u) is 0 there,
   as in exp_@V@); for u < 0.25 the reduction is the identity (n = 0) and om is the polynomial's
   own expm1 part, -(r + r^2 P(r)) at r = -u: no cancellation, no second polynomial. */
static inline float gol_parts_@V@(float x, float* om_out, float* r_out, float* extra) {
    const float q = x < -50.0f ? -50.0f : x;
    const float qc = q > 80.0f ? 80.0f : q;
    /* u = exp(-qc) */
    float r;
    const float n = exp_reduce_@V@(-qc, &r);
    const float u = (exp_poly_@V@(r) + 1.0f) * exp2i_@V@(n);
    /* e2 = exp(-u), om = 1 - e2 */
    float r2;
    const float n2 = exp_reduce_@V@(-u < -87.33654f ? -87.33654f : -u, &r2);
    const float em1 = exp_poly_@V@(r2);
    const float e2 = -u < -87.33654f ? 0.0f : (em1 + 1.0f) * exp2i_@V@(n2);
    const float om = u < 0.25f ? -em1 : 1.0f - e2;
    *om_out = om;
    *r_out = u * e2 / om;
    *extra = q - qc;
    return u;
}

static inline double lanesum_@V@(const float* restrict a, int64_t C) {
    float acc[LANES];
    for (int v = 0; v < LANES; ++v) acc[v] = 0.0f;
    int64_t k = 0;
    for (; k + LANES <= C; k += LANES)
        for (int v = 0; v < LANES; ++v) acc[v] += a[k + v];
    double s = 0.0;
    for (; k < C; ++k) s += (double)a[k];
    for (int v = 0; v < LANES; ++v) s += (double)acc[v];
    return s;
}

static inline float lanemax_@V@(const float* restrict a, int64_t C) {
    float acc[LANES];
    for (int v = 0; v < LANES; ++v) acc[v] = -INFINITY;
    int64_t k = 0;
    for (; k + LANES <= C; k += LANES)
        for (int v = 0; v < LANES; ++v) acc[v] = a[k + v] > acc[v] ? a[k + v] : acc[v];
    float m = -INFINITY;
    for (; k < C; ++k) m = a[k] > m ? a[k] : m;
    for (int v = 0; v < LANES; ++v) m = acc[v] > m ? acc[v] : m;
    return m;
}

/* one kept row of GOL */
static double gol_row_@V@(const job_t* j, const float* restrict xr, float* restrict gr, int64_t y) {
    const int64_t C = j->C;
    const float off = (float)j->p0 / (float)C, on = 1.0f - (float)j->p0 + off, scale = (float)j->scale;
    const float* restrict w = j->w;
    float* restrict lr = j->scratch;
    const int32_t yi = (int32_t)y, Ci = (int32_t)C; /* int32 lanes: SSE2 has no 64-bit compare */
    if (w) {
        for (int32_t k = 0; k < Ci; ++k) {
            float gk;
            const float lk = gol_@V@(xr[k], k == yi ? on : off, scale, &gk);
            gr[k] = gk * w[k];
            lr[k] = lk * w[k];
        }
        return lanesum_@V@(lr, C);
    }
    /* no weights: sum_k l_k = off U + (1 - off) B + (on - off)(u_y - b_y), U = sum_k u_k, B = sum_k b_k,
       and B without a log per element: sum_k -log om_k = -log prod_k om_k, the product kept per lane
       as a mantissa in [1, 2) and an integer exponent (om >= 1.8e-35: each step stays normal) */
    float pm[LANES], pu[LANES], px[LANES];
    int32_t pe[LANES];
    for (int v = 0; v < LANES; ++v) { pm[v] = 1.0f; pu[v] = 0.0f; px[v] = 0.0f; pe[v] = 0; }
    const float goff = scale * (1.0f - off), uoff = scale * off;
    int64_t k = 0;
    for (; k + LANES <= C; k += LANES) {
        for (int v = 0; v < LANES; ++v) {
            float om, r, e;
            const float xk = xr[k + v];
            const float u = gol_parts_@V@(xk, &om, &r, &e);
            gr[k + v] = xk >= -50.0f ? goff * r - uoff * u : 0.0f;
            float pr = pm[v] * om;
            int32_t bits;
            memcpy(&bits, &pr, sizeof bits);
            pe[v] += (bits >> 23) - 127;
            bits = (bits & 0x007fffff) | 0x3f800000;
            memcpy(&pm[v], &bits, sizeof bits);
            pu[v] += u;
            px[v] += e;
        }
    }
    double B = 0.0, U = 0.0;
    for (; k < C; ++k) {
        float om, r, e;
        const float u = gol_parts_@V@(xr[k], &om, &r, &e);
        gr[k] = xr[k] >= -50.0f ? goff * r - uoff * u : 0.0f;
        B += (double)e - log((double)om);
        U += (double)u;
    }
    for (int v = 0; v < LANES; ++v) {
        B += (double)px[v] - (log((double)pm[v]) + (double)pe[v] * 0.69314718055994530942);
        U += (double)pu[v];
    }
    /* the target's label is on, not off */
    float omy, ry, ey;
    const float uy = gol_parts_@V@(xr[y], &omy, &ry, &ey);
    const double by = (double)ey - log((double)omy);
    gr[y] = xr[y] >= -50.0f ? scale * ((1.0f - on) * ry - on * uy) : 0.0f;
    return (double)off * U + (1.0 - (double)off) * B + ((double)on - (double)off) * ((double)uy - by);
}

/* one kept row of the log-Z penalty or comp-sum; returns NAN to hand the batch back */
static double softmax_row_@V@(const job_t* j, const float* restrict xr, float* restrict gr, int64_t y) {
    const int64_t C = j->C;
    const float m = lanemax_@V@(xr, C);
    if (!(m > -INFINITY) || !(m < INFINITY)) return NAN; /* no finite logit, NaN or +inf */
    for (int64_t k = 0; k < C; ++k) gr[k] = exp_@V@(xr[k] - m);
    const double ey = (double)gr[y];
    gr[y] = 0.0f;
    const double so = lanesum_@V@(gr, C), s = so + ey;
    const double lse = (double)m + log(s);
    /* ce = log(1 + so / e_y): exact as p_y -> 1; lse - x_y where e_y underflowed (p_y < 1e-30:
       no cancellation there), +inf for a target whose logit is -inf */
    const double ce = ey > 1e-30 ? log1p(so / ey) : lse - (double)xr[y];
    double value, fac, extra = 0.0;
    if (j->kind == 1) {
        value = ce + j->p0 * lse * lse;
        fac = 1.0;
        extra = 2.0 * j->p0 * lse;
    } else if (j->p0 == 1.0) {
        value = ce;
        fac = 1.0;
    } else {
        const double r = (1.0 - j->p0) * ce;
        /* tau < 1 and a factor exp(r) near the float32 range (a masked target, extreme logits):
           the PyTorch path's log-space arithmetic defines the +-inf entries */
        if (r > 80.0) return NAN;
        value = expm1(r) / (1.0 - j->p0);
        fac = exp(r);
    }
    const double inv = j->scale / s;
    const float cn = (float)((fac + extra) * inv);
    for (int64_t k = 0; k < C; ++k) gr[k] *= cn;
    gr[y] = (float)((extra * ey - fac * so) * inv);
    return value;
}

/* one kept row of the Z-loss */
static double zloss_row_@V@(const job_t* j, const float* restrict xr, float* restrict gr, int64_t y) {
    const int64_t C = j->C;
    const double mu = lanesum_@V@(xr, C) / (double)C;
    const float muf = (float)mu;
    float* restrict d = j->scratch;
    for (int64_t k = 0; k < C; ++k) {
        const float dk = xr[k] - muf;
        d[k] = dk * dk;
    }
    const double v = lanesum_@V@(d, C) / (double)C;
    const double sigma = sqrt(v + j->p2);
    const double z = ((double)xr[y] - mu) / sigma;
    const double t = j->p0 * (j->p1 - z);
    const double sp = t > 0.0 ? t + log1p(exp(-t)) : log1p(exp(t));
    const double sg = t >= 0.0 ? 1.0 / (1.0 + exp(-t)) : exp(t) / (1.0 + exp(t));
    const double gs = j->scale * sg;
    const float coef = (float)(gs * z / ((double)C * sigma * sigma));
    const float off = (float)(gs / ((double)C * sigma));
    for (int64_t k = 0; k < C; ++k) gr[k] = coef * (xr[k] - muf) + off;
    gr[y] -= (float)(gs / sigma);
    return sp / j->p0;
}

static void rows_@V@(job_t* j) {
    const int64_t C = j->C;
    for (int64_t m = j->r0; m < j->r1; ++m) {
        const int64_t y = j->ids[m];
        float* restrict gr = j->grad + m * C;
        const float* restrict xr = j->x + m * C;
        if (y == j->ignore) {
            memset(gr, 0, (size_t)C * sizeof(float));
            j->rows[m] = 0.0;
            continue;
        }
        double value;
        if (j->kind == 0) value = gol_row_@V@(j, xr, gr, y);
        else if (j->kind == 3) value = zloss_row_@V@(j, xr, gr, y);
        else value = softmax_row_@V@(j, xr, gr, y);
        if (isnan(value) && j->kind != 0) { j->status = 2; return; }
        j->rows[m] = value;
    }
}

static void* run_@V@(void* p) {
    rows_@V@((job_t*)p);
    return NULL;
}

/* rows[m] and the gradient grad (M, C) of the reduced loss (see the module docstring); w: the
   (C,) weights of GOL or NULL, scratch: threads x C floats. Returns 0, 2 to hand the batch
   back to the PyTorch path, or 1 when a thread could not start (its rows done in this thread). */
int rows_forward_@V@(const float* x, const int64_t* ids, const float* w, int64_t M, int64_t C, int64_t ignore,
                     int kind, double p0, double p1, double p2, double scale, float* grad, double* rows,
                     float* scratch, int threads) {
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    if (threads > M) threads = (int)(M > 0 ? M : 1);
    job_t jobs[64];
    pthread_t tid[64];
    int started[64];
    for (int t = 0; t < threads; ++t) {
        job_t jb = {x, ids, w, C, M * t / threads, M * (t + 1) / threads, ignore, kind, p0, p1, p2, scale,
                    grad, rows, scratch + (size_t)t * (size_t)C, 0};
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
    for (int t = 0; t < threads; ++t)
        if (jobs[t].status == 2) return 2;
    return status;
}

void rows_exp_@V@(const float* in, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = exp_@V@(in[i]);
}

void rows_log_@V@(const float* in, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = log_@V@(in[i]);
}
"""

_SOURCE = _native.isa_source(_HEAD, _BODY, "rows")

#: ``-std=c99`` alone would switch contraction off (ISO C mode): ``-ffp-contract=fast`` turns it back on
_FLAGS = ["-O3", "-fPIC", "-shared", "-pthread", "-std=c99", "-fno-math-errno", "-fno-trapping-math",
          "-ffp-contract=fast"]

#: set to False (e.g. by a test) to run the PyTorch paths even where the kernel is built
enabled = True

_variant: str = "base"


def _declare(lib: ctypes.CDLL) -> str:
    i64, i32, ptr, f64 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_double
    lib.rows_variant.argtypes = []
    lib.rows_variant.restype = i32
    for name in _native.ISA_NAMES:
        fn = getattr(lib, f"rows_forward_{name}", None)
        if fn is None:
            continue
        fn.argtypes = [ptr, ptr, ptr, i64, i64, i64, i32, f64, f64, f64, f64, ptr, ptr, ptr, i32]
        fn.restype = i32
        for aux in ("exp", "log"):
            f = getattr(lib, f"rows_{aux}_{name}")
            f.argtypes = [ptr, ptr, i64]
            f.restype = None
    global _variant
    _variant = _native.ISA_NAMES[lib.rows_variant()]
    return _variant


_KERNEL = _native.NativeLibrary("loss_rows", _SOURCE, _FLAGS, _declare)


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
                 if getattr(lib, f"rows_forward_{n}", None) is not None)


def usable(x: Tensor) -> bool:
    """Whether the kernel can take the logits ``x``: a CPU float32 ``(M, C)`` matrix, outside
    ``torch.compile``, the kernel built and enabled."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 2:
        return False
    try:
        if torch.compiler.is_compiling():
            return False
    except AttributeError:  # pragma: no cover - very old torch
        pass
    return ready()


def forward(kind: str, x: Tensor, ids: Tensor, scale: float, *, weight: Optional[Tensor] = None,
            params: Tuple[float, float, float] = (0.0, 0.0, 0.0), ignore_index: int = -100,
            which: Optional[str] = None) -> Optional[Tuple[Tensor, Tensor]]:
    """``(rows (M,) float64, grad (M, C) float32)``: each kept row's loss and the reduced loss's
    gradient times ``scale``, or ``None`` where a row needs the PyTorch path. ``params``: GOL
    ``(eps,)``, log-Z ``(coef,)``, comp-sum ``(tau,)``, Z-loss ``(a, b, eps)``. ``which`` forces a
    variant (tests)."""
    lib = library()
    assert lib is not None
    x = x.contiguous()
    ids = ids.to(torch.int64).contiguous()
    m, c = x.shape
    w = None if weight is None else weight.to(torch.float32).contiguous()
    grad = torch.empty_like(x)
    rows = torch.empty(m, dtype=torch.float64)
    threads = max(1, min(64, torch.get_num_threads())) if x.numel() >= PARALLEL_MIN else 1
    scratch = torch.empty(threads * c, dtype=torch.float32)
    p = tuple(float(v) for v in params) + (0.0,) * (3 - len(params))
    status = getattr(lib, f"rows_forward_{which or _variant}")(
        x.data_ptr(), ids.data_ptr(), None if w is None else w.data_ptr(), m, c, int(ignore_index), KINDS[kind], p[0], p[1], p[2],
        float(scale), grad.data_ptr(), rows.data_ptr(), scratch.data_ptr(), threads)
    return None if status == 2 else (rows, grad)


def unary(name: str, v: Tensor, which: Optional[str] = None) -> Tensor:
    """The kernel's own ``exp`` or ``log`` over a float32 tensor (tests)."""
    lib = library()
    assert lib is not None
    v = v.to(torch.float32).contiguous()
    out = torch.empty_like(v)
    getattr(lib, f"rows_{name}_{which or _variant}")(v.data_ptr(), out.data_ptr(), v.numel())
    return out


class KernelFunction(torch.autograd.Function):
    """A loss through the kernel: the forward writes the gradient for an incoming gradient of 1
    (the reduction's scale folded in), the backward scales it: by the scalar incoming gradient of a
    mean or sum (not at all for ``loss.backward()``'s seed of 1), row by row for ``"none"``. A second
    backward through a retained graph runs the kernel again. Use :func:`run`."""

    @staticmethod
    def forward(ctx, x, ids, weight, kind, params, ignore_index, scale, per_row, rows, grad, grad_mode):  # type: ignore[override]
        ctx.save_for_backward(x, ids, weight)
        ctx.opts = (kind, params, ignore_index, scale, per_row)
        ctx.grad = grad if grad_mode and ctx.needs_input_grad[0] else None
        if per_row:
            return rows.to(x.dtype)
        return (rows.sum() * scale).to(x.dtype)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        grad, ctx.grad = ctx.grad, None
        kind, params, ignore_index, scale, per_row = ctx.opts
        if grad is None:
            x, ids, weight = ctx.saved_tensors
            grad = forward(kind, x, ids, scale, weight=weight, params=params, ignore_index=ignore_index)[1]
        if per_row:
            grad = grad.mul_(g.reshape(-1, 1))
        elif g.item() != 1.0:
            grad = grad.mul_(g)
        return grad, None, None, None, None, None, None, None, None, None, None


def run(kind: str, x: Tensor, ids: Tensor, reduction: str, *, weight: Optional[Tensor] = None,
        params: Tuple[float, ...] = (), ignore_index: int = -100, units_per_row: int = 1) -> Optional[Tensor]:
    """The loss ``kind`` of ``x (M, C)`` through the kernel, differentiable in ``x``: per row
    (``"none"``, float32 ``(M,)``, 0 on ignored rows; not for GOL, whose unit is the element), or
    the ``"mean"`` (over the kept rows times ``units_per_row``) or ``"sum"``; ``None`` where the
    kernel hands the batch back (the caller then runs its PyTorch path)."""
    per_row = reduction == "none"
    if per_row and kind == "gol":
        raise ValueError("rows_native.run: GOL's per-element values are not per-row losses")
    scale = 1.0
    if reduction == "mean":
        kept = int((ids != ignore_index).sum()) * units_per_row
        scale = 1.0 / kept if kept > 0 else 1.0
    done = forward(kind, x, ids, scale, weight=weight, params=params, ignore_index=ignore_index)
    if done is None:
        return None
    rows, grad = done
    return KernelFunction.apply(x, ids, weight, kind, params, ignore_index, scale, per_row, rows, grad,
                                torch.is_grad_enabled())
