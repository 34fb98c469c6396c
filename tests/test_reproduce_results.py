"""``benchmarks/reproduce_results.py``: the ``--quick`` reproduction runs end to end (tuning run, paired
evaluation, statistics, reports) and its markdown agrees with its CSV; the model selection and the
report's statistics are checked on hand-made runs against independent computations.

The quick run trains the OPL claim (CE + OPL vs CE on MNIST-5k low-data) for 2 batches per arm through
the real CLI in fresh processes: one tuning run and one evaluation run per arm; a second quick run does
the same for one recommendation claim (Partial FC on ML-100k, with the classes-seen columns) and one
retrieval claim (decoupled softmax vs InfoNCE on chatterbot). Its numbers are
meaningless; what is checked is the wiring and that every number in the markdown is computed from
the CSV.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import math
import os
import re
import statistics
import sys

import numpy as np
import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "reproduce_results.py")
T975_9 = 2.262157  # t_{0.975, 9}, from a printed table


sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # as benchmarks/reproduce_results.py puts it there
import reproduce as rp  # noqa: E402  (the reproduction package: rp.claims, rp.runs, rp.running, ...)
import reproduce.cli  # noqa: E402,F401  (the command line imports every step's module)
from tests._helpers.reproduce_runs import only_cached  # noqa: E402

CF = rp.claims.load_claims()


def test_the_entry_point_is_the_packages_command_line():
    """``benchmarks/reproduce_results.py`` (the command the reports and docs quote) runs
    :func:`reproduce.cli.main`, and ``--help`` describes the pipeline."""
    spec = importlib.util.spec_from_file_location("reproduce_results", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main is rp.cli.main
    assert rp.cli.parse_args.__module__ == "reproduce.cli" and rp.__doc__.startswith("Reproduce the papers' claims")


def test_the_printed_command_leaves_out_the_scratch_workdir_and_an_allow_dirty_with_nothing_to_allow():
    argv = ["--claims", "opl", "--workdir", "/tmp/x", "--runs-from", "results/revision4", "--workdir=/tmp/y",
            "--jobs", "2", "--allow-dirty"]
    assert rp.cli.printed_arguments(argv, dirty=False) == ["--claims", "opl", "--runs-from", "results/revision4",
                                                           "--jobs", "2"]
    assert rp.cli.printed_arguments(argv, dirty=True)[-1] == "--allow-dirty"


# ------------------------------------------------------------------------------------------
# selection and report on hand-made runs (no training)
# ------------------------------------------------------------------------------------------
def _row(arm, phase, seed, params=None, **metrics):
    r = {"benchmark": CF.arms[arm].benchmark, "arm": arm, "phase": phase, "seed": seed, "ok": True,
         "params": json.dumps(params or {}, sort_keys=True), "steps": 800, "run_seconds": 10.0,
         "data": json.dumps({"train_size": 975}), "error": "", "label": CF.arms[arm].label}
    r.update(metrics)
    return r


def _three_lr_arm():
    """ce_lt with a three-point learning-rate grid (the claims file's has 9): selection on hand-made rows."""
    arm = dataclasses.replace(CF.arms["ce_lt"], grid=(("model.init_args.lr", (0.001, 0.002, 0.005)),))
    assert arm.key == "ce_lt" and len(CF.arms["ce_lt"].grid_points()) > 3
    return arm


def test_choose_maximises_mean_validation_metric_ties_first():
    arm = _three_lr_arm()
    p = arm.grid_points()
    assert len(p) == 3
    rows = [_row("ce_lt", "tune", s, p[0], **{"val/balanced_acc": v}) for s, v in ((1000, 0.80), (1001, 0.84))]
    rows += [_row("ce_lt", "tune", s, p[1], **{"val/balanced_acc": v}) for s, v in ((1000, 0.90), (1001, 0.70))]
    rows += [_row("ce_lt", "tune", s, p[2], **{"val/balanced_acc": v}) for s, v in ((1000, 0.83), (1001, 0.83))]
    rows.append(_row("ce_lt", "eval", 0, p[1], **{"val/balanced_acc": 0.99, "test/balanced_acc": 0.99}))
    best, table = rp.tuning.choose(arm, rows, quick=False)
    # means over the two tuning seeds: 0.82, 0.80, 0.83 (the single best run, 0.90, does not decide)
    assert best == p[2]
    assert [t["value"] for t in table] == pytest.approx([0.82, 0.80, 0.83]) and [t["n"] for t in table] == [2, 2, 2]


def test_choose_ignores_evaluation_rows_and_breaks_ties_by_order():
    arm = _three_lr_arm()
    p = arm.grid_points()
    rows = [_row("ce_lt", "tune", 1000, p[0], **{"val/balanced_acc": 0.82}),
            _row("ce_lt", "tune", 1000, p[1], **{"val/balanced_acc": 0.80}),
            _row("ce_lt", "tune", 1000, p[2], **{"val/balanced_acc": 0.83}),
            # an evaluation row and a test metric never influence the choice
            _row("ce_lt", "eval", 0, p[1], **{"val/balanced_acc": 0.99, "test/balanced_acc": 0.99})]
    best, table = rp.tuning.choose(arm, rows, quick=False)
    assert best == p[2] and [t["value"] for t in table] == [0.82, 0.80, 0.83]
    rows[2]["val/balanced_acc"] = 0.82  # a tie: the first declared point wins
    assert rp.tuning.choose(arm, rows, quick=False)[0] == p[0]


def test_a_point_that_failed_on_a_seed_ranks_after_the_points_that_trained_on_all():
    """A failed (or diverged) tuning run leaves its point with fewer finite values: it is not chosen
    over a point that trained on every tuning seed, however good its other runs (both choosers)."""
    arm = _three_lr_arm()
    p = arm.grid_points()
    rows = [_row("ce_lt", "tune", s, p[0], **{"val/balanced_acc": 0.80}) for s in (1000, 1001)]
    rows += [_row("ce_lt", "tune", 1000, p[1], **{"val/balanced_acc": 0.95}),
             dict(_row("ce_lt", "tune", 1001, p[1]), ok=False, error="ValueError: logits contains NaN")]
    rows += [_row("ce_lt", "tune", s, p[2], **{"val/balanced_acc": 0.70}) for s in (1000, 1001)]
    best, table = rp.tuning.choose(arm, rows, quick=False)
    assert best == p[0] and [t["n"] for t in table] == [2, 1, 2]
    got = rp.tuning.tune_group([arm], rp.tuning.score_from_rows(rows, [1000, 1001]), rounds=0)
    assert got.chosen[arm.key] == p[0]


def _synthetic_rows():
    """10 seeds of the WCDAS claim: WCDAS = CE + 0.05 + noise on acc_tail, cosine = CE + noise; the
    logit-adjusted and balanced-softmax baselines = CE + 0.02 + noise (their own generator, so that the
    other arms' values do not depend on them)."""
    rng = np.random.default_rng(3)
    lt = np.random.default_rng(4)
    rows = []
    base = rng.uniform(0.5, 0.8, size=10)
    for s in range(10):
        ce = base[s]
        vals = {"ce_lt": ce, "wcdas_lt": ce + 0.05 + rng.normal(0, 0.01), "cosine_lt": ce + rng.normal(0, 0.03),
                "la_lt": ce + 0.02 + lt.normal(0, 0.02), "bsm_lt": ce + 0.02 + lt.normal(0, 0.02)}
        for arm, v in vals.items():
            m = {"test/acc_tail": v, "test/acc_head": 0.95, "test/balanced_acc": (v + 0.95) / 2,
                 "test/loss_scale": 16.0 if arm == "wcdas_lt" else "", "test/loss_rho_mean": 0.5 if arm == "wcdas_lt" else ""}
            m.update({f"test/acc_class_{c}": 0.9 - 0.05 * c for c in range(10)})
            rows.append(_row(arm, "eval", s, CF.arms[arm].grid_points()[0], **m))
    return rows


def _meta(seeds_of):
    """The report metadata ``main`` would pass, for hand-made rows."""
    return {"mode": "test", "command": "x", "code": "c", "date": "d", "versions": {}, "cpus": 2, "cpu": "cpu",
            "jobs": 1, "threads": 1, "ci": "t", "confidence": 0.95, "power": 0.8, "bootstrap_resamples": 10000,
            "tuning_seeds": [1000], "seeds_of": seeds_of}


def _cells(md, heading_key):
    """The paired-check table rows of the claim whose heading ends with ``(`key`)``."""
    block = md.split(f"(`{heading_key}`)", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in block.splitlines():
        if line.startswith("| ") and " | [" in line:
            out.append([c.strip() for c in line.strip("|").split("|")])
    return out


def test_report_statistics_match_an_independent_computation(tmp_path):
    rows = _synthetic_rows()
    claim = next(c for c in CF.claims if c.key == "wcdas")
    res = rp.analysis.claim_results(claim, rows, seeds=list(range(10)), method="t", confidence=0.95)
    chosen = {k: CF.arms[k].grid_points()[0] for k in claim.arms}
    meta = _meta({"wcdas": list(range(10))})
    md_path = tmp_path / "vision.md"
    rp.reports.write_markdown("vision", [claim], [res], rows, CF, chosen, {}, meta, str(md_path), ["vision_forest.png"])
    assert set(claim.run_arms()) == {r["arm"] for r in rows}
    assert rp.plots.plot_forest("vision", [res], CF.arms, str(tmp_path / "f.png")) == len(claim.checks) == 6
    rp.plots.plot_per_class(rows, CF.arms, list(claim.arms), str(tmp_path / "pc.png"))
    for png in ("f.png", "pc.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = md_path.read_text()
    table = _cells(md, "wcdas")
    assert len(table) == len(claim.checks)
    for cells, ch in zip(table, claim.checks):
        fam = {r["seed"]: r[ch.metric] for r in rows if r["arm"] == ch.family}
        base = {r["seed"]: r[ch.metric] for r in rows if r["arm"] == ch.baseline}
        d = np.array([fam[s] - base[s] for s in range(10)])
        half = T975_9 * d.std(ddof=1) / math.sqrt(10)
        assert cells[1] == "10"
        assert float(cells[4]) == pytest.approx(d.mean(), abs=5.1e-5)
        lo, hi = (float(x) for x in cells[5].strip("[]").split(","))
        assert (lo, hi) == pytest.approx((d.mean() - half, d.mean() + half), abs=5.1e-5)
        expected = "reproduced" if lo > 0 else "contradicted" if hi < 0 else "not resolved"
        assert cells[7] == expected
        assert float(cells[6]) > 0
    # WCDAS beats CE by 0.05 +- 0.01 on acc_tail: reproduced; cosine vs CE is noise: not resolved
    assert table[0][7] == "reproduced"
    assert "paired t interval" in md and "MDE" in md and "Verdict:" in md
    # the arms table reports mean +- sd of each arm over its seeds
    ce_vals = [r["test/acc_tail"] for r in rows if r["arm"] == "ce_lt"]
    assert rp.reports.fmt(statistics.fmean(ce_vals), statistics.stdev(ce_vals)) in md


def _plan_arm(key, seconds, lrs):
    import dataclasses

    return dataclasses.replace(CF.arms["cos_pfc01"], key=key, label=key, seconds=seconds,
                               grid=(("model.init_args.lr", tuple(lrs)),), overrides=())


def test_plan_queues_an_arms_evaluation_as_soon_as_its_own_tuning_is_done():
    """Two process slots: the slow arm's single tuning run cannot finish until the fast arm's three
    evaluation runs have run in the other slot, so a plan that evaluated only after all tuning would
    time out here. The rows come back in plan order with the chosen point of each arm."""
    import threading

    slow, fast = _plan_arm("slow", 500.0, [0.05]), _plan_arm("fast", 5.0, [0.1, 0.2])
    fast_evals_done = threading.Event()
    lock = threading.Lock()
    started, calls = [], []

    def fake_execute(run, *, fresh, quick, workdir, threads, timeout):
        with lock:
            started.append((run.arm.key, run.phase, run.seed))
            calls.append(fresh)
        if run.arm.key == "slow" and run.phase == "tune":
            assert fast_evals_done.wait(20), "the fast arm's evaluation never ran beside the slow tuning"
        lr = dict(run.params)["model.init_args.lr"]
        row = {"arm": run.arm.key, "phase": run.phase, "seed": run.seed, "ok": True, "cached": False,
               "error": "", "run_seconds": 0.0, "params": json.dumps(dict(run.params), sort_keys=True),
               "val/open_rank1": 1.0 - abs(lr - 0.2)}  # 0.2 wins where it is on the grid
        with lock:
            if sum(1 for a, p, _ in started if (a, p) == ("fast", "eval")) == 3 and run.arm.key == "fast" \
                    and run.phase == "eval":
                fast_evals_done.set()
        return row

    tune = rp.tuning.tuning_runs([slow, fast], [1000], quick=False)
    logs = []
    tune_rows, eval_rows, chosen, tables = rp.running.run_plan(
        [slow, fast], tune, {"slow": [0, 1], "fast": [0, 1, 2]}, jobs=2, threads=1, quick=False,
        workdir="unused", fresh=False, timeout=1.0, log=lambda *a, **k: logs.append(a[0]), execute_fn=fake_execute)
    assert started[0] == ("slow", "tune", 1000)  # the longest declared run starts first
    first_slow_eval = started.index(("slow", "eval", 0))
    assert all(started.index(("fast", "eval", s)) < first_slow_eval for s in range(3))
    assert [(r["arm"], r["phase"]) for r in tune_rows] == [("slow", "tune"), ("fast", "tune"), ("fast", "tune")]
    assert [(r["arm"], r["seed"]) for r in eval_rows] == [("slow", 0), ("slow", 1), ("fast", 0), ("fast", 1), ("fast", 2)]
    assert chosen == {"slow": {"model.init_args.lr": 0.05}, "fast": {"model.init_args.lr": 0.2}}
    assert [t["n"] for t in tables["fast"]] == [1, 1]
    assert len(logs) == 8 and logs[-1].startswith("[8/8 ") and all(c is False for c in calls)


def test_plan_runs_identical_runs_once():
    """Two arms that agree (same recipe, overrides and grid) share each process: the copy reads the
    first's result (``fresh=False``) after it, even under ``--fresh``."""
    a, b = _plan_arm("a", 50.0, [0.1]), _plan_arm("b", 50.0, [0.1])
    calls = []

    def fake_execute(run, *, fresh, quick, workdir, threads, timeout):
        calls.append((run.arm.key, run.phase, run.seed, fresh))
        return {"arm": run.arm.key, "phase": run.phase, "seed": run.seed, "ok": True, "cached": not fresh,
                "error": "", "run_seconds": 0.0, "params": json.dumps(dict(run.params), sort_keys=True),
                "val/open_rank1": 0.5}

    tune = rp.tuning.tuning_runs([a, b], [1000], quick=False)
    tune_rows, eval_rows, _, _ = rp.running.run_plan([a, b], tune, {"a": [0], "b": [0]}, jobs=2, threads=1, quick=False,
                                                     workdir="unused", fresh=True, timeout=1.0, log=lambda *x, **k: None,
                                                     execute_fn=fake_execute)
    assert sorted(calls) == [("a", "eval", 0, True), ("a", "tune", 1000, True),
                             ("b", "eval", 0, False), ("b", "tune", 1000, False)]
    assert [r["arm"] for r in tune_rows] == ["a", "b"] and [r["arm"] for r in eval_rows] == ["a", "b"]


def test_plan_with_a_deadline_starts_only_runs_that_fit_and_reads_finished_ones(tmp_path):
    """One slot and a simulated clock that each run advances by its declared seconds: after the long
    arm's tuning (0 -> 100 s) its evaluations (100 s each) no longer fit before the 150 s deadline, so
    the short arm's runs take the slot; the long arm's seed 1, finished in the workdir beforehand, is
    read anyway; seed 0 is never started and has no row."""
    long, short = _plan_arm("long", 100.0, [0.1]), _plan_arm("short", 10.0, [0.2])
    now = [0.0]
    started = []

    def fake_execute(run, *, fresh, quick, workdir, threads, timeout):
        started.append((run.arm.key, run.phase, run.seed))
        if (row := rp.running.cached_row(run, quick=quick, workdir=workdir)) is not None:
            return row
        now[0] += run.arm.seconds
        return {"arm": run.arm.key, "phase": run.phase, "seed": run.seed, "ok": True, "cached": False,
                "error": "", "run_seconds": run.arm.seconds, "params": json.dumps(dict(run.params), sort_keys=True),
                "val/open_rank1": 0.5}

    _finish(rp.runs.Run(long, 1, "eval", (("model.init_args.lr", 0.1),)), tmp_path)
    tune = rp.tuning.tuning_runs([long, short], [1000], quick=False)
    logs = []
    tune_rows, eval_rows, chosen, _ = rp.running.run_plan(
        [long, short], tune, {"long": [0, 1], "short": [0, 1]}, jobs=1, threads=1, quick=False,
        workdir=str(tmp_path), fresh=False, timeout=1.0, log=lambda *a, **k: logs.append(a[0]),
        execute_fn=fake_execute, deadline=150.0, clock=lambda: now[0])
    assert started == [("long", "tune", 1000), ("long", "eval", 1), ("short", "tune", 1000),
                       ("short", "eval", 0), ("short", "eval", 1)]
    assert now[0] == 130.0
    assert [r["arm"] for r in tune_rows] == ["long", "short"]
    assert [(r["arm"], r["seed"], r["cached"]) for r in eval_rows] == [("long", 1, True), ("short", 0, False),
                                                                     ("short", 1, False)]
    assert chosen == {"long": {"model.init_args.lr": 0.1}, "short": {"model.init_args.lr": 0.2}}
    assert "1 run(s) not started" in logs[-1] and "(long)" in logs[-1]
    # without a deadline the same plan runs everything
    now[0], started[:] = 0.0, []
    _, eval_rows, _, _ = rp.running.run_plan(
        [long, short], tune, {"long": [0, 1], "short": [0, 1]}, jobs=1, threads=1, quick=False,
        workdir=str(tmp_path), fresh=False, timeout=1.0, log=lambda *a, **k: None, execute_fn=fake_execute,
        clock=lambda: now[0])
    assert len(started) == 6 and len(eval_rows) == 4


def test_deadline_that_nothing_fits_writes_no_report(tmp_path, monkeypatch, capsys):
    """``--deadline 0`` with no finished runs starts nothing (any execution fails this test) and writes
    no report; the exit status says the work is unfinished."""
    only_cached(monkeypatch)
    out, work = tmp_path / "out", tmp_path / "work"
    code = rp.cli.main(["--claims", "opl", "--deadline", "0", "--out", str(out), "--workdir", str(work), "--jobs", "1",
                        "--allow-dirty"])
    assert code == 3
    assert not out.exists() or not any(out.iterdir())
    msg = capsys.readouterr().out
    assert "stopped at the deadline" in msg and "no report written" in msg


def _finish(run, workdir, ok=True, **val):
    d = rp.running._run_dir(run, run.args(False), str(workdir))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "result.json"), "w") as fh:
        json.dump({"ok": ok, "val_metrics": val, "wall_seconds": 1.0}, fh)


def test_plan_status_counts_the_runs_finished_in_the_workdir(tmp_path):
    """Evaluation runs count only under the point the finished tuning chose; a failed run is not
    finished; the time left is the declared seconds of the unfinished runs."""
    claim = next(c for c in CF.claims if c.key == "pfc_cosface_c1e5")
    fam, base = (CF.arms[k] for k in claim.arms)
    seeds_of = {claim.key: [0, 1, 2]}
    status = lambda: rp.running.plan_status([claim], CF.arms, [1000], seeds_of, quick=False, workdir=str(tmp_path))[0]
    st = status()
    assert (st["tune"], st["eval"], st["tune_done"], st["eval_done"]) == (8, 6, 0, 0)
    assert st["seconds_left"] == st["seconds"] == pytest.approx(7 * (fam.seconds + base.seconds))
    for i, r in enumerate(rp.tuning.tuning_runs([fam], [1000], quick=False)):  # the third point wins
        _finish(r, tmp_path, **{"val/open_rank1": 0.9 if i == 2 else 0.1})
    best = fam.grid_points()[2]
    _finish(rp.runs.Run(fam, 0, "eval", tuple(best.items())), tmp_path)
    _finish(rp.runs.Run(fam, 1, "eval", tuple(fam.grid_points()[0].items())), tmp_path)  # another point: not it
    _finish(rp.runs.Run(fam, 2, "eval", tuple(best.items())), tmp_path, ok=False)
    _finish(rp.tuning.tuning_runs([base], [1000], quick=False)[0], tmp_path, **{"val/open_rank1": 0.5})
    st = status()
    assert (st["tune_done"], st["eval_done"], st["open_arms"]) == (5, 1, [fam.key, base.key])
    assert st["seconds_left"] == pytest.approx(2 * fam.seconds + 6 * base.seconds)


# ------------------------------------------------------------------------------------------
# runs files: regenerate from committed runs, export and resume unfinished work
# ------------------------------------------------------------------------------------------
def _finish_full(run, workdir, seed_value, *, versions=True):
    """A finished run's result.json with every kind of field the worker writes."""
    d = rp.running._run_dir(run, run.args(False), str(workdir))
    os.makedirs(d, exist_ok=True)
    res = {"ok": True, "epochs": run.arm.epochs, "steps": 3125, "fit_seconds": 700.123456, "test_seconds": 0.0,
           "wall_seconds": 712.5, "peak_rss_mb": 1390.27, "recipe_sha": rp.records._match_fields(run)[1],
           "code": "deadbeef", "started": "t0",
           "data": {"num_classes": 100000, "train_size": 400000},
           "fit_metrics": {"train/step_ms": 190.0 + seed_value, "train/loss": 3.0},
           "val_metrics": {"val/open_rank1": 0.1 * seed_value, "val/top1": 1.0 / 3.0},
           "test_metrics": {"test/open_rank1": 0.5 + seed_value} if run.phase == "eval" else {}}
    if versions:
        res["versions"] = {"python": "3.11.7", "sys_version": "long", "torch": "2.14.1", "pytorch_lightning": "2.6.6",
                           "threads": 1}
    with open(os.path.join(d, "result.json"), "w") as fh:
        json.dump(res, fh)


def test_reports_regenerate_from_the_committed_runs_without_running_anything(tmp_path, monkeypatch):
    """The committed runs file is enough to rebuild a claim's report on a fresh machine: every run is
    read from it (none executes), and every committed column of its rows comes back unchanged."""
    only_cached(monkeypatch)
    committed = os.path.join(ROOT, "results", "revision2")
    out, work = tmp_path / "out", tmp_path / "work"
    # the revision-2 reports regenerate under the revision-2 claims file frozen beside their runs
    code = rp.cli.main(["--claims", "nbc_softmax,partial_fc_ml100k", "--runs-from", committed, "--out", str(out),
                        "--workdir", str(work), "--jobs", "1", "--claims-file", os.path.join(committed, "claims.yaml"),
                        "--allow-dirty"])  # nothing runs: a checkout with uncommitted changes may regenerate
    assert code == 0
    claims = {c.key: c for c in CF.claims}
    for bench, key in (("retrieval", "nbc_softmax"), ("recommendation", "partial_fc_ml100k")):
        arms = claims[key].arms
        with open(os.path.join(committed, f"{bench}_runs.csv"), newline="") as fh:
            old = [r for r in csv.DictReader(fh) if r["arm"] in arms]
        with open(out / f"{bench}_runs.csv", newline="") as fh:
            new = list(csv.DictReader(fh))
        assert len(new) == len(old) > 0
        key = lambda r: (r["arm"], r["phase"], r["seed"], r["params"])
        new_by = {key(r): r for r in new}
        for r in old:
            assert {k: new_by[key(r)].get(k, "") for k in r} == r  # a column only other arms fill is empty
        assert all(r["key"] for r in new)  # the rebuilt rows carry the exact run key
    # the verdicts are the committed report's
    old_summary = open(os.path.join(committed, "summary.md")).read()
    for line in (out / "summary.md").read_text().splitlines():
        if line.startswith("| ") and "[" in line and "|---" not in line:
            assert line in old_summary


def test_a_changed_recipe_never_reuses_the_committed_runs_of_the_old_one(tmp_path):
    """A run's key holds its recipe's parsed content: the many-class recipes changed after revision 2
    (the nuisance mixing), so none of revision 2's many-class rows stands in for a run of the current
    recipes, while the unchanged retrieval recipes' rows all do."""
    committed = os.path.join(ROOT, "results", "revision2")
    rev2 = rp.claims.load_claims(os.path.join(committed, "claims.yaml"))
    for bench, key, expect_hits in (("many_class", "pfc_arcface", False), ("retrieval", "nbc_softmax", True)):
        claim = next(c for c in rev2.claims if c.key == key)
        arms = [rev2.arms[k] for k in claim.arms]
        runs = rp.tuning.tuning_runs(arms, [1000], quick=False)
        path = os.path.join(committed, f"{bench}_runs.csv")
        with open(path, newline="") as fh:
            rows = [r for r in csv.DictReader(fh) if r["arm"] in claim.arms and r["phase"] == "tune"]
        assert rows and all(r["key"] for r in rows)
        changed = {r["recipe_sha"] != rp.running._recipe_sha(rev2.arms[r["arm"]]) for r in rows}
        assert changed == {not expect_hits}
        written, had = rp.records.seed_workdir(runs, [path], workdir=str(tmp_path / key), quick=False)
        assert had == 0
        assert (written == len({r["key"] for r in rows})) if expect_hits else written == 0


def test_exported_runs_resume_on_another_workdir(tmp_path, monkeypatch):
    """``--export-runs`` writes what a workdir has finished; ``--runs-from`` on an empty workdir makes
    the same runs finished there, with identical rows; the plan then counts them as finished."""
    claim = next(c for c in CF.claims if c.key == "pfc_cosface_c1e5")
    fam, base = (CF.arms[k] for k in claim.arms)
    a, b = tmp_path / "a", tmp_path / "b"
    tune = rp.tuning.tuning_runs([fam, base], [1000], quick=False)
    for i, r in enumerate(tune[:6]):
        _finish_full(r, a, i, versions=i != 1)
    best = fam.grid_points()[3]  # the family's last point gets the highest validation value (0.3)
    ev = [rp.runs.Run(fam, s, "eval", tuple(best.items())) for s in (0, 1)]
    for r in ev:
        _finish_full(r, a, 7 + r.seed)
    export = tmp_path / "part" / "many_class_runs.csv"
    assert rp.cli.main(["--claims", claim.key, "--workdir", str(a), "--export-runs", str(export)]) == 0
    with open(export, newline="") as fh:
        exported = list(csv.DictReader(fh))
    assert len(exported) == 8 and all(r["key"] for r in exported)
    assert json.loads(next(r for r in exported if r["seed"] == "0")["versions"]) == \
        {"python": "3.11.7", "pytorch_lightning": "2.6.6", "torch": "2.14.1"}

    rp.cli.main(["--claims", claim.key, "--workdir", str(b), "--runs-from", str(export), "--plan"])
    for r in tune[:6] + ev:
        ra, rb = (rp.running.cached_row(r, quick=False, workdir=str(w)) for w in (a, b))
        assert rb is not None
        fixed = [k for k in rp.records.CSV_FIXED if k != "cached"]
        assert {k: rb[k] for k in fixed} == {k: ra[k] for k in fixed}
        assert {k: v for k, v in rb.items() if "/" in k} == {k: v for k, v in ra.items() if "/" in k}
    for r in tune[6:]:
        assert rp.running.cached_row(r, quick=False, workdir=str(b)) is None
    st = rp.running.plan_status([claim], CF.arms, [1000], {claim.key: [0, 1, 2]}, quick=False, workdir=str(b))[0]
    # the family's tuning is done and chose its last point (highest validation value), where its two
    # evaluation runs are; the baseline's tuning is not done, so none of its evaluation counts yet
    assert (st["tune_done"], st["eval_done"], st["open_arms"]) == (6, 2, [fam.key, base.key])

    # a run the workdir already holds is left as it is; a second seeding writes nothing
    assert rp.records.seed_workdir(tune, [str(export)], workdir=str(b), quick=False) == (0, 6)


def test_runs_file_rows_match_by_key_or_by_their_fields(tmp_path):
    """Rows carrying a key match only that exact run; older rows without one match on recipe content,
    phase, seed, overrides, grid point and epochs; a changed recipe or failed run never matches."""
    arm = CF.arms["cos_c1e5_pfc01"]
    run = rp.tuning.tuning_runs([arm], [1000], quick=False)[0]
    src = tmp_path / "src"
    _finish_full(run, src, 1)
    row = rp.running.cached_row(run, quick=False, workdir=str(src))
    path = tmp_path / "x_runs.csv"

    def seeded(mutate):
        r = dict(row)
        mutate(r)
        rp.records.write_csv([r], str(path))
        work = tmp_path / f"w{len(list(tmp_path.iterdir()))}"
        return rp.records.seed_workdir([run], [str(path)], workdir=str(work), quick=False)[0]

    assert seeded(lambda r: None) == 1
    assert seeded(lambda r: r.update(key="0" * 16)) == 0  # another run's key
    assert seeded(lambda r: r.update(key="")) == 1  # no key: the fields decide
    assert seeded(lambda r: r.update(key="", recipe_sha="000000000000")) == 0  # the recipe changed since
    assert seeded(lambda r: r.update(key="", seed=1001)) == 0
    assert seeded(lambda r: r.update(key="", epochs=arm.epochs + 1)) == 0
    assert seeded(lambda r: r.update(key="", params=json.dumps({"model.init_args.lr": 0.5}))) == 0
    assert seeded(lambda r: r.update(ok=False)) == 0


def test_runs_from_refuses_fresh_and_missing_paths(tmp_path):
    with pytest.raises(SystemExit, match="cannot be combined"):
        rp.cli.main(["--claims", "opl", "--fresh", "--runs-from", str(tmp_path), "--workdir", str(tmp_path), "--plan"])
    with pytest.raises(SystemExit, match="no such file or folder"):
        rp.cli.main(["--claims", "opl", "--runs-from", str(tmp_path / "nope"), "--workdir", str(tmp_path), "--plan"])


def test_versions_line_says_how_many_runs_recorded_them():
    full = {"python": "3.11.7", "torch": "2.14.1", "pytorch_lightning": "2.6.6"}
    assert rp.reports._versions([{"_versions": {}}, {"_versions": full}]) == {**full, "recorded": 1, "runs": 2}
    assert rp.reports._versions_text(rp.reports._versions([{"_versions": full}])) == \
        "Python 3.11.7; torch 2.14.1, pytorch-lightning 2.6.6"
    text = rp.reports._versions_text
    assert "recorded by 1 of the 2 runs" in text(rp.reports._versions([{"_versions": {}}, {"_versions": full}]))
    assert text(rp.reports._versions([{"_versions": {"threads": 1}}])).startswith("library versions: not recorded")


def test_grid_edges_flags_a_choice_at_an_end_of_a_numeric_list():
    arm = CF.arms["ce_lt"]  # lr over [0.0005, ..., 0.01], 9 values
    points = arm.grid_points()
    assert len(points) == 9
    assert rp.tuning.grid_edges(arm, points[0]) == ["lr=0.0005 (lowest of 9)"]
    assert all(rp.tuning.grid_edges(arm, p) == [] for p in points[1:-1])
    assert rp.tuning.grid_edges(arm, points[-1]) == ["lr=0.01 (highest of 9)"]
    assert rp.tuning.grid_edges(arm, {}) == []
    cos = CF.arms["cosine_lt"]  # a product: lr x scale, each list read on its own
    assert rp.tuning.grid_edges(cos, {"model.init_args.lr": 0.002, "model.init_args.loss.init_args.scale": 32.0}) == \
        ["scale=32.0 (highest of 3)"]
    assert rp.tuning.grid_edges(cos, {"model.init_args.lr": 0.001, "model.init_args.loss.init_args.scale": 8.0}) == \
        ["lr=0.001 (lowest of 3)", "scale=8.0 (lowest of 3)"]
    # points written out: only a key every point sets to a number (here the learning rate) has an order
    explicit = CF.arms["wcdas_lt"]
    assert rp.tuning.numeric_lists(explicit) == ["model.init_args.lr"]
    assert rp.tuning.grid_edges(explicit, {"model.init_args.lr": 0.002,
                                           "model.init_args.loss.init_args.scale": 32.0}) == []
    assert rp.tuning.grid_edges(explicit, {"model.init_args.lr": 0.005}) == ["lr=0.005 (highest of 3)"]
    two = rp.claims.Arm("x", "vision", "x", arm.recipe, 1, "val/acc", grid=(("model.init_args.lr", (0.1, 0.2)),))
    assert rp.tuning.grid_edges(two, {"model.init_args.lr": 0.2}) == []  # with two values every choice is an end


def test_report_names_the_arms_tuned_at_a_grid_edge(tmp_path):
    rows = _synthetic_rows()
    claim = next(c for c in CF.claims if c.key == "wcdas")
    res = rp.analysis.claim_results(claim, rows, seeds=list(range(10)), method="t", confidence=0.95)
    chosen = {k: CF.arms[k].grid_points()[1] for k in claim.arms}
    chosen["ce_lt"] = CF.arms["ce_lt"].grid_points()[-1]
    meta = _meta({"wcdas": list(range(10))})
    md_path = tmp_path / "vision.md"
    rp.reports.write_markdown("vision", [claim], [res], rows, CF, chosen, {}, meta, str(md_path), [])
    md = md_path.read_text()
    edge_lines = [line for line in md.splitlines() if line.startswith("Chosen at an end of its grid")]
    assert len(edge_lines) == 1
    assert f"{CF.arms['ce_lt'].label}: lr=0.01 (highest of 9)" in edge_lines[0]
    others = [k for k in claim.arms if k != "ce_lt" and rp.tuning.grid_edges(CF.arms[k], chosen[k])]
    assert all(CF.arms[k].label in edge_lines[0] for k in others)


def test_bootstrap_option_is_used_and_stated(tmp_path):
    rows = _synthetic_rows()
    claim = next(c for c in CF.claims if c.key == "wcdas")
    res = rp.analysis.claim_results(claim, rows, seeds=list(range(10)), method="bootstrap", confidence=0.95)
    ci = res["checks"][0]["ci"]
    assert ci.method == "bootstrap" and ci.low > 0  # 0.05 +- 0.01 over 10 seeds
    d = np.array([r["test/acc_tail"] for r in rows if r["arm"] == "wcdas_lt"]) - \
        np.array([r["test/acc_tail"] for r in rows if r["arm"] == "ce_lt"])
    # percentile bootstrap of the mean: inside the range of the data, near mean +- 1.96 sd / sqrt(n)
    half = 1.96 * d.std(ddof=0) / math.sqrt(10)
    assert ci.low == pytest.approx(d.mean() - half, abs=0.3 * half)
    assert ci.high == pytest.approx(d.mean() + half, abs=0.3 * half)
    meta = {**_meta({"wcdas": list(range(10))}), "ci": "bootstrap"}
    path = tmp_path / "v.md"
    rp.reports.write_markdown("vision", [claim], [res], rows, CF, {}, {}, meta, str(path), [])
    assert "percentile bootstrap of the mean (10000 resamples)" in path.read_text()


# ------------------------------------------------------------------------------------------
# the reduced reproduction, end to end
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def quick_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    work = tmp_path_factory.mktemp("work")
    code = rp.cli.main(["--quick", "--claims", "opl", "--jobs", "2", "--out", str(out), "--workdir", str(work)])
    return out, code


def test_quick_refuses_the_committed_results():
    with pytest.raises(SystemExit, match="outside results/"):
        rp.cli.main(["--quick", "--claims", "opl", "--out", os.path.join(ROOT, "results")])


def test_quick_reproduction_writes_everything(quick_out):
    out, code = quick_out
    assert code == 0, (out / "vision_runs.csv").read_text()
    for name in ("vision.md", "summary.md", "vision_runs.csv", "vision.png", "vision_forest.png"):
        assert (out / name).exists() and (out / name).stat().st_size > 0, name
    for name in ("vision.png", "vision_forest.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "segmentation.md").exists()
    md = (out / "vision.md").read_text()
    assert "MNIST-5k" in md and "test_resnet" in md and "train_size=350" in md
    # one seed: no CI, no verdict either way; after 2 batches an arm may also sit under its competence
    # floor (chance), which makes the claim invalid rather than decided
    assert re.search(r"Verdict: (not resolved|invalid \(arm .+ did not train\))", md) and "n/a (n < 2)" in md
    assert "OPL" in (out / "summary.md").read_text()


def test_a_forked_run_equals_a_fresh_interpreter_run(quick_out, tmp_path):
    """The quick reproduction forks its runs from a server that imported torch and Lightning once
    (the default ``--isolation fork``); the same run in a fresh interpreter (``process``) gives the
    same metrics, bit for bit (one thread, seeded: nothing carries over from the server)."""
    out, _ = quick_out
    with open(out / "vision_runs.csv", newline="") as fh:
        forked = next(r for r in csv.DictReader(fh) if r["arm"] == "ce_lowdata" and r["phase"] == "eval")
    run = rp.runs.Run(arm=CF.arms["ce_lowdata"], seed=int(forked["seed"]), phase="eval",
                      params=tuple(sorted(json.loads(forked["params"]).items())))
    fresh = rp.running.execute(run, quick=True, workdir=str(tmp_path), threads=1, fresh=True, timeout=600,
                               isolation="process")
    assert fresh["ok"], fresh["error"]
    metrics = [k for k in fresh if k.startswith("test/")]
    assert len(metrics) >= 10 and "test/loss" in metrics
    assert {k: str(fresh[k]) for k in metrics} == {k: forked[k] for k in metrics}
    assert fresh["key"] == forked["key"]  # the same run: isolation is not part of what a run is


def test_quick_csv_phases_and_markdown_agree(quick_out):
    out, _ = quick_out
    with open(out / "vision_runs.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted((r["arm"], r["phase"]) for r in rows) == [("ce_lowdata", "eval"), ("ce_lowdata", "tune"),
                                                           ("opl_lowdata", "eval"), ("opl_lowdata", "tune")]
    cpu = rp.cli._cpu_name()
    for r in rows:
        assert r["ok"] == "True", r["error"]
        assert r["device"] == f"cpu: {cpu}", r["device"]  # the device each run trained on
        if r["phase"] == "tune":  # validation only: the test split is never read for selection
            assert r["seed"] == "1000" and r["val/top1"] != "" and r["test/top1"] == ""
        else:
            assert r["seed"] == "0" and r["test/top1"] != "" and int(r["steps"]) == 2
    md = (out / "vision.md").read_text()
    assert f"- devices the runs trained on: `cpu: {cpu}` (4 run(s))" in md
    block = md.split("(`opl`)", 1)[1]
    header = next(line for line in block.splitlines() if line.startswith("| arm |"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    checked = 0
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != len(cols) or cells[0] in ("arm", "---") or line.startswith("|---"):
            continue
        arm = next(k for k in ("opl_lowdata", "ce_lowdata") if CF.arms[k].label == cells[0])
        ev = next(r for r in rows if r["arm"] == arm and r["phase"] == "eval")
        for col, cell in zip(cols, cells):
            if col in ("top1", "cos_intra", "cos_inter"):
                assert rp.reports.parse_fmt(cell)[0] == pytest.approx(float(ev[f"test/{col}"]), abs=5.1e-5)
                checked += 1
    assert checked == 6


def test_quick_rows_carry_curve_test_split_and_code_hash(quick_out):
    out, _ = quick_out
    with open(out / "vision_runs.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        assert r["code_hash"] == rp.running._code_hash(CF.arms[r["arm"]])
        assert re.fullmatch(r"[0-9a-f]{12}", r["test_split"])
        curve = json.loads(r["curve"])
        assert len(curve["val/top1"]) == 1 and "val/loss" in curve  # 1 epoch, validated once
    # one test split for the tuning seed (1000) and the evaluation seed (0): evaluation.test_seed
    assert len({r["test_split"] for r in rows}) == 1
    md = (out / "vision.md").read_text()
    assert "Test split: one for all 2 evaluation runs" in md and "Learning curve of the primary baseline" in md
    assert (out / "vision_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "vision_curves.png" in md


# ------------------------------------------------------------------------------------------
# the reduced reproduction of one recommendation and one retrieval claim, end to end
# ------------------------------------------------------------------------------------------
REC_RET = ("partial_fc_ml100k", "decoupled_softmax_chatterbot")


@pytest.fixture(scope="module")
def quick_rec_ret(tmp_path_factory):
    out = tmp_path_factory.mktemp("results_rec_ret")
    work = tmp_path_factory.mktemp("work_rec_ret")
    # one invocation for these two claims and the language-model claim below (one fork server, which
    # imports torch and Lightning once, instead of two)
    code = rp.cli.main(["--quick", "--claims", ",".join((*REC_RET, "z_loss_lm")), "--jobs", "2", "--out", str(out),
                        "--workdir", str(work)])
    return out, code


@pytest.mark.slow
def test_quick_recommendation_and_retrieval_claims_end_to_end(quick_rec_ret):
    out, code = quick_rec_ret
    assert code == 0, (out / "recommendation_runs.csv").read_text()
    for b in ("recommendation", "retrieval"):
        for name in (f"{b}.md", f"{b}_runs.csv", f"{b}.png", f"{b}_forest.png"):
            assert (out / name).exists() and (out / name).stat().st_size > 0, name
    assert not (out / "vision.md").exists()
    summary = (out / "summary.md").read_text()
    assert "Partial FC" in summary and "decoupled softmax" in summary
    expected = {"recommendation": ["pfc_01", "pfc_10"], "retrieval": ["dsm_chat", "infonce_chat"]}
    for b, arms in expected.items():
        with open(out / f"{b}_runs.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert sorted((r["arm"], r["phase"]) for r in rows) == sorted(
            (a, p) for a in arms for p in ("eval", "tune"))
        md = (out / f"{b}.md").read_text()
        for r in rows:
            assert r["ok"] == "True", r["error"]
            if r["phase"] == "tune":  # validation only
                key = "val/recall@20" if b == "recommendation" else "val/ndcg@10"
                assert r["seed"] == "1000" and r[key] != "" and r[key.replace("val/", "test/")] == ""
            else:
                assert r["seed"] == "0" and int(r["steps"]) == 2
        ev = {r["arm"]: r for r in rows if r["phase"] == "eval"}
        # evaluation.test_seed: the tuning seed (1000) and the evaluation seed (0) share one test split
        assert len({r["test_split"] for r in rows}) == 1 and rows[0]["test_split"]
        assert all(json.loads(r["curve"]) for r in ev.values())
        if b == "recommendation":
            # the classes each step's softmax saw: rate 0.1 of 1,682 (k = 168) < the distinct positives of
            # a batch of 1,024 pairs, so both rates softmax over exactly the batch's positives ... or all items
            r01, r10 = ev["pfc_01"], ev["pfc_10"]
            assert float(r01["train/softmax_classes"]) == pytest.approx(float(r01["train/positive_classes"]))
            assert float(r01["train/positive_classes"]) > 168
            assert float(r10["train/softmax_classes"]) == 1682.0
            assert "softmax_classes" in md and "test_interactions=943" in md
            for r in rows:
                assert json.loads(r["data"])["dataset"] == "ml-100k"
        else:
            assert "r@1" in md and "dataset=chatterbot" in md
        for a in arms:  # every arm's table row shows its computed test metric
            label = CF.arms[a].label
            line = next(line for line in md.splitlines() if line.startswith(f"| {label} |"))
            metric = "recall@20" if b == "recommendation" else "r@1"
            assert f"{float(ev[a][f'test/{metric}']):.4f}" in line


# ------------------------------------------------------------------------------------------
# the reduced reproduction of one language-model claim, end to end
# ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_quick_language_model_claim_end_to_end(quick_rec_ret):
    """``--quick --claims ...,z_loss_lm``: one tuning and one evaluation run per arm of the small LM
    recipes through the real CLI (2 batches each), the unigram reference columns that the claim's
    competence floors name, and the report (the same invocation as the claims above)."""
    out, code = quick_rec_ret
    assert code == 0, (out / "language_model_runs.csv").read_text()
    for name in ("language_model.md", "language_model_runs.csv", "summary.md"):
        assert (out / name).exists() and (out / name).stat().st_size > 0, name
    with open(out / "language_model_runs.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted((r["arm"], r["phase"]) for r in rows) == [("ce_lm", "eval"), ("ce_lm", "tune"),
                                                           ("zloss_lm", "eval"), ("zloss_lm", "tune")]
    claim = next(c for c in CF.claims if c.key == "z_loss_lm")
    for r in rows:
        assert r["ok"] == "True", r["error"]
        assert json.loads(r["data"])["dataset"] == "stdlib-source"
        if r["phase"] == "tune":  # validation only: the test split is never read for selection
            assert r["seed"] == "1000" and r["val/top1"] != "" and r["test/top1"] == ""
        else:
            assert r["seed"] == "0" and int(r["steps"]) == 2
            for metric, floor in claim.floors:  # the floor columns come from the same runs
                assert 0.0 < float(r[floor]) < 1.0 and r[metric] != ""
            assert float(r["test/unigram_ppl"]) > 1.0
    # the two arms start from the same weights and see the same data: the reference is the same
    ev = {r["arm"]: r for r in rows if r["phase"] == "eval"}
    assert ev["ce_lm"]["test/unigram_top1"] == ev["zloss_lm"]["test/unigram_top1"]
    md = (out / "language_model.md").read_text()
    assert "(`z_loss_lm`)" in md and "Competence floors" in md and "unigram_top1" in md
    assert re.search(r"Verdict: (not resolved|invalid \(arm .+ did not train\))", md)


# ------------------------------------------------------------------------------------------------
# protocol revision 3 on hand-made runs (no training)
# ------------------------------------------------------------------------------------------------
def _rev3_cells(md, key):
    block = md.split(f"(`{key}`)", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()
            if line.startswith("| ") and ("| primary |" in line or "| secondary" in line)]


def test_revision_3_report_primary_holm_and_competence_gate(tmp_path):
    from scipy import stats as sst

    rows = _synthetic_rows()
    claim = next(c for c in CF.claims if c.key == "wcdas")
    res = rp.analysis.claim_results(claim, rows, seeds=list(range(10)), method="t", confidence=0.95, revision=3)
    meta = {**_meta({"wcdas": list(range(10))}), "revision": 3}
    path = tmp_path / "vision.md"
    rp.reports.write_markdown("vision", [claim], [res], rows, CF, {}, {}, meta, str(path), [])
    md = path.read_text()
    cells = _rev3_cells(md, "wcdas")
    assert [c[1].split(" (")[0] for c in cells] == ["primary" if ch.primary else "secondary" for ch in claim.checks]
    assert [ch.primary for ch in claim.checks] == [False, False, True, False, False, False]
    # independent: two-sided paired t p-values of the secondary checks, Holm by hand
    p = []
    for ch in claim.checks:
        fam = np.array([r[ch.metric] for r in rows if r["arm"] == ch.family])
        base = np.array([r[ch.metric] for r in rows if r["arm"] == ch.baseline])
        d = fam - base
        t = d.mean() / (d.std(ddof=1) / math.sqrt(10))
        p.append(2 * sst.t.sf(t, 9))
    sec = [i for i, ch in enumerate(claim.checks) if not ch.primary]
    order = sorted(sec, key=lambda i: p[i])
    holm, running = {}, 0.0
    for r, i in enumerate(order):
        running = max(running, min(1.0, (len(sec) - r) * p[i]))
        holm[i] = running
    for i in sec:
        raw, adj = (float(x) for x in cells[i][8].split(" / "))
        assert raw == pytest.approx(p[i], rel=1e-3) and adj == pytest.approx(holm[i], rel=1e-3)
        assert f"Holm rank {order.index(i) + 1})" in cells[i][1]
        assert cells[i][10].startswith("reproduced" if holm[i] < 0.05 else ("not resolved", "contradicted"))
    # the primary (balanced accuracy vs CE: +0.025 per seed) decides
    assert cells[2][10] == "reproduced" and res["verdict"] == "reproduced"
    assert "**Verdict: reproduced** (the primary check's)." in md and "Competence floors" in md
    assert "decidable at this n" in md and "MDE" not in md

    # the competence gate: CE's balanced accuracy under its floor (0.1) makes the claim invalid
    low = [dict(r, **{"test/balanced_acc": 0.05}) if r["arm"] == "ce_lt" else r for r in rows]
    res = rp.analysis.claim_results(claim, low, seeds=list(range(10)), method="t", confidence=0.95, revision=3)
    assert res["rev3"].primary.verdict == "reproduced" and res["verdict"] == "invalid (arm ce_lt did not train)"
    lines = rp.reports.summary_rev3([res], CF.arms, meta)
    assert "1 claims: 0 reproduced, 0 contradicted, 0 not resolved, 1 invalid" in lines[0]
    assert any("| invalid (arm ce_lt did not train) |" in line for line in lines)


def test_revision_3_sanity_claim_and_did_in_the_report(tmp_path):
    # decoupled softmax = InfoNCE with one positive: identical runs, a sanity claim; PSL false negatives:
    # difference in differences against the clean arms of the psl claim
    rows = []
    for s in range(10):
        for arm in ("dsm_stdlib", "infonce_stdlib"):
            rows.append(_row(arm, "eval", s, **{"test/r@1": 0.6 + 0.01 * s, "test/ndcg@10": 0.7, "test/r@10": 0.9,
                                                 "test/mrr@10": 0.65}))
    sanity = next(c for c in CF.claims if c.key == "decoupled_softmax_stdlib")
    res = rp.analysis.claim_results(sanity, rows, seeds=list(range(10)), method="t", confidence=0.95, revision=3)
    assert res["rev3"].sanity and res["verdict"] == "holds"
    lines = rp.reports.summary_rev3([res], CF.arms, {"seeds_of": {sanity.key: list(range(10))}})
    assert "0 claims" in lines[0] and any(line.startswith("| `decoupled_softmax_stdlib` | sanity: r@1") for line in lines)

    fn = next(c for c in CF.claims if c.key == "psl_false_negatives")
    rng = np.random.default_rng(0)
    rows = []
    for s in range(10):
        base = 0.2 + rng.normal(0, 0.01)
        vals = {"ssm_rs": base, "psl_tanh_rs": base + 0.003, "ssm_fn": base - 0.02, "psl_tanh_fn": base - 0.01}
        for arm, v in vals.items():
            rows.append(_row(arm, "eval", s, **{"test/recall@20": v + rng.normal(0, 0.001), "test/ndcg@20": v,
                                                 "test/debiased_recall@20": v}))
    res = rp.analysis.claim_results(fn, rows, seeds=list(range(10)), method="t", confidence=0.95, revision=3)
    d = []
    for s in range(10):
        v = {r["arm"]: r["test/recall@20"] for r in rows if r["seed"] == s}
        d.append((v["psl_tanh_fn"] - v["ssm_fn"]) - (v["psl_tanh_rs"] - v["ssm_rs"]))
    prim = res["rev3"].primary
    assert prim.ci.mean == pytest.approx(np.mean(d)) and prim.ci.n == 10 and res["verdict"] == "reproduced"
    # read under revision 2 (--revision 2): every check at 95%, the did check by its claimed direction
    old = rp.analysis.claim_results(fn, rows, seeds=list(range(10)), method="t", confidence=0.95, revision=2)
    assert old["checks"][0]["ci"].mean == pytest.approx(np.mean(d)) and old["checks"][0]["verdict"] == "reproduced"
    meta = {**_meta({fn.key: list(range(10))}), "revision": 3}
    path = tmp_path / "rec.md"
    rp.reports.write_markdown("recommendation", [fn], [res], rows, CF, {}, {}, meta, str(path), [])
    md = path.read_text()
    assert "minus clean (recall@20: PSL tanh - sampled softmax) > 0" in md
    # the clean arms run with the claim and appear in its arms table
    assert f"| {CF.arms['ssm_rs'].label} |" in md


def test_revision_3_flags_not_worse_but_worse_in_every_table(tmp_path):
    # Z-loss top-1 below CE by 0.005 +- 0.001 on every seed: inside the 0.01 margin, but worse
    claim = next(c for c in CF.claims if c.key == "z_loss")
    rows = []
    for s in range(10):
        ce = 0.95 + 0.002 * (s % 3)
        rows.append(_row("ce", "eval", s, **{"test/top1": ce, "test/top5": 0.99, "test/ece": 0.02}))
        rows.append(_row("z_loss", "eval", s, **{"test/top1": ce - 0.005 + 0.001 * ((s % 2) - 0.5),
                                                 "test/top5": 0.99 + 0.001 * (s % 2), "test/ece": 0.02}))
    res = rp.analysis.claim_results(claim, rows, seeds=list(range(10)), method="t", confidence=0.95, revision=3)
    top1 = next(x["result"] for x in res["checks"] if x["check"].metric == "test/top1")
    assert top1.verdict == "reproduced" and top1.flag == "not worse by the margin, but worse"
    meta = {**_meta({"z_loss": list(range(10))}), "revision": 3}
    path = tmp_path / "vision.md"
    rp.reports.write_markdown("vision", [claim], [res], rows, CF, {}, {}, meta, str(path), [])
    md = path.read_text()
    assert "| reproduced (not worse by the margin, but worse) |" in md
    # the margin beside the baseline's own error: CE's seed sd and 1 - mean
    ce = [r["test/top1"] for r in rows if r["arm"] == "ce"]
    assert f"0.01 (baseline sd {statistics.stdev(ce):.4f}; 1 - mean {1 - statistics.fmean(ce):.4f})" in md
    assert any("flagged: top1: Z-loss not worse than cross-entropy (at most 0.01 below): not worse by the margin, "
               "but worse" in line for line in rp.reports.summary_rev3([res], CF.arms, meta))
    assert rp.plots.plot_forest("vision", [res], CF.arms, str(tmp_path / "f.png")) == 2  # the flag is in its labels too


# ------------------------------------------------------------------------------------------------
# revision 3: a fixed test split, learning curves and provenance
# ------------------------------------------------------------------------------------------------
def _curve_rows(test_split, gain):
    """The WCDAS claim's hand-made runs with a test-split fingerprint per run (``test_split(arm, seed)``)
    and 4-epoch validation curves; cross-entropy's (the primary baseline's) balanced accuracy still
    rises by ``gain`` over its last epoch."""
    rows = _synthetic_rows()
    for r in rows:
        end = r["test/balanced_acc"]
        g = gain if r["arm"] == "ce_lt" else 0.0
        r["test_split"] = test_split(r["arm"], r["seed"])
        r["curve"] = json.dumps({"val/balanced_acc": [end - 0.3, end - 0.1, end - g, end], "val/loss": [2, 1, 0.5, 0.4]})
    return rows


def test_revision_3_report_refuses_a_test_split_that_is_not_fixed_and_flags_a_budget_limited_baseline(tmp_path):
    claim = next(c for c in CF.claims if c.key == "wcdas")
    seeds = list(range(10))
    meta = {**_meta({"wcdas": seeds}), "revision": 3}

    def report(rows):
        res = rp.analysis.claim_results(claim, rows, seeds=seeds, method="t", confidence=0.95, revision=3, arms=CF.arms)
        path = tmp_path / "vision.md"
        rp.reports.write_markdown("vision", [claim], [res], rows, CF, {}, {}, meta, str(path), [])
        return res, path.read_text(), rp.reports.summary_rev3([res], CF.arms, meta)

    # one test split, a baseline that stopped improving: nothing flagged
    res, md, summary = report(_curve_rows(lambda a, s: "5a1b2c3d4e5f", gain=0.0))
    assert res["test_split"]["problem"] is None and res["budget"]["rule"].limited is False
    assert "Test split: one for all 50 evaluation runs (`5a1b2c3d4e5f`)." in md
    assert "not budget-limited" in md and "flagged" not in "\n".join(summary)
    # a new test split per seed (as revision 2's runs): the claim is invalid, said in its section and the summary
    res, md, summary = report(_curve_rows(lambda a, s: f"split{s}", gain=0.0))
    assert res["test_split"]["problem"] == "10 different test splits over 50 evaluation runs"
    assert res["verdict"] == "invalid (test split not fixed: 10 different test splits over 50 evaluation runs)"
    assert "**Test split not fixed**: 10 different test splits over 50 evaluation runs" in md and "the claim is invalid" in md
    assert "made invalid because its runs were tested on more than one test split" in md
    assert any("flagged: test split not fixed (10 different test splits" in line for line in summary)
    assert any("| invalid (test split not fixed" in line for line in summary)
    # cross-entropy's balanced accuracy still rises by 0.02 over its last epoch, more than half the
    # primary check's CI half-width: budget-limited
    rows = _curve_rows(lambda a, s: "5a1b2c3d4e5f", gain=0.02)
    res, md, summary = report(rows)
    b = res["budget"]
    prim = res["rev3"].primary
    assert b["arm"] == "ce_lt" and b["metric"] == "val/balanced_acc" and b["rule"].n == 10
    assert b["rule"].gain == pytest.approx(0.02) and b["rule"].threshold == pytest.approx((prim.ci.high - prim.ci.low) / 4)
    assert b["rule"].limited is True and "**budget-limited**" in md
    assert any(f"budget-limited ({CF.arms['ce_lt'].label} still improving)" in line for line in summary)
    assert rp.plots.plot_curves("vision", [res], rows, CF.arms, str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # runs without curves or fingerprints (revision 2's): said so, nothing plotted
    plain = _synthetic_rows()
    res, md, _ = report(plain)
    assert "Test split: not recorded" in md and "Learning curve: not recorded" in md
    assert not rp.plots.plot_curves("vision", [res], plain, CF.arms, str(tmp_path / "none.png"))


def test_a_changed_code_hash_makes_a_cached_run_miss(tmp_path, monkeypatch):
    """A run finished with other code (a loss, model or DataModule changed since) is not reused; a run
    read from a runs file is the record and is read as recorded, whatever code made it."""
    arm = CF.arms["cos_c1e5_pfc01"]
    run = rp.tuning.tuning_runs([arm], [1000], quick=False)[0]
    _finish_full(run, tmp_path / "a", 1)
    row = rp.running.cached_row(run, quick=False, workdir=str(tmp_path / "a"))
    assert row is not None and len(rp.running._code_hash(arm)) == 12
    monkeypatch.setattr(rp.running, "_code_tree_hash", lambda: "another version of losses/ and lightning_modules/")
    assert rp.running.cached_row(run, quick=False, workdir=str(tmp_path / "a")) is None
    # the recipe is part of the hash too
    other = dataclasses.replace(arm, recipe=CF.arms["ce"].recipe)
    assert rp.running._code_hash(other) != rp.running._code_hash(arm)
    # a runs file's row (revision 2's rows have no code hash) still seeds the workdir and keeps its record
    runs_file = tmp_path / "x_runs.csv"
    rp.records.write_csv([row], str(runs_file))
    assert rp.records.seed_workdir([run], [str(runs_file)], workdir=str(tmp_path / "b"), quick=False) == (1, 0)
    again = rp.running.cached_row(run, quick=False, workdir=str(tmp_path / "b"))
    assert again is not None and again["code_hash"] == row["code_hash"] == ""


def test_a_dirty_tree_is_refused_unless_allowed_and_quick_says_so(tmp_path, monkeypatch):
    only_cached(monkeypatch)
    monkeypatch.setattr(rp.running, "_dirty_paths", lambda: [" M losses/classification/comp_sum.py"])
    common = ["--claims", "opl", "--workdir", str(tmp_path / "w"), "--jobs", "1", "--deadline", "0"]
    with pytest.raises(SystemExit, match="uncommitted changes under losses/.*--allow-dirty"):
        rp.cli.main([*common, "--out", str(tmp_path / "o")])
    # allowed: it starts (nothing fits before a deadline of 0, so nothing runs); --quick runs dirty as CI does
    assert rp.cli.main([*common, "--out", str(tmp_path / "o"), "--allow-dirty"]) == 3
    assert rp.cli.main([*common, "--out", str(tmp_path / "q"), "--quick"]) == 3
    # --plan and --export-runs run nothing and write no report: never refused
    assert rp.cli.main(["--claims", "opl", "--workdir", str(tmp_path / "w"), "--plan"]) == 0
    # the report names the uncommitted changes and the runs made on them
    rows = [dict(_row("ce_lowdata", "eval", 0), code="abc-dirty"), dict(_row("opl_lowdata", "eval", 0), code="abc")]
    lines = rp.reports.provenance_lines(rows, {"dirty": [" M losses/x.py"], "dirty_reason": "--quick", "revision": 3})
    assert lines[0].startswith("**uncommitted changes** under losses/") and "(--quick)" in lines[0]
    assert "`M losses/x.py`" in lines[0]
    assert lines[1] == "**1 run(s) made with uncommitted changes** (their code ends in -dirty): eval ce_lowdata seed 0"
    # revision 2's reports regenerate as they were: runs read from a file are named under revision 3 only
    assert rp.reports.provenance_lines(rows, {"dirty": [], "revision": 2}) == []


def test_revision_2_runs_are_read_under_the_current_claims_file(tmp_path, monkeypatch):
    """``--revision-2-runs``: the current (revision 3) claims file without its evaluation section makes
    runs as revision 2 made them, so its committed runs regenerate the claim without training. The claim
    is one whose arms revision 3 left as revision 2 declared them (recipe, grid, overrides, epochs: the
    gol_items arms tuned the learning rate already; revision 3's equal tuning changed the others')."""
    only_cached(monkeypatch)
    committed = os.path.join(ROOT, "results", "revision2")
    old = rp.claims.load_claims(os.path.join(committed, "claims.yaml"))
    claim = next(c for c in CF.claims if c.key == "gol_items")
    for k in claim.run_arms():
        a, b = CF.arms[k], old.arms[k]
        assert (a.recipe, a.grid_points(), a.overrides, a.epochs) == (b.recipe, b.grid_points(), b.overrides, b.epochs), k
    out, work = tmp_path / "out", tmp_path / "work"
    assert rp.cli.main(["--claims", claim.key, "--runs-from", committed, "--revision-2-runs", "--out", str(out),
                        "--workdir", str(work), "--jobs", "1", "--allow-dirty"]) == 0
    md = (out / "recommendation.md").read_text()
    assert "Test split: not recorded" in md and "Learning curve: not recorded" in md
    assert not (out / "recommendation_curves.png").exists()


def test_worker_reads_the_validation_curve_from_the_csv_log(tmp_path):
    """``_reproduce_worker._curve``: the ``val/...`` values per validation epoch from the CSV logger's
    file (train rows and empty cells skipped, epochs in order, values rounded to 6 significant digits)."""
    spec = importlib.util.spec_from_file_location("reproduce_worker_curve",
                                                  os.path.join(ROOT, "benchmarks", "_reproduce_worker.py"))
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    (tmp_path / "metrics.csv").write_text(
        "epoch,step,train/loss,val/top1,val/loss\n"
        "0,9,2.5,,\n"
        "0,9,,0.5,1.9\n"
        "1,19,2.0,,\n"
        "1,19,,0.612345678,1.5\n"
        "2,29,,0.7,\n")

    class Logger:
        log_dir = str(tmp_path)

    class Trainer:
        loggers = [Logger()]

    assert worker._curve(Trainer()) == {"val/loss": [1.9, 1.5, None], "val/top1": [0.5, 0.612346, 0.7]}
    # a one-epoch run validating within the epoch: one point per pass (epoch 0 at steps 74, 149, ...)
    intra = tmp_path / "intra"
    intra.mkdir()
    (intra / "metrics.csv").write_text(
        "epoch,step,train/loss,val/top1\n"
        "0,74,,0.1\n" "0,99,3.0,\n" "0,149,,0.15\n" "0,224,,0.18\n" "0,299,,0.19\n")
    Logger.log_dir = str(intra)
    assert worker._curve(Trainer()) == {"val/top1": [0.1, 0.15, 0.18, 0.19]}
    Logger.log_dir = str(tmp_path / "none")
    assert worker._curve(Trainer()) == {}


def test_one_epoch_evaluation_runs_validate_every_quarter():
    """An evaluation run of a one-epoch budget validates 4 times within the epoch (its learning curve);
    its tuning runs and multi-epoch arms are unchanged."""
    lm = CF.arms["ce_lm"]
    assert lm.epochs == 1
    ev = rp.runs.run_args(lm, 0, {"model.init_args.lr": 0.001}, phase="eval", quick=False)
    assert "--trainer.val_check_interval=0.25" in ev and "--trainer.check_val_every_n_epoch=1" in ev
    assert not any("val_check_interval" in a for a in rp.runs.run_args(lm, 1000, {}, phase="tune", quick=False))
    assert not any("val_check_interval" in a for a in rp.runs.run_args(CF.arms["ce"], 0, {}, phase="eval", quick=False))


def test_a_gpu_arm_runs_only_where_a_cuda_device_is_visible(tmp_path):
    """An arm whose overrides put it on a GPU (``trainer.accelerator: gpu``): its runs are made in a fresh
    interpreter (CUDA does not survive a fork) and the command line refuses to start them where no
    CUDA device is visible (this machine), naming the arm; ``--plan`` still prints them."""
    assert rp.running.needs_gpu(["--trainer.accelerator=gpu"]) and rp.running.needs_gpu(["--trainer.accelerator=cuda"])
    assert not rp.running.needs_gpu(["--trainer.accelerator=gpu", "--trainer.accelerator=cpu"])  # the last wins
    assert not rp.running.needs_gpu(["--trainer.max_epochs=2"])
    if rp.running.cuda_devices():  # pragma: no cover - a GPU machine runs such arms
        return
    with open(rp.common.CLAIMS_FILE) as fh:
        raw = yaml.safe_load(fh)
    raw["arms"] = {k: raw["arms"][k] for k in ("ce_lowdata", "opl_lowdata")}
    raw["arms"]["opl_lowdata"]["overrides"] = {**(raw["arms"]["opl_lowdata"].get("overrides") or {}),
                                               "trainer.accelerator": "gpu", "trainer.devices": 1}
    raw["claims"] = [c for c in raw["claims"] if c["key"] == "opl"]
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    args = ["--claims-file", str(path), "--quick", "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "w")]
    with pytest.raises(SystemExit, match=r"arm\(s\) \['opl_lowdata'\] train on a GPU .* no CUDA device is visible"):
        rp.cli.main(args)
    assert not (tmp_path / "w").exists()  # refused before any run
    assert rp.cli.main([*args, "--plan"]) == 0


def test_the_code_version_outside_a_git_checkout_is_the_named_commit(tmp_path, monkeypatch):
    """A copy of the tree without ``.git`` (what a GPU machine receives) records the commit named by
    ``REPRODUCE_CODE_VERSION``, else ``unknown``; in the checkout it is the checkout's commit."""
    head = rp.running._code_version()
    assert head != "unknown" and len(head.split("-")[0]) == 12
    monkeypatch.setattr(rp.running, "ROOT", str(tmp_path))  # git answers nothing there
    monkeypatch.delenv(rp.running.CODE_VERSION_ENV, raising=False)
    assert rp.running._code_version() == "unknown"
    monkeypatch.setenv(rp.running.CODE_VERSION_ENV, "0123456789ab")
    assert rp.running._code_version() == "0123456789ab"
