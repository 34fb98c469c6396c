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

Protocol revision 3 (:func:`evaluate_claim`) reads the same intervals differently: one **primary**
check per claim decides it; the other checks are **secondary**, adjusted with Holm's step-down
method within the claim (:func:`p_value` inverts the interval, :func:`holm` adjusts,
:func:`holm_confidence` gives each rank's interval) and never decide it; ``did`` checks read the
per-seed difference in differences (:func:`did_differences`); ``sanity`` checks (identities, levels
met by construction) say *holds* / *fails* and never count; an arm under the claim's competence
floor (:func:`competence_failures`) makes the claim *invalid*; a non-inferior result whose CI lies
on the worse side of 0 is flagged (:func:`flag`); and :func:`decidable` (CI half-width against the
margin, or the paper's effect) replaces the MDE in the reports.

Two revision-3 rules read the runs rather than the differences: :func:`test_split_problem` flags a
claim whose evaluation runs were tested on more than one test split (each run records its split's
fingerprint), and :func:`budget_limited` marks a claim whose primary baseline's validation curve
was still rising at the end of the step budget.
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
    means = _boot_means(np.asarray(list(xs), dtype=float), n_boot, seed)
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


# ------------------------------------------------------------------------------------------------
# revision 3: one primary check per claim, Holm-adjusted secondary checks, non-inferiority flags,
# difference-in-differences, sanity checks, the competence gate and "decidable at this n"
# ------------------------------------------------------------------------------------------------
INVALID = "invalid"
HOLDS = "holds"  # sanity checks: the identity / level a loss meets by construction holds ...
FAILS = "fails"  # ... or fails; never counted as a reproduction
NOT_WORSE_BUT_WORSE = "not worse by the margin, but worse"
WITHIN_BUT_DIFFERENT = "within the margin, but different"

REV3_KINDS = KINDS + ("did", "sanity")
SANITY_RULES = ("higher", "lower", "equivalent", "not_worse", "below", "above")


def _boot_means(x: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """``n_boot`` means of resamples (with replacement) of ``x`` drawn from ``seed``: the draws of
    :func:`interval`'s percentile bootstrap, which :func:`p_value` inverts with the same resamples."""
    rng = np.random.default_rng(seed)
    return x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)


def _p_side(x: np.ndarray, c: float, side: str, method: str, n_boot: int, seed: int) -> float:
    """The smallest ``alpha`` at which the two-sided ``1 - alpha`` interval of the mean of ``x`` lies
    strictly above ``c`` (``side="above"``) or strictly below it (``"below"``), capped at 1.

    Paired t: ``2 * P(T > (mean - c) / se)`` (above), ``2 * P(T < (mean - c) / se)`` (below), ``T`` t
    with ``n - 1`` degrees of freedom; with ``sd == 0`` the interval is the point ``mean``: 0 when it
    lies on that side, else 1. Bootstrap: twice the share of resampled means on the wrong side of
    ``c`` (the percentile interval's tail)."""
    n = x.size
    m = float(x.mean())
    if method == "bootstrap":
        means = _boot_means(x, n_boot, seed)
        wrong = float((means <= c).mean()) if side == "above" else float((means >= c).mean())
        return min(1.0, 2.0 * wrong)
    sd = float(x.std(ddof=1))
    if sd == 0.0:
        ok = m > c if side == "above" else m < c
        return 0.0 if ok else 1.0
    t = (m - c) / (sd / math.sqrt(n))
    st = _t()
    p = 2.0 * (st.t.sf(t, n - 1) if side == "above" else st.t.cdf(t, n - 1))
    return float(min(1.0, p))


def p_value(kind: str, xs: Sequence[float], *, margin: Optional[float] = None, level: Optional[float] = None,
            method: str = "t", n_boot: int = 10000, seed: int = 0) -> float:
    """The p-value of a check for its claimed side: the smallest ``alpha`` at which the ``1 - alpha``
    interval of ``xs`` gives the verdict *reproduced* under the rule of ``kind`` (the interval
    inverted, so ``p < alpha`` exactly when the ``1 - alpha`` interval reproduces). ``xs`` are the
    paired differences (``higher``, ``lower``, ``equivalent``, ``not_worse``, ``not_worse_lower``)
    or the family's values (``below`` / ``above`` a ``level``). ``nan`` with fewer than 2 values."""
    x = np.asarray([v for v in xs if math.isfinite(float(v))], dtype=float)
    if x.size < 2:
        return float("nan")
    args = dict(method=method, n_boot=n_boot, seed=seed)
    if kind == "higher":
        return _p_side(x, 0.0, "above", **args)
    if kind == "lower":
        return _p_side(x, 0.0, "below", **args)
    if kind == "not_worse":
        return _p_side(x, -float(margin), "above", **args)
    if kind == "not_worse_lower":
        return _p_side(x, float(margin), "below", **args)
    if kind == "equivalent":
        return max(_p_side(x, -float(margin), "above", **args), _p_side(x, float(margin), "below", **args))
    if kind == "above":
        return _p_side(x, float(level), "above", **args)
    if kind == "below":
        return _p_side(x, float(level), "below", **args)
    raise ValueError(f"p_value: unknown kind {kind!r}")


def holm(pvalues: Sequence[float]) -> Tuple[list, list]:
    """Holm's step-down adjustment of ``m`` p-values: ``(adjusted, ranks)``.

    The p-values are ordered ascending (ties: the given order), ``p_(1) <= ... <= p_(m)``; the
    adjusted value of the ``r``-th is ``min(1, max_{j <= r} (m - j + 1) p_(j))``, so it never falls
    along the order. ``ranks[i]`` is the 1-based rank of ``pvalues[i]``. ``nan`` p-values (no
    interval) are ranked last and stay ``nan``."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: (not math.isfinite(pvalues[i]), pvalues[i] if math.isfinite(pvalues[i])
                                            else 0.0, i))
    adjusted = [float("nan")] * m
    ranks = [0] * m
    running = 0.0
    for r, i in enumerate(order, start=1):
        ranks[i] = r
        p = pvalues[i]
        if not math.isfinite(p):
            continue
        running = max(running, min(1.0, (m - r + 1) * p))
        adjusted[i] = running
    return adjusted, ranks


def holm_confidence(rank: int, m: int, confidence: float = 0.95) -> float:
    """The confidence of the Holm-adjusted interval of the check ranked ``rank`` (1-based) among
    ``m``: ``1 - alpha / (m - rank + 1)`` with ``alpha = 1 - confidence``."""
    return 1.0 - (1.0 - confidence) / (m - rank + 1)


def did_differences(family_stress: Mapping[int, float], baseline_stress: Mapping[int, float],
                    family_clean: Mapping[int, float], baseline_clean: Mapping[int, float]) -> Dict[int, float]:
    """Difference in differences per seed: ``(family - baseline) under the stress minus (family -
    baseline) clean``, over the seeds all four have (finite values). Positive: the family's
    advantage grows (or its deficit shrinks) under the stress."""
    stress = paired_differences(family_stress, baseline_stress)
    clean = paired_differences(family_clean, baseline_clean)
    return {s: stress[s] - clean[s] for s in sorted(set(stress) & set(clean))}


def competence_failures(arms: Mapping[str, Mapping[int, float]], floor) -> list:
    """The arms that do not beat ``floor``: ``[(arm, mean, floor mean)]``.

    ``arms``: ``{arm: {seed: value}}`` of one metric (higher is better). ``floor``: a number, or
    ``{arm: {seed: value}}`` of a no-training / fixed-projection result column computed by the same
    run on the same split (each arm is compared with its own runs' floor column). An arm passes
    when its mean over its seeds is strictly above the floor's mean; an arm without values (or
    without floor values) is neither passed nor failed (it is not in the list: the check itself has
    no data)."""
    out = []
    for arm, vals in arms.items():
        v = [float(x) for x in vals.values() if math.isfinite(float(x))]
        if not v:
            continue
        if isinstance(floor, Mapping):
            fl = [float(x) for s, x in (floor.get(arm) or {}).items() if s in vals and math.isfinite(float(x))]
            if not fl:
                continue
            f = sum(fl) / len(fl)
        else:
            f = float(floor)
        m = sum(v) / len(v)
        if not m > f:
            out.append((arm, m, f))
    return out


def decidable(ci: Interval, *, margin: Optional[float] = None, effect: Optional[float] = None) -> Tuple[Optional[bool], str]:
    """Whether this n can decide the check: the CI's half-width against the declared margin, or,
    without one, against the effect the paper reports (``effect``). ``(None, reason)`` when there
    is no interval or neither reference is declared; else ``(half < reference, text)``."""
    if ci.n < 2 or not (math.isfinite(ci.low) and math.isfinite(ci.high)):
        return None, "no interval"
    half = (ci.high - ci.low) / 2.0
    if margin is not None:
        ref, name = abs(float(margin)), "margin"
    elif effect is not None:
        ref, name = abs(float(effect)), "paper's effect"
    else:
        return None, f"half-width {half:.4f}; no margin or paper effect declared"
    ok = bool(half < ref)
    return ok, f"half-width {half:.4f} {'<' if ok else '>='} {name} {ref:g}"


def flag(kind: str, ci: Interval, *, better: str = "higher") -> Optional[str]:
    """The note of a margin check whose interval passes the margin but excludes 0 on one side:
    ``not_worse`` whose CI lies entirely on the worse side of 0 (:data:`NOT_WORSE_BUT_WORSE`),
    ``equivalent`` whose CI excludes 0 (:data:`WITHIN_BUT_DIFFERENT`). ``None`` otherwise."""
    if ci.n < 2 or not (math.isfinite(ci.low) and math.isfinite(ci.high)):
        return None
    if kind == "not_worse":
        worse = ci.high < 0 if better == "higher" else ci.low > 0
        return NOT_WORSE_BUT_WORSE if worse else None
    if kind == "equivalent":
        return WITHIN_BUT_DIFFERENT if (ci.high < 0 or ci.low > 0) else None
    return None


@dataclass(frozen=True)
class CheckInput:
    """One check of a claim, its sample already formed: the paired differences (``higher``,
    ``lower``, ``equivalent``, ``not_worse``), the differences in differences (``did``) or the
    family's values (``below`` / ``above``). ``kind="sanity"`` checks carry their ``rule`` (one of
    :data:`SANITY_RULES`). ``better``: the direction of the metric that is good (``not_worse`` and
    ``did``)."""

    name: str
    kind: str
    values: Tuple[float, ...]
    primary: bool = False
    rule: Optional[str] = None
    better: str = "higher"
    margin: Optional[float] = None
    level: Optional[float] = None
    effect: Optional[float] = None


@dataclass(frozen=True)
class CheckResult:
    name: str
    kind: str
    rule: str  # the rule the verdict is read with (higher | lower | equivalent | not_worse | ...)
    role: str  # "primary" | "secondary" | "sanity"
    verdict: str
    ci: Interval  # at the nominal confidence
    reported_ci: Interval  # the interval the verdict was read from (Holm-adjusted for secondary checks)
    p: float
    p_adjusted: float  # Holm within the claim's secondary checks; = p for primary and sanity checks
    rank: int  # Holm rank among the secondary checks (0 for primary / sanity)
    flag: Optional[str]
    decidable: Optional[bool]
    decidable_text: str


@dataclass(frozen=True)
class ClaimResult:
    verdict: str  # the primary check's verdict, INVALID when an arm is under its floor
    primary: Optional[CheckResult]
    checks: Tuple[CheckResult, ...]
    invalid_arms: Tuple[Tuple[str, str, float, float], ...]  # (arm, metric, its mean, the floor)
    sanity: bool  # the primary check is a sanity check: a claim reported in the sanity section
    split_problem: Optional[str] = None  # more than one recorded test split: the claim is INVALID

    def verdict_text(self) -> str:
        if self.verdict == INVALID:
            why = []
            if self.invalid_arms:
                names = ", ".join(dict.fromkeys(a for a, *_ in self.invalid_arms))
                why.append(f"arm {names} did not train")
            if self.split_problem:
                why.append(f"test split not fixed: {self.split_problem}")
            return f"invalid ({'; '.join(why)})"
        return self.verdict


def _rule(ch: CheckInput) -> str:
    if ch.kind == "sanity":
        return ch.rule or ""
    if ch.kind == "did":
        return "higher" if ch.better == "higher" else "lower"
    return ch.kind


def _verdict_kind(rule: str, better: str) -> str:
    return "not_worse_lower" if rule == "not_worse" and better == "lower" else rule


def _sample_interval(values: Sequence[float], conf: float, method: str, n_boot: int, seed: int) -> Interval:
    return interval([v for v in values if math.isfinite(float(v))], method=method, confidence=conf,
                    n_boot=n_boot, seed=seed)


def evaluate_claim(checks: Sequence[CheckInput], *, invalid_arms: Sequence[Tuple[str, str, float, float]] = (),
                   method: str = "t", confidence: float = 0.95, n_boot: int = 10000, seed: int = 0,
                   test_splits: Optional[Mapping[Tuple[str, int], str]] = None) -> ClaimResult:
    """Revision-3 verdicts of one claim.

    * The **primary** check (exactly one) decides the claim: its verdict at the nominal
      ``confidence``. A claim with an arm under its competence floor (``invalid_arms``) is
      :data:`INVALID` whatever its checks say, and so is a claim whose evaluation runs recorded
      more than one test split (``test_splits``: ``{(arm, seed): fingerprint}``, ``""`` where a
      run recorded none; runs that recorded nothing are no evidence either way and leave the
      verdict as it is, :func:`test_split_problem` names them).
    * **Secondary** checks (every other check but sanity ones) are reported with Holm's step-down
      adjustment within the claim: each check's p-value for its claimed side (:func:`p_value`) is
      adjusted over the ``m`` secondary checks (:func:`holm`); the check ranked ``r`` is shown
      with its interval at confidence ``1 - alpha / (m - r + 1)``. Its verdict: *reproduced* when
      the adjusted p-value is below ``alpha`` (the step-down order enforced), *contradicted* when
      its adjusted interval lies on the other side (or outside the margin), else *not resolved*.
      They never decide the claim.
    * **Sanity** checks (identities, levels met by construction) are read at the nominal
      confidence and say :data:`HOLDS` / :data:`FAILS` / *not resolved*; they never count as
      reproductions and take no part in Holm's adjustment. A claim whose primary check is a
      sanity check is a sanity claim (``ClaimResult.sanity``).
    """
    primaries = [c for c in checks if c.primary]
    if len(primaries) != 1:
        raise ValueError(f"evaluate_claim: exactly one check must be primary (got {len(primaries)})")
    alpha = 1.0 - confidence
    secondary = [i for i, c in enumerate(checks) if not c.primary and c.kind != "sanity"]
    pv = {}
    for i, c in enumerate(checks):
        rule = _rule(c)
        pv[i] = p_value(_verdict_kind(rule, c.better), c.values, margin=c.margin, level=c.level, method=method,
                        n_boot=n_boot, seed=seed)
    adjusted, ranks = holm([pv[i] for i in secondary])
    adj = {i: (a, r) for i, a, r in zip(secondary, adjusted, ranks)}
    m = len(secondary)
    out = []
    for i, c in enumerate(checks):
        rule = _rule(c)
        vk = _verdict_kind(rule, c.better)
        ci = _sample_interval(c.values, confidence, method, n_boot, seed)
        role = "primary" if c.primary else "sanity" if c.kind == "sanity" else "secondary"
        if role == "secondary":
            p_adj, rank = adj[i]
            shown = _sample_interval(c.values, holm_confidence(rank, m, confidence), method, n_boot, seed)
            v = verdict(vk, shown, margin=c.margin, level=c.level)
            if v == REPRODUCED and not (math.isfinite(p_adj) and p_adj < alpha):
                v = NOT_RESOLVED  # Holm's step-down stopped before this check
        else:
            p_adj, rank, shown = pv[i], 0, ci
            v = verdict(vk, ci, margin=c.margin, level=c.level)
            if c.kind == "sanity":
                v = HOLDS if v == REPRODUCED else FAILS if v == CONTRADICTED else NOT_RESOLVED
        fl = flag(rule, shown, better=c.better) if v in (REPRODUCED, HOLDS) else None
        dec, dec_text = decidable(ci, margin=c.margin, effect=c.effect)
        out.append(CheckResult(c.name, c.kind, rule, role, v, ci, shown, pv[i], p_adj, rank, fl, dec, dec_text))
    prim = next(r for r in out if r.role == "primary")
    is_sanity = next(c for c in checks if c.primary).kind == "sanity"
    recorded = {f for f in (test_splits or {}).values() if f}
    split_problem = test_split_problem(test_splits) if len(recorded) > 1 else None
    v = INVALID if invalid_arms or split_problem else prim.verdict
    return ClaimResult(v, prim, tuple(out), tuple(tuple(x) for x in invalid_arms), is_sanity, split_problem)


# ------------------------------------------------------------------------------------------------
# revision 3: the runs behind a claim
# ------------------------------------------------------------------------------------------------
def test_split_problem(fingerprints: Mapping[Tuple[str, int], str]) -> Optional[str]:
    """The problem with a claim's test splits, or ``None`` when every evaluation run was tested on one
    split. ``fingerprints``: ``{(arm, seed): test-split fingerprint}`` of the claim's evaluation runs
    (``""``: not recorded). The text names how many splits there are, the seeds whose arms were
    tested on different splits (the pairing itself is broken there) and the runs that recorded none."""
    fps = {k: v for k, v in fingerprints.items() if v}
    missing = sorted(k for k, v in fingerprints.items() if not v)
    parts = []
    distinct = sorted(set(fps.values()))
    if len(distinct) > 1:
        parts.append(f"{len(distinct)} different test splits over {len(fps)} evaluation runs")
        seeds = sorted({s for _, s in fps})
        broken = [s for s in seeds if len({v for (a, t), v in fps.items() if t == s}) > 1]
        if broken:
            parts.append("arms of seed(s) " + ", ".join(str(s) for s in broken) + " tested on different splits")
    if missing and fps:
        parts.append(f"{len(missing)} of {len(fingerprints)} runs recorded no test split")
    return "; ".join(parts) or None


@dataclass(frozen=True)
class BudgetRule:
    """:func:`budget_limited`'s reading of one curve family: the mean last-epoch gain (in the good
    direction), the threshold it is compared with and what the threshold is, the number of curves and
    the verdict (``None``: not decidable, e.g. fewer than 2 epochs or no threshold)."""

    gain: float
    threshold: float
    basis: str
    n: int
    limited: Optional[bool]


def budget_limited(curves: Sequence[Sequence[Optional[float]]], *, better: str = "higher",
                   margin: Optional[float] = None, half_width: float = float("nan")) -> BudgetRule:
    """Whether a step budget cut a baseline short: its validation curves (one per seed, a value per
    epoch) still rose over the last epoch by more than the claim can resolve.

    Rule (revision 3): the gain of a curve is its last value minus the one before, sign-adjusted so
    that a gain is an improvement (``better="lower"``: a fall); ``gain`` is its mean over the curves
    with at least two finite values at the end. The threshold is the primary check's margin where it
    declares one, else half the primary check's CI half-width. *Budget-limited* when the mean gain
    exceeds the threshold: one more epoch would have moved the baseline by more than the comparison's
    resolution, so the claim compares arms before they converged."""
    sign = 1.0 if better == "higher" else -1.0
    gains = []
    for c in curves:
        vals = [v for v in c]
        if len(vals) >= 2 and all(v is not None and math.isfinite(v) for v in vals[-2:]):
            gains.append(sign * (vals[-1] - vals[-2]))
    gain = float(np.mean(gains)) if gains else float("nan")
    if margin is not None and margin > 0:
        threshold, basis = float(margin), "the margin"
    elif math.isfinite(half_width):
        threshold, basis = 0.5 * half_width, "0.5 x the CI half-width"
    else:
        threshold, basis = float("nan"), "no margin and no CI"
    limited = bool(gain > threshold) if math.isfinite(gain) and math.isfinite(threshold) else None
    return BudgetRule(gain=gain, threshold=threshold, basis=basis, n=len(gains), limited=limited)
