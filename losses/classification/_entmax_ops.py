"""Kernels behind :mod:`losses.classification.sparsemax` (LOSSES.md §2).

Everything here works on a 2-D tensor ``z`` of shape ``(M, C)`` (rows on dim 0, classes on
the last dim) that is already in the compute dtype (float32 or float64). The public functions in
``sparsemax.py`` move the class dim last, upcast half inputs and call these.

Conventions shared by every kernel:

* Scores are shifted by the row max first (``z' = z - m``), so every threshold ``tau`` returned
  here is in shifted coordinates and lies in ``[-1, 0]`` for sparsemax (``[-1/2, 0]`` after the
  ``x = z'/2`` scaling of entmax-1.5).
* ``-inf`` scores are masks: they never enter the support. A row without any finite score gets
  ``m = 0`` and an all-zero probability row (no NaN), so gradients of ignored rows stay finite.
* The thresholds from the cumulative sums are refined by one exact step on the found support,
  computed with a pairwise ``sum`` (not the sequential ``cumsum``), so rows sum to one to
  rounding even for large supports.
* Top-k path: ``torch.topk`` with ``k`` columns; if some row's support reaches ``k`` (and
  ``k < C``) the whole batch is redone with ``2k`` (shapes never depend on the data; deciding to
  redo is the only host sync, and only when ``k`` is given).
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__: list = []


# --------------------------------------------------------------------------------------
# row max
# --------------------------------------------------------------------------------------


def row_max(z: Tensor) -> Tensor:
    """``(M, 1)`` row maxima, 0 for rows without a finite score (all ``-inf``)."""
    m = z.amax(dim=-1, keepdim=True)
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


# --------------------------------------------------------------------------------------
# thresholds from sorted (descending), shifted values s: (M, K), s[:, 0] = 0 for finite rows
# --------------------------------------------------------------------------------------


def _ranks(s: Tensor) -> Tensor:
    return torch.arange(1, s.shape[-1] + 1, device=s.device, dtype=s.dtype)


def sparsemax_tau_sorted(s: Tensor) -> Tuple[Tensor, Tensor]:
    """Sparsemax threshold from sorted shifted scores ``s`` (descending).

    ``k* = max{k : 1 + k s_(k) > sum_{j<=k} s_(j)}``, ``tau = (sum_{j<=k*} s_(j) - 1)/k*``.
    Returns ``(tau (M, 1), kstar (M, 1) int64)``; ``kstar == 0`` marks rows without a finite
    score (their ``tau`` is set to ``-1``).
    """
    r = _ranks(s)
    cs = s.cumsum(dim=-1)
    kstar = ((1 + r * s) > cs).sum(dim=-1, keepdim=True)
    in_support = r <= kstar
    ssum = torch.where(in_support, s, torch.zeros((), dtype=s.dtype, device=s.device)).sum(dim=-1, keepdim=True)
    tau = (ssum - 1) / kstar.clamp(min=1).to(s.dtype)
    tau = torch.where(kstar > 0, tau, torch.full_like(tau, -1.0))
    return tau, kstar


def entmax15_tau_sorted(x: Tensor) -> Tuple[Tensor, Tensor]:
    """Entmax-1.5 threshold from sorted ``x = z'/2`` (descending).

    Per k: mean ``mu_k`` and mean square ``m_k`` of the top k,
    ``tau_k = mu_k - sqrt(max((1 - k (m_k - mu_k^2)) / k, 0))``; ``k* = #{k : tau_k <= x_(k)}``.
    ``tau_{k*}`` is then refined by one Newton step of ``sum_S (x - tau)^2 = 1`` on the support.
    """
    r = _ranks(x)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    finite = torch.isfinite(x)
    xf = torch.where(finite, x, zero)  # keeps NaN out of the cumulative sums
    mean = xf.cumsum(dim=-1) / r
    msq = (xf * xf).cumsum(dim=-1) / r
    delta = (1 - r * (msq - mean * mean)) / r
    tau_k = mean - delta.clamp(min=0).sqrt()
    kstar = ((tau_k <= x) & finite).sum(dim=-1, keepdim=True)
    idx = (kstar - 1).clamp(min=0)
    tau = tau_k.gather(-1, idx)
    # one Newton step on f(tau) = sum_S (x - tau)^2 - 1 with pairwise sums
    in_support = r <= kstar
    d = torch.where(in_support, (x - tau).clamp(min=0), zero)
    s1 = d.sum(dim=-1, keepdim=True)
    s2 = (d * d).sum(dim=-1, keepdim=True)
    tau = tau + (s2 - 1) / (2 * torch.where(s1 > 0, s1, torch.ones_like(s1)))
    tau = torch.where(kstar > 0, tau, torch.full_like(tau, -1.0))
    return tau, kstar


def _tau_sorted(kind: str, s: Tensor) -> Tuple[Tensor, Tensor]:
    if kind == "sparsemax":
        return sparsemax_tau_sorted(s)
    return entmax15_tau_sorted(s * 0.5)


def _p_from(kind: str, s: Tensor, tau: Tensor) -> Tensor:
    """Probabilities from shifted scores ``s`` (any layout) and threshold ``tau``."""
    if kind == "sparsemax":
        return (s - tau).clamp(min=0)
    return (s * 0.5 - tau).clamp(min=0).square()


# --------------------------------------------------------------------------------------
# full-sort and top-k forward passes
# --------------------------------------------------------------------------------------


class Threshold:
    """Result of a sort / top-k threshold search on ``z (M, C)``.

    ``m`` (M, 1) row max, ``tau`` (M, 1) threshold in shifted coordinates; for the top-k path
    also ``top_idx`` (M, k) and ``top_p`` (M, k), which hold the whole support.
    """

    __slots__ = ("m", "tau", "top_idx", "top_p")

    def __init__(self, m: Tensor, tau: Tensor, top_idx: Optional[Tensor] = None, top_p: Optional[Tensor] = None):
        self.m, self.tau, self.top_idx, self.top_p = m, tau, top_idx, top_p


def threshold(kind: str, z: Tensor, k: Optional[int]) -> Threshold:
    """Sort (``k=None``) or top-k threshold search for ``kind`` in {"sparsemax", "entmax15"}."""
    c = z.shape[-1]
    if k is None or k >= c:
        sorted_z = torch.sort(z, dim=-1, descending=True).values
        m = sorted_z[:, :1]
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        tau, _ = _tau_sorted(kind, sorted_z - m)
        return Threshold(m, tau)
    kk = int(k)
    while True:
        top_v, top_i = torch.topk(z, kk, dim=-1, largest=True, sorted=True)
        m = top_v[:, :1]
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        s = top_v - m
        tau, kstar = _tau_sorted(kind, s)
        if kk >= c or z.shape[0] == 0 or not bool((kstar >= kk).any()):
            return Threshold(m, tau, top_i, _p_from(kind, s, tau))
        kk = min(2 * kk, c)  # some row's support reached kk: redo the batch with 2kk


def dense_probs(kind: str, z: Tensor, th: Threshold) -> Tensor:
    """The ``(M, C)`` probabilities for a :class:`Threshold`."""
    if th.top_idx is not None:
        return torch.zeros_like(z).scatter_(-1, th.top_idx, th.top_p)
    return _p_from(kind, z - th.m, th.tau)


# --------------------------------------------------------------------------------------
# bisection (any alpha > 1)
# --------------------------------------------------------------------------------------


def rpow(d: Tensor, e: Union[float, Tensor]) -> Tensor:
    """``d ** e`` for ``d >= 0`` and ``e > 0`` (0 at ``d == 0``). A per-row tensor exponent goes
    through ``exp(e log d)``, much faster on CPU than a broadcast tensor ``pow``."""
    if isinstance(e, Tensor):
        return torch.exp(e * torch.log(d))
    if e == 1.0:
        return d
    if e == 2.0:
        return d * d
    return d.pow(e)


def bisect_probs(z: Tensor, alpha: Tensor, n_iter: int, alpha_float: Optional[float] = None) -> Tuple[Tensor, Tensor]:
    """Entmax-alpha by bisection; ``alpha`` is ``(M, 1)`` or ``(1, 1)`` (``alpha_float``: the same
    value as a Python float, for the fast scalar path). Returns ``(p, m)``.

    With ``x = (alpha - 1)(z - m)`` (so ``max x = 0``), ``tau`` is bisected on
    ``[-1, -(1/C)^(alpha-1)]`` for ``sum_j [x_j - tau]_+^(1/(alpha-1)) = 1`` for ``n_iter``
    steps, and ``p`` is renormalised to sum to one.
    """
    c = z.shape[-1]
    m = row_max(z)
    if alpha_float is not None:
        am1: Union[float, Tensor] = alpha_float - 1.0
        inv: Union[float, Tensor] = 1.0 / am1
        lo = torch.full_like(m, -1.0)
        hi = torch.full_like(m, -((1.0 / c) ** am1))
    else:
        am1 = alpha - 1
        inv = 1.0 / am1
        lo = torch.full_like(m, -1.0) + torch.zeros_like(am1)
        hi = -torch.pow(torch.full_like(am1, 1.0 / c), am1) + torch.zeros_like(m)
    x = (z - m) * am1
    for _ in range(int(n_iter)):
        mid = (lo + hi) * 0.5
        f = rpow((x - mid).clamp_(min=0), inv).sum(dim=-1, keepdim=True) - 1
        above = f >= 0
        lo = torch.where(above, mid, lo)
        hi = torch.where(above, hi, mid)
    p = rpow((x - (lo + hi) * 0.5).clamp_(min=0), inv)
    total = p.sum(dim=-1, keepdim=True)
    p = p / torch.where(total > 0, total, torch.ones_like(total))
    return p, m


# --------------------------------------------------------------------------------------
# vector-Jacobian products
# --------------------------------------------------------------------------------------


def _xlogx(p: Tensor) -> Tensor:
    return torch.where(p > 0, p * torch.log(torch.where(p > 0, p, torch.ones_like(p))), torch.zeros_like(p))


def entmax_vjp(p: Tensor, v: Tensor, g: Tensor) -> Tensor:
    """``dz = g*v - (<g, v> / sum g) g`` with ``g = p^(2 - alpha)`` on the support (0 elsewhere)."""
    gs = g.sum(dim=-1, keepdim=True)
    gv = (g * v).sum(dim=-1, keepdim=True)
    return g * v - (gv / torch.where(gs > 0, gs, torch.ones_like(gs))) * g


def sparsemax_vjp(p: Tensor, v: Tensor) -> Tensor:
    return entmax_vjp(p, v, (p > 0).to(p.dtype))


def entmax15_vjp(p: Tensor, v: Tensor) -> Tensor:
    return entmax_vjp(p, v, p.sqrt())


def bisect_g(p: Tensor, alpha: Tensor) -> Tensor:
    """``p^(2 - alpha)`` on the support, 0 elsewhere (``2 - alpha`` may be <= 0)."""
    pos = p > 0
    return torch.where(pos, torch.exp((2 - alpha) * torch.log(torch.where(pos, p, torch.ones_like(p)))),
                       torch.zeros_like(p))


def alpha_vjp(p: Tensor, v: Tensor, alpha: Tensor, g: Tensor) -> Tensor:
    """``(M, 1)`` gradient w.r.t. alpha of ``<v, entmax_alpha(z)>`` (LOSSES.md §2, alpha-VJP)."""
    am1 = alpha - 1
    gs = g.sum(dim=-1, keepdim=True)
    pt = g / torch.where(gs > 0, gs, torch.ones_like(gs))
    plogp = _xlogx(p)
    ent = plogp.sum(dim=-1, keepdim=True)
    term = (p - pt) / (am1 * am1) - (plogp - pt * ent) / am1
    return (v * term).sum(dim=-1, keepdim=True)


# --------------------------------------------------------------------------------------
# autograd Functions of the activations (first order only)
# --------------------------------------------------------------------------------------


class SparsemaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: Tensor, k: Optional[int]) -> Tensor:
        p = dense_probs("sparsemax", z, threshold("sparsemax", z, k))
        ctx.save_for_backward(p)
        return p

    @staticmethod
    @once_differentiable
    def backward(ctx, v: Tensor):
        (p,) = ctx.saved_tensors
        return sparsemax_vjp(p, v), None


class Entmax15Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: Tensor, k: Optional[int]) -> Tensor:
        p = dense_probs("entmax15", z, threshold("entmax15", z, k))
        ctx.save_for_backward(p)
        return p

    @staticmethod
    @once_differentiable
    def backward(ctx, v: Tensor):
        (p,) = ctx.saved_tensors
        return entmax15_vjp(p, v), None


class EntmaxBisectFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: Tensor, alpha: Tensor, n_iter: int, alpha_float: Optional[float]) -> Tensor:
        p, _ = bisect_probs(z, alpha, n_iter, alpha_float)
        ctx.save_for_backward(p, alpha)
        return p

    @staticmethod
    @once_differentiable
    def backward(ctx, v: Tensor):
        p, alpha = ctx.saved_tensors
        g = bisect_g(p, alpha)
        dz = entmax_vjp(p, v, g)
        da = None
        if ctx.needs_input_grad[1]:
            da = alpha_vjp(p, v, alpha, g)
            if da.shape != alpha.shape:
                da = da.sum(dim=0, keepdim=True)
        return dz, da, None, None


# --------------------------------------------------------------------------------------
# Fenchel-Young losses
# --------------------------------------------------------------------------------------


def tsallis(p: Tensor, alpha: Tensor) -> Tensor:
    """``H_alpha(p) = (1 - sum_j p_j^alpha) / (alpha (alpha - 1))`` per row, ``(M, 1)``."""
    s = rpow(p, alpha).sum(-1, keepdim=True)
    return (1 - s) / (alpha * (alpha - 1))


def tsallis_dalpha(p: Tensor, alpha: Tensor) -> Tensor:
    """``dH_alpha(p)/d alpha`` per row, ``(M, 1)``."""
    pos = p > 0
    logp = torch.log(torch.where(pos, p, torch.ones_like(p)))
    pa = torch.where(pos, torch.exp(alpha * logp), torch.zeros_like(p))
    s = pa.sum(-1, keepdim=True)
    s_log = (pa * logp).sum(-1, keepdim=True)
    den = alpha * (alpha - 1)
    return -s_log / den - (1 - s) * (2 * alpha - 1) / (den * den)


def _dot_masked(w: Tensor, s: Tensor) -> Tensor:
    """``sum_j w_j s_j`` with ``w_j s_j`` taken as 0 where ``w_j == 0`` (``s_j`` may be -inf)."""
    return torch.where(w > 0, w * s, torch.zeros((), dtype=s.dtype, device=s.device)).sum(-1, keepdim=True)


class FYLossFunction(torch.autograd.Function):
    """Per-row Fenchel-Young loss ``L(z; q) = <p* - q, z> + H(p*) - H(q)``.

    ``forward(z (M, C), y (M,) int64 or None, q (M, C) or None, alpha (M|1, 1) or None, kind, k,
    n_iter, alpha_float)`` returns ``(M,)``; exactly one of ``y`` (class ids, already made safe for ignored
    rows) and ``q`` (distributions) is given. ``kind`` is "sparsemax", "entmax15" or "bisect".
    Backward: ``dz = p* - q``; ``dq = -z' + q^(alpha-1)/(alpha-1)`` (shifted scores);
    ``dalpha = dH(p*)/dalpha - dH(q)/dalpha`` (Danskin).
    """

    @staticmethod
    def forward(ctx, z, y, q, alpha, kind, k, n_iter, alpha_float):
        ctx.kind = kind
        if kind == "bisect":
            p, m = bisect_probs(z, alpha, n_iter, alpha_float)
            zs = z - m
            omega = _dot_masked(p, zs) + tsallis(p, alpha)
            saved_p, th = p, None
        else:
            th = threshold(kind, z, k)
            m, tau = th.m, th.tau
            if th.top_idx is not None:
                p = th.top_p
            else:
                zs_full = z - m
                p = _p_from(kind, zs_full, tau)
            p_sum = p.sum(-1, keepdim=True)
            if kind == "sparsemax":  # <p, z'> + H_2(p) = 1/2 sum p^2 + tau sum p + 1/2
                omega = (tau * p_sum + 1) + 0.5 * ((p * p).sum(-1, keepdim=True) - 1)
            else:  # x = z'/2 = sqrt(p) + tau on the support
                # = 2/3 sum p^1.5 + 2 tau sum p + 4/3, grouped to be exactly 0 on one-hot rows
                omega = 2 * (tau * p_sum + 1) + (2.0 / 3.0) * ((p * p.sqrt()).sum(-1, keepdim=True) - 1)
            saved_p = None
        if y is not None:
            zy = z.gather(-1, y.unsqueeze(-1)) - m
            loss = omega - zy
        else:
            a = alpha if alpha is not None else torch.full_like(m, 2.0 if kind == "sparsemax" else 1.5)
            zs_q = z - m
            loss = omega - _dot_masked(q, zs_q) - tsallis(q, a)
        loss = loss.clamp(min=0).squeeze(-1)
        # save what the backward needs
        ctx.has_y = y is not None
        if kind == "bisect":
            ctx.save_for_backward(saved_p, y, q, alpha, z, m)
        elif th.top_idx is not None:
            ctx.save_for_backward(th.top_p, th.top_idx, y, q, alpha, z, m, th.tau)
        else:
            ctx.save_for_backward(y, q, alpha, z, m, th.tau)
        ctx.topk = th is not None and th.top_idx is not None
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        kind = ctx.kind
        g = grad.unsqueeze(-1)
        if kind == "bisect":
            p, y, q, alpha, z, m = ctx.saved_tensors
            dz = p * g
        elif ctx.topk:
            top_p, top_i, y, q, alpha, z, m, tau = ctx.saved_tensors
            dz = torch.zeros_like(z).scatter_(-1, top_i, top_p * g)
            p = None
        else:
            y, q, alpha, z, m, tau = ctx.saved_tensors
            p = _p_from(kind, z - m, tau)
            dz = p.mul_(g)
        if ctx.has_y:
            dz.scatter_add_(-1, y.unsqueeze(-1), -g)
        else:
            dz = dz - q * g
        dq = da = None
        a = alpha if alpha is not None else torch.full_like(m, 2.0 if kind == "sparsemax" else 1.5)
        if not ctx.has_y and ctx.needs_input_grad[2]:
            qa = rpow(q, a - 1)
            dq = (qa / (a - 1) - (z - m)) * g
        if kind == "bisect" and ctx.needs_input_grad[3]:
            dH = tsallis_dalpha(p, alpha)
            if not ctx.has_y:
                dH = dH - tsallis_dalpha(q, alpha)
            da = dH * g
            if da.shape != alpha.shape:
                da = da.sum(dim=0, keepdim=True)
        return dz, None, dq, da, None, None, None, None
