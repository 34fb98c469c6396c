"""PSL, sampled softmax and BPR (docs/losses/psl.md) against explicit float64 loops and the spec's facts.

The oracles below compute sigma(d) ** (1 / tau) directly (not in log space) from the table of
activations, so they are independent of the implementation's log-space forms.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import losses
from tests._helpers import REDUCTIONS, assert_gradcheck, assert_value_and_grad, weighted_reduce
from tests._helpers.rows import PAIRS, entry

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "psl": entry("psl_loss", "PSLLoss", PAIRS, unit="row"),
    "sampled_softmax": entry("sampled_softmax_loss", "SampledSoftmaxLoss", PAIRS, unit="row"),
    "bpr": entry("bpr_loss", "BPRLoss", PAIRS, unit="pair"),
}

ACTS = ("tanh", "atan", "relu", "exp")


# --------------------------------------------------------------------------------------
# oracles (explicit loops, float64)
# --------------------------------------------------------------------------------------


def sigma(d, act):
    if act == "tanh":
        return 1 + torch.tanh(d)
    if act == "atan":
        return 1 + torch.atan(d)
    if act == "relu":
        return torch.clamp(d + 1, min=0)
    return torch.exp(d)


def psl_oracle(pos, neg, *, tau=0.05, act="tanh", kappa=0.5, include=True, mask=None, normalization="row",
               reduction="mean"):
    """Returns the reduced loss (graph-attached to pos, neg) and the per-row (values, weights)."""
    B, N = neg.shape
    if normalization == "batch":
        total = pos.new_zeros(())
        n_valid = 0
        any_term = False
        for b in range(B):
            for j in range(N):
                if mask is not None and not bool(mask[b, j]):
                    continue
                n_valid += 1
                s = sigma(kappa * (neg[b, j] - pos[b]), act)
                if float(s.detach()) > 0:
                    total = total + s ** (1 / tau)
                    any_term = True
        if n_valid == 0 or not any_term:
            return total * 0, None
        avg = total / n_valid
        return (torch.log(1 + avg) if include else torch.log(avg)), None
    values, weights = [], []
    for b in range(B):
        acc = pos.new_zeros(())
        n_terms = 0
        n_valid = 0
        for j in range(N):
            if mask is not None and not bool(mask[b, j]):
                continue
            n_valid += 1
            s = sigma(kappa * (neg[b, j] - pos[b]), act)
            if float(s.detach()) > 0:  # a pair with sigma <= 0 contributes nothing
                acc = acc + s ** (1 / tau)
                n_terms += 1
        if include:
            values.append(torch.log(1 + acc))
            weights.append(1.0 if n_valid > 0 else 0.0)
        elif n_terms > 0:
            values.append(torch.log(acc))
            weights.append(1.0)
        else:
            values.append(acc * 0)
            weights.append(0.0)
    v = torch.stack(values)
    w = torch.tensor(weights, dtype=torch.float64)
    v = torch.where(w > 0, v, torch.zeros_like(v))
    return weighted_reduce(v, w, reduction), (v, w)


def bpr_oracle(pos, neg, mask=None, reduction="mean"):
    B, N = neg.shape
    out = torch.zeros(B, N, dtype=torch.float64)
    rows = []
    count = 0
    for b in range(B):
        row = []
        for j in range(N):
            if mask is not None and not bool(mask[b, j]):
                row.append(pos.new_zeros(()))
                continue
            row.append(torch.log(1 + torch.exp(neg[b, j] - pos[b])))
            count += 1
        rows.append(torch.stack(row))
    out = torch.stack(rows)
    if reduction == "none":
        return out
    if reduction == "sum":
        return out.sum()
    return out.sum() / max(count, 1)


def cosine_inputs(B=5, N=7, seed=0, low=-1.0, high=1.0):
    g = torch.Generator().manual_seed(seed)
    pos = (torch.rand(B, generator=g, dtype=torch.float64) * (high - low) + low).requires_grad_(True)
    neg = (torch.rand(B, N, generator=g, dtype=torch.float64) * (high - low) + low).requires_grad_(True)
    return pos, neg


def random_mask(B=5, N=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(B, N, generator=g) > 0.4
    m[0] = False  # a row without valid negatives
    m[1, 0] = True
    return m


# --------------------------------------------------------------------------------------
# values and gradients against the loops
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("include", [True, False])
@pytest.mark.parametrize("use_mask", [False, True])
def test_psl_matches_loop_oracle(act, include, use_mask):
    pos, neg = cosine_inputs()
    mask = random_mask() if use_mask else None
    for reduction in REDUCTIONS:
        got = losses.psl_loss(pos, neg, activation=act, include_positive=include, neg_mask=mask,
                              reduction=reduction, temperature=0.1)
        expected, _ = psl_oracle(pos, neg, act=act, tau=0.1, include=include, mask=mask, reduction=reduction)
        assert_value_and_grad(got, expected, [pos, neg])


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("kappa,tau", [(0.25, 0.05), (0.5, 0.025), (0.3, 0.25)])
def test_psl_hyperparameters_match_oracle(act, kappa, tau):
    pos, neg = cosine_inputs(B=3, N=5, seed=4)
    got = losses.psl_loss(pos, neg, activation=act, score_scale=kappa, temperature=tau, reduction="none")
    expected, _ = psl_oracle(pos, neg, act=act, kappa=kappa, tau=tau, include=True, reduction="none")
    assert_value_and_grad(got, expected, [pos, neg])


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("include", [True, False])
@pytest.mark.parametrize("use_mask", [False, True])
def test_psl_batch_normalization_matches_oracle(act, include, use_mask):
    pos, neg = cosine_inputs(seed=2)
    mask = random_mask() if use_mask else None
    got = losses.psl_loss(pos, neg, activation=act, include_positive=include, normalization="batch", neg_mask=mask)
    expected, _ = psl_oracle(pos, neg, act=act, include=include, mask=mask, normalization="batch")
    assert got.shape == ()
    assert_value_and_grad(got, expected, [pos, neg])


def test_variants_set_include_positive():
    pos, neg = cosine_inputs(seed=3)
    ref = losses.psl_loss(pos, neg, variant="reference")
    torch.testing.assert_close(ref, psl_oracle(pos, neg, include=False)[0], rtol=1e-10, atol=0)
    paper = losses.psl_loss(pos, neg, variant="paper")
    torch.testing.assert_close(paper, psl_oracle(pos, neg, include=True)[0], rtol=1e-10, atol=0)
    # the flag overrides the variant
    torch.testing.assert_close(losses.psl_loss(pos, neg, variant="reference", include_positive=True), paper,
                               rtol=0, atol=0)
    s_ref = losses.sampled_softmax_loss(pos, neg, variant="reference")
    torch.testing.assert_close(s_ref, psl_oracle(pos, neg, act="exp", include=False)[0], rtol=1e-10, atol=0)


@pytest.mark.parametrize("include", [True, False])
@pytest.mark.parametrize("use_mask", [False, True])
def test_sampled_softmax_matches_loop_oracle(include, use_mask):
    pos, neg = cosine_inputs(seed=5)
    mask = random_mask() if use_mask else None
    for reduction in REDUCTIONS:
        got = losses.sampled_softmax_loss(pos, neg, include_positive=include, neg_mask=mask, reduction=reduction,
                                          score_scale=0.7, temperature=0.2)
        expected, _ = psl_oracle(pos, neg, act="exp", include=include, mask=mask, reduction=reduction,
                                 kappa=0.7, tau=0.2)
        assert_value_and_grad(got, expected, [pos, neg])


@pytest.mark.parametrize("use_mask", [False, True])
def test_bpr_matches_loop_oracle(use_mask):
    pos, neg = cosine_inputs(seed=6)
    pos2 = (pos.detach() * 3).requires_grad_(True)  # raw scores, not only cosines
    mask = random_mask() if use_mask else None
    for reduction in REDUCTIONS:
        got = losses.bpr_loss(pos2, neg, neg_mask=mask, reduction=reduction)
        expected = bpr_oracle(pos2, neg, mask=mask, reduction=reduction)
        assert_value_and_grad(got, expected, [pos2, neg])
    none = losses.bpr_loss(pos2, neg, neg_mask=mask, reduction="none")
    assert none.shape == neg.shape
    if mask is not None:
        assert torch.all(none[~mask] == 0)


# --------------------------------------------------------------------------------------
# test facts (docs/losses/psl.md)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("include", [True, False])
def test_exp_psl_equals_ssm(include):
    pos, neg = cosine_inputs(seed=7)
    mask = random_mask(seed=8)
    for reduction in REDUCTIONS:
        a = losses.psl_loss(pos, neg, activation="exp", include_positive=include, neg_mask=mask, reduction=reduction)
        b = losses.sampled_softmax_loss(pos, neg, include_positive=include, neg_mask=mask, reduction=reduction)
        assert_value_and_grad(a, b, [pos, neg], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("act", ["tanh", "atan", "relu"])
@pytest.mark.parametrize("kappa", [0.5, 0.25, 0.1])
@pytest.mark.parametrize("include", [True, False])
def test_psl_is_at_most_ssm_on_cosines(act, kappa, include):
    pos, neg = cosine_inputs(B=64, N=9, seed=9)
    psl = losses.psl_loss(pos, neg, activation=act, score_scale=kappa, include_positive=include, reduction="none")
    ssm = losses.sampled_softmax_loss(pos, neg, score_scale=kappa, include_positive=include, reduction="none")
    assert torch.all(psl <= ssm + 1e-12)
    assert torch.any(psl < ssm - 1e-3)  # and strictly below somewhere


def sigma_prime(d, act):
    if act == "tanh":
        return 1 - torch.tanh(d) ** 2
    if act == "atan":
        return 1 / (1 + d ** 2)
    if act == "relu":
        return torch.ones_like(d)
    return torch.exp(d)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("include", [True, False])
def test_gradient_formula(act, include):
    tau, kappa = 0.1, 0.5
    pos, neg = cosine_inputs(B=4, N=6, seed=10)
    loss = losses.psl_loss(pos, neg, activation=act, temperature=tau, score_scale=kappa, include_positive=include,
                           reduction="sum")
    g_neg, g_pos = torch.autograd.grad(loss, [neg, pos])
    with torch.no_grad():
        d = kappa * (neg - pos[:, None])
        s = sigma(d, act)
        powered = s ** (1 / tau)
        denom = (1.0 if include else 0.0) + powered.sum(dim=1, keepdim=True)
        dl_dd = sigma_prime(d, act) / (tau * s) * powered / denom
    torch.testing.assert_close(g_neg, kappa * dl_dd, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_pos, -kappa * dl_dd.sum(dim=1), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("tau,kappa", [(0.05, 0.5), (0.2, 1.0), (1.0, 0.3)])
def test_ssm_with_positive_is_cross_entropy(tau, kappa):
    pos, neg = cosine_inputs(B=5, N=4, seed=11)
    got = losses.sampled_softmax_loss(pos, neg, temperature=tau, score_scale=kappa, include_positive=True)
    logits = torch.cat([torch.zeros(5, 1, dtype=torch.float64), kappa * (neg - pos[:, None]) / tau], dim=1)
    expected = F.cross_entropy(logits, torch.zeros(5, dtype=torch.long))
    assert_value_and_grad(got, expected, [pos, neg], rtol=1e-12, atol=1e-12)


def test_bpr_gradient_is_minus_sigmoid():
    pos, neg = cosine_inputs(B=6, N=1, seed=12)
    neg1 = neg.detach()[:, 0].clone().requires_grad_(True)  # (B,) = one negative per row
    loss = losses.bpr_loss(pos, neg1, reduction="sum")
    g_pos, g_neg = torch.autograd.grad(loss, [pos, neg1])
    torch.testing.assert_close(g_pos, -torch.sigmoid(neg1 - pos).detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g_neg, torch.sigmoid(neg1 - pos).detach(), rtol=1e-12, atol=1e-14)
    # several negatives: the positive collects the sum over its pairs
    pos, neg = cosine_inputs(B=3, N=5, seed=13)
    (g_pos,) = torch.autograd.grad(losses.bpr_loss(pos, neg, reduction="sum"), [pos])
    torch.testing.assert_close(g_pos, -torch.sigmoid(neg - pos[:, None]).sum(dim=1).detach(), rtol=1e-12, atol=0)


# --------------------------------------------------------------------------------------
# edge cases
# --------------------------------------------------------------------------------------


def test_pair_outside_domain_contributes_exact_zero():
    # relu at d = -1 exactly: pos = 1, neg = -1, kappa = 0.5 -> sigma = 0
    pos = torch.tensor([1.0, 0.2], dtype=torch.float64, requires_grad=True)
    neg = torch.tensor([[-1.0, 0.3], [-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    for include in (True, False):
        none = losses.psl_loss(pos, neg, activation="relu", include_positive=include, reduction="none")
        expected_row0 = (1 + 0.5 * (0.3 - 1.0)) ** 20
        expected_row0 = math.log(1 + expected_row0) if include else math.log(expected_row0)
        assert float(none[0].detach()) == pytest.approx(expected_row0, rel=1e-12)
        g = torch.autograd.grad(none.sum(), neg)[0]
        assert g[0, 0] == 0 and torch.isfinite(g).all()
    # unbounded scores, relu with kappa = 1: pairs with neg - pos <= -1 give exactly 0 and no gradient
    pos = torch.tensor([3.0, 0.0], dtype=torch.float64, requires_grad=True)
    neg = torch.tensor([[0.0, 2.5], [-2.0, 0.5]], dtype=torch.float64, requires_grad=True)
    out = losses.psl_loss(pos, neg, activation="relu", score_scale=1.0, bounded_scores=False, reduction="none")
    torch.testing.assert_close(out, torch.log(1 + torch.tensor([0.5 ** 20, 1.5 ** 20], dtype=torch.float64)))
    g_neg, g_pos = torch.autograd.grad(out.sum(), [neg, pos])
    assert g_neg[0, 0] == 0 and g_neg[1, 0] == 0
    assert torch.isfinite(g_pos).all() and torch.isfinite(g_neg).all()
    # atan: d < -tan(1) is outside the domain
    out = losses.psl_loss(pos, neg, activation="atan", score_scale=1.0, bounded_scores=False, reduction="none")
    assert torch.isfinite(out).all()
    g = torch.autograd.grad(out.sum(), neg)[0]
    assert g[0, 0] == 0 and g[1, 0] == 0


def test_row_with_only_out_of_domain_pairs():
    pos = torch.tensor([3.0, 0.0], dtype=torch.float64, requires_grad=True)
    neg = torch.tensor([[0.0, 0.5], [0.1, 0.2]], dtype=torch.float64, requires_grad=True)
    kw = dict(activation="relu", score_scale=1.0, bounded_scores=False)
    # with the [1]: the row is valid with loss log(1 + 0) = 0 and stays in the mean
    none = losses.psl_loss(pos, neg, reduction="none", **kw)
    assert none[0] == 0
    mean = losses.psl_loss(pos, neg, **kw)
    torch.testing.assert_close(mean, none.sum() / 2)
    # without it, log(0) is replaced by 0 and the row leaves the mean
    none = losses.psl_loss(pos, neg, reduction="none", include_positive=False, **kw)
    assert none[0] == 0
    torch.testing.assert_close(losses.psl_loss(pos, neg, include_positive=False, **kw), none[1])
    spec = losses.get_loss_spec("psl")
    assert spec.unit_weights(pos, neg, include_positive=False, **kw).tolist() == [0.0, 1.0]
    g = torch.autograd.grad(losses.psl_loss(pos, neg, include_positive=False, **kw), [pos, neg])
    assert g[0][0] == 0 and torch.all(g[1][0] == 0)


def test_rows_without_valid_negatives_leave_the_mean():
    pos, neg = cosine_inputs(seed=14)
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[1] = False
    mask[3] = False
    for fn in (losses.psl_loss, losses.sampled_softmax_loss):
        for include in (True, False):
            none = fn(pos, neg, neg_mask=mask, include_positive=include, reduction="none")
            assert none[1] == 0 and none[3] == 0
            mean = fn(pos, neg, neg_mask=mask, include_positive=include)
            keep = [0, 2, 4]
            ref = fn(pos[keep], neg[keep], include_positive=include)
            torch.testing.assert_close(mean, ref, rtol=1e-12, atol=0)
            g = torch.autograd.grad(mean, [pos, neg])
            assert g[0][1] == 0 and torch.all(g[1][3] == 0)


@pytest.mark.parametrize("fn", [losses.psl_loss, losses.sampled_softmax_loss, losses.bpr_loss])
def test_all_masked_or_empty_is_attached_zero(fn):
    pos, neg = cosine_inputs(B=3, N=4, seed=15)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    for reduction in ("mean", "sum"):
        out = fn(pos, neg, neg_mask=mask, reduction=reduction)
        assert out.item() == 0.0 and out.grad_fn is not None
        g = torch.autograd.grad(out, [pos, neg])
        assert all(x is not None and torch.all(x == 0) for x in g)
    empty_pos = torch.zeros(0, dtype=torch.float64, requires_grad=True)
    empty_neg = torch.zeros(0, 4, dtype=torch.float64, requires_grad=True)
    out = fn(empty_pos, empty_neg)
    assert out.item() == 0.0
    g = torch.autograd.grad(out, [empty_pos, empty_neg])
    assert g[0].shape == (0,) and g[1].shape == (0, 4)


def test_batch_normalization_all_masked_is_attached_zero():
    pos, neg = cosine_inputs(B=3, N=4, seed=16)
    out = losses.psl_loss(pos, neg, normalization="batch", neg_mask=torch.zeros(3, 4, dtype=torch.bool))
    assert out.item() == 0.0
    g = torch.autograd.grad(out, [pos, neg])
    assert torch.all(g[0] == 0) and torch.all(g[1] == 0)


def test_one_dimensional_negatives_mean_one_negative():
    pos, neg = cosine_inputs(B=5, N=1, seed=17)
    flat = neg.detach()[:, 0].clone().requires_grad_(True)
    for fn in (losses.psl_loss, losses.sampled_softmax_loss):
        torch.testing.assert_close(fn(pos, flat, reduction="none"), fn(pos, neg, reduction="none"), rtol=0, atol=0)
    assert losses.bpr_loss(pos, flat, reduction="none").shape == (5,)
    torch.testing.assert_close(losses.bpr_loss(pos, flat, reduction="none"),
                               losses.bpr_loss(pos, neg, reduction="none")[:, 0], rtol=0, atol=0)
    m = torch.tensor([True, False, True, True, False])
    assert losses.bpr_loss(pos, flat, neg_mask=m, reduction="none")[1] == 0
    torch.testing.assert_close(losses.psl_loss(pos, flat, neg_mask=m, reduction="none"),
                               losses.psl_loss(pos, neg, neg_mask=m[:, None], reduction="none"), rtol=0, atol=0)


def test_extreme_unbounded_scores_are_finite():
    g = torch.Generator().manual_seed(18)
    pos = (torch.randn(5, generator=g) * 1e4).requires_grad_(True)
    neg = (torch.randn(5, 7, generator=g) * 1e4).requires_grad_(True)
    for act in ACTS:
        for include in (True, False):
            out = losses.psl_loss(pos, neg, activation=act, bounded_scores=False, include_positive=include)
            grads = torch.autograd.grad(out, [pos, neg])
            assert torch.isfinite(out) and all(torch.isfinite(x).all() for x in grads), act
    out = losses.bpr_loss(pos, neg)
    assert torch.isfinite(out) and torch.isfinite(torch.autograd.grad(out, neg)[0]).all()


def test_float32_and_half_inputs():
    pos, neg = cosine_inputs(seed=19)
    ref = losses.psl_loss(pos.detach(), neg.detach())
    p32 = pos.detach().float().requires_grad_(True)
    out = losses.psl_loss(p32, neg.detach().float())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)
    p16 = pos.detach().half().requires_grad_(True)
    out = losses.psl_loss(p16, neg.detach().half())
    assert out.dtype == torch.float32
    assert torch.autograd.grad(out, p16)[0].dtype == torch.float16


# --------------------------------------------------------------------------------------
# gradcheck (float64, small odd shapes, away from kinks)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("B,N", [(1, 3), (3, 5)])
def test_gradcheck(B, N):
    pos, neg = cosine_inputs(B=B, N=N, seed=20, low=-0.9, high=0.9)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[0, 0] = False
    for act in ACTS:
        for include in (True, False):
            for reduction in ("none", "mean"):
                f = lambda p, n: losses.psl_loss(p, n, activation=act, include_positive=include,  # noqa: E731
                                                 temperature=0.25, neg_mask=mask, reduction=reduction)
                assert_gradcheck(f, pos, neg)
            f = lambda p, n: losses.psl_loss(p, n, activation=act, include_positive=include,  # noqa: E731
                                             temperature=0.25, normalization="batch")
            assert_gradcheck(f, pos, neg)
    assert_gradcheck(lambda p, n: losses.sampled_softmax_loss(p, n, temperature=0.3), pos, neg)
    assert_gradcheck(lambda p, n: losses.bpr_loss(p, n, neg_mask=mask, reduction="sum"), pos, neg)


# --------------------------------------------------------------------------------------
# errors and validation
# --------------------------------------------------------------------------------------


def test_domain_errors_have_the_spec_message():
    pos, neg = cosine_inputs(B=2, N=3)
    msg = ("psl_loss: activation='relu' needs score_scale <= 0.5 for scores in [-1, 1] (got 1.0); "
           "larger values put d outside the activation's domain")
    with pytest.raises(ValueError) as exc:
        losses.psl_loss(pos, neg, activation="relu", score_scale=1.0)
    assert str(exc.value) == msg
    with pytest.raises(ValueError, match=r"^psl_loss: activation='atan' needs score_scale <= 0\.7787 for scores "
                                         r"in \[-1, 1\] \(got 1\.0\)"):
        losses.psl_loss(pos, neg, activation="atan", score_scale=1.0)
    with pytest.raises(ValueError, match=r"^PSLLoss: activation='relu' needs score_scale <= 0\.5"):
        losses.PSLLoss(activation="relu", score_scale=0.6)
    # at the bound and for unbounded scores: no error
    losses.psl_loss(pos, neg, activation="relu", score_scale=0.5)
    losses.psl_loss(pos, neg, activation="atan", score_scale=math.tan(1) / 2)
    losses.psl_loss(pos, neg, activation="relu", score_scale=1.0, bounded_scores=False)
    losses.psl_loss(pos, neg, activation="tanh", score_scale=5.0)


@pytest.mark.parametrize("kwargs,pattern", [
    ({"temperature": 0.0}, r"^psl_loss: temperature must be finite and satisfy temperature > 0"),
    ({"temperature": -1.0}, r"^psl_loss: temperature"),
    ({"score_scale": 0.0}, r"^psl_loss: score_scale must be finite and satisfy score_scale > 0"),
    ({"activation": "sigmoid"}, r"^psl_loss: activation must be one of"),
    ({"variant": "official"}, r"^psl_loss: variant must be one of"),
    ({"normalization": "global"}, r"^psl_loss: normalization must be one of"),
    ({"include_positive": 1}, r"^psl_loss: include_positive must be None or a bool"),
    ({"bounded_scores": None}, r"^psl_loss: bounded_scores must be a bool"),
    ({"reduction": "elementwise"}, r"^psl_loss: reduction must be one of"),
    ({"normalization": "batch", "reduction": "none"},
     r"^psl_loss: batch-level loss; only reduction='mean' is supported \(got 'none'\)"),
    ({"normalization": "batch", "reduction": "sum"}, r"^psl_loss: batch-level loss"),
])
def test_psl_hyperparameter_errors(kwargs, pattern):
    pos, neg = cosine_inputs(B=2, N=3)
    # a non-bool flag is the wrong kind of argument (TypeError); every other case is a wrong value
    exc = TypeError if "must be None or a bool" in pattern or "must be a bool" in pattern else ValueError
    with pytest.raises(exc, match=pattern):
        losses.psl_loss(pos, neg, **kwargs)


@pytest.mark.parametrize("fn", [losses.psl_loss, losses.sampled_softmax_loss, losses.bpr_loss])
def test_shape_and_type_errors(fn):
    name = fn.__name__
    pos, neg = cosine_inputs(B=3, N=4)
    with pytest.raises(ValueError, match=rf"^{name}: pos_scores must have shape \(B,\)"):
        fn(pos[:, None], neg)
    with pytest.raises(ValueError, match=rf"^{name}: neg_scores must have shape \(3, N\)"):
        fn(pos, neg[:2])
    with pytest.raises(ValueError, match=rf"^{name}: neg_scores must have shape"):
        fn(pos, neg[:, :, None])
    with pytest.raises(ValueError, match=rf"^{name}: neg_mask must have the shape of neg_scores"):
        fn(pos, neg, neg_mask=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match=rf"^{name}: neg_mask must be a bool tensor"):
        fn(pos, neg, neg_mask=torch.ones(3, 4))
    with pytest.raises(TypeError, match=rf"^{name}: pos_scores must be a floating-point tensor"):
        fn(torch.ones(3, dtype=torch.long), neg)
    with pytest.raises(TypeError, match=rf"^{name}: neg_scores must be a torch.Tensor"):
        fn(pos, [[0.0] * 4] * 3)


@pytest.mark.parametrize("fn", [losses.psl_loss, losses.sampled_softmax_loss, losses.bpr_loss])
def test_nan_and_inf_are_data_checks(fn):
    name = fn.__name__
    pos, neg = cosine_inputs(B=3, N=4)
    bad_neg = neg.detach().clone()
    bad_neg[1, 2] = math.nan
    with pytest.raises(ValueError, match=rf"^{name}: neg_scores contains NaN or infinite values \(got 1 NaN\)"):
        fn(pos, bad_neg)
    bad_pos = pos.detach().clone()
    bad_pos[0] = -math.inf
    with pytest.raises(ValueError, match=rf"^{name}: pos_scores contains NaN or infinite values \(got 1 -inf\)"):
        fn(bad_pos, neg)
    with losses.validation(False):
        fn(pos, bad_neg)  # the data check is off; shape checks still run
        with pytest.raises(ValueError, match="neg_scores must have shape"):
            fn(pos, neg[:2])
        if fn is losses.psl_loss:
            with pytest.raises(ValueError, match="needs score_scale"):
                fn(pos, neg, activation="relu", score_scale=1.0)


def test_sampled_softmax_and_bpr_hyperparameter_errors():
    pos, neg = cosine_inputs(B=2, N=3)
    with pytest.raises(ValueError, match=r"^sampled_softmax_loss: temperature"):
        losses.sampled_softmax_loss(pos, neg, temperature=0)
    with pytest.raises(ValueError, match=r"^sampled_softmax_loss: score_scale"):
        losses.sampled_softmax_loss(pos, neg, score_scale=-0.5)
    with pytest.raises(ValueError, match=r"^sampled_softmax_loss: variant"):
        losses.sampled_softmax_loss(pos, neg, variant="x")
    with pytest.raises(ValueError, match=r"^bpr_loss: reduction"):
        losses.bpr_loss(pos, neg, reduction="avg")
    with pytest.raises(ValueError, match=r"^SampledSoftmaxLoss: temperature"):
        losses.SampledSoftmaxLoss(temperature=0.0)
    with pytest.raises(ValueError, match=r"^BPRLoss: reduction"):
        losses.BPRLoss(reduction="avg")
    with pytest.raises(ValueError, match=r"^PSLLoss: batch-level loss"):
        losses.PSLLoss(normalization="batch", reduction="none")


# --------------------------------------------------------------------------------------
# modules
# --------------------------------------------------------------------------------------


def test_modules_equal_functions():
    pos, neg = cosine_inputs(seed=21)
    mask = random_mask(seed=22)
    kw = dict(temperature=0.1, activation="atan", score_scale=0.6, variant="reference", include_positive=True,
              normalization="row", bounded_scores=True, reduction="sum")
    m = losses.PSLLoss(**kw)
    torch.testing.assert_close(m(pos, neg, neg_mask=mask), losses.psl_loss(pos, neg, neg_mask=mask, **kw),
                               rtol=0, atol=0)
    assert "activation='atan'" in repr(m) and "score_scale=0.6" in repr(m)
    m = losses.PSLLoss(normalization="batch")
    torch.testing.assert_close(m(pos, neg), losses.psl_loss(pos, neg, normalization="batch"), rtol=0, atol=0)
    kw = dict(temperature=0.2, score_scale=1.0, variant="paper", include_positive=False, reduction="none")
    m = losses.SampledSoftmaxLoss(**kw)
    torch.testing.assert_close(m(pos, neg, neg_mask=mask), losses.sampled_softmax_loss(pos, neg, neg_mask=mask, **kw),
                               rtol=0, atol=0)
    assert repr(m).startswith("SampledSoftmaxLoss(temperature=0.2")
    m = losses.BPRLoss(reduction="none")
    torch.testing.assert_close(m(pos, neg, neg_mask=mask), losses.bpr_loss(pos, neg, neg_mask=mask, reduction="none"),
                               rtol=0, atol=0)
    assert repr(m) == "BPRLoss(reduction='none')"
    assert isinstance(losses.create_loss("psl", temperature=0.025), losses.PSLLoss)


def test_registry_unit_weights():
    pos, neg = cosine_inputs(seed=23)
    mask = random_mask(seed=24)
    w = losses.get_loss_spec("psl").unit_weights(pos, neg, neg_mask=mask)
    assert w.tolist() == mask.any(dim=1).double().tolist()
    w = losses.get_loss_spec("sampled_softmax").unit_weights(pos, neg, neg_mask=mask)
    assert w.tolist() == mask.any(dim=1).double().tolist()
    w = losses.get_loss_spec("bpr").unit_weights(pos, neg, neg_mask=mask)
    assert w.tolist() == mask.double().tolist()
    spec = losses.get_loss_spec("bpr")
    assert spec.unit == "pair" and spec.arxiv == "1205.2618" and spec.inputs == ("pos_scores", "neg_scores")
    assert losses.get_loss_spec("psl").arxiv == "2411.00163"
