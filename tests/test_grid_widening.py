"""The automatic grid widening of ``benchmarks/reproduce_results.py`` (the claims file's
``tuning.widen``): hand-made tuning scores against the decisions worked out by hand from the rule --
the step beyond an end, the equal-budget point of an arm chosen inside its grid, the round limit,
arms declared ``widen: false`` -- and the queue (``run_plan``) running the widened points before it
evaluates at the final choice. No training: the runs are fakes that score a point by a formula."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os

import pytest

from tests.test_claims import CF, rp  # the reproduction package, and the claims file

LR = "model.init_args.lr"


def _arm(key, lrs, widen=True, seconds=10.0):
    return dataclasses.replace(CF.arms["cos_pfc01"], key=key, label=key, seconds=seconds, widen=widen,
                               grid=((LR, tuple(lrs)),), overrides=())


def _score(table):
    """A Score from ``{arm: {lr: value}}``: points not in the table have not run yet."""
    def score(arm, p):
        v = table.get(arm.key, {}).get(p[LR])
        return None if v is None else (v, 1)

    return score


def test_step_out_is_geometric_for_positive_lists_arithmetic_otherwise():
    assert rp.tuning.step_out([0.001, 0.002, 0.004], "low") == 0.0005
    assert rp.tuning.step_out([0.001, 0.002, 0.004], "high") == 0.008
    assert rp.tuning.step_out([0.00003, 0.0001, 0.0003], "low") == pytest.approx(0.000009)
    assert rp.tuning.step_out([-1.0, 0.0, 1.0], "low") == -2.0  # not all positive: the difference
    assert rp.tuning.step_out([0.0, 0.5, 1.0], "high") == 1.5
    assert rp.tuning.step_out([8, 16, 32], "high") == 64 and isinstance(rp.tuning.step_out([8, 16, 32], "high"), int)
    assert rp.tuning.step_out([1, 2, 3], "low") == 0  # geometric: 1 * 1 / 2 = 0.5, rounded to an integer
    assert rp.tuning.step_out([1, 1, 2], "low") == 0  # a repeated value is counted once: the neighbour of 1 is 2


def test_an_end_choice_widens_the_whole_group_one_point_each():
    """a chose the lowest lr; b chose inside, its better neighbour is the higher lr: in round 1 a gains
    0.0005 (beyond its end) and b gains 0.008 (beyond the end on its better side). Once those have run, a's
    0.0005 is worse than 0.001, so 0.001 is inside the widened list and nobody is at an end: final."""
    a, b = _arm("a", [0.001, 0.002, 0.004]), _arm("b", [0.001, 0.002, 0.004])
    table = {"a": {0.001: 0.9, 0.002: 0.8, 0.004: 0.7}, "b": {0.001: 0.6, 0.002: 0.8, 0.004: 0.7}}
    st = rp.tuning.tune_group([a, b], _score(table), rounds=2)
    assert not st.final and st.rounds == 1
    assert sorted((m.key, p[LR]) for m, p in st.missing) == [("a", 0.0005), ("b", 0.008)]
    table["a"][0.0005], table["b"][0.008] = 0.85, 0.75
    st = rp.tuning.tune_group([a, b], _score(table), rounds=2)
    assert st.final and st.rounds == 1 and st.missing == []
    assert st.chosen == {"a": {LR: 0.001}, "b": {LR: 0.002}}
    assert [(t["params"][LR], t["round"]) for t in st.tables["a"]] == [(0.001, 0), (0.002, 0), (0.004, 0), (0.0005, 1)]
    assert st.tables["a"][-1]["reason"] == "chose the lowest lr"
    assert st.tables["b"][-1]["reason"].startswith("equal budget") and "higher" in st.tables["b"][-1]["reason"]
    assert len(st.points["a"]) == len(st.points["b"]) == 4  # equal tuning budgets
    assert rp.tuning.grid_edges(a, st.chosen["a"], [t["params"] for t in st.tables["a"]]) == []


def test_an_arm_still_at_an_end_after_the_last_round_is_left_and_named():
    a = _arm("a", [0.001, 0.002, 0.004])
    table = {"a": {0.001: 0.9, 0.002: 0.8, 0.004: 0.7, 0.0005: 0.95, 0.00025: 0.97, 0.000125: 0.99}}
    st = rp.tuning.tune_group([a], _score(table), rounds=2)
    assert st.final and st.rounds == 2
    assert [p[LR] for p in st.points["a"]] == [0.001, 0.002, 0.004, 0.0005, 0.00025]  # never a third round
    assert st.chosen["a"] == {LR: 0.00025}
    assert rp.tuning.grid_edges(a, st.chosen["a"], st.points["a"]) == ["lr=0.00025 (lowest of 5)"]


def test_no_round_when_every_arm_chose_inside_and_ties_go_to_the_first_point():
    a, b = _arm("a", [0.1, 0.2, 0.4]), _arm("b", [0.1, 0.2, 0.4])
    st = rp.tuning.tune_group([a, b], _score({"a": {0.1: 0.5, 0.2: 0.6, 0.4: 0.6}, "b": {0.1: 0.1, 0.2: 0.9, 0.4: 0.2}}),
                              rounds=2)
    assert st.final and st.rounds == 0  # a's tie between 0.2 and 0.4 goes to 0.2 (inside)
    assert st.chosen == {"a": {LR: 0.2}, "b": {LR: 0.2}}


def test_widen_false_arms_never_widen_and_quick_never_widens():
    hi = _arm("hi", [0.008, 0.016, 0.032], widen=False)
    st = rp.tuning.tune_group([hi], _score({"hi": {0.008: 0.9, 0.016: 0.5, 0.032: 0.1}}), rounds=2)
    assert st.final and st.rounds == 0 and st.chosen["hi"] == {LR: 0.008}
    a = _arm("a", [0.001, 0.002, 0.004])
    st = rp.tuning.tune_group([a], _score({"a": {0.001: 0.9}}), rounds=2, quick=True)  # quick: the first point only
    assert st.final and st.rounds == 0 and len(st.points["a"]) == 1


def test_failed_runs_score_nan_and_never_win():
    rows = [{"arm": "a", "phase": "tune", "seed": 1000, "params": json.dumps({LR: lr}), "ok": ok, "val/x": v}
            for lr, ok, v in ((0.001, "False", ""), (0.002, "True", "0.5"), (0.004, True, 0.4))]
    a = dataclasses.replace(_arm("a", [0.001, 0.002, 0.004]), select="val/x")
    score = rp.tuning.score_from_rows(rows, [1000])
    v, n = score(a, {LR: 0.001})
    assert math.isnan(v) and n == 0
    assert score(a, {LR: 0.002}) == (0.5, 1) and score(a, {LR: 0.0005}) is None
    st = rp.tuning.tune_group([a], score, rounds=0)
    assert st.chosen["a"] == {LR: 0.002}


def test_the_claims_file_declares_the_rule_and_its_groups():
    assert CF.widen_rounds == 6
    groups = CF.widen_groups()
    lm = next(g for g in groups if "ce_lm" in g)
    assert sorted(lm) == ["ce_lm", "entmax_lm", "logz_lm", "zloss_lm"]  # joined through ce_lm
    assert ["ce_lm_hi"] in groups and ["logz_lm_hi"] in groups  # widen: false, each alone
    assert sum(len(g) for g in groups) == len(CF.arms)  # a partition of the arms
    assert rp.tuning.plan_groups(CF, ["zloss_lm"]) == [lm]


def test_run_plan_runs_the_widened_points_then_evaluates_at_the_final_choice():
    """The fake runs score lr by -|log2(lr / 0.0005)|: 0.0005 is best. Round 0 ({0.001, 0.002, 0.004})
    chooses 0.001 for both arms (an end); round 1 adds 0.0005 to both (a: its end; b is at the same end);
    0.0005 wins and is again the lowest, round 2 adds 0.00025, which is worse: final at 0.0005, inside.
    Evaluations run at 0.0005 only."""
    a, b = _arm("a", [0.001, 0.002, 0.004]), _arm("b", [0.001, 0.002, 0.004])
    seen = []

    def fake_execute(run, *, fresh, quick, workdir, threads, timeout):
        lr = dict(run.params)[LR]
        seen.append((run.arm.key, run.phase, lr))
        return {"arm": run.arm.key, "phase": run.phase, "seed": run.seed, "ok": True, "cached": False, "error": "",
                "run_seconds": 0.0, "params": json.dumps(dict(run.params), sort_keys=True),
                "val/open_rank1": -abs(math.log2(lr / 0.0005))}

    tune = rp.tuning.tuning_runs([a, b], [1000], quick=False)
    logs = []
    tune_rows, eval_rows, chosen, tables = rp.running.run_plan(
        [a, b], tune, {"a": [0, 1], "b": [0]}, jobs=2, threads=1, quick=False, workdir="unused", fresh=False,
        timeout=1.0, log=lambda *x, **k: logs.append(x[0]), execute_fn=fake_execute, groups=[["a", "b"]], rounds=2)
    assert chosen == {"a": {LR: 0.0005}, "b": {LR: 0.0005}}
    assert [t["params"][LR] for t in tables["a"]] == [0.001, 0.002, 0.004, 0.0005, 0.00025]
    assert [t["round"] for t in tables["b"]] == [0, 0, 0, 1, 2]
    assert len(tune_rows) == 10 and [r["params"] for r in tune_rows[:6]] == [json.dumps({LR: v}) for v in
                                                                               (0.001, 0.002, 0.004) * 2]
    assert sorted((r["arm"], r["seed"]) for r in eval_rows) == [("a", 0), ("a", 1), ("b", 0)]
    assert all(lr == 0.0005 for k, ph, lr in seen if ph == "eval")
    # every evaluation started after the last widened tuning run
    last_tune = max(i for i, (_, ph, _) in enumerate(seen) if ph == "tune")
    assert min(i for i, (_, ph, _) in enumerate(seen) if ph == "eval") > last_tune
    assert any("widening round 2" in line for line in logs)
    # the replay from the finished rows makes the same decisions (what a report regenerated from the
    # committed runs does)
    st = rp.tuning.tune_group([a, b], rp.tuning.score_from_rows(tune_rows, [1000]), rounds=2)
    assert st.final and st.chosen == chosen and st.points["a"] == [t["params"] for t in tables["a"]]


def test_grid_edges_read_the_widened_lists():
    a = _arm("a", [0.001, 0.002, 0.004])
    assert rp.tuning.grid_edges(a, {LR: 0.001}) == ["lr=0.001 (lowest of 3)"]
    assert rp.tuning.grid_edges(a, {LR: 0.001}, [{LR: 0.0005}]) == []
    assert rp.tuning.grid_edges(a, {LR: 0.0005}, [{LR: 0.0005}]) == ["lr=0.0005 (lowest of 4)"]


def test_explicit_points_widen_along_the_key_every_point_sets():
    """WCDAS-style points (learning rates x settings written out, one setting without a value): the
    learning rate is read as a list; the widened point is the chosen point with it stepped out, the
    setting kept."""
    scale = "model.init_args.loss.init_args.scale"
    pts = tuple(tuple(p.items()) for lr in (0.001, 0.002, 0.005) for p in ({LR: lr}, {LR: lr, scale: 16.0}))
    a = dataclasses.replace(_arm("a", [0.1]), grid=(), points=pts)
    assert rp.tuning.numeric_lists(a) == [LR]

    def score(arm, p):
        base = {0.001: 0.5, 0.002: 0.6, 0.005: 0.7, 0.0125: 0.65}.get(p[LR])
        return None if base is None else (base + (0.01 if scale in p else 0.0), 1)

    st = rp.tuning.tune_group([a], score, rounds=2)
    assert st.final and st.rounds == 1
    assert st.points["a"][-1] == {LR: 0.0125, scale: 16.0}  # 0.005 * 0.005 / 0.002, the chosen setting kept
    assert st.chosen["a"] == {LR: 0.005, scale: 16.0}


def test_points_read_from_a_runs_file_take_the_grid_order_so_they_name_the_same_runs(tmp_path):
    """A runs file writes ``params`` with sorted keys; a widened point of a two-key grid read back in
    that order would give its run other arguments (another key) than the replay's point, so a report
    could not regenerate from its committed runs. ``file_points`` puts the keys in the grid's order."""
    arm = CF.arms["cosine_lt"]  # grid: lr, then loss.init_args.scale (sorted: scale first)
    lr, scale = "model.init_args.lr", "model.init_args.loss.init_args.scale"
    assert [k for k, _ in arm.grid] == [lr, scale]
    widened = {lr: 0.0125, scale: 8.0}  # the replay's point: the grid's order
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerows([["arm", "params"], ["cosine_lt", json.dumps(widened, sort_keys=True)]])
    (read,) = rp.records.file_points([str(path)], [arm])["cosine_lt"]
    assert list(read) == [lr, scale] and read == widened
    run_read, run_replay = (rp.runs.Run(arm, 1000, "tune", tuple(p.items())) for p in (read, widened))
    assert run_read.args(False) == run_replay.args(False)
    key = rp.running._run_key
    assert key(run_read, run_read.args(False)) == key(run_replay, run_replay.args(False))
    # keys the grid does not declare keep their place after the declared ones
    assert list(rp.records.grid_order(arm, {"x": 1, scale: 8.0, lr: 0.01})) == [lr, scale, "x"]


def test_revision_4_widens_lists_of_two_values_and_two_value_points(tmp_path):
    """Up to revision 3 a list of two values never widens (every choice is an end); from revision 4
    (``widen_min`` 2, set from the claims file's revision) it does, a points list of two fixed scales
    included, and grid_edges names such an end."""
    scale = "model.init_args.loss.init_args.scale"
    two = dataclasses.replace(_arm("a", [0.001, 0.002]), grid=((LR, (0.001, 0.002)),))
    assert rp.tuning.numeric_lists(two) == [] and rp.tuning.grid_edges(two, {LR: 0.002}) == []
    two4 = dataclasses.replace(two, widen_min=2)
    assert rp.tuning.numeric_lists(two4) == [LR]
    assert rp.tuning.grid_edges(two4, {LR: 0.002}) == ["lr=0.002 (highest of 2)"]
    score = lambda arm, p: (p[LR], 1)  # higher is better: the highest learning rate wins
    assert rp.tuning.tune_group([two], score, rounds=3).rounds == 0
    st = rp.tuning.tune_group([two4], score, rounds=3)
    assert st.rounds == 3 and [p[LR] for p in st.points["a"]] == [0.001, 0.002, 0.004, 0.008, 0.016]
    pts = tuple(tuple({LR: lr, scale: s}.items()) for lr in (0.001, 0.002, 0.005) for s in (16.0, 32.0))
    fixed = dataclasses.replace(_arm("b", [0.1]), grid=(), points=pts, widen_min=2)
    assert rp.tuning.numeric_lists(fixed) == [LR, scale]
    st = rp.tuning.tune_group([fixed], lambda arm, p: (p[scale] / 100 - abs(p[LR] - 0.002), 1), rounds=1)
    assert st.points["b"][-1] == {LR: 0.002, scale: 64.0}  # the learning rate inside its list: the scale steps out
    # the claims files: revision 4 arms widen two-value lists, revision 3 arms do not
    r4 = rp.claims.load_claims(os.path.join(rp.common.ROOT, "benchmarks", "claims_revision4.yaml"))
    assert {a.widen_min for a in r4.arms.values()} == {2} and {a.widen_min for a in CF.arms.values()} == {3}
