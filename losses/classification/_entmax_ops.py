"""Kernels behind :mod:`losses.classification.sparsemax` (docs/losses/sparsemax.md).

Everything here works on a 2-D tensor ``z`` of shape ``(M, C)`` (rows on dim 0, classes on
the last dim) that is already in the compute dtype (float32 or float64). The public functions in
``sparsemax.py`` move the class dim last, upcast half inputs and call these.

Conventions shared by every kernel:

* Scores are shifted by the row max first (``z' = z - m``), so every threshold ``tau`` returned
  here is in shifted coordinates and lies in ``[-1, 0]`` (for entmax-1.5 in the scale
  ``x = z'/2``). Hence the support lies in ``z' > -1`` (sparsemax) or ``z' > -2`` (entmax-1.5).
* ``-inf`` scores are masks: they never enter the support. A row without any finite score gets
  ``m = 0`` and an all-zero probability row (no NaN), so gradients of ignored rows stay finite.
* Exact threshold searches (``k=None``):

  - ``"sort"``: sort each row, cumulative sums, ``k*`` and ``tau`` as docs/losses/sparsemax.md writes them;
    ``tau`` is then recomputed from pairwise sums over the support (not the sequential
    ``cumsum``) so rows sum to one to rounding even for large supports.
  - ``"newton"``: the candidates ``z' > -1`` (``-2``) are packed into a narrow matrix, then
    Newton's method from the left on the convex ``f(tau) = sum_j [x_j - tau]_+^(1/(alpha-1)) - 1``
    identifies the support, and ``tau`` is the sort formula's closed form on that support -
    the same result without sorting. A CPU ``torch.sort`` of a (256, 1000) batch costs about
    20x ``F.cross_entropy``; this search about 2x. It host-syncs a few times (free on CPU); the
    sort is used off CPU and as the fallback after ``NEWTON_MAX_ITER`` steps.
  - ``"dense"`` (the CPU default for mid-width rows): the same Newton search without packing the
    candidates (packing cost a ``nonzero`` and index building per call), over whole rows from a
    lower bound: the threshold of a subset of a row's scores is at most the row's, so the exact
    threshold of the rows' chunk maxima (:func:`halving_max`, at most 128 columns; for entmax-1.5
    each chunk's two largest scores, :func:`top2_halving`, as its support is wider) starts it. One
    pass over the whole rows at that threshold confirms it for every row whose support the chunk
    level held (the same support size); only the other rows are searched further. That pass is
    ``[x - tau]_+`` itself, so the probabilities, the loss value and (for ids with a sum or mean
    reduction) the whole gradient ``(p* - onehot)/N`` cost no further search pass over the scores.

  - The C kernel (:mod:`losses.kernels.entmax_native`, CPU, built on first use where a C compiler exists):
    the same dense search per row with no operator calls (Michelot's algorithm for sparsemax,
    Newton from the left with the support's closed form as the stopping test for entmax-1.5, in
    float64), and with ids the per-row values and gradients ``p* - onehot`` in the same call.
    Where it is built, :func:`_threshold_dense` and the Fenchel-Young Function call it first and
    keep the PyTorch search as the fallback (cases it hands back: NaN or ``+inf`` scores, ids out
    of range with the data checks off, a search longer than its step limit).

* What differs between the mappings (threshold, probabilities, Fenchel-Young value, backward)
  lives in one small object each, :data:`MAPPINGS` ``"sparsemax"``, ``"entmax15"`` (exact
  thresholds, one shared autograd Function) and ``"bisect"`` (any alpha); the search drivers
  (:func:`threshold`, :func:`dense_probs`) and the Fenchel-Young Function look them up by name.

* Top-k path (``k`` given): ``torch.topk`` with ``k`` columns; if some row's support reaches
  ``k`` (and ``k < C``) the whole batch is redone with ``2k`` (shapes never depend on the
  data; deciding to redo is one host sync per round).

* Choice of the search on CPU outside ``torch.compile`` (:func:`auto_search`): all three are
  exact, so the fastest for the batch shape ``(M, C)`` is used. With the C kernel that is the dense
  search at every width; without it, from one-thread measurements
  (benchmarks/perf_losses.py, docs/performance.md): top-k (with the doubling above) for wide
  rows (``C > 2048``) and for small batches of narrow rows, the dense search in between, the sort for
  entmax-1.5 rows of at most 32 classes. On wide rows a batch whose support outgrows the top-k
  after :data:`AUTO_TOPK_DOUBLINGS` doublings goes to the dense search (near-uniform rows would
  otherwise double up to a full sort). Every ``k`` takes that choice on CPU (a given ``k`` was
  measured slower than the choice wherever they differ, e.g. sparsemax at (256, 1e4) with
  ``k=128`` 1.14x ``F.cross_entropy`` against 0.50x); on GPU a given ``k`` is the first top-k size.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .._core import _compiling, add_at_target, once_differentiable, zero_rows
from ..kernels import entmax_native as _entmax_native

__all__: list = []


# --------------------------------------------------------------------------------------
# row max
# --------------------------------------------------------------------------------------


def row_max(z: Tensor) -> Tensor:
    """``(M, 1)`` row maxima, 0 for rows without a finite score (all ``-inf``)."""
    return torch.nan_to_num(z.amax(dim=-1, keepdim=True), nan=0.0, posinf=0.0, neginf=0.0)


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


# --------------------------------------------------------------------------------------
# full-sort and top-k forward passes
# --------------------------------------------------------------------------------------


def sparsemax_tau_newton(zs: Tensor, max_iter: int) -> Optional[Tensor]:
    """Exact sparsemax threshold by Newton's method from the left, without sorting.

    ``f(tau) = sum_j [zs_j - tau]_+ - 1`` is convex, piecewise linear and decreasing; from
    ``tau_0 = max - 1 = -1`` (where ``f >= 0``) the Newton iterates
    ``tau_{t+1} = (sum_{S_t} zs - 1) / |S_t|``, ``S_t = {zs > tau_t}``, increase to the root and
    reach it exactly once the support stops shrinking (``|S_{t+1}| = |S_t|``): ``tau`` is then
    the sort formula evaluated on the true support. Returns ``None`` if some row needs more than
    ``max_iter`` steps (the caller then sorts). One host sync per step.
    """
    zero = torch.zeros((), dtype=zs.dtype, device=zs.device)
    tau = torch.full((zs.shape[0], 1), -1.0, dtype=zs.dtype, device=zs.device)
    cnt_prev = None
    for _ in range(max_iter):
        mask = zs > tau
        cnt = mask.sum(dim=-1, keepdim=True)
        if cnt_prev is not None and torch.equal(cnt, cnt_prev):
            return tau
        ssum = torch.where(mask, zs, zero).sum(dim=-1, keepdim=True)
        tau = (ssum - 1) / cnt.clamp(min=1).to(zs.dtype)  # rows without a finite score: tau = -1
        cnt_prev = cnt
    return None


def entmax15_tau_newton(x: Tensor, max_iter: int, tau0: Optional[Tensor] = None) -> Optional[Tensor]:
    """Exact entmax-1.5 threshold (``x = zs/2``, ``max x = 0``) without sorting.

    Newton's method from the left on the convex, decreasing ``f(tau) = sum_j [x_j - tau]_+^2 - 1``
    (``tau_0 = -1``, or any ``tau0`` with ``f(tau0) >= 0``) shrinks the candidate support
    ``S = {x > tau}``; on each ``S`` the closed
    form ``tau_S = mu - sqrt(max((1 - k (m - mu^2)) / k, 0))`` (``k = |S|``, ``mu``, ``m`` the
    mean and mean square over ``S``) is exact as soon as ``{x > tau_S} = S``. Returns ``None``
    after ``max_iter`` steps without that (the caller then sorts).
    """
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    tau = torch.full((x.shape[0], 1), -1.0, dtype=x.dtype, device=x.device) if tau0 is None else tau0
    for _ in range(max_iter):
        mask = x > tau
        cnt = mask.sum(dim=-1, keepdim=True)
        kf = cnt.clamp(min=1).to(x.dtype)
        xm = torch.where(mask, x, zero)
        s1 = xm.sum(dim=-1, keepdim=True)
        s2 = (xm * xm).sum(dim=-1, keepdim=True)
        mu = s1 / kf
        var_k = s2 - s1 * mu  # k (m - mu^2)
        tau_s = mu - ((1 - var_k) / kf).clamp(min=0).sqrt()
        tau_s = torch.where(cnt > 0, tau_s, torch.full_like(tau_s, -1.0))
        if torch.equal((x > tau_s).sum(dim=-1, keepdim=True), cnt):
            return tau_s
        # Newton step on f from the left: f(tau) = sum_S (x - tau)^2 - 1, f'(tau) = -2 sum_S (x - tau)
        d1 = s1 - kf * tau
        d2 = s2 - 2 * tau * s1 + kf * tau * tau
        tau = torch.where(cnt > 0, tau + (d2 - 1) / (2 * torch.where(d1 > 0, d1, torch.ones_like(d1))), tau)
    return None


def _polish_entmax15(x: Tensor, tau: Tensor) -> Tensor:
    """One Newton step of ``sum (x - tau)_+^2 = 1`` with pairwise sums (summation accuracy)."""
    d = (x - tau).clamp(min=0)
    s1 = d.sum(dim=-1, keepdim=True)
    s2 = (d * d).sum(dim=-1, keepdim=True)
    return torch.where(s1 > 0, tau + (s2 - 1) / (2 * torch.where(s1 > 0, s1, torch.ones_like(s1))), tau)


def _compact_candidates(zs: Tensor, lower: Union[float, Tensor]) -> Tensor:
    """The scores ``zs > lower`` (a float or per-row ``(M, 1)``) of each row packed to the left of
    an ``(M, K)`` matrix padded with ``-inf`` (``K`` the largest candidate count; one host sync).
    The support of sparsemax (entmax-1.5) lies in ``zs > -1`` (``zs > -2``), because
    ``tau >= max - 1`` in its own scale; any lower bound of the threshold will do."""
    cand = zs > lower
    cnt = cand.sum(dim=-1, dtype=torch.int32).long()
    kmax = int(cnt.max())
    if kmax * 2 > zs.shape[-1]:  # packing would not save work
        return zs
    vals = zs[cand]  # row-major order
    rows = torch.repeat_interleave(torch.arange(zs.shape[0], device=zs.device), cnt)
    starts = torch.cumsum(cnt, 0) - cnt
    cols = torch.arange(vals.shape[0], device=zs.device) - starts[rows]
    out = zs.new_full((zs.shape[0], max(kmax, 1)), float("-inf"))
    out[rows, cols] = vals
    return out


def bucket_max(x: Tensor, width: int) -> Tensor:
    """``(M, w)``, ``w <= width``: the row split into ``ceil(C / w)`` consecutive chunks of ``w``
    columns and the chunks' element-wise maximum (the last, shorter chunk on its first columns), so
    every entry is one of the row's own scores. One read of ``x``, vectorised across the chunk."""
    rows, c = x.shape
    groups = -(-c // width)
    w = -(-c // groups)
    full = (groups - 1) * w
    if groups == 1:
        return x
    out = x[:, :full].view(rows, groups - 1, w).amax(dim=1)
    r = c - full
    torch.maximum(out[:, :r], x[:, full:], out=out[:, :r])
    return out


def _dense_pass(x: Tensor, tau: Tensor, entmax: bool, keep_d: bool = True, inplace: bool = False) -> tuple:
    """One pass over the rows at ``tau (M, 1)``: ``(d, sum d, sum d^2 (entmax-1.5 only, else None),
    |S|)`` with ``d = [x - tau]_+`` and ``S = {x > tau}`` (its size counted as ``sum sign(d)``, a
    float). ``keep_d=False`` lets the count overwrite ``d`` (a search level whose ``d`` is not used);
    ``inplace=True`` writes ``d`` into ``x``."""
    d = (x.sub_(tau) if inplace else torch.sub(x, tau)).clamp_(min=0)
    s1 = d.sum(dim=-1, keepdim=True)
    s2 = torch.linalg.vector_norm(d, dim=-1, keepdim=True).square_() if entmax else None
    cnt = (d.sign() if keep_d else d.sign_()).sum(dim=-1, keepdim=True)
    return d, s1, s2, cnt


def sparsemax_tau_dense(x: Tensor, tau: Tensor, src: Optional[Tensor], max_iter: int, keep_d: bool = True,
                        first: Optional[tuple] = None, empty: bool = True):
    """Exact sparsemax threshold of the shifted scores ``x (M, K)`` (max 0) by Newton's method from
    the left over whole rows, all rows together, from a lower bound ``tau`` (``f(tau) >= 0``, e.g.
    -1). ``src``: the support size whose closed form ``tau`` already is (``None``: unknown);
    ``first``: the :func:`_dense_pass` at ``tau`` when the caller has made it and found it not exact
    (the search then starts with the step from it). Each step is one pass:
    ``d = [x - tau]_+``, its sum and its support size ``|S|``; ``tau' = tau + (sum d - 1)/|S|`` is the
    sort formula on ``S`` (a lower bound of the threshold for any ``S``), exact once the next pass
    finds the same ``|S|``. Returns ``(tau, d, sum d, None, |S|)`` at the exact ``tau``, or ``None``
    after ``max_iter`` passes. Rows without a finite score (``|S| = 0``) are done at once (their
    ``tau`` is meaningless; the caller sets it)."""
    for _ in range(max_iter):
        d, s1, _, cnt = _dense_pass(x, tau, False, keep_d) if first is None else first
        if first is None and src is not None and torch.equal(cnt, src):
            return tau, d, s1, None, cnt
        tau = torch.addcdiv(tau, s1 - 1, cnt.clamp(min=1) if empty else cnt)
        src, first = cnt, None
    return None


def _entmax15_closed_form(tau: Tensor, s1: Tensor, s2m1: Tensor, cnt: Tensor, empty: bool = True) -> Tensor:
    """The entmax-1.5 threshold of the set ``S = {x > tau}`` alone (the root of ``sum_S (x - t)^2 = 1``
    below ``min_S x``) from the pass at ``tau``: ``tau + (s1 - sqrt(s1^2 - |S| (s2 - 1)))/|S|``
    (``s2m1 = s2 - 1``); at least the threshold when ``S`` holds the support, at most when ``S`` is
    inside it, the threshold itself when ``S`` is the support."""
    k = cnt.clamp(min=1) if empty else cnt
    disc = torch.addcmul(s1 * s1, k, s2m1, value=-1).clamp_(min=0).sqrt_()
    return torch.addcdiv(tau, s1 - disc, k)


def entmax15_tau_dense(x: Tensor, tau: Tensor, src: Optional[Tensor], max_iter: int, keep_d: bool = True,
                       first: Optional[tuple] = None, empty: bool = True):
    """Exact entmax-1.5 threshold of ``x = (z - max)/2 (M, K)`` over whole rows, all rows together,
    from a lower bound ``tau`` (``f(tau) = sum [x - tau]_+^2 - 1 >= 0``); ``src``, ``keep_d`` and
    ``first`` as in :func:`sparsemax_tau_dense`.

    Each step is two passes. At the left point ``tau`` (``S = {x > tau}`` holds the support) the
    closed form on ``S`` (:func:`_entmax15_closed_form`) is at least the threshold and equal to it
    when ``S`` is the support; the second pass, there, checks that: the same ``|S|`` means it is
    exact. Otherwise its own set lies inside the support, so its closed form is a lower bound, as is
    the Newton step ``tau + (s2 - 1)/(2 s1)`` from the left point: the next left point is the larger
    (and, when it is that closed form, the pass there checks it). Returns ``(tau, d, s1, s2, |S|)``
    or ``None`` after ``max_iter`` steps."""
    for _ in range(max_iter):
        d, s1, s2, cnt = _dense_pass(x, tau, True, keep_d) if first is None else first
        if first is None and src is not None and torch.equal(cnt, src):
            return tau, d, s1, s2, cnt
        first = None
        s2m1 = s2 - 1
        upper = _entmax15_closed_form(tau, s1, s2m1, cnt, empty)
        newton = torch.addcdiv(tau, s2m1, s1.clamp(min=1e-30), value=0.5)
        d, s1, s2, cnt_up = _dense_pass(x, upper, True, keep_d)
        if torch.equal(cnt_up, cnt):
            return upper, d, s1, s2, cnt_up
        lower = _entmax15_closed_form(upper, s1, s2 - 1, cnt_up, empty)
        tau = torch.maximum(newton, lower)
        src = torch.where(lower >= newton, cnt_up, -1.0)
    return None


#: columns of the narrow level of the dense search: the rows' chunk maxima (:func:`halving_max`)
#: give a lower bound of the threshold (the threshold of a subset of the scores is at most the
#: row's) and usually the whole support
DENSE_BUCKETS = 128


def halving_max(x: Tensor, width: int) -> Tensor:
    """Chunk maxima of the rows of ``x (M, C)`` by halving: while the width exceeds ``width`` and is
    even, the element-wise maximum of the two halves (one ``torch.maximum`` per level, cheaper
    than a strided reduction); an odd width goes to :func:`bucket_max`. Every entry is one of the
    row's own scores."""
    c = x.shape[-1]
    while c > width and c % 2 == 0:
        h = c // 2
        x = torch.maximum(x[:, :h], x[:, h:c])
        c = h
    return x if c <= width else bucket_max(x, width)


def top2_halving(x: Tensor, width: int) -> Tensor:
    """The two largest scores of each chunk of the rows of ``x (M, C)`` (``(M, 2w)``, ``w <= width``:
    the chunk maxima, then the chunk runners-up), found by halving: the first level pairs the two
    halves (their maximum and minimum), each further level merges two chunks' (max, runner-up)
    pairs into ``max(max_a, max_b)`` and ``max(min(max_a, max_b), max(runner_a, runner_b))``. Every
    entry is one of the row's own scores, each at most once. An odd width stops the halving (the
    chunks are then wider than ``C / width``); fewer than 4 columns: ``x`` itself."""
    c = x.shape[-1]
    if c < 4 or c % 2:
        return x
    h = c // 2
    top, second = torch.maximum(x[:, :h], x[:, h:]), torch.minimum(x[:, :h], x[:, h:])
    c = h
    while c > width and c % 2 == 0:
        h = c // 2
        ta, tb = top[:, :h], top[:, h:]
        second = torch.maximum(torch.minimum(ta, tb), torch.maximum(second[:, :h], second[:, h:]))
        top = torch.maximum(ta, tb)
        c = h
    return torch.cat((top, second), dim=-1)


def _threshold_dense(kind: str, z: Tensor, max_iter: int) -> Optional[Threshold]:
    """The ``"dense"`` search: the mapping's exact Newton search (:func:`sparsemax_tau_dense`,
    :func:`entmax15_tau_dense`) first on the chunk maxima of each row (at most ``DENSE_BUCKETS``
    columns: a lower bound and its support size), then one pass over the whole rows at that
    threshold, which is exact for the rows whose support the chunk maxima held (the same support
    size); only the other rows are searched further. ``None`` if a level needs more than
    ``max_iter`` steps (the caller sorts). The whole-row pass overwrites the shifted scores with
    ``d = [x - tau]_+`` (no second ``(M, C)`` buffer), so the result carries no ``zs``."""
    mapping = _exact(kind)
    entmax = mapping.scale != 1.0
    if not _compiling() and _entmax_native.usable(z):
        # the same search per row in C (losses/kernels/entmax_native.py): no operator calls
        found = _entmax_native.threshold(z, entmax)
        if found is not None:
            m, tau, d, s1, s2, s3, _ = found
            return Threshold(m, tau, None, d=d, sums=(s1, s2, s3))
    search = mapping.tau_dense
    wide = z.shape[-1] > 2 * DENSE_BUCKETS
    # the chunk maxima are taken before the shift (the shift is monotone: the same values); the
    # row max is then the max of the chunk maxima, no pass over the whole rows
    nz = (top2_halving(z, DENSE_BUCKETS) if entmax else halving_max(z, DENSE_BUCKETS)) if wide else z
    m = nz.amax(dim=-1, keepdim=True)
    empty = not bool(torch.isfinite(m).all())  # a row without a finite score (validation off)
    if empty:
        m = m.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)

    def shifted(rows: Tensor, mrows: Tensor) -> Tensor:
        x = torch.sub(rows, mrows)
        return x.mul_(mapping.scale) if entmax else x

    x = shifted(z, m)
    tau = torch.full_like(m, -1.0)
    if not wide:
        found = search(x, tau, None, max_iter, empty=empty)
        if found is None:
            return None
        s3 = _cube_sum(found[1]) if entmax else None
    else:
        xn = shifted(nz, m)
        narrow = search(xn, tau, None, max_iter, keep_d=False, empty=empty)
        if narrow is None:
            return None
        tau, src = narrow[0], narrow[-1]
        found = (tau,) + _dense_pass(x, tau, entmax, inplace=True)
        # entmax-1.5's loss needs sum d^3: over the chunk maxima, which hold the support of every
        # row the whole-row pass confirms (the rows searched again below get theirs from their rows)
        s3 = _cube_sum(torch.sub(xn, tau).clamp_(min=0)) if entmax else None
        bad = found[-1] != src
        if bool(bad.any()):  # a support the chunk maxima missed: those rows search on
            rows = bad.squeeze(1).nonzero().squeeze(1)
            part = search(shifted(z.index_select(0, rows), m.index_select(0, rows)), tau.index_select(0, rows),
                          src.index_select(0, rows), max_iter, empty=empty,
                          first=(None,) + tuple(None if t is None else t.index_select(0, rows) for t in found[2:]))
            if part is None:
                return None
            keep = found[:-1] if not empty else found  # |S| is only needed for empty rows
            found = tuple(None if t is None else t.index_copy_(0, rows, p) for t, p in zip(keep, part)) + \
                found[len(keep):]
            if entmax:
                s3.index_copy_(0, rows, _cube_sum(part[1]))
    tau, d, s1, s2, cnt = found
    tau, s1, s2, s3 = _polish_dense(entmax, tau, d, s1, s2, s3, cnt)
    if empty:
        tau = tau.masked_fill(cnt == 0, -1.0)  # rows without a finite score
    return Threshold(m, tau, None, d=d, sums=(s1, s2, s3))


def _polish_dense(entmax: bool, tau: Tensor, d: Tensor, s1: Tensor, s2: Optional[Tensor], s3: Optional[Tensor],
                  cnt: Tensor):
    """One Newton step of the threshold equation on the found support ``S`` (sparsemax
    ``sum_S (x - tau) = 1``, entmax-1.5 ``sum_S (x - tau)^2 = 1``) for the rows that miss it by more
    than a few units of rounding; ``d`` is updated in place and those rows' sums recomputed. The
    search reaches a wide support's threshold by a step from a far left point (e.g. ``tau = -1`` to
    ``-0.03`` for 1,000 equal scores), which keeps the far point's absolute rounding: ~30 units of
    the threshold's own in float32, rows summing to ``1 +- 3e-6`` (``5e-5`` over 1e5 equal scores).
    The sort path ends with the same step (:func:`entmax15_tau_sorted`). Rows wider than 2,048
    (reached from the top-k search when a support outgrows it) get their ``sum d^2`` summed
    again pairwise first."""
    tol = 8 * torch.finfo(d.dtype).eps
    if entmax and d.shape[-1] > WIDE_ROWS:
        # the passes' sum d^2 (vector_norm: fast, one running sum per lane) drifts on wide rows
        # (1.6e-4 over 1e5 equal entries in float32); a dot product sums pairwise
        s2 = torch.linalg.vecdot(d, d, dim=-1).unsqueeze(-1)
    total = s2 if entmax else s1
    off = ((total - 1).abs() > tol) & (cnt > 0)
    if not bool(off.any()):
        return tau, s1, s2, s3
    rows = off.squeeze(1).nonzero().squeeze(1)
    dr = d.index_select(0, rows)
    support = dr > 0  # the found support: the step is a rounding correction, no entry joins it
    if entmax:
        step = (s2.index_select(0, rows) - 1) / (2 * s1.index_select(0, rows))
    else:
        step = (s1.index_select(0, rows) - 1) / cnt.index_select(0, rows)
    dr = dr.sub_(step).mul_(support).clamp_(min=0)
    d.index_copy_(0, rows, dr)
    tau = tau.index_add(0, rows, step)
    s1 = s1.index_copy(0, rows, dr.sum(dim=-1, keepdim=True))
    if s2 is not None:
        s2 = s2.index_copy(0, rows, torch.linalg.vector_norm(dr, dim=-1, keepdim=True).square_())
    if s3 is not None:
        s3 = s3.index_copy(0, rows, _cube_sum(dr))
    return tau, s1, s2, s3


def _cube_sum(d: Tensor) -> Tensor:
    """``sum_j d_j^3`` per row, ``(M, 1)``."""
    return torch.linalg.vecdot(d * d, d, dim=-1).unsqueeze(-1)


class Threshold:
    """Result of a threshold search on ``z (M, C)``.

    ``m`` (M, 1) row max; ``tau`` (M, 1) threshold in shifted coordinates; ``vals`` (M, K)
    shifted scores that hold the whole support (packed candidates, sorted rows or the top k;
    ``-inf`` padding allowed), so the probabilities on the support are
    ``MAPPINGS[kind].probs(vals, tau)``; ``zs`` the dense shifted scores ``z - m`` when the
    search built them; ``top_idx`` (M, k) the columns of ``vals`` for the top-k path (``None``
    otherwise). The dense search (``"dense"``) instead leaves ``vals`` and ``zs`` ``None`` and gives
    ``d = [x - tau]_+`` (M, C) at the exact ``tau`` (``x`` the shifted scores in the mapping's
    scale; ``d`` is written over them) and its row sums ``sums`` (``(sum d, sum d^2, sum d^3)``, the
    last two ``None`` for sparsemax): the probabilities and the loss value then need no further
    pass over the scores.
    """

    __slots__ = ("m", "tau", "vals", "zs", "top_idx", "d", "sums")

    def __init__(self, m: Tensor, tau: Tensor, vals: Tensor, zs: Optional[Tensor] = None,
                 top_idx: Optional[Tensor] = None, d: Optional[Tensor] = None, sums: Optional[tuple] = None):
        self.m, self.tau, self.vals, self.zs, self.top_idx = m, tau, vals, zs, top_idx
        self.d, self.sums = d, sums

    def shifted(self, z: Tensor) -> Tensor:
        return self.zs if self.zs is not None else z - self.m


#: Newton steps before falling back to a sort (typical rows need 2-7).
NEWTON_MAX_ITER = 32


#: rows wider than this take the top-k search on CPU (:func:`auto_search`); the dense search meets
#: them only when a support outgrows the top-k (:data:`AUTO_TOPK_DOUBLINGS`)
WIDE_ROWS = 2048


#: top-k first sizes of :func:`auto_search` (typical supports are a few entries; wider ones double)
AUTO_TOPK = {"sparsemax": (8, 32), "entmax15": (32, 128)}


def auto_search(kind: str, m: int, c: int, native: Optional[bool] = None) -> Tuple[str, Optional[int]]:
    """``(method, k)`` of the fastest exact search for an ``(m, c)`` batch on one CPU thread:
    ``("topk", k0)``, ``("dense", None)`` or ``("sort", None)`` (measured crossovers).

    ``native``: whether the dense search runs in the C kernel (:mod:`losses.kernels.entmax_native`; ``None``:
    whether it is built and enabled now). With it the dense search is taken at every width: it was
    the fastest at every shape measured up to 10,000 classes (one thread, idle machine, forward +
    backward / ``F.cross_entropy``: at (256, 4096) sparsemax 0.53x against the top-k's 1.39x,
    entmax-1.5 0.78x against 2.50x; at (256, 1e4) 0.60x / 0.62x against 0.89x / 1.49x; at
    (64, 100) 3.8x against 13.5x on the loaded machine) and equal to the top-k within the noise at
    1e5 classes (0.59x / 0.63x against 0.58x / 0.65x), where it also needs no doubling for wide
    supports. Without the kernel the crossovers below are the PyTorch searches'."""
    narrow, wide = AUTO_TOPK[kind]
    if native is None:
        native = _entmax_native.ready()
    if native:
        return "dense", None
    if c > WIDE_ROWS:
        return "topk", wide
    small = m * c <= 32768
    if kind == "entmax15":
        if c <= 32:
            return "sort", None
        if c <= 128:
            return "topk", narrow
        return ("topk", wide) if small else ("dense", None)
    if c <= 128 and small:
        return "topk", narrow
    return "dense", None


def _eager_threshold(z: Tensor, kind: str) -> Tuple[Tensor, Tensor]:
    """``(m, tau)`` of the fastest exact CPU search (:func:`auto_search`), run eagerly."""
    th = threshold(kind, z, None)
    return th.m.clone(), th.tau.clone()


def _fake_threshold(z: Tensor, kind: str) -> Tuple[Tensor, Tensor]:
    return z.new_empty((z.shape[0], 1)), z.new_empty((z.shape[0], 1))


#: ``torch.compile`` cannot trace the data-dependent CPU searches (host syncs, shapes that depend
#: on the data), and the sort it would trace instead costs ~15x ``F.cross_entropy`` at C = 1e5. So
#: on CPU a compiled graph calls the searches as one opaque operator that returns the row max
#: ``m`` and the threshold ``tau`` ``(M, 1)``; the dense passes around it (``[z - m - tau]_+``, the
#: loss value, the backward) are traced and fused as usual. ``None`` on a torch without
#: ``torch.library.custom_op`` (the sort is traced there).
_THRESHOLD_OP = None
_THRESHOLD_KEEP_OP = None


def _eager_threshold_keep(z: Tensor, keep: Tensor, kind: str) -> Tuple[Tensor, Tensor]:
    """:func:`_eager_threshold` of ``z`` with the rows where ``keep (M,)`` is False set to 0 first
    (ignored positions, whose scores may be anything): :func:`losses._core.zero_rows`, which runs
    eagerly here and so zeroes only when some row is ignored (a host look at ``keep`` is free)."""
    return _eager_threshold(zero_rows(z, keep), kind)


def _fake_threshold_keep(z: Tensor, keep: Tensor, kind: str) -> Tuple[Tensor, Tensor]:
    return _fake_threshold(z, kind)


if hasattr(torch, "library") and hasattr(torch.library, "custom_op"):
    try:
        _THRESHOLD_OP = torch.library.custom_op(
            "losses::exact_entmax_threshold", _eager_threshold, mutates_args=(), device_types="cpu",
            schema="(Tensor z, str kind) -> (Tensor, Tensor)")
        _THRESHOLD_OP.register_fake(_fake_threshold)
        # the same search on the raw scores and the kept-rows mask: a traced graph whose ignored rows
        # are zeroed by a `where` would otherwise materialise that `where` (a read and a write of the
        # whole scores) only to hand it to the opaque operator; the passes after the search fuse it
        _THRESHOLD_KEEP_OP = torch.library.custom_op(
            "losses::exact_entmax_threshold_keep", _eager_threshold_keep, mutates_args=(), device_types="cpu",
            schema="(Tensor z, Tensor keep, str kind) -> (Tensor, Tensor)")
        _THRESHOLD_KEEP_OP.register_fake(_fake_threshold_keep)
    except (RuntimeError, TypeError):  # pragma: no cover - registered twice (module reloaded) or old API
        _THRESHOLD_OP = _THRESHOLD_KEEP_OP = None


def threshold(kind: str, z: Tensor, k: Optional[int], method: Optional[str] = None,
              max_iter: int = NEWTON_MAX_ITER, raw: Optional[Tensor] = None,
              keep: Optional[Tensor] = None) -> Threshold:
    """Exact threshold search for ``kind`` in {"sparsemax", "entmax15"} on ``z (M, C)``.

    ``k`` given (and ``< C``): top-k partial sort, the batch redone with ``2k`` while some row's
    support reaches ``k``. ``k=None``: ``method="sort"`` sorts every row; ``method="newton"``
    (packed candidates) and ``method="dense"`` (whole rows from the chunk maxima's threshold) use
    the sort-free exact Newton search (falling back to the sort after ``max_iter`` steps).
    The default (``None``) is :func:`auto_search` on CPU, which then decides whatever ``k`` says
    (under ``torch.compile`` the search runs as the opaque operator above), and the sort (or the
    given ``k``'s top-k) elsewhere (no host syncs, one static graph). ``raw``, ``keep``: when ``z`` is
    ``raw`` with the rows where ``keep`` is False zeroed (ignored positions), the compiled CPU path
    hands the operator ``raw`` and ``keep`` instead, so that the zeroed copy is never materialised.
    """
    c = z.shape[-1]
    if method is None and z.device.type == "cpu" and _THRESHOLD_OP is not None and _compiling():
        if raw is not None and keep is not None and _THRESHOLD_KEEP_OP is not None:
            m, tau = _THRESHOLD_KEEP_OP(raw, keep, kind)
        else:
            m, tau = _THRESHOLD_OP(z, kind)
        zs = z - m
        return Threshold(m, tau, zs, zs=zs)
    if method is None and z.device.type == "cpu" and not _compiling():
        # the measured choice decides on CPU; a given k (a speed option: the result is the same)
        # gives way to it, so that no public path is slower than the default
        method, k0 = auto_search(kind, z.shape[0], c)
        k = None
        if method == "topk":
            if k0 < c:
                return _threshold_topk(kind, z, int(k0), dense_after=AUTO_TOPK_DOUBLINGS, max_iter=max_iter)
            method = "sort"
    if k is not None and k < c:
        return _threshold_topk(kind, z, int(k))
    if method is None:
        method = "sort"
    if method == "dense" and z.shape[0] > 0:
        th = _threshold_dense(kind, z, max_iter)
        if th is not None:
            return th
    if method == "newton" and z.shape[0] > 0:
        m = row_max(z)
        zs = z - m
        found = _exact(kind).tau_candidates(zs, max_iter)
        if found is not None:
            return Threshold(m, found[0], found[1], zs=zs)
    sorted_z = torch.sort(z, dim=-1, descending=True).values
    m = sorted_z[:, :1]
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    s = sorted_z - m
    tau, _ = _exact(kind).tau_sorted(s)
    return Threshold(m, tau, s)


#: top-k rounds the CPU default (:func:`auto_search`) doubles ``k`` before it gives the batch to the
#: dense search instead: a top-k of k columns costs about one ``F.cross_entropy`` up to k ~ 128 and
#: grows with k (at (1024, 8192), one thread: 42 ms at k = 32, 160 ms at 1,024, 240 ms at 2,048, the
#: full sort 755 ms), while the dense search's cost hardly depends on the support. Near-uniform
#: rows (a language model's logits at initialisation: entmax-1.5's support is then almost the whole
#: row) took 7 doublings and 2.9 s where the dense search takes ~0.4 s.
AUTO_TOPK_DOUBLINGS = 1


def _threshold_topk(kind: str, z: Tensor, k: int, dense_after: Optional[int] = None,
                    max_iter: int = NEWTON_MAX_ITER) -> Threshold:
    """Top-k search from ``k`` columns, the batch redone with ``2k`` while some row's support reaches
    ``k``. ``dense_after``: after that many doublings a batch that still overflows goes to the dense
    search (:func:`_threshold_dense`; the doubling goes on only if that search gives up)."""
    c = z.shape[-1]
    kk = k
    rounds = 0
    while True:
        top_v, top_i = torch.topk(z, kk, dim=-1, largest=True, sorted=True)
        m = top_v[:, :1]
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        s = top_v - m
        tau, kstar = _exact(kind).tau_sorted(s)
        if kk >= c or z.shape[0] == 0 or not bool((kstar >= kk).any()):
            return Threshold(m, tau, s, top_idx=top_i)
        if dense_after is not None and rounds >= dense_after:
            th = _threshold_dense(kind, z, max_iter)
            if th is not None:
                return th
            dense_after = None
        rounds += 1
        kk = min(2 * kk, c)  # some row's support reached kk: redo the batch with 2kk


def dense_probs(kind: str, z: Tensor, th: Threshold) -> Tensor:
    """The ``(M, C)`` probabilities for a :class:`Threshold`."""
    probs = _exact(kind).probs
    if th.top_idx is not None:
        return torch.zeros_like(z).scatter_(-1, th.top_idx, probs(th.vals, th.tau))
    if th.d is not None:
        return _exact(kind).probs_from_d(th.d)
    return probs(th.shifted(z), th.tau)


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
    """``(M, 1)`` gradient w.r.t. alpha of ``<v, entmax_alpha(z)>`` (docs/losses/sparsemax.md, alpha-VJP)."""
    am1 = alpha - 1
    gs = g.sum(dim=-1, keepdim=True)
    pt = g / torch.where(gs > 0, gs, torch.ones_like(gs))
    plogp = _xlogx(p)
    ent = plogp.sum(dim=-1, keepdim=True)
    term = (p - pt) / (am1 * am1) - (plogp - pt * ent) / am1
    return (v * term).sum(dim=-1, keepdim=True)


# --------------------------------------------------------------------------------------
# the mappings: what differs between sparsemax, entmax-1.5 and bisection
# --------------------------------------------------------------------------------------


class _Sparsemax:
    """Sparsemax (``alpha = 2``): threshold, probabilities ``[z' - tau]_+`` and backward.

    Every method works on shifted scores ``s = z - m`` (``max s = 0``); ``tau`` is in the same
    coordinates."""

    name = "sparsemax"
    alpha = 2.0  # the Tsallis exponent of the Fenchel-Young loss
    exact = True  # a closed-form threshold (sort / Newton / top-k), not bisection
    scale = 1.0  # the dense search runs on x = scale * (z - max)
    tau_dense = staticmethod(sparsemax_tau_dense)

    @staticmethod
    def probs_from_d(d: Tensor) -> Tensor:
        """Probabilities from the dense search's ``d = [z' - tau]_+`` (they are ``d``)."""
        return d

    @staticmethod
    def omega_dense(p: Tensor, d: Tensor, tau: Tensor, sums: tuple) -> Tensor:
        """:meth:`omega` from the dense probabilities ``p = d`` and ``sums[0] = sum p``."""
        sq = torch.linalg.vector_norm(p, dim=-1, keepdim=True).square()
        return (tau * sums[0] + 1) + 0.5 * (sq - 1)

    @staticmethod
    def tau_sorted(s: Tensor) -> Tuple[Tensor, Tensor]:
        """``(tau, kstar)`` from sorted (descending) shifted scores."""
        return sparsemax_tau_sorted(s)

    @staticmethod
    def probs(s: Tensor, tau: Tensor) -> Tensor:
        """Probabilities from shifted scores ``s`` (any layout) and ``tau`` (a fresh tensor)."""
        return (s - tau).clamp_(min=0)

    @staticmethod
    def tau_candidates(zs: Tensor, max_iter: int) -> Optional[Tuple[Tensor, Tensor]]:
        """Sort-free exact threshold: pack the candidates ``zs > -1``, then Newton. Returns
        ``(tau, packed)`` (``packed``: shifted scores holding the whole support) or ``None``."""
        packed = _compact_candidates(zs, -1.0)
        tau = sparsemax_tau_newton(packed, max_iter)
        return None if tau is None else (tau, packed)

    @staticmethod
    def omega(ps: Tensor, tau: Tensor) -> Tensor:
        """``<p, z'> + H_2(p)`` per row from the support probabilities ``ps`` and ``tau``:
        ``1/2 sum p^2 + tau sum p + 1/2``."""
        sq = torch.linalg.vector_norm(ps, dim=-1, keepdim=True).square()
        return (tau * ps.sum(-1, keepdim=True) + 1) + 0.5 * (sq - 1)

    @staticmethod
    def vjp(p: Tensor, v: Tensor) -> Tensor:
        """Backward of the activation: ``v - mean_S(v)`` on the support ``S``."""
        return sparsemax_vjp(p, v)


class _Entmax15:
    """Entmax-1.5: threshold in the scale ``x = z'/2``, probabilities ``[x - tau]_+^2``, backward."""

    name = "entmax15"
    alpha = 1.5
    exact = True
    scale = 0.5
    tau_dense = staticmethod(entmax15_tau_dense)

    @staticmethod
    def probs_from_d(d: Tensor) -> Tensor:
        """Probabilities from the dense search's ``d = [z'/2 - tau]_+``: ``d^2``."""
        return d * d

    @staticmethod
    def omega_dense(p: Tensor, d: Tensor, tau: Tensor, sums: tuple) -> Tensor:
        """:meth:`omega` from ``p = d^2``, ``sums = (sum d, sum d^2 = sum p)``: ``sum p^1.5 = <p, d>``."""
        p15 = sums[2] if len(sums) > 2 and sums[2] is not None else torch.linalg.vecdot(p, d, dim=-1).unsqueeze(-1)
        return 2 * (tau * sums[1] + 1) + (2.0 / 3.0) * (p15 - 1)

    @staticmethod
    def tau_sorted(s: Tensor) -> Tuple[Tensor, Tensor]:
        return entmax15_tau_sorted(s * 0.5)

    @staticmethod
    def probs(s: Tensor, tau: Tensor) -> Tensor:
        return (s * 0.5 - tau).clamp_(min=0).square_()

    @staticmethod
    def tau_candidates(zs: Tensor, max_iter: int) -> Optional[Tuple[Tensor, Tensor]]:
        # x = zs/2: one Newton step from tau_0 = -1 on the full rows gives a much tighter lower
        # bound tau_1 <= tau (f is convex), so far fewer candidates are packed
        d = (zs * 0.5 + 1).clamp_(min=0)
        s1 = d.sum(dim=-1, keepdim=True)
        s2 = torch.linalg.vector_norm(d, dim=-1, keepdim=True).square()
        tau1 = torch.where(s1 > 0, -1 + (s2 - 1) / (2 * torch.where(s1 > 0, s1, torch.ones_like(s1))), -1.0)
        tau1 = torch.minimum(tau1, torch.zeros_like(tau1))
        packed = _compact_candidates(zs, 2 * tau1)
        x = packed * 0.5
        tau = entmax15_tau_newton(x, max_iter, tau1)
        return None if tau is None else (_polish_entmax15(x, tau), packed)

    @staticmethod
    def omega(ps: Tensor, tau: Tensor) -> Tensor:
        """``<p, z'> + H_1.5(p)`` per row (``x = z'/2 = sqrt(p) + tau`` on the support):
        ``2/3 sum p^1.5 + 2 tau sum p + 4/3``, grouped to be exactly 0 on one-hot rows."""
        return 2 * (tau * ps.sum(-1, keepdim=True) + 1) + (2.0 / 3.0) * ((ps * ps.sqrt()).sum(-1, keepdim=True) - 1)

    @staticmethod
    def vjp(p: Tensor, v: Tensor) -> Tensor:
        """Backward of the activation: ``g*v - (<g, v>/sum g) g`` with ``g = sqrt(p)``."""
        return entmax15_vjp(p, v)


class _Bisect:
    """Entmax-alpha for any ``alpha > 1`` by bisection (``alpha`` per call, possibly learnable)."""

    name = "bisect"
    alpha = None
    exact = False

    @staticmethod
    def probs_and_max(z: Tensor, alpha: Tensor, n_iter: int, alpha_float: Optional[float]) -> Tuple[Tensor, Tensor]:
        """``(p, m)``: the probabilities and the row max (see :func:`bisect_probs`)."""
        return bisect_probs(z, alpha, n_iter, alpha_float)

    @staticmethod
    def vjp(p: Tensor, v: Tensor, alpha: Tensor, need_alpha: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """``(dz, dalpha)`` of ``<v, entmax_alpha(z)>`` (``dalpha`` only if ``need_alpha``)."""
        g = bisect_g(p, alpha)
        dz = entmax_vjp(p, v, g)
        da = None
        if need_alpha:
            da = alpha_vjp(p, v, alpha, g)
            if da.shape != alpha.shape:
                da = da.sum(dim=0, keepdim=True)
        return dz, da


#: the mapping objects by name ("sparsemax", "entmax15", "bisect")
MAPPINGS = {m.name: m for m in (_Sparsemax, _Entmax15, _Bisect)}


def _exact(kind: str):
    mapping = MAPPINGS[kind]
    assert mapping.exact, kind
    return mapping


# --------------------------------------------------------------------------------------
# autograd Functions of the activations (first order only)
# --------------------------------------------------------------------------------------


class ExactEntmaxFunction(torch.autograd.Function):
    """Sparsemax or entmax-1.5 of ``z (M, C)``: ``apply(z, kind, k)`` with ``kind`` a name of
    :data:`MAPPINGS` ("sparsemax", "entmax15") and ``k`` the top-k size (``None``: exact)."""

    @staticmethod
    def forward(ctx, z: Tensor, kind: str, k: Optional[int]) -> Tensor:
        p = dense_probs(kind, z, threshold(kind, z, k))
        ctx.kind = kind
        ctx.save_for_backward(p)
        return p

    @staticmethod
    @once_differentiable("sparsemax / entmax15")
    def backward(ctx, v: Tensor):
        (p,) = ctx.saved_tensors
        return _exact(ctx.kind).vjp(p, v), None, None


class EntmaxBisectFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: Tensor, alpha: Tensor, n_iter: int, alpha_float: Optional[float]) -> Tensor:
        p, _ = _Bisect.probs_and_max(z, alpha, n_iter, alpha_float)
        ctx.save_for_backward(p, alpha)
        return p

    @staticmethod
    @once_differentiable("entmax_bisect")
    def backward(ctx, v: Tensor):
        p, alpha = ctx.saved_tensors
        dz, da = _Bisect.vjp(p, v, alpha, ctx.needs_input_grad[1])
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


def _fy_dense_ids(kind: str, z: Tensor, y: Tensor, th: Threshold, divisor: int, need_grad: bool):
    """``(total, grad)`` of the Fenchel-Young loss of ids ``y (M,)`` from a dense search result:
    ``total`` the sum of the per-row losses divided by ``divisor``, ``grad`` (if ``need_grad``)
    ``(p* - onehot(y)) / divisor`` built in the search's own ``d`` buffer (which it overwrites).

    Per row ``L = omega - z'_y`` with ``z'_y = z_y - m`` and ``omega = <p*, z'> + H(p*)`` from
    ``tau`` and the sums over the support: sparsemax ``omega = (tau s1 + 1) + (sum p^2 - 1)/2``;
    entmax-1.5 (``x = z'/2 = sqrt(p) + tau`` there) ``omega = 2 (tau sum p + 1) + 2/3 (sum p^1.5 - 1)``,
    both exactly 0 on one-hot rows; clamped at 0 against rounding."""
    d, tau = th.d, th.tau
    scale = 1.0 / divisor
    if kind == "sparsemax":
        omega = torch.linalg.vector_norm(d, dim=-1, keepdim=True).square_().sub_(1).mul_(0.5)
        omega.add_(torch.mul(tau, th.sums[0]).add_(1))
        grad = d.mul_(scale) if need_grad and divisor != 1 else d
    else:
        p15 = th.sums[2].clone()  # sum p^1.5 = sum d^3
        p = d.square_()
        omega = p15.sub_(1).mul_(2.0 / 3.0).add_(torch.mul(tau, th.sums[1]).add_(1).mul_(2))
        grad = p.mul_(scale) if need_grad and divisor != 1 else p
    total = omega.sub_(z.gather(-1, y.unsqueeze(-1)).sub_(th.m)).clamp_(min=0).sum()
    if divisor != 1:
        total = total / divisor
    if not need_grad:
        return total, None
    return total, grad.scatter_(-1, y.unsqueeze(-1), -scale, reduce="add")


class FYLossFunction(torch.autograd.Function):
    """Per-row Fenchel-Young loss ``L(z; q) = <p* - q, z> + H(p*) - H(q)``.

    ``forward(z (M, C), y (M,) int64 or None, q (M, C) or None, alpha (M|1, 1) or None, kind, k,
    n_iter, alpha_float)`` returns ``(M,)``; exactly one of ``y`` (class ids, already made safe for ignored
    rows) and ``q`` (distributions) is given. ``kind`` is "sparsemax", "entmax15" or "bisect".
    Backward: ``dz = p* - q``; ``dq = -z' + q^(alpha-1)/(alpha-1)`` (shifted scores);
    ``dalpha = dH(p*)/dalpha - dH(q)/dalpha`` (Danskin).
    """

    @staticmethod
    def forward(ctx, z, y, q, alpha, kind, k, n_iter, alpha_float, divisor=None, raw=None, keep=None):
        # raw, keep: z is raw with the rows where keep is False zeroed (see threshold); no gradient
        mapping = MAPPINGS[kind]
        ctx.divisor = divisor
        ctx.kind = kind
        ctx.rows = False
        ctx.has_y = y is not None
        zs = tau = top_i = p = None
        dense = False
        if not mapping.exact:
            p, m = mapping.probs_and_max(z, alpha, n_iter, alpha_float)
            zs = z - m
            omega = _dot_masked(p, zs) + tsallis(p, alpha)
        else:
            # ids on CPU with the C kernel built (the CPU default's search then, at every width):
            # values and gradients from one kernel call; None from it leaves the case to the path below
            rows = None
            if y is not None and z.device.type == "cpu" and _entmax_native.usable(z):
                entmax = mapping.scale != 1.0
                if _compiling():
                    if _FY_ROWS_OP is not None:  # traced: one opaque operator (see _FY_ROWS_OP)
                        rows = _FY_ROWS_OP(z if raw is None else raw, y.long(), None if raw is None else keep, kind)
                elif divisor is None:
                    rows = _entmax_native.fy_rows(z, y, None, entmax)
                elif raw is None:
                    # a sum / mean: the kernel writes the whole gradient (p* - onehot) / divisor
                    ctx.fused = ctx.needs_input_grad[0]
                    done = _entmax_native.fy_ids(z, y, entmax, divisor, ctx.fused)
                    if done is not None:
                        total, grad = done
                        if ctx.fused:
                            ctx.save_for_backward(grad)
                        return total
            if rows is not None:
                values, grad = rows
                ctx.rows = ctx.needs_input_grad[0]
                if ctx.rows:
                    ctx.save_for_backward(grad)
                if divisor is not None:
                    total = values.sum()
                    return total if divisor == 1 else total / divisor
                return values
            # value from tau and the support only (th.vals holds it); no dense pass here
            th = threshold(kind, z, k, raw=raw, keep=keep)
            if th.d is not None and y is not None and divisor is not None:
                # the dense search with ids and a sum / mean: value and gradient from its last pass
                ctx.fused = ctx.needs_input_grad[0]
                total, grad = _fy_dense_ids(kind, z, y, th, divisor, ctx.fused)
                if ctx.fused:
                    ctx.save_for_backward(grad)
                return total
            m, tau, zs = th.m, th.tau, th.zs
            if th.d is not None:  # the dense search: p from its last pass, kept for the backward
                dense = True
                p = mapping.probs_from_d(th.d)
                omega = mapping.omega_dense(p, th.d, tau, th.sums)
            else:
                ps = mapping.probs(th.vals, tau)
                omega = mapping.omega(ps, tau)
                if th.top_idx is not None:
                    p, top_i = ps, th.top_idx
        if y is not None:
            loss = omega - (z.gather(-1, y.unsqueeze(-1)) - m)
        else:
            a = alpha if alpha is not None else torch.full_like(m, mapping.alpha)
            if zs is None:
                zs = z - m
            loss = omega - _dot_masked(q, zs) - tsallis(q, a)
        loss = loss.clamp(min=0).squeeze(-1)
        ctx.topk = top_i is not None
        ctx.fused = dense and divisor is not None and y is not None and ctx.needs_input_grad[0]
        if ctx.fused:
            # the whole gradient, (p* - onehot(y)) / divisor, built in p's own buffer (the dense
            # search's last pass, owned here); the backward returns it as it is for a unit grad
            scale = 1.0 / divisor
            if divisor != 1:
                p.mul_(scale)
            p = add_at_target(p, y, m.new_full((), -scale))
            ctx.save_for_backward(p)
        else:
            # backward: bisect keeps p; top-k keeps p on the top k; else p is rebuilt from zs and tau
            ctx.save_for_backward(p, top_i, zs if p is None else None, tau, y, q, alpha, z, m)
        if divisor is not None:  # every position has unit weight 1: the reduction is done here
            total = loss.sum()
            return total if divisor == 1 else total / divisor
        return loss

    @staticmethod
    @once_differentiable("sparsemax_loss / entmax15_loss / entmax_bisect_loss")
    def backward(ctx, grad):
        if ctx.rows:  # the rows' gradients p* - onehot(y), for unit row gradients
            (dz,) = ctx.saved_tensors
            if ctx.divisor is not None:
                dz = dz * (grad / ctx.divisor)
            else:
                dz = dz * grad.unsqueeze(-1)
            return dz, None, None, None, None, None, None, None, None, None, None
        if ctx.fused:  # the forward built the gradient for a unit grad (the usual loss.backward())
            (dz,) = ctx.saved_tensors
            if not (grad.device.type == "cpu" and not _compiling() and float(grad) == 1.0):
                dz = dz * grad
            return dz, None, None, None, None, None, None, None, None, None, None
        mapping = MAPPINGS[ctx.kind]
        p, top_i, zs, tau, y, q, alpha, z, m = ctx.saved_tensors
        if ctx.divisor is not None:  # one scalar gradient for every row
            grad = (grad / ctx.divisor).expand(z.shape[0])
        g = grad.unsqueeze(-1)
        if ctx.topk:
            dz = torch.zeros_like(z).scatter_(-1, top_i, p * g)
        elif p is not None:
            dz = p * g
        else:
            if zs is None:
                zs = z - m
            dz = mapping.probs(zs, tau).mul_(g)
        if ctx.has_y:
            dz = add_at_target(dz, y, -g)
        else:
            dz = dz - q * g
        dq = da = None
        if not ctx.has_y and ctx.needs_input_grad[2]:
            a = alpha if alpha is not None else torch.full_like(m, mapping.alpha)
            dq = (rpow(q, a - 1) / (a - 1) - (z - m)) * g
        if not mapping.exact and ctx.needs_input_grad[3]:
            dH = tsallis_dalpha(p, alpha)
            if not ctx.has_y:
                dH = dH - tsallis_dalpha(q, alpha)
            da = dH * g
            if da.shape != alpha.shape:
                da = da.sum(dim=0, keepdim=True)
        return dz, None, dq, da, None, None, None, None, None, None, None


# --------------------------------------------------------------------------------------
# the per-row loss and gradient as one opaque operator under torch.compile (CPU)
# --------------------------------------------------------------------------------------


def _eager_fy_rows(z: Tensor, y: Tensor, keep: Optional[Tensor], kind: str) -> Tuple[Tensor, Tensor]:
    """``(values (M,), grad (M, C))``: the exact Fenchel-Young losses of the rows with ids ``y`` and
    their gradients ``p* - onehot(y)``, rows where ``keep`` is False (``None``: every row kept)
    given 0 and a zero gradient without being read. The C kernel at every width (here the eager
    top-k of wide rows would still have to be spread into the dense gradient: at (256, 1e5) 1.41x
    compiled ``F.cross_entropy`` against the kernel's 0.99x, interleaved, one thread), else (no
    kernel, or a case it hands back) the eager arithmetic, so that values, errors and fallbacks
    are the eager ones."""
    if _entmax_native.usable(z):
        done = _entmax_native.fy_rows(z, y, keep, kind == "entmax15")
        if done is not None:
            return done
    # autograd does not record inside an operator: the forward's arithmetic, p* - onehot by hand
    zz = z if keep is None else zero_rows(z, keep)
    mapping = _exact(kind)
    th = threshold(kind, zz, None)
    p = dense_probs(kind, zz, th)
    if th.d is not None:
        omega = mapping.omega_dense(p, th.d, th.tau, th.sums)
    else:
        omega = mapping.omega(mapping.probs(th.vals, th.tau), th.tau)
    values = (omega - (zz.gather(-1, y.unsqueeze(-1)) - th.m)).clamp(min=0).squeeze(-1)
    grad = add_at_target(p.clone(), y, p.new_full((), -1.0))
    if keep is not None:
        values = values.masked_fill(~keep, 0.0)
        grad = grad.masked_fill(~keep.unsqueeze(-1), 0.0)
    return values, grad


def _fake_fy_rows(z: Tensor, y: Tensor, keep: Optional[Tensor], kind: str) -> Tuple[Tensor, Tensor]:
    return z.new_empty(z.shape[:1]), torch.empty_like(z)


#: under ``torch.compile`` on CPU, the exact losses with ids are this one opaque operator when the C
#: kernel is built (one call: the row max, the search, the values and the gradients ``p* - onehot``
#: of the rows; the ignored rows' raw scores are not read): the traced graph keeps the reduction and,
#: in the backward, the scaling of the saved gradient. Without the kernel, the threshold operator
#: above and traced passes run.
_FY_ROWS_OP = None
if _THRESHOLD_OP is not None:
    try:
        _FY_ROWS_OP = torch.library.custom_op(
            "losses::exact_entmax_fy_rows", _eager_fy_rows, mutates_args=(), device_types="cpu",
            schema="(Tensor z, Tensor y, Tensor? keep, str kind) -> (Tensor, Tensor)")
        _FY_ROWS_OP.register_fake(_fake_fy_rows)
    except (RuntimeError, TypeError):  # pragma: no cover - registered twice (module reloaded) or old API
        _FY_ROWS_OP = None
