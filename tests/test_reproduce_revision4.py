"""Protocol revision 4 in the reproduction pipeline (``benchmarks/reproduce``): the claims file's
``fidelity``, ``not_applicable``, ``manipulation`` and ``relative_margin`` keys are parsed, validated
(refused below revision 4, where they would change revision 3's verdicts), read into the verdicts
(``stats.evaluate_claim``) and printed by the reports, whose revision-4 headline counts only the
tested claims and lists the others apart. Hand-made runs, no training; the expected numbers are
computed here independently."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import sys

import numpy as np
import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # as benchmarks/reproduce_results.py puts it there
import reproduce as rp  # noqa: E402
import reproduce.cli  # noqa: E402,F401  (imports every step's module)
from tests._helpers.reproduce_runs import only_cached  # noqa: E402

CF = rp.claims.load_claims()
CF4 = dataclasses.replace(CF, revision=4, claims=tuple(dataclasses.replace(c, fidelity=()) for c in CF.claims))
SEEDS = list(range(10))


def _row(arm, seed, **metrics):
    r = {"benchmark": CF.arms[arm].benchmark, "arm": arm, "phase": "eval", "seed": seed, "ok": True,
         "params": "{}", "steps": 800, "run_seconds": 10.0, "data": json.dumps({"train_size": 975}), "error": "",
         "label": CF.arms[arm].label}
    r.update(metrics)
    return r


def _wcdas_rows():
    """10 seeds of the WCDAS claim: WCDAS = CE + 0.05 on balanced accuracy (+ small noise), the other
    baselines near CE; WCDAS logs its learned scale (16) and a mean rho of 0.5."""
    rng = np.random.default_rng(11)
    base = rng.uniform(0.6, 0.8, size=10)
    rows = []
    for s in SEEDS:
        vals = {"ce_lt": base[s], "wcdas_lt": base[s] + 0.05 + rng.normal(0, 0.01),
                "cosine_lt": base[s] + rng.normal(0, 0.02), "la_lt": base[s] + 0.01 + rng.normal(0, 0.02),
                "bsm_lt": base[s] + 0.01 + rng.normal(0, 0.02)}
        for arm, v in vals.items():
            rows.append(_row(arm, s, **{"test/balanced_acc": v, "test/acc_tail": v - 0.1,
                                        "test/loss_scale": 16.0 if arm == "wcdas_lt" else ""}))
    return rows


def _claim(**changes):
    c = next(c for c in CF4.claims if c.key == "wcdas")
    return dataclasses.replace(c, **changes)


def _meta():
    return {"mode": "test", "command": "x", "code": "c", "date": "d", "versions": {}, "cpus": 2, "cpu": "cpu",
            "jobs": 1, "threads": 1, "ci": "t", "confidence": 0.95, "power": 0.8, "bootstrap_resamples": 10000,
            "tuning_seeds": [1000], "seeds_of": {c.key: SEEDS for c in CF.claims}, "revision": 4}


# ------------------------------------------------------------------------------------------
# the claims file
# ------------------------------------------------------------------------------------------
def test_revision_4_keys_are_parsed_from_the_claims_file(tmp_path):
    with open(rp.common.CLAIMS_FILE) as fh:
        raw = yaml.safe_load(fh)
    raw["statistics"]["revision"] = 4
    for c in raw["claims"]:
        c["fidelity"] = []
    c = next(c for c in raw["claims"] if c["key"] == "wcdas")
    c["fidelity"] = ["MNIST-5k with a long tail instead of ImageNet-LT", "a 2-layer MLP instead of a ResNet"]
    c["not_applicable"] = "ten classes"
    c["manipulation"] = [{"name": "the scale was learned", "arm": "wcdas_lt", "metric": "test/loss_scale",
                          "op": ">", "level": 1}]
    ch = next(x for x in c["checks"] if x.get("primary"))
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    cf = rp.claims.load_claims(str(path))
    got = next(x for x in cf.claims if x.key == "wcdas")
    assert cf.revision == 4 and got.fidelity == tuple(c["fidelity"]) and got.not_applicable == "ten classes"
    assert got.manipulation == (rp.claims.Manipulation("the scale was learned", "wcdas_lt", "test/loss_scale", ">", 1),)
    assert next(x for x in cf.claims if x.key == "opl").fidelity == ()
    assert rp.claims.validate_claims(cf) == []
    # a relative margin on a not_worse check is read as such
    ch.update(kind="not_worse", relative_margin=0.1, better="higher")
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    prim = next(x for x in next(x for x in rp.claims.load_claims(str(path)).claims if x.key == "wcdas").checks
                if x.primary)
    assert prim.relative_margin == 0.1 and prim.margin is None
    assert rp.claims.validate_claims(rp.claims.load_claims(str(path))) == []


def test_revision_4_keys_are_refused_below_revision_4_and_checked_at_4():
    c3 = next(c for c in CF.claims if c.key == "wcdas")
    assert c3.fidelity is None and c3.not_applicable is None and c3.manipulation == ()
    prim = next(i for i, ch in enumerate(c3.checks) if ch.primary)
    rel = tuple(dataclasses.replace(ch, kind="not_worse", relative_margin=0.1) if i == prim else ch
                for i, ch in enumerate(c3.checks))
    bad3 = dataclasses.replace(c3, not_applicable="ten classes", checks=rel)
    text = "\n".join(rp.claims.validate_claims(dataclasses.replace(CF, claims=(bad3,))))
    assert "not_applicable, relative_margin (checks [3]) change verdicts under protocol revision 4 only" in text

    # revision 4: every claim declares fidelity; bad manipulation checks, reasons and margins are named
    no_fid = dataclasses.replace(_claim(), key="a", fidelity=None)
    bad = dataclasses.replace(_claim(), key="b", fidelity=("",), not_applicable="  ", manipulation=(
        rp.claims.Manipulation("", "", "", "", None),
        rp.claims.Manipulation("acts", "no_such_arm", "loss_scale", "!=", float("nan"))))
    both = dataclasses.replace(_claim(), key="c", checks=tuple(
        dataclasses.replace(ch, kind="not_worse", relative_margin=-1.0 if i == 0 else 0.1, margin=None if i == 0 else 0.01)
        for i, ch in enumerate(c3.checks)))
    text = "\n".join(rp.claims.validate_claims(dataclasses.replace(CF4, claims=(no_fid, bad, both))))
    for fragment in ("claim 'a': revision 4 declares fidelity", "claim 'b': fidelity must be a list of non-empty lines",
                     "not_applicable must be the declared reason", "manipulation 1: give each manipulation check",
                     "arm 'no_such_arm' is not an arm the claim runs", "metric 'loss_scale' must be a logged column",
                     "op must be one of", "level must be a finite number",
                     "claim 'c', check 1 (test/acc_tail): relative_margin must be a positive number",
                     "claim 'c', check 2 (test/acc_tail): declare the margin either in the metric's units"):
        assert fragment in text, fragment
    assert rp.claims.validate_claims(CF4) == []


# ------------------------------------------------------------------------------------------
# verdicts and reports
# ------------------------------------------------------------------------------------------
def _results(claim, rows, revision=4):
    return rp.analysis.claim_results(claim, rows, seeds=SEEDS, method="t", confidence=0.95, revision=revision,
                                     arms=CF.arms)


def test_not_applicable_and_not_tested_override_the_primary_verdict():
    rows = _wcdas_rows()
    plain = _results(_claim(), rows)
    assert plain["verdict"] == "reproduced" and plain["rev3"].manipulation == ()
    # revision 3 reading of the same claim is the same
    assert _results(_claim(), rows, revision=3)["verdict"] == "reproduced"

    na = _results(_claim(not_applicable="ten classes cannot show a long-tail method"), rows)
    assert na["verdict"] == "not applicable here (ten classes cannot show a long-tail method)"
    assert na["rev3"].primary.verdict == "reproduced"  # the checks are still computed and reported

    acted = rp.claims.Manipulation("the scale moved off 1", "wcdas_lt", "test/loss_scale", ">", 1.0)
    passed = _results(_claim(manipulation=(acted,)), rows)
    assert passed["verdict"] == "reproduced"
    m = passed["rev3"].manipulation[0]
    assert m.passed and m.mean == 16.0 and m.n == 10

    failed = _results(_claim(manipulation=(dataclasses.replace(acted, level=20.0),)), rows)
    assert failed["verdict"] == "not tested (the scale moved off 1: mean test/loss_scale of wcdas_lt 16 (10 seeds), not > 20)"
    # an arm without the metric has no evidence that the intervention acted
    missing = _results(_claim(manipulation=(dataclasses.replace(acted, arm="ce_lt"),)), rows)
    assert missing["verdict"].startswith("not tested (the scale moved off 1: no values of test/loss_scale in ce_lt")


def test_a_claim_declared_not_applicable_is_not_run_and_reported_with_its_reason(monkeypatch, tmp_path):
    """Revision 4: a claim declared not applicable before any run is not trained (its arms join no
    widening group and are run only for another selected claim); its summary line gives the reason,
    and the headline lists it apart."""
    na = next(c for c in R4.claims if c.key == "z_loss_r4")
    assert na.not_applicable and "z4" in na.arms
    res = rp.analysis.not_run_result(na)
    assert res["not_run"] and res["checks"] == [] and res["verdict"] == f"not applicable here ({na.not_applicable})"
    with pytest.raises(ValueError, match="declares no not_applicable reason"):
        rp.analysis.not_run_result(next(c for c in R4.claims if c.key == "sparsemax_r4"))
    lines = "\n".join(rp.reports.summary_rev3([res], R4.arms, {**_meta(), "revision": 4}))
    assert "0 claims tested" in lines and "1 not applicable here" in lines
    assert f"| not run: declared not applicable before any run | {res['verdict']} |" in lines
    # the not-applicable claim's own arm joins no group; read at revision 3 it would join ce4's
    assert not any("z4" in g and len(g) > 1 for g in R4.widen_groups())
    assert any({"z4", "ce4"} <= set(g) for g in dataclasses.replace(R4, revision=3).widen_groups())
    # the command line trains nothing for it: its arms are not in the plan
    planned = []
    monkeypatch.setattr(rp.running, "run_plan", lambda arms, *a, **k: planned.extend(a.key for a in arms) or ([], [], {}, {}))
    rp.cli.main(["--claims-file", os.path.join(ROOT, "benchmarks", "claims_revision4.yaml"), "--claims",
                 "z_loss_r4,opl_r4", "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "w"), "--allow-dirty"])
    assert set(planned) == {"opl4_lowdata", "ce4_lowdata"}
    with pytest.raises(SystemExit, match="every selected claim is declared not applicable"):
        rp.cli.main(["--claims-file", os.path.join(ROOT, "benchmarks", "claims_revision4.yaml"), "--claims",
                     "z_loss_r4", "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "w"), "--allow-dirty"])


def test_relative_margin_resolves_against_the_baselines_error():
    rows = _wcdas_rows()
    c = _claim()
    prim = next(i for i, ch in enumerate(c.checks) if ch.primary)
    checks = tuple(dataclasses.replace(ch, kind="not_worse", relative_margin=0.2, better="higher") if i == prim else ch
                   for i, ch in enumerate(c.checks))
    res = _results(dataclasses.replace(c, checks=checks), rows)
    base = np.mean([r["test/balanced_acc"] for r in rows if r["arm"] == "ce_lt"])
    d = np.array([r["test/balanced_acc"] for r in rows if r["arm"] == "wcdas_lt"]) - \
        np.array([r["test/balanced_acc"] for r in rows if r["arm"] == "ce_lt"])
    r = res["rev3"].primary
    assert r.margin == pytest.approx(0.2 * (1.0 - base), rel=1e-12)
    assert r.margin_basis.startswith("0.2 x the baseline's error")
    # non-inferiority: the one-sided lower bound of the mean difference against -margin (WCDAS is ahead)
    assert d.mean() - 2.262157 * d.std(ddof=1) / math.sqrt(10) > -r.margin and res["verdict"] == "reproduced"


def test_reports_print_fidelity_manipulation_and_the_revision_4_headline(tmp_path):
    rows = _wcdas_rows()
    acted = rp.claims.Manipulation("the scale moved off 1", "wcdas_lt", "test/loss_scale", ">", 20.0)
    fid = ("MNIST-5k with a long tail instead of ImageNet-LT",)
    w_nt = _claim(fidelity=fid, manipulation=(acted,))
    w_na = dataclasses.replace(_claim(not_applicable="declared: ten classes"), key="wcdas_na")
    w_ok = dataclasses.replace(_claim(), key="wcdas_ok")
    results = [_results(w_nt, rows), _results(w_na, rows), _results(w_ok, rows)]
    meta = _meta()
    meta["seeds_of"].update({"wcdas_na": SEEDS, "wcdas_ok": SEEDS})
    path = tmp_path / "vision.md"
    rp.reports.write_markdown("vision", [w_nt, w_na, w_ok], results, rows, CF4, {}, {}, meta, str(path), [])
    md = path.read_text()
    block = md.split("(`wcdas`)", 1)[1].split("\n## ", 1)[0]
    assert "Deviations from the paper's setup (declared before the runs):\n\n- MNIST-5k with a long tail" in block
    assert "- **failed**: the scale moved off 1: mean test/loss_scale of WCDAS" in block
    assert "**Verdict: not tested (" in block and "the primary check read reproduced" in block
    na_block = md.split("(`wcdas_na`)", 1)[1].split("\n## ", 1)[0]
    assert "**Verdict: not applicable here (declared: ten classes)**: declared before the runs" in na_block
    assert "Deviations from the paper's setup: none known" in na_block

    lines = rp.reports.summary_rev3(results, CF.arms, meta)
    head = "\n".join(lines[:8])
    assert lines[0].startswith("Protocol revision 4: each claim's verdict is its primary check's; 1 claims tested: "
                               "1 reproduced, 0 contradicted, 0 not resolved, 0 invalid. Listed apart, never counted: "
                               "1 not applicable here, 1 not tested, 0 sanity claim(s).")
    assert "- `wcdas_na`: not applicable here (declared: ten classes)" in head
    assert "- `wcdas`: not tested (the scale moved off 1:" in head
    # BH over the one tested claim: its own p-value, significant at 0.05
    p = results[2]["rev3"].primary.p
    assert p < 0.05 and "Benjamini-Hochberg across the 1 tested claims' primary p-values (false discovery rate " \
                        "0.05): 1 significant (`wcdas_ok`)." in head
    table = [x for x in lines if x.startswith("| ")]
    assert any("| not tested (the scale" in x and "1 declared deviation(s)" in x for x in table)
    assert any("| not applicable here (declared: ten classes) |" in x for x in table)


# ------------------------------------------------------------------------------------------
# the two-level bootstrap from per-item test records
# ------------------------------------------------------------------------------------------
R4 = rp.claims.load_claims(os.path.join(ROOT, "benchmarks", "claims_revision4.yaml"))


def _write_items(path, ids, correct, top1):
    from lightning_modules.records import write_test_items

    header = {"format": "test-item-records", "version": 1, "module": "IdentityEmbedder", "kind": "many_class",
              "metrics": {"test/open_rank1": {"table": "open", "columns": ["open_rank1"], "agg": "mean"},
                          "test/top1": {"table": "closed", "columns": ["top1", "target"], "agg": "class_mean"}},
              "tables": {}}
    write_test_items(str(path), {"open": {"item": ids, "open_rank1": correct},
                                 "closed": {"item": np.arange(4), "top1": top1, "target": np.arange(4)}}, header)


def test_two_level_bootstrap_from_the_records_decides_the_primary_check_when_wider(tmp_path):
    """Five seeds whose open-set differences are the same four probes every seed (no seed-to-seed
    variation: the seed interval has no width) while the item resampling sees how few probes carry the
    difference. The seed interval alone reads non-inferiority; the two-level interval is wider, the
    verdict is read from it and is not resolved. The records are matched by probe id (one arm's file
    is stored in another order); a class-mean metric is resampled within its classes."""
    c = next(x for x in R4.claims if x.key == "pfc_cosface_r4")
    n, rng = 300, np.random.default_rng(5)
    base = (rng.random(n) < 0.8).astype(np.float32)
    worse = np.flatnonzero(base == 1)[:4]
    fam = base.copy()
    fam[worse] = 0.0
    ids = np.arange(1000, 1000 + n)
    rows, items = [], {}
    for s in range(5):
        for arm, v in (("cos4_pfc01", fam), ("cos4_pfc03", base), ("cos4_pfc10", base)):
            order = rng.permutation(n) if arm == "cos4_pfc01" else np.arange(n)
            path = tmp_path / f"{arm}__s{s}.npz"
            _write_items(path, ids[order], v[order], np.ones(4, dtype=np.float32))
            items[(arm, s)] = str(path)
            rows.append({"benchmark": "many_class", "arm": arm, "phase": "eval", "seed": s, "ok": True,
                         "test/open_rank1": float(v.mean()), "test/top1": 0.9, "test/open_rank1_fixed": 0.1,
                         "test/top1_fixed": 0.1, "test/train_step_ms": 10.0 if arm != "cos4_pfc10" else 20.0,
                         "train/positive_share": 0.25, "data": "{}", "params": "{}", "steps": 2496,
                         "run_seconds": 60.0, "error": "", "label": R4.arms[arm].label})
    res = rp.analysis.claim_results(c, rows, seeds=list(range(5)), method="t", confidence=0.95, revision=4,
                                    n_boot=2000, arms=R4.arms, items=items)
    prim = res["rev3"].primary
    d = np.stack([fam - base] * 5)  # the per-seed, per-probe differences, probes in id order
    expect = rp.common.stats.two_level_bootstrap(d, np.zeros_like(d), n_boot=2000)
    got = res["items"]["checks"]["0"]
    assert (got["ci"].low, got["ci"].high, got["items"], got["seeds"]) == (expect.low, expect.high, n, 5)
    margin = 0.1 * (1.0 - base.mean())
    assert prim.margin == pytest.approx(margin)
    assert prim.ci.low == pytest.approx(-4 / n) and prim.ci.low > -margin  # the seeds alone: non-inferior
    assert expect.low < -margin < expect.high  # seeds x items: not resolved
    assert prim.read_from == "seeds x items" and prim.verdict == "not resolved" and res["verdict"] == "not resolved"
    assert prim.item_ci == got["ci"] and prim.reported_ci == got["ci"]
    top1 = res["items"]["checks"]["2"]  # top1 here is a class mean over 4 classes, equal in both arms
    assert top1["classes"] == 4 and top1["items"] == 4 and top1["ci"].mean == 0.0 and "2" not in res["items"]["notes"]
    assert "not in the per-item records" in res["items"]["notes"]["4"]
    # a secondary check reports its two-level interval and keeps its seed verdict
    sec = next(x["result"] for x in res["checks"] if x["result"].name == "1")
    assert sec.item_ci is not None and sec.read_from == "seeds"
    # without the records the seed interval decides
    plain = rp.analysis.claim_results(c, rows, seeds=list(range(5)), method="t", confidence=0.95, revision=4,
                                      n_boot=2000, arms=R4.arms)
    assert plain["verdict"] == "reproduced" and "items" not in plain
    # the report says what was read
    meta = {**_meta(), "seeds_of": {c.key: list(range(5))}}
    path = tmp_path / "many_class.md"
    rp.reports.write_markdown("many_class", [c], [res], rows, R4, {}, {}, meta, str(path), [])
    md = path.read_text()
    assert "Two-level bootstrap over seeds and test items" in md
    assert f"over 5 seeds x {n} items" in md and "the verdict is read from the seeds x items interval" in md


def test_collect_test_items_copies_workdir_records_beside_the_runs_file(tmp_path):
    arm = R4.arms["cos4_pfc01"]
    stem = os.path.splitext(os.path.basename(arm.recipe))[0]
    run_dir = tmp_path / "work" / f"{stem}__eval__s3__abc__def"
    run_dir.mkdir(parents=True)
    _write_items(run_dir / "test_items.npz", np.arange(3), np.ones(3, dtype=np.float32), np.ones(4, dtype=np.float32))
    rows = [{"phase": "eval", "ok": True, "arm": "cos4_pfc01", "seed": 3, "key": "abc", "code_hash": "def"},
            {"phase": "eval", "ok": True, "arm": "cos4_pfc10", "seed": 3, "key": "x", "code_hash": "y"},
            {"phase": "tune", "ok": True, "arm": "cos4_pfc01", "seed": 1000, "key": "abc", "code_hash": "def"}]
    out = tmp_path / "out"
    got = rp.records.collect_test_items(rows, R4.arms, benchmark="many_class", workdir=str(tmp_path / "work"),
                                        out=str(out))
    copied = out / "many_class_test_items" / "cos4_pfc01__s3.npz"
    assert got == {("cos4_pfc01", 3): str(copied)} and copied.is_file()
    # read again from a committed folder (a runs file's neighbour), the workdir gone
    again = rp.records.collect_test_items(rows, R4.arms, benchmark="many_class", workdir=str(tmp_path / "none"),
                                          out=str(tmp_path / "other"), search=[str(out)])
    assert again == {("cos4_pfc01", 3): str(copied)}


def test_export_carries_the_records_of_evaluation_runs_beside_the_exported_file(tmp_path):
    """A part-done reproduction exported with ``--export-runs`` keeps each evaluation run's per-item
    records beside the file (where ``--runs-from`` finds them), whether the run finished in the
    workdir or was itself read from an earlier runs file; tuning runs have none."""
    arm = R4.arms["cos4_pfc01"]
    stem = os.path.splitext(os.path.basename(arm.recipe))[0]
    run_dir = tmp_path / "work" / f"{stem}__eval__s3__abc__def"
    run_dir.mkdir(parents=True)
    _write_items(run_dir / "test_items.npz", np.arange(3), np.ones(3, dtype=np.float32), np.ones(4, dtype=np.float32))
    earlier = tmp_path / "earlier" / "many_class_test_items"
    earlier.mkdir(parents=True)
    _write_items(earlier / "cos4_pfc01__s4.npz", np.arange(3), np.zeros(3, dtype=np.float32),
                 np.ones(4, dtype=np.float32))
    rows = [{"benchmark": "many_class", "phase": "eval", "ok": True, "arm": "cos4_pfc01", "seed": s, "key": k,
             "code_hash": "def"} for s, k in ((3, "abc"), (4, "old"))]
    rows.append({"benchmark": "many_class", "phase": "tune", "ok": True, "arm": "cos4_pfc01", "seed": 1000,
                 "key": "t", "code_hash": "def"})
    export = tmp_path / "part" / "many_class_runs.csv"
    got = rp.records.export_test_items(rows, R4.arms, workdir=str(tmp_path / "work"), export=str(export),
                                       search=[str(tmp_path / "earlier")])
    folder = tmp_path / "part" / "many_class_test_items"
    assert got == {("cos4_pfc01", 3): str(folder / "cos4_pfc01__s3.npz"),
                   ("cos4_pfc01", 4): str(folder / "cos4_pfc01__s4.npz")}
    assert sorted(p.name for p in folder.iterdir()) == ["cos4_pfc01__s3.npz", "cos4_pfc01__s4.npz"]
    assert (folder / "cos4_pfc01__s4.npz").read_bytes() == (earlier / "cos4_pfc01__s4.npz").read_bytes()
    # exporting again onto the same file (the workdir gone) finds them where they are and copies nothing
    again = rp.records.export_test_items(rows, R4.arms, workdir=str(tmp_path / "none"), export=str(export),
                                         search=[str(tmp_path / "part")])
    assert again == got


def test_budget_rule_on_every_arm_and_at_this_budget_in_the_wording():
    """Revision 4 reads every arm's learning curve: a family arm still rising at the end of its budget
    flags the claim (the baseline's flat curve would not have) and the verdict says "at this budget"."""
    rows = _wcdas_rows()
    flat = json.dumps({"val/balanced_acc": [0.5, 0.6, 0.7, 0.7, 0.7]})
    rising = json.dumps({"val/balanced_acc": [0.3, 0.4, 0.5, 0.6, 0.7]})
    for r in rows:
        r["curve"] = rising if r["arm"] == "wcdas_lt" else flat
    res = _results(_claim(), rows)
    assert set(res["budgets"]) == set(_claim().run_arms())
    assert rp.reports.limited_arms(res) == ["wcdas_lt"] and not res["budget"]["rule"].limited  # the baseline is flat
    lines = rp.reports.summary_rev3([res], CF.arms, _meta())
    label = CF.arms["wcdas_lt"].label
    row = next(x for x in lines if x.startswith("| ") and "(vision.md)" in x)
    assert "reproduced at this budget |" in row and f"budget-limited ({label} still improving)" in row
    text = "\n".join(rp.reports._rev3_check_lines(res, rows, SEEDS, CF.arms))
    assert f"**Verdict: reproduced at this budget** (the primary check's; {label} still improving" in text
    assert "Learning curves, every arm" in text and "it was still improving" in text
    # revision 3 reads the baseline's curve only: nothing flagged
    assert "budgets" not in _results(_claim(), rows, revision=3)


# ------------------------------------------------------------------------------------------
# the replicate at twice the budget
# ------------------------------------------------------------------------------------------
def test_replicate_is_declared_at_revision_4_and_validated():
    c3 = next(c for c in CF.claims if c.key == "wcdas")
    text = "\n".join(rp.claims.validate_claims(dataclasses.replace(CF, claims=(dataclasses.replace(c3, replicate=(2, 3)),))))
    assert "replicate change verdicts under protocol revision 4 only" in text
    bad = [dataclasses.replace(_claim(), key=f"r{i}", replicate=r) for i, r in enumerate(((1, 3), (2, 99), ("x", None)))]
    text = "\n".join(rp.claims.validate_claims(dataclasses.replace(CF4, claims=tuple(bad))))
    assert "claim 'r0': replicate.budget must be an integer >= 2" in text
    assert "claim 'r1': replicate.seeds must be an integer from 1 to the claim's 10 seeds (got 99)" in text
    assert "claim 'r2': replicate.budget" in text and "claim 'r2': replicate.seeds" in text
    r4 = next(c for c in R4.claims if c.key == "pfc_cosface_r4")
    assert r4.replicate == (2, 3)
    reps = rp.claims.replicates([r4])
    assert reps == {k: (2, (0, 1, 2)) for k in r4.run_arms()}
    arm2 = rp.claims.replicate_arm(R4.arms["cos4_pfc01"], 2)
    assert arm2.epochs == 16 and arm2.key == "cos4_pfc01" and arm2.seconds == 2 * R4.arms["cos4_pfc01"].seconds
    # its runs: evaluation runs at twice the epochs, a phase of their own (their own workdir folder)
    run = rp.runs.Run(arm2, 0, "replicate", (("model.init_args.lr", 0.001),))
    args = run.args(False)
    assert "--trainer.max_epochs=16" in args and "--trainer.check_val_every_n_epoch=1" in args
    # a two-stage arm keeps its stage boundary at the same share of the fit (15 of 20 -> 30 of 40)
    two = rp.claims.replicate_arm(R4.arms["gol4_lt_2s"], 2)
    assert two.epochs == 40 and dict(two.overrides)["model.init_args.two_stage_epoch"] == 30
    assert dict(two.overrides)["data.init_args.linear_probe"] is True
    assert "--model.init_args.two_stage_epoch=30" in rp.runs.Run(two, 0, "replicate", ()).args(False)


def test_plan_queues_the_replicate_once_the_arms_setting_is_chosen():
    arm = dataclasses.replace(R4.arms["cos4_pfc01"], grid=(("model.init_args.lr", (0.001, 0.003)),), seconds=1.0)
    started = []

    def fake_execute(run, *, fresh, quick, workdir, threads, timeout):
        started.append((run.phase, run.seed, run.arm.epochs))
        lr = dict(run.params)["model.init_args.lr"]
        return {"arm": run.arm.key, "phase": run.phase, "seed": run.seed, "ok": True, "cached": False, "error": "",
                "run_seconds": 0.0, "params": json.dumps(dict(run.params), sort_keys=True),
                "val/open_rank1": lr, "epochs": run.arm.epochs}

    tune = rp.tuning.tuning_runs([arm], [1000], quick=False)
    tune_rows, eval_rows, chosen, _ = rp.running.run_plan(
        [arm], tune, {arm.key: [0, 1]}, jobs=1, threads=1, quick=False, workdir="unused", fresh=False, timeout=1.0,
        log=lambda *a, **k: None, execute_fn=fake_execute, replicates={arm.key: (2, (0,))})
    assert chosen == {arm.key: {"model.init_args.lr": 0.003}}
    assert [(r["phase"], r["seed"], r["epochs"]) for r in eval_rows] == [("eval", 0, 8), ("eval", 1, 8),
                                                                         ("replicate", 0, 16)]
    assert started.index(("replicate", 0, 16)) > max(started.index(("tune", 1000, 8)), 1)
    # every candidate the runs files may hold, the replicates at every point too
    cands = rp.records.candidate_runs([arm], [1000], {arm.key: [0, 1]}, False, replicates={arm.key: (2, (0,))})
    assert sorted((r.phase, r.arm.epochs) for r in cands if r.phase == "replicate") == [("replicate", 16)] * 2


def _with_replicate_rows(rows, shift):
    """The claim's rows plus replicate rows on seeds 0-2: WCDAS's balanced accuracy = CE's + ``shift``."""
    out = list(rows)
    for s in range(3):
        for arm in _claim().run_arms():
            base = next(r for r in rows if r["arm"] == "ce_lt" and r["seed"] == s)["test/balanced_acc"]
            v = base + shift if arm == "wcdas_lt" else base
            out.append(dict(_row(arm, s, **{"test/balanced_acc": v, "test/acc_tail": v - 0.1}), phase="replicate",
                            steps=1600))
    return out


def test_replicate_confirms_or_overturns_a_decided_verdict():
    rows = _wcdas_rows()
    c = _claim(replicate=(2, 3))
    stands = _results(c, _with_replicate_rows(rows, 0.03))
    assert stands["verdict"] == "reproduced" and stands["replicate"]["flips"] is False
    assert stands["replicate"]["n"] == 3 and stands["replicate"]["mean"] == pytest.approx(0.03)
    assert "the verdict stands" in stands["replicate"]["text"]
    flips = _results(c, _with_replicate_rows(rows, -0.01))
    assert flips["replicate"]["flips"] is True and flips["verdict"] == "not resolved"
    assert flips["rev3"].verdict == "not resolved" and flips["rev3"].primary.verdict == "reproduced"
    assert "not resolved at this budget" in flips["replicate"]["text"]
    lines = rp.reports.summary_rev3([flips], CF.arms, _meta())
    assert lines[0].startswith("Protocol revision 4: each claim's verdict is its primary check's; 1 claims tested: "
                               "0 reproduced, 0 contradicted, 1 not resolved")
    assert any("not resolved at this budget (the primary check read reproduced; its 2x-budget replicate did not)" in x
               for x in lines)
    md = "\n".join(rp.reports._rev3_check_lines(flips, rows, SEEDS, CF.arms))
    assert "Replicate at 2x the budget" in md and "**Verdict: not resolved at this budget**" in md
    # declared but not run: flagged, the verdict left as the seeds read it
    missing = _results(c, rows)
    assert missing["verdict"] == "reproduced" and missing["replicate"]["n"] == 0
    assert any("2x-budget replicate not run" in x for x in rp.reports.summary_rev3([missing], CF.arms, _meta()))


def test_replicate_reads_a_difference_in_differences_from_all_four_arms():
    """A robustness claim's replicate: the differences in differences of the replicated arms (the
    clean pair too) on seeds 0-2, on the claimed side of 0 or the verdict becomes not resolved."""
    c = dataclasses.replace(next(x for x in CF4.claims if x.key == "comp_sum"), replicate=(2, 3))
    rng = np.random.default_rng(5)
    rows = []

    def four(seed, did, phase):
        base = rng.uniform(0.9, 0.95)
        vals = {"ce": base, "comp_sum_clean": base - 0.005, "ce_noisy": base - 0.05,
                "comp_sum_noisy": base - 0.05 - 0.005 + did}
        return [dict(_row(arm, seed, **{"test/top1": v}), phase=phase) for arm, v in vals.items()]

    for seed in SEEDS:
        rows += four(seed, 0.02 + rng.normal(0, 0.003), "eval")
    stands = _results(c, rows + [r for s in range(3) for r in four(s, 0.01, "replicate")])
    assert stands["verdict"] == "reproduced" and stands["replicate"]["mean"] == pytest.approx(0.01)
    assert "the verdict stands" in stands["replicate"]["text"] and "boundary 0" in stands["replicate"]["text"]
    flips = _results(c, rows + [r for s in range(3) for r in four(s, -0.01, "replicate")])
    assert flips["replicate"]["flips"] is True and flips["verdict"] == "not resolved"


#: the revision-4 claims with a committed report (results/revision4/summary.md); the claims declared
#: beside them and not run yet have no line there
REPORTED = ("pfc_cosface_r4", "pfc_arcface_r4", "decoupled_softmax_users_r4", "z_loss_items_r4", "sparsemax_r4",
            "entmax15_r4", "opl_r4", "comp_sum_r4", "psl_false_negatives_r4", "z_loss_r4", "gol_r4",
            "gol_2stage_r4", "pfc_ml100k_r4", "decoupled_softmax_chatterbot_r4", "soft_topk_chatterbot_r4",
            "wcdas_r4", "gol_items_r4", "psl_r4", "psl_popularity_shift_r4", "decoupled_softmax_stdlib_r4",
            "nbc_softmax_r4", "wcdas_2stage_r4", "dice_r4", "jaccard_r4", "adversarial_r4", "dice_ce_r4",
            "jaccard_ce_r4")


@pytest.mark.slow
def test_the_committed_revision_4_report_regenerates_from_its_runs_and_records(tmp_path, monkeypatch):
    """``results/revision4/``: its runs file and per-item records rebuild the report on a fresh machine
    (nothing trains), with the committed summary's verdict lines and two-level bootstrap lines."""
    only_cached(monkeypatch)
    committed = os.path.join(ROOT, "results", "revision4")
    out, work = tmp_path / "out", tmp_path / "work"
    code = rp.cli.main(["--claims-file", os.path.join(ROOT, "benchmarks", "claims_revision4.yaml"), "--claims",
                        ",".join(REPORTED), "--runs-from", committed, "--out", str(out), "--workdir", str(work),
                        "--jobs", "1", "--allow-dirty"])
    assert code == 0
    old_summary = open(os.path.join(committed, "summary.md")).read()
    new_lines = [x for x in (out / "summary.md").read_text().splitlines() if x.startswith(("| ", "Protocol", "- `"))
                 and "|---" not in x]
    assert new_lines and all(x in old_summary for x in new_lines)
    for bench in ("many_class", "vision", "recommendation", "retrieval", "segmentation"):
        old_md = open(os.path.join(committed, f"{bench}.md")).read()
        # the two-level lines (segmentation: Dice and mIoU pool the pixels of the whole test set, a ratio
        # of sums, so each says why it is not computed), the verdicts and the replicate lines
        two_level = [x for x in (out / f"{bench}.md").read_text().splitlines()
                     if "seeds x " in x or ": not computed (" in x or x.startswith(("**Verdict", "Replicate at"))]
        assert two_level and all(x in old_md for x in two_level), bench
        assert not (out / f"{bench}_test_items").exists()  # the records were read where they are committed


# -- the gate: a baseline must train before the rest of its claim is run ------------------------------------
def _gate_claims_file(tmp_path) -> str:
    """The 100,000-identity claim and its two arms, as declared but on the CPU (no trainer.accelerator),
    written to a claims file of its own."""
    with open(os.path.join(ROOT, "benchmarks", "claims_revision4.yaml")) as fh:
        raw = yaml.safe_load(fh)
    claim = next(c for c in raw["claims"] if c["key"] == "pfc_cosface_c1e5_r4")
    raw["claims"] = [claim]
    raw["arms"] = {k: dict(raw["arms"][k]) for k in claim["arms"]}
    for a in raw["arms"].values():
        a["overrides"] = {k: v for k, v in a["overrides"].items() if not k.startswith("trainer.")}
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def _instant_runs(monkeypatch, open_rank1):
    """``running.execute`` replaced by a run that writes its ``result.json`` at once, its validation
    and test open-set rank-1 ``open_rank1(run)`` (the other logged columns at plausible levels), a
    finished run read from the workdir as the real one does: what the queue and the gate read,
    without training. Returns the runs started, in order."""
    started = []

    def execute(run, *, quick, workdir, threads, fresh, timeout, isolation="fork"):
        if not fresh and (row := rp.running.cached_row(run, quick=quick, workdir=workdir)) is not None:
            return row  # finished: read, as the real execute does
        started.append((run.arm.key, run.phase, run.seed, dict(run.params)))
        args = run.args(quick)
        folder = rp.running._run_dir(run, args, workdir)
        os.makedirs(folder, exist_ok=True)
        v = open_rank1(run)
        res = {"ok": True, "epochs": run.arm.epochs, "steps": 25000, "wall_seconds": 1.0, "code": "test",
               "code_hash": rp.running._code_hash(run.arm), "data": {"test_split": "t7"},
               "fit_metrics": {"train/positive_share": 0.03 if "c1e5_pfc01" == run.arm.key else 1.0},
               "val_metrics": {"val/open_rank1": v},
               "test_metrics": {} if run.phase == "tune" else {
                   "test/open_rank1": v, "test/top1": v, "test/top5": v, "test/open_tar_far": v,
                   "test/open_rank1_fixed": 0.168, "test/top1_fixed": 0.1, "test/train_step_ms": 5.0,
                   "test/train_cuda_peak_mb": 900.0 if "c1e5_pfc01" == run.arm.key else 1500.0}}
        with open(os.path.join(folder, "result.json"), "w") as fh:
            json.dump(res, fh)
        return rp.running._row(run, args, res)

    monkeypatch.setattr(rp.running, "execute", execute)
    return started


def test_a_failed_gate_makes_the_claim_not_tested_and_runs_nothing_else(tmp_path, monkeypatch, capsys):
    """The full softmax (the gate arm) stays under the validation floor at every learning rate of the
    first tuning seed: only those three runs are made, and the claim is *not tested* with the gate's
    reading as its reason, listed apart from the headline; the runs file holds the gate runs."""
    path = _gate_claims_file(tmp_path)
    started = _instant_runs(monkeypatch, lambda run: 0.05)
    plan = ["--claims-file", path, "--workdir", str(tmp_path / "w"), "--plan"]
    assert rp.cli.main(plan) == 0
    assert "    gate: open: 0 of its 3 run(s) (c1e5_pfc10, seed 1000) finished; they run first" in capsys.readouterr().out
    code = rp.cli.main(["--claims-file", path, "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "w"),
                        "--jobs", "2", "--allow-dirty"])
    assert code == 0
    assert sorted((a, p, s) for a, p, s, _ in started) == [("c1e5_pfc10", "tune", 1000)] * 3
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "0 claims tested" in summary and "1 not tested" in summary
    assert ("`pfc_cosface_c1e5_r4`: not tested (the full softmax leaves its plateau: the best val/open_rank1 of "
            "c1e5_pfc10 over its 3 gate run(s) 0.05, not > 0.19)") in summary
    assert "| not run: its gate failed | not tested (" in summary
    with open(tmp_path / "out" / "many_class_runs.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 3
    assert "not tested, its gate failed" in capsys.readouterr().out
    assert rp.cli.main(plan) == 0
    assert "    gate: failed: the claim is not tested (the full softmax leaves its plateau" in capsys.readouterr().out


def test_a_passed_gate_lets_the_claim_run_after_it(tmp_path, monkeypatch, capsys):
    """One gate run above the floor: the gate passes after the first tuning seed's runs of the full
    softmax, which start before any other run of the claim, and the claim then runs as declared."""
    path = _gate_claims_file(tmp_path)
    started = _instant_runs(monkeypatch, lambda run: 0.5 if dict(run.params)["model.init_args.lr"] == 0.0003 else 0.1)
    code = rp.cli.main(["--claims-file", path, "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "w"),
                        "--jobs", "2", "--allow-dirty"])
    assert code == 0
    assert [(a, p, s) for a, p, s, _ in started[:3]] == [("c1e5_pfc10", "tune", 1000)] * 3
    assert {(a, p) for a, p, _, _ in started[3:]} >= {("c1e5_pfc01", "tune"), ("c1e5_pfc10", "eval"),
                                                      ("c1e5_pfc01", "eval"), ("c1e5_pfc10", "replicate")}
    assert sum(1 for a, p, s, _ in started if (a, p, s) == ("c1e5_pfc10", "tune", 1000)) == 3  # read, not rerun
    out = capsys.readouterr().out
    assert "gate passed (the full softmax leaves its plateau: the best val/open_rank1 of c1e5_pfc10 over its 3 " \
           "gate run(s) 0.5, > 0.19)" in out
    assert "1 claims tested" in (tmp_path / "out" / "summary.md").read_text()


def test_a_gate_is_declared_with_a_validation_metric_of_one_of_its_arms():
    c = next(c for c in R4.claims if c.key == "pfc_cosface_c1e5_r4")
    assert c.gate == rp.claims.Gate("the full softmax leaves its plateau", "c1e5_pfc10", "val/open_rank1", ">", 0.19)
    bad = dataclasses.replace(R4, claims=(dataclasses.replace(c, gate=rp.claims.Gate("g", "nope", "test/top1", "~", 1.0)),))
    problems = "\n".join(rp.claims.validate_claims(bad))
    assert "arm 'nope' is not one of the claim's arms" in problems and "must be a validation column" in problems
    assert "op must be one of" in problems
