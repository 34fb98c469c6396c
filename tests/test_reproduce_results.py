"""``benchmarks/reproduce_results.py``: the reduced (``--quick``) reproduction runs end to end and
its markdown agrees with its CSV; the verdict rules on hand-made numbers.

The quick run trains one vision claim (OPL on digits low-data) and one recommendation claim
(decoupled softmax vs InfoNCE on ML-100k users) for 2 batches each, through the real CLI, in fresh
processes. Its numbers are meaningless; what is checked is that every file is written and that
every mean +- sd in the markdown is the aggregate of the CSV's raw runs.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import os
import statistics
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "reproduce_results.py")


def _module():
    spec = importlib.util.spec_from_file_location("reproduce_results", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


rr = _module()


# ------------------------------------------------------------------------------------------
# verdict rules (no runs)
# ------------------------------------------------------------------------------------------
def test_verdict_better():
    c = rr.Check("m", "f", "b", "better")
    # means 0.9 vs 0.8, sds 0.01 / 0.01 -> pooled 0.01 < 0.1
    assert rr.verdict(c, [0.89, 0.90, 0.91], [0.79, 0.80, 0.81])[0] == rr.REPRODUCED
    assert rr.verdict(c, [0.79, 0.80, 0.81], [0.89, 0.90, 0.91])[0] == rr.NOT_REPRODUCED
    # difference 0.01 and sds 0.1 -> within one sd
    v, info = rr.verdict(c, [0.8, 0.9, 1.0], [0.79, 0.89, 0.99])
    assert v == rr.INCONCLUSIVE
    assert info["diff"] == pytest.approx(0.01)
    assert info["pooled_sd"] == pytest.approx(0.1)
    # lower is better: the family's smaller value wins
    c_low = rr.Check("m", "f", "b", "better", higher_is_better=False)
    assert rr.verdict(c_low, [0.1, 0.11, 0.12], [0.3, 0.31, 0.32])[0] == rr.REPRODUCED
    # one seed: no sd
    assert rr.verdict(c, [0.9], [0.8])[0] == rr.INCONCLUSIVE_N


def test_verdict_not_worse_equal_below():
    nw = rr.Check("m", "f", "b", "not_worse", tol=0.01)
    assert rr.verdict(nw, [0.895, 0.895, 0.895], [0.9, 0.9, 0.9])[0] == rr.REPRODUCED  # 0.005 <= tol
    assert rr.verdict(nw, [0.85, 0.85, 0.85], [0.9, 0.9, 0.9])[0] == rr.NOT_REPRODUCED
    assert rr.verdict(nw, [0.99, 0.99, 0.99], [0.9, 0.9, 0.9])[0] == rr.REPRODUCED  # better is fine
    eq = rr.Check("m", "f", "b", "equal", tol=1e-3)
    assert rr.verdict(eq, [0.5, 0.6, 0.7], [0.5, 0.6, 0.7])[0] == rr.REPRODUCED
    assert rr.verdict(eq, [0.9, 0.9, 0.9], [0.5, 0.5, 0.5])[0] == rr.NOT_REPRODUCED
    below = rr.Check("m", "f", None, "below", level=10.0)
    assert rr.verdict(below, [1.1, 1.2, 1.3], [])[0] == rr.REPRODUCED
    assert rr.verdict(below, [10.0, 10.0, 10.0], [])[0] == rr.NOT_REPRODUCED
    assert rr.verdict(below, [9.0, 10.0, 11.0], [])[0] == rr.INCONCLUSIVE


def test_claim_verdict_and_format():
    assert rr.claim_verdict([rr.REPRODUCED, rr.REPRODUCED]) == rr.REPRODUCED
    assert rr.claim_verdict([rr.REPRODUCED, rr.NOT_REPRODUCED]).startswith(rr.NOT_REPRODUCED + " (1 of 2")
    assert rr.claim_verdict([rr.REPRODUCED, rr.INCONCLUSIVE]).startswith(rr.INCONCLUSIVE)
    m, s = rr.parse_fmt(rr.fmt(0.123456, 0.0101))
    assert (m, s) == (0.1235, 0.0101)
    assert math.isnan(rr.parse_fmt(rr.fmt(0.5, float("nan")))[1])


def test_every_claim_row_of_benchmarks_md_is_covered():
    """One claim per row of the docs/benchmarks.md table (decoupled softmax: two, one per data set),
    every arm points at an existing recipe, every check at an arm of its claim."""
    arms = rr._arms()
    claims = rr._claims()
    families = {c.family for c in claims}
    assert families == {"Z-loss", "sparsemax loss", "comp-sum (tau)", "smooth adversarial comp-sum", "OPL", "GOL",
                        "WCDAS", "Dice semimetric", "NBC-softmax", "Partial FC", "decoupled softmax", "PSL"}
    for c in claims:
        for k in c.arms:
            assert os.path.exists(os.path.join(ROOT, arms[k].recipe)), arms[k].recipe
        for ch in c.checks:
            assert ch.family in c.arms and (ch.baseline is None or ch.baseline in c.arms)


def test_run_args_vary_every_seed():
    arms = rr._arms()
    a = rr.run_args(arms["pfc_01"], 2, quick=False)
    assert "--seed_everything=2" in a and "--data.init_args.seed=2" in a
    assert "--model.init_args.loss.init_args.seed=2" in a  # the recipe's loss has its own seed
    assert f"--trainer.max_epochs={arms['pfc_01'].epochs}" in a and "--trainer.limit_val_batches=0" in a
    b = rr.run_args(arms["ce"], 1, quick=True)
    assert "--model.init_args.loss.init_args.seed=1" not in b
    assert "--trainer.limit_train_batches=2" in b and "--trainer.max_epochs=1" in b


# ------------------------------------------------------------------------------------------
# the reduced reproduction, end to end
# ------------------------------------------------------------------------------------------
def _tables(md: str):
    """``{claim heading: {loss label: {column: cell}}}`` from the first table of each claim."""
    out, heading, header, rows, in_table = {}, None, None, None, False
    for line in md.splitlines():
        if line.startswith("## "):
            heading, header, in_table = line[3:], None, False
            continue
        if heading and line.startswith("| loss |") and header is None:
            header = [c.strip() for c in line.strip("|").split("|")]
            rows = out.setdefault(heading, {})
            in_table = True
            continue
        if in_table:
            if not line.startswith("|"):
                in_table = False
                continue
            if line.startswith("|---"):
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = dict(zip(header, cells))
    return out


@pytest.fixture(scope="module")
def quick_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    work = tmp_path_factory.mktemp("work")
    code = rr.main(["--quick", "--claims", "opl,decoupled_ml100k", "--out", str(out), "--workdir", str(work)])
    return out, code


def test_quick_reproduction_writes_everything(quick_out):
    out, code = quick_out
    assert code == 0, (out / "raw_runs.csv").read_text()
    for name in ("vision.md", "recommendation.md", "summary.md", "raw_runs.csv", "vision.png",
                 "recommendation.png", "recommendation_recall20.png"):
        p = out / name
        assert p.exists() and p.stat().st_size > 0, name
    for name in ("vision.png", "recommendation.png", "recommendation_recall20.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "retrieval.md").exists()  # only the chosen claims ran
    summary = (out / "summary.md").read_text()
    assert "OPL" in summary and "decoupled softmax" in summary
    md = (out / "vision.md").read_text()
    assert "sys.version" in md and "torch" in md and "train_size=" in md
    assert "Verdict: inconclusive (n < 2)" in md  # one seed: no sd, no verdict either way


def test_quick_markdown_equals_csv_aggregates(quick_out):
    out, _ = quick_out
    with open(out / "raw_runs.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["arm"] for r in rows} == {"opl_lowdata", "ce_lowdata", "ds_users", "infonce_users"}
    assert all(r["ok"] == "True" and r["seed"] == "0" and r["epochs"] == "1" for r in rows)
    arms = rr._arms()
    by_label = {a.label: a.key for a in arms.values()}
    checked = 0
    for bench in ("vision", "recommendation"):
        tables = _tables((out / f"{bench}.md").read_text())
        assert tables, bench
        for heading, table in tables.items():
            for label, cells in table.items():
                key = by_label[label]
                mine = [r for r in rows if r["arm"] == key]
                assert cells["n"] == str(len(mine))
                assert cells["epochs"] == "1"
                for col, cell in cells.items():
                    if col in ("loss", "recipe", "n", "epochs", "run s"):
                        continue
                    vals = [float(r[f"test/{col}"]) for r in mine if r.get(f"test/{col}", "") != ""]
                    m, s = rr.parse_fmt(cell)
                    if not vals:
                        assert cell == "n/a"
                        continue
                    assert m == pytest.approx(statistics.fmean(vals), abs=5.1e-5), (heading, label, col)
                    if len(vals) > 1:
                        assert s == pytest.approx(statistics.stdev(vals), abs=5.1e-5)
                    else:
                        assert math.isnan(s)
                    checked += 1
    assert checked >= 4 * 3  # every arm, at least three metrics each
