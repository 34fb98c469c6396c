"""``benchmarks/stats.py``, protocol revision 4: the verdicts *not applicable here* and *not tested*
(manipulation checks), the headline tally, margins relative to the baseline's error, the two-level
bootstrap over seeds and test items and Benjamini-Hochberg across claims. Every rule is checked
against an independent computation written here from its definition (hand values, brute-force
loops, scipy where it is installed)."""

from __future__ import annotations

import importlib.util
import math
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module():
    spec = importlib.util.spec_from_file_location("bench_stats_rev4", os.path.join(ROOT, "benchmarks", "stats.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


st = _module()


def _five(mean, a=0.01):
    return [mean + a * k for k in (-2, -1, 0, 1, 2)]


def _ci(kind="higher", values=(), **kw):
    return st.CheckInput(name=kw.pop("name", kind), kind=kind, values=tuple(values), **kw)


def _mc(values, op="<", level=1.0, name="log Z small", metric="mean |log Z|", arm="penalty"):
    return st.ManipulationCheck(name=name, metric=metric, arm=arm, op=op, level=level, values=values)


# ------------------------------------------------------------------------------------------------
# manipulation checks, "not tested", "not applicable here" and the headline
# ------------------------------------------------------------------------------------------------
def test_manipulation_check_reads_the_arm_mean_against_an_absolute_level():
    r = st.manipulation_result(_mc((0.5, 0.7, 0.9)))  # mean 0.7 < 1
    assert (r.mean, r.n, r.passed) == (pytest.approx(0.7), 3, True)
    assert r.text() == "log Z small: mean mean |log Z| of penalty 0.7 (3 seeds), < 1"
    r = st.manipulation_result(_mc({0: 1.2, 1: 1.5, 2: float("nan")}))  # nan dropped: mean 1.35, not < 1
    assert (r.mean, r.n, r.passed) == (pytest.approx(1.35), 2, False)
    assert r.text().endswith("1.35 (2 seeds), not < 1")
    # each operator against its definition, at the boundary and on either side
    for vals in ((1.0, 1.0), (0.9, 0.9), (1.1, 1.1)):
        m = sum(vals) / len(vals)
        for op, want in (("<", m < 1), ("<=", m <= 1), (">", m > 1), (">=", m >= 1)):
            assert st.manipulation_result(_mc(vals, op=op)).passed is want
    # loss spikes > 0 in the unstable arm: none happened, so the stress never acted
    assert st.manipulation_result(_mc((0, 0, 0), op=">", level=0, metric="loss spikes")).passed is False
    # no values: nothing shows that the intervention acted
    r = st.manipulation_result(_mc(()))
    assert r.passed is False and r.n == 0 and r.text() == "log Z small: no values of mean |log Z| in penalty"
    with pytest.raises(ValueError, match="op must be one of"):
        st.manipulation_result(_mc((0.5,), op="=="))
    with pytest.raises(ValueError, match="finite"):
        st.manipulation_result(_mc((0.5,), level=float("nan")))


def test_a_failed_manipulation_check_makes_the_claim_not_tested():
    prim = [_ci("higher", _five(0.02), primary=True)]
    base = st.evaluate_claim(prim)
    assert base.verdict == st.REPRODUCED
    ok = st.evaluate_claim(prim, manipulation=[_mc((0.5, 0.6))])
    assert ok.verdict == st.REPRODUCED and ok.manipulation[0].passed and ok.failed_manipulation() == ()
    bad = st.evaluate_claim(prim, manipulation=[_mc((0.5, 0.6)), _mc((0.9, 1.0), op="<", level=0.5,
                                                                   name="sampled", metric="fraction", arm="pfc")])
    assert bad.verdict == st.NOT_TESTED
    assert bad.verdict_text() == "not tested (sampled: mean fraction of pfc 0.95 (2 seeds), not < 0.5)"
    # the checks' numbers are still there, exactly as without the manipulation checks
    assert bad.primary == base.primary and bad.checks == base.checks
    # an arm that did not train (or a broken split) is invalid first: the runs cannot be read at all
    inv = st.evaluate_claim(prim, manipulation=[_mc((2.0,))], invalid_arms=[("b", "test/top1", 0.09, 0.1)])
    assert inv.verdict == st.INVALID and not inv.manipulation[0].passed


def test_not_applicable_is_declared_and_overrides_every_other_verdict():
    prim = [_ci("higher", _five(0.02), primary=True), _ci("higher", _five(0.04), name="S")]
    base = st.evaluate_claim(prim)
    why = "top-5 at 10 classes is at ceiling"
    r = st.evaluate_claim(prim, not_applicable=why, manipulation=[_mc((2.0,))],
                          invalid_arms=[("b", "test/top1", 0.09, 0.1)])
    assert r.verdict == st.NOT_APPLICABLE and r.not_applicable == why
    assert r.verdict_text() == f"not applicable here ({why})"
    assert r.checks == base.checks  # reported as computed, not read
    # a claim declared not applicable may have no runs and no checks
    empty = st.evaluate_claim([], not_applicable=why)
    assert empty.verdict == st.NOT_APPLICABLE and empty.primary is None and empty.checks == ()
    for bad in ("", "  ", 3):
        with pytest.raises(ValueError, match="not_applicable must be the declared reason"):
            st.evaluate_claim(prim, not_applicable=bad)
    with pytest.raises(ValueError, match="exactly one check must be primary"):
        st.evaluate_claim([])  # without the declaration a claim still needs its primary check


def test_headline_counts_keep_untested_and_sanity_claims_apart():
    def claim(checks, **kw):
        return st.evaluate_claim(checks, **kw)

    results = {
        "a": claim([_ci("higher", _five(0.02), primary=True)]),  # reproduced
        "b": claim([_ci("higher", _five(-0.03), primary=True)]),  # contradicted
        "c": claim([_ci("higher", _five(0.0), primary=True)]),  # not resolved
        "d": claim([_ci("higher", _five(0.02), primary=True)], invalid_arms=[("x", "m", 0.0, 0.1)]),
        "e": claim([_ci("higher", _five(0.04), primary=True)], not_applicable="rate 0.1 samples nothing"),
        "f": claim([_ci("higher", _five(0.04), primary=True)], manipulation=[_mc((3.0, 3.0))]),
        "g": claim([_ci("sanity", [0.0] * 5, primary=True, rule="equivalent", margin=0.01)]),
        "h": claim([_ci("higher", _five(0.03), primary=True)]),  # reproduced
    }
    h = st.headline_counts(results)
    assert h.counts == {st.REPRODUCED: 2, st.CONTRADICTED: 1, st.NOT_RESOLVED: 1, st.INVALID: 1} and h.total == 5
    assert h.claims[st.REPRODUCED] == ("a", "h") and h.claims[st.INVALID] == ("d",)
    assert h.not_applicable == (("e", "rate 0.1 samples nothing"),)
    assert h.not_tested == (("f", "log Z small: mean mean |log Z| of penalty 3 (2 seeds), not < 1"),)
    assert h.sanity == (("g", st.HOLDS),)
    assert st.headline_counts(list(results.items())) == h  # pairs work as well as a mapping
    assert list(h.counts) == list(st.HEADLINE)


# ------------------------------------------------------------------------------------------------
# margins relative to the baseline's error
# ------------------------------------------------------------------------------------------------
def test_relative_margin_formula_by_hand():
    m = st.resolve_margin(relative=0.1, baseline_mean=0.979)  # error 0.021: margin 0.0021
    assert m.margin == pytest.approx(0.0021) and m.baseline_error == pytest.approx(0.021) and m.relative == 0.1
    assert m.basis == "0.1 x the baseline's error 0.021 (1 - mean 0.979) = 0.0021"
    m = st.resolve_margin(relative=0.2, baseline_mean=0.05, better="lower")  # ECE 0.05: margin 0.01
    assert m.margin == pytest.approx(0.01) and m.basis == "0.2 x the baseline's error 0.05 (its mean) = 0.01"
    assert st.resolve_margin(margin=0.01) == st.Margin(0.01, None, None, "declared")
    assert st.resolve_margin() == st.Margin(None, None, None, "")
    for kw, msg in (({"margin": 0.01, "relative": 0.1, "baseline_mean": 0.9}, "not both"),
                    ({"relative": 0.1}, "needs the baseline's mean"),
                    ({"relative": 0.1, "baseline_mean": 12.0}, r"in \[0, 1\]"),
                    ({"relative": 0.1, "baseline_mean": -0.1, "better": "lower"}, ">= 0"),
                    ({"relative": 0.1, "baseline_mean": 1.0}, "error is 0"),
                    ({"relative": -0.1, "baseline_mean": 0.9}, "positive"),
                    ({"relative": 0.1, "baseline_mean": 0.9, "better": "up"}, "better")):
        with pytest.raises(ValueError, match=msg):
            st.resolve_margin(**kw)


def test_relative_margin_is_the_bound_on_the_family_error_by_brute_force():
    # the resolved margin must accept exactly the family means whose error is at most (1 + r) x the
    # baseline's: a grid of family means against the definition, both directions
    r = 0.1
    for b in (0.979, 0.5, 0.02):
        m = st.resolve_margin(relative=r, baseline_mean=b).margin
        for f in np.linspace(b - 0.05, b + 0.01, 601):
            if abs((1 - f) - (1 + r) * (1 - b)) < 1e-12:
                continue  # the boundary itself, where rounding decides
            assert (f - b >= -m) == ((1 - f) <= (1 + r) * (1 - b))
    for b in (0.3, 0.01):
        m = st.resolve_margin(relative=r, baseline_mean=b, better="lower").margin
        for f in np.linspace(0, 2 * b, 601):
            if abs(f - (1 + r) * b) < 1e-12:
                continue
            assert (f - b <= m) == (f <= (1 + r) * b)


def test_a_check_with_a_relative_margin_reads_as_its_resolved_absolute_margin():
    # baseline accuracy 0.979 (error 0.021); the family loses 0.005 +- 0.001 (CI about [-0.0075, -0.0025]):
    # its error grows by about a quarter
    d = [-0.005, -0.006, -0.004]
    absolute = st.evaluate_claim([_ci("not_worse", d, primary=True, margin=0.01)])
    assert absolute.verdict == st.REPRODUCED  # a one-point margin lets it pass
    assert absolute.primary.margin == 0.01 and absolute.primary.margin_basis == "declared"
    rel = st.evaluate_claim([_ci("not_worse", d, primary=True, relative_margin=0.1, baseline_mean=0.979)])
    assert rel.verdict == st.CONTRADICTED  # a 10% larger error allows a loss of at most 0.0021 here
    assert rel.primary.margin == pytest.approx(0.0021)
    # identical numbers to the same margin declared in the metric's units, secondary checks included
    def checks(**kw):
        return [_ci("higher", _five(0.02), primary=True),
                _ci("not_worse", [-0.001, 0.0005, -0.0002], name="nw", **kw),
                _ci("equivalent", [0.0001, -0.0003, 0.0002], name="eq", **kw)]

    a = st.evaluate_claim(checks(margin=0.1 * 0.021))
    b = st.evaluate_claim(checks(relative_margin=0.1, baseline_mean=0.979))
    for x, y in zip(a.checks, b.checks):
        assert (x.verdict, x.ci, x.reported_ci, x.flag, x.decidable) == (y.verdict, y.ci, y.reported_ci, y.flag,
                                                                          y.decidable)
        assert x.p == pytest.approx(y.p, abs=1e-15) and x.p_adjusted == pytest.approx(y.p_adjusted, abs=1e-15)
    with pytest.raises(ValueError, match="not both"):
        st.evaluate_claim([_ci("not_worse", d, primary=True, margin=0.01, relative_margin=0.1, baseline_mean=0.9)])


# ------------------------------------------------------------------------------------------------
# two-level bootstrap (seeds x test items)
# ------------------------------------------------------------------------------------------------
def _slow_two_level(fam, base, n_boot, seed, block, confidence=0.95):
    """The definition's interval, one replicate at a time (:func:`_slow_two_level_means`)."""
    means = _slow_two_level_means(fam, base, n_boot, seed, block)
    alpha = 1 - confidence
    return np.quantile(means, [alpha / 2, 1 - alpha / 2])


def _slow_two_level_means(fam, base, n_boot, seed, block):
    """The definition, one replicate at a time with explicit loops, on the documented stream: per
    block, the seed indices (r, S) and then the item indices (r, N)."""
    fam, base = np.asarray(fam, float), np.asarray(base, float)
    S, N = fam.shape
    rng = np.random.default_rng(seed)
    means = []
    for start in range(0, n_boot, block):
        r = min(block, n_boot - start)
        si = rng.integers(0, S, size=(r, S))
        ii = rng.integers(0, N, size=(r, N))
        for k in range(r):
            total = 0.0
            for a in si[k]:
                for j in ii[k]:  # the same item resample for every seed and for both arms
                    total += fam[a, j] - base[a, j]
            means.append(total / (S * N))
    return means


def _fields(ci):
    """An interval's fields but the MDE (``nan`` in the two-level bootstrap, and ``nan != nan``)."""
    return (ci.n, ci.mean, ci.sd, ci.low, ci.high, ci.method, ci.confidence)


def test_two_level_bootstrap_matches_a_slow_loop_on_the_same_stream():
    rng = np.random.default_rng(11)
    fam = (rng.random((4, 9)) < 0.7).astype(float)
    base = (rng.random((4, 9)) < 0.6).astype(float)
    for block in (7, 100, 1):  # a partial last block, one block, one replicate per block
        ci = st.two_level_bootstrap(fam, base, n_boot=100, seed=5, block=block)
        lo, hi = _slow_two_level(fam, base, 100, 5, block)
        assert (ci.low, ci.high) == pytest.approx((lo, hi), abs=1e-12)
    assert ci.n == 4 and ci.mean == pytest.approx((fam - base).mean()) and ci.method == st.TWO_LEVEL
    assert ci.sd == pytest.approx(np.std((fam - base).mean(1), ddof=1)) and math.isnan(ci.mde)
    # the default block is documented as a function of the shape: here one block of 100
    assert _fields(st.two_level_bootstrap(fam, base, n_boot=100, seed=5)) == _fields(
        st.two_level_bootstrap(fam, base, n_boot=100, seed=5, block=100))
    # seeded; {seed: scores} mappings pair by seed
    again = st.two_level_bootstrap({s: fam[s] for s in range(4)}, {s: base[s] for s in (3, 2, 1, 0)},
                                   n_boot=100, seed=5, block=1)
    assert _fields(again) == _fields(ci)


def test_two_level_bootstrap_with_one_item_is_the_seed_bootstrap():
    d = np.array([0.01, 0.03, -0.02, 0.04, 0.0, 0.02])
    for seed in (0, 3):
        two = st.two_level_bootstrap(d[:, None] + 0.5, np.full((6, 1), 0.5), n_boot=4000, seed=seed)
        one = st.interval(d, method="bootstrap", n_boot=4000, seed=seed)
        assert (two.low, two.high, two.mean, two.sd, two.n) == pytest.approx(
            (one.low, one.high, one.mean, one.sd, one.n), abs=1e-12)


def test_two_level_bootstrap_covers_the_true_difference_about_95_percent():
    # crossed random effects: D[s, j] = mu + seed effect + item effect + noise, the same items for every
    # seed; the truth is mu. 200 datasets; coverage of a 95% interval should be near 0.95 (the
    # bootstrap of the crossed design is known to be a little conservative; the percentile interval
    # with 10 seeds a little liberal)
    rng = np.random.default_rng(2026)
    S, N, mu, hits = 10, 60, 0.03, 0
    for k in range(200):
        seed_eff = rng.normal(0, 0.01, size=(S, 1))
        item_eff = rng.normal(0, 0.08, size=(1, N))
        noise = rng.normal(0, 0.05, size=(S, N))
        base = rng.normal(0.8, 0.05, size=(S, N))
        fam = base + mu + seed_eff + item_eff + noise
        ci = st.two_level_bootstrap(fam, base, n_boot=1000, seed=k)
        hits += ci.low < mu < ci.high
    assert 0.90 <= hits / 200 <= 0.99, hits


def test_two_level_bootstrap_width_follows_the_item_variance_when_seeds_agree():
    # every seed scores the items identically: only the item resample varies, and the interval's
    # half-width is close to 1.96 x sd(items) / sqrt(N)
    rng = np.random.default_rng(4)
    per_item = rng.normal(0.02, 0.1, size=400)
    fam = np.tile(per_item, (5, 1))
    ci = st.two_level_bootstrap(fam, np.zeros_like(fam), n_boot=4000, seed=1)
    half = 1.959964 * per_item.std(ddof=1) / math.sqrt(400)
    assert (ci.high - ci.low) / 2 == pytest.approx(half, rel=0.08)
    assert math.isnan(ci.sd) or ci.sd == pytest.approx(0.0, abs=1e-15)


def test_two_level_bootstrap_refuses_unequal_item_sets():
    ok = np.zeros((3, 4))
    with pytest.raises(ValueError, match="family has 4 test items for seed 0 but 3 for seed 1"):
        st.two_level_bootstrap([[0, 1, 1, 0], [1, 1, 0], [0, 0, 0, 1]], ok)
    with pytest.raises(ValueError, match="baseline has 4 test items for seed 0 but 5 for seed 2"):
        st.two_level_bootstrap({s: ok[s] for s in range(3)}, {0: [0] * 4, 1: [0] * 4, 2: [0] * 5})
    with pytest.raises(ValueError, match="family is scored on 4 test items and baseline on 5"):
        st.two_level_bootstrap(ok, np.zeros((3, 5)))
    with pytest.raises(ValueError, match="family has 3 seeds and baseline 2"):
        st.two_level_bootstrap(ok, np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"baseline must be shaped \(seeds, items\)"):
        st.two_level_bootstrap(ok, np.zeros(4))
    with pytest.raises(ValueError, match="not one of each"):
        st.two_level_bootstrap({s: ok[s] for s in range(3)}, ok)
    with pytest.raises(ValueError, match="family has non-finite scores for seed 1"):
        st.two_level_bootstrap([[0.0] * 4, [0.0, float("nan"), 0.0, 0.0], [0.0] * 4], ok)
    with pytest.raises(ValueError, match="confidence"):
        st.two_level_bootstrap(ok, ok, confidence=95)
    with pytest.raises(ValueError, match="n_boot"):
        st.two_level_bootstrap(ok, ok, n_boot=0)
    one = st.two_level_bootstrap(np.ones((1, 4)), np.zeros((1, 4)))  # one seed: no interval
    assert one.n == 1 and one.mean == 1.0 and math.isnan(one.low) and math.isnan(one.high)


def _slow_stratified_means(fam, base, labels, n_boot, seed, block):
    """The class-mean definition, one replicate at a time: per block the seed indices (r, S), then for
    each class in ascending order the within-class item indices (r, n_class); a replicate's statistic
    is the mean over classes of the class's mean difference over the drawn (seed, item) pairs."""
    fam, base, labels = np.asarray(fam, float), np.asarray(base, float), np.asarray(labels)
    S = fam.shape[0]
    classes = sorted(set(labels.tolist()))
    members = {c: [j for j in range(labels.size) if labels[j] == c] for c in classes}
    rng = np.random.default_rng(seed)
    means = []
    for start in range(0, n_boot, block):
        r = min(block, n_boot - start)
        si = rng.integers(0, S, size=(r, S))
        drawn = {c: rng.integers(0, len(members[c]), size=(r, len(members[c]))) for c in classes}
        for k in range(r):
            per_class = []
            for c in classes:
                items = [members[c][i] for i in drawn[c][k]]
                total = sum(fam[a, j] - base[a, j] for a in si[k] for j in items)
                per_class.append(total / (S * len(items)))
            means.append(sum(per_class) / len(classes))
    return means


def test_two_level_bootstrap_of_a_class_mean_resamples_within_classes():
    # balanced accuracy: a mean of per-class accuracies, the classes of unequal size
    rng = np.random.default_rng(21)
    labels = np.array([0] * 7 + [1] * 3 + [2] * 5)
    rng.shuffle(labels)
    fam = (rng.random((4, labels.size)) < 0.7).astype(float)
    base = (rng.random((4, labels.size)) < 0.6).astype(float)

    def balanced(x):
        return np.mean([x[:, labels == c].mean(axis=1) for c in (0, 1, 2)], axis=0)  # per seed

    for block in (7, 100, 1):
        ci = st.two_level_bootstrap(fam, base, n_boot=100, seed=5, block=block, strata=labels)
        want = np.quantile(_slow_stratified_means(fam, base, labels, 100, 5, block), [0.025, 0.975])
        assert (ci.low, ci.high) == pytest.approx(tuple(want), abs=1e-12)
    per_seed = balanced(fam) - balanced(base)
    assert ci.mean == pytest.approx(per_seed.mean(), abs=1e-15) and ci.sd == pytest.approx(per_seed.std(ddof=1))
    assert ci.mean != pytest.approx((fam - base).mean())  # unequal classes: not the plain item mean
    # the p-value reads the same replicates
    means = np.array(_slow_stratified_means(fam, base, labels, 300, 9, 300))
    p = st.two_level_p_value("higher", fam, base, n_boot=300, seed=9, strata=labels)
    assert p == pytest.approx(min(1.0, 2.0 * float(np.mean(means <= 0))), abs=1e-15)
    # one stratum draws what the unstratified bootstrap draws
    one = st.two_level_bootstrap(fam, base, n_boot=200, seed=3, strata=np.zeros(labels.size, dtype=int))
    plain = st.two_level_bootstrap(fam, base, n_boot=200, seed=3)
    assert (one.low, one.high, one.mean) == pytest.approx((plain.low, plain.high, plain.mean), abs=1e-12)
    # every replicate keeps the class counts: a difference confined to one class of three, constant
    # across seeds and items, has no item or seed variation left
    d = np.where(labels == 1, 0.3, 0.0)[None, :].repeat(4, axis=0)
    flat = st.two_level_bootstrap(d, np.zeros_like(d), n_boot=500, seed=1, strata=labels)
    assert flat.low == pytest.approx(0.1, abs=1e-12) and flat.high == pytest.approx(0.1, abs=1e-12)
    with pytest.raises(ValueError, match="strata must give one label per test item"):
        st.two_level_bootstrap(fam, base, strata=labels[:-1])
    with pytest.raises(TypeError, match="strata must be integer labels"):
        st.two_level_bootstrap(fam, base, strata=labels.astype(float))


def test_two_level_p_value_is_the_share_of_replicates_on_the_wrong_side():
    rng = np.random.default_rng(3)
    fam = rng.normal(0.62, 0.2, size=(5, 12))
    base = rng.normal(0.6, 0.2, size=(5, 12))
    means = np.array(_slow_two_level_means(fam, base, 300, 9, 300))
    def share(wrong):
        return min(1.0, 2.0 * float(np.mean(wrong)))
    cases = {("higher", None): share(means <= 0), ("lower", None): share(means >= 0),
             ("not_worse", 0.05): share(means <= -0.05), ("not_worse_lower", 0.05): share(means >= 0.05),
             ("equivalent", 0.05): max(share(means <= -0.05), share(means >= 0.05))}
    for (kind, margin), want in cases.items():
        assert st.two_level_p_value(kind, fam, base, margin=margin, n_boot=300, seed=9) == pytest.approx(want, abs=1e-15)
    # p < alpha where the 1 - alpha interval reproduces: a clear effect and none
    big = st.two_level_p_value("higher", fam + 0.2, base, n_boot=2000, seed=1)
    ci = st.two_level_bootstrap(fam + 0.2, base, n_boot=2000, seed=1)
    assert big < 0.05 and st.verdict("higher", ci) == st.REPRODUCED
    none = st.two_level_p_value("higher", base, base + rng.normal(0, 0.05, size=base.shape), n_boot=2000, seed=1)
    assert none > 0.05
    assert math.isnan(st.two_level_p_value("higher", fam[:1], base[:1]))
    with pytest.raises(ValueError, match="positive margin"):
        st.two_level_p_value("not_worse", fam, base)
    with pytest.raises(ValueError, match="unknown kind"):
        st.two_level_p_value("below", fam, base)


def test_two_level_bootstrap_at_full_size_is_bounded_and_matches_its_small_blocks():
    # 10 seeds x 33,000 items at a reduced n_boot: the default block keeps each block near 2**21
    # indices; the same stream drawn in smaller blocks of the same size gives the same interval
    rng = np.random.default_rng(0)
    fam = (rng.random((10, 33000)) < 0.9).astype(float)
    base = (rng.random((10, 33000)) < 0.89).astype(float)
    ci = st.two_level_bootstrap(fam, base, n_boot=126, seed=2)
    block = 2 ** 21 // (10 + 33000)
    assert block == 63
    assert _fields(st.two_level_bootstrap(fam, base, n_boot=126, seed=2, block=63)) == _fields(ci)
    assert ci.low < (fam - base).mean() < ci.high and ci.high - ci.low < 0.01


# ------------------------------------------------------------------------------------------------
# Benjamini-Hochberg across claims
# ------------------------------------------------------------------------------------------------
def test_benjamini_hochberg_by_hand():
    # p = 0.01, 0.04, 0.03, 0.005 (m = 4): ordered 0.005, 0.01, 0.03, 0.04; m p / k = 0.02, 0.02, 0.04,
    # 0.04; running minimum from the largest: 0.02, 0.02, 0.04, 0.04
    adj, rej = st.benjamini_hochberg([0.01, 0.04, 0.03, 0.005])
    assert adj == pytest.approx([0.02, 0.04, 0.04, 0.02]) and rej == [True] * 4
    assert st.benjamini_hochberg([0.01, 0.04, 0.03, 0.005], q=0.03)[1] == [True, False, False, True]
    # step-up: p_(3) = 0.05 <= 3 x 0.05 / 3 rejects all three although 0.04 > 0.05 / 3
    adj, rej = st.benjamini_hochberg([0.04, 0.045, 0.05])
    assert adj == pytest.approx([0.05, 0.05, 0.05]) and rej == [True, True, True]
    # monotone along the order and capped at 1
    adj, _ = st.benjamini_hochberg([0.9, 0.8, 0.95, 0.99])
    assert adj == pytest.approx([0.99, 0.99, 0.99, 0.99]) and max(adj) <= 1.0
    adj, rej = st.benjamini_hochberg([0.6])
    assert adj == [0.6] and rej == [False]
    # nan: ranked last, never rejected, counted in m
    adj, rej = st.benjamini_hochberg([float("nan"), 0.01])
    assert math.isnan(adj[0]) and adj[1] == pytest.approx(0.02) and rej == [False, True]
    assert st.benjamini_hochberg([]) == ([], [])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        st.benjamini_hochberg([1.2])
    with pytest.raises(ValueError, match="q must be"):
        st.benjamini_hochberg([0.1], q=0)


def _step_up_rejections(p, q):
    """The step-up rule from its definition: reject the k* smallest with k* the largest k such that
    p_(k) <= k q / m."""
    m = len(p)
    order = sorted(range(m), key=lambda i: (p[i], i))
    kstar = 0
    for k in range(1, m + 1):
        if p[order[k - 1]] <= k * q / m:
            kstar = k
    out = [False] * m
    for i in order[:kstar]:
        out[i] = True
    return out


def test_benjamini_hochberg_against_the_step_up_rule_and_scipy():
    rng = np.random.default_rng(7)
    for trial in range(300):
        m = int(rng.integers(1, 25))
        p = rng.beta(0.4, 2.0, size=m)
        if trial % 3 == 0:
            p = np.round(p, 2)  # ties
        p = [float(x) for x in p]
        for q in (0.05, 0.1, 0.2):
            adj, rej = st.benjamini_hochberg(p, q)
            assert rej == _step_up_rejections(p, q)
            # the adjusted value from its definition: min over j >= k of m p_(j) / j, capped at 1
            srt = sorted(p)
            for i, x in enumerate(p):
                k = max(kk for kk in range(1, m + 1) if srt[kk - 1] == x)
                want = min(1.0, min(m * srt[j - 1] / j for j in range(k, m + 1)))
                assert adj[i] == pytest.approx(want, abs=1e-15)
    scipy_stats = pytest.importorskip("scipy.stats")
    if not hasattr(scipy_stats, "false_discovery_control"):
        pytest.skip("scipy without false_discovery_control")
    for _ in range(50):
        p = rng.uniform(0, 0.2, size=int(rng.integers(1, 30)))
        adj, _ = st.benjamini_hochberg(p.tolist())
        assert adj == pytest.approx(scipy_stats.false_discovery_control(p, method="bh").tolist(), abs=1e-14)


def test_claims_fdr_takes_the_primary_p_of_the_tested_claims():
    results = {
        "a": st.evaluate_claim([_ci("higher", _five(0.02), primary=True)]),  # p 0.047421
        "b": st.evaluate_claim([_ci("higher", _five(0.04), primary=True)]),  # p 0.004812
        "c": st.evaluate_claim([_ci("higher", _five(0.0), primary=True)]),  # not resolved, p 1
        "d": st.evaluate_claim([_ci("higher", _five(0.04), primary=True)], invalid_arms=[("x", "m", 0, 1)]),
        "e": st.evaluate_claim([_ci("higher", _five(0.04), primary=True)], not_applicable="ceiling"),
        "f": st.evaluate_claim([_ci("higher", _five(0.04), primary=True)], manipulation=[_mc((5.0,))]),
        "g": st.evaluate_claim([_ci("sanity", [0.0] * 5, primary=True, rule="equivalent", margin=0.01)]),
    }
    out = st.claims_fdr(results)
    assert list(out) == ["a", "b", "c"]
    # m = 3: b 3 x 0.004812 = 0.014436; a min(3/2 x 0.047421, 1) = 0.071132; c 1
    assert out["b"][1] == pytest.approx(0.014436, abs=1e-5) and out["b"][2] is True
    assert out["a"][1] == pytest.approx(1.5 * 0.047421, abs=1e-5) and out["a"][2] is False
    assert out["c"] == (pytest.approx(1.0), pytest.approx(1.0), False)
    assert out["a"][0] == results["a"].primary.p
