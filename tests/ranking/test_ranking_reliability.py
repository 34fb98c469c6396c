"""Reliability rules for the ranking losses (docs/conventions.md; docs/losses/decoupled_softmax.md,
docs/losses/psl.md): candidate masks and ``-inf`` scores, mixed precision, float64 exactness,
degenerate inputs and resumable sampling.

Oracles: the explicit float64 loops of test_decoupled.py / test_soft_topk.py / test_psl.py are
evaluated on the *reduced* rows (masked candidates deleted), which is what a mask means.
"""

from __future__ import annotations

import io
import math

import pytest
import torch

import losses
from tests._helpers import weighted_reduce
from tests.ranking.test_decoupled import decoupled_row, infonce_row
from tests.ranking.test_soft_topk import softplus as softplus_oracle
from tests.ranking.test_soft_topk import solve_u

NEG_INF = -math.inf


def _case(seed=0, B=4, L=7, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, L, generator=g, dtype=torch.float64) * scale
    pos = torch.zeros(B, L, dtype=torch.bool)
    pos[0, 1] = True
    pos[1, [0, 4]] = True
    pos[2, 6] = True
    # row 3: no positive (unit weight 0)
    mask = torch.zeros(B, L, dtype=torch.bool)
    mask[0, [0, 5]] = True
    mask[1, 2] = True
    mask[2, [0, 1, 2]] = True
    mask[3, 3] = True
    return scores, pos, mask


def _reduced_oracle(row_fn, scores, pos, mask, reduction="mean"):
    vals, ws = [], []
    for i in range(scores.shape[0]):
        keep = [l for l in range(scores.shape[1]) if not mask[i, l]]
        s_row = scores[i, keep]
        y_row = pos[i, keep].double().tolist()
        v = row_fn(s_row, y_row)
        vals.append(scores.new_zeros(()) * scores.sum() if v is None else v)
        ws.append(0.0 if v is None else 1.0)
    return weighted_reduce(torch.stack(vals), torch.tensor(ws, dtype=torch.float64), reduction)


ROW_FNS = {
    "decoupled_softmax_loss": lambda s, y: decoupled_row(s, y, 0.5),
    "infonce_loss": lambda s, y: infonce_row(s, y, 0.5),
    "infonce_mean": lambda s, y: infonce_row(s, y, 0.5, "mean"),
}


def _call(name, scores, pos, **kw):
    if name == "infonce_mean":
        return losses.infonce_loss(scores, pos, temperature=0.5, positive_normalization="mean", **kw)
    return getattr(losses, name)(scores, pos, temperature=0.5, **kw)


@pytest.mark.parametrize("name", sorted(ROW_FNS))
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_mask_equals_loss_on_reduced_rows(name, reduction):
    scores, pos, mask = _case(1)
    leaf = scores.clone().requires_grad_(True)
    got = _call(name, leaf, pos, mask=mask, reduction=reduction)
    ref_leaf = scores.clone().requires_grad_(True)
    ref = _reduced_oracle(ROW_FNS[name], ref_leaf, pos, mask, reduction)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-14)
    (g,) = torch.autograd.grad(got.sum(), leaf)
    (gr,) = torch.autograd.grad(ref.sum(), ref_leaf)
    assert torch.all(g[mask] == 0)  # exactly 0 at the excluded candidates
    torch.testing.assert_close(g, gr, rtol=1e-12, atol=1e-14)
    # -inf scores are the same as the mask, with data checks on
    inf_leaf = scores.masked_fill(mask, NEG_INF).requires_grad_(True)
    got_inf = _call(name, inf_leaf, pos, reduction=reduction)
    torch.testing.assert_close(got_inf, got, rtol=0, atol=0)
    (gi,) = torch.autograd.grad(got_inf.sum(), inf_leaf)
    assert torch.equal(gi, g)


def _soft_topk_reduced(scores, pos, mask, *, k, alpha, T):
    vals, ws = [], []
    for i in range(scores.shape[0]):
        keep = [l for l in range(scores.shape[1]) if not mask[i, l]]
        s = [float(scores[i, l]) / T for l in keep]
        P = [j for j, l in enumerate(keep) if pos[i, l]]
        if not P:
            vals.append(0.0)
            ws.append(0.0)
            continue
        u = solve_u([alpha * v for v in s], k)
        vals.append(sum(softplus_oracle(-(alpha * s[j] + u)) for j in P) / len(P))
        ws.append(1.0)
    return torch.tensor(vals, dtype=torch.float64), torch.tensor(ws, dtype=torch.float64)


def test_soft_topk_mask_equals_loss_on_reduced_rows():
    scores, pos, mask = _case(2)
    leaf = scores.clone().requires_grad_(True)
    got = losses.soft_topk_loss(leaf, pos, k=2, temperature=0.5, n_iter=80, mask=mask, reduction="none")
    v, w = _soft_topk_reduced(scores, pos, mask, k=2, alpha=2.0, T=0.5)
    torch.testing.assert_close(got, v, rtol=1e-10, atol=1e-12)
    (g,) = torch.autograd.grad(got.sum(), leaf)
    assert torch.all(g[mask] == 0) and torch.isfinite(g).all()
    # the gradient equals the gradient of the reduced row (library, unmasked path)
    for i in range(3):
        keep = ~mask[i]
        r = scores[i, keep].clone().unsqueeze(0).requires_grad_(True)
        ri = losses.soft_topk_loss(r, pos[i, keep].unsqueeze(0), k=2, temperature=0.5, n_iter=80)
        (gr,) = torch.autograd.grad(ri, r)
        torch.testing.assert_close(g[i, keep], gr[0], rtol=1e-9, atol=1e-12)
    inf_scores = scores.masked_fill(mask, NEG_INF)
    got_inf = losses.soft_topk_loss(inf_scores, pos, k=2, temperature=0.5, n_iter=80, reduction="none")
    torch.testing.assert_close(got_inf, got, rtol=0, atol=0)


def test_soft_topk_neg_inf_with_validation_off_has_finite_gradients():
    scores, pos, mask = _case(3)
    leaf = scores.masked_fill(mask, NEG_INF).requires_grad_(True)
    with losses.validation(False):
        out = losses.soft_topk_loss(leaf, pos, k=2)
    (g,) = torch.autograd.grad(out, leaf)
    assert torch.isfinite(out) and torch.isfinite(g).all() and torch.all(g[mask] == 0)
    # also an all-masked row (an error with validation on) stays finite, with weight 0
    leaf2 = leaf.detach().clone()
    leaf2[3] = NEG_INF
    leaf2.requires_grad_(True)
    with losses.validation(False):
        for fn in (losses.soft_topk_loss, losses.decoupled_softmax_loss, losses.infonce_loss):
            out = fn(leaf2, pos, reduction="none")
            (g,) = torch.autograd.grad(out.sum(), leaf2)
            assert torch.isfinite(out).all() and torch.isfinite(g).all() and out[3] == 0


@pytest.mark.parametrize("fn", [losses.decoupled_softmax_loss, losses.infonce_loss, losses.soft_topk_loss])
def test_mask_errors(fn):
    name = fn.__name__
    kw = {"k": 1} if fn is losses.soft_topk_loss else {}
    scores, pos, mask = _case(4)
    bad = mask.clone()
    bad[1, 4] = True  # a positive
    with pytest.raises(ValueError, match=rf"^{name}: mask or a -inf score removes a positive \(got rows \[1\]\)"):
        fn(scores, pos, mask=bad, **kw)
    with pytest.raises(ValueError, match=rf"^{name}: mask or a -inf score removes a positive"):
        fn(scores.masked_fill(bad, NEG_INF), pos, **kw)
    empty = mask.clone()
    empty[3] = True  # row without positives and without candidates
    with pytest.raises(ValueError, match=rf"^{name}: a row has no finite score .* \(got rows \[3\]\)"):
        fn(scores, pos, mask=empty, **kw)
    with pytest.raises(TypeError, match=rf"^{name}: mask must be a bool tensor"):
        fn(scores, pos, mask=mask.long(), **kw)
    with pytest.raises(ValueError, match=rf"^{name}: mask must have the scores' shape \(4, 7\)"):
        fn(scores, pos, mask=mask[:, :3], **kw)
    for bad_value, what in ((math.nan, "1 NaN"), (math.inf, r"1 \+inf")):
        s = scores.clone()
        s[0, 3] = bad_value
        with pytest.raises(ValueError, match=rf"^{name}: scores contains NaN or infinite values \(got {what}\)"):
            fn(s, pos, **kw)


def test_soft_topk_k_must_be_below_the_unmasked_candidates():
    scores, pos, mask = _case(5)
    # row 2 keeps 4 of 7 candidates: k = 4 is fine unmasked but not for the reduced row
    with pytest.raises(ValueError, match=r"^soft_topk_loss: k = 4 must be smaller than the number of unmasked "
                                         r"candidates of every row \(got rows \[2\]\)"):
        losses.soft_topk_loss(scores, pos, k=4, mask=mask)
    losses.soft_topk_loss(scores, pos, k=4)


@pytest.mark.parametrize("fn", [losses.decoupled_softmax_loss, losses.infonce_loss])
def test_one_candidate_is_an_error(fn):
    with pytest.raises(ValueError, match=rf"^{fn.__name__}: scores must have at least 2 candidates per row.*"
                                         r"bce_with_logits"):
        fn(torch.randn(3, 1), torch.tensor([0, 0, 0]))


@pytest.mark.parametrize("cls,kw", [(losses.DecoupledSoftmaxLoss, {}), (losses.InfoNCELoss, {}),
                                    (losses.SoftTopKLoss, {"k": 2})])
def test_modules_and_in_batch_scores_take_the_mask(cls, kw):
    g = torch.Generator().manual_seed(6)
    q = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    keys = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.arange(4)
    fnm = torch.zeros(4, 4, dtype=torch.bool)
    fnm[0, 2] = fnm[3, 1] = True  # known false negatives
    module = cls(temperature=0.5, **kw)
    out = module(q, keys, ids, mask=fnm)
    scores, t = losses.in_batch_scores(q, keys, ids, mask=fnm)
    assert torch.all(scores[fnm] == NEG_INF) and torch.equal(t, ids)
    fn = {losses.DecoupledSoftmaxLoss: losses.decoupled_softmax_loss, losses.InfoNCELoss: losses.infonce_loss,
          losses.SoftTopKLoss: losses.soft_topk_loss}[cls]
    ref_scores = (q @ keys.T).detach()
    ref = fn(ref_scores, ids, temperature=0.5, mask=fnm, **kw)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)
    # forward(scores, target, mask=...) is the function
    torch.testing.assert_close(module(ref_scores, ids, mask=fnm), ref, rtol=0, atol=0)
    gq, gk = torch.autograd.grad(out, (q, keys))
    assert torch.isfinite(gq).all() and torch.isfinite(gk).all()
    with pytest.raises(ValueError, match=r"^in_batch_scores: mask must have shape \(4, 4\)"):
        losses.in_batch_scores(q, keys, ids, mask=fnm[:, :2])


# --------------------------------------------------------------------------------------
# PSL / sampled softmax / BPR: -inf negatives are neg_mask=False
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,kw", [("psl_loss", {}), ("psl_loss", {"activation": "relu"}),
                                     ("psl_loss", {"variant": "reference"}),
                                     ("psl_loss", {"normalization": "batch"}), ("sampled_softmax_loss", {}),
                                     ("bpr_loss", {})])
def test_neg_inf_negatives_equal_neg_mask(name, kw):
    g = torch.Generator().manual_seed(7)
    pos = torch.rand(4, generator=g, dtype=torch.float64) * 2 - 1
    neg = torch.rand(4, 5, generator=g, dtype=torch.float64) * 2 - 1
    keep = torch.rand(4, 5, generator=g) > 0.4
    keep[2] = False  # a row without any negative
    fn = getattr(losses, name)
    reductions = ["mean"] if kw.get("normalization") == "batch" else ["none", "mean", "sum"]
    for reduction in reductions:
        a = neg.clone().requires_grad_(True)
        ref = fn(pos, a, neg_mask=keep, reduction=reduction, **kw)
        b = neg.masked_fill(~keep, NEG_INF).requires_grad_(True)
        got = fn(pos, b, reduction=reduction, **kw)
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
        (ga,) = torch.autograd.grad(ref.sum(), a)
        (gb,) = torch.autograd.grad(got.sum(), b)
        assert torch.equal(ga, gb) and torch.all(gb[~keep] == 0)
    spec = losses.get_loss_spec(name.replace("_loss", ""))
    if spec.unit_weights is not None and kw.get("normalization") != "batch":
        w_mask = spec.unit_weights(pos, neg, neg_mask=keep, **kw)
        w_inf = spec.unit_weights(pos, neg.masked_fill(~keep, NEG_INF), **kw)
        assert torch.equal(w_mask, w_inf)
    bad = pos.clone()
    bad[0] = NEG_INF
    with pytest.raises(ValueError, match=rf"^{name}: pos_scores contains NaN or infinite values"):
        fn(bad, neg, **kw)


# --------------------------------------------------------------------------------------
# float64 exactness (no softplus cut-off)
# --------------------------------------------------------------------------------------


def test_decoupled_is_exact_in_float64_beyond_the_softplus_threshold():
    # NLSE - s just above 20: F.softplus(threshold=20) would return x, off by exp(-x) ~ 1e-9
    scores = torch.tensor([[0.0, 20.5, -5.0, -6.0], [1.0, 0.0, 0.0, 21.0]], dtype=torch.float64)
    target = torch.tensor([0, 1])
    got = losses.decoupled_softmax_loss(scores, target, temperature=1.0, reduction="none")
    ref = torch.stack([decoupled_row(scores[i], [1.0 if j == int(target[i]) else 0.0 for j in range(4)], 1.0)
                       for i in range(2)])
    torch.testing.assert_close(got, ref, rtol=1e-13, atol=0)
    soft = losses.soft_topk_loss(scores, target, k=1, alpha=1.0, temperature=1.0, n_iter=200, reduction="none")
    for i in range(2):
        u = solve_u(scores[i].tolist(), 1)
        expected = softplus_oracle(-(float(scores[i, int(target[i])]) + u))
        assert soft[i].item() == pytest.approx(expected, rel=1e-12)


def test_bpr_and_psl_are_exact_in_float64_beyond_the_softplus_threshold():
    pos = torch.tensor([0.0, -30.0], dtype=torch.float64)
    neg = torch.tensor([[21.0, 27.0], [-1.0, -3.0]], dtype=torch.float64)
    got = losses.bpr_loss(pos, neg, reduction="none")
    for b in range(2):
        for j in range(2):
            x = float(neg[b, j] - pos[b])
            expected = max(x, 0.0) + math.log1p(math.exp(-abs(x)))
            assert got[b, j].item() == pytest.approx(expected, rel=1e-14)
    # tanh activation: log(1 + tanh d) = log 2 - softplus(-2d), with -2d = 21 just above the cut-off
    p2 = torch.tensor([1.0], dtype=torch.float64)
    n2 = torch.tensor([[-20.0]], dtype=torch.float64)
    got = losses.psl_loss(p2, n2, score_scale=0.5, temperature=1.0, variant="reference")
    d = -10.5
    expected = math.log(2.0) - (max(-2 * d, 0.0) + math.log1p(math.exp(-abs(2 * d))))
    assert got.item() == pytest.approx(expected, rel=1e-13)


# --------------------------------------------------------------------------------------
# mixed precision
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["decoupled_softmax", "infonce", "soft_topk", "psl", "sampled_softmax", "bpr"])
@pytest.mark.parametrize("backward_inside", [True, False])
def test_bf16_autocast_forward_and_backward_equal_float32(name, backward_inside):
    spec = losses.get_loss_spec(name)
    module = losses.create_loss(name, **dict(spec.example_kwargs))
    g = torch.Generator().manual_seed(8)
    if spec.inputs == ("scores", "target"):
        q = torch.randn(5, 4, generator=g)
        k = torch.randn(5, 4, generator=g)

        def run(q_, k_):
            return module(q_, k_, torch.arange(5))
        leaves = (q, k)
    else:
        pos = torch.rand(5, generator=g) * 2 - 1
        neg = torch.rand(5, 3, generator=g) * 2 - 1

        def run(p_, n_):
            return module(p_, n_)
        leaves = (pos, neg)
    ref_leaves = [t.clone().requires_grad_(True) for t in leaves]
    ref = run(*ref_leaves)
    ref_grads = torch.autograd.grad(ref, ref_leaves)
    ac_leaves = [t.clone().requires_grad_(True) for t in leaves]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(*ac_leaves)
        if backward_inside:
            grads = torch.autograd.grad(out, ac_leaves)
    if not backward_inside:
        grads = torch.autograd.grad(out, ac_leaves)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-7)
    for a, b in zip(grads, ref_grads):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_bf16_inputs_under_autocast_give_float32_loss_and_bf16_gradients():
    s = torch.randn(3, 5).bfloat16().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = losses.decoupled_softmax_loss(s, torch.tensor([0, 1, 2]))
        (g,) = torch.autograd.grad(out, s)
    assert out.dtype == torch.float32 and g.dtype == torch.bfloat16
    ref = losses.decoupled_softmax_loss(s.detach().float(), torch.tensor([0, 1, 2]))
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------------------
# resumable sampling
# --------------------------------------------------------------------------------------


def _roundtrip(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("make", [
    lambda: losses.DecoupledSoftmaxLoss(variant="reference", seed=3, temperature=1.0),
    lambda: losses.SoftTopKLoss(variant="reference", k=1, seed=3, temperature=1.0),
])
def test_resumed_module_draws_what_the_uninterrupted_run_draws(make):
    g = torch.Generator().manual_seed(9)
    batches = [(torch.randn(6, 5, generator=g, dtype=torch.float64), torch.rand(6, 5, generator=g) < 0.6)
               for _ in range(6)]
    for _, t in batches:
        t[:, 0] = True
        t[:, 4] = False
    k = 3
    full = make()
    uninterrupted = [full(s, t) for s, t in batches]
    first = make()
    for s, t in batches[:k]:
        first(s, t)
    sd = _roundtrip(first.state_dict())
    assert "_extra_state" in sd
    resumed = make()
    resumed.load_state_dict(sd)
    after = [resumed(s, t) for s, t in batches[k:]]
    for a, b in zip(after, uninterrupted[k:]):
        assert torch.equal(a, b)
    # the draws depend on the state: a fresh module (no state loaded) gives other values
    fresh = make()
    assert any(not torch.equal(fresh(s, t), b) for (s, t), b in zip(batches[k:], uninterrupted[k:]))
    # an older state_dict without the generator still loads (strict), and starts from the seed
    old = {key: v for key, v in sd.items() if not key.endswith("_extra_state")}
    legacy = make()
    legacy.load_state_dict(old)
    again = make()
    assert all(torch.equal(legacy(s, t), again(s, t)) for s, t in batches[:2])
    # a state saved before any draw restarts from the seed
    blank = make()
    loaded = make()
    for s, t in batches[:2]:
        loaded(s, t)
    loaded.load_state_dict(_roundtrip(blank.state_dict()))
    assert torch.equal(loaded(*batches[0]), uninterrupted[0])


@pytest.mark.parametrize("fn,kw", [(losses.decoupled_softmax_loss, {}), (losses.infonce_loss, {}),
                                   (losses.soft_topk_loss, {"k": 2}), (losses.psl_loss, {}),
                                   (losses.sampled_softmax_loss, {}), (losses.bpr_loss, {})])
def test_rows_without_weight_holding_inf_or_nan_give_zero_gradients(fn, kw):
    """validation(False): rows of unit weight 0 (no positive; no valid negative) and masked pairs
    may hold +-inf/NaN; the value is that of the other rows and no gradient is NaN."""
    scores, pos, _ = _case(10)
    if fn in (losses.psl_loss, losses.sampled_softmax_loss, losses.bpr_loss):
        p = scores[:, 0].clone()
        n = scores[:, 1:4].clone()
        keep = torch.ones_like(n, dtype=torch.bool)
        keep[3] = False  # row without a valid negative
        keep[0, 1] = False  # one masked pair
        p[3], n[3, 0], n[0, 1] = math.nan, math.inf, math.nan
        leaves = [p.requires_grad_(True), n.requires_grad_(True)]
        with losses.validation(False):
            out = fn(p, n, neg_mask=keep, **kw)
        clean_n = n.detach().clone()
        clean_n[3], clean_n[0, 1] = 0.0, 0.0
        clean_p = p.detach().clone()
        clean_p[3] = 0.0
        ref = fn(clean_p, clean_n, neg_mask=keep, **kw)
    else:
        dirty = scores.clone()
        dirty[3, 0], dirty[3, 1], dirty[3, 2] = math.inf, math.nan, NEG_INF  # row 3 has no positive
        leaves = [dirty.requires_grad_(True)]
        with losses.validation(False):
            out = fn(dirty, pos, **kw)
        ref = fn(scores[:3], pos[:3], **kw)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)
    for g in torch.autograd.grad(out, leaves):
        assert torch.isfinite(g).all()


def test_hyperparameter_kinds_are_type_errors():
    s, t = torch.randn(2, 5), torch.tensor([0, 1])
    with pytest.raises(TypeError, match=r"^soft_topk_loss: n_iter must be an int >= 1"):
        losses.soft_topk_loss(s, t, k=2, n_iter=8.0)
    with pytest.raises(ValueError, match=r"^soft_topk_loss: n_iter must be an int >= 1"):
        losses.soft_topk_loss(s, t, k=2, n_iter=0)
    with pytest.raises(TypeError, match=r"^decoupled_softmax_loss: mask_value must be None, a finite real number"):
        losses.decoupled_softmax_loss(s, t, mask_value="-inf")
    with pytest.raises(ValueError, match=r"^decoupled_softmax_loss: mask_value must be None, a finite real number"):
        losses.decoupled_softmax_loss(s, t, mask_value=math.nan)
