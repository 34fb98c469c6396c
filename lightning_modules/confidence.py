"""Confidence metrics of a classifier: calibration, likelihood, selective prediction and
out-of-distribution detection, as pure functions of tensors (float64 inside, floats out).

* :func:`expected_calibration_error` -- ECE, top-label, 15 equal-width confidence bins.
* :func:`negative_log_likelihood` -- NLL of the predictive distribution with the sparse-output
  rule: probabilities are clipped at :data:`NLL_EPS` before the log, and the fraction of targets
  that got probability exactly 0 is returned beside it.
* :func:`aurc` -- area under the risk-coverage curve of selective prediction by confidence (ties
  accepted as a block: the expected value over a random order within tied confidences).
* :func:`ood_auroc` -- AUROC of an in-distribution score separating in- from out-of-distribution
  inputs (in-distribution the positive class, ties count one half); with :func:`msp_score`
  (maximum predictive probability) and :func:`energy_score` (``logsumexp`` of the logits, the
  negative free energy: higher = more in-distribution).

:class:`~lightning_modules.models.VisionClassifier` logs them per evaluation stage as ``ece``,
``nll``, ``nll_zero_frac``, ``aurc``, ``ood_auroc_msp``, ``ood_auroc_energy`` (and
``ood_noise_auroc_msp`` / ``ood_noise_auroc_energy`` for the far-OOD noise set); the OOD sets come
from the DataModule (``MNISTDataModule(ood=...)``).
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

__all__ = [
    "NLL_EPS",
    "expected_calibration_error",
    "negative_log_likelihood",
    "aurc",
    "ood_auroc",
    "msp_score",
    "energy_score",
]

#: The probability floor of :func:`negative_log_likelihood`: a target given probability 0 (which a
#: sparse mapping such as sparsemax does) costs ``-log(1e-12) = 27.63`` nats instead of infinity.
NLL_EPS = 1e-12


def _check(probs: Tensor, target: Tensor, name: str) -> Tuple[Tensor, Tensor]:
    if probs.dim() != 2 or target.dim() != 1 or probs.shape[0] != target.shape[0]:
        raise ValueError(f"{name}: expected probs (N, C) and target (N,) with the same N "
                         f"(got {tuple(probs.shape)} and {tuple(target.shape)})")
    if probs.shape[0] == 0:
        raise ValueError(f"{name}: no samples (N = 0)")
    return probs.detach().double(), target.detach().long()


def expected_calibration_error(probs: Tensor, target: Tensor, n_bins: int = 15) -> float:
    """Top-label ECE: ``sum_b |B_b| / N * |acc(B_b) - conf(B_b)|`` over ``n_bins`` equal-width bins of
    the confidence ``max_c p_c``; bin ``b`` holds confidences in ``(b / n_bins, (b + 1) / n_bins]``
    (a confidence of exactly 0 goes to the first bin). The prediction is ``argmax_c p_c`` (the
    first on ties)."""
    p, y = _check(probs, target, "expected_calibration_error")
    conf, pred = p.max(dim=1)
    correct = (pred == y).double()
    edges = torch.linspace(0.0, 1.0, n_bins + 1, dtype=torch.float64)
    # index of the bin (lo, hi] of each confidence
    b = torch.bucketize(conf, edges[1:-1], right=False)
    n = conf.numel()
    ece = torch.zeros((), dtype=torch.float64)
    for k in range(n_bins):
        m = b == k
        if m.any():
            ece += m.sum().double() / n * (correct[m].mean() - conf[m].mean()).abs()
    return float(ece)


def negative_log_likelihood(probs: Tensor, target: Tensor, eps: float = NLL_EPS) -> Tuple[float, float]:
    """``(mean -log max(p_y, eps), fraction of targets with p_y == 0)``.

    For softmax outputs ``p_y > 0`` always and the first value is the usual NLL (up to the floor,
    reached only below ``1e-12``). Sparse mappings (sparsemax, entmax) give exactly 0 to classes
    outside their support, where the NLL is infinite; the floor keeps it finite and comparable,
    and the second value says how often it was hit."""
    p, y = _check(probs, target, "negative_log_likelihood")
    py = p.gather(1, y.unsqueeze(1)).squeeze(1)
    nll = -torch.log(py.clamp_min(eps))
    return float(nll.mean()), float((py <= 0).double().mean())


def aurc(confidence: Tensor, correct: Tensor) -> float:
    """Area under the risk-coverage curve of selective prediction.

    Samples are accepted in decreasing ``confidence``; at coverage ``k / N`` the risk is the error
    rate of the ``k`` accepted ones, and ``AURC = (1 / N) sum_{k=1}^{N} risk(k)`` (lower is better).
    Ties: samples of equal confidence are accepted as one block, and inside it each
    ``k`` counts the block's errors pro rata (``errors before the block + (k - before) * the
    block's error rate``), the expected risk over a uniformly random order of the tied samples, so
    the value does not depend on the input order."""
    c = confidence.detach().double().flatten()
    err = 1.0 - correct.detach().double().flatten()
    n = c.numel()
    if n == 0 or err.numel() != n:
        raise ValueError(f"aurc: expected confidence and correct of the same non-zero length "
                         f"(got {c.numel()} and {err.numel()})")
    order = torch.argsort(c, descending=True, stable=True)
    c, err = c[order], err[order]
    uniq, counts = torch.unique_consecutive(c, return_counts=True)
    ends = torch.cumsum(counts, 0)
    starts = ends - counts
    cum_err = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(err, 0)])
    k = torch.arange(1, n + 1, dtype=torch.float64)
    block = torch.repeat_interleave(torch.arange(uniq.numel()), counts)
    before = starts[block].double()
    rate = (cum_err[ends] - cum_err[starts]) / counts.double()
    errors_k = cum_err[starts][block] + (k - before) * rate[block]
    return float((errors_k / k).mean())


def ood_auroc(score_in: Tensor, score_out: Tensor) -> float:
    """AUROC of ``score`` (higher = more in-distribution) with in-distribution the positive class:
    ``P(s_in > s_out) + P(s_in == s_out) / 2`` over all pairs (the Mann-Whitney statistic), from
    mid-ranks."""
    a = score_in.detach().double().flatten()
    b = score_out.detach().double().flatten()
    if a.numel() == 0 or b.numel() == 0:
        raise ValueError(f"ood_auroc: both sets need scores (got {a.numel()} and {b.numel()})")
    allv = torch.cat([a, b])
    sorted_v, idx = torch.sort(allv, stable=True)
    uniq, inv, counts = torch.unique_consecutive(sorted_v, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    mid = ends - (counts.double() - 1.0) / 2.0  # mid-rank of each tie group (ranks 1..N)
    ranks = torch.empty_like(allv)
    ranks[idx] = mid[inv]
    n_in, n_out = a.numel(), b.numel()
    u = ranks[:n_in].sum() - n_in * (n_in + 1) / 2.0
    return float(u / (n_in * n_out))


def msp_score(probs: Tensor) -> Tensor:
    """Maximum predictive probability per row (higher = more in-distribution)."""
    return probs.detach().double().max(dim=1).values


def energy_score(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """``T * logsumexp(logits / T)`` per row: the negative free energy ``-E(x)``, higher = more
    in-distribution (Liu et al., 2020, with ``T = 1``)."""
    z = logits.detach().double()
    return temperature * torch.logsumexp(z / temperature, dim=1)
