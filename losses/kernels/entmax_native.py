"""A small C kernel for the exact sparsemax / entmax-1.5 threshold on CPU rows.

Why it exists. On CPU the exact threshold of a mid-width row (``C`` up to a few thousand) is found
by a sort-free Newton search (:func:`losses.classification._entmax_ops._threshold_dense`). In eager
PyTorch every step of that search is a handful of operator calls on ``(M, 1)`` to ``(M, 128)``
tensors, each with a fixed cost of a few microseconds, and the number of steps is set by the
slowest row of the batch: at ``(256, 1e3)`` those calls, not the arithmetic, cost about as much as
the whole of an ``F.cross_entropy`` step. A per-row search in C touches each score two or three
times and makes no operator calls.

What it computes, per row ``z`` of a contiguous float32 / float64 ``(M, C)`` matrix (all arithmetic
in float64):

1. ``m = max_j z_j`` (``0`` for a row without a finite score: ``-inf`` entries are masks);
2. the candidates ``x_j = s (z_j - m) > -1`` (``s = 1`` for sparsemax, ``1/2`` for entmax-1.5):
   the threshold lies in ``[-1, 0]``, so the support is among them;
3. the exact threshold ``tau`` of the candidates:

   - sparsemax: Michelot's algorithm. ``tau_K = (sum_K x - 1)/|K|`` of a set ``K`` that holds the
     support is at most the threshold, so the entries ``x <= tau_K`` are outside the support and
     leave ``K``; when none leaves, ``tau_K`` is the threshold (the sort formula on the support).
   - entmax-1.5 (``sum_j [x_j - tau]_+^2 = 1``): Newton's method from the left, from ``tau = -1``
     (the function is convex and decreasing, so the steps stay at most the threshold and
     ``K = {x > tau}`` always holds the support). At each step the closed form of ``K`` alone, the
     root ``tau_K`` of ``sum_K (x - t)^2 = 1`` below ``mean_K x``, is checked: if no entry of ``K``
     lies below ``tau_K``, ``K`` is the support and ``tau_K`` the threshold (when ``K`` holds
     entries outside the support, ``tau_K`` is above some of them, so the check cannot pass
     early).

4. one pass that writes ``d = [x - tau]_+`` (or, for the fused loss below, the gradient) and the
   sums ``sum d``, ``sum d^2``, ``sum d^3`` and the support size.

The fused entry point also takes class ids and writes the Fenchel-Young loss's whole gradient
``(p* - onehot(y)) * scale`` and the per-row losses ``max(omega - (z_y - m), 0)`` with
``omega = (tau sum p + 1) + (sum p^2 - 1)/2`` (sparsemax, ``p = d``) or
``2 (tau sum p + 1) + 2/3 (sum p^1.5 - 1)`` (entmax-1.5, ``p = d^2``), the formulas of
:func:`losses.classification._entmax_ops._fy_dense_ids`.

A row holding NaN or ``+inf``, an id out of range or a search that has not ended after
:data:`MAX_STEPS` steps makes the call return a status instead: the caller then runs the PyTorch
search, which gives the same result (or raises the same error) as without this kernel. Rows are
split over ``torch.get_num_threads()`` POSIX threads when the batch is large enough to pay for
them (:data:`PARALLEL_MIN`).

Building (shared with the Dice kernel: ``losses/kernels/_native.py``). The first use compiles the C source below with the system's C compiler (``$CC``, else
``cc``, ``gcc`` or ``clang``; about a second) into ``$LOSSES_CACHE_DIR/kernels`` (default
``~/.cache/softmax-losses/kernels``), under a name that hashes the source, the compiler's flags and
the machine, written atomically so that concurrent processes can build at once (a C++ driver such
as ``g++``, the compiler ``torch.compile`` needs on CPU, is used as a C compiler where no C one is
found). Without a compiler, off Linux / macOS, or with ``LOSSES_NATIVE=0`` in the environment, nothing is built and
the PyTorch search runs (the same values, checked by the tests). :func:`available` says which.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _native

__all__: list = []

#: steps of the threshold search per row before the call gives up (typical rows need 1-8)
MAX_STEPS = 200

#: rows x columns above which the rows are split over ``torch.get_num_threads()`` threads
PARALLEL_MIN = 1 << 18

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>

#define ST_OK 0
#define ST_NONFINITE 1
#define ST_STEPS 2
#define ST_MEMORY 3
#define ST_ID 4

/* exact threshold of the candidates buf[0..*kp) (x > -1, max 0); returns ST_OK and tau, and
   leaves in buf[0..*kp) the last set searched, which holds the support */
static int search(double* buf, int64_t* kp, int entmax, int max_steps, double* tau_out) {
    int64_t k = *kp;
    double tau = -1.0;
    for (int step = 0; step < max_steps; ++step) {
        int64_t n = 0;
        double s1 = 0.0, s2 = 0.0, mn = INFINITY;
        /* branch-free compaction: the set's entries sit at random places in the row */
        for (int64_t i = 0; i < k; ++i) {
            double x = buf[i];
            int in = x > tau;
            double d = in ? x - tau : 0.0, xm = in ? x : INFINITY;
            buf[n] = x;
            n += in;
            s1 += d;
            s2 += d * d;
            mn = xm < mn ? xm : mn;
        }
        k = n;
        *kp = n;
        if (n == 0) { *tau_out = tau; return ST_STEPS; }  /* cannot happen: the max is 0 > tau */
        if (!entmax) {
            double t = tau + (s1 - 1.0) / (double)n;  /* (sum_K x - 1)/|K| */
            if (mn >= t) { *tau_out = t; return ST_OK; }
            tau = t;
        } else {
            double disc = s1 * s1 - (double)n * (s2 - 1.0);
            if (disc < 0.0) disc = 0.0;
            double t = tau + (s1 - sqrt(disc)) / (double)n;  /* closed form of K alone */
            if (mn >= t) { *tau_out = t; return ST_OK; }
            double nt = tau + 0.5 * (s2 - 1.0) / s1;  /* Newton from the left */
            if (!(nt > tau)) {
                /* stalled by rounding: the entries of K below t are within rounding of the
                   threshold; the next pass leaves them out (some lies in (tau, t) since mn < t) */
                double b = tau;
                for (int64_t i = 0; i < k; ++i) if (buf[i] < t && buf[i] > b) b = buf[i];
                nt = b;
            }
            tau = nt;
        }
    }
    return ST_STEPS;
}

#define DEFINE(SUFFIX, T)                                                                          \
/* one row with its max m (NaN if the row holds one): tau and the sums over the support */        \
static int row_threshold_##SUFFIX(const T* z, int64_t c, double m, int entmax, double* buf,        \
                                  int max_steps, double* tau_out, double* sums) {                 \
    double scale = entmax ? 0.5 : 1.0;                                                             \
    sums[0] = sums[1] = sums[2] = sums[3] = 0.0;                                                   \
    if (m != m || m == INFINITY) return ST_NONFINITE;                                              \
    if (m == -INFINITY) { *tau_out = -1.0; return ST_OK; } /* no finite score: empty support */   \
    T lim = (T)(m - 1.0 / scale); /* candidates x = scale (z - m) > -1 (and a rounding more) */   \
    int64_t k = 0;                                                                                 \
    /* blocks of 16 scores: one test whether any is a candidate (most blocks of a wide row hold  \
       none), then a branch-free store of the block's candidates */                               \
    int64_t j = 0;                                                                                 \
    for (; j + 16 <= c; j += 16) {                                                                 \
        int any = 0;                                                                               \
        for (int t = 0; t < 16; ++t) any |= z[j + t] >= lim;                                       \
        if (!any) continue;                                                                        \
        for (int t = 0; t < 16; ++t) {                                                             \
            buf[k] = ((double)z[j + t] - m) * scale;                                               \
            k += z[j + t] >= lim;                                                                  \
        }                                                                                          \
    }                                                                                              \
    for (; j < c; ++j) {                                                                           \
        buf[k] = ((double)z[j] - m) * scale;                                                       \
        k += z[j] >= lim;                                                                          \
    }                                                                                              \
    double tau;                                                                                    \
    int st = search(buf, &k, entmax, max_steps, &tau);                                              \
    if (st != ST_OK) return st;                                                                    \
    for (int64_t i = 0; i < k; ++i) {                                                              \
        double d = buf[i] - tau;                                                                   \
        int in = d > 0.0;                                                                          \
        d = in ? d : 0.0;                                                                          \
        sums[0] += d; sums[1] += d * d; sums[2] += d * d * d; sums[3] += in;                       \
    }                                                                                              \
    *tau_out = tau;                                                                                \
    return ST_OK;                                                                                  \
}                                                                                                  \
                                                                                                   \
typedef struct {                                                                                   \
    const T* z; const T* mrow; int64_t r0, r1, c; int entmax, max_steps;                           \
    const int64_t* ids; double gscale; /* ids != NULL: fused loss and gradient */                 \
    const uint8_t* keep; /* NULL, or rows to compute (others: zero gradient, loss 0) */           \
    T* m; T* tau; T* out; T* s1; T* s2; T* s3; T* cnt; double* row_loss;                           \
    int status;                                                                                    \
} job_##SUFFIX;                                                                                    \
                                                                                                   \
static void* run_##SUFFIX(void* arg) {                                                             \
    job_##SUFFIX* J = (job_##SUFFIX*)arg;                                                          \
    int64_t c = J->c;                                                                              \
    const double scale = J->entmax ? 0.5 : 1.0;                                                    \
    double* buf = (double*)malloc(sizeof(double) * (size_t)(c > 0 ? c : 1));                       \
    if (!buf) { J->status = ST_MEMORY; return NULL; }                                              \
    J->status = ST_OK;                                                                             \
    for (int64_t r = J->r0; r < J->r1; ++r) {                                                      \
        const T* z = J->z + r * c;                                                                 \
        T* o = J->out + r * c;                                                                     \
        if (J->keep && !J->keep[r]) { /* an ignored row: its scores are not read */               \
            for (int64_t j = 0; j < c; ++j) o[j] = (T)0;                                           \
            J->row_loss[r] = 0.0;                                                                  \
            continue;                                                                              \
        }                                                                                          \
        double m = (double)J->mrow[r], tau, sums[4];                                               \
        int st = row_threshold_##SUFFIX(z, c, m, J->entmax, buf, J->max_steps, &tau, sums);       \
        if (st != ST_OK) { J->status = st; break; }                                                \
        int64_t y = -1;                                                                            \
        if (J->ids) { y = J->ids[r]; if (y < 0 || y >= c) { J->status = ST_ID; break; } }         \
        if (m == -INFINITY) m = 0.0;                                                               \
        /* d = [s (z - m) - tau]_+ in the input dtype: z - m is exact near the max (Sterbenz), so   \
           d keeps its precision however large the scores (m + tau in one term would not) */       \
        const T mt = (T)m, taut = (T)tau, ts = (T)scale, g = (T)J->gscale, zero = (T)0;           \
        if (!J->ids) {                                                                             \
            for (int64_t j = 0; j < c; ++j) { T d = (z[j] - mt) * ts - taut; o[j] = d > zero ? d : zero; } \
            J->m[r] = (T)m; J->tau[r] = (T)tau; J->s1[r] = (T)sums[0]; J->s2[r] = (T)sums[1];     \
            J->s3[r] = (T)sums[2]; J->cnt[r] = (T)sums[3];                                         \
        } else {                                                                                   \
            if (J->entmax) {                                                                       \
                for (int64_t j = 0; j < c; ++j) {                                                  \
                    T d = (z[j] - mt) * ts - taut; d = d > zero ? d : zero; o[j] = d * d * g; }    \
            } else {                                                                               \
                for (int64_t j = 0; j < c; ++j) { T d = ((z[j] - mt) - taut) * g; o[j] = d > zero ? d : zero; } \
            }                                                                                      \
            double omega;                                                                          \
            if (J->entmax) omega = 2.0 * (tau * sums[1] + 1.0) + (2.0 / 3.0) * (sums[2] - 1.0);    \
            else omega = (tau * sums[0] + 1.0) + 0.5 * (sums[1] - 1.0);                            \
            double loss = omega - ((double)z[y] - m);                                              \
            J->row_loss[r] = loss > 0.0 ? loss : (loss != loss ? loss : 0.0);                      \
            o[y] = (T)((double)o[y] - J->gscale);                                                  \
        }                                                                                          \
    }                                                                                              \
    free(buf);                                                                                     \
    return NULL;                                                                                   \
}                                                                                                  \
                                                                                                   \
static int launch_##SUFFIX(job_##SUFFIX* base, int64_t rows, int threads) {                        \
    if (threads < 1) threads = 1;                                                                  \
    if (threads > 64) threads = 64;                                                                \
    if (threads > rows) threads = (int)(rows > 0 ? rows : 1);                                      \
    job_##SUFFIX jobs[64];                                                                         \
    pthread_t tid[64];                                                                             \
    int started[64];                                                                               \
    int64_t per = (rows + threads - 1) / threads;                                                  \
    for (int t = 0; t < threads; ++t) {                                                            \
        jobs[t] = *base;                                                                           \
        jobs[t].r0 = t * per < rows ? t * per : rows;                                              \
        jobs[t].r1 = (t + 1) * per < rows ? (t + 1) * per : rows;                                  \
        started[t] = 0;                                                                            \
    }                                                                                              \
    for (int t = 1; t < threads; ++t)                                                              \
        started[t] = pthread_create(&tid[t], NULL, run_##SUFFIX, &jobs[t]) == 0;                   \
    run_##SUFFIX(&jobs[0]);                                                                        \
    for (int t = 1; t < threads; ++t) {                                                            \
        if (started[t]) pthread_join(tid[t], NULL); else run_##SUFFIX(&jobs[t]);                   \
    }                                                                                              \
    int status = ST_OK;                                                                            \
    for (int t = 0; t < threads; ++t) if (jobs[t].status > status) status = jobs[t].status;        \
    return status;                                                                                 \
}                                                                                                  \
                                                                                                   \
int entmax_threshold_##SUFFIX(const T* z, int64_t rows, int64_t c, int entmax, int max_steps,     \
                              int threads, T* m, T* tau, T* d, T* s1, T* s2, T* s3, T* cnt) {      \
    job_##SUFFIX J = {z, m, 0, rows, c, entmax, max_steps, NULL, 0.0, NULL, m, tau, d, s1, s2, s3, \
                      cnt, NULL, 0};                                                               \
    return launch_##SUFFIX(&J, rows, threads);                                                     \
}                                                                                                  \
                                                                                                   \
int entmax_fy_ids_##SUFFIX(const T* z, const T* mrow, int64_t rows, int64_t c, int entmax,         \
                           int max_steps, int threads, const int64_t* ids, const uint8_t* keep,    \
                           double gscale, T* grad, double* row_loss, double* total) {              \
    job_##SUFFIX J = {z, mrow, 0, rows, c, entmax, max_steps, ids, gscale, keep, NULL, NULL, grad, \
                      NULL, NULL, NULL, NULL, row_loss, 0};                                        \
    int st = launch_##SUFFIX(&J, rows, threads);                                                   \
    double acc = 0.0;                                                                              \
    for (int64_t r = 0; r < rows; ++r) acc += row_loss[r];                                         \
    *total = acc;                                                                                  \
    return st;                                                                                     \
}

DEFINE(f32, float)
DEFINE(f64, double)
"""

_FLAGS = ["-O3", "-fPIC", "-shared", "-pthread", "-std=c99", "-fno-math-errno"]

#: set to False (e.g. by a test) to run the PyTorch search even where the kernel is built
enabled = True

def _declare(lib: ctypes.CDLL) -> None:
    i64, i32, dbl, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_double, ctypes.c_void_p
    for sfx in ("f32", "f64"):
        fn = getattr(lib, f"entmax_threshold_{sfx}")
        fn.argtypes = [ptr, i64, i64, i32, i32, i32] + [ptr] * 7
        fn.restype = i32
        fn = getattr(lib, f"entmax_fy_ids_{sfx}")
        fn.argtypes = [ptr, ptr, i64, i64, i32, i32, i32, ptr, ptr, dbl, ptr, ptr, ptr]
        fn.restype = i32


_KERNEL = _native.NativeLibrary("entmax_threshold", _SOURCE, _FLAGS, _declare)


def library() -> Optional[ctypes.CDLL]:
    """The loaded kernel, built on first use; ``None`` where it cannot be (see :func:`available`)."""
    return _KERNEL.load()


def _ready() -> bool:
    return library() is not None


# torch.compile: whether the kernel is built is a constant of the process. Dynamo calls this
# eagerly while tracing and bakes its answer in, instead of tracing into the build (its lock, files
# and subprocess would break the graph the first time a compiled loss reaches it). This is the mark
# ``torch._dynamo.assume_constant_result`` sets (torch 2.0 and later), set here without importing
# Dynamo: touching ``torch._dynamo`` at import time would add ~1.2 s to ``import losses``.
_ready._dynamo_marked_constant = True  # type: ignore[attr-defined]


def ready() -> bool:
    """Whether the kernel is built and enabled (builds it on the first call)."""
    return enabled and _ready()


def available() -> Tuple[bool, str]:
    """``(True, where)`` when the kernel is built and loaded, else ``(False, why not)``."""
    return library() is not None, _KERNEL.why


def _threads(rows: int, cols: int) -> int:
    return max(1, torch.get_num_threads()) if rows * cols >= PARALLEL_MIN else 1


def usable(z: Tensor) -> bool:
    """Whether the kernel can take ``z``: a CPU float32 / float64 2-D tensor with at least one row
    (contiguous or made so by the caller), and the kernel built."""
    return (z.device.type == "cpu" and z.dtype in (torch.float32, torch.float64) and z.dim() == 2
            and z.shape[0] > 0 and z.shape[1] > 0 and ready())


def threshold(z: Tensor, entmax: bool) -> Optional[tuple]:
    """``(m, tau, d, s1, s2, s3, cnt)`` (each ``(M, 1)`` but ``d (M, C)``) in ``z``'s dtype, or ``None``
    when the kernel cannot decide (non-finite scores other than ``-inf``, a search that did not end):
    the caller then runs the PyTorch search."""
    lib = library()
    z = z.contiguous()
    rows, c = z.shape
    d = torch.empty_like(z)
    # the row max by torch (vectorised; NaN propagates, which the kernel reports), written over
    # by the kernel (0 for rows without a finite score)
    small = [z.amax(dim=1, keepdim=True)] + [z.new_empty((rows, 1)) for _ in range(5)]
    fn = lib.entmax_threshold_f32 if z.dtype == torch.float32 else lib.entmax_threshold_f64
    st = fn(z.data_ptr(), rows, c, int(entmax), MAX_STEPS, _threads(rows, c), *(t.data_ptr() for t in small[:2]),
            d.data_ptr(), *(t.data_ptr() for t in small[2:]))
    if st != 0:
        return None
    m, tau, s1, s2, s3, cnt = small
    return m, tau, d, s1, s2, s3, cnt


def _fy(z: Tensor, y: Tensor, keep: Optional[Tensor], entmax: bool, gscale: float):
    """One call of the fused kernel: ``(row_loss (M,) float64, total (float), grad)`` or ``None``."""
    lib = library()
    z = z.contiguous()
    y = y.contiguous()
    if y.dtype != torch.int64:
        y = y.long()
    rows, c = z.shape
    grad = torch.empty_like(z)
    row_loss = torch.empty(rows, dtype=torch.float64)
    total = ctypes.c_double(0.0)
    # the row max by torch (NaN propagates; the kernel reports it); the kernel does not look at the
    # ignored rows, max included
    m = z.amax(dim=1)
    flags = None if keep is None else keep.contiguous().to(torch.uint8)
    fn = lib.entmax_fy_ids_f32 if z.dtype == torch.float32 else lib.entmax_fy_ids_f64
    st = fn(z.data_ptr(), m.data_ptr(), rows, c, int(entmax), MAX_STEPS, _threads(rows, c), y.data_ptr(),
            None if flags is None else flags.data_ptr(), gscale, grad.data_ptr(), row_loss.data_ptr(),
            ctypes.byref(total))
    if st != 0:
        return None
    return row_loss, total.value, grad


def fy_ids(z: Tensor, y: Tensor, entmax: bool, divisor: int, need_grad: bool) -> Optional[Tuple[Tensor, Optional[Tensor]]]:
    """``(total, grad)`` of the Fenchel-Young loss with ids ``y (M,)`` and a sum / mean reduction
    (``divisor`` 1 or ``M``): ``total = sum_rows L / divisor`` (0-dim, ``z``'s dtype) and
    ``grad = (p* - onehot(y)) / divisor`` (``None`` unless ``need_grad``; the buffer is written
    either way). ``None`` when the kernel cannot decide (see :func:`threshold`) or an id is out of
    range: the caller then runs the PyTorch path, which raises or gives the same values."""
    done = _fy(z, y, None, entmax, 1.0 / divisor)
    if done is None:
        return None
    _, total, grad = done
    value = total if divisor == 1 else total / divisor
    return torch.tensor(value, dtype=z.dtype), (grad if need_grad else None)


def fy_rows(z: Tensor, y: Tensor, keep: Optional[Tensor], entmax: bool) -> Optional[Tuple[Tensor, Tensor]]:
    """``(values (M,), grad (M, C))``: the per-row Fenchel-Young losses with ids ``y`` and their
    gradients ``p* - onehot(y)`` (for a unit gradient of each row's loss), in ``z``'s dtype. Rows
    where ``keep (M,)`` bool is False are not read (their scores may be anything) and get 0 and a
    zero gradient row. ``None`` as for :func:`fy_ids`."""
    done = _fy(z, y, keep, entmax, 1.0)
    if done is None:
        return None
    row_loss, _, grad = done
    return row_loss.to(z.dtype), grad
