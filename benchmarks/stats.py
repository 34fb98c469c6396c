"""Paired statistics and verdicts for the reproduction's claims.

For each seed, the family's and the baseline's runs share the split, the data order and (where the
architectures agree) the initial weights, so the unit of analysis is the per-seed difference
``d_i = family_i - baseline_i``. This module computes

* the mean paired difference with a 95% confidence interval: paired t (``method="t"``, the default:
  ``mean +- t_{0.975, n-1} * sd / sqrt(n)``) or a seeded percentile bootstrap of the mean
  (``method="bootstrap"``); every report says which;
* the minimum detectable effect (MDE): the true mean difference a two-sided paired t test at
  ``alpha = 0.05`` detects with 80% power for this ``n`` and the observed sd of the differences
  (solved exactly with the noncentral t distribution);
* the verdict, decided by the CI only:

  - direction claims (``"higher"`` / ``"lower"`` is better for the family): *reproduced* when the
    CI lies on the claimed side of 0, *contradicted* when it lies on the other side, *not resolved*
    otherwise;
  - ``"equivalent"`` claims with a margin ``m`` declared before the run: *reproduced* when the CI
    lies inside ``(-m, m)``, *contradicted* when it lies entirely outside ``[-m, m]``, *not
    resolved* otherwise;
  - ``"not_worse"`` claims (non-inferiority, margin ``m``, ``better`` = the direction that is
    good): *reproduced* when the CI lies above ``-m`` (sign-adjusted), *contradicted* when it lies
    entirely below ``-m``, *not resolved* otherwise;
  - ``"below"`` / ``"above"`` a fixed level (one sample, e.g. the mean support size of sparsemax
    below the number of classes): the same rule on the CI of the mean itself.

With fewer than two pairs there is no CI and the verdict is *not resolved*.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

REPRODUCED = "reproduced"
CONTRADICTED = "contradicted"
NOT_RESOLVED = "not resolved"

KINDS = ("higher", "lower", "equivalent", "not_worse", "below", "above")
METHODS = ("t", "bootstrap")


@dataclass(frozen=True)
class Interval:
    """Mean, sd, n and a CI of a sample (paired differences or one arm's values)."""

    n: int
    mean: float
    sd: float
    low: float
    high: float
    method: str
    confidence: float
    mde: float  # minimum detectable effect at 80% power (two-sided paired t, alpha = 1 - confidence)

    def as_dict(self) -> dict:
        return asdict(self)


def _t():
    from scipy import stats

    return stats


def mean_sd(xs: Sequence[float]) -> Tuple[float, float, int]:
    """``(mean, sample sd (ddof 1), n)``; ``nan`` where undefined."""
    x = np.asarray(list(xs), dtype=float)
    n = int(x.size)
    if n == 0:
        return float("nan"), float("nan"), 0
    return float(x.mean()), (float(x.std(ddof=1)) if n > 1 else float("nan")), n


def _two_sided_power(crit: float, df: int, delta: float) -> float:
    """``P(|T| > crit)`` for ``T`` noncentral t with ``df`` degrees of freedom and noncentrality
    ``delta``. scipy's ``nct`` returns ``nan`` in parts of the range at ``df == 1`` (two pairs), so a
    non-finite value falls back to integrating ``T = (Z + delta) / (X / sqrt(df))`` over the chi
    distribution of ``X``."""
    st = _t()
    p = float(st.nct.sf(crit, df, delta) + st.nct.cdf(-crit, df, delta))
    if math.isfinite(p):
        return p
    from scipy.integrate import quad

    root = math.sqrt(df)

    def integrand(x: float) -> float:
        c = crit * x / root
        return float(st.chi.pdf(x, df) * (st.norm.sf(c - delta) + st.norm.cdf(-c - delta)))

    val, _ = quad(integrand, 0.0, math.inf, epsabs=1e-13, epsrel=1e-11, limit=200)
    return float(val)


def minimum_detectable_effect(sd: float, n: int, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest true mean difference a two-sided one-sample (paired) t test at ``alpha`` detects
    with probability ``power``, for ``n`` pairs whose differences have sd ``sd``.

    Solves ``P(|T| > t_{1 - alpha/2, n-1}) = power`` for the noncentrality ``delta = MDE sqrt(n) / sd``
    of the noncentral t distribution with ``n - 1`` degrees of freedom. ``nan`` for ``n < 2`` or a
    non-finite sd; 0 when ``sd == 0``."""
    if n < 2 or not math.isfinite(sd):
        return float("nan")
    if sd == 0.0:
        return 0.0
    st = _t()
    from scipy.optimize import brentq

    df = n - 1
    crit = st.t.ppf(1.0 - alpha / 2.0, df)

    def gap(delta: float) -> float:
        return _two_sided_power(crit, df, delta) - power

    hi = 1.0
    while gap(hi) < 0.0:
        hi *= 2.0
    delta = brentq(gap, 0.0, hi, xtol=1e-12)
    return float(delta * sd / math.sqrt(n))


def interval(xs: Sequence[float], *, method: str = "t", confidence: float = 0.95, n_boot: int = 10000,
             seed: int = 0) -> Interval:
    """Mean of ``xs`` with a ``confidence`` CI (paired t or percentile bootstrap) and the MDE."""
    if method not in METHODS:
        raise ValueError(f"interval: method must be one of {METHODS} (got {method!r})")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"interval: confidence must be in (0, 1) (got {confidence!r})")
    m, s, n = mean_sd(xs)
    alpha = 1.0 - confidence
    mde = minimum_detectable_effect(s, n, alpha=alpha)
    if n < 2:
        return Interval(n, m, s, float("nan"), float("nan"), method, confidence, mde)
    if method == "t":
        half = _t().t.ppf(1.0 - alpha / 2.0, n - 1) * s / math.sqrt(n)
        return Interval(n, m, s, m - half, m + half, method, confidence, mde)
    x = np.asarray(list(xs), dtype=float)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, n, size=(n_boot, n))].mean(axis=1)
    low, high = np.quantile(means, [alpha / 2.0, 1.0 - alpha / 2.0])
    return Interval(n, m, s, float(low), float(high), method, confidence, mde)


def paired_differences(family: Mapping[int, float], baseline: Mapping[int, float]) -> Dict[int, float]:
    """``{seed: family[seed] - baseline[seed]}`` over the seeds both arms have (finite values)."""
    out = {}
    for seed in sorted(set(family) & set(baseline)):
        f, b = float(family[seed]), float(baseline[seed])
        if math.isfinite(f) and math.isfinite(b):
            out[seed] = f - b
    return out


def verdict(kind: str, ci: Interval, *, margin: Optional[float] = None, level: Optional[float] = None) -> str:
    """The verdict of one check from its CI (rules in the module docstring).

    ``ci`` is the interval of the paired differences ``family - baseline`` (``higher``, ``lower``,
    ``equivalent``, ``not_worse``, ``not_worse_lower``), or of the family's values (``below``,
    ``above`` a ``level``). ``not_worse`` is for metrics where higher is better (the difference must
    stay above ``-margin``), ``not_worse_lower`` for metrics where lower is better (below
    ``+margin``)."""
    if ci.n < 2 or not (math.isfinite(ci.low) and math.isfinite(ci.high)):
        return NOT_RESOLVED
    lo, hi = ci.low, ci.high
    if kind == "higher":
        return REPRODUCED if lo > 0 else CONTRADICTED if hi < 0 else NOT_RESOLVED
    if kind == "lower":
        return REPRODUCED if hi < 0 else CONTRADICTED if lo > 0 else NOT_RESOLVED
    if kind in ("equivalent", "not_worse", "not_worse_lower"):
        if margin is None or not (margin > 0 and math.isfinite(margin)):
            raise ValueError(f"verdict: a {kind!r} claim needs a positive margin declared up front (got {margin!r})")
        if kind == "equivalent":
            if -margin < lo and hi < margin:
                return REPRODUCED
            return CONTRADICTED if (lo > margin or hi < -margin) else NOT_RESOLVED
        if kind == "not_worse_lower":  # lower is better: not worse = difference below +margin
            lo, hi = -hi, -lo
        return REPRODUCED if lo > -margin else CONTRADICTED if hi < -margin else NOT_RESOLVED
    if kind in ("below", "above"):
        if level is None or not math.isfinite(level):
            raise ValueError(f"verdict: a {kind!r} claim needs a level (got {level!r})")
        if kind == "below":
            return REPRODUCED if hi < level else CONTRADICTED if lo > level else NOT_RESOLVED
        return REPRODUCED if lo > level else CONTRADICTED if hi < level else NOT_RESOLVED
    raise ValueError(f"verdict: unknown kind {kind!r}; choose one of {KINDS}")


def check(kind: str, family: Mapping[int, float], baseline: Optional[Mapping[int, float]] = None, *,
          better: str = "higher", margin: Optional[float] = None, level: Optional[float] = None,
          method: str = "t", confidence: float = 0.95, seed: int = 0) -> Tuple[str, Interval]:
    """Verdict and interval of one check from per-seed values ``{seed: value}``.

    ``kind``: ``higher`` / ``lower`` (the claimed direction of ``family - baseline``),
    ``equivalent`` (``margin``), ``not_worse`` (``margin``; ``better`` says which direction of the
    metric is good), ``below`` / ``above`` (a ``level``, family only)."""
    if kind in ("below", "above"):
        ci = interval([v for _, v in sorted(family.items()) if math.isfinite(float(v))], method=method,
                      confidence=confidence, seed=seed)
        return verdict(kind, ci, level=level), ci
    if baseline is None:
        raise ValueError(f"check: a {kind!r} claim needs a baseline")
    diffs = paired_differences(family, baseline)
    ci = interval(list(diffs.values()), method=method, confidence=confidence, seed=seed)
    k = kind
    if kind == "not_worse" and better == "lower":
        k = "not_worse_lower"
    return verdict(k, ci, margin=margin), ci


def claim_verdict(verdicts: Sequence[str]) -> str:
    """A claim with several checks: *reproduced* when every check is, *contradicted* when any is,
    else *not resolved*."""
    if verdicts and all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    if any(v == CONTRADICTED for v in verdicts):
        return CONTRADICTED
    return NOT_RESOLVED
