"""Balanced softmax: loop oracle from the formula (class weights, soft targets, every reduction and
layout), gradcheck, zero-count classes (removed from the softmax, gradient exactly 0), the
relation to logit adjustment, the unadjusted prediction, errors and the validation switch."""

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
    "balanced_softmax": entry("balanced_softmax_loss", "BalancedSoftmaxLoss", LOGITS, unit="position",
                              example={"class_counts": [40, 25, 15, 12, 8]}),
}


def _counts(c, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 500, (c,), generator=g)


def bs_loop(x, t, counts, *, weight=None, ignore_index=-100, reduction="mean"):
    """-log(n_y exp(h_y) / sum_k n_k exp(h_k)), position by position; a class with n_k = 0 adds
    nothing to the sum."""
    vals, ws, mean_ws = [], [], []
    for pos in positions(x):
        y = int(t[pos])
        if y == ignore_index:
            vals.append(torch.zeros((), dtype=torch.float64))
            ws.append(0.0)
            mean_ws.append(0.0)
            continue
        h = logits_at(x, pos)
        m = max(float(v.detach()) for v in h)
        z = sum((float(counts[k]) * torch.exp(v - m) for k, v in enumerate(h) if float(counts[k]) > 0),
                torch.zeros((), dtype=torch.float64))
        w = 1.0 if weight is None else float(weight[y])
        vals.append(-w * (math.log(float(counts[y])) + h[y] - m - torch.log(z)))
        ws.append(1.0)
        mean_ws.append(w)
    return loop_reduce(vals, ws, position_shape(x), reduction, mean_weights=mean_ws)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", LOGIT_SHAPES)
def test_matches_loop_oracle_fp64(shape, reduction):
    x, t = logits_and_ids(shape, seed=1, scale=1.5, ignore_at=2)
    counts = _counts(shape[1])
    out, g = value_and_grad(losses.balanced_softmax_loss, x, t, counts, reduction=reduction)
    ref, g_ref = value_and_grad(bs_loop, x, t, counts, reduction=reduction)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_class_weights_match_loop_oracle(reduction):
    x, t = logits_and_ids((5, 7, 3), seed=2, ignore_at=4)
    counts, w = _counts(7, 1), torch.linspace(0.3, 2.0, 7, dtype=torch.float64)
    out, g = value_and_grad(losses.balanced_softmax_loss, x, t, counts, weight=w, reduction=reduction)
    ref, g_ref = value_and_grad(bs_loop, x, t, counts, weight=w, reduction=reduction)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_zero_count_classes_leave_the_softmax(reduction):
    """log 0 = -inf: the value is the loss without those classes, their gradient exactly 0."""
    x, t = logits_and_ids((6, 5, 2), seed=3, ignore_at=3)
    counts = torch.tensor([30, 0, 12, 0, 5])
    t = torch.where(t == 1, 0, torch.where(t == 3, 2, t))  # no target on a zero-count class
    out, g = value_and_grad(losses.balanced_softmax_loss, x, t, counts, reduction=reduction)
    ref, g_ref = value_and_grad(bs_loop, x, t, counts, reduction=reduction)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)
    assert torch.all(g[:, [1, 3]] == 0)
    keep = torch.tensor([0, 2, 4])
    remap = torch.tensor([0, -1, 1, -1, 2])
    t_kept = torch.where(t == -100, t, remap[t.clamp_min(0)])
    torch.testing.assert_close(out, losses.balanced_softmax_loss(x[:, keep], t_kept, counts[keep],
                                                                 reduction=reduction), rtol=1e-12, atol=1e-12)


def test_target_on_a_zero_count_class_is_a_value_error_and_a_data_check():
    x = torch.randn(3, 4)
    counts = torch.tensor([10, 0, 3, 2])
    with pytest.raises(ValueError, match=r"^balanced_softmax_loss: target falls on a class with class_counts 0 "
                                         r"\(got zero-count classes \[1\]\)"):
        losses.balanced_softmax_loss(x, torch.tensor([0, 1, 3]), counts)
    losses.balanced_softmax_loss(x, torch.tensor([0, -100, 3]), counts)  # ignored: fine
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0]] * 3)
    with pytest.raises(ValueError, match=r"^balanced_softmax_loss: target falls on a class with class_counts 0"):
        losses.balanced_softmax_loss(x, q, counts)
    with losses.validation(False):
        out = losses.balanced_softmax_loss(x, torch.tensor([0, 1, 3]), counts, reduction="none")
    assert out[1].item() == math.inf  # the class is absent: -log 0, as a target on a -inf logit


def test_soft_targets_and_the_logit_adjusted_relation():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4, 5, generator=g, dtype=torch.float64)
    q = torch.softmax(torch.randn(4, 5, generator=g, dtype=torch.float64), 1)
    counts = _counts(5, 2)
    expected = -(q * torch.log_softmax(x + counts.double().log(), 1)).sum(1)
    torch.testing.assert_close(losses.balanced_softmax_loss(x, q, counts, reduction="none"), expected,
                               rtol=1e-12, atol=1e-12)
    t = torch.tensor([0, 4, 2, 1])
    torch.testing.assert_close(losses.balanced_softmax_loss(x, t, counts),
                               losses.logit_adjusted_loss(x, t, counts, tau=1.0), rtol=1e-12, atol=1e-12)


def test_equal_counts_are_cross_entropy():
    x, t = logits_and_ids((6, 4), seed=6, ignore_at=1)
    torch.testing.assert_close(losses.balanced_softmax_loss(x, t, [7, 7, 7, 7]), F.cross_entropy(x, t),
                               rtol=1e-12, atol=1e-12)


def test_gradcheck():
    x, t = logits_and_ids((3, 5, 2), seed=7, scale=0.8, ignore_at=1)
    t = torch.where(t == 2, 0, t)
    counts, w = torch.tensor([9, 4, 0, 1, 30]), torch.tensor([0.3, 1.0, 0.7, 1.2, 0.5], dtype=torch.float64)
    assert_gradcheck(lambda z: losses.balanced_softmax_loss(z, t, counts, weight=w, reduction="sum"),
                     x.clone().requires_grad_(True))


def test_module_predicts_with_the_unadjusted_logits_and_keeps_its_counts():
    m = losses.BalancedSoftmaxLoss(class_counts=torch.tensor([700, 200, 100]))
    assert m.class_counts.dtype == torch.float64
    x = torch.randn(4, 3)
    torch.testing.assert_close(m.predict_proba(x), torch.softmax(x, 1))
    fresh = losses.BalancedSoftmaxLoss(class_counts=[1, 1, 1])
    fresh.load_state_dict(m.state_dict())
    t = torch.tensor([0, 2, 1, 1])
    torch.testing.assert_close(fresh(x, t), m(x, t))
    assert repr(m) == "BalancedSoftmaxLoss(ignore_index=-100, reduction='mean')"


def test_empty_batch_and_all_ignored_give_an_attached_zero():
    for x, t in ((torch.zeros(0, 3, requires_grad=True), torch.zeros(0, dtype=torch.long)),
                 (torch.randn(3, 3, requires_grad=True), torch.full((3,), -100))):
        out = losses.balanced_softmax_loss(x, t, [5, 3, 1])
        assert out.item() == 0.0 and out.grad_fn is not None
        (g,) = torch.autograd.grad(out, x)
        assert torch.all(g == 0)


@pytest.mark.parametrize("counts,err,match", [
    ([5, -1, 3, 2], ValueError, r"^balanced_softmax_loss: class_counts must be non-negative and finite \(got class 1"),
    ([5.0, math.nan, 3.0, 2.0], ValueError, r"^balanced_softmax_loss: class_counts must be non-negative"),
    ([5.0, math.inf, 3.0, 2.0], ValueError, r"^balanced_softmax_loss: class_counts must be non-negative"),
    ([0, 0, 0, 0], ValueError, r"^balanced_softmax_loss: class_counts is zero for every class"),
    ([5, 3, 2], ValueError, r"^balanced_softmax_loss: class_counts must have shape \(4,\)"),
    ({"a": 1}, TypeError, r"^balanced_softmax_loss: class_counts must be a tensor or a list of numbers"),
    (torch.ones(4, dtype=torch.bool), TypeError, r"^balanced_softmax_loss: class_counts must be real-valued"),
])
def test_bad_counts(counts, err, match):
    x, t = torch.randn(3, 4), torch.tensor([0, 2, 3])
    with pytest.raises(err, match=match):
        losses.balanced_softmax_loss(x, t, counts)


@pytest.mark.parametrize("call,err,match", [
    (lambda x, t, n: losses.balanced_softmax_loss(x[0], t, n), ValueError, r"^balanced_softmax_loss: input must"),
    (lambda x, t, n: losses.balanced_softmax_loss(x, torch.tensor([0, 1, 4]), n), ValueError,
     r"^balanced_softmax_loss:"),
    (lambda x, t, n: losses.balanced_softmax_loss(x[:, :1], torch.zeros(3, dtype=torch.long), n[:1]), ValueError,
     r"bce_with_logits"),
    (lambda x, t, n: losses.balanced_softmax_loss(x, t.float(), n), TypeError, r"^balanced_softmax_loss: target"),
    (lambda x, t, n: losses.BalancedSoftmaxLoss(class_counts=torch.ones(2, 2)), ValueError,
     r"^BalancedSoftmaxLoss: class_counts must be 1-D"),
])
def test_documented_errors(call, err, match):
    x, t, n = torch.randn(3, 4), torch.tensor([0, 1, 3]), torch.tensor([40, 30, 20, 10])
    with pytest.raises(err, match=match):
        call(x, t, n)
