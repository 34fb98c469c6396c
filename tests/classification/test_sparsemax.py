"""Sparsemax / entmax-1.5 / bisection entmax: activations and Fenchel-Young losses (docs/losses/sparsemax.md).

Oracles are independent float64 loops written from the formulas of docs/losses/sparsemax.md (sort, find k*, tau; a
scalar bisection for general alpha) on Python floats; gradients are compared with the analytic
Jacobian/FY formulas evaluated by loops, with finite differences, and with gradcheck.
"""

from __future__ import annotations

import copy
import doctest
import importlib
import math
import pickle

import pytest
import torch

import losses
from tests._helpers import weighted_reduce
from tests._helpers.rows import LOGITS, entry

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "sparsemax": entry("sparsemax_loss", "SparsemaxLoss", LOGITS, unit="position"),
    "entmax15": entry("entmax15_loss", "Entmax15Loss", LOGITS, unit="position"),
    "entmax_bisect": entry("entmax_bisect_loss", "EntmaxBisectLoss", LOGITS, unit="position"),
}
EXPECTED_HELPERS = ("sparsemax", "entmax15", "entmax_bisect")

@pytest.fixture(params=["native", "torch"], autouse=True)
def search_path(request, monkeypatch):
    """Runs every test of this file once with the C threshold kernel
    (losses/kernels/entmax_native.py) and once with the PyTorch searches it replaces on CPU
    (the path taken where no C compiler exists, and whose shape-based choice then differs)."""
    native = importlib.import_module("losses.kernels.entmax_native")
    if request.param == "native":
        ok, why = native.available()
        assert ok, f"the C threshold kernel did not build here: {why}"
    monkeypatch.setattr(native, "enabled", request.param == "native")
    return request.param


INF = float("inf")
NINF = float("-inf")

LOSSES = {
    "sparsemax": (losses.sparsemax_loss, 2.0, {}),
    "entmax15": (losses.entmax15_loss, 1.5, {}),
    "entmax_bisect": (losses.entmax_bisect_loss, 1.5, {}),
}


# --------------------------------------------------------------------------------------
# float64 loop oracles (Python floats, no torch)
# --------------------------------------------------------------------------------------


def o_sparsemax(z):
    """sort z down; k* = max{k : 1 + k z_(k) > sum_{j<=k} z_(j)}; tau = (sum_{j<=k*} - 1)/k*."""
    zs = sorted(z, reverse=True)
    csum, kstar, ksum = 0.0, 0, 0.0
    for k in range(1, len(zs) + 1):
        if zs[k - 1] == NINF:
            break
        csum += zs[k - 1]
        if 1.0 + k * zs[k - 1] > csum:
            kstar, ksum = k, csum
    tau = (ksum - 1.0) / kstar
    return [max(v - tau, 0.0) if v != NINF else 0.0 for v in z], tau


def o_entmax15(z):
    """x = z/2 sorted down; tau_k = mu_k - sqrt(max((1 - k(m_k - mu_k^2))/k, 0)); k* = #{tau_k <= x_(k)}."""
    x = sorted((v / 2.0 for v in z if v != NINF), reverse=True)
    taus, count = [], 0
    s1 = s2 = 0.0  # running sums of x_(1..k) and their squares, added in sum()'s left-to-right order
    for k in range(1, len(x) + 1):
        s1 += x[k - 1]
        s2 += x[k - 1] * x[k - 1]
        mu = s1 / k
        msq = s2 / k
        delta = (1.0 - k * (msq - mu * mu)) / k
        tau_k = mu - math.sqrt(max(delta, 0.0))
        taus.append(tau_k)
        if tau_k <= x[k - 1]:
            count += 1
    tau = taus[count - 1]
    return [max(v / 2.0 - tau, 0.0) ** 2 if v != NINF else 0.0 for v in z], tau


def o_entmax_alpha(z, alpha):
    """[(alpha-1) z - tau]_+^(1/(alpha-1)) with tau from a 200-step scalar bisection."""
    x = [(alpha - 1.0) * v if v != NINF else NINF for v in z]
    mx = max(x)

    def total(t):
        return sum(max(v - t, 0.0) ** (1.0 / (alpha - 1.0)) for v in x if v != NINF)

    lo, hi = mx - 1.0, mx
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if total(mid) >= 1.0:
            lo = mid
        else:
            hi = mid
    tau = 0.5 * (lo + hi)
    return [max(v - tau, 0.0) ** (1.0 / (alpha - 1.0)) if v != NINF else 0.0 for v in x], tau


def o_probs(kind, z, alpha=None):
    if all(v == NINF for v in z):  # the library's convention for a row without a finite score
        return [0.0] * len(z)
    if kind == "sparsemax":
        return o_sparsemax(z)[0]
    if kind == "entmax15":
        return o_entmax15(z)[0]
    return o_entmax_alpha(z, alpha)[0]


def o_tsallis(p, alpha):
    return (1.0 - sum(t ** alpha for t in p if t > 0)) / (alpha * (alpha - 1.0))


def o_fy(z, q, alpha, p):
    """<p - q, z> + H(p) - H(q), with p_j z_j (q_j z_j) taken as 0 where p_j (q_j) is 0."""
    sp = sum(pi * zi for pi, zi in zip(p, z) if pi > 0)
    sq = sum(qi * zi for qi, zi in zip(q, z) if qi > 0)
    return sp - sq + o_tsallis(p, alpha) - o_tsallis(q, alpha)


def o_vjp(p, v, alpha):
    """J^T v with J = diag(g) - g g^T / sum g, g = p^(2-alpha) on the support."""
    g = [pi ** (2.0 - alpha) if pi > 0 else 0.0 for pi in p]
    gs = sum(g)
    out = []
    for i in range(len(p)):
        acc = 0.0
        for j in range(len(p)):
            jac = (g[i] if i == j else 0.0) - g[i] * g[j] / gs
            acc += jac * v[j]
        out.append(acc)
    return out


def rows_of(x, dim):
    """(rows as lists, shape of the moved tensor) with `dim` moved last."""
    moved = x.detach().double().movedim(dim, -1)
    return moved.reshape(-1, moved.shape[-1]).tolist(), moved.shape


def oracle_activation(kind, x, dim=-1, alpha=None):
    """Dense oracle output (float64 tensor) for an activation along `dim`."""
    rows, shape = rows_of(x, dim)
    if isinstance(alpha, torch.Tensor):
        alphas = alpha.detach().double().expand(*(list(x.movedim(dim, -1).shape[:-1]))).reshape(-1).tolist()
    else:
        alphas = [alpha] * len(rows)
    out = [o_probs(kind, r, a) for r, a in zip(rows, alphas)]
    return torch.tensor(out, dtype=torch.float64).reshape(shape).movedim(-1, dim)


def oracle_loss(kind, x, target, alpha=None, ignore_index=-100):
    """Per-position oracle values and gradients (p - q) for the FY loss; classes on dim 1."""
    a = {"sparsemax": 2.0, "entmax15": 1.5}.get(kind, alpha)
    rows, shape = rows_of(x, 1)
    m = len(rows)
    if target.is_floating_point():
        qrows = rows_of(target, 1)[0]
        valid = [True] * m
    else:
        ids = target.reshape(-1).tolist()
        valid = [t != ignore_index for t in ids]
        qrows = [[1.0 if (j == t) else 0.0 for j in range(shape[-1])] for t in ids]
    if isinstance(a, torch.Tensor):
        alphas = a.detach().double().expand(shape[:-1]).reshape(-1).tolist()
    else:
        alphas = [a] * m
    vals, grads = [], []
    for r, q, ok, al in zip(rows, qrows, valid, alphas):
        if not ok:
            vals.append(0.0)
            grads.append([0.0] * len(r))
            continue
        p = o_probs("bisect" if kind == "entmax_bisect" else kind, r, al)
        vals.append(o_fy(r, q, al, p))
        grads.append([pi - qi for pi, qi in zip(p, q)])
    v = torch.tensor(vals, dtype=torch.float64).reshape(shape[:-1])
    g = torch.tensor(grads, dtype=torch.float64).reshape(shape).movedim(-1, 1)
    return v, g, torch.tensor(valid, dtype=torch.float64).reshape(shape[:-1])


def call_loss(name, x, t, **kw):
    fn = LOSSES[name][0]
    return fn(x, t, **kw)


# --------------------------------------------------------------------------------------
# activations vs the loop oracles
# --------------------------------------------------------------------------------------


ACTS = [
    ("sparsemax", lambda x, **kw: losses.sparsemax(x, **kw), None),
    ("entmax15", lambda x, **kw: losses.entmax15(x, **kw), None),
    ("bisect13", lambda x, **kw: losses.entmax_bisect(x, alpha=1.3, **kw), 1.3),
    ("bisect15", lambda x, **kw: losses.entmax_bisect(x, alpha=1.5, **kw), 1.5),
    ("bisect20", lambda x, **kw: losses.entmax_bisect(x, alpha=2.0, **kw), 2.0),
    ("bisect25", lambda x, **kw: losses.entmax_bisect(x, alpha=2.5, **kw), 2.5),
]


def _kind(name):
    return name if name in ("sparsemax", "entmax15") else "bisect"


@pytest.mark.parametrize("name,act,alpha", ACTS, ids=[a[0] for a in ACTS])
@pytest.mark.parametrize("dim", [-1, 1, -2, 0])
def test_activation_matches_loop_oracle(name, act, alpha, dim):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 7, 3, generator=g, dtype=torch.float64) * 2
    x[0, 2, 1] = NINF  # -inf masks are outside the support
    x[1, 0, 0] = NINF
    if dim in (0,):
        x = x[:, :4]
    got = act(x, dim=dim)
    expected = oracle_activation(_kind(name), x, dim, alpha)
    assert got.dtype == torch.float64 and got.shape == x.shape
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got.sum(dim), torch.ones_like(got.sum(dim)), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name,act,alpha", ACTS, ids=[a[0] for a in ACTS])
def test_activation_vjp_matches_loop_jacobian(name, act, alpha):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(5, 7, generator=g, dtype=torch.float64) * 1.5).requires_grad_(True)
    v = torch.randn(5, 7, generator=g, dtype=torch.float64)
    p = act(x)
    (grad,) = torch.autograd.grad(p, x, v)
    a = {"sparsemax": 2.0, "entmax15": 1.5}.get(name, alpha)
    expected = torch.tensor([o_vjp(pr, vr, a) for pr, vr in zip(p.detach().tolist(), v.tolist())],
                            dtype=torch.float64)
    torch.testing.assert_close(grad, expected, rtol=1e-9, atol=1e-12)


def test_activation_single_rows_and_known_values():
    # z = (2, 1.5, -1): sparsemax tau = 1.25 -> (0.75, 0.25, 0)
    z = torch.tensor([2.0, 1.5, -1.0], dtype=torch.float64)
    torch.testing.assert_close(losses.sparsemax(z), torch.tensor([0.75, 0.25, 0.0], dtype=torch.float64))
    # all-equal scores give the uniform distribution
    for fn in (losses.sparsemax, losses.entmax15, losses.entmax_bisect):
        torch.testing.assert_close(fn(torch.zeros(3, 4, dtype=torch.float64)),
                                   torch.full((3, 4), 0.25, dtype=torch.float64), rtol=0, atol=1e-12)
    # a slice without a finite score gives zeros (not NaN)
    x = torch.tensor([[NINF, NINF], [0.0, NINF]])
    for fn in (losses.sparsemax, losses.entmax15, losses.entmax_bisect):
        torch.testing.assert_close(fn(x), torch.tensor([[0.0, 0.0], [1.0, 0.0]]))


# --------------------------------------------------------------------------------------
# sort vs top-k vs bisection
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("k", [1, 2, 3, 7, 50])
@pytest.mark.parametrize("dim", [-1, 1, -3, 0])
def test_topk_equals_sort_and_bisection(kind, k, dim):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 9, 5, generator=g, dtype=torch.float64) * 0.3  # wide supports: k is redone
    x[0, 0] = 0.0
    act = losses.sparsemax if kind == "sparsemax" else losses.entmax15
    alpha = 2.0 if kind == "sparsemax" else 1.5
    full = act(x, dim=dim)
    topk = act(x, dim=dim, k=k)
    bis = losses.entmax_bisect(x, alpha=alpha, dim=dim)
    torch.testing.assert_close(topk, full, rtol=0, atol=1e-13)
    torch.testing.assert_close(bis, full, rtol=0, atol=1e-12)
    # gradients agree too
    v = torch.randn(x.shape, generator=g, dtype=torch.float64)
    grads = []
    for kw in ({}, {"k": k}):
        xx = x.clone().requires_grad_(True)
        grads.append(torch.autograd.grad(act(xx, dim=dim, **kw), xx, v)[0])
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-13), (torch.float32, 2e-6)])
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("scale", [0.01, 0.3, 1.0, 3.0, 30.0])
def test_exact_search_methods_agree(kind, scale, dtype, tol, search_path):
    """k=None: full sort == sort-free Newton search (packed or not) == its sort fallback."""
    ops = importlib.import_module("losses.classification._entmax_ops")
    g = torch.Generator().manual_seed(16)
    x = torch.randn(64, 37, generator=g, dtype=torch.float64) * scale
    x[0] = 0.0  # all equal
    x[1] = NINF  # no finite score: zeros
    x[2, :30] = NINF
    x[3] = torch.linspace(0, -1.2, 37, dtype=torch.float64)  # evenly spaced: many Newton steps
    x[4] = -torch.logspace(-6, 0.5, 37, dtype=torch.float64)  # clustered at the max
    x = x.to(dtype)
    ref = ops.dense_probs(kind, x, ops.threshold(kind, x, None, method="sort"))
    for kw in ({"method": "newton"}, {"method": "newton", "max_iter": 1}, {"method": "dense"},
               {"method": "dense", "max_iter": 1}, {"method": None}):
        th = ops.threshold(kind, x, None, **kw)
        torch.testing.assert_close(ops.dense_probs(kind, x, th), ref, rtol=0, atol=tol)
    expected = oracle_activation(kind, x.double())
    torch.testing.assert_close(ref.double(), expected, rtol=0, atol=max(tol, 1e-12))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-13), (torch.float32, 2e-6)])
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("c", [300, 1000, 1777])
def test_dense_search_with_chunk_maxima_matches_sort(kind, c, dtype, tol, search_path):
    """Rows wider than 2 * DENSE_BUCKETS: the chunk-maxima levels then the whole rows, the
    finished rows dropped between passes; p and tau equal the sort's, also for masked rows."""
    ops = importlib.import_module("losses.classification._entmax_ops")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(96, c, generator=g, dtype=torch.float64)
    x[0] = 0.0
    x[1] = NINF
    x[2, 3:] = NINF
    x[3] = torch.linspace(0, -1.2, c, dtype=torch.float64)
    x[4] *= 30.0
    x[5] *= 0.01
    x[6, : c // 2] = x[6, c // 2: 2 * (c // 2)]  # ties across the chunks
    x = x.to(dtype)
    ref_th = ops.threshold(kind, x, None, method="sort")
    th = ops.threshold(kind, x, None, method="dense")
    assert th.d is not None
    torch.testing.assert_close(ops.dense_probs(kind, x, th), ops.dense_probs(kind, x, ref_th), rtol=0, atol=tol)
    torch.testing.assert_close(th.tau, ref_th.tau, rtol=0, atol=10 * tol)
    chunks = ops.bucket_max(x, 128)
    assert chunks.shape[1] <= 128
    for row in (x[7], x[8]):  # every chunk maximum is one of the row's own scores
        assert set(ops.bucket_max(row[None], 128)[0].tolist()) <= set(row.tolist())


@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
def test_wide_rows_with_wide_supports_leave_the_top_k_doubling_for_the_dense_search(kind, monkeypatch, search_path):
    """Without the C kernel, the CPU default on wide rows (C > 2048) starts with a top-k; when the support outgrows it
    after AUTO_TOPK_DOUBLINGS doublings (near-uniform rows: a language model's logits at
    initialisation), the batch goes to the dense search, with the sort's probabilities, loss and
    gradient; rows whose support fits keep the top-k."""
    ops = importlib.import_module("losses.classification._entmax_ops")
    fn = getattr(losses, f"{kind}_loss")
    g = torch.Generator().manual_seed(9)
    c = 4099  # odd: the chunk levels take the bucket path
    x = torch.randn(12, c, generator=g, dtype=torch.float64) * 0.01  # support: hundreds to all of the row
    x[0] *= 300.0  # a row with a small support in the same batch
    x[1, : c // 3] = NINF
    y = torch.randint(0, c, (12,), generator=g)
    calls = {"topk": [], "dense": 0}
    real_topk, real_dense = torch.topk, ops._threshold_dense

    def topk(t, k, *a, **kw):
        calls["topk"].append(k)
        return real_topk(t, k, *a, **kw)

    def dense(*a, **kw):
        calls["dense"] += 1
        return real_dense(*a, **kw)

    monkeypatch.setattr(torch, "topk", topk)
    monkeypatch.setattr(ops, "_threshold_dense", dense)
    th = ops.threshold(kind, x, None)
    k0 = ops.AUTO_TOPK[kind][1]
    if search_path == "native":  # with the C kernel the dense search is the default at every width
        assert calls == {"topk": [], "dense": 1}
    else:
        assert calls == {"topk": [k0 * 2 ** i for i in range(ops.AUTO_TOPK_DOUBLINGS + 1)], "dense": 1}
    assert th.d is not None
    ref = ops.threshold(kind, x, None, method="sort")
    torch.testing.assert_close(ops.dense_probs(kind, x, th), ops.dense_probs(kind, x, ref), rtol=0, atol=1e-13)
    torch.testing.assert_close(th.tau, ref.tau, rtol=0, atol=1e-12)
    monkeypatch.undo()
    monkeypatch.setattr(importlib.import_module("losses.kernels.entmax_native"), "enabled",
                        search_path == "native")
    xa = x.clone().requires_grad_()
    values, grads, _ = oracle_loss(kind, x, y)  # independent float64 oracle, row by row
    la = fn(xa, y, reduction="sum")
    torch.testing.assert_close(la, values.sum(), rtol=0, atol=1e-10)
    ga, = torch.autograd.grad(la, xa)
    torch.testing.assert_close(ga, grads, rtol=0, atol=1e-12)
    # a batch whose supports fit the first top-k never reaches the dense search
    calls.update(topk=[], dense=0)
    monkeypatch.setattr(torch, "topk", topk)
    monkeypatch.setattr(ops, "_threshold_dense", dense)
    ops.threshold(kind, x[:1] * 10.0, None)
    assert calls == ({"topk": [], "dense": 1} if search_path == "native" else {"topk": [k0], "dense": 0})


@pytest.mark.parametrize("c", [8, 300, 1000, 1024])
def test_chunk_maxima_levels_are_sub_multisets_of_the_row(c):
    """The narrow levels of the dense search hold each score at most once: the halving maxima are
    the chunk maxima (positions ``j, j + w, ...``), the top-2 level adds each chunk's runner-up."""
    ops = importlib.import_module("losses.classification._entmax_ops")
    g = torch.Generator().manual_seed(21)
    x = torch.randn(6, c, generator=g, dtype=torch.float64)
    x[1] = x[1].round()  # ties
    x[2, ::3] = NINF
    for narrow in (ops.halving_max(x, 128), ops.top2_halving(x, 128)):
        assert narrow.shape[1] <= 256
        for row, full in zip(narrow, x):
            left = full.tolist()
            for v in row.tolist():
                left.remove(v)  # raises if v is not (or no longer) in the row
    two = ops.top2_halving(x, 128)
    w = two.shape[1] // 2
    chunks = x.reshape(6, -1, w)  # chunk j: positions j, j + w, ...
    top2 = chunks.topk(2, dim=1).values
    torch.testing.assert_close(two[:, :w], top2[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(two[:, w:], top2[:, 1], rtol=0, atol=0)


def test_newton_search_packs_candidates_and_falls_back():
    ops = importlib.import_module("losses.classification._entmax_ops")
    zs = torch.tensor([[0.0, -0.5, -1.5, -3.0, -0.99, NINF], [0.0, -2.0, -1.0, -0.2, -5.0, -7.0]])
    packed = ops._compact_candidates(zs, -1.0)
    assert packed.shape == (2, 3)  # zs > -1 only: row 0 has 3 candidates, row 1 has 2
    torch.testing.assert_close(packed[0], torch.tensor([0.0, -0.5, -0.99]))
    torch.testing.assert_close(packed[1], torch.tensor([0.0, -0.2, NINF]))
    assert ops._compact_candidates(zs, -10.0) is zs  # no saving: unpacked
    # a row needing several Newton steps: too few steps give None (the caller sorts)
    row = torch.linspace(0, -0.9, 50, dtype=torch.float64)[None]
    assert ops.sparsemax_tau_newton(row, 1) is None
    tau = ops.sparsemax_tau_newton(row, 32)
    assert abs(float(tau) - o_sparsemax(row[0].tolist())[1]) <= 1e-14
    tau15 = ops.entmax15_tau_newton(row * 0.5, 32)
    assert abs(float(tau15) - o_entmax15(row[0].tolist())[1]) <= 1e-14


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_topk_loss_equals_sort_loss(name, k):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 7, 3, 2, generator=g, dtype=torch.float64) * 0.5
    t = torch.randint(0, 7, (5, 3, 2), generator=g)
    t[0, 0, 0] = -100
    fn = LOSSES[name][0]
    outs = []
    for kw in ({}, {"k": k}):
        xx = x.clone().requires_grad_(True)
        out = fn(xx, t, reduction="none", **kw)
        outs.append((out, torch.autograd.grad(out.sum(), xx)[0]))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype,c,tol", [(torch.float32, 1000, 1e-6), (torch.float32, 100_000, 5e-6),
                                         (torch.float64, 1000, 1e-12)])
def test_bisect_equals_exact_algorithms(dtype, c, tol):
    g = torch.Generator().manual_seed(5)
    n = 16 if c <= 1000 else 2
    x = (torch.randn(n, c, generator=g, dtype=torch.float64) * 2).to(dtype)
    torch.testing.assert_close(losses.entmax_bisect(x, alpha=2.0), losses.sparsemax(x), rtol=0, atol=tol)
    torch.testing.assert_close(losses.entmax_bisect(x, alpha=1.5), losses.entmax15(x), rtol=0, atol=tol)
    y = torch.randint(0, c, (n,), generator=g)
    torch.testing.assert_close(losses.entmax_bisect_loss(x, y, alpha=2.0, reduction="none"),
                               losses.sparsemax_loss(x, y, reduction="none"), rtol=tol, atol=tol)
    torch.testing.assert_close(losses.entmax_bisect_loss(x, y, alpha=1.5, reduction="none"),
                               losses.entmax15_loss(x, y, reduction="none"), rtol=tol, atol=tol)


# --------------------------------------------------------------------------------------
# losses vs the loop oracles
# --------------------------------------------------------------------------------------


LOSS_CASES = [
    ("sparsemax", {}),
    ("sparsemax", {"k": 2}),
    ("entmax15", {}),
    ("entmax15", {"k": 3}),
    ("entmax_bisect", {"alpha": 1.5}),
    ("entmax_bisect", {"alpha": 1.25}),
    ("entmax_bisect", {"alpha": 2.0}),
    ("entmax_bisect", {"alpha": 3.0}),
    ("entmax_bisect", {"alpha": "tensor"}),
]


def _alpha_kw(kw, out_shape, g):
    kw = dict(kw)
    if kw.get("alpha") == "tensor":
        kw["alpha"] = 1.1 + torch.rand(out_shape, generator=g, dtype=torch.float64) * 1.5
    return kw


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("spatial", [(), (3, 2)])
@pytest.mark.parametrize("name,kw", LOSS_CASES, ids=[f"{n}-{k}" for n, k in LOSS_CASES])
def test_loss_ids_matches_loop_oracle(name, kw, spatial, reduction):
    g = torch.Generator().manual_seed(6)
    shape = (5, 7) + spatial
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    t = torch.randint(0, 7, (5,) + spatial, generator=g)
    t.view(-1)[1] = -100
    t.view(-1)[3] = 5
    x.movedim(1, -1).reshape(-1, 7)  # (view check only)
    xm = x.movedim(1, -1).clone()
    xm.reshape(-1, 7)[3, 0] = NINF  # a masked non-target score
    xm.reshape(-1, 7)[3, 6] = NINF
    x = xm.movedim(-1, 1).contiguous().requires_grad_(True)
    kw = _alpha_kw(kw, (5,) + spatial, g)
    out = call_loss(name, x, t, reduction=reduction, **kw)
    values, grads, valid = oracle_loss(name, x, t, alpha=kw.get("alpha"))
    expected = weighted_reduce(values, valid, reduction)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    (gx,) = torch.autograd.grad(out.sum(), x)
    scale = 1.0 if reduction != "mean" else 1.0 / valid.sum()
    torch.testing.assert_close(gx, grads * scale, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("spatial", [(), (3, 2)])
@pytest.mark.parametrize("name,kw", LOSS_CASES, ids=[f"{n}-{k}" for n, k in LOSS_CASES])
def test_loss_distribution_target_matches_loop_oracle(name, kw, spatial):
    g = torch.Generator().manual_seed(7)
    shape = (5, 7) + spatial
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    raw = torch.rand(shape, generator=g, dtype=torch.float64)
    raw = raw * (torch.rand(shape, generator=g, dtype=torch.float64) > 0.4)  # sparse targets
    raw.select(1, 0).add_(0.1)
    q = raw / raw.sum(1, keepdim=True)
    kw = _alpha_kw(kw, (5,) + spatial, g)
    out = call_loss(name, x, q, reduction="none", ignore_index=0, **kw)  # ignore_index does not apply
    values, grads, _ = oracle_loss(name, x, q, alpha=kw.get("alpha"))
    torch.testing.assert_close(out, values, rtol=1e-10, atol=1e-12)
    (gx,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(gx, grads, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(call_loss(name, x, q, **kw), values.mean(), rtol=1e-10, atol=1e-12)


def test_loss_alpha_shapes_and_single_class_batch():
    g = torch.Generator().manual_seed(17)
    x = torch.randn(4, 5, 3, generator=g, dtype=torch.float64)
    y = torch.full((4, 3), 2)  # every position has the same class
    per_pos = 1.2 + torch.rand(4, 3, generator=g, dtype=torch.float64)
    expected, _, _ = oracle_loss("entmax_bisect", x, y, alpha=per_pos)
    for a in (per_pos, per_pos.unsqueeze(1)):  # (N, d1) or with a size-1 class dim
        got = losses.entmax_bisect_loss(x, y, alpha=a, reduction="none")
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    per_sample = per_pos[:, :1]  # (N, 1) broadcasts over d1
    expected, _, _ = oracle_loss("entmax_bisect", x, y, alpha=per_sample.expand(4, 3))
    got = losses.entmax_bisect_loss(x, y, alpha=per_sample, reduction="none")
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    got = losses.entmax_bisect_loss(x, y, alpha=torch.tensor(1.5, dtype=torch.float64), reduction="none")
    torch.testing.assert_close(got, losses.entmax15_loss(x, y, reduction="none"), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=r"^entmax_bisect_loss: tensor alpha must be a scalar or broadcast"):
        losses.entmax_bisect_loss(x, y, alpha=torch.full((5,), 1.5, dtype=torch.float64))
    for name in ("sparsemax", "entmax15"):
        got = call_loss(name, x, y, reduction="none")
        torch.testing.assert_close(got, oracle_loss(name, x, y)[0], rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------
# gradcheck (float64, small odd shapes, away from support changes)
# --------------------------------------------------------------------------------------


def _safe_scores(shape, seed):
    """Scores whose support is stable under gradcheck's 1e-6 perturbations."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 1.3).requires_grad_(True)


@pytest.mark.parametrize("n,c", [(1, 3), (3, 5)])
def test_gradcheck_activations(n, c):
    x = _safe_scores((n, c), 10 + n)
    assert torch.autograd.gradcheck(lambda z: losses.sparsemax(z), (x,))
    assert torch.autograd.gradcheck(lambda z: losses.entmax15(z), (x,))
    assert torch.autograd.gradcheck(lambda z: losses.sparsemax(z, k=1), (x,))
    assert torch.autograd.gradcheck(lambda z: losses.entmax15(z, dim=0, k=2), (x,))
    for a in (1.3, 1.5, 2.0):
        assert torch.autograd.gradcheck(lambda z: losses.entmax_bisect(z, alpha=a), (x,))
    # alpha: a scalar tensor and one alpha per row
    a0 = torch.tensor(1.4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z, a: losses.entmax_bisect(z, alpha=a), (x, a0))
    a_rows = (1.2 + 0.3 * torch.arange(n, dtype=torch.float64)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z, a: losses.entmax_bisect(z, alpha=a), (x, a_rows))
    a_col = (1.2 + 0.2 * torch.arange(c, dtype=torch.float64)).unsqueeze(0).requires_grad_(True)  # dim=0
    assert torch.autograd.gradcheck(lambda z, a: losses.entmax_bisect(z, alpha=a, dim=0), (x, a_col))


@pytest.mark.parametrize("n,c", [(1, 3), (3, 5)])
def test_gradcheck_losses(n, c):
    x = _safe_scores((n, c), 20 + n)
    y = torch.arange(n) % c
    raw = torch.rand(n, c, generator=torch.Generator().manual_seed(n), dtype=torch.float64) + 0.05
    q = (raw / raw.sum(1, keepdim=True)).requires_grad_(True)
    for red in ("mean", "sum"):
        assert torch.autograd.gradcheck(lambda z: losses.sparsemax_loss(z, y, reduction=red), (x,))
        assert torch.autograd.gradcheck(lambda z: losses.entmax15_loss(z, y, reduction=red), (x,))
        assert torch.autograd.gradcheck(lambda z: losses.sparsemax_loss(z, y, k=1, reduction=red), (x,))
    for a in (1.3, 1.5, 2.0):
        assert torch.autograd.gradcheck(lambda z: losses.entmax_bisect_loss(z, y, alpha=a), (x,))
    # float distribution targets: gradient w.r.t. input and target (target kept on the simplex
    # to first order by gradcheck's perturbation size; the loss is defined off it too)
    assert torch.autograd.gradcheck(lambda z, t: losses.sparsemax_loss(z, t), (x, q))
    assert torch.autograd.gradcheck(lambda z, t: losses.entmax15_loss(z, t), (x, q))
    assert torch.autograd.gradcheck(lambda z, t: losses.entmax_bisect_loss(z, t, alpha=1.7), (x, q))
    # alpha (scalar tensor and per row), ids and distribution targets
    a0 = torch.tensor(1.6, dtype=torch.float64, requires_grad=True)
    a_rows = (1.3 + 0.25 * torch.arange(n, dtype=torch.float64)).requires_grad_(True)
    for a in (a0, a_rows):
        assert torch.autograd.gradcheck(lambda z, al: losses.entmax_bisect_loss(z, y, alpha=al), (x, a))
        assert torch.autograd.gradcheck(lambda z, al: losses.entmax_bisect_loss(z, q.detach(), alpha=al),
                                        (x, a))


# --------------------------------------------------------------------------------------
# gradient and test facts (docs/losses/sparsemax.md)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(LOSSES))
def test_gradient_is_p_minus_q(name):
    g = torch.Generator().manual_seed(8)
    x = (torch.randn(6, 9, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    y = torch.randint(0, 9, (6,), generator=g)
    act = {"sparsemax": losses.sparsemax, "entmax15": losses.entmax15,
           "entmax_bisect": lambda z: losses.entmax_bisect(z, alpha=1.5)}[name]
    (gx,) = torch.autograd.grad(call_loss(name, x, y, reduction="sum"), x)
    p = act(x.detach())
    torch.testing.assert_close(gx, p - torch.nn.functional.one_hot(y, 9).double(), rtol=0, atol=1e-12)
    raw = torch.rand(6, 9, generator=g, dtype=torch.float64)
    q = raw / raw.sum(1, keepdim=True)
    (gx,) = torch.autograd.grad(call_loss(name, x, q, reduction="sum"), x)
    torch.testing.assert_close(gx, p - q, rtol=0, atol=1e-12)

@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_gradient_built_in_the_forward_obeys_grad_scale_and_retained_graphs(name, reduction, search_path):
    """Reduced losses over rows of 300+ classes (the dense CPU search) build ``(p* - onehot) / N``
    in the forward and return it as it is for a unit grad: a scaled loss, a graph kept for a second
    backward and an accumulating ``.grad`` must all still see the exact gradient."""
    g = torch.Generator().manual_seed(12)
    x = (torch.randn(128, 300, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    y = torch.randint(0, 300, (128,), generator=g)
    ops = importlib.import_module("losses.classification._entmax_ops")
    assert ops.auto_search(name, 128, 300) == ("dense", None)
    act = {"sparsemax": losses.sparsemax, "entmax15": losses.entmax15}[name]
    expected = act(x.detach()) - torch.nn.functional.one_hot(y, 300).double()
    if reduction == "mean":
        expected = expected / 128
    loss = call_loss(name, x, y, reduction=reduction)
    loss.backward(retain_graph=True)
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=1e-13)
    loss.backward(retain_graph=True)  # the saved gradient is not consumed by the first backward
    torch.testing.assert_close(x.grad, 2 * expected, rtol=0, atol=1e-13)
    (2.5 * loss).backward()
    torch.testing.assert_close(x.grad, 4.5 * expected, rtol=0, atol=1e-13)
    x.grad = None
    (gx,) = torch.autograd.grad(call_loss(name, x, y, reduction=reduction) * -3.0, x)
    torch.testing.assert_close(gx, -3.0 * expected, rtol=0, atol=1e-13)
    (gx,) = torch.autograd.grad(call_loss(name, x, y, reduction=reduction), x)
    torch.testing.assert_close(gx, expected, rtol=0, atol=1e-13)



@pytest.mark.parametrize("name", list(LOSSES))
def test_nonnegative_and_zero_iff_prediction_equals_target(name):
    g = torch.Generator().manual_seed(9)
    x = torch.randn(200, 6, generator=g, dtype=torch.float64) * 3
    y = torch.randint(0, 6, (200,), generator=g)
    vals = call_loss(name, x, y, reduction="none")
    assert torch.all(vals >= 0)
    act = {"sparsemax": losses.sparsemax, "entmax15": losses.entmax15,
           "entmax_bisect": lambda z: losses.entmax_bisect(z, alpha=1.5)}[name]
    p = act(x)
    onehot = p.gather(1, y[:, None]).squeeze(1) == 1
    assert onehot.any() and (~onehot).any()
    assert torch.all(vals[onehot] <= 1e-12) and torch.all(vals[~onehot] > 1e-12)
    # distribution targets: q = p* gives 0; any other q gives > 0
    vq = call_loss(name, x, p, reduction="none")
    assert torch.all(vq.abs() <= 1e-9)
    raw = torch.rand(200, 6, generator=g, dtype=torch.float64)
    q = raw / raw.sum(1, keepdim=True)
    assert torch.all(call_loss(name, x, q, reduction="none") > 1e-6)


def test_sparsemax_zero_iff_margin_of_one():
    # one-hot: L = 0 iff z_y >= 1 + max_{j != y} z_j
    base = torch.tensor([[0.3, -0.4, 0.1, -2.0]], dtype=torch.float64)
    y = torch.tensor([2])
    for gap, zero in ((1.0, True), (1.5, True), (1.0 - 1e-6, False), (0.5, False)):
        z = base.clone()
        z[0, 2] = 0.3 + gap
        v = losses.sparsemax_loss(z, y)
        assert (float(v) == 0.0) == zero, (gap, float(v))


@pytest.mark.parametrize("t", [-3.0, -1.0, -0.7, -0.2, 0.0, 0.4, 0.99, 1.0, 2.5])
def test_sparsemax_two_class_closed_form(t):
    z = torch.tensor([[t, 0.0]], dtype=torch.float64)
    expected = 0.0 if t >= 1 else (-t if t <= -1 else (1 - t) ** 2 / 4)
    got = losses.sparsemax_loss(z, torch.tensor([0]))
    assert abs(float(got) - expected) <= 1e-14
    for alt in (losses.entmax_bisect_loss(z, torch.tensor([0]), alpha=2.0),
                losses.sparsemax_loss(z, torch.tensor([0]), k=1)):
        assert abs(float(alt) - expected) <= 1e-12


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("c", [-7.5, 3.0, 1e3])
def test_shift_invariance(name, c):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(5, 7, generator=g, dtype=torch.float64)
    y = torch.randint(0, 7, (5,), generator=g)
    raw = torch.rand(5, 7, generator=g, dtype=torch.float64)
    q = raw / raw.sum(1, keepdim=True)
    for t in (y, q):
        torch.testing.assert_close(call_loss(name, x + c, t, reduction="none"),
                                   call_loss(name, x, t, reduction="none"), rtol=1e-9, atol=1e-11)


def test_sparsemax_closed_form_equals_fy_form():
    g = torch.Generator().manual_seed(12)
    x = torch.randn(40, 8, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 8, (40,), generator=g)
    got = losses.sparsemax_loss(x, y, reduction="none")
    p = losses.sparsemax(x)
    # FY form <p - e_y, z> + H_2(p) (H_2(e_y) = 0)
    fy = (p * x).sum(1) - x.gather(1, y[:, None]).squeeze(1) + (1 - (p * p).sum(1)) / 2
    # spec closed form -z_y + 1/2 sum_S (z_j^2 - tau^2) + 1/2, tau from the support
    supp = p > 0
    tau = ((x * supp).sum(1) - 1) / supp.sum(1)
    closed = -x.gather(1, y[:, None]).squeeze(1) + 0.5 * ((x ** 2 - tau[:, None] ** 2) * supp).sum(1) + 0.5
    torch.testing.assert_close(got, fy, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, closed, rtol=1e-12, atol=1e-12)
    # entmax15: FY form from the activation
    p15 = losses.entmax15(x)
    fy15 = (p15 * x).sum(1) - x.gather(1, y[:, None]).squeeze(1) + (1 - p15.pow(1.5).sum(1)) / 0.75
    torch.testing.assert_close(losses.entmax15_loss(x, y, reduction="none"), fy15, rtol=1e-12, atol=1e-12)


def _fd(f, a, h=1e-5):
    return (f(a + h) - f(a - h)) / (2 * h)


@pytest.mark.parametrize("alpha", [1.3, 1.5, 1.8])
def test_alpha_vjp_matches_finite_differences(alpha):
    g = torch.Generator().manual_seed(13)
    x = torch.randn(4, 6, generator=g, dtype=torch.float64) * 1.5
    v = torch.randn(4, 6, generator=g, dtype=torch.float64)
    # autograd alpha-VJP, one alpha per row
    a = torch.full((4,), alpha, dtype=torch.float64, requires_grad=True)
    (ga,) = torch.autograd.grad((losses.entmax_bisect(x, alpha=a) * v).sum(), a)
    rows = x.tolist()
    for i in range(4):
        def f(al, i=i):
            return sum(pi * vi for pi, vi in zip(o_entmax_alpha(rows[i], al)[0], v[i].tolist()))
        assert abs(float(ga[i]) - _fd(f, alpha)) <= 1e-7 * max(1.0, abs(_fd(f, alpha)))
    # the loss's Danskin gradient in alpha vs finite differences of the loop oracle
    y = torch.randint(0, 6, (4,), generator=g)
    raw = torch.rand(4, 6, generator=g, dtype=torch.float64)
    q = raw / raw.sum(1, keepdim=True)
    for t in (y, q):
        a = torch.tensor(alpha, dtype=torch.float64, requires_grad=True)
        (ga,) = torch.autograd.grad(losses.entmax_bisect_loss(x, t, alpha=a, reduction="sum"), a)

        def f(al, t=t):
            return float(oracle_loss("entmax_bisect", x, t, alpha=al)[0].sum())

        assert abs(float(ga) - _fd(f, alpha)) <= 1e-7 * max(1.0, abs(_fd(f, alpha)))


# --------------------------------------------------------------------------------------
# -inf masks, C = 1, all-ignored, empty batch
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(LOSSES))
def test_target_on_minus_inf_is_plus_inf_with_finite_gradient(name):
    x = torch.tensor([[1.0, NINF, 0.5, -0.3], [0.2, 0.1, NINF, 2.0]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1, 3])
    vals = call_loss(name, x, y, reduction="none")
    assert vals[0].item() == INF
    act = {"sparsemax": losses.sparsemax, "entmax15": losses.entmax15,
           "entmax_bisect": lambda z: losses.entmax_bisect(z, alpha=1.5)}[name]
    p = act(x.detach())
    values, _, _ = oracle_loss(name, x, torch.tensor([0, 3]), alpha=1.5)
    torch.testing.assert_close(vals[1], values[1], rtol=1e-10, atol=1e-12)
    (gx,) = torch.autograd.grad(vals.sum(), x)
    assert torch.isfinite(gx).all()
    torch.testing.assert_close(gx, p - torch.nn.functional.one_hot(y, 4).double(), rtol=0, atol=1e-12)
    assert call_loss(name, x, y, reduction="mean").item() == INF
    # a -inf score with zero target mass is simply outside the support
    q = torch.tensor([[0.5, 0.0, 0.5, 0.0], [0.25, 0.25, 0.0, 0.5]], dtype=torch.float64)
    vq = call_loss(name, x, q, reduction="none")
    expected, _, _ = oracle_loss(name, x, q, alpha=1.5)
    torch.testing.assert_close(vq, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(LOSSES))
def test_all_minus_inf_row_raises_data_check(name):
    x = torch.randn(5, 4)
    x[3] = NINF
    y = torch.tensor([0, 1, 2, 3, 0])
    msg = rf"^{name}_loss: row 3 of input has no finite score \(got all -inf\); unmask at least one class per row$"
    with pytest.raises(ValueError, match=msg):
        call_loss(name, x, y)
    q = torch.full((5, 4), 0.25)
    with pytest.raises(ValueError, match=msg):
        call_loss(name, x, q)
    # N-D: "row" counts positions in (N, d1..dk) order
    x3 = torch.randn(2, 4, 3)
    x3[1, :, 1] = NINF
    with pytest.raises(ValueError, match=rf"^{name}_loss: row 4 of input"):
        call_loss(name, x3, torch.zeros(2, 3, dtype=torch.long))
    # an ignored row may be fully masked (padding); it contributes an exact 0
    y_ign = y.clone()
    y_ign[3] = -100
    out = call_loss(name, x.double().requires_grad_(True), y_ign, reduction="none")
    assert out[3].item() == 0.0 and torch.isfinite(out).all()
    with losses.validation(False):
        call_loss(name, x, y)  # the data check is off; no exception


@pytest.mark.parametrize("name", list(LOSSES))
def test_one_class_is_a_degenerate_input_error(name):
    # C = 1: the loss would be identically 0 and train nothing, so it is refused
    x = torch.randn(4, 1, 3, dtype=torch.float64, requires_grad=True)
    for t in (torch.zeros(4, 3, dtype=torch.long), torch.ones(4, 1, 3, dtype=torch.float64)):
        with pytest.raises(ValueError, match=rf"^{name}_loss: a softmax over a single class .*bce_with_logits"):
            call_loss(name, x, t, reduction="none")


@pytest.mark.parametrize("name", list(LOSSES))
def test_all_ignored_and_empty_batch_are_attached_zero(name):
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    x.data[1, :] = NINF  # even fully masked ignored rows
    kw = {}
    a = None
    if name == "entmax_bisect":
        a = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
        kw["alpha"] = a
    for red in ("mean", "sum"):
        out = call_loss(name, x, torch.full((3,), -100), reduction=red, **kw)
        assert out.item() == 0.0 and out.grad_fn is not None
        leaves = [x] + ([a] if a is not None else [])
        for gr in torch.autograd.grad(out, leaves):
            assert gr is not None and torch.all(gr == 0)
    e = torch.randn(0, 5, requires_grad=True)
    out = call_loss(name, e, torch.zeros(0, dtype=torch.long))
    assert out.item() == 0.0 and out.grad_fn is not None
    assert call_loss(name, e, torch.zeros(0, dtype=torch.long), reduction="none").shape == (0,)
    (ge,) = torch.autograd.grad(out, e)
    assert ge.shape == (0, 5)


# --------------------------------------------------------------------------------------
# dtypes, half precision, double backward
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("c,tol", [(1000, 1e-6), (100_000, 5e-6)])
def test_half_precision_rows_sum_to_one(dtype, c, tol):
    g = torch.Generator().manual_seed(14)
    n = 8 if c <= 1000 else 1
    cases = [torch.randn(n, c, generator=g) * 3, torch.randn(n, c, generator=g) * 0.01, torch.zeros(n, c)]
    for i, x in enumerate(cases):
        x = x.to(dtype)
        # near-uniform and equal rows at C = 1e5: supports of 1e3-1e5 entries, which leave the top-k
        # search for the dense one (their rows then sum to one after its final Newton step)
        fns = [losses.sparsemax, losses.entmax15, losses.entmax_bisect,
               lambda z: losses.sparsemax(z, k=16), lambda z: losses.entmax15(z, k=16)]
        for fn in fns:
            # the mappings return the input dtype (as torch.softmax) and compute in float32 inside
            p = fn(x)
            assert p.dtype == dtype
            p32 = fn(x.float())
            assert float((p32.double().sum(-1) - 1).abs().max()) <= tol
            torch.testing.assert_close(p, p32.to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_gradients_in_input_dtype(dtype):
    x = torch.randn(4, 6).to(dtype).requires_grad_(True)
    y = torch.tensor([0, 1, 2, 3])
    for name in LOSSES:
        out = call_loss(name, x, y)
        assert out.dtype == torch.float32
        (gx,) = torch.autograd.grad(out, x)
        assert gx.dtype == dtype
    for fn in (losses.sparsemax, losses.entmax15, losses.entmax_bisect):
        (gx,) = torch.autograd.grad(fn(x).pow(2).sum(), x)
        assert gx.dtype == dtype


def test_float64_alpha_promotes_compute_dtype():
    x = torch.randn(3, 4)
    a = torch.tensor(1.5, dtype=torch.float64)
    assert losses.entmax_bisect(x, alpha=a).dtype == torch.float64
    assert losses.entmax_bisect_loss(x, torch.tensor([0, 1, 2]), alpha=a).dtype == torch.float64
    assert losses.sparsemax_loss(x, torch.tensor([0, 1, 2])).dtype == torch.float32


def test_double_backward_raises():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 1, 2])
    a = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    outs = [losses.sparsemax(x).pow(2).sum(), losses.entmax15(x).pow(2).sum(),
            losses.entmax_bisect(x, alpha=a).pow(2).sum(), losses.sparsemax_loss(x, y),
            losses.entmax15_loss(x, y), losses.entmax_bisect_loss(x, y, alpha=a)]
    for out in outs:
        with pytest.raises(RuntimeError, match=r"no second derivative"):
            torch.autograd.grad(out, x, create_graph=True)


# --------------------------------------------------------------------------------------
# errors and the validation switch
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(LOSSES))
def test_bad_arguments_raise_clear_errors(name):
    fn = f"{name}_loss"
    x = torch.randn(3, 4)
    y = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=rf"^{fn}: reduction must be one of"):
        call_loss(name, x, y, reduction="elementwise_mean")
    with pytest.raises(ValueError, match=rf"^{fn}: input must have shape \(N, C\)"):
        call_loss(name, torch.randn(4), torch.tensor(0))
    with pytest.raises(ValueError, match=rf"^{fn}: target shape must be \(3,\)"):
        call_loss(name, x, torch.tensor([0, 1]))
    with pytest.raises(TypeError, match=rf"^{fn}: target has the shape of class ids \(3,\) but a floating-point"):
        call_loss(name, x, y.float())  # ids sent as floats: the wrong kind
    with pytest.raises(ValueError, match=rf"^{fn}: float target must have the input's shape"):
        call_loss(name, x, torch.rand(3, 5))
    with pytest.raises(TypeError, match=rf"^{fn}: target must hold integer class ids"):
        call_loss(name, x, torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match=rf"^{fn}: input must be a floating-point tensor"):
        call_loss(name, x.long(), y)
    with pytest.raises(ValueError, match=rf"^{fn}: input needs at least one class"):
        call_loss(name, torch.randn(3, 0), y)
    # data checks
    with pytest.raises(ValueError, match=rf"^{fn}: target has class ids outside \[0, 4\)"):
        call_loss(name, x, torch.tensor([0, 4, 1]))
    with pytest.raises(ValueError, match=rf"^{fn}: target has class ids outside"):
        call_loss(name, x, torch.tensor([0, -1, 1]))
    for bad in (math.nan, INF):
        xb = x.clone()
        xb[1, 2] = bad
        with pytest.raises(ValueError, match=rf"^{fn}: input contains NaN or \+inf"):
            call_loss(name, xb, y)
    with pytest.raises(ValueError, match=rf"^{fn}: float target must be a distribution over dim 1"):
        call_loss(name, x, torch.full((3, 4), 0.3))
    neg = torch.tensor([[1.2, -0.2, 0.0, 0.0]]).expand(3, 4)
    with pytest.raises(ValueError, match=rf"^{fn}: float target must be a distribution over dim 1"):
        call_loss(name, x, neg)
    with pytest.raises(ValueError, match=rf"^{fn}: target contains NaN"):
        call_loss(name, x, torch.full((3, 4), math.nan))
    if name != "entmax_bisect":
        for k in (0, -2):
            with pytest.raises(ValueError, match=rf"^{fn}: k must be None or a positive int"):
                call_loss(name, x, y, k=k)
        for k in (1.5, True):  # not an int at all: the wrong kind
            with pytest.raises(TypeError, match=rf"^{fn}: k must be None or a positive int"):
                call_loss(name, x, y, k=k)


def test_alpha_and_n_iter_errors():
    x = torch.randn(3, 4)
    y = torch.tensor([0, 1, 2])
    for bad in (1.0, 0.5, -2.0, math.nan, math.inf):
        with pytest.raises(ValueError, match=r"^entmax_bisect_loss: alpha must be finite and satisfy alpha > 1"):
            losses.entmax_bisect_loss(x, y, alpha=bad)
        with pytest.raises(ValueError, match=r"^entmax_bisect: alpha must be finite and satisfy alpha > 1"):
            losses.entmax_bisect(x, alpha=bad)
        with pytest.raises(ValueError, match=r"^EntmaxBisectLoss: alpha must"):
            losses.EntmaxBisectLoss(alpha=bad)
    with pytest.raises(ValueError, match=r"1 \+ softplus"):
        losses.entmax_bisect_loss(x, y, alpha=1.0)
    ta = torch.tensor([1.5, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"^entmax_bisect_loss: alpha must be finite and > 1 \(got min=1.0\)"):
        losses.entmax_bisect_loss(x, y, alpha=ta)
    with pytest.raises(ValueError, match=r"^entmax_bisect: alpha must be finite and > 1"):
        losses.entmax_bisect(x, alpha=ta)
    with pytest.raises(ValueError, match=r"^entmax_bisect_loss: tensor alpha must be a scalar or broadcast"):
        losses.entmax_bisect_loss(x, y, alpha=torch.full((4,), 1.5))
    with pytest.raises(ValueError, match=r"^entmax_bisect: tensor alpha must"):
        losses.entmax_bisect(x, alpha=torch.full((4,), 1.5))
    with pytest.raises(TypeError, match=r"^entmax_bisect: alpha must be a floating-point tensor"):
        losses.entmax_bisect(x, alpha=torch.tensor(2))
    for bad, exc in ((0, ValueError), (-1, ValueError), (2.5, TypeError)):
        with pytest.raises(exc, match=r"^entmax_bisect_loss: n_iter must be a positive int"):
            losses.entmax_bisect_loss(x, y, n_iter=bad)
        with pytest.raises(exc, match=r"^entmax_bisect: n_iter must be a positive int"):
            losses.entmax_bisect(x, n_iter=bad)
    # tensor-alpha range is a data check: off with validation(False); shapes still checked
    with losses.validation(False):
        losses.entmax_bisect_loss(x, y, alpha=ta)
        with pytest.raises(ValueError, match="tensor alpha must"):
            losses.entmax_bisect_loss(x, y, alpha=torch.full((4,), 1.5))
        with pytest.raises(ValueError, match="alpha must be finite and satisfy alpha > 1"):
            losses.entmax_bisect_loss(x, y, alpha=1.0)  # a hyperparameter, always checked


def test_activation_argument_errors():
    x = torch.randn(3, 4)
    for fn, name in ((losses.sparsemax, "sparsemax"), (losses.entmax15, "entmax15"),
                     (losses.entmax_bisect, "entmax_bisect")):
        with pytest.raises(ValueError, match=rf"^{name}: dim out of range"):
            fn(x, dim=2)
        with pytest.raises(ValueError, match=rf"^{name}: dim out of range"):
            fn(x, dim=-3)
        with pytest.raises(TypeError, match=rf"^{name}: dim must be an int"):
            fn(x, dim=1.0)
        with pytest.raises(TypeError, match=rf"^{name}: input must be a floating-point tensor"):
            fn(x.long())
    for fn, name in ((losses.sparsemax, "sparsemax"), (losses.entmax15, "entmax15")):
        with pytest.raises(ValueError, match=rf"^{name}: k must be None or a positive int"):
            fn(x, k=0)


@pytest.mark.parametrize("name", list(LOSSES))
def test_validation_off_disables_exactly_the_data_checks(name):
    x = torch.randn(3, 4)
    y = torch.tensor([0, 1, 2])
    xn = x.clone()
    xn[0, 0] = math.nan
    xm = x.clone()
    xm[1] = NINF
    with losses.validation(False):
        call_loss(name, xn, y)  # NaN input: undefined result, no check
        call_loss(name, xm, y)  # all -inf row
        call_loss(name, x, torch.full((3, 4), 0.3))  # not a distribution
        # shape / kind / hyperparameter checks still run
        with pytest.raises(ValueError, match="target shape"):
            call_loss(name, x, torch.tensor([0, 1]))
        with pytest.raises(TypeError, match="integer class ids"):
            call_loss(name, x, torch.ones(3, 4, dtype=torch.bool))
        with pytest.raises(ValueError, match="reduction"):
            call_loss(name, x, y, reduction="avg")


# --------------------------------------------------------------------------------------
# modules, registry, docs
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls,fn,kw", [
    (losses.SparsemaxLoss, losses.sparsemax_loss, {"k": 2, "ignore_index": 3, "reduction": "sum"}),
    (losses.Entmax15Loss, losses.entmax15_loss, {"k": None, "ignore_index": 1, "reduction": "none"}),
    (losses.EntmaxBisectLoss, losses.entmax_bisect_loss,
     {"alpha": 1.7, "n_iter": 30, "ignore_index": 0, "reduction": "mean"}),
])
def test_module_equals_function_with_options(cls, fn, kw):
    g = torch.Generator().manual_seed(15)
    x = torch.randn(6, 5, 2, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (6, 2), generator=g)
    m = cls(**kw)
    torch.testing.assert_close(m(x, y), fn(x, y, **kw), rtol=0, atol=0)
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        torch.testing.assert_close(other(x, y), fn(x, y, **kw), rtol=0, atol=0)
    r = repr(m)
    assert cls.__name__ in r and f"reduction={kw['reduction']!r}" in r
    assert f"ignore_index={kw['ignore_index']}" in r


def test_registry_entries():
    for name, arxiv, fn, cls in (("sparsemax", "1602.02068", losses.sparsemax_loss, losses.SparsemaxLoss),
                                 ("entmax15", "1905.05702", losses.entmax15_loss, losses.Entmax15Loss),
                                 ("entmax_bisect", "1905.05702", losses.entmax_bisect_loss,
                                  losses.EntmaxBisectLoss)):
        spec = losses.get_loss_spec(name)
        assert spec.arxiv == arxiv and spec.function is fn and spec.module is cls
        assert spec.inputs == ("input", "target") and spec.unit == "position"
        assert not spec.owns_head and not spec.auxiliary and not spec.experimental
        assert dict(spec.example_kwargs) == {}
        assert isinstance(losses.create_loss(name), cls)
        # the "extreme" example has -inf masks that never sit on a target
        (x, t), _ = spec.example_inputs(generator=torch.Generator().manual_seed(0), dtype=torch.float32,
                                        case="extreme")
        assert torch.isneginf(x).any()
        assert torch.isfinite(x.gather(1, t[:, None])).all()
    for fn in (losses.sparsemax, losses.entmax15, losses.entmax_bisect):
        assert fn.__name__ in losses.functional.__all__


def test_docstring_examples_run():
    mod = importlib.import_module("losses.classification.sparsemax")
    result = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 8 and result.failed == 0


def test_modules_expose_their_output_distribution():
    """``predict_proba`` is the mapping the loss is the Fenchel-Young loss of (classes on dim 1)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6, 3, generator=g, dtype=torch.float64)
    pairs = [
        (losses.SparsemaxLoss(), losses.sparsemax(x, dim=1)),
        (losses.Entmax15Loss(), losses.entmax15(x, dim=1)),
        (losses.EntmaxBisectLoss(alpha=1.3), losses.entmax_bisect(x, alpha=1.3, dim=1)),
    ]
    for module, expected in pairs:
        p = module.predict_proba(x)
        torch.testing.assert_close(p, expected)
        torch.testing.assert_close(p.sum(dim=1), torch.ones(4, 3, dtype=torch.float64))
    # gradient of the loss = predict_proba - onehot (the FY identity), per position
    y = torch.randint(0, 6, (4, 3), generator=g)
    xr = x.clone().requires_grad_(True)
    (gx,) = torch.autograd.grad(losses.SparsemaxLoss(reduction="sum")(xr, y), xr)
    onehot = torch.nn.functional.one_hot(y, 6).movedim(-1, 1).double()
    torch.testing.assert_close(gx, losses.SparsemaxLoss().predict_proba(x) - onehot)


# -- torch.compile on CPU: the exact searches run as one opaque operator inside the graph --------


@pytest.mark.parametrize("name", ["sparsemax_loss", "entmax15_loss", "sparsemax", "entmax15"])
def test_compiled_cpu_search_matches_eager(name):
    """One compile with dynamic shapes serves three shapes whose exact search picks Newton, top-k and
    sort at run time (inside the operator): values and gradients equal eager to 1e-12, and the
    compiled function is not recompiled per shape."""
    from losses.classification import _entmax_ops

    if _entmax_ops._THRESHOLD_OP is None:
        pytest.skip("this torch has no torch.library.custom_op; compiled graphs trace the sort")
    torch._dynamo.reset()
    fn = getattr(losses, name)
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)  # fullgraph: no graph break around the search
    counters = torch._dynamo.utils.counters
    counters.clear()
    for shape in [(64, 300), (8, 4000), (3, 7)]:  # Newton, top-k and sort choices
        g = torch.Generator().manual_seed(0)
        z = torch.randn(*shape, generator=g, dtype=torch.float64) * 3
        z[0, 1] = float("-inf")  # a class that does not exist in row 0
        y = torch.randint(0, shape[1], (shape[0],), generator=g)
        y[0] = 0
        y[2] = -100  # an ignored row
        args = (lambda t: (t, y)) if name.endswith("loss") else (lambda t: (t,))
        w = torch.randn(shape, generator=g, dtype=torch.float64)  # a random cotangent for the mappings

        def value(f, t):
            out = f(*args(t))
            return out if out.dim() == 0 else (torch.where(torch.isfinite(out), out, 0) * w).sum()

        ze = z.clone().requires_grad_(True)
        ve = value(fn, ze)
        ve.backward()
        zc = z.clone().requires_grad_(True)
        vc = value(compiled, zc)
        vc.backward()
        torch.testing.assert_close(vc, ve, rtol=1e-12, atol=1e-12, msg=f"{name} {shape}")
        torch.testing.assert_close(zc.grad, ze.grad, rtol=1e-12, atol=1e-12, msg=f"{name} {shape}")
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])  # one graph for the three shapes
    torch._dynamo.reset()


def test_compiled_search_operator_returns_the_eager_threshold(search_path):
    from losses.classification import _entmax_ops

    if _entmax_ops._THRESHOLD_OP is None:
        pytest.skip("this torch has no torch.library.custom_op")
    z = torch.randn(16, 500, generator=torch.Generator().manual_seed(1))
    for kind in ("sparsemax", "entmax15"):
        m, tau = _entmax_ops._THRESHOLD_OP(z, kind)
        th = _entmax_ops.threshold(kind, z, None, method="sort")
        torch.testing.assert_close(m, th.m)
        torch.testing.assert_close(tau, th.tau, rtol=1e-5, atol=1e-6)
        torch.library.opcheck(_entmax_ops._THRESHOLD_OP, (z, kind), test_utils=("test_schema", "test_faketensor"))
    # the search, not a traced sort; with the C kernel the whole per-row loss is one operator
    op = "exact_entmax_fy_rows" if search_path == "native" else "exact_entmax_threshold"
    torch._dynamo.reset()
    graphs = torch._dynamo.explain(losses.sparsemax_loss)(z, torch.zeros(16, dtype=torch.long)).graphs
    assert op in _graph_code(graphs)
    torch._dynamo.reset()
    graphs = torch._dynamo.explain(losses.sparsemax_loss)(z, torch.zeros(16, dtype=torch.long), k=10).graphs
    assert op in _graph_code(graphs)  # on CPU the choice decides, k or not


def _graph_code(graphs) -> str:
    """The code of dynamo's graphs and of their submodules (an autograd.Function's traced forward)."""
    return "\n".join(mod.code for gm in graphs for _, mod in gm.named_modules() if hasattr(mod, "code"))


def test_compiled_search_reads_the_raw_scores_and_the_kept_rows(search_path):
    """With an ignore_index the traced graph cannot see on the host that no row is ignored; the search
    then takes the raw scores and the kept-rows mask (the zeroing of ignored rows happens inside it,
    and only when a row is ignored), so no zeroed copy of the scores is materialised for it. Ignored
    rows holding NaN / +-inf give the eager values and exact zero gradients."""
    from losses.classification import _entmax_ops

    if _entmax_ops._THRESHOLD_KEEP_OP is None:
        pytest.skip("this torch has no torch.library.custom_op")
    g = torch.Generator().manual_seed(3)
    z = torch.randn(12, 300, generator=g, dtype=torch.float64) * 2
    keep = torch.ones(12, dtype=torch.bool)
    keep[[2, 7]] = False
    for kind in ("sparsemax", "entmax15"):
        m, tau = _entmax_ops._THRESHOLD_KEEP_OP(z, keep, kind)
        zeroed = torch.where(keep.unsqueeze(1), z, 0.0)
        m_ref, tau_ref = _entmax_ops._THRESHOLD_OP(zeroed, kind)
        assert torch.equal(m, m_ref) and torch.equal(tau, tau_ref)
        torch.library.opcheck(_entmax_ops._THRESHOLD_KEEP_OP, (z, keep, kind),
                              test_utils=("test_schema", "test_faketensor"))
    torch._dynamo.reset()
    y = torch.randint(0, 300, (12,), generator=g)
    graphs = torch._dynamo.explain(losses.sparsemax_loss)(z, y).graphs
    # the raw scores and the mask go to the operator (with the C kernel: the per-row loss operator)
    op = "exact_entmax_fy_rows" if search_path == "native" else "exact_entmax_threshold_keep"
    assert op in _graph_code(graphs)
    if search_path == "native":
        for kind in ("sparsemax", "entmax15"):
            raw = z.clone()
            raw[2] = float("nan")  # an ignored row is not read
            values, grad = _entmax_ops._FY_ROWS_OP(raw, y, keep, kind)
            xa = torch.where(keep.unsqueeze(1), z, 0.0).requires_grad_(True)
            ref = getattr(losses, f"{kind}_loss")(xa, torch.where(keep, y, -100), reduction="none")
            (gref,) = torch.autograd.grad(ref.sum(), xa)
            torch.testing.assert_close(values, ref, rtol=0, atol=1e-13)
            torch.testing.assert_close(grad, gref, rtol=0, atol=1e-13)
            torch.library.opcheck(_entmax_ops._FY_ROWS_OP, (z, y, keep, kind),
                                  test_utils=("test_schema", "test_faketensor"))
            torch.library.opcheck(_entmax_ops._FY_ROWS_OP, (z, y, None, kind),
                                  test_utils=("test_schema", "test_faketensor"))
    bad = z.clone()
    bad[2] = float("nan")
    bad[7, :5] = float("inf")
    y[[2, 7]] = -100
    for name in ("sparsemax_loss", "entmax15_loss"):
        fn = getattr(losses, name)
        for reduction in ("mean", "sum", "none"):
            torch._dynamo.reset()
            compiled = torch.compile(lambda t: fn(t, y, reduction=reduction), backend="aot_eager", fullgraph=True)
            with losses.validation(False):
                ze = bad.clone().requires_grad_(True)
                ve = fn(ze, y, reduction=reduction)
                ve.sum().backward()
                zc = bad.clone().requires_grad_(True)
                vc = compiled(zc)
                vc.sum().backward()
            torch.testing.assert_close(vc, ve, rtol=1e-12, atol=1e-12, msg=f"{name} {reduction}")
            torch.testing.assert_close(zc.grad, ze.grad, rtol=1e-12, atol=1e-12, msg=f"{name} {reduction}")
            assert torch.all(zc.grad[[2, 7]] == 0) and not zc.grad.isnan().any()
    torch._dynamo.reset()
