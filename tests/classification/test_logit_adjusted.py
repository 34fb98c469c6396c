"""Logit-adjusted loss: loop oracle from the formula (tau, class weights, soft targets, every
reduction and layout), gradcheck, scale invariance of the prior, the unadjusted prediction, errors
and the validation switch."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import losses
from tests._helpers import LOGIT_SHAPES, REDUCTIONS, assert_gradcheck, logits_and_ids, logits_at, loop_reduce
from tests._helpers import position_shape, positions, value_and_grad
from tests._helpers.rows import LOGITS, entry

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "logit_adjusted": entry("logit_adjusted_loss", "LogitAdjustedLoss", LOGITS, unit="position",
                            example={"class_prior": [0.4, 0.25, 0.15, 0.12, 0.08]}),
}

TAUS = [0.0, 0.5, 1.0, 2.0]


def _prior(c, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(c, generator=g, dtype=torch.float64) ** 3 + 1e-3  # long-tailed
    return p / p.sum()


def la_loop(x, t, prior, *, tau=1.0, weight=None, ignore_index=-100, reduction="mean"):
    """-log(exp(h_y + tau log pi_y) / sum_k exp(h_k + tau log pi_k)), position by position."""
    vals, ws, mean_ws = [], [], []
    for pos in positions(x):
        y = int(t[pos])
        if y == ignore_index:
            vals.append(torch.zeros((), dtype=torch.float64))
            ws.append(0.0)
            mean_ws.append(0.0)
            continue
        h = [v + tau * math.log(float(prior[k])) for k, v in enumerate(logits_at(x, pos))]
        m = max(float(v.detach()) for v in h)
        z = sum((torch.exp(v - m) for v in h), torch.zeros((), dtype=torch.float64))
        w = 1.0 if weight is None else float(weight[y])
        vals.append(-w * (h[y] - m - torch.log(z)))
        ws.append(1.0)
        mean_ws.append(w)
    return loop_reduce(vals, ws, position_shape(x), reduction, mean_weights=mean_ws)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", LOGIT_SHAPES)
@pytest.mark.parametrize("tau", TAUS)
def test_matches_loop_oracle_fp64(shape, reduction, tau):
    x, t = logits_and_ids(shape, seed=1, scale=1.5, ignore_at=2)
    prior = _prior(shape[1])
    out, g = value_and_grad(losses.logit_adjusted_loss, x, t, prior, tau=tau, reduction=reduction)
    ref, g_ref = value_and_grad(la_loop, x, t, prior, tau=tau, reduction=reduction)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_class_weights_match_loop_oracle(reduction):
    x, t = logits_and_ids((5, 7, 3), seed=2, ignore_at=4)
    prior, w = _prior(7, 1), torch.linspace(0.3, 2.0, 7, dtype=torch.float64)
    out, g = value_and_grad(losses.logit_adjusted_loss, x, t, prior, tau=1.5, weight=w, reduction=reduction)
    ref, g_ref = value_and_grad(la_loop, x, t, prior, tau=1.5, weight=w, reduction=reduction)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


def test_soft_targets_are_cross_entropy_of_the_adjusted_logits():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 5, 2, generator=g, dtype=torch.float64)
    q = torch.softmax(torch.randn(4, 5, 2, generator=g, dtype=torch.float64), 1)
    prior = _prior(5, 2)
    adjusted = x + 0.7 * prior.log().view(1, -1, 1)
    expected = -(q * torch.log_softmax(adjusted, 1)).sum(1)
    torch.testing.assert_close(losses.logit_adjusted_loss(x, q, prior, tau=0.7, reduction="none"), expected,
                               rtol=1e-12, atol=1e-12)


def test_prior_scale_and_list_form_do_not_change_the_loss():
    x, t = logits_and_ids((6, 4), seed=5)
    prior = _prior(4, 3)
    ref = losses.logit_adjusted_loss(x, t, prior)
    torch.testing.assert_close(losses.logit_adjusted_loss(x, t, prior * 250.0), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(losses.logit_adjusted_loss(x, t, prior.tolist()), ref, rtol=1e-12, atol=1e-12)
    counts = torch.tensor([50, 20, 5, 1])
    torch.testing.assert_close(losses.logit_adjusted_loss(x, t, counts), losses.logit_adjusted_loss(
        x, t, counts.double() / counts.sum()), rtol=1e-12, atol=1e-12)


def test_tau_zero_and_uniform_prior_are_cross_entropy():
    x, t = logits_and_ids((6, 4), seed=6, ignore_at=1)
    ce = F.cross_entropy(x, t)
    torch.testing.assert_close(losses.logit_adjusted_loss(x, t, _prior(4), tau=0.0), ce, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(losses.logit_adjusted_loss(x, t, torch.full((4,), 0.25, dtype=torch.float64)), ce,
                               rtol=1e-12, atol=1e-12)


def test_gradcheck():
    x, t = logits_and_ids((3, 5, 2), seed=7, scale=0.8, ignore_at=1)
    prior, w = _prior(5, 4), torch.tensor([0.3, 1.0, 0.7, 1.2, 0.5], dtype=torch.float64)
    assert_gradcheck(lambda z: losses.logit_adjusted_loss(z, t, prior, tau=1.3, weight=w, reduction="sum"),
                     x.clone().requires_grad_(True))


def test_module_predicts_with_the_unadjusted_logits_and_keeps_its_prior():
    prior = [0.7, 0.2, 0.1]
    m = losses.LogitAdjustedLoss(class_prior=prior, tau=1.0)
    x = torch.randn(4, 3, 2)
    torch.testing.assert_close(m.predict_proba(x), torch.softmax(x, 1))
    assert m.predict_proba(x.half()).dtype == torch.float32
    assert torch.equal(m.state_dict()["class_prior"], torch.tensor(prior, dtype=torch.float64))
    fresh = losses.LogitAdjustedLoss(class_prior=[1.0, 1.0, 1.0])
    fresh.load_state_dict(m.state_dict())
    t = torch.tensor([[0, 1], [2, 0], [1, 1], [0, 2]])
    torch.testing.assert_close(fresh(x, t), m(x, t))


def test_empty_batch_and_all_ignored_give_an_attached_zero():
    prior = [0.5, 0.3, 0.2]
    for x, t in ((torch.zeros(0, 3, requires_grad=True), torch.zeros(0, dtype=torch.long)),
                 (torch.randn(3, 3, requires_grad=True), torch.full((3,), -100))):
        out = losses.logit_adjusted_loss(x, t, prior)
        assert out.item() == 0.0 and out.grad_fn is not None
        (g,) = torch.autograd.grad(out, x)
        assert torch.all(g == 0)


@pytest.mark.parametrize("prior,err,match", [
    ([0.5, 0.5, 0.0, 0.1], ValueError, r"^logit_adjusted_loss: class_prior must be positive and finite \(got class 2"),
    ([0.5, -0.1, 0.3, 0.3], ValueError, r"^logit_adjusted_loss: class_prior must be positive"),
    ([0.5, math.nan, 0.3, 0.2], ValueError, r"^logit_adjusted_loss: class_prior must be positive"),
    ([0.5, math.inf, 0.3, 0.2], ValueError, r"^logit_adjusted_loss: class_prior must be positive"),
    ([0.5, 0.5, 0.1], ValueError, r"^logit_adjusted_loss: class_prior must have shape \(4,\)"),
    ("uniform", TypeError, r"^logit_adjusted_loss: class_prior must be a tensor or a list of numbers"),
    ([0.5, True, 0.3, 0.2], TypeError, r"^logit_adjusted_loss: class_prior must be a tensor or a list"),
])
def test_bad_prior(prior, err, match):
    x, t = torch.randn(3, 4), torch.tensor([0, 1, 3])
    with pytest.raises(err, match=match):
        losses.logit_adjusted_loss(x, t, prior)


def test_prior_values_are_a_data_check_its_length_is_not():
    x, t = torch.randn(3, 4), torch.tensor([0, 1, 3])
    with losses.validation(False):
        losses.logit_adjusted_loss(x, t, torch.tensor([0.5, 0.5, 0.1, 0.1]))
        with pytest.raises(ValueError, match=r"class_prior must have shape \(4,\)"):
            losses.logit_adjusted_loss(x, t, torch.ones(3))


@pytest.mark.parametrize("call,err,match", [
    (lambda x, t, p: losses.logit_adjusted_loss(x[0], t, p), ValueError, r"^logit_adjusted_loss: input must have"),
    (lambda x, t, p: losses.logit_adjusted_loss(x, torch.tensor([0, 1, 4]), p), ValueError, r"^logit_adjusted_loss:"),
    (lambda x, t, p: losses.logit_adjusted_loss(x[:, :1], torch.zeros(3, dtype=torch.long), p[:1]), ValueError,
     r"bce_with_logits"),
    (lambda x, t, p: losses.logit_adjusted_loss(x, t, p, tau=-1.0), ValueError, r"^logit_adjusted_loss: tau"),
    (lambda x, t, p: losses.logit_adjusted_loss(x, t.float(), p), TypeError, r"^logit_adjusted_loss: target"),
    (lambda x, t, p: losses.LogitAdjustedLoss(class_prior=torch.ones(2, 2)), ValueError,
     r"^LogitAdjustedLoss: class_prior must be 1-D"),
    (lambda x, t, p: losses.LogitAdjustedLoss(class_prior=p, tau=math.inf), ValueError, r"^LogitAdjustedLoss: tau"),
])
def test_documented_errors(call, err, match):
    x, t, p = torch.randn(3, 4), torch.tensor([0, 1, 3]), torch.tensor([0.4, 0.3, 0.2, 0.1])
    with pytest.raises(err, match=match):
        call(x, t, p)


def test_nan_logits_are_a_data_check():
    x, t = torch.randn(3, 4), torch.tensor([0, 1, 3])
    x[0, 1] = math.nan
    with pytest.raises(ValueError, match=r"^logit_adjusted_loss: input"):
        losses.logit_adjusted_loss(x, t, [0.4, 0.3, 0.2, 0.1])
    with losses.validation(False):
        losses.logit_adjusted_loss(x, t, [0.4, 0.3, 0.2, 0.1])
