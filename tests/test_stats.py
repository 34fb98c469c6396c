"""``benchmarks/stats.py``: paired CIs, the minimum detectable effect and the verdict rules, on
cases computed by hand (t quantiles from printed tables) or by an independent simulation."""

from __future__ import annotations

import importlib.util
import math
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module():
    spec = importlib.util.spec_from_file_location("bench_stats", os.path.join(ROOT, "benchmarks", "stats.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


st = _module()
T975 = {2: 4.302653, 4: 2.776445, 9: 2.262157}  # t_{0.975, df}, from a printed table


def _seeds(xs):
    return dict(enumerate(xs))


def test_paired_t_interval_by_hand():
    # d = 0.01 .. 0.05: mean 0.03, sd sqrt(2.5e-4) = 0.0158114, half-width 2.776445 * 0.0158114 / sqrt(5)
    ci = st.interval([0.01, 0.02, 0.03, 0.04, 0.05])
    half = T975[4] * math.sqrt(2.5e-4) / math.sqrt(5)
    assert ci.n == 5 and ci.method == "t"
    assert ci.mean == pytest.approx(0.03) and ci.sd == pytest.approx(math.sqrt(2.5e-4))
    assert (ci.low, ci.high) == pytest.approx((0.03 - half, 0.03 + half), abs=1e-7)
    assert st.verdict("higher", ci) == st.REPRODUCED
    assert st.verdict("lower", ci) == st.CONTRADICTED  # CI entirely on the other side


def test_pairing_uses_seed_differences_not_arm_spreads():
    # large spread across seeds, constant +0.01 per seed: unresolvable unpaired, clear paired
    base = {s: v for s, v in enumerate([0.70, 0.80, 0.90, 0.60, 0.75])}
    fam = {s: v + 0.01 + 0.001 * (s % 2) for s, v in base.items()}
    verdict, ci = st.check("higher", fam, base)
    assert verdict == st.REPRODUCED and ci.mean == pytest.approx(0.0104)  # 0.01 + 0.001 * 2 / 5
    # seeds missing on one side are dropped, not misaligned
    assert st.paired_differences({0: 1.0, 1: 2.0, 5: 3.0}, {1: 1.5, 5: 1.0, 7: 0.0}) == {1: 0.5, 5: 2.0}


def test_not_resolved_case():
    # d = 0.05, -0.03, 0.02, -0.01: mean 0.0075, sd 0.035, CI ~ [-0.048, 0.063] straddles 0
    ci = st.interval([0.05, -0.03, 0.02, -0.01])
    assert ci.low < 0 < ci.high
    assert st.verdict("higher", ci) == st.NOT_RESOLVED
    assert st.verdict("lower", ci) == st.NOT_RESOLVED
    # one seed: no interval, never a verdict either way
    assert st.check("higher", {0: 0.9}, {0: 0.1})[0] == st.NOT_RESOLVED


def test_contradicted_case():
    # family worse on every seed by 0.10 +- 0.01: CI ~ [-0.117, -0.083] for a "higher" claim
    verdict, ci = st.check("higher", _seeds([0.80, 0.81, 0.79]), _seeds([0.90, 0.90, 0.90]))
    half = T975[2] * 0.01 / math.sqrt(3)
    assert (ci.low, ci.high) == pytest.approx((-0.1 - half, -0.1 + half), abs=1e-7)
    assert verdict == st.CONTRADICTED


def test_equivalence_margin():
    inside = st.interval([0.001, -0.001, 0.002, -0.002, 0.0])  # CI ~ +-0.0020
    assert st.verdict("equivalent", inside, margin=0.01) == st.REPRODUCED
    outside = st.interval([0.05, 0.051, 0.049])  # CI ~ [0.0475, 0.0525], beyond +0.01
    assert st.verdict("equivalent", outside, margin=0.01) == st.CONTRADICTED
    straddle = st.interval([0.0, 0.02, 0.01, 0.015])  # CI ~ [-0.0025, 0.025], crosses 0.01
    assert st.verdict("equivalent", straddle, margin=0.01) == st.NOT_RESOLVED
    with pytest.raises(ValueError, match="margin declared up front"):
        st.verdict("equivalent", inside)


def test_not_worse_margin_both_directions():
    # worse by 0.005 +- 0.001 on a higher-is-better metric: CI [-0.0075, -0.0025] > -0.01
    v, ci = st.check("not_worse", _seeds([0.895, 0.896, 0.894]), _seeds([0.9, 0.9, 0.9]), margin=0.01)
    half = T975[2] * 0.001 / math.sqrt(3)
    assert ci.low == pytest.approx(-0.005 - half, abs=1e-7) and v == st.REPRODUCED
    v, _ = st.check("not_worse", _seeds([0.85, 0.851, 0.849]), _seeds([0.9, 0.9, 0.9]), margin=0.01)
    assert v == st.CONTRADICTED
    # lower is better (e.g. ECE): higher values by 0.05 are worse than a 0.01 margin allows
    v, _ = st.check("not_worse", _seeds([0.15, 0.151, 0.149]), _seeds([0.1, 0.1, 0.1]), margin=0.01, better="lower")
    assert v == st.CONTRADICTED
    v, _ = st.check("not_worse", _seeds([0.05, 0.051, 0.049]), _seeds([0.1, 0.1, 0.1]), margin=0.01, better="lower")
    assert v == st.REPRODUCED


def test_level_claims():
    assert st.check("below", _seeds([1.2, 1.3, 1.25]), level=10.0)[0] == st.REPRODUCED
    assert st.check("below", _seeds([10.5, 10.6, 10.4]), level=10.0)[0] == st.CONTRADICTED
    assert st.check("below", _seeds([9.0, 11.0, 10.0]), level=10.0)[0] == st.NOT_RESOLVED
    assert st.check("above", _seeds([0.98, 0.97, 0.99]), level=0.95)[0] == st.REPRODUCED


def test_zero_variance_differences():
    # identical arms (e.g. top5 = 1.0 everywhere): CI [0, 0] is on neither side
    ci = st.interval([0.0, 0.0, 0.0])
    assert (ci.low, ci.high, ci.mde) == (0.0, 0.0, 0.0)
    assert st.verdict("higher", ci) == st.NOT_RESOLVED
    assert st.verdict("equivalent", ci, margin=1e-3) == st.REPRODUCED


def test_mde_has_80_percent_power_by_simulation():
    n, sd = 10, 0.02
    mde = st.minimum_detectable_effect(sd, n)
    # approximation (t_crit + t_power) * sd / sqrt(n) = (2.262157 + 0.883404) * 0.02 / sqrt(10) = 0.019894;
    # the exact noncentral-t value is slightly larger
    approx = (T975[9] + 0.883404) * sd / math.sqrt(n)
    assert approx < mde < approx * 1.03
    rng = np.random.default_rng(0)
    sims = rng.normal(mde, sd, size=(40000, n))
    tstat = sims.mean(1) / (sims.std(1, ddof=1) / math.sqrt(n))
    power = float((np.abs(tstat) > T975[9]).mean())
    assert power == pytest.approx(0.8, abs=0.01)  # Monte Carlo sd 0.002
    assert math.isnan(st.minimum_detectable_effect(sd, 1))
    # the MDE shrinks like 1 / sqrt(n) (roughly) with more seeds
    assert st.minimum_detectable_effect(sd, 40) < mde / 1.8


def test_mde_with_two_pairs_is_finite_and_has_80_percent_power():
    # one degree of freedom: scipy's noncentral t returns nan in part of this range, which once
    # crashed a report whose claim had only two finished seeds
    sd = 0.05
    mde = st.minimum_detectable_effect(sd, 2)
    assert math.isfinite(mde) and mde > st.minimum_detectable_effect(sd, 3)
    rng = np.random.default_rng(1)
    sims = rng.normal(mde, sd, size=(200000, 2))
    tstat = sims.mean(1) / (sims.std(1, ddof=1) / math.sqrt(2))
    power = float((np.abs(tstat) > 12.706205).mean())  # t_{0.975, 1} from printed tables
    assert power == pytest.approx(0.8, abs=0.006)  # Monte Carlo sd 0.0009
    ci = st.interval([0.01, 0.02])
    assert math.isfinite(ci.mde) and math.isfinite(ci.low)


def test_bootstrap_percentile_interval_exact_small_case():
    # x = (0, 1, 2): the 27 equally likely resamples have mean 0 and mean 2 with p = 1/27 = 0.037 each,
    # above the 2.5% tails, so the percentile interval is exactly [0, 2]
    ci = st.interval([0.0, 1.0, 2.0], method="bootstrap", n_boot=20000, seed=1)
    assert ci.method == "bootstrap" and (ci.low, ci.high) == (0.0, 2.0)
    again = st.interval([0.0, 1.0, 2.0], method="bootstrap", n_boot=20000, seed=1)
    assert again == ci  # seeded
    with pytest.raises(ValueError, match="method"):
        st.interval([1.0, 2.0], method="wilcoxon")


def test_claim_verdict():
    assert st.claim_verdict([st.REPRODUCED, st.REPRODUCED]) == st.REPRODUCED
    assert st.claim_verdict([st.REPRODUCED, st.CONTRADICTED]) == st.CONTRADICTED
    assert st.claim_verdict([st.REPRODUCED, st.NOT_RESOLVED]) == st.NOT_RESOLVED
    assert st.claim_verdict([]) == st.NOT_RESOLVED
