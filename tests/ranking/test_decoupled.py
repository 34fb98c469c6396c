"""Decoupled softmax and InfoNCE (docs/losses/decoupled_softmax.md) against explicit float64 loops and the spec's facts;
target handling, sampling, errors and the single-process ``in_batch_scores`` / module forms."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch
import torch.nn.functional as F

import losses
from tests._helpers import assert_gradcheck, assert_value_and_grad, weighted_reduce
from tests._helpers.rows import SCORES, entry

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "decoupled_softmax": entry("decoupled_softmax_loss", "DecoupledSoftmaxLoss", SCORES, unit="row"),
    "infonce": entry("infonce_loss", "InfoNCELoss", SCORES, unit="row"),
}
EXPECTED_HELPERS = ("in_batch_scores",)

NEG_INF = -math.inf


# --------------------------------------------------------------------------------------
# oracles (explicit loops, float64)
# --------------------------------------------------------------------------------------


def decoupled_row(s_row, y_row, T, *, weighted=False, mask_value=NEG_INF, only=None):
    """One row's loss from the definition (sums of exponentials, no logsumexp).

    ``only``: score just this positive (the sampled estimator); otherwise every positive."""
    L = len(y_row)
    P = [l for l in range(L) if y_row[l] > 0]
    if not P:
        return None
    acc = s_row.new_zeros(())
    for l in range(L):
        if l not in P:
            acc = acc + torch.exp(s_row[l] / T)
    if mask_value != NEG_INF:
        acc = acc + len(P) * math.exp(mask_value)
    scored = P if only is None else [only]
    total = s_row.new_zeros(())
    for l in scored:
        w = y_row[l] if weighted else 1.0
        total = total + w * torch.log(1 + acc * torch.exp(-s_row[l] / T))
    return total / len(scored)


def infonce_row(s_row, y_row, T, normalization="sum"):
    L = len(y_row)
    P = [l for l in range(L) if y_row[l] > 0]
    if not P:
        return None
    z = s_row.new_zeros(())
    for l in range(L):
        z = z + torch.exp(s_row[l] / T)
    total = s_row.new_zeros(())
    for l in P:
        total = total + (torch.log(z) - s_row[l] / T)
    return total / (len(P) if normalization == "mean" else 1)


def reduce_rows(rows, scores, reduction):
    """Rows without a value (``None``: no positive) are graph-attached zeros of unit weight 0."""
    vals = [r if r is not None else scores.new_zeros(()) * scores.sum() for r in rows]
    w = torch.tensor([0.0 if r is None else 1.0 for r in rows], dtype=torch.float64)
    return weighted_reduce(torch.stack(vals), w, reduction)


def dense_relevance(target, L):
    """Target (any accepted form) -> list of per-row relevance lists (0 = negative)."""
    if target.dtype == torch.bool:
        return target.double().tolist()
    if target.is_floating_point():
        return [[max(v, 0.0) for v in row] for row in target.double().tolist()]
    ids = target.tolist()
    out = []
    for row in ids:
        row = row if isinstance(row, list) else [row]
        dense = [0.0] * L
        for j in row:
            if j != -100:
                dense[j] = 1.0
        out.append(dense)
    return out


def random_case(B=5, L=7, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    scores = (torch.randn(B, L, generator=g, dtype=torch.float64) * scale).requires_grad_(True)
    mask = torch.rand(B, L, generator=g) < 0.3
    mask[0] = False  # no positive
    mask[1] = True  # all positive
    mask[2] = False
    mask[2, 3] = True  # exactly one
    mask[3, :3] = True  # several
    rel = torch.where(mask, torch.rand(B, L, generator=g, dtype=torch.float64) + 0.1, torch.zeros(B, L, dtype=torch.float64))
    rel[4, 0] = -0.5  # non-positive relevance is a negative
    return scores, mask, rel


# --------------------------------------------------------------------------------------
# values and gradients against the loops
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("target_kind", ["bool", "float", "float_weighted"])
@pytest.mark.parametrize("mask_value", [None, -100.0, -3.0])
@pytest.mark.parametrize("T", [0.05, 1.0])
def test_decoupled_matches_loop_oracle(reduction, target_kind, mask_value, T):
    scores, mask, rel = random_case(scale=1.0 if T == 1.0 else 0.2)
    target = mask if target_kind == "bool" else rel
    weighted = target_kind == "float_weighted"
    Y = dense_relevance(target, 7)
    mv = NEG_INF if mask_value is None else mask_value
    got = losses.decoupled_softmax_loss(scores, target, temperature=T, weighted=weighted, mask_value=mask_value,
                                        reduction=reduction)
    rows = [decoupled_row(scores[i], Y[i], T, weighted=weighted, mask_value=mv) for i in range(5)]
    assert_value_and_grad(got, reduce_rows(rows, scores, reduction), [scores])


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("normalization", ["sum", "mean"])
@pytest.mark.parametrize("target_kind", ["bool", "float"])
def test_infonce_matches_loop_oracle(reduction, normalization, target_kind):
    scores, mask, rel = random_case(seed=1, scale=0.2)
    target = mask if target_kind == "bool" else rel
    Y = dense_relevance(target, 7)
    got = losses.infonce_loss(scores, target, positive_normalization=normalization, reduction=reduction)
    rows = [infonce_row(scores[i], Y[i], 0.05, normalization) for i in range(5)]
    assert_value_and_grad(got, reduce_rows(rows, scores, reduction), [scores])


def test_reference_variant_uses_mask_minus_100_and_one_sampled_positive():
    scores, mask, _ = random_case(seed=2, B=5, L=6, scale=0.5)
    # make -100 visible: every scaled score sits near -100 (T = 1)
    s = (scores.detach() - 100.0).requires_grad_(True)
    g = torch.Generator().manual_seed(0)
    none = losses.decoupled_softmax_loss(s, mask, temperature=1.0, variant="reference", generator=g,
                                         reduction="none").detach()
    Y = dense_relevance(mask, 6)
    for i in range(5):
        P = [l for l in range(6) if Y[i][l] > 0]
        if not P:
            assert none[i] == 0
            continue
        candidates = [float(decoupled_row(s[i].detach(), Y[i], 1.0, mask_value=-100.0, only=j)) for j in P]
        assert any(abs(float(none[i]) - c) <= 1e-10 * max(1.0, abs(c)) for c in candidates), (i, candidates)
    # flags on their own: sample_one_positive=False with the reference's -100 mask is the
    # all-positive oracle with mask_value=-100
    got = losses.decoupled_softmax_loss(s, mask, temperature=1.0, variant="reference", sample_one_positive=False,
                                        reduction="none")
    rows = [decoupled_row(s[i], Y[i], 1.0, mask_value=-100.0) for i in range(5)]
    assert_value_and_grad(got, reduce_rows(rows, s, "none"), [s])
    # paper variant with sample_one_positive and exact removal
    got = losses.decoupled_softmax_loss(s, mask, temperature=1.0, sample_one_positive=True,
                                        generator=torch.Generator().manual_seed(1), reduction="none")
    for i in range(5):
        P = [l for l in range(6) if Y[i][l] > 0]
        if P:
            candidates = [float(decoupled_row(s[i].detach(), Y[i], 1.0, only=j)) for j in P]
            assert any(abs(float(got[i].detach()) - c) <= 1e-10 * max(1.0, abs(c)) for c in candidates)


def test_sampled_positive_follows_relevance():
    # one row, positives 0, 2, 4 with relevance 1 : 2 : 5; distinct per-positive values identify the draw
    L, n = 6, 6000
    rel = torch.tensor([[1.0, 0.0, 2.0, 0.0, 5.0, 0.0]], dtype=torch.float64).expand(n, L)
    scores = torch.tensor([[0.1, 0.4, 0.9, -0.3, 0.5, 0.2]], dtype=torch.float64).expand(n, L)
    out = losses.decoupled_softmax_loss(scores, rel, temperature=1.0, sample_one_positive=True,
                                        generator=torch.Generator().manual_seed(3), reduction="none")
    values = {j: float(decoupled_row(scores[0], rel[0].tolist(), 1.0, only=j)) for j in (0, 2, 4)}
    counts = {j: int((out - v).abs().lt(1e-12).sum()) for j, v in values.items()}
    assert sum(counts.values()) == n
    for j, p in ((0, 1 / 8), (2, 2 / 8), (4, 5 / 8)):
        se = math.sqrt(p * (1 - p) / n)
        assert abs(counts[j] / n - p) < 4 * se, (j, counts)
    # weighted: the sampled term is multiplied by the relevance of the drawn positive
    outw = losses.decoupled_softmax_loss(scores[:50], rel[:50], temperature=1.0, sample_one_positive=True,
                                         weighted=True, generator=torch.Generator().manual_seed(3), reduction="none")
    for j, v in values.items():
        torch.testing.assert_close(outw[(out[:50] - v).abs() < 1e-12], (rel[0, j] * v).expand(int(((out[:50] - v).abs() < 1e-12).sum())))


def test_expected_sampled_loss_equals_paper_loss():
    """Binary relevance, sample_one_positive=True, mask_value=-inf: E[sampled] = paper (4000 draws)."""
    scores, mask, _ = random_case(seed=4, B=5, L=7, scale=0.1)
    n = 4000
    paper = losses.decoupled_softmax_loss(scores.detach(), mask, reduction="none")
    rep_scores = scores.detach().repeat(n, 1)
    rep_mask = mask.repeat(n, 1)
    draws = losses.decoupled_softmax_loss(rep_scores, rep_mask, sample_one_positive=True, mask_value=-math.inf,
                                          generator=torch.Generator().manual_seed(5), reduction="none").view(n, 5)
    mean, sd = draws.mean(dim=0), draws.std(dim=0)
    for i in range(5):
        se = float(sd[i]) / math.sqrt(n)
        assert abs(float(mean[i]) - float(paper[i])) <= 4 * se + 1e-12, (i, float(mean[i]), float(paper[i]), se)
    assert float(sd[3]) > 0  # the multi-positive row really is random


# --------------------------------------------------------------------------------------
# test facts (docs/losses/decoupled_softmax.md)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [0.05, 0.7])
def test_one_positive_per_row_equals_cross_entropy(T):
    g = torch.Generator().manual_seed(6)
    scores = (torch.randn(6, 9, generator=g, dtype=torch.float64) * 0.3).requires_grad_(True)
    ids = torch.randint(0, 9, (6,), generator=g)
    mask = F.one_hot(ids, 9).bool()
    forms = [ids, ids[:, None], mask, mask.double(), torch.stack([ids, torch.full_like(ids, -100)], 1)]
    for target in forms:
        for got in (losses.decoupled_softmax_loss(scores, target, temperature=T),
                    losses.infonce_loss(scores, target, temperature=T, positive_normalization="sum"),
                    losses.infonce_loss(scores, target, temperature=T, positive_normalization="mean"),
                    losses.decoupled_softmax_loss(scores, target, temperature=T, variant="reference",
                                                  mask_value=-math.inf)):
            assert_value_and_grad(got, F.cross_entropy(scores / T, ids), [scores], rtol=1e-12, atol=1e-12)
    none = losses.decoupled_softmax_loss(scores, ids, temperature=T, reduction="none")
    torch.testing.assert_close(none, F.cross_entropy(scores / T, ids, reduction="none"), rtol=1e-12, atol=1e-12)


def test_decoupled_is_at_most_infonce_mean_per_row():
    for seed in range(3):
        scores, mask, rel = random_case(seed=10 + seed, B=5, L=7, scale=0.3)
        for target in (mask, rel):
            dec = losses.decoupled_softmax_loss(scores, target, reduction="none")
            inf = losses.infonce_loss(scores, target, positive_normalization="mean", reduction="none")
            assert torch.all(dec <= inf + 1e-12)
            has_two = (target > 0).sum(dim=1) >= 2
            assert torch.all(dec[has_two] < inf[has_two])


def test_positive_gradient_formula():
    T = 0.1
    scores, mask, _ = random_case(seed=13, B=5, L=7, scale=0.3)
    loss = losses.decoupled_softmax_loss(scores, mask, temperature=T, reduction="sum")
    (grad,) = torch.autograd.grad(loss, scores)
    s = scores.detach() / T
    for i in range(5):
        P = [l for l in range(7) if mask[i, l]]
        N = [l for l in range(7) if not mask[i, l]]
        nlse = torch.logsumexp(s[i, N], 0) if N else torch.tensor(-math.inf, dtype=torch.float64)
        for l in P:
            q = torch.exp(s[i, l]) / (torch.exp(s[i, l]) + torch.exp(nlse))
            expected = -(1 - q) / len(P) / T  # dL/ds_il, then ds_il/dscores_il = 1/T
            torch.testing.assert_close(grad[i, l], expected, rtol=1e-10, atol=1e-14)


def test_other_positives_are_removed_exactly():
    """Paper variant: a positive's term ignores the other positives entirely (no -100 leaks)."""
    T = 1.0
    scores = torch.tensor([[-100.0, -100.0, -99.0, -101.0, -100.5]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False, False, False]])
    got = losses.decoupled_softmax_loss(scores, mask, temperature=T)
    # equals the mean of two cross-entropies with the other positive's column deleted
    a = F.cross_entropy(scores[:, [0, 2, 3, 4]], torch.tensor([0]))
    b = F.cross_entropy(scores[:, [1, 2, 3, 4]], torch.tensor([0]))
    assert_value_and_grad(got, (a + b) / 2, [scores], rtol=1e-12, atol=1e-12)
    leaky = losses.decoupled_softmax_loss(scores, mask, temperature=T, mask_value=-100.0)
    assert float(leaky.detach()) > float(got.detach()) + 0.1  # -100 entries matter at this scale
    # huge scores of the other positive change nothing
    s2 = scores.detach().clone()
    s2[0, 1] = 1e4
    one = losses.decoupled_softmax_loss(s2, mask, temperature=T, reduction="none")
    ref_a = F.cross_entropy(s2[:, [0, 2, 3, 4]], torch.tensor([0]))
    ref_b = F.cross_entropy(s2[:, [1, 2, 3, 4]], torch.tensor([0]))
    torch.testing.assert_close(one, ((ref_a + ref_b) / 2).view(1), rtol=1e-12, atol=1e-12)


def test_rows_without_positives_and_all_positive_rows():
    scores, mask, _ = random_case(seed=14, B=5, L=7, scale=0.3)
    none = losses.decoupled_softmax_loss(scores, mask, reduction="none")
    assert none[0] == 0  # no positives
    assert none[1] == 0  # every label positive: NLSE = -inf
    g = torch.autograd.grad(none[1], scores)[0]
    assert torch.all(g == 0)
    # the all-positive row stays in the mean, the empty row leaves it
    mean = losses.decoupled_softmax_loss(scores, mask)
    torch.testing.assert_close(mean, none[1:].sum() / 4, rtol=1e-12, atol=0)
    w = losses.get_loss_spec("decoupled_softmax").unit_weights(scores, mask)
    assert w.tolist() == [0.0, 1.0, 1.0, 1.0, 1.0]
    # InfoNCE: an all-positive row is a regular row (positives in each other's denominators)
    inf = losses.infonce_loss(scores, mask, reduction="none")
    assert inf[0] == 0 and inf[1] > 0


@pytest.mark.parametrize("fn", [losses.decoupled_softmax_loss, losses.infonce_loss])
def test_all_ignored_is_attached_zero(fn):
    scores = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    for target in (torch.full((4,), -100), torch.full((4, 3), -100), torch.zeros(4, 5, dtype=torch.bool),
                   torch.zeros(4, 5, dtype=torch.float64)):
        for reduction in ("mean", "sum"):
            out = fn(scores, target, reduction=reduction)
            assert out.item() == 0.0 and out.grad_fn is not None
            (g,) = torch.autograd.grad(out, scores)
            assert torch.all(g == 0)
        assert torch.all(fn(scores, target, reduction="none") == 0)
    empty = torch.zeros(0, 5, requires_grad=True)
    out = fn(empty, torch.zeros(0, dtype=torch.long))
    assert out.item() == 0.0 and torch.autograd.grad(out, empty)[0].shape == (0, 5)


def test_target_forms_agree():
    g = torch.Generator().manual_seed(15)
    scores = torch.randn(4, 6, generator=g, dtype=torch.float64)
    ids = torch.tensor([[1, 4, -100], [0, -100, -100], [-100, -100, -100], [2, 2, 5]])  # repeats are one positive
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[0, [1, 4]] = True
    mask[1, 0] = True
    mask[3, [2, 5]] = True
    for fn in (losses.decoupled_softmax_loss, losses.infonce_loss):
        ref = fn(scores, mask, reduction="none")
        torch.testing.assert_close(fn(scores, ids, reduction="none"), ref, rtol=0, atol=0)
        torch.testing.assert_close(fn(scores, ids.int(), reduction="none"), ref, rtol=0, atol=0)
        torch.testing.assert_close(fn(scores, mask.double() * 3.0, reduction="none"), ref, rtol=0, atol=0)
        # another ignore_index
        ids7 = torch.where(ids == -100, torch.full_like(ids, -7), ids)
        torch.testing.assert_close(fn(scores, ids7, ignore_index=-7, reduction="none"), ref, rtol=0, atol=0)
    # weighted with bool / id targets is the unweighted loss
    torch.testing.assert_close(losses.decoupled_softmax_loss(scores, ids, weighted=True),
                               losses.decoupled_softmax_loss(scores, mask), rtol=0, atol=0)


def test_float_precision_and_half_inputs():
    scores, mask, rel = random_case(seed=16, scale=0.3)
    for fn in (losses.decoupled_softmax_loss, losses.infonce_loss):
        ref = fn(scores.detach(), rel)
        out = fn(scores.detach().float(), rel.float())
        assert out.dtype == torch.float32
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)
        assert fn(scores.detach().float(), rel).dtype == torch.float64  # a float64 target promotes
        h = scores.detach().half().requires_grad_(True)
        out = fn(h, mask)
        assert out.dtype == torch.float32 and torch.autograd.grad(out, h)[0].dtype == torch.float16


def test_extreme_scores_are_finite():
    g = torch.Generator().manual_seed(17)
    scores = (torch.randn(5, 7, generator=g) * 1e4).requires_grad_(True)
    _, mask, rel = random_case(seed=17)
    for fn, kw in ((losses.decoupled_softmax_loss, {}), (losses.decoupled_softmax_loss, {"variant": "reference"}),
                   (losses.decoupled_softmax_loss, {"weighted": True}), (losses.infonce_loss, {})):
        for target in (mask, rel):
            out = fn(scores, target, **kw)
            assert torch.isfinite(out) and torch.isfinite(torch.autograd.grad(out, scores)[0]).all()


# --------------------------------------------------------------------------------------
# gradcheck
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("B,L", [(1, 3), (3, 5)])
def test_gradcheck(B, L):
    g = torch.Generator().manual_seed(18)
    scores = torch.randn(B, L, generator=g, dtype=torch.float64).requires_grad_(True)
    rel = torch.zeros(B, L, dtype=torch.float64)
    rel[:, 0] = 0.7
    rel[-1, 1] = 1.5
    mask = rel > 0
    for kw in ({}, {"weighted": True}, {"mask_value": -1.0}, {"sample_one_positive": True}):
        for reduction in ("none", "mean"):
            def f(x, kw=kw, reduction=reduction):
                return losses.decoupled_softmax_loss(x, rel, temperature=0.5, reduction=reduction,
                                                     generator=torch.Generator().manual_seed(0), **kw)
            assert_gradcheck(f, scores)
    for norm in ("sum", "mean"):
        assert_gradcheck(lambda x: losses.infonce_loss(x, mask, temperature=0.5,
                                                                      positive_normalization=norm), scores)


# --------------------------------------------------------------------------------------
# determinism and modules
# --------------------------------------------------------------------------------------


def test_sampling_is_deterministic_for_a_seed():
    scores, mask, rel = random_case(seed=19, B=5, L=7, scale=0.2)
    reps = scores.detach().repeat(20, 1)
    rel_r = rel.repeat(20, 1)
    run = lambda gen: losses.decoupled_softmax_loss(reps, rel_r, variant="reference", generator=gen,  # noqa: E731
                                                    reduction="none")
    a = run(torch.Generator().manual_seed(7))
    b = run(torch.Generator().manual_seed(7))
    c = run(torch.Generator().manual_seed(8))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)
    m1 = losses.DecoupledSoftmaxLoss(variant="reference", seed=3, reduction="none")
    m2 = losses.DecoupledSoftmaxLoss(variant="reference", seed=3, reduction="none")
    first = m1(reps, rel_r)
    torch.testing.assert_close(first, m2(reps, rel_r), rtol=0, atol=0)
    # the module's generator advances; copies continue from the same state
    c1, c2 = copy.deepcopy(m1), pickle.loads(pickle.dumps(m1))
    nxt = m1(reps, rel_r)
    assert not torch.equal(nxt, first)
    torch.testing.assert_close(c1(reps, rel_r), nxt, rtol=0, atol=0)
    torch.testing.assert_close(c2(reps, rel_r), nxt, rtol=0, atol=0)
    # the same draws as the functional form with a generator seeded alike
    torch.testing.assert_close(first, run(torch.Generator().manual_seed(3)), rtol=0, atol=0)


def test_modules_equal_functions():
    scores, mask, rel = random_case(seed=20, scale=0.3)
    kw = dict(temperature=0.2, weighted=True, variant="paper", sample_one_positive=False, mask_value=-5.0,
              ignore_index=-1, reduction="sum")
    m = losses.DecoupledSoftmaxLoss(**kw)
    torch.testing.assert_close(m(scores, rel), losses.decoupled_softmax_loss(scores, rel, **kw), rtol=0, atol=0)
    assert "mask_value=-5.0" in repr(m) and "weighted=True" in repr(m)
    kw = dict(temperature=0.3, positive_normalization="mean", ignore_index=-1, reduction="none")
    m = losses.InfoNCELoss(**kw)
    torch.testing.assert_close(m(scores, mask), losses.infonce_loss(scores, mask, **kw), rtol=0, atol=0)
    assert repr(m).startswith("InfoNCELoss(temperature=0.3, positive_normalization='mean'")


def test_query_keys_form_and_in_batch_scores():
    g = torch.Generator().manual_seed(21)
    q = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[0, 2], [5, -100], [-100, -100], [1, 3]])
    scores, t = losses.in_batch_scores(q, k, ids)
    torch.testing.assert_close(scores, q @ k.T, rtol=0, atol=0)
    assert t is ids
    # gather_distributed without a process group is the identity
    scores2, t2 = losses.in_batch_scores(q, k, ids, gather_distributed=True)
    torch.testing.assert_close(scores2, scores, rtol=0, atol=0)
    assert t2 is ids
    for module, fn in ((losses.DecoupledSoftmaxLoss(temperature=0.5), losses.decoupled_softmax_loss),
                       (losses.InfoNCELoss(temperature=0.5), losses.infonce_loss)):
        got = module(q, k, ids)
        expected = fn(q @ k.T, ids, temperature=0.5)
        assert_value_and_grad(got, expected, [q, k], rtol=1e-12, atol=1e-12)
    module = losses.DecoupledSoftmaxLoss(gather_distributed=True)
    torch.testing.assert_close(module(q, k, ids), losses.decoupled_softmax_loss(q @ k.T, ids), rtol=0, atol=0)
    # all-ignored query/keys batch: attached zero with zero gradients for both inputs
    out = losses.InfoNCELoss()(q, k, torch.full((4,), -100))
    gq, gk = torch.autograd.grad(out, [q, k])
    assert out.item() == 0 and torch.all(gq == 0) and torch.all(gk == 0)
    # half inputs are scored in float32
    s16, _ = losses.in_batch_scores(q.half(), k.half(), ids)
    assert s16.dtype == torch.float32
    with pytest.raises(ValueError, match=r"^in_batch_scores: query and keys must have shapes \(B, D\) and \(K, D\)"):
        losses.in_batch_scores(q, k[:, :2], ids)
    with pytest.raises(TypeError, match=r"^in_batch_scores: keys must be a floating-point tensor"):
        losses.in_batch_scores(q, torch.ones(6, 3, dtype=torch.long), ids)


# --------------------------------------------------------------------------------------
# errors and validation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [losses.decoupled_softmax_loss, losses.infonce_loss, losses.soft_topk_loss])
def test_integer_mask_target_is_a_type_error(fn):
    name = fn.__name__
    scores = torch.randn(3, 4)
    target = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1]])
    kw = {"k": 2} if fn is losses.soft_topk_loss else {}
    msg = (f"{name}: integer target of shape (B, L) looks like a multi-hot mask (got values in {{0, 1}}); "
           "pass target.bool() or pad id lists with ignore_index")
    with pytest.raises(TypeError) as exc:
        fn(scores, target, **kw)
    assert str(exc.value) == msg
    # padded id lists of the same width are fine, and so are 0/1 ids with L <= 2 or P != L
    fn(scores, torch.tensor([[0, 1, 1, -100], [1, 0, 0, 0], [0, 0, 0, 1]]), **kw)
    fn(scores, torch.tensor([[0, 1], [1, 0], [0, 0]]), **kw)
    if fn is not losses.soft_topk_loss:
        fn(torch.randn(3, 2), torch.tensor([[0, 1], [1, 0], [0, 0]]))
    # it is a data check
    with losses.validation(False):
        fn(scores, target, **kw)


@pytest.mark.parametrize("fn", [losses.decoupled_softmax_loss, losses.infonce_loss, losses.soft_topk_loss])
def test_target_and_score_errors(fn):
    name = fn.__name__
    kw = {"k": 2} if fn is losses.soft_topk_loss else {}
    scores = torch.randn(3, 5)
    with pytest.raises(ValueError, match=rf"^{name}: target has class ids outside \[0, 5\) \(got min=0, max=5\)"):
        fn(scores, torch.tensor([0, 5, 1]), **kw)
    with pytest.raises(ValueError, match=rf"^{name}: target has class ids outside \[0, 5\)"):
        fn(scores, torch.tensor([[0, -2], [1, -100], [2, 3]]), **kw)
    with pytest.raises(ValueError, match=rf"^{name}: integer target must have shape \(3,\) or \(3, P\)"):
        fn(scores, torch.tensor([0, 1]), **kw)
    with pytest.raises(ValueError, match=rf"^{name}: integer target must have shape"):
        fn(scores, torch.zeros(3, 1, 1, dtype=torch.long), **kw)
    with pytest.raises(ValueError, match=rf"^{name}: bool target must have the scores' shape \(3, 5\)"):
        fn(scores, torch.zeros(3, 4, dtype=torch.bool), **kw)
    with pytest.raises(ValueError, match=rf"^{name}: float target must have the scores' shape \(3, 5\)"):
        fn(scores, torch.zeros(3), **kw)
    with pytest.raises(ValueError, match=rf"^{name}: scores must have shape \(B, L\)"):
        fn(torch.randn(5), torch.tensor([0]), **kw)
    with pytest.raises(ValueError, match=rf"^{name}: scores must have shape \(B, L\)"):
        fn(torch.randn(2, 3, 5), torch.tensor([0, 1]), **kw)
    with pytest.raises(TypeError, match=rf"^{name}: scores must be a floating-point tensor"):
        fn(torch.ones(3, 5, dtype=torch.long), torch.tensor([0, 1, 2]), **kw)
    with pytest.raises(TypeError, match=rf"^{name}: target must be a torch.Tensor"):
        fn(scores, [0, 1, 2], **kw)
    bad = scores.clone()
    bad[1, 1] = math.nan
    with pytest.raises(ValueError, match=rf"^{name}: scores contains NaN or infinite values \(got 1 NaN\)"):
        fn(bad, torch.tensor([0, 1, 2]), **kw)
    bad[1, 1] = math.inf
    with pytest.raises(ValueError, match=rf"^{name}: scores contains NaN or infinite values \(got 1 \+inf\)"):
        fn(bad, torch.tensor([0, 1, 2]), **kw)
    rel = torch.zeros(3, 5)
    rel[0, 0] = math.nan
    with pytest.raises(ValueError, match=rf"^{name}: target contains NaN"):
        fn(scores, rel, **kw)
    with pytest.raises(ValueError, match=rf"^{name}: reduction must be one of"):
        fn(scores, torch.tensor([0, 1, 2]), reduction="batchmean", **kw)
    with pytest.raises(ValueError, match=rf"^{name}: temperature must be finite and satisfy temperature > 0"):
        fn(scores, torch.tensor([0, 1, 2]), temperature=0.0, **kw)
    # validation off: the data checks go, the shape checks stay; out-of-range ids are then ignored
    with losses.validation(False):
        bad[1, 1] = math.nan
        fn(bad, torch.tensor([0, 1, 2]), **kw)
        out = fn(scores, torch.tensor([0, 9, -3]), reduction="none", **kw)
        assert out[1] == 0 and out[2] == 0
        with pytest.raises(ValueError, match="bool target must have the scores' shape"):
            fn(scores, torch.zeros(3, 4, dtype=torch.bool), **kw)


def test_hyperparameter_errors():
    s, t = torch.randn(2, 4), torch.tensor([0, 1])
    cases = [
        (dict(variant="dexml"), r"^decoupled_softmax_loss: variant must be one of 'paper', 'reference'"),
        (dict(weighted=1), r"^decoupled_softmax_loss: weighted must be a bool"),
        (dict(sample_one_positive="yes"), r"^decoupled_softmax_loss: sample_one_positive must be None or a bool"),
        (dict(mask_value=math.nan), r"^decoupled_softmax_loss: mask_value must be None, a finite real number or -inf"),
        (dict(mask_value=math.inf), r"^decoupled_softmax_loss: mask_value"),
        (dict(temperature=-0.1), r"^decoupled_softmax_loss: temperature"),
    ]
    for kw, pattern in cases:
        # a non-bool flag is the wrong kind of argument (TypeError); the rest are wrong values
        exc = TypeError if "a bool" in pattern else ValueError
        with pytest.raises(exc, match=pattern):
            losses.decoupled_softmax_loss(s, t, **kw)
    with pytest.raises(ValueError, match=r"^infonce_loss: positive_normalization must be one of 'sum', 'mean'"):
        losses.infonce_loss(s, t, positive_normalization="max")
    with pytest.raises(TypeError, match=r"^DecoupledSoftmaxLoss: seed must be an int or None"):
        losses.DecoupledSoftmaxLoss(seed=1.5)
    with pytest.raises(TypeError, match=r"^DecoupledSoftmaxLoss: gather_distributed must be a bool"):
        losses.DecoupledSoftmaxLoss(gather_distributed="yes")
    with pytest.raises(ValueError, match=r"^InfoNCELoss: temperature"):
        losses.InfoNCELoss(temperature=0)
    with pytest.raises(ValueError, match=r"^InfoNCELoss: reduction must be one of"):
        losses.InfoNCELoss(reduction="avg")
    with pytest.raises(ValueError, match=r"^DecoupledSoftmaxLoss: mask_value"):
        losses.DecoupledSoftmaxLoss(mask_value=math.nan)
    # -inf and finite mask values are accepted
    losses.decoupled_softmax_loss(s, t, mask_value=-math.inf)
    losses.decoupled_softmax_loss(s, t, mask_value=-100)
