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


# ------------------------------------------------------------------------------------------------
# revision 3: primary / Holm-adjusted secondary checks, flags, difference in differences, sanity
# checks, the competence gate and "decidable at this n"
# ------------------------------------------------------------------------------------------------
def _t4_cdf(x):
    """CDF of Student's t with 4 degrees of freedom in closed form (independent of scipy):
    ``1/2 + (3/8) u (1 - v / 12)`` with ``u = x / sqrt(1 + x^2/4)``, ``v = x^2 / (1 + x^2/4)``."""
    w = 1.0 + x * x / 4.0
    return 0.5 + 0.375 * (x / math.sqrt(w)) * (1.0 - (x * x / w) / 12.0)


def _five(mean, a=0.01):
    """Five values ``mean + a * (-2, -1, 0, 1, 2)``: sd ``a sqrt(2.5)``, standard error ``a / sqrt(2)``."""
    return [mean + a * k for k in (-2, -1, 0, 1, 2)]


def test_p_value_inverts_the_interval_by_hand():
    se = 0.01 / math.sqrt(2)
    for m in (0.02, 0.03, 0.04):
        p = st.p_value("higher", _five(m))
        assert p == pytest.approx(2 * (1 - _t4_cdf(m / se)), abs=1e-9)
        # the (1 - p) interval ends exactly at 0
        assert st.interval(_five(m), confidence=1 - p).low == pytest.approx(0.0, abs=1e-9)
    # hand values: t = 2.8284, 4.2426, 5.6569 (df 4) -> two-sided p 0.047421, 0.013234, 0.004812
    assert [st.p_value("higher", _five(m)) for m in (0.02, 0.03, 0.04)] == pytest.approx(
        [0.047421, 0.013234, 0.004812], abs=2e-6)
    # lower / not_worse / equivalent / level sides
    assert st.p_value("lower", _five(-0.03)) == pytest.approx(0.013234, abs=2e-6)
    assert st.p_value("not_worse", _five(-0.01), margin=0.03) == pytest.approx(0.047421, abs=2e-6)  # -0.01 + 0.03
    assert st.p_value("not_worse_lower", _five(0.01), margin=0.03) == pytest.approx(0.047421, abs=2e-6)
    # equivalence within +-0.05 of mean 0.01: the worse side is 0.05 - 0.01 = 0.04 -> 0.004812
    assert st.p_value("equivalent", _five(0.01), margin=0.05) == pytest.approx(0.004812, abs=2e-6)
    assert st.p_value("below", _five(9.96), level=10.0) == pytest.approx(0.004812, abs=2e-6)
    assert st.p_value("above", [1.0, 1.0, 1.0], level=0.5) == 0.0 and st.p_value("higher", [0.0, 0.0]) == 1.0
    assert math.isnan(st.p_value("higher", [0.1]))


def test_holm_step_down_by_hand():
    # p = 0.01, 0.04, 0.03: ordered 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> max 0.06)
    adjusted, ranks = st.holm([0.01, 0.04, 0.03])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06]) and ranks == [1, 3, 2]
    assert st.holm([0.5, 0.4]) == ([0.8, 0.8], [2, 1])
    assert st.holm([0.7, 0.6])[0] == [1.0, 1.0]  # capped at 1
    adjusted, ranks = st.holm([float("nan"), 0.02])
    assert math.isnan(adjusted[0]) and adjusted[1] == pytest.approx(0.02 * 2) and ranks == [2, 1]
    assert st.holm_confidence(1, 3) == pytest.approx(1 - 0.05 / 3)
    assert st.holm_confidence(2, 3) == pytest.approx(0.975) and st.holm_confidence(3, 3) == pytest.approx(0.95)


def _ci(kind="higher", values=(), **kw):
    return st.CheckInput(name=kw.pop("name", kind), kind=kind, values=tuple(values), **kw)


def test_primary_decides_and_secondaries_are_holm_adjusted_by_hand():
    # secondary p-values (hand, above): S1 0.047421, S2 0.047421, S3 0.004812; m = 3
    # Holm: S3 0.014436 (rank 1, reproduced); S1, S2 0.094841 (ranks 2, 3): not resolved, although
    # each one's own 95% interval excludes 0
    checks = [_ci("higher", _five(-0.03), name="P", primary=True),
              _ci("higher", _five(0.02), name="S1"), _ci("higher", _five(0.02), name="S2"),
              _ci("higher", _five(0.04), name="S3")]
    res = st.evaluate_claim(checks)
    by = {r.name: r for r in res.checks}
    assert res.verdict == st.CONTRADICTED == by["P"].verdict  # the primary alone decides
    assert [by[k].role for k in ("P", "S1", "S2", "S3")] == ["primary", "secondary", "secondary", "secondary"]
    assert by["S3"].p_adjusted == pytest.approx(3 * 0.004812, abs=1e-5) and by["S3"].verdict == st.REPRODUCED
    assert by["S1"].p_adjusted == pytest.approx(2 * 0.047421, abs=1e-5) == by["S2"].p_adjusted
    assert (by["S1"].rank, by["S2"].rank, by["S3"].rank) == (2, 3, 1)
    assert by["S1"].verdict == by["S2"].verdict == st.NOT_RESOLVED
    # rank 3 is read at 95%: its interval 0.02 +- 2.776445 * 0.01 / sqrt(2) excludes 0, but the
    # step-down stopped at rank 2
    half = T975[4] * 0.01 / math.sqrt(2)
    assert (by["S2"].reported_ci.low, by["S2"].reported_ci.high) == pytest.approx((0.02 - half, 0.02 + half), abs=1e-7)
    assert by["S1"].reported_ci.confidence == pytest.approx(0.975) and by["S1"].reported_ci.low < 0
    assert by["S3"].reported_ci.confidence == pytest.approx(1 - 0.05 / 3)
    # the primary check is read at the nominal level, unadjusted
    assert by["P"].p_adjusted == by["P"].p and by["P"].reported_ci == by["P"].ci
    with pytest.raises(ValueError, match="exactly one check must be primary"):
        st.evaluate_claim(checks[1:])


def test_not_worse_but_worse_flag_and_decidable_at_this_n():
    # worse by 0.005 +- 0.001: CI [-0.0075, -0.0025] above -0.01 (not worse) and below 0 (worse)
    d = [-0.005, -0.006, -0.004]
    res = st.evaluate_claim([_ci("not_worse", d, primary=True, margin=0.01)])
    r = res.primary
    half = T975[2] * 0.001 / math.sqrt(3)
    assert res.verdict == st.REPRODUCED and r.flag == st.NOT_WORSE_BUT_WORSE
    assert r.decidable is True and f"half-width {half:.4f} < margin 0.01" == r.decidable_text
    # lower is better: +0.005 is the worse side
    r = st.evaluate_claim([_ci("not_worse", [0.005, 0.006, 0.004], primary=True, margin=0.01, better="lower")]).primary
    assert r.verdict == st.REPRODUCED and r.flag == st.NOT_WORSE_BUT_WORSE
    # a CI around 0 carries no flag; an equivalence away from 0 does
    assert st.evaluate_claim([_ci("not_worse", [0.001, -0.001, 0.0], primary=True, margin=0.01)]).primary.flag is None
    r = st.evaluate_claim([_ci("equivalent", [0.005, 0.006, 0.004], primary=True, margin=0.01)]).primary
    assert r.verdict == st.REPRODUCED and r.flag == st.WITHIN_BUT_DIFFERENT
    # without a margin the paper's effect is the reference; without either, no figure is given
    wide = [0.01, 0.02, 0.03, 0.04, 0.05]  # half-width 2.776445 * 0.0158114 / sqrt(5) = 0.019632
    assert st.decidable(st.interval(wide), effect=0.03) == (True, "half-width 0.0196 < paper's effect 0.03")
    assert st.decidable(st.interval(wide), effect=0.01)[0] is False
    assert st.decidable(st.interval(wide))[0] is None
    assert st.decidable(st.interval([0.1]), margin=0.01) == (None, "no interval")


def test_difference_in_differences_by_hand():
    fs = {0: 0.70, 1: 0.72, 2: 0.68, 3: 0.71, 4: 0.5}  # seed 4 exists only under the stress: dropped
    bs = {0: 0.60, 1: 0.61, 2: 0.60, 3: 0.62, 4: 0.4}
    fc = {0: 0.90, 1: 0.91, 2: 0.89, 3: 0.90}
    bc = {0: 0.88, 1: 0.88, 2: 0.87, 3: 0.89}
    d = st.did_differences(fs, bs, fc, bc)
    # stress (0.10, 0.11, 0.08, 0.09) - clean (0.02, 0.03, 0.02, 0.01) = (0.08, 0.08, 0.06, 0.08)
    assert list(d) == [0, 1, 2, 3] and list(d.values()) == pytest.approx([0.08, 0.08, 0.06, 0.08])
    res = st.evaluate_claim([_ci("did", d.values(), primary=True)])
    half = 3.182446 * 0.01 / math.sqrt(4)  # t_{0.975, 3}; sd 0.01
    ci = res.primary.ci
    assert (ci.mean, ci.low, ci.high) == pytest.approx((0.075, 0.075 - half, 0.075 + half), abs=1e-7)
    assert res.verdict == st.REPRODUCED and res.primary.rule == "higher"
    # lower is better (e.g. an error rate): a growing difference contradicts the claimed robustness
    assert st.evaluate_claim([_ci("did", d.values(), primary=True, better="lower")]).verdict == st.CONTRADICTED


def test_competence_gate_makes_a_claim_invalid():
    arms = {"family": {0: 0.95, 1: 0.96, 2: 0.97}, "baseline": {0: 0.10, 1: 0.08, 2: 0.09}}
    # baseline mean 0.09 is not above the chance floor 0.1: the claim is invalid although its primary
    # check (family > baseline by ~0.87) reproduces
    bad = st.competence_failures(arms, 0.1)
    assert [(a, round(m, 6), f) for a, m, f in bad] == [("baseline", 0.09, 0.1)]
    d = st.paired_differences(arms["family"], arms["baseline"])
    res = st.evaluate_claim([_ci("higher", d.values(), primary=True)],
                            invalid_arms=[(a, "test/top1", m, f) for a, m, f in bad])
    assert res.primary.verdict == st.REPRODUCED and res.verdict == st.INVALID
    assert res.verdict_text() == "invalid (arm baseline did not train)"
    # a floor column: each arm against its own runs' no-training result on the same split
    floor = {"family": {0: 0.5, 1: 0.5, 2: 0.5}, "baseline": {0: 0.05, 1: 0.05, 2: 0.05}}
    assert st.competence_failures(arms, floor) == []
    floor["family"] = {0: 0.97, 1: 0.97, 2: 0.97}  # mean 0.96 is not above 0.97
    assert [a for a, *_ in st.competence_failures(arms, floor)] == ["family"]
    assert st.competence_failures({"x": {}}, 0.1) == []  # no values: no data, not a failure


def test_sanity_checks_are_a_separate_kind():
    same = [0.0] * 10  # identical runs: the identity holds exactly
    res = st.evaluate_claim([_ci("sanity", same, primary=True, rule="equivalent", margin=0.01)])
    assert res.sanity and res.verdict == st.HOLDS and res.primary.role == "primary"
    # a sanity check beside a primary: HOLDS / FAILS, no Holm adjustment, not counted in m
    res = st.evaluate_claim([_ci("higher", _five(0.02), primary=True, name="P"),
                             _ci("sanity", [11.0, 11.2, 10.9], rule="below", level=10.0, name="support"),
                             _ci("higher", _five(0.02), name="S")])
    by = {r.name: r for r in res.checks}
    assert not res.sanity and res.verdict == st.REPRODUCED
    assert by["support"].verdict == st.FAILS and by["support"].role == "sanity" and by["support"].rank == 0
    assert by["S"].rank == 1 and by["S"].p_adjusted == pytest.approx(by["S"].p)  # m = 1: no adjustment


# ------------------------------------------------------------------------------------------------
# revision 3: test splits and the budget-limited rule (hand-made inputs)
# ------------------------------------------------------------------------------------------------
def test_test_split_problem_names_splits_broken_seeds_and_missing_records():
    one = {("a", 0): "aaa", ("b", 0): "aaa", ("a", 1): "aaa", ("b", 1): "aaa"}
    assert st.test_split_problem(one) is None
    assert st.test_split_problem({k: "" for k in one}) is None  # nothing recorded: no evidence either way
    per_seed = {("a", 0): "s0", ("b", 0): "s0", ("a", 1): "s1", ("b", 1): "s1"}  # revision 2: paired, per seed
    assert st.test_split_problem(per_seed) == "2 different test splits over 4 evaluation runs"
    unpaired = {**per_seed, ("b", 1): "s0"}
    assert st.test_split_problem(unpaired) == ("2 different test splits over 4 evaluation runs; arms of seed(s) 1 "
                                                  "tested on different splits")
    assert st.test_split_problem({**one, ("b", 1): ""}) == "1 of 4 runs recorded no test split"


def test_a_claim_tested_on_more_than_one_split_is_invalid():
    """Two recorded test splits refuse the claim whatever its checks say; one split, or runs that
    recorded none, leave the primary check's verdict."""
    prim = [_ci("higher", _five(0.02), primary=True)]
    one = {("a", 0): "aaa", ("b", 0): "aaa", ("a", 1): "aaa", ("b", 1): "aaa"}
    assert st.evaluate_claim(prim, test_splits=one).verdict == st.REPRODUCED
    assert st.evaluate_claim(prim, test_splits={k: "" for k in one}).verdict == st.REPRODUCED
    assert st.evaluate_claim(prim, test_splits={**one, ("b", 1): ""}).verdict == st.REPRODUCED  # flagged only
    per_seed = {("a", 0): "s0", ("b", 0): "s0", ("a", 1): "s1", ("b", 1): "s1"}
    res = st.evaluate_claim(prim, test_splits=per_seed)
    assert res.primary.verdict == st.REPRODUCED and res.verdict == st.INVALID
    assert res.verdict_text() == "invalid (test split not fixed: 2 different test splits over 4 evaluation runs)"
    both = st.evaluate_claim(prim, test_splits=per_seed, invalid_arms=[("b", "test/top1", 0.09, 0.1)])
    assert both.verdict_text() == ("invalid (arm b did not train; test split not fixed: 2 different test splits "
                                   "over 4 evaluation runs)")


def test_budget_limited_rule_on_hand_made_curves():
    rising = [[0.5, 0.7, 0.80, 0.84], [0.5, 0.6, 0.78, 0.82]]  # last-epoch gains 0.04, 0.04
    flat = [[0.5, 0.7, 0.84, 0.841], [0.5, 0.6, 0.82, 0.819]]  # +0.001, -0.001
    r = st.budget_limited(rising, half_width=0.02)  # threshold 0.5 x 0.02 = 0.01 < 0.04
    assert r.limited is True and r.gain == pytest.approx(0.04) and r.threshold == pytest.approx(0.01) and r.n == 2
    assert r.basis == "0.5 x the CI half-width"
    assert st.budget_limited(flat, half_width=0.02).limited is False
    # a declared margin is the threshold where there is one
    r = st.budget_limited(rising, margin=0.05, half_width=0.02)
    assert r.limited is False and r.threshold == 0.05 and r.basis == "the margin"
    # lower is better: a falling curve is still improving
    falling = [[1.0, 0.8, 0.7, 0.65]]
    assert st.budget_limited(falling, better="lower", half_width=0.02).limited is True
    assert st.budget_limited(falling, better="higher", half_width=0.02).limited is False
    # not decidable: one epoch, no curves, or no CI and no margin
    assert st.budget_limited([[0.9]], half_width=0.02).limited is None
    assert st.budget_limited([], half_width=0.02).limited is None
    assert st.budget_limited(rising).limited is None
    # a curve with a missing last value does not count
    assert st.budget_limited([[0.5, None], [0.5, 0.6]], half_width=0.02).n == 1
