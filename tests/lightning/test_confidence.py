"""``lightning_modules/confidence.py``: ECE, NLL (with the sparse-output rule), AURC and OOD AUROC
against independent float64 computations (loops over samples / pairs / orderings) and hand values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from lightning_modules import confidence as cm


def _probs(rng, n, c):
    z = rng.normal(size=(n, c)) * 2.0
    p = np.exp(z - z.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True)


def test_ece_matches_a_loop_and_a_hand_case():
    rng = np.random.default_rng(0)
    p = _probs(rng, 400, 10)
    y = rng.integers(0, 10, 400)
    y[:200] = p[:200].argmax(1)  # partly accurate
    # independent: bin of a confidence c is ceil(c * 15) - 1 (c = 0 -> bin 0)
    bins = {}
    for pi, yi in zip(p, y):
        conf = pi.max()
        b = max(0, math.ceil(conf * 15) - 1)
        bins.setdefault(b, []).append((conf, float(pi.argmax() == yi)))
    ece = sum(len(v) / 400 * abs(np.mean([a for _, a in v]) - np.mean([c for c, _ in v])) for v in bins.values())
    got = cm.expected_calibration_error(torch.tensor(p), torch.tensor(y))
    assert got == pytest.approx(ece, abs=1e-12)
    # hand case: two samples, confidences 0.9 (right) and 0.6 (wrong): |1 - 0.9| / 2 + |0 - 0.6| / 2 = 0.35
    p2 = torch.tensor([[0.9, 0.1], [0.6, 0.4]])
    assert cm.expected_calibration_error(p2, torch.tensor([0, 1])) == pytest.approx(0.35)


def test_nll_and_the_sparse_output_rule():
    p = torch.tensor([[0.7, 0.3, 0.0], [0.0, 1.0, 0.0], [0.2, 0.3, 0.5], [0.5, 0.5, 0.0]], dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 2])  # the last target has probability 0 (outside a sparse support)
    nll, zero = cm.negative_log_likelihood(p, y)
    expected = (-math.log(0.7) - math.log(1.0) - math.log(0.5) - math.log(1e-12)) / 4
    assert nll == pytest.approx(expected, rel=1e-12) and zero == 0.25
    assert cm.NLL_EPS == 1e-12
    # softmax outputs: the plain NLL, equal to cross-entropy of the logits
    rng = np.random.default_rng(1)
    z = torch.tensor(rng.normal(size=(50, 7)))
    t = torch.tensor(rng.integers(0, 7, 50))
    nll, zero = cm.negative_log_likelihood(torch.softmax(z, 1), t)
    assert nll == pytest.approx(float(torch.nn.functional.cross_entropy(z, t)), rel=1e-10) and zero == 0.0
    with pytest.raises(ValueError, match="expected probs"):
        cm.negative_log_likelihood(p[0], y)


def _aurc_order(err):
    n = len(err)
    return sum(sum(err[:k]) / k for k in range(1, n + 1)) / n


def test_aurc_by_hand_and_ties_as_the_mean_over_orderings():
    # conf 0.9, 0.8, 0.7, 0.6 with the second wrong: risks 0, 1/2, 1/3, 1/4 -> mean 0.2708333
    conf = torch.tensor([0.6, 0.9, 0.7, 0.8])
    correct = torch.tensor([1, 1, 1, 0])
    assert cm.aurc(conf, correct) == pytest.approx((0 + 1 / 2 + 1 / 3 + 1 / 4) / 4)
    # ties: the average AURC over every order of the tied samples (brute force)
    conf = [0.9, 0.7, 0.7, 0.7, 0.5, 0.5, 0.2]
    err = [0, 1, 0, 1, 0, 1, 1]
    groups = {}
    for c, e in zip(conf, err):
        groups.setdefault(c, []).append(e)
    keys = sorted(groups, reverse=True)
    vals = []
    for perms in itertools.product(*[list(itertools.permutations(groups[k])) for k in keys]):
        vals.append(_aurc_order([e for g in perms for e in g]))
    got = cm.aurc(torch.tensor(conf), 1 - torch.tensor(err))
    assert got == pytest.approx(float(np.mean(vals)), abs=1e-12)
    # order of the input does not matter
    perm = torch.tensor([6, 2, 0, 5, 1, 4, 3])
    assert cm.aurc(torch.tensor(conf)[perm], (1 - torch.tensor(err))[perm]) == pytest.approx(got, abs=1e-15)
    # all correct: 0; all wrong: 1
    assert cm.aurc(torch.rand(5), torch.ones(5)) == 0.0 and cm.aurc(torch.rand(5), torch.zeros(5)) == 1.0


def test_ood_auroc_against_pairs_and_the_scores():
    rng = np.random.default_rng(2)
    a = np.round(rng.normal(1.0, 1.0, 60), 1)  # rounded: many ties
    b = np.round(rng.normal(0.0, 1.0, 45), 1)
    pairs = np.mean([(x > y) + 0.5 * (x == y) for x in a for y in b])
    assert cm.ood_auroc(torch.tensor(a), torch.tensor(b)) == pytest.approx(pairs, abs=1e-12)
    assert cm.ood_auroc(torch.tensor([2.0, 3.0]), torch.tensor([0.0, 1.0])) == 1.0
    assert cm.ood_auroc(torch.tensor([1.0]), torch.tensor([1.0])) == 0.5
    z = torch.tensor(rng.normal(size=(4, 5)))
    energy = np.log(np.exp(z.numpy()).sum(1))
    assert cm.energy_score(z).numpy() == pytest.approx(energy, abs=1e-12)
    assert cm.msp_score(torch.softmax(z, 1)).numpy() == pytest.approx(
        (np.exp(z.numpy()) / np.exp(z.numpy()).sum(1, keepdims=True)).max(1), abs=1e-12)

