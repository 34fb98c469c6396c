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

Protocol revision 4 adds, without changing any revision-3 result (new functions, and new arguments
whose defaults leave the old ones as they were):

* two verdicts that say a claim was not tested, both kept out of the headline
  (:func:`headline_counts`): *not applicable here* (:data:`NOT_APPLICABLE`, a reason declared
  before the runs) and *not tested* (:data:`NOT_TESTED`, a :class:`ManipulationCheck` -- an
  absolute level on one arm that shows the intervention acted -- failed);
* margins declared relative to the baseline's error (:func:`resolve_margin`), so that a margin of
  one point at 98% accuracy cannot let the error grow by half;
* a percentile bootstrap over seeds and test items together (:func:`two_level_bootstrap`, and
  its p-value for a check's claimed side, :func:`two_level_p_value`) for per-item scores on one
  shared test split;
* Benjamini-Hochberg across claims (:func:`benjamini_hochberg`, :func:`claims_fdr`).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

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


def capped(loss: float, cap: float) -> float:
    """A sweep run's final loss as the sensitivity reads it: ``min(loss, cap)``, and ``cap`` where it is
    not finite (the run diverged)."""
    return min(float(loss), float(cap)) if math.isfinite(float(loss)) else float(cap)


def lr_sensitivity(losses: Sequence[float], cap: float) -> float:
    """The learning-rate sensitivity of one sweep (Wortsman et al. 2023, "Small-scale proxies for
    large-scale Transformer training instabilities"): over the sweep's final losses ``l(eta)`` (one
    per learning rate), ``mean_eta min(l(eta), cap) - min_eta min(l(eta), cap)``, where ``cap`` is
    the loss at initialisation (the uniform prediction's, ``ln C`` for ``C`` classes): a run that
    diverged (a non-finite loss) or ended worse than it started counts as ``cap``. 0 when every
    learning rate reaches the same loss; larger when the loss depends more on the learning rate.
    ``nan`` for an empty sweep."""
    vals = [capped(v, cap) for v in losses]
    if not vals:
        return float("nan")
    return sum(vals) / len(vals) - min(vals)


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
    ``did``).

    A margin is declared either in the metric's units (``margin``) or, from revision 4, relative to
    the baseline's error (``relative_margin`` with ``baseline_mean``, the baseline arm's mean over
    the seeds of the check; ``better`` then also says which error applies): :func:`resolve_margin`
    turns it into the absolute margin the check is read with, and :class:`CheckResult` reports it."""

    name: str
    kind: str
    values: Tuple[float, ...]
    primary: bool = False
    rule: Optional[str] = None
    better: str = "higher"
    margin: Optional[float] = None
    level: Optional[float] = None
    effect: Optional[float] = None
    relative_margin: Optional[float] = None
    baseline_mean: Optional[float] = None


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
    margin: Optional[float] = None  # the absolute margin the check was read with (declared or resolved)
    margin_basis: str = ""  # how it was obtained (:attr:`Margin.basis`); "" without a margin
    # revision 4: the two-level bootstrap over seeds and test items at the nominal confidence (None:
    # not computed) and which interval the verdict was read from ("seeds" or "seeds x items")
    item_ci: Optional[Interval] = None
    read_from: str = "seeds"


@dataclass(frozen=True)
class ClaimResult:
    verdict: str  # the primary check's verdict, INVALID when an arm is under its floor
    primary: Optional[CheckResult]
    checks: Tuple[CheckResult, ...]
    invalid_arms: Tuple[Tuple[str, str, float, float], ...]  # (arm, metric, its mean, the floor)
    sanity: bool  # the primary check is a sanity check: a claim reported in the sanity section
    split_problem: Optional[str] = None  # more than one recorded test split: the claim is INVALID
    not_applicable: Optional[str] = None  # the reason declared before the runs: NOT_APPLICABLE
    manipulation: Tuple[ManipulationResult, ...] = ()  # every manipulation check, passed or failed

    def failed_manipulation(self) -> Tuple[ManipulationResult, ...]:
        """The manipulation checks that failed (a claim with any is :data:`NOT_TESTED`)."""
        return tuple(m for m in self.manipulation if not m.passed)

    def verdict_text(self) -> str:
        if self.verdict == NOT_APPLICABLE:
            return f"{NOT_APPLICABLE} ({self.not_applicable})"
        if self.verdict == NOT_TESTED:
            return f"{NOT_TESTED} ({'; '.join(m.text() for m in self.failed_manipulation())})"
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
    if ch.kind == "lr_sensitivity":  # the family's sensitivity minus the baseline's, claimed below 0
        return "lower"
    return ch.kind


def _verdict_kind(rule: str, better: str) -> str:
    return "not_worse_lower" if rule == "not_worse" and better == "lower" else rule


def _sample_interval(values: Sequence[float], conf: float, method: str, n_boot: int, seed: int) -> Interval:
    return interval([v for v in values if math.isfinite(float(v))], method=method, confidence=conf,
                    n_boot=n_boot, seed=seed)


def evaluate_claim(checks: Sequence[CheckInput], *, invalid_arms: Sequence[Tuple[str, str, float, float]] = (),
                   method: str = "t", confidence: float = 0.95, n_boot: int = 10000, seed: int = 0,
                   test_splits: Optional[Mapping[Tuple[str, int], str]] = None,
                   manipulation: Sequence[ManipulationCheck] = (),
                   not_applicable: Optional[str] = None,
                   item_intervals: Optional[Mapping[str, Tuple[Interval, float]]] = None) -> ClaimResult:
    """Revision-3 verdicts of one claim, with revision 4's two verdicts that are not a test's outcome.

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
    * Margins: a check's ``margin``, or the absolute margin its ``relative_margin`` resolves to
      from ``baseline_mean`` (:func:`resolve_margin`), reported in ``CheckResult.margin``.

    Revision 4 (both arguments default to nothing, which leaves the revision-3 result unchanged):

    * ``not_applicable``: a reason declared in the claims file before the runs (e.g. the metric is
      at its ceiling in this setting). The claim's verdict is :data:`NOT_APPLICABLE` whatever its
      checks and runs say; the checks are still evaluated so that their numbers are reported (a
      claim declared not applicable may also come with no checks at all).
    * ``manipulation``: :class:`ManipulationCheck` s, absolute levels on one arm that show the
      intervention acted (:func:`manipulation_result`). When any fails, the claim's verdict is
      :data:`NOT_TESTED`; every result is in ``ClaimResult.manipulation``.

    * ``item_intervals``: ``{check name: (interval, p)}``, a paired check's
      :func:`two_level_bootstrap` interval over seeds and test items at the nominal confidence and
      its :func:`two_level_p_value`. The **primary** check's verdict is read from the wider of its
      seed interval and this one (the p-value is the larger of the two); every other check reports
      it beside its own (``CheckResult.item_ci``) and is read as before.

    Precedence: *not applicable here* (declared before the runs), then *invalid* (an arm did not
    train, the test split was not fixed: the runs cannot be read), then *not tested* (the runs are
    sound but the intervention did not act), then the primary check's verdict.
    """
    if not_applicable is not None and not (isinstance(not_applicable, str) and not_applicable.strip()):
        raise ValueError(f"evaluate_claim: not_applicable must be the declared reason, a non-empty string "
                         f"(got {not_applicable!r})")
    manip = tuple(manipulation_result(m) for m in manipulation)
    if not_applicable is not None and not checks:
        return ClaimResult(NOT_APPLICABLE, None, (), tuple(tuple(x) for x in invalid_arms), False, None,
                           not_applicable, manip)
    primaries = [c for c in checks if c.primary]
    if len(primaries) != 1:
        raise ValueError(f"evaluate_claim: exactly one check must be primary (got {len(primaries)})")
    alpha = 1.0 - confidence
    secondary = [i for i, c in enumerate(checks) if not c.primary and c.kind != "sanity"]
    margins = [resolve_margin(margin=c.margin, relative=c.relative_margin, baseline_mean=c.baseline_mean,
                              better=c.better) for c in checks]
    pv = {}
    for i, c in enumerate(checks):
        rule = _rule(c)
        pv[i] = p_value(_verdict_kind(rule, c.better), c.values, margin=margins[i].margin, level=c.level,
                        method=method, n_boot=n_boot, seed=seed)
    adjusted, ranks = holm([pv[i] for i in secondary])
    adj = {i: (a, r) for i, a, r in zip(secondary, adjusted, ranks)}
    m = len(secondary)
    out = []
    for i, c in enumerate(checks):
        rule = _rule(c)
        vk = _verdict_kind(rule, c.better)
        mg = margins[i].margin
        ci = _sample_interval(c.values, confidence, method, n_boot, seed)
        role = "primary" if c.primary else "sanity" if c.kind == "sanity" else "secondary"
        if role == "secondary":
            p_adj, rank = adj[i]
            shown = _sample_interval(c.values, holm_confidence(rank, m, confidence), method, n_boot, seed)
            v = verdict(vk, shown, margin=mg, level=c.level)
            if v == REPRODUCED and not (math.isfinite(p_adj) and p_adj < alpha):
                v = NOT_RESOLVED  # Holm's step-down stopped before this check
        else:
            p_adj, rank, shown = pv[i], 0, ci
            v = verdict(vk, ci, margin=mg, level=c.level)
            if c.kind == "sanity":
                v = HOLDS if v == REPRODUCED else FAILS if v == CONTRADICTED else NOT_RESOLVED
        item = (item_intervals or {}).get(c.name)
        item_ci, read_from, p_i = (item[0], "seeds", pv[i]) if item else (None, "seeds", pv[i])
        if item and role == "primary" and _wider(item[0], ci):
            shown, read_from = item[0], "seeds x items"
            v = verdict(vk, shown, margin=mg, level=c.level)
        if item and role == "primary" and math.isfinite(item[1]):
            p_i = max(pv[i], float(item[1])) if math.isfinite(pv[i]) else float(item[1])
            p_adj = p_i
        fl = flag(rule, shown, better=c.better) if v in (REPRODUCED, HOLDS) else None
        dec, dec_text = decidable(shown if read_from != "seeds" else ci, margin=mg, effect=c.effect)
        out.append(CheckResult(c.name, c.kind, rule, role, v, ci, shown, p_i, p_adj, rank, fl, dec, dec_text,
                               mg, margins[i].basis, item_ci, read_from))
    prim = next(r for r in out if r.role == "primary")
    is_sanity = next(c for c in checks if c.primary).kind == "sanity"
    recorded = {f for f in (test_splits or {}).values() if f}
    split_problem = test_split_problem(test_splits) if len(recorded) > 1 else None
    v = INVALID if invalid_arms or split_problem else prim.verdict
    if not_applicable is not None:
        v = NOT_APPLICABLE
    elif v != INVALID and any(not m.passed for m in manip):
        v = NOT_TESTED
    return ClaimResult(v, prim, tuple(out), tuple(tuple(x) for x in invalid_arms), is_sanity, split_problem,
                       not_applicable, manip)


def _wider(a: Interval, b: Interval) -> bool:
    """Whether interval ``a`` is finite and wider than ``b`` (or ``b`` has no finite bounds)."""
    if not (math.isfinite(a.low) and math.isfinite(a.high)):
        return False
    if not (math.isfinite(b.low) and math.isfinite(b.high)):
        return True
    return (a.high - a.low) > (b.high - b.low)


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


# ------------------------------------------------------------------------------------------------
# revision 4: verdicts that say what was tested (not applicable here, not tested), margins relative
# to the baseline's error, the two-level bootstrap over seeds and test items, Benjamini-Hochberg
# across claims
# ------------------------------------------------------------------------------------------------
NOT_APPLICABLE = "not applicable here"  # declared before the runs: the claim cannot be tested in this setting
NOT_TESTED = "not tested"  # a manipulation check failed: the intervention did not act in these runs
HEADLINE = (REPRODUCED, CONTRADICTED, NOT_RESOLVED, INVALID)  # the verdicts the headline counts
MANIPULATION_OPS = ("<", "<=", ">", ">=")
TWO_LEVEL = "bootstrap, seeds x items"  # Interval.method of :func:`two_level_bootstrap`
_BLOCK_INDICES = 2 ** 21  # resample indices drawn per block of :func:`two_level_bootstrap` (about 16 MB)


@dataclass(frozen=True)
class ManipulationCheck:
    """A check that the intervention acted in one arm: its per-seed ``values`` of ``metric`` must
    stand at an absolute ``level`` (``arm``'s mean ``op`` ``level``, ``op`` one of
    :data:`MANIPULATION_OPS`). Examples: the log-Z penalty arm's mean |log Z| ``<`` 1; the sampled
    fraction of Partial FC ``<`` 1; a sparse mapping's mean support ``<`` the number of classes; loss
    spikes ``>`` 0 in the unstable arm of a stability claim. The level is absolute, never the
    baseline arm's value: the question is whether the intervention happened, not whether it beat
    anything. ``values``: the arm's per-seed values (a sequence, or ``{seed: value}``)."""

    name: str
    metric: str
    arm: str
    op: str
    level: float
    values: Tuple[float, ...]


@dataclass(frozen=True)
class ManipulationResult:
    """:func:`manipulation_result`'s reading of a :class:`ManipulationCheck`: the arm's mean over its
    ``n`` seeds with finite values, the level and whether the mean passes it."""

    name: str
    metric: str
    arm: str
    op: str
    level: float
    mean: float
    n: int
    passed: bool

    def text(self) -> str:
        """E.g. ``"log Z small: mean |log Z| of penalty 1.37 (3 seeds), not < 1"``."""
        if self.n == 0:
            return f"{self.name}: no values of {self.metric} in {self.arm}"
        seeds = f"{self.n} seed{'s' if self.n != 1 else ''}"
        return (f"{self.name}: mean {self.metric} of {self.arm} {self.mean:.4g} ({seeds}), "
                f"{'' if self.passed else 'not '}{self.op} {self.level:g}")


def _values(xs) -> list:
    vals = xs.values() if isinstance(xs, Mapping) else xs
    return [float(v) for v in vals if v is not None and math.isfinite(float(v))]


def meets_level(value: float, op: str, level: float) -> bool:
    """``value op level`` for an ``op`` of :data:`MANIPULATION_OPS` (a manipulation check's and a
    gate's reading)."""
    return {"<": value < level, "<=": value <= level, ">": value > level, ">=": value >= level}[op]


def manipulation_result(check: ManipulationCheck) -> ManipulationResult:
    """Read one manipulation check. Rule: the arm's mean over its seeds (finite values) must satisfy
    ``mean op level``; no interval is used. The check asks whether the intervention acted at all, a
    question about a level the intervention is built to reach, so a point reading is the honest one:
    a confidence interval would turn an intervention that barely acted into "not shown to act"
    (or the reverse) by the seed count alone. The mean and the level are reported
    (:meth:`ManipulationResult.text`). An arm with no finite values fails: nothing shows that the
    intervention acted."""
    if check.op not in MANIPULATION_OPS:
        raise ValueError(f"manipulation check {check.name!r}: op must be one of {MANIPULATION_OPS} (got {check.op!r})")
    level = float(check.level)
    if not math.isfinite(level):
        raise ValueError(f"manipulation check {check.name!r}: the level must be a finite number (got {check.level!r})")
    v = _values(check.values)
    if not v:
        return ManipulationResult(check.name, check.metric, check.arm, check.op, level, float("nan"), 0, False)
    m = float(np.mean(v))
    passed = meets_level(m, check.op, level)
    return ManipulationResult(check.name, check.metric, check.arm, check.op, level, m, len(v), bool(passed))


@dataclass(frozen=True)
class Headline:
    """:func:`headline_counts`: the claims counted in the headline (``counts``, one entry per
    :data:`HEADLINE` verdict, and ``claims``, their names per verdict) and those listed apart:
    ``not_applicable`` (claim, declared reason), ``not_tested`` (claim, the failing manipulation
    checks) and ``sanity`` (claim, verdict text)."""

    counts: Dict[str, int]
    claims: Dict[str, Tuple[str, ...]]
    not_applicable: Tuple[Tuple[str, str], ...]
    not_tested: Tuple[Tuple[str, str], ...]
    sanity: Tuple[Tuple[str, str], ...]

    @property
    def total(self) -> int:
        """The number of claims in the headline."""
        return sum(self.counts.values())


def _named(results) -> list:
    return list(results.items()) if isinstance(results, Mapping) else [tuple(x) for x in results]


def headline_counts(results) -> Headline:
    """Tally claims for the headline. ``results``: ``{claim: ClaimResult}`` (or ``(claim, result)``
    pairs). Rule: a claim *not applicable here* or *not tested* is listed apart with its reason, a
    sanity claim (its primary check is a sanity check) is listed apart with its verdict, and every
    other claim counts under its verdict, one of *reproduced*, *contradicted*, *not resolved*,
    *invalid*. Only those four make the headline: a claim that was not, or could not be, tested is
    no evidence for or against the paper, and a sanity claim tests the implementation."""
    counts = {v: 0 for v in HEADLINE}
    claims = {v: [] for v in HEADLINE}
    na, nt, sanity = [], [], []
    for name, r in _named(results):
        if r.verdict == NOT_APPLICABLE:
            na.append((name, r.not_applicable or ""))
        elif r.verdict == NOT_TESTED:
            nt.append((name, "; ".join(m.text() for m in r.failed_manipulation())))
        elif r.sanity:
            sanity.append((name, r.verdict_text()))
        elif r.verdict in counts:
            counts[r.verdict] += 1
            claims[r.verdict].append(name)
        else:
            raise ValueError(f"headline_counts: claim {name!r} has verdict {r.verdict!r}, which is neither a "
                             f"headline verdict {HEADLINE} nor one listed apart")
    return Headline(counts, {v: tuple(c) for v, c in claims.items()}, tuple(na), tuple(nt), tuple(sanity))


@dataclass(frozen=True)
class Margin:
    """:func:`resolve_margin`: the absolute ``margin`` (metric units; ``None`` without one), the
    declared ``relative`` margin and the ``baseline_error`` it was applied to (``None`` for a margin
    declared in the metric's units) and a ``basis`` text for the reports."""

    margin: Optional[float]
    relative: Optional[float]
    baseline_error: Optional[float]
    basis: str


def resolve_margin(*, margin: Optional[float] = None, relative: Optional[float] = None,
                   baseline_mean: Optional[float] = None, better: str = "higher") -> Margin:
    """The absolute margin of a check declared either in the metric's units (``margin``, returned as
    it is) or relative to the baseline's error (``relative``; not both).

    The baseline's error ``e`` is ``1 - b`` for a metric where higher is better, which must then lie
    in [0, 1] (accuracy, recall@k), and ``b`` itself for a metric where lower is better, which must
    be >= 0 (an error rate, ECE, NLL), with ``b`` the baseline arm's mean over the check's seeds
    (``baseline_mean``). The absolute margin is ``m = relative * e``: a non-inferiority check then
    lets the family's error grow to at most ``(1 + relative) * e`` (higher is better: ``f - b >=
    -relative * (1 - b)``; lower is better: ``f - b <= relative * b``), an equivalence check keeps
    it within ``(1 +- relative) * e``. E.g. at 97.9% baseline accuracy a margin of 1 point would let
    the error grow from 2.1% to 3.1%, by 48%; ``relative=0.1`` gives ``m = 0.1 * 0.021 = 0.0021``.
    ``b`` is the observed mean, read as fixed: what is declared before the runs is ``relative``.
    A baseline error of 0 leaves no room for any margin and is refused."""
    if margin is not None and relative is not None:
        raise ValueError(f"resolve_margin: declare a margin either in the metric's units or relative to the "
                         f"baseline's error, not both (margin={margin!r}, relative={relative!r})")
    if relative is None:
        if margin is None:
            return Margin(None, None, None, "")
        return Margin(margin, None, None, "declared")
    r = float(relative)
    if not (r > 0 and math.isfinite(r)):
        raise ValueError(f"resolve_margin: the relative margin must be a positive number (got {relative!r})")
    if better not in ("higher", "lower"):
        raise ValueError(f"resolve_margin: better must be 'higher' or 'lower' (got {better!r})")
    b = float("nan") if baseline_mean is None else float(baseline_mean)
    if not math.isfinite(b):
        raise ValueError(f"resolve_margin: a relative margin needs the baseline's mean (got {baseline_mean!r})")
    if better == "higher":
        if not 0.0 <= b <= 1.0:
            raise ValueError(f"resolve_margin: a relative margin on a higher-is-better metric needs a metric in "
                             f"[0, 1], whose error is 1 - metric (baseline mean {b!r})")
        e, how = 1.0 - b, f"1 - mean {b:.4g}"
    else:
        if b < 0.0:
            raise ValueError(f"resolve_margin: a relative margin on a lower-is-better metric needs a metric >= 0, "
                             f"the error itself (baseline mean {b!r})")
        e, how = b, "its mean"
    if e == 0.0:
        raise ValueError(f"resolve_margin: the baseline's error is 0 (mean {b!r}): a relative margin leaves no room")
    m = r * e
    return Margin(m, r, e, f"{r:g} x the baseline's error {e:.4g} ({how}) = {m:.4g}")


def _score_rows(x, name: str) -> Dict[int, np.ndarray]:
    """``{seed: 1-D float array}`` of one arm's per-seed, per-item scores (a mapping, or a sequence /
    2-D array whose rows are the seeds), every row the same length and finite."""
    if isinstance(x, Mapping):
        rows = {k: np.asarray(v, dtype=float) for k, v in x.items()}
    else:
        if isinstance(x, np.ndarray) and x.ndim != 2:
            raise ValueError(f"two_level_bootstrap: {name} must be shaped (seeds, items) (got shape {x.shape})")
        rows = {k: np.asarray(v, dtype=float) for k, v in enumerate(x)}
    ref = None
    for k, v in rows.items():
        if v.ndim != 1:
            raise ValueError(f"two_level_bootstrap: {name}'s scores of seed {k} must be one value per test item "
                             f"(got shape {v.shape})")
        if ref is None:
            ref = (k, v.size)
        elif v.size != ref[1]:
            raise ValueError(f"two_level_bootstrap: {name} has {ref[1]} test items for seed {ref[0]} but {v.size} "
                             f"for seed {k}: every seed must be scored on the same test items")
        if not np.isfinite(v).all():
            raise ValueError(f"two_level_bootstrap: {name} has non-finite scores for seed {k}")
    return rows


def two_level_bootstrap(family, baseline, *, confidence: float = 0.95, n_boot: int = 10000, seed: int = 0,
                        block: Optional[int] = None, strata=None) -> Interval:
    """Percentile bootstrap CI of the mean paired difference over seeds and test items.

    ``family`` and ``baseline``: per-seed, per-item scores on the same test items (e.g. per-image
    correctness 0/1, per-query recall@20), shaped ``(seeds, items)`` (rows paired by position) or
    ``{seed: scores per item}`` (paired by seed; seeds in one arm only are dropped, as in
    :func:`paired_differences`). Item ``j`` must be the same test item in every row of both arms;
    rows of unequal length are refused (``ValueError`` naming the argument).

    With ``D[s, j] = family[s, j] - baseline[s, j]`` over ``S`` seeds and ``N`` items, the statistic
    is ``mean(D)``. A replicate draws ``S`` seeds with replacement and, independently, ``N`` items
    with replacement, and takes the mean of ``D`` over every (drawn seed, drawn item) pair. The one
    item resample is applied to both arms (the pairing by item is kept) and to every seed of the
    replicate: the test items are shared by the seeds (one fixed test split), so an item's
    difficulty is common to all seeds, and resampling it once per replicate keeps that crossed
    structure; resampling items per seed would treat the seeds as tested on independent items and
    understate the item variance. The interval is the ``(1 - confidence)/2`` and ``(1 +
    confidence)/2`` quantiles of the ``n_boot`` replicate means.

    RNG stream: ``np.random.default_rng(seed)``; the replicates are drawn in blocks of ``block``
    (default ``max(1, min(n_boot, 2**21 // (S + N)))``, a function of the shape only, so a result is
    reproducible anywhere); per block of ``r`` replicates the seed indices ``integers(0, S, (r, S))``
    are drawn first, then the item indices ``integers(0, N, (r, N))``. Each replicate's mean is
    computed from the draws' counts ``c`` (seeds) and ``w`` (items) as ``c @ D @ w / (S N)``, a
    block at a time, so memory stays at a few times ``block * (S + N)`` numbers. With one item per
    seed (``N = 1``, one block) the draws and the interval are those of :func:`interval`'s seed
    bootstrap of the per-seed differences.

    Returns an :class:`Interval`: ``n`` the number of seeds, ``mean`` the mean of ``D``, ``sd`` the
    sd (ddof 1) of the per-seed mean differences, ``method`` :data:`TWO_LEVEL` and ``mde`` ``nan``
    (no closed form for this design; :func:`decidable` reads the interval itself). With fewer than
    two seeds there is no interval (the seed-to-seed variation is not observed).

    ``strata``: for a metric that is a mean of per-class means (balanced accuracy, the accuracy over
    a group of classes), one integer label per item (its class). The statistic is then
    ``mean_h mean_{j in h} D[s, j]`` averaged over the seeds (every stratum weighs the same, whatever
    its size: the class mean), and a replicate resamples the items within each stratum (``n_h``
    draws among the stratum's ``n_h`` items), so every replicate keeps the test split's class
    counts, as the metric's definition needs. Per block the stream draws the seed indices first,
    then, for each stratum in ascending label order, ``integers(0, n_h, (r, n_h))``; the block size
    is the same function of ``S + N``. With one stratum the draws are those without strata;
    ``strata=None`` is the plain mean over items above, its stream unchanged."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"two_level_bootstrap: confidence must be in (0, 1) (got {confidence!r})")
    d = _two_level_differences(family, baseline)
    groups = _strata(strata, d.shape[1] if d.ndim == 2 else 0)
    nan = float("nan")
    if d.size == 0:
        return Interval(d.shape[0], nan, nan, nan, nan, TWO_LEVEL, confidence, nan)
    n_s = d.shape[0]
    if groups is None:
        mean = float(d.mean())
        per_seed = d.mean(axis=1)
    else:
        per_seed = d @ _stratum_weights(groups, d.shape[1])
        mean = float(per_seed.mean())
    sd = float(per_seed.std(ddof=1)) if n_s > 1 else nan
    if n_s < 2:
        return Interval(n_s, mean, sd, nan, nan, TWO_LEVEL, confidence, nan)
    means = _two_level_means(d, n_boot, seed, block, groups)
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2.0, 1.0 - alpha / 2.0])
    return Interval(n_s, mean, sd, float(low), float(high), TWO_LEVEL, confidence, nan)


def _two_level_differences(family, baseline) -> np.ndarray:
    """``D = family - baseline``, shaped ``(seeds, items)``, after :func:`two_level_bootstrap`'s checks
    of its arguments (``(0, 0)`` or ``(seeds, 0)`` when there is nothing to pair)."""
    if isinstance(family, Mapping) != isinstance(baseline, Mapping):
        raise ValueError("two_level_bootstrap: pass family and baseline both as {seed: scores} mappings (paired by "
                         "seed) or both as (seeds, items) arrays (paired by row), not one of each")
    fam, base = _score_rows(family, "family"), _score_rows(baseline, "baseline")
    if not isinstance(family, Mapping) and len(fam) != len(base):
        raise ValueError(f"two_level_bootstrap: family has {len(fam)} seeds and baseline {len(base)}: rows are "
                         f"paired by position (pass {{seed: scores}} mappings to pair by seed)")
    seeds = sorted(set(fam) & set(base))
    nf = next(iter(fam.values())).size if fam else 0
    nb = next(iter(base.values())).size if base else 0
    if fam and base and nf != nb:
        raise ValueError(f"two_level_bootstrap: family is scored on {nf} test items and baseline on {nb}: both arms "
                         f"must be scored on the same test items")
    if not seeds:
        return np.zeros((0, 0))
    return np.stack([fam[s] - base[s] for s in seeds])


_TWO_LEVEL_CACHE: Dict[tuple, np.ndarray] = {}


def _strata(strata, n_items: int) -> Optional[List[np.ndarray]]:
    """The item indices of each stratum, in ascending label order (``None``: no strata)."""
    if strata is None:
        return None
    lab = np.asarray(strata)
    if lab.ndim != 1 or lab.size != n_items:
        raise ValueError(f"two_level_bootstrap: strata must give one label per test item ({n_items}) "
                         f"(got shape {lab.shape})")
    if lab.dtype.kind not in "iub":
        raise TypeError(f"two_level_bootstrap: strata must be integer labels (got dtype {lab.dtype})")
    return [np.flatnonzero(lab == h) for h in np.unique(lab)]


def _stratum_weights(groups: List[np.ndarray], n_items: int) -> np.ndarray:
    """Per-item weights whose dot product with a row of ``D`` is the class-mean statistic:
    ``1 / (H n_h)`` for an item of stratum ``h`` of ``H``."""
    w = np.empty(n_items)
    for g in groups:
        w[g] = 1.0 / (len(groups) * g.size)
    return w


def _two_level_means(d: np.ndarray, n_boot: int, seed: int, block: Optional[int],
                     groups: Optional[List[np.ndarray]] = None) -> np.ndarray:
    """The ``n_boot`` replicate means of :func:`two_level_bootstrap` (its RNG stream and blocks),
    read-only; the last few are kept, since a check's interval and p-value resample the same ``D``."""
    gkey = None if groups is None else hashlib.sha1(b"|".join(g.astype(np.int64).tobytes() for g in groups)).hexdigest()
    key = (d.shape, d.dtype.str, hashlib.sha1(np.ascontiguousarray(d).tobytes()).hexdigest(), n_boot, seed, block,
           gkey)
    if key not in _TWO_LEVEL_CACHE:
        if len(_TWO_LEVEL_CACHE) >= 8:
            _TWO_LEVEL_CACHE.pop(next(iter(_TWO_LEVEL_CACHE)))
        means = _two_level_means_uncached(d, n_boot, seed, block, groups)
        means.flags.writeable = False
        _TWO_LEVEL_CACHE[key] = means
    return _TWO_LEVEL_CACHE[key]


def _two_level_means_uncached(d: np.ndarray, n_boot: int, seed: int, block: Optional[int],
                              groups: Optional[List[np.ndarray]] = None) -> np.ndarray:
    if int(n_boot) != n_boot or n_boot < 1:
        raise ValueError(f"two_level_bootstrap: n_boot must be a positive integer (got {n_boot!r})")
    n_boot = int(n_boot)
    n_s, n_i = d.shape
    if block is None:
        block = max(1, min(n_boot, _BLOCK_INDICES // (n_s + n_i)))
    if int(block) != block or block < 1:
        raise ValueError(f"two_level_bootstrap: block must be a positive integer (got {block!r})")
    block = int(block)
    rng = np.random.default_rng(seed)
    dt = d.T.copy()  # (items, seeds)
    means = np.empty(n_boot)
    if groups is not None:  # H n_h per item (each item is in one stratum)
        denom = np.empty(n_i)
        for g in groups:
            denom[g] = float(len(groups) * g.size)
    for start in range(0, n_boot, block):
        r = min(block, n_boot - start)
        si = rng.integers(0, n_s, size=(r, n_s))
        row = np.arange(r)[:, None]
        c = np.bincount((si + row * n_s).ravel(), minlength=r * n_s).reshape(r, n_s).astype(float)
        if groups is None:
            ii = rng.integers(0, n_i, size=(r, n_i))
            w = np.bincount((ii + row * n_i).ravel(), minlength=r * n_i).reshape(r, n_i).astype(float)
            means[start:start + r] = np.einsum("rs,rs->r", c, w @ dt) / (n_s * n_i)
            continue
        # within each stratum, n_h draws among its n_h items (drawn stratum by stratum, in label order);
        # an item's count is divided by H n_h, its stratum's weight: one count pass over the r x N draws
        gi = np.concatenate([g[rng.integers(0, g.size, size=(r, g.size))] for g in groups], axis=1)
        w = np.bincount((gi + row * n_i).ravel(), minlength=r * n_i).reshape(r, n_i) / denom
        means[start:start + r] = np.einsum("rs,rs->r", c, w @ dt) / n_s
    return means


def two_level_p_value(kind: str, family, baseline, *, margin: Optional[float] = None, n_boot: int = 10000,
                      seed: int = 0, block: Optional[int] = None, strata=None) -> float:
    """The p-value of a paired check for its claimed side from :func:`two_level_bootstrap`'s
    replicates (same arguments, same stream): twice the share of replicate means on the wrong side
    of the check's boundary, capped at 1, as :func:`p_value` does for the seed bootstrap. Boundaries:
    0 (``higher``: means <= 0 are wrong; ``lower``: means >= 0), ``-margin`` (``not_worse``: means
    <= -margin), ``+margin`` (``not_worse_lower``: means >= margin); ``equivalent`` takes the larger
    of the two sides' values at ``-margin`` and ``+margin``. So ``p < alpha`` when the ``1 - alpha``
    percentile interval reproduces the check (up to the interpolation of the quantiles), and the
    value can enter :func:`holm` or :func:`benjamini_hochberg`. ``nan`` with fewer than two seeds."""
    sides = {"higher": ((0.0, "above"),), "lower": ((0.0, "below"),)}
    if kind in ("not_worse", "not_worse_lower", "equivalent"):
        if margin is None or not (margin > 0 and math.isfinite(margin)):
            raise ValueError(f"two_level_p_value: a {kind!r} check needs a positive margin (got {margin!r})")
        m = float(margin)
        sides = {"not_worse": ((-m, "above"),), "not_worse_lower": ((m, "below"),),
                 "equivalent": ((-m, "above"), (m, "below"))}
    if kind not in sides:
        raise ValueError(f"two_level_p_value: unknown kind {kind!r}; choose one of higher, lower, not_worse, "
                         f"not_worse_lower, equivalent")
    d = _two_level_differences(family, baseline)
    groups = _strata(strata, d.shape[1] if d.ndim == 2 else 0)
    if d.shape[0] < 2 or d.size == 0:
        return float("nan")
    means = _two_level_means(d, n_boot, seed, block, groups)
    ps = []
    for c, side in sides[kind]:
        wrong = float((means <= c).mean()) if side == "above" else float((means >= c).mean())
        ps.append(min(1.0, 2.0 * wrong))
    return max(ps)


def benjamini_hochberg(pvalues: Sequence[float], q: float = 0.05) -> Tuple[list, list]:
    """Benjamini-Hochberg adjustment of ``m`` p-values (one per claim): ``(adjusted, rejected)``.

    Ordered ascending (ties: the given order), ``p_(1) <= ... <= p_(m)``, the adjusted value of the
    ``k``-th is ``min(1, min_{j >= k} m p_(j) / j)``: monotone along the order and capped at 1.
    ``rejected`` follows the step-up rule as written: reject ``p_(1) .. p_(k*)`` with ``k*`` the
    largest ``k`` where ``p_(k) <= k q / m`` (the same as ``adjusted <= q`` but for rounding at the
    boundary), which holds the false discovery rate at ``q`` for independent or positively
    dependent tests. ``nan`` p-values (a claim without
    an interval) are ranked last, stay ``nan``, are never rejected and still count in ``m``, the
    conservative reading (as :func:`holm`)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"benjamini_hochberg: q must be in (0, 1) (got {q!r})")
    p = [float(x) for x in pvalues]
    for x in p:
        if math.isfinite(x) and not 0.0 <= x <= 1.0:
            raise ValueError(f"benjamini_hochberg: p-values must lie in [0, 1] (got {x!r})")
    m = len(p)
    finite = sorted((i for i in range(m) if math.isfinite(p[i])), key=lambda i: (p[i], i))
    adjusted = [float("nan")] * m
    running = 1.0
    for k in range(len(finite), 0, -1):
        i = finite[k - 1]
        running = min(running, m * p[i] / k)
        adjusted[i] = running
    kstar = max((k for k in range(1, len(finite) + 1) if p[finite[k - 1]] <= k * q / m), default=0)
    rejected = [False] * m
    for i in finite[:kstar]:
        rejected[i] = True
    return adjusted, rejected


def claims_fdr(results, q: float = 0.05) -> Dict[str, Tuple[float, float, bool]]:
    """Benjamini-Hochberg across claims: ``{claim: (p, adjusted p, rejected)}`` over the claims the
    headline counts as tested (*reproduced*, *contradicted*, *not resolved*; not the invalid, not
    applicable, not tested or sanity claims, :func:`headline_counts`), each represented by its
    primary check's p-value for the claimed side (:func:`p_value`). ``rejected``: the claim is
    reproduced with the false discovery rate over the claims held at ``q``."""
    named = [(n, r) for n, r in _named(results)
             if not r.sanity and r.verdict in (REPRODUCED, CONTRADICTED, NOT_RESOLVED) and r.primary is not None]
    ps = [r.primary.p for _, r in named]
    adjusted, rejected = benjamini_hochberg(ps, q)
    return {n: (p, a, j) for (n, _), p, a, j in zip(named, ps, adjusted, rejected)}
