"""Orthogonal Projection Loss (docs/losses/opl.md): loop oracle, gradcheck, test facts, errors."""

from __future__ import annotations

import copy
import itertools
import math
import pickle

import pytest
import torch

import losses
from tests._helpers import assert_gradcheck, randn
from tests._helpers.rows import EMBEDDINGS, entry

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "opl": entry("opl_loss", "OrthogonalProjectionLoss", EMBEDDINGS, unit="batch", auxiliary=True),
}

IGN = -100


# --------------------------------------------------------------------------------------
# independent float64 oracle: explicit loops straight from the formula (autograd-able)
# --------------------------------------------------------------------------------------


def _normalize(v):
    norm = torch.sqrt(sum(v[k] * v[k] for k in range(v.shape[0])))
    return v / torch.clamp(norm, min=1e-12)


def opl_oracle(f, y, *, gamma=0.5, variant="paper", neg_term=None, ignore_index=IGN):
    rows = [i for i in range(f.shape[0]) if int(y[i]) != ignore_index]
    zero = f.sum() * 0
    if not rows:
        return zero, zero, zero
    nf = {i: _normalize(f[i]) for i in rows}
    sp, cp, sn, cn, sabs = zero, 0, zero, 0, zero
    for i in rows:
        for j in rows:
            g = sum(nf[i][k] * nf[j][k] for k in range(f.shape[1]))
            if i != j and int(y[i]) == int(y[j]):
                sp, cp = sp + g, cp + 1
            if int(y[i]) != int(y[j]):
                sn, cn, sabs = sn + g, cn + 1, sabs + torch.abs(g)
    if variant == "paper":
        s = sp / cp if cp else zero
        d = sn / cn if cn else zero
        mabs = sabs / cn if cn else zero
    else:
        s, d, mabs = sp / (cp + 1e-6), sn / (cn + 1e-6), sabs / (cn + 1e-6)
    form = neg_term or ("abs_of_mean" if variant == "paper" else "mean_abs")
    neg = {"abs_of_mean": torch.abs(d), "mean_abs": mabs, "mean": d}[form]
    return (1 - s) + gamma * neg, s, d


# --------------------------------------------------------------------------------------
# value and gradient against the oracle
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant,neg_term", list(itertools.product(
    ["paper", "reference"], [None, "abs_of_mean", "mean_abs", "mean"])))
@pytest.mark.parametrize("gamma", [0.5, 2.0])
def test_value_and_gradient_match_loop_oracle(variant, neg_term, gamma):
    # signed features (transformer tokens), an ignored row, three classes with repeats
    f = randn(7, 3, seed=1).requires_grad_(True)
    y = torch.tensor([2, 0, IGN, 2, 1, 0, 2])
    out, s, d = losses.opl_loss(f, y, gamma=gamma, variant=variant, neg_term=neg_term, return_stats=True)
    ref, rs, rd = opl_oracle(f, y, gamma=gamma, variant=variant, neg_term=neg_term)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(s, rs, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(d, rd, rtol=1e-10, atol=1e-12)
    (g,) = torch.autograd.grad(out, f)
    (gr,) = torch.autograd.grad(ref, f)
    torch.testing.assert_close(g, gr, rtol=1e-9, atol=1e-12)
    assert torch.all(g[2] == 0)  # the ignored row gets nothing


def test_neg_term_forms_differ_on_signed_features():
    f = randn(6, 4, seed=3)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    vals = {t: float(losses.opl_loss(f, y, neg_term=t)) for t in ("abs_of_mean", "mean_abs", "mean")}
    refs = {t: float(opl_oracle(f, y, neg_term=t)[0]) for t in vals}
    for t in vals:
        assert vals[t] == pytest.approx(refs[t], rel=1e-12)
    assert len({round(v, 9) for v in vals.values()}) == 3


def test_float32_matches_float64_oracle():
    f = randn(5, 3, seed=4)
    y = torch.tensor([0, 1, 0, 1, 1])
    out = losses.opl_loss(f.float(), y)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), opl_oracle(f, y)[0], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------
# gradcheck (fp64, small odd shapes, away from |d| = 0)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant,neg_term", [("paper", None), ("reference", None), ("paper", "mean"),
                                              ("reference", "abs_of_mean")])
@pytest.mark.parametrize("n,y", [(3, [0, 0, 1]), (5, [0, 1, 2, 0, 1]), (1, [0])])
def test_gradcheck(variant, neg_term, n, y):
    f = randn(n, 3, seed=10 + n).requires_grad_(True)
    y = torch.tensor(y)
    fn = lambda x: losses.opl_loss(x, y, variant=variant, neg_term=neg_term)  # noqa: E731
    assert_gradcheck(fn, f)


# --------------------------------------------------------------------------------------
# test facts (docs/losses/opl.md)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["paper", "reference"])
def test_stats_lie_in_unit_interval(variant):
    for seed in range(20):
        f = randn(9, 4, seed=seed)
        if seed % 2:
            f = f.abs()  # post-ReLU: cosines >= 0
        if seed % 5 == 0:
            f[:] = f[0]  # all identical: s = 1 (paper) exactly, d = 1
        y = torch.randint(0, 3, (9,), generator=torch.Generator().manual_seed(seed))
        _, s, d = losses.opl_loss(f, y, variant=variant, return_stats=True)
        assert -1 - 1e-12 <= s.item() <= 1 + 1e-12 and -1 - 1e-12 <= d.item() <= 1 + 1e-12


@pytest.mark.parametrize("variant,neg_term", [("paper", None), ("reference", None), ("paper", "mean")])
def test_invariant_to_positive_per_sample_rescaling(variant, neg_term):
    f = randn(8, 5, seed=7).requires_grad_(True)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, IGN])
    c = torch.rand(8, 1, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 10 + 0.01
    a = losses.opl_loss(f, y, variant=variant, neg_term=neg_term, return_stats=True)
    b = losses.opl_loss(f * c, y, variant=variant, neg_term=neg_term, return_stats=True)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)
    flip = torch.ones(8, 1, dtype=torch.float64)
    flip[0] = -1.0  # a negative factor on one sample does change the loss
    other = losses.opl_loss(f * flip, y, variant=variant, neg_term=neg_term)
    assert abs(a[0].item() - other.item()) > 1e-6


@pytest.mark.parametrize("variant", ["paper", "reference"])
def test_three_forms_agree_on_non_negative_features(variant):
    # post-ReLU features; values agree everywhere, gradients away from G_ij = 0 (where |.|
    # has subgradient 0), so the features are made strictly positive for the gradient part
    f0 = torch.relu(randn(9, 6, seed=11))
    y0 = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])
    vals = [losses.opl_loss(f0, y0, variant=variant, neg_term=t) for t in ("abs_of_mean", "mean_abs", "mean")]
    for v in vals[1:]:
        torch.testing.assert_close(v, vals[0], rtol=1e-12, atol=1e-12)
    f = (randn(9, 6, seed=11).abs() + 0.05).requires_grad_(True)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])
    outs = [losses.opl_loss(f, y, variant=variant, neg_term=t) for t in ("abs_of_mean", "mean_abs", "mean")]
    grads = [torch.autograd.grad(o, f)[0] for o in outs]
    for o, g in zip(outs[1:], grads[1:]):
        torch.testing.assert_close(o, outs[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g, grads[0], rtol=1e-10, atol=1e-12)


def test_paper_default_gamma_and_paper_equation():
    f = randn(6, 3, seed=12)
    y = torch.tensor([0, 1, 0, 1, 2, 2])
    _, s, d = opl_oracle(f, y)
    assert float(losses.opl_loss(f, y)) == pytest.approx(float(1 - s + 0.5 * abs(d)), rel=1e-12)
    assert float(losses.opl_loss(f, y, gamma=1.0)) == pytest.approx(float(1 - s + abs(d)), rel=1e-12)


# --------------------------------------------------------------------------------------
# edge cases (docs/losses/opl.md)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["paper", "reference"])
def test_empty_and_all_ignored_batches_are_attached_zero(variant):
    for f, y in [(torch.zeros(0, 4, dtype=torch.float64), torch.zeros(0, dtype=torch.long)),
                 (randn(5, 4, seed=0), torch.full((5,), IGN)),
                 (randn(3, 4, seed=0), torch.full((3,), -1))]:  # custom ignore_index
        x = f.clone().requires_grad_(True)
        out = losses.opl_loss(x, y, variant=variant, ignore_index=int(y[0]) if y.numel() else IGN)
        assert out.item() == 0.0 and out.grad_fn is not None and out.dtype == torch.float64
        (g,) = torch.autograd.grad(out, x)
        assert g is not None and torch.all(g == 0)


@pytest.mark.parametrize("variant", ["paper", "reference"])
def test_all_labels_distinct(variant):
    f = randn(5, 3, seed=5).requires_grad_(True)
    y = torch.tensor([4, 0, 3, 1, 2])
    out, s, d = losses.opl_loss(f, y, variant=variant, neg_term="abs_of_mean", return_stats=True)
    assert s.item() == 0.0
    _, _, rd = opl_oracle(f, y, variant=variant)
    torch.testing.assert_close(out, 1 + 0.5 * rd.abs(), rtol=1e-12, atol=1e-12)


def test_one_sample_gives_one_with_zero_gradient():
    for y in (torch.tensor([3]), torch.tensor([IGN, 3, IGN])):
        f = randn(y.numel(), 4, seed=2).requires_grad_(True)
        for variant in ("paper", "reference"):
            out = losses.opl_loss(f, y, variant=variant)
            assert out.item() == 1.0
            (g,) = torch.autograd.grad(out, f)
            assert torch.all(g == 0)


@pytest.mark.parametrize("variant", ["paper", "reference"])
def test_one_class_has_d_zero(variant):
    f = randn(5, 3, seed=6).requires_grad_(True)
    y = torch.full((5,), 2)
    out, s, d = losses.opl_loss(f, y, variant=variant, return_stats=True)
    assert d.item() == 0.0
    rs = opl_oracle(f, y, variant=variant)[1]
    torch.testing.assert_close(out, 1 - rs, rtol=1e-12, atol=1e-12)


def test_zero_features_have_cosine_zero_and_finite_gradient():
    f = randn(5, 3, seed=8)
    f[1] = 0.0
    f[3] = 0.0
    f.requires_grad_(True)
    y = torch.tensor([0, 0, 1, 1, 0])
    out, s, d = losses.opl_loss(f, y, return_stats=True)
    ref, rs, rd = opl_oracle(f, y)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    (g,) = torch.autograd.grad(out, f)
    assert torch.isfinite(g).all()
    z = torch.zeros(4, 3, dtype=torch.float64, requires_grad=True)
    out = losses.opl_loss(z, torch.tensor([0, 0, 1, 1]), return_stats=True)
    assert [v.item() for v in out] == [1.0, 0.0, 0.0]
    (g,) = torch.autograd.grad(out[0], z)
    assert torch.isfinite(g).all()


def test_abs_has_subgradient_zero_at_zero():
    # two orthogonal classes: every cross-class cosine is exactly 0, so d == 0
    f = torch.tensor([[1.0, 0.0, 0.3], [2.0, 0.0, -0.1], [0.0, 1.0, 0.0], [0.0, 3.0, 0.0]],
                     dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 0, 1, 1])
    out, s, d = losses.opl_loss(f, y, gamma=0.5, return_stats=True)
    assert d.item() == 0.0
    (g,) = torch.autograd.grad(out, f)
    (g0,) = torch.autograd.grad(losses.opl_loss(f, y, gamma=0.0), f)
    torch.testing.assert_close(g, g0, rtol=0, atol=0)
    (gd,) = torch.autograd.grad(losses.opl_loss(f, y, gamma=1.0, return_stats=True)[2], f)
    assert gd.abs().sum() > 0  # d itself does move: the zero comes from |.|


def test_integer_ids_of_any_dtype_and_negative_ids():
    f = randn(6, 3, seed=9)
    y = torch.tensor([5, -3, 5, -3, 0, 0])
    ref = opl_oracle(f, y)[0]
    for dt in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        yy = y.to(dt) if dt != torch.uint8 else (y + 3).to(dt)
        torch.testing.assert_close(losses.opl_loss(f, yy), ref, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------------------


# fp16 / bf16 embeddings (an fp32 loss equal to the upcast one, gradients in the input dtype): the
# contract's "dtypes" property (tests/test_contract.py); autocast is checked here to 1e-6, tighter
# than the contract's 1e-5.


def test_autocast_does_not_lower_precision():
    f = randn(6, 5, seed=14).float()
    y = torch.tensor([0, 1, 0, 1, 2, 2])
    ref = losses.opl_loss(f, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = losses.opl_loss(f, y)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------
# errors and validation
# --------------------------------------------------------------------------------------


def test_errors():
    f = randn(4, 3, seed=0)
    y = torch.tensor([0, 1, 0, 1])
    for bad in ("none", "sum"):
        msg = (f"opl_loss: batch-level loss; only reduction='mean' is supported (got '{bad}'); "
               "compute per-sample terms yourself if needed")
        with pytest.raises(ValueError) as e:
            losses.opl_loss(f, y, reduction=bad)
        assert str(e.value) == msg
        with pytest.raises(ValueError, match="batch-level loss"):
            losses.OrthogonalProjectionLoss(reduction=bad)
    with pytest.raises(ValueError, match=r"^opl_loss: reduction must be one of 'mean' \(got 'avg'\)"):
        losses.opl_loss(f, y, reduction="avg")
    with pytest.raises(ValueError, match=r"^opl_loss: variant must be one of"):
        losses.opl_loss(f, y, variant="official")
    with pytest.raises(ValueError, match=r"^opl_loss: neg_term must be one of"):
        losses.opl_loss(f, y, neg_term="abs")
    with pytest.raises(ValueError, match=r"^opl_loss: gamma must be finite"):
        losses.opl_loss(f, y, gamma=-1.0)
    with pytest.raises(ValueError, match=r"^opl_loss: embeddings must have shape \(N, D\) \(got shape \(4,\)\)"):
        losses.opl_loss(f[:, 0], y)
    with pytest.raises(ValueError, match=r"^opl_loss: target must have shape \(4,\)"):
        losses.opl_loss(f, y[:3])
    with pytest.raises(TypeError, match=r"^opl_loss: target must hold integer class ids \(got torch.float32\)"):
        losses.opl_loss(f, y.float())
    with pytest.raises(TypeError, match=r"^opl_loss: embeddings must be a floating-point tensor"):
        losses.opl_loss(f.long(), y)
    with pytest.raises(ValueError, match=r"^OrthogonalProjectionLoss: variant must be one of"):
        losses.OrthogonalProjectionLoss(variant="x")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_embeddings_are_a_data_check(bad):
    f = randn(4, 3, seed=0)
    f[2, 1] = bad
    y = torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match=r"^opl_loss: embeddings contains NaN or infinite values"):
        losses.opl_loss(f, y)
    with losses.validation(False):
        out = losses.opl_loss(f, y)  # no check: garbage in, garbage out, but no exception
    assert not torch.isfinite(out)


def test_validation_off_keeps_shape_and_hyperparameter_checks():
    f = randn(4, 3, seed=0)
    y = torch.tensor([0, 1, 0, 1])
    with losses.validation(False):
        with pytest.raises(ValueError, match="batch-level loss"):
            losses.opl_loss(f, y, reduction="sum")
        with pytest.raises(ValueError, match=r"^opl_loss: target must have shape"):
            losses.opl_loss(f, y[:2])
        with pytest.raises(ValueError, match=r"^opl_loss: gamma must be finite"):
            losses.opl_loss(f, y, gamma=math.nan)


# --------------------------------------------------------------------------------------
# module
# --------------------------------------------------------------------------------------


def test_module_equals_function_and_has_no_head():
    f = randn(7, 3, seed=15)
    y = torch.tensor([0, 1, 0, IGN, 2, 2, 1])
    for kw in ({}, {"gamma": 2.0, "variant": "reference"}, {"neg_term": "mean", "ignore_index": 2}):
        m = losses.OrthogonalProjectionLoss(**kw)
        torch.testing.assert_close(m(f, y), losses.opl_loss(f, y, **kw), rtol=0, atol=0)
    m = losses.OrthogonalProjectionLoss(return_stats=True, gather_distributed=True)  # no group: identity
    got = m(f, y)
    exp = losses.opl_loss(f, y, return_stats=True)
    assert len(got) == 3
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not hasattr(m, "logits") and list(m.parameters()) == []
    r = repr(m)
    assert "gamma=0.5" in r and "variant='paper'" in r and "gather_distributed=True" in r
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        for a, b in zip(other(f, y), got):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert losses.create_loss("opl", gamma=1.0).gamma == 1.0
    spec = losses.get_loss_spec("opl")
    assert spec.auxiliary and not spec.owns_head and spec.unit == "batch" and spec.unit_weights is None


def test_doctests_run():
    import doctest

    from losses.embedding import opl

    res = doctest.testmod(opl, optionflags=doctest.ELLIPSIS)
    assert res.attempted > 0 and res.failed == 0
