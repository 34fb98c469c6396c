"""Dice semimetric, Jaccard metric and soft Dice losses (docs/losses/dice.md)."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch

import losses
from tests._helpers.rows import LOGITS, entry
from tests.classification._hints import raise_and_follow

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "dice_semimetric": entry("dice_semimetric_loss", "DiceSemimetricLoss", LOGITS, unit="class"),
    "jaccard_metric": entry("jaccard_metric_loss", "JaccardMetricLoss", LOGITS, unit="class"),
    "soft_dice": entry("soft_dice_loss", "SoftDiceLoss", LOGITS, unit="class"),
}

FUNCS = {
    "dice": losses.dice_semimetric_loss,
    "jaccard": losses.jaccard_metric_loss,
    "soft_dice": losses.soft_dice_loss,
}
MODULES = {
    "dice": losses.DiceSemimetricLoss,
    "jaccard": losses.JaccardMetricLoss,
    "soft_dice": losses.SoftDiceLoss,
}


# --------------------------------------------------------------------------------------
# fp64 loop oracle from the tp/fp/fn formulas (scalar torch ops: autograd gives the gradient)
# --------------------------------------------------------------------------------------


def oracle(kind, input, target, *, activation="softmax", smooth=1.0, aggregate="dataset", active_classes=None,
           log_loss=False, weight=None, mask=None, ignore_index=-100, reduction="mean"):
    b_, c_ = input.shape[:2]
    z = input.reshape(b_, c_, -1)
    s_ = z.shape[2]
    hard = not target.is_floating_point()
    tgt = target.reshape(b_, -1) if hard else target.reshape(b_, c_, -1)
    msk = None if mask is None else mask.reshape(b_, -1)
    wt = [1.0] * c_ if weight is None else [float(v) for v in weight]
    s = smooth

    # probabilities and labels, one position at a time
    prob = [[[None] * s_ for _ in range(c_)] for _ in range(b_)]
    lab = [[[0.0] * s_ for _ in range(c_)] for _ in range(b_)]
    keep = [[True] * s_ for _ in range(b_)]
    for b in range(b_):
        for k in range(s_):
            col = [z[b, c, k] for c in range(c_)]
            if activation == "softmax":
                m = max(float(v.detach()) for v in col)
                e = [torch.exp(v - m) for v in col]
                tot = sum(e)
                ps = [v / tot for v in e]
            elif activation == "sigmoid":
                ps = [1 / (1 + torch.exp(-v)) for v in col]
            else:
                ps = col
            for c in range(c_):
                prob[b][c][k] = ps[c]
            if hard:
                t = int(tgt[b, k])
                if t == ignore_index:
                    keep[b][k] = False
                else:
                    lab[b][t][k] = 1.0
            else:
                for c in range(c_):
                    lab[b][c][k] = float(tgt[b, c, k])
            if msk is not None and not bool(msk[b, k]):
                keep[b][k] = False

    zero = input.sum() * 0
    # per (image, class) sums
    X = [[zero for _ in range(c_)] for _ in range(b_)]
    Y = [[0.0] * c_ for _ in range(b_)]
    DL = [[zero for _ in range(c_)] for _ in range(b_)]
    IN = [[zero for _ in range(c_)] for _ in range(b_)]
    PRES = [[False] * c_ for _ in range(b_)]
    NK = [0] * b_
    for b in range(b_):
        for k in range(s_):
            if not keep[b][k]:
                continue
            NK[b] += 1
            for c in range(c_):
                p, y = prob[b][c][k], lab[b][c][k]
                X[b][c] = X[b][c] + p
                Y[b][c] += y
                DL[b][c] = DL[b][c] + torch.abs(p - y)
                IN[b][c] = IN[b][c] + p * y
                PRES[b][c] = PRES[b][c] or y > 0.01

    def unit(x, y, dl, inner):
        if kind == "soft_dice":
            num, den = 2 * inner + 2 * s, x + y + 2 * s
        else:
            a = 0.5 if kind == "dice" else 1.0
            tp = (x + y - dl) / 2
            fp, fn = x - tp, y - tp
            num, den = tp + s, tp + a * fp + a * fn + s
        if float(den.detach()) == 0.0:
            T = zero + 1.0
        else:
            T = num / den
        return -torch.log(T) if log_loss else 1 - T

    mode = active_classes or ("present" if hard else "all")
    units, weights = [], []
    if aggregate == "dataset":
        for c in range(c_):
            x = sum(X[b][c] for b in range(b_))
            y = sum(Y[b][c] for b in range(b_))
            dl = sum(DL[b][c] for b in range(b_))
            inner = sum(IN[b][c] for b in range(b_))
            act = any(PRES[b][c] for b in range(b_)) if mode == "present" else sum(NK) > 0
            units.append(unit(x, y, dl, inner) if act else zero)
            weights.append(wt[c] if act else 0.0)
        if reduction == "none":
            return torch.stack(units)
        total = sum(w * v for w, v in zip(weights, units))
        if reduction == "sum":
            return total
        return total / sum(weights) if sum(weights) > 0 else zero

    act = [[(PRES[b][c] if mode == "present" else NK[b] > 0) for c in range(c_)] for b in range(b_)]
    L = [[unit(X[b][c], Y[b][c], DL[b][c], IN[b][c]) if act[b][c] else zero for c in range(c_)]
         for b in range(b_)]
    if reduction == "none":
        return torch.stack([torch.stack(row) for row in L])
    if aggregate == "image":
        per_image = []
        for b in range(b_):
            den = sum(wt[c] for c in range(c_) if act[b][c])
            if den > 0:
                per_image.append(sum(wt[c] * L[b][c] for c in range(c_) if act[b][c]) / den)
        if reduction == "sum":
            return sum(per_image) if per_image else zero
        return sum(per_image) / len(per_image) if per_image else zero
    # "class"
    per_class, wsum = [], 0.0
    for c in range(c_):
        n = sum(1 for b in range(b_) if act[b][c])
        if n:
            per_class.append(wt[c] * sum(L[b][c] for b in range(b_) if act[b][c]) / n)
            wsum += wt[c]
    if reduction == "sum":
        return sum(per_class) if per_class else zero
    return sum(per_class) / wsum if per_class else zero


def _data(shape, *, soft=False, seed=0, activation="softmax", ignore=True, with_mask=False):
    g = torch.Generator().manual_seed(seed)
    b, c = shape[:2]
    if activation == "none":
        x = torch.rand(shape, generator=g, dtype=torch.float64) * 0.9 + 0.05
    else:
        x = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    x.requires_grad_(True)
    if soft:
        t = torch.rand(shape, generator=g, dtype=torch.float64)
        t[:, -1] = 0.0  # an empty class
    else:
        t = torch.randint(0, c - 1, (b,) + tuple(shape[2:]), generator=g)  # class c-1 absent
        if ignore:
            t.view(-1)[2] = -100
    mask = None
    if with_mask:
        mask = torch.rand((b,) + tuple(shape[2:]), generator=g) > 0.25
    return x, t, mask


def _compare(kind, x, t, rtol=1e-10, atol=1e-12, **kw):
    got = FUNCS[kind](x, t, **kw)
    ref = oracle(kind, x, t, **kw)
    torch.testing.assert_close(got, ref.detach(), rtol=rtol, atol=atol)
    g_got = torch.autograd.grad(got.sum(), x, allow_unused=True)[0]
    g_ref = torch.autograd.grad(ref.sum(), x, allow_unused=True)[0]
    g_ref = torch.zeros_like(x) if g_ref is None else g_ref
    torch.testing.assert_close(g_got, g_ref, rtol=rtol, atol=atol)
    return got


OPTION_SETS = [
    {},
    {"active_classes": "all", "log_loss": True},
    {"smooth": 0.0, "active_classes": "present", "weight": "w"},
    {"smooth": 0.3, "log_loss": True, "weight": "w", "mask": True},
    {"activation": "sigmoid", "active_classes": "all"},
    {"activation": "none", "smooth": 0.5, "mask": True},
]


@pytest.mark.parametrize("kind", ["dice", "jaccard", "soft_dice"])
@pytest.mark.parametrize("aggregate", ["dataset", "image", "class"])
@pytest.mark.parametrize("soft", [False, True])
def test_matches_loop_oracle(kind, aggregate, soft):
    for i, opts in enumerate(OPTION_SETS):
        opts = dict(opts)
        shape = (3, 5, 3, 2) if i % 2 == 0 else (5, 7)
        x, t, mask = _data(shape, soft=soft, seed=i, activation=opts.get("activation", "softmax"),
                           with_mask=opts.pop("mask", False))
        if opts.get("weight") == "w":
            opts["weight"] = torch.linspace(0.5, 2.0, shape[1], dtype=torch.float64)
        for reduction in ("none", "mean", "sum"):
            _compare(kind, x, t, aggregate=aggregate, mask=mask, reduction=reduction, **opts)


@pytest.mark.parametrize("kind", ["dice", "jaccard", "soft_dice"])
@pytest.mark.parametrize("activation", ["softmax", "sigmoid"])
def test_ids_with_every_position_kept(kind, activation):
    """Integer ids, no ignored id and no mask: the path that never builds the one-hot labels
    (``_DiceStatsIds``) against the float64 loop oracle, every aggregation, reduction, weights and
    log loss, 2-D / 3-D / no spatial dims; and equal to the one-hot path of the same labels."""
    for i, shape in enumerate([(3, 5, 3, 2), (5, 7), (2, 4, 2, 3, 2)]):
        x, t, _ = _data(shape, seed=20 + i, activation=activation, ignore=False)
        for aggregate in ("dataset", "image", "class"):
            for opts in ({}, {"active_classes": "all", "weight": torch.linspace(0.5, 2.0, shape[1],
                                                                                dtype=torch.float64)},
                         {"log_loss": True, "smooth": 0.3, "reduction": "sum"}):
                opts.setdefault("reduction", "none" if aggregate == "image" else "mean")
                _compare(kind, x, t, activation=activation, aggregate=aggregate, **opts)
        # the same labels one-hot (soft labels of 0 and 1) through the general path: equal values and gradients
        onehot = torch.nn.functional.one_hot(t, shape[1]).movedim(-1, 1).to(x.dtype)
        for aggregate in ("dataset", "image"):
            kw = dict(activation=activation, aggregate=aggregate, active_classes="present")
            a = FUNCS[kind](x, t, **kw)
            b = FUNCS[kind](x, onehot, **kw)
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
            ga = torch.autograd.grad(a, x)[0]
            gb = torch.autograd.grad(b, x)[0]
            torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["dice", "jaccard", "soft_dice"])
def test_ids_with_every_position_kept_gradcheck(kind):
    g = torch.Generator().manual_seed(5)
    for activation, aggregate in (("softmax", "dataset"), ("sigmoid", "image"), ("softmax", "class")):
        x = torch.randn(2, 4, 3, generator=g, dtype=torch.float64).requires_grad_(True)
        t = torch.randint(0, 4, (2, 3), generator=g)
        assert torch.autograd.gradcheck(
            lambda z: FUNCS[kind](z, t, activation=activation, aggregate=aggregate, smooth=0.5,
                                  weight=torch.linspace(0.5, 1.5, 4, dtype=torch.float64)), (x,))


def test_custom_ignore_index_and_nd_input():
    x, t, _ = _data((2, 4, 2, 3, 2), seed=3, ignore=False)
    t[0, 0, 0, 0] = 255
    for kind in FUNCS:
        _compare(kind, x, t, ignore_index=255, aggregate="image")


# --------------------------------------------------------------------------------------
# gradcheck
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,c", [(1, 3), (3, 5)])
@pytest.mark.parametrize("kind", ["dice", "jaccard", "soft_dice"])
def test_gradcheck(n, c, kind):
    combos = list(zip(("dataset", "image", "class", "dataset", "image", "class"),
                      ("softmax", "sigmoid", "none", "none", "softmax", "sigmoid"),
                      (False, True, False, True, True, False)))
    for j, (aggregate, activation, soft) in enumerate(combos):
        g = torch.Generator().manual_seed(j + 10 * n + c)
        if activation == "none":
            x = torch.rand(n, c, 3, generator=g, dtype=torch.float64) * 0.8 + 0.1
        else:
            x = torch.randn(n, c, 3, generator=g, dtype=torch.float64)
        if soft:
            # labels far from the probabilities of the "none" inputs (|x - y| has a kink at 0)
            t = torch.where(torch.rand(n, c, 3, generator=g, dtype=torch.float64) > 0.5, 0.97, 0.02)
            t = t.to(torch.float64)
        else:
            t = torch.randint(0, c, (n, 3), generator=g)
        x.requires_grad_(True)
        fn = FUNCS[kind]
        mask = torch.ones(n, 3, dtype=torch.bool)
        mask[0, 1] = j % 2 == 1
        assert torch.autograd.gradcheck(
            lambda z: fn(z, t, activation=activation, aggregate=aggregate, log_loss=j % 2 == 0, smooth=0.5,
                         mask=mask, weight=torch.linspace(0.5, 1.5, c, dtype=torch.float64),
                         reduction="none" if j % 3 == 0 else "mean"), (x,), fast_mode=n > 1), \
            (kind, aggregate, activation, soft)


# --------------------------------------------------------------------------------------
# test facts (docs/losses/dice.md)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("aggregate", ["dataset", "image", "class"])
def test_hard_labels_semimetric_equals_soft_dice(aggregate):
    x, t, mask = _data((4, 6, 3, 2), seed=7, with_mask=True)
    for opts in ({}, {"activation": "sigmoid", "smooth": 0.0}, {"log_loss": True, "active_classes": "all"},
                 {"weight": torch.rand(6, dtype=torch.float64)}):
        for reduction in ("none", "mean"):
            a = losses.dice_semimetric_loss(x, t, aggregate=aggregate, mask=mask, reduction=reduction, **opts)
            b = losses.soft_dice_loss(x, t, aggregate=aggregate, mask=mask, reduction=reduction, **opts)
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
            # one-hot float labels with activation "none" on probabilities as well
    p = torch.softmax(x.detach(), 1)
    y = torch.nn.functional.one_hot(t.clamp(min=0), 6).movedim(-1, 1).double()
    a = losses.dice_semimetric_loss(p, y, activation="none", aggregate=aggregate)
    b = losses.soft_dice_loss(p, y, activation="none", aggregate=aggregate)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("aggregate", ["dataset", "image", "class"])
def test_soft_labels_identity_and_symmetry(aggregate):
    g = torch.Generator().manual_seed(8)
    x = torch.rand(3, 4, 5, generator=g, dtype=torch.float64)
    y = torch.rand(3, 4, 5, generator=g, dtype=torch.float64)
    for fn in (losses.dice_semimetric_loss, losses.jaccard_metric_loss):
        for smooth in (0.0, 1.0):
            kw = dict(activation="none", aggregate=aggregate, smooth=smooth)
            assert fn(x, x, **kw).item() == pytest.approx(0.0, abs=1e-15)
            assert fn(x, y, **kw).item() > 0
            torch.testing.assert_close(fn(x, y, reduction="none", **kw), fn(y, x, reduction="none", **kw),
                                       rtol=1e-14, atol=1e-15)
    # soft Dice is not minimised at x = y
    assert losses.soft_dice_loss(x, x, activation="none", aggregate=aggregate).item() > 0.05


def test_soft_dice_one_third_vs_one_half():
    y = torch.full((2, 1, 6), 0.5, dtype=torch.float64)
    one = torch.ones_like(y)
    sd = losses.soft_dice_loss(one, y, activation="none", smooth=0.0)
    assert sd.item() == pytest.approx(1 / 3, rel=1e-14)
    assert losses.soft_dice_loss(y, y, activation="none", smooth=0.0).item() == pytest.approx(0.5, rel=1e-14)
    # the semimetric prefers x = y
    assert losses.dice_semimetric_loss(y, y, activation="none", smooth=0.0).item() == 0.0
    assert losses.dice_semimetric_loss(one, y, activation="none", smooth=0.0).item() == pytest.approx(1 / 3)


def test_jaccard_triangle_inequality_and_dice_relation():
    g = torch.Generator().manual_seed(9)
    for _ in range(50):
        x, y, z = (torch.rand(1, 1, 7, generator=g, dtype=torch.float64) for _ in range(3))
        kw = dict(activation="none", smooth=0.0, reduction="none")
        dxz = losses.jaccard_metric_loss(x, z, **kw)
        dxy = losses.jaccard_metric_loss(x, y, **kw)
        dyz = losses.jaccard_metric_loss(y, z, **kw)
        assert float(dxz) <= float(dxy + dyz) + 1e-12
        t_jac = 1 - dxy
        t_dice = 1 - losses.dice_semimetric_loss(x, y, **kw)
        torch.testing.assert_close(t_dice, 2 * t_jac / (1 + t_jac), rtol=1e-13, atol=1e-15)
    # the Dice semimetric violates the triangle inequality (it is only a semimetric)
    a = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    b = torch.tensor([[[1.0, 1.0]]], dtype=torch.float64)
    c = torch.tensor([[[0.0, 1.0]]], dtype=torch.float64)
    kw = dict(activation="none", smooth=0.0)
    assert losses.dice_semimetric_loss(a, c, **kw) > (losses.dice_semimetric_loss(a, b, **kw)
                                                      + losses.dice_semimetric_loss(b, c, **kw))


def test_empty_class_rules():
    # class 1 has no labels; its probabilities are x
    x = torch.tensor([[[0.7, 0.6, 0.9], [0.3, 0.4, 0.1]]], dtype=torch.float64)  # (1, 2, 3), probabilities
    t = torch.tensor([[0, 0, 0]])
    s = 0.5
    sx1 = 0.8
    for kind, expected in (("dice", sx1 / (sx1 + 2 * s)), ("jaccard", sx1 / (sx1 + s))):
        fn = FUNCS[kind]
        none = fn(x, t, activation="none", smooth=s, active_classes="all", reduction="none")
        assert none[1].item() == pytest.approx(expected, rel=1e-13)
        # "present" (default for ids) skips it
        assert fn(x, t, activation="none", smooth=s, reduction="none")[1].item() == 0.0
        assert fn(x, t, activation="none", smooth=s).item() == pytest.approx(none[0].item(), rel=1e-13)
        # its gradient pushes the predictions to 0
        xr = x.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(xr, t, activation="none", smooth=s, active_classes="all",
                                      reduction="none")[1], xr)
        assert torch.all(g[0, 1] > 0)


def test_smooth_zero_empty_unit_is_zero():
    x = torch.tensor([[[0.0, 0.0], [1.0, 1.0]]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([[[0.0, 0.0], [1.0, 1.0]]], dtype=torch.float64)
    for fn in FUNCS.values():
        for log_loss in (False, True):
            none = fn(x, y, activation="none", smooth=0.0, reduction="none", log_loss=log_loss)
            assert none.tolist() == [0.0, 0.0]
            out = fn(x, y, activation="none", smooth=0.0, log_loss=log_loss)
            (g,) = torch.autograd.grad(out, x)
            assert torch.isfinite(g).all()


def test_log_loss_is_minus_log_t():
    x, t, _ = _data((3, 4, 5), seed=10)
    for fn in FUNCS.values():
        for aggregate in ("dataset", "image"):
            lin = fn(x, t, aggregate=aggregate, reduction="none")
            lg = fn(x, t, aggregate=aggregate, reduction="none", log_loss=True)
            act = lin != 0
            torch.testing.assert_close(lg[act], -torch.log(1 - lin[act]))


@pytest.mark.parametrize("aggregate", ["dataset", "image", "class"])
def test_no_active_unit_is_attached_zero(aggregate):
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    cases = [
        (torch.full((2, 4), -100), None, None),
        (torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.bool), None),
        (torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.bool), "all"),
        (torch.rand(2, 3, 4, dtype=torch.float64), torch.zeros(2, 4, dtype=torch.bool), None),
        (torch.zeros(2, 3, 4, dtype=torch.float64), None, "present"),  # soft labels, nothing present
    ]
    for fn in FUNCS.values():
        for t, mask, active in cases:
            for reduction in ("mean", "sum"):
                out = fn(x, t, mask=mask, aggregate=aggregate, active_classes=active, reduction=reduction,
                         log_loss=True, smooth=0.0)
                assert out.item() == 0.0 and out.grad_fn is not None
                (g,) = torch.autograd.grad(out, x)
                assert torch.all(g == 0)
            assert torch.all(fn(x, t, mask=mask, aggregate=aggregate, active_classes=active, reduction="none") == 0)


def test_class_weights_dataset_mode():
    x, t, _ = _data((3, 4, 6), seed=11, ignore=False)
    w = torch.tensor([1.0, 0.0, 2.0, 5.0], dtype=torch.float64)
    for fn in FUNCS.values():
        none = fn(x, t, reduction="none")
        active = torch.tensor([bool((t == c).any()) for c in range(4)])
        expected = (w * none)[active].sum() / w[active].sum()
        torch.testing.assert_close(fn(x, t, weight=w), expected)


def test_one_class_and_empty_batch():
    x = torch.randn(3, 1, 4, dtype=torch.float64, requires_grad=True)
    t = torch.zeros(3, 4, dtype=torch.long)
    for kind in FUNCS:
        _compare(kind, x, t, activation="sigmoid")
    xe = torch.zeros(0, 3, 4, requires_grad=True)
    for fn in FUNCS.values():
        out = fn(xe, torch.zeros(0, 4, dtype=torch.long))
        assert out.item() == 0.0
        assert torch.autograd.grad(out, xe)[0].shape == xe.shape


def test_extreme_logits_finite():
    x, t, _ = _data((2, 4, 5), seed=12)
    xb = (x.detach() * 1e4).requires_grad_(True)
    for fn in FUNCS.values():
        for aggregate in ("dataset", "image", "class"):
            out = fn(xb, t, aggregate=aggregate, log_loss=True)
            (g,) = torch.autograd.grad(out, xb)
            assert torch.isfinite(out) and torch.isfinite(g).all()


def test_half_precision_input():
    x, t, _ = _data((2, 4, 5), seed=13)
    for fn in FUNCS.values():
        xh = x.detach().half().requires_grad_(True)
        out = fn(xh, t)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, fn(xh.detach().float(), t), rtol=1e-6, atol=1e-6)
        assert torch.autograd.grad(out, xh)[0].dtype == torch.float16


# --------------------------------------------------------------------------------------
# errors and validation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dice", "jaccard", "soft_dice"])
def test_class_dimension_hints_work_when_followed(kind):
    """The set-level losses need a class dimension: each alternative the hint names, applied."""
    fn = FUNCS[kind]
    g = torch.Generator().manual_seed(10)
    x = torch.randn(5, generator=g, dtype=torch.float64)
    # one sample's C class scores and its id / its soft labels: a batch dimension on both
    for t in (torch.tensor(2), torch.softmax(torch.randn(5, generator=g, dtype=torch.float64), 0)):
        xb, tb = raise_and_follow(lambda: fn(x, t), ValueError, ("input.unsqueeze(0)", "target.unsqueeze(0)"), x, t)
        torch.testing.assert_close(fn(xb, tb), fn(x[None], t[None]))
    # one sigmoid output per sample with 0/1 ids: a channel dimension and float labels
    ids = torch.randint(0, 2, (5,), generator=g)
    xb, tb = raise_and_follow(lambda: fn(x, ids), ValueError,
                              ("input.unsqueeze(1)", "target.to(input.dtype).unsqueeze(1)"), x, ids)
    assert "activation='sigmoid'" in _message(lambda: fn(x, ids))
    out = fn(xb, tb, activation="sigmoid")
    torch.testing.assert_close(out, fn(x[:, None], ids.double()[:, None], activation="sigmoid"))
    # one foreground channel through a softmax: the sigmoid with the id map as float labels
    xc = torch.randn(2, 1, 3, 3, generator=g, dtype=torch.float64)
    idmap = torch.randint(0, 2, (2, 3, 3), generator=g)
    tc = raise_and_follow(lambda: fn(xc, idmap), ValueError, "target.unsqueeze(1).to(input.dtype)", xc, idmap)
    assert "activation='sigmoid'" in _message(lambda: fn(xc, idmap))
    out = fn(xc, tc, activation="sigmoid")
    assert torch.isfinite(out) and out.dtype == torch.float64


def _message(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("kind", ["dice", "jaccard", "soft_dice"])
def test_errors(kind):
    fn = FUNCS[kind]
    name = fn.__name__
    x = torch.randn(2, 3, 4)
    t = torch.randint(0, 3, (2, 4))
    with pytest.raises(ValueError, match=rf"^{name}: smooth must be finite and satisfy smooth >= 0"):
        fn(x, t, smooth=-1.0)
    with pytest.raises(ValueError, match=rf"^{name}: activation must be one of"):
        fn(x, t, activation="relu")
    with pytest.raises(ValueError, match=rf"^{name}: aggregate must be one of"):
        fn(x, t, aggregate="batch")
    with pytest.raises(ValueError, match=rf"^{name}: active_classes must be one of"):
        fn(x, t, active_classes="some")
    with pytest.raises(TypeError, match=rf"^{name}: log_loss must be a bool"):
        fn(x, t, log_loss=1)
    with pytest.raises(ValueError, match=rf"^{name}: reduction must be one of"):
        fn(x, t, reduction="batchmean")
    with pytest.raises(ValueError, match=rf"^{name}: target has class ids outside \[0, 3\)"):
        fn(x, torch.tensor([[0, 1, 2, 3], [0, 0, 0, 0]]))
    with pytest.raises(ValueError, match=rf"^{name}: target has class ids outside"):
        fn(x, torch.tensor([[0, 1, 2, -1], [0, 0, 0, 0]]))
    with pytest.raises(ValueError, match=rf"^{name}: input must lie in \[0, 1\]"):
        fn(x, t, activation="none")
    with pytest.raises(ValueError, match=rf"^{name}: target must lie in \[0, 1\]"):
        fn(x, torch.full((2, 3, 4), 1.2))
    xn = x.clone()
    xn[0, 0, 0] = math.nan
    with pytest.raises(ValueError, match=rf"^{name}: input contains NaN"):
        fn(xn, t)
    with pytest.raises(ValueError, match=rf"^{name}: input must lie in \[0, 1\] \(got NaN\)"):
        fn(xn.sigmoid(), t, activation="none")
    with pytest.raises(TypeError, match=rf"^{name}: input must be a floating-point tensor"):
        fn(t, t)
    with pytest.raises(TypeError, match=rf"^{name}: target must hold integer class ids or float soft labels"):
        fn(x, t.bool())
    with pytest.raises(ValueError, match=rf"^{name}: integer target shape must be \(2, 4\)"):
        fn(x, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=rf"^{name}: float target must have the input's shape"):
        fn(x, torch.rand(2, 3, 3))
    with pytest.raises(ValueError, match=rf"^{name}: input must have shape \(B, C\)"):
        fn(torch.randn(4), torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match=rf"^{name}: mask must be a bool tensor"):
        fn(x, t, mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match=rf"^{name}: mask shape must be \(2, 4\)"):
        fn(x, t, mask=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=rf"^{name}: weight must have shape \(3,\)"):
        fn(x, t, weight=torch.ones(4))
    with pytest.raises(ValueError, match=rf"^{name}: weight must be non-negative"):
        fn(x, t, weight=torch.tensor([1.0, -1.0, 1.0]))
    mod = MODULES[kind]
    with pytest.raises(ValueError, match=rf"^{mod.__name__}: smooth must be finite"):
        mod(smooth=-0.5)
    with pytest.raises(ValueError, match=rf"^{mod.__name__}: aggregate must be one of"):
        mod(aggregate="pixels")
    with pytest.raises(TypeError, match=rf"^{mod.__name__}: gather_distributed must be a bool"):
        mod(gather_distributed="yes")


def test_validation_off_skips_only_data_checks():
    x = torch.randn(2, 3, 4)
    t = torch.randint(0, 3, (2, 4))
    with losses.validation(False):
        for fn in FUNCS.values():
            fn(x, t, activation="none")  # values outside [0, 1]
            fn(x, torch.full((2, 3, 4), 1.2))  # soft labels outside [0, 1]
            fn(x, t, weight=torch.tensor([1.0, -1.0, 1.0]))
            xn = x.clone()
            xn[0, 0, 0] = math.nan
            assert torch.isnan(fn(xn, t))
            fn(x, torch.tensor([[0, 1, 2, 9], [0, 0, 0, 0]]))  # undefined but no crash
            with pytest.raises(ValueError, match="smooth"):
                fn(x, t, smooth=-1.0)
            with pytest.raises(ValueError, match="mask shape"):
                fn(x, t, mask=torch.ones(2, 3, dtype=torch.bool))


# --------------------------------------------------------------------------------------
# modules and registry
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dice", "jaccard", "soft_dice"])
def test_module(kind):
    w = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    kw = dict(activation="sigmoid", smooth=0.25, aggregate="class", active_classes="all", log_loss=True, weight=w,
              ignore_index=9, reduction="sum")
    m = MODULES[kind](**kw)
    for piece in ("activation='sigmoid'", "smooth=0.25", "aggregate='class'", "active_classes='all'",
                  "log_loss=True", "ignore_index=9", "reduction='sum'", "gather_distributed=False"):
        assert piece in repr(m)
    x, t, mask = _data((3, 3, 4), seed=14, with_mask=True, ignore=False)
    t[0, 0] = 9
    expected = FUNCS[kind](x, t, mask=mask, **kw)
    torch.testing.assert_close(m(x, t, mask), expected, rtol=0, atol=0)
    gathered = MODULES[kind](gather_distributed=True, **kw)  # single process: identical
    torch.testing.assert_close(gathered(x, t, mask=mask), expected, rtol=0, atol=0)
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        torch.testing.assert_close(other(x, t, mask), expected)
    fresh = MODULES[kind](**{**kw, "weight": torch.ones(3, dtype=torch.float64)})
    fresh.load_state_dict(m.state_dict())
    torch.testing.assert_close(fresh(x, t, mask), expected)


@pytest.mark.parametrize("name", ["dice_semimetric", "jaccard_metric", "soft_dice"])
@pytest.mark.parametrize("aggregate", ["dataset", "image", "class"])
def test_registry_unit_weights(name, aggregate):
    spec = losses.get_loss_spec(name)
    assert spec.unit == "class" and spec.inputs == ("input", "target")
    assert spec.arxiv == {"dice_semimetric": "2303.16296", "jaccard_metric": "2302.05666", "soft_dice": ""}[name]
    x, t, mask = _data((4, 5, 3), seed=15, with_mask=True)
    w = torch.tensor([1.0, 0.0, 3.0, 0.5, 2.0], dtype=torch.float64)
    m = losses.create_loss(name, aggregate=aggregate, weight=w)
    uw = spec.unit_weights(x, t, mask=mask, aggregate=aggregate, weight=w)
    none = losses.create_loss(name, aggregate=aggregate, weight=w, reduction="none")(x, t, mask)
    assert uw.shape == none.shape == ((5,) if aggregate == "dataset" else (4, 5))
    torch.testing.assert_close(m(x, t, mask), (uw * none).sum() / uw.sum())
    # the unit-weight rule, docs/conventions.md formulas, computed independently
    act = torch.zeros(4, 5, dtype=torch.bool)
    keep = (t != -100) & mask
    for b in range(4):
        for c in range(5):
            act[b, c] = bool(((t[b] == c) & keep[b]).any())
    if aggregate == "dataset":
        expected = w * act.any(0)
    elif aggregate == "image":
        a = w * act
        expected = a / a.sum(1, keepdim=True).clamp(min=1e-300)
    else:
        expected = (w * act) / act.sum(0).clamp(min=1)
    torch.testing.assert_close(uw.double(), expected.double())
