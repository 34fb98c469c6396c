"""Soft top-k loss (docs/losses/decoupled_softmax.md): an independent float64 loop oracle (its own solver for the
threshold), the spec's facts (sum of p, bracket up to L = 1e6, implicit gradient vs finite
differences), the reference variant's positive sampling, errors and modules."""

from __future__ import annotations

import copy
import itertools
import math
import pickle

import pytest
import torch

import losses
from tests._helpers import assert_gradcheck, weighted_reduce
from losses.ranking.soft_topk import _soft_topk_threshold
from tests._helpers.rows import SCORES, entry

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "soft_topk": entry("soft_topk_loss", "SoftTopKLoss", SCORES, unit="row", example={"k": 2}),
}


# --------------------------------------------------------------------------------------
# oracle: Python floats, own bracket (wide and fixed), 100 bisection steps
# --------------------------------------------------------------------------------------


def sig(z):
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def solve_u(x, k):
    lo, hi = -max(x) - 60.0, -min(x) + 60.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if sum(sig(v + mid) for v in x) < k:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def softplus(z):
    return max(z, 0.0) + math.log1p(math.exp(-abs(z)))


def oracle_rows(scores, Y, *, k, alpha, T, masked=None, kept=None):
    """Per-row values and weights. ``masked``/``kept``: per-row sets of positives whose scaled
    scores become -100 / that are scored (the reference variant)."""
    S = scores.tolist()
    vals, ws = [], []
    for i, (row, y) in enumerate(zip(S, Y)):
        L = len(row)
        P = [l for l in range(L) if y[l] > 0]
        ki = math.ceil(sum(max(v, 0.0) for v in y)) if k == "num_positives" else k
        s = [v / T for v in row]
        if masked is not None:
            s = [-100.0 if l in masked[i] else s[l] for l in range(L)]
        scored = P if kept is None else sorted(kept[i])
        if not scored or ki == 0:
            vals.append(0.0)
            ws.append(0.0)
            continue
        u = solve_u([alpha * v for v in s], ki)
        vals.append(sum(softplus(-(alpha * s[l] + u)) for l in scored) / len(scored))
        ws.append(1.0)
    return torch.tensor(vals, dtype=torch.float64), torch.tensor(ws, dtype=torch.float64)


def dense(target, L):
    if target.dtype == torch.bool or target.is_floating_point():
        return target.double().tolist()
    out = []
    for row in target.tolist():
        row = row if isinstance(row, list) else [row]
        d = [0.0] * L
        for j in row:
            if j != -100:
                d[j] = 1.0
        out.append(d)
    return out


def case(seed=0, B=5, L=7, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, L, generator=g, dtype=torch.float64) * scale
    mask = torch.zeros(B, L, dtype=torch.bool)
    mask[1, [0, 3]] = True
    mask[2, 5] = True
    mask[3, [1, 2, 6]] = True
    mask[4, 4] = True  # row 0: no positive
    rel = torch.where(mask, torch.rand(B, L, generator=g, dtype=torch.float64) * 0.9 + 0.05, torch.zeros(B, L, dtype=torch.float64))
    ids = torch.tensor([[-100, -100, -100], [0, 3, -100], [5, -100, -100], [1, 2, 6], [4, 4, -100]])
    return scores, mask, rel, ids


def fd_grad(f, x, h=1e-6):
    g = torch.zeros_like(x)
    for idx in itertools.product(*[range(n) for n in x.shape]):
        xp, xm = x.clone(), x.clone()
        xp[idx] += h
        xm[idx] -= h
        g[idx] = (f(xp) - f(xm)) / (2 * h)
    return g


# --------------------------------------------------------------------------------------
# values and gradients against the oracle
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, "num_positives"])
@pytest.mark.parametrize("target_kind", ["bool", "float", "ids"])
@pytest.mark.parametrize("alpha,T", [(2.0, 1.0), (0.7, 0.2)])
def test_matches_oracle(k, target_kind, alpha, T):
    scores, mask, rel, ids = case(scale=0.5 if T == 1.0 else 0.1)
    target = {"bool": mask, "float": rel, "ids": ids}[target_kind]
    Y = dense(target, 7)
    v, w = oracle_rows(scores, Y, k=k, alpha=alpha, T=T)
    for reduction in ("none", "mean", "sum"):
        got = losses.soft_topk_loss(scores, target, k=k, alpha=alpha, temperature=T, n_iter=60, reduction=reduction)
        torch.testing.assert_close(got, weighted_reduce(v, w, reduction), rtol=1e-10, atol=1e-12)
    # gradient against central differences of the oracle
    x = scores.clone().requires_grad_(True)
    out = losses.soft_topk_loss(x, target, k=k, alpha=alpha, temperature=T, n_iter=60, reduction="sum")
    (g,) = torch.autograd.grad(out, x)
    ref = fd_grad(lambda s: float(weighted_reduce(*oracle_rows(s, Y, k=k, alpha=alpha, T=T), "sum")), scores)
    torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-6)


def test_equal_scores_give_log_L_over_k():
    for L, k in ((7, 2), (10, 3), (1000, 5)):
        for dtype in (torch.float64, torch.float32):
            scores = torch.full((2, L), 0.3, dtype=dtype)
            target = torch.tensor([0, L - 1])
            got = losses.soft_topk_loss(scores, target, k=k)
            tol = dict(rtol=1e-12, atol=0) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got, torch.tensor(math.log(L / k), dtype=dtype), **tol)


@pytest.mark.parametrize("n_iter", [24, 32])
def test_float64_is_exact_with_the_default_bisection(n_iter):
    """The Newton polish after the bisection: with the default 32 steps (and with 24) the float64
    values are the oracle's to 1e-12 relative (the bisection alone stops ~2^-32 of the bracket away),
    and the threshold makes sum p = k to float64 rounding."""
    scores, mask, rel, ids = case(seed=5, B=5, L=40, scale=3.0)
    ids = torch.tensor([[-100, -100, -100], [0, 3, -100], [5, -100, -100], [1, 2, 36], [4, 4, -100]])
    mask = torch.zeros(5, 40, dtype=torch.bool)
    for i, row in enumerate(ids.tolist()):
        for j in row:
            if j != -100:
                mask[i, j] = True
    Y = dense(mask, 40)
    for k in (1, 7):
        v, w = oracle_rows(scores, Y, k=k, alpha=2.0, T=0.5)
        got = losses.soft_topk_loss(scores, ids, k=k, alpha=2.0, temperature=0.5, n_iter=n_iter, reduction="none")
        torch.testing.assert_close(got, v * w, rtol=1e-12, atol=1e-15)
        s = scores / 0.5
        t = _soft_topk_threshold(s, float(k), 2.0, n_iter)
        torch.testing.assert_close(torch.sigmoid(2.0 * (s + t[:, None])).sum(dim=1), torch.full((5,), float(k), dtype=torch.float64),
                                   rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------
# test facts: sum of p, bracket for large L, implicit gradient
# --------------------------------------------------------------------------------------


def test_probabilities_sum_to_k_float32():
    g = torch.Generator().manual_seed(1)
    for L in (7, 50, 300):
        raw = torch.randn(6, L, generator=g)
        raw[0] = 0.0  # equal scores
        raw[1, 0] = 50.0  # one dominant score
        s = raw / 0.05
        for k in (1, 5):
            if k >= L:
                continue
            t = _soft_topk_threshold(s, float(k), 2.0, 32)
            p = torch.sigmoid(2.0 * (s + t[:, None]))
            assert t.dtype == torch.float32
            torch.testing.assert_close(p.sum(dim=1), torch.full((6,), float(k)), rtol=0, atol=1e-5)
        # per-row k
        kk = torch.tensor([1.0, 2.0, 3.0, 1.0, 4.0, 2.0])
        t = _soft_topk_threshold(s, kk, 2.0, 32)
        torch.testing.assert_close(torch.sigmoid(2.0 * (s + t[:, None])).sum(dim=1), kk, rtol=0, atol=1e-5)


def _mp_rows(scores, pos_lists, *, k, alpha, T):
    """Per-row loss (mean over positives of -log sigmoid(alpha (s/T + t))) with the threshold solved
    by a plain bisection on ``sum p - k`` in mpmath with enough digits that nothing cancels
    (independent of the library's solver)."""
    import mpmath

    out = []
    for row, P in zip(scores.tolist(), pos_lists):
        # enough digits that sum p carries its smallest terms (down to about exp(-2 max|x|)) next to k
        mpmath.mp.dps = 60 + int(2 * alpha * max(abs(v) for v in row) / T / math.log(10))
        x = [mpmath.mpf(alpha) * mpmath.mpf(v) / mpmath.mpf(T) for v in row]

        def f(u):
            return sum(1 / (1 + mpmath.exp(-(v + u))) for v in x) - k

        lo, hi = -max(x) - 200, -min(x) + 200
        for _ in range(400):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
        u = (lo + hi) / 2
        out.append(float(sum(mpmath.log1p(mpmath.exp(-(x[l] + u))) for l in P) / len(P)))
    return out


def test_saturated_sigmoids_keep_the_threshold_in_float32_and_float64():
    """Cosine-range scores over the default temperature put alpha s / T near +-40: the top k
    sigmoids are within float32's epsilon of 1 and the rest of 0, so a direct ``sum p = k`` is
    exactly k over a wide range of t (a root 2.2 off in the first case, loss 35.36 instead of
    33.99). float64 saturates the same way at temperature 0.002."""
    s = torch.tensor([[0.9, 0.8, -0.1, -0.5], [0.95, 0.9, 0.85, -0.7]])
    ids = torch.tensor([[3], [1]])
    g = torch.Generator().manual_seed(11)
    s2 = torch.cat([0.8 + 0.05 * torch.randn(6, 5, generator=g), -0.2 + 0.05 * torch.randn(6, 5, generator=g)], 1)
    ids2 = torch.randint(5, 10, (6, 1), generator=g)
    for scores, t, k in ((s, ids, 2), (s2, ids2, 5)):
        want = _mp_rows(scores, t.tolist(), k=k, alpha=2.0, T=0.05)
        for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
            got = losses.soft_topk_loss(scores.to(dtype), t, k=k, reduction="none")
            torch.testing.assert_close(got, torch.tensor(want, dtype=dtype), rtol=tol, atol=0)
        # the implicit gradient: float32 equals float64 (itself checked by gradcheck elsewhere)
        grads = []
        for dtype in (torch.float32, torch.float64):
            leaf = scores.detach().to(dtype).clone().requires_grad_()
            losses.soft_topk_loss(leaf, t, k=k).backward()
            grads.append(leaf.grad.double())
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-5)
    want = _mp_rows(s, ids.tolist(), k=2, alpha=2.0, T=0.002)
    got = losses.soft_topk_loss(s.double(), ids, k=2, temperature=0.002, reduction="none")
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=0)


def test_bracket_holds_up_to_a_million_labels():
    L, k, alpha = 1_000_000, 5, 2.0
    g = torch.Generator().manual_seed(2)
    s = torch.empty(3, L, dtype=torch.float64)
    s[0] = 0.0  # equal
    s[1] = torch.randn(L, generator=g, dtype=torch.float64) / 0.05  # random
    s[2] = 0.0
    s[2, 7] = 1e3  # one dominant
    # the case is discriminating: fixed +-10/alpha margins around the scores miss the root
    assert L * torch.sigmoid(torch.tensor(-10.0, dtype=torch.float64)) > k
    t = _soft_topk_threshold(s, float(k), alpha, 40)
    p_sum = torch.sigmoid(alpha * (s + t[:, None])).sum(dim=1)
    torch.testing.assert_close(p_sum, torch.full((3,), float(k), dtype=torch.float64), rtol=1e-8, atol=0)
    # equal scores: L_i = -log p = log(L / k), in float64 (from t) and float32 (the public loss)
    loss64 = -torch.nn.functional.logsigmoid(alpha * (s[0, 0] + t[0]))
    torch.testing.assert_close(loss64, torch.tensor(math.log(L / k), dtype=torch.float64), rtol=1e-8, atol=0)
    out = losses.soft_topk_loss(torch.zeros(1, L), torch.tensor([3]), k=k)
    torch.testing.assert_close(out, torch.tensor(math.log(L / k)), rtol=1e-5, atol=0)


def test_log_probability_gradient_matches_formula_and_finite_differences():
    alpha, n_iter = 2.0, 60
    g = torch.Generator().manual_seed(3)
    s0 = torch.randn(2, 5, generator=g, dtype=torch.float64)
    k = torch.tensor([2.0, 3.0], dtype=torch.float64)

    def log_p(s):
        t = _soft_topk_threshold(s, k, alpha, n_iter)
        return torch.nn.functional.logsigmoid(alpha * (s + t[:, None]))

    J = torch.autograd.functional.jacobian(log_p, s0)  # (2, 5, 2, 5)
    with torch.no_grad():
        t = _soft_topk_threshold(s0, k, alpha, n_iter)
        p = torch.sigmoid(alpha * (s0 + t[:, None]))
        v = p * (1 - p)
        frac = v / v.sum(dim=1, keepdim=True)
    h = 1e-6
    for i in range(2):
        for j in range(5):
            for m in range(5):
                formula = alpha * (1 - p[i, j]) * ((1.0 if j == m else 0.0) - frac[i, m])
                sp, sm = s0.clone(), s0.clone()
                sp[i, m] += h
                sm[i, m] -= h
                fd = (log_p(sp)[i, j] - log_p(sm)[i, j]) / (2 * h)
                torch.testing.assert_close(J[i, j, i, m], formula, rtol=1e-10, atol=1e-12)
                torch.testing.assert_close(J[i, j, i, m], fd, rtol=1e-6, atol=1e-8)
            other = 1 - i
            assert torch.all(J[i, j, other] == 0)  # rows are independent


def test_gradcheck():
    for B, L in ((1, 3), (3, 5)):
        g = torch.Generator().manual_seed(4 + L)
        x = torch.randn(B, L, generator=g, dtype=torch.float64).requires_grad_(True)
        mask = torch.zeros(B, L, dtype=torch.bool)
        mask[:, 0] = True
        mask[-1, 1] = True
        for k in (1, 2, "num_positives"):
            for reduction in ("none", "mean"):
                def f(s, k=k, reduction=reduction):
                    return losses.soft_topk_loss(s, mask, k=k, temperature=0.5, n_iter=60, reduction=reduction)
                assert_gradcheck(f, x)


# --------------------------------------------------------------------------------------
# num_positives, reference variant, edge cases
# --------------------------------------------------------------------------------------


def test_num_positives_uses_ceil_of_relevance_sum():
    scores = torch.randn(2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    rel = torch.tensor([[0.5, 0.7, 0, 0, 0, 0], [0.2, 0, 0, 0, 0, 0]], dtype=torch.float64)  # k = 2, 1
    got = losses.soft_topk_loss(scores, rel, k="num_positives", temperature=1.0, n_iter=60, reduction="none")
    for i, kk in enumerate((2, 1)):
        ref = losses.soft_topk_loss(scores[i:i + 1], rel[i:i + 1] > 0, k=kk, temperature=1.0, n_iter=60)
        torch.testing.assert_close(got[i], ref, rtol=1e-12, atol=0)


def test_reference_variant_keeps_k_sampled_positives():
    scores, mask, rel, _ = case(seed=6, scale=0.5)
    Y = dense(mask, 7)
    # no row has more than k positives: the reference equals the paper
    for k in (3, 4):
        torch.testing.assert_close(
            losses.soft_topk_loss(scores, mask, k=k, temperature=1.0, variant="reference",
                                  generator=torch.Generator().manual_seed(0)),
            losses.soft_topk_loss(scores, mask, k=k, temperature=1.0), rtol=0, atol=0)
    # k = 1 < 3 positives in row 3 and 2 in row 1: one sampled positive is scored, the others -> -100
    k = 1
    seen = set()
    for seed in range(12):
        got = losses.soft_topk_loss(scores, mask, k=k, temperature=1.0, n_iter=60, variant="reference",
                                    generator=torch.Generator().manual_seed(seed), reduction="none")
        for i in range(5):
            P = [l for l in range(7) if Y[i][l] > 0]
            if not P:
                assert got[i] == 0
                continue
            matches = []
            for kept in itertools.combinations(P, min(k, len(P))):
                masked = [set() for _ in range(5)]
                masked[i] = set(P) - set(kept)
                keep = [set(P) for _ in range(5)]
                keep[i] = set(kept)
                v, _ = oracle_rows(scores, Y, k=k, alpha=2.0, T=1.0, masked=masked, kept=keep)
                if abs(float(v[i]) - float(got[i])) <= 1e-9:
                    matches.append(kept)
            assert len(matches) == 1, (i, matches)
            if i == 3:
                seen.add(matches[0])
    assert len(seen) >= 2  # really random


def test_reference_variant_is_deterministic_for_a_seed():
    scores, mask, _, _ = case(seed=7, scale=0.5)
    reps, mreps = scores.repeat(10, 1), mask.repeat(10, 1)
    run = lambda gen: losses.soft_topk_loss(reps, mreps, k=1, variant="reference", generator=gen,  # noqa: E731
                                            reduction="none")
    torch.testing.assert_close(run(torch.Generator().manual_seed(1)), run(torch.Generator().manual_seed(1)),
                               rtol=0, atol=0)
    m = losses.SoftTopKLoss(k=1, variant="reference", seed=4, reduction="none")
    first = m(reps, mreps)
    torch.testing.assert_close(first, run(torch.Generator().manual_seed(4)), rtol=0, atol=0)
    c1, c2 = copy.deepcopy(m), pickle.loads(pickle.dumps(m))
    nxt = m(reps, mreps)
    assert not torch.equal(first, nxt)
    torch.testing.assert_close(c1(reps, mreps), nxt, rtol=0, atol=0)
    torch.testing.assert_close(c2(reps, mreps), nxt, rtol=0, atol=0)


def test_rows_without_positives_and_all_ignored():
    scores, mask, _, ids = case(seed=8)
    x = scores.clone().requires_grad_(True)
    none = losses.soft_topk_loss(x, mask, k=2, reduction="none")
    assert none[0] == 0
    mean = losses.soft_topk_loss(x, mask, k=2)
    torch.testing.assert_close(mean, none[1:].mean(), rtol=1e-12, atol=0)
    g = torch.autograd.grad(mean, x)[0]
    assert torch.all(g[0] == 0)
    for k in (2, "num_positives"):
        for reduction in ("mean", "sum"):
            out = losses.soft_topk_loss(x, torch.full((5,), -100), k=k, reduction=reduction)
            assert out.item() == 0.0 and out.grad_fn is not None
            assert torch.all(torch.autograd.grad(out, x)[0] == 0)
    assert losses.get_loss_spec("soft_topk").unit_weights(scores, ids).tolist() == [0.0, 1.0, 1.0, 1.0, 1.0]


def test_extreme_and_half_inputs():
    g = torch.Generator().manual_seed(9)
    _, mask, _, _ = case()
    for scale in (1e4, 1.0):
        x = (torch.randn(5, 7, generator=g) * scale).requires_grad_(True)
        for kw in ({"k": 2}, {"k": "num_positives"}, {"k": 1, "variant": "reference"}):
            out = losses.soft_topk_loss(x, mask, **kw)
            assert torch.isfinite(out) and torch.isfinite(torch.autograd.grad(out, x)[0]).all()
    x = torch.zeros(3, 7)
    x[:, 0] = 1e4  # one dominant, saturated sigmoids
    x.requires_grad_(True)
    out = losses.soft_topk_loss(x, torch.tensor([1, 0, 2]), k=1)
    assert torch.isfinite(out) and torch.isfinite(torch.autograd.grad(out, x)[0]).all()
    h = (torch.randn(5, 7, generator=g)).half().requires_grad_(True)
    out = losses.soft_topk_loss(h, mask, k=2)
    ref = losses.soft_topk_loss(h.detach().float(), mask, k=2)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert torch.autograd.grad(out, h)[0].dtype == torch.float16


# --------------------------------------------------------------------------------------
# errors and modules
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, -1, True, 2.5, "all", None])
def test_bad_k(k):
    # one exception type per mistake: a wrong kind (bool, float, None) is TypeError, a wrong value ValueError
    exc = TypeError if k is None or isinstance(k, (bool, float)) else ValueError
    with pytest.raises(exc, match=r"^soft_topk_loss: k must be an int with 0 < k < L or 'num_positives'"):
        losses.soft_topk_loss(torch.randn(2, 5), torch.tensor([0, 1]), k=k)
    with pytest.raises(exc, match=r"^SoftTopKLoss: k must be"):
        losses.SoftTopKLoss(k=k)


def test_errors():
    s, t = torch.randn(2, 5), torch.tensor([0, 1])
    with pytest.raises(ValueError, match=r"^soft_topk_loss: k must satisfy 0 < k < L = 5 \(got 5\)"):
        losses.soft_topk_loss(s, t, k=5)
    with pytest.raises(ValueError, match=r"^soft_topk_loss: k must satisfy 0 < k < L = 5 \(got 7\)"):
        losses.SoftTopKLoss(k=7)(s, t)
    with pytest.raises(ValueError, match=r"^soft_topk_loss: alpha must be finite and satisfy alpha > 0"):
        losses.soft_topk_loss(s, t, k=2, alpha=0.0)
    with pytest.raises(ValueError, match=r"^soft_topk_loss: temperature must be finite and satisfy temperature > 0"):
        losses.soft_topk_loss(s, t, k=2, temperature=-1.0)
    with pytest.raises(ValueError, match=r"^soft_topk_loss: n_iter must be an int >= 1"):
        losses.soft_topk_loss(s, t, k=2, n_iter=0)
    with pytest.raises(ValueError, match=r"^soft_topk_loss: variant must be one of"):
        losses.soft_topk_loss(s, t, k=2, variant="dexml")
    with pytest.raises(ValueError, match=r"^soft_topk_loss: soft top-k needs at least 2 labels per row"):
        losses.soft_topk_loss(torch.randn(2, 1), torch.tensor([0, 0]), k="num_positives")
    with pytest.raises(ValueError, match=r"^SoftTopKLoss: alpha"):
        losses.SoftTopKLoss(alpha=-2.0)
    with pytest.raises(TypeError, match=r"^SoftTopKLoss: seed must be an int or None"):
        losses.SoftTopKLoss(seed="0")
    # a row with k_i >= L under k="num_positives" is a data check
    full = torch.ones(2, 5, dtype=torch.bool)
    full[1, 1:] = False
    with pytest.raises(ValueError, match=r"^soft_topk_loss: k='num_positives' needs fewer than L = 5 positives per "
                                         r"row \(got max k_i=5\)"):
        losses.soft_topk_loss(s, full, k="num_positives")
    with losses.validation(False):
        losses.soft_topk_loss(s, full, k="num_positives")


def test_module_equals_function_and_query_keys_form():
    scores, mask, rel, ids = case(seed=10, scale=0.3)
    kw = dict(k=2, alpha=1.5, temperature=0.3, n_iter=40, variant="paper", ignore_index=-100, reduction="none")
    m = losses.SoftTopKLoss(**kw)
    torch.testing.assert_close(m(scores, rel), losses.soft_topk_loss(scores, rel, **kw), rtol=0, atol=0)
    assert repr(m).startswith("SoftTopKLoss(k=2, alpha=1.5, temperature=0.3, n_iter=40")
    assert "k='num_positives'" in repr(losses.SoftTopKLoss(k="num_positives"))
    g = torch.Generator().manual_seed(11)
    q = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    keys = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 1, 2, 3])
    got = losses.SoftTopKLoss(k=2)(q, keys, t)
    expected = losses.soft_topk_loss(q @ keys.T, t, k=2)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    ga = torch.autograd.grad(got, [q, keys])
    gb = torch.autograd.grad(expected, [q, keys])
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
