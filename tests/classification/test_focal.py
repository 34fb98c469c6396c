"""Focal loss: the loss's own tests. This file is the template for a new loss's test file.

What a new loss's test file needs (what nothing shared can know):

* an independent float64 reference written from the paper's formula (here a loop over positions),
  compared with the loss's value and gradient for every hyperparameter regime, layout and reduction;
* the paper's own properties (here: gamma = 0 is cross-entropy, exactness at p_y = 1);
* the loss's own documented behaviour and bad inputs (its hyperparameters' ranges, its extra
  tensors such as ``alpha``, what a ``-inf`` target gives) and its ``EXPECTED_ENTRIES``.

What it gets for free from its ``register(...)`` entry (do not repeat it here): the properties of
``losses.testing.check_loss`` (reductions consistent with the unit weights, the all-ignored batch as
an exact attached 0, finite values and gradients at random / extreme / constant inputs, fp16 / bf16
/ float64, autocast, module == function, repr / deepcopy / pickle / state_dict, double backward,
torch.compile, float64 gradcheck of every reduction), run for every entry by ``tests/test_contract.py``;
``tests/test_contract_reliability.py`` (CPU bf16 autocast, NaN / +inf as data checks and the
validation switch, ``-inf`` masks, a target on a masked class, one class as a ``ValueError`` naming
the binary loss, float labels for ids as a ``TypeError``, non-integer ``ignore_index``);
``tests/test_properties.py`` (random shapes from N = 0, dtypes, masks, ignored positions, module ==
function, reductions); ``tests/test_module_repr.py`` (the repr) and ``tests/test_doctests.py``.
"""

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
EXPECTED_ENTRIES = {"focal": entry("focal_loss", "FocalLoss", LOGITS, unit="position")}

GAMMAS = [0.0, 0.5, 1.0, 2.0, 3.5]


def focal_loop(x, t, *, gamma=2.0, alpha=None, ignore_index=-100, reduction="mean"):
    """-alpha_y (1 - p_y)^gamma log p_y, written out position by position (float64)."""
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
        z = sum((torch.exp(v - m) for v in h), torch.zeros((), dtype=torch.float64))
        log_p = h[y] - m - torch.log(z)
        p = torch.exp(log_p)
        a = 1.0 if alpha is None else float(alpha[y])
        vals.append(-a * (1 - p) ** gamma * log_p)
        ws.append(1.0)  # "none" carries alpha_y already: "sum" adds the values
        mean_ws.append(a)  # "mean" divides by the summed alpha_y
    return loop_reduce(vals, ws, position_shape(x), reduction, mean_weights=mean_ws)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", LOGIT_SHAPES)
@pytest.mark.parametrize("gamma", GAMMAS)
def test_matches_loop_oracle_fp64(shape, reduction, gamma):
    x, t = logits_and_ids(shape, seed=1, scale=1.5, ignore_at=2)
    out, g = value_and_grad(losses.focal_loss, x, t, gamma=gamma, reduction=reduction)
    ref, g_ref = value_and_grad(focal_loop, x, t, gamma=gamma, reduction=reduction)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", LOGIT_SHAPES)
def test_alpha_matches_loop_oracle_and_module(shape, reduction):
    x, t = logits_and_ids(shape, seed=2, scale=2.0, ignore_at=0)
    alpha = torch.linspace(0.2, 1.5, shape[1], dtype=torch.float64)
    out, g = value_and_grad(losses.focal_loss, x, t, gamma=1.5, alpha=alpha, reduction=reduction)
    ref, g_ref = value_and_grad(focal_loop, x, t, gamma=1.5, alpha=alpha, reduction=reduction)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)
    module = losses.FocalLoss(gamma=1.5, alpha=alpha, reduction=reduction)
    torch.testing.assert_close(module(x, t), ref, rtol=1e-10, atol=1e-12)


def test_gamma_zero_is_cross_entropy_also_with_alpha():
    x, t = logits_and_ids((6, 4, 3), seed=3, ignore_at=5)
    w = torch.tensor([0.5, 1.0, 2.0, 0.25], dtype=torch.float64)
    for reduction in REDUCTIONS:
        torch.testing.assert_close(losses.focal_loss(x, t, gamma=0.0, alpha=w, reduction=reduction),
                                   F.cross_entropy(x, t, weight=w, reduction=reduction), rtol=1e-12, atol=1e-12)


def test_gradcheck_below_gamma_one_with_alpha():
    """gamma < 1, where the power's derivative is unbounded near p_y = 1, with alpha (the default
    gamma without alpha: check_loss's "gradients" property)."""
    x, t = logits_and_ids((3, 5, 2), seed=4, scale=0.8, ignore_at=1)
    alpha = torch.tensor([0.3, 1.0, 0.7, 1.2, 0.5], dtype=torch.float64)
    assert_gradcheck(lambda z: losses.focal_loss(z, t, gamma=0.5, alpha=alpha, reduction="sum"),
                     x.clone().requires_grad_(True))


@pytest.mark.parametrize("gamma", [0.25, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exact_at_p_one(gamma, dtype):
    """p_y = 1 to working precision: value 0 and gradient exactly 0 (the limit), never NaN, also for
    gamma < 1 where (1 - p)^(gamma - 1) is unbounded."""
    x = torch.tensor([[800.0, 0.0, -1.0], [60.0, 0.0, 0.0]], dtype=dtype, requires_grad=True)
    t = torch.tensor([0, 0])
    out = losses.focal_loss(x, t, gamma=gamma, reduction="none")
    (g,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(out).all() and torch.isfinite(g).all()
    assert float(out[0].detach()) == 0.0 and torch.all(g[0] == 0)
    assert 0.0 <= float(out[1].detach()) < 1e-20


def test_neg_inf_target_is_inf_with_the_cross_entropy_gradient():
    x = torch.tensor([[1.0, -math.inf, 0.5]], dtype=torch.float64, requires_grad=True)
    out = losses.focal_loss(x, torch.tensor([1]), gamma=2.0, reduction="none")
    (g,) = torch.autograd.grad(out.sum(), x)
    assert out.item() == math.inf
    p = torch.softmax(x.detach(), 1)[0]
    torch.testing.assert_close(g[0], p - torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))


def test_empty_batch_gives_an_attached_zero():
    # (the all-ignored batch: check_loss's "all_ignored" property)
    x = torch.zeros(0, 4, requires_grad=True)
    out = losses.focal_loss(x, torch.zeros(0, dtype=torch.long))
    assert out.item() == 0.0 and out.grad_fn is not None
    (g,) = torch.autograd.grad(out, x)
    assert g.shape == x.shape


@pytest.mark.parametrize("call,err,match", [
    (lambda x, t: losses.focal_loss(x[0], t), ValueError, r"^focal_loss: input must have shape \(N, C\)"),
    (lambda x, t: losses.focal_loss(x, t[:2]), ValueError, r"^focal_loss: "),
    (lambda x, t: losses.focal_loss(x, torch.tensor([0, 1, 4])), ValueError, r"^focal_loss: .*(range|4)"),
    (lambda x, t: losses.focal_loss(x, t, gamma=-1.0), ValueError, r"^focal_loss: gamma"),
    (lambda x, t: losses.focal_loss(x, t, gamma=math.nan), ValueError, r"^focal_loss: gamma"),
    (lambda x, t: losses.focal_loss(x, t, gamma="2"), TypeError, r"^focal_loss: gamma"),
    (lambda x, t: losses.focal_loss(x, t, alpha=torch.ones(3)), ValueError, r"^focal_loss: alpha must have shape"),
    (lambda x, t: losses.focal_loss(x, t, alpha=-torch.ones(4)), ValueError, r"^focal_loss: alpha must be non-neg"),
    # the function's own check (tests/test_contract.py passes a bad reduction to the module)
    (lambda x, t: losses.focal_loss(x, t, reduction="avg"), ValueError, r"^focal_loss: reduction"),
    (lambda x, t: losses.FocalLoss(gamma=-0.5), ValueError, r"^FocalLoss: gamma"),
])
def test_documented_errors(call, err, match):
    x, t = torch.randn(3, 4), torch.tensor([0, 1, 3])
    with pytest.raises(err, match=match):
        call(x, t)


def test_soft_targets_are_a_type_error_naming_a_loss_that_takes_them():
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match=r"^focal_loss: target must hold integer class ids.*cross_entropy_loss"):
        losses.focal_loss(x, torch.softmax(torch.randn(3, 4), 1))


def test_module_state_dict_carries_alpha():
    m = losses.FocalLoss(alpha=[0.25, 0.75, 1.0])
    assert torch.equal(m.state_dict()["alpha"], torch.tensor([0.25, 0.75, 1.0]))
