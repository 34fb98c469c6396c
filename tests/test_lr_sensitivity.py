"""The learning-rate sensitivity check of protocol revision 4 (``kind: lr_sensitivity``; Wortsman et
al. 2023): the statistic (``stats.lr_sensitivity``), its sample from the tuning sweep
(``analysis.sensitivity_sample``: per tuning seed and sweep, diverged runs at the cap, incomplete
sweeps left out), the validator, the report's sweep table, an instant end-to-end run of the
language-model claim through the command line (no training) whose verdict the independent
recomputation (``benchmarks/recompute_revision4.py``) repeats, and the per-step training trace
the reproduction worker keeps. Expected numbers are computed here from the definition."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import sys
import types

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # as benchmarks/reproduce_results.py puts it there
import reproduce as rp  # noqa: E402
import reproduce.cli  # noqa: E402,F401  (imports every step's module)
import stats  # noqa: E402

R4_FILE = os.path.join(ROOT, "benchmarks", "claims_revision4.yaml")
R4 = rp.claims.load_claims(R4_FILE)
CLAIM = next(c for c in R4.claims if c.key == "logz_lr_sensitivity_lm_r4")
PRIM = CLAIM.primary()
LN_V = 9.0109  # the declared cap: ln 8192, the uniform prediction's loss, to 4 decimals
assert PRIM.cap == LN_V and abs(LN_V - math.log(8192)) < 5e-5


def _sens(losses, cap):
    vals = [cap if not math.isfinite(v) else min(v, cap) for v in losses]
    return sum(vals) / len(vals) - min(vals)


def test_the_statistic_caps_diverged_and_worse_than_initial_runs():
    assert stats.lr_sensitivity([3.0, 3.5, 4.0], 9.0) == pytest.approx(0.5)
    # a diverged run (nan / inf) and one that ended above the cap both count as the cap
    assert stats.lr_sensitivity([3.0, float("nan"), 12.0, float("inf")], 9.0) == pytest.approx((3 + 9 + 9 + 9) / 4 - 3)
    assert stats.lr_sensitivity([4.0, 4.0], 9.0) == 0.0
    assert math.isnan(stats.lr_sensitivity([], 9.0))


def _tune_row(arm, seed, width, lr, nll=None, error=""):
    params = {"model.init_args.embedding_dim": width, "model.init_args.num_heads": 4 if width == 256 else 8,
              "model.init_args.lr": lr}
    r = {"benchmark": "language_model", "arm": arm, "phase": "tune", "seed": seed, "ok": not error,
         "params": json.dumps(params, sort_keys=True), "error": error, "label": arm}
    if nll is not None:
        r["val/nll"] = nll
    return r


LRS = (0.0003, 0.001, 0.003, 0.01, 0.03, 0.1)


def _sweep(arm, seed, width, losses, errors=None):
    errors = errors or {}
    return [_tune_row(arm, seed, width, lr, None if lr in errors else v, errors.get(lr, ""))
            for lr, v in zip(LRS, losses)]


def test_the_sample_pairs_sweeps_by_tuning_seed_and_width_and_reads_divergence_as_the_cap():
    ce = [5.0, 4.0, 3.5, 4.5, 7.0, 8.0]
    pen = [5.0, 4.0, 3.4, 4.0, 5.0, 6.0]
    nan_error = "ValueError: cross_entropy: logits contains NaN or +inf (12 NaN); check the model output for overflow"
    rows = (_sweep("ce4_lm_sweep", 1000, 256, ce, {0.1: nan_error})        # diverged: counts as ln V
            + _sweep("logz4_lm_sweep", 1000, 256, pen)
            + _sweep("ce4_lm_sweep", 1001, 256, ce) + _sweep("logz4_lm_sweep", 1001, 256, pen)
            + _sweep("ce4_lm_sweep", 1000, 512, ce)
            + _sweep("logz4_lm_sweep", 1000, 512, pen, {0.01: "RuntimeError: CUDA out of memory"})  # not a divergence
            + _sweep("ce4_lm_sweep", 1001, 512, ce[:5]) + _sweep("logz4_lm_sweep", 1001, 512, pen))  # incomplete
    got = rp.analysis.sensitivity_sample(PRIM, rows, R4.arms)
    ce_div = ce[:5] + [float("nan")]
    assert set(got) == {(1000, "256"), (1001, "256")}  # the two 512 sweeps are missing a run
    assert got[(1000, "256")] == pytest.approx(_sens(pen, LN_V) - _sens(ce_div, LN_V))
    assert got[(1001, "256")] == pytest.approx(_sens(pen, LN_V) - _sens(ce, LN_V))
    assert rp.analysis.diverged({"ok": False, "error": nan_error})
    assert not rp.analysis.diverged({"ok": False, "error": "RuntimeError: CUDA out of memory"})
    assert not rp.analysis.diverged({"ok": True, "error": ""})
    # the check's sample, as the claim's verdict reads it: the paired differences, keyed by position
    sample = rp.analysis.check_sample(PRIM, rows, [0, 1], R4.arms)
    assert sorted(sample.values()) == pytest.approx(sorted(got.values()))


def _file(tmp_path, edit):
    with open(R4_FILE) as fh:
        raw = yaml.safe_load(fh)
    edit(raw)
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return "\n".join(rp.claims.validate_claims(rp.claims.load_claims(str(path))))


def _prim(raw):
    claim = next(c for c in raw["claims"] if c["key"] == "logz_lr_sensitivity_lm_r4")
    return next(ch for ch in claim["checks"] if ch.get("primary"))


@pytest.mark.parametrize("edit, fragment", [
    (lambda raw: _prim(raw).update(metric="test/nll"), "its metric must be a validation loss"),
    (lambda raw: _prim(raw).update(better="higher"), "declare better: lower"),
    (lambda raw: _prim(raw).pop("cap"), "cap must be a finite number"),
    (lambda raw: _prim(raw).update(margin=0.1), "takes no margin"),
    (lambda raw: raw["arms"]["ce4_lm_sweep"].pop("widen"), "declare it widen: false"),
    (lambda raw: _prim(raw).update(group="model.init_args.dropout"), "group 'model.init_args.dropout' must be a key"),
    (lambda raw: raw["arms"]["logz4_lm_sweep"]["grid"].__setitem__("points", [  # its own list (the file shares one)
        {"model.init_args.embedding_dim": 256, "model.init_args.num_heads": 4, "model.init_args.lr": 0.0002},
        *raw["arms"]["logz4_lm_sweep"]["grid"]["points"][1:]]),
     "must sweep the same grid points"),
    (lambda raw: [a["grid"].__setitem__("points", a["grid"]["points"][:2] + a["grid"]["points"][6:])
                  for k, a in raw["arms"].items() if k.endswith("_lm_sweep")],
     "every sweep needs at least 3 learning rates"),
])
def test_the_validator_names_what_a_sensitivity_check_needs(tmp_path, edit, fragment):
    assert fragment in _file(tmp_path, edit)


def test_a_replicate_doubles_a_step_budget_with_the_epochs():
    arm = rp.claims.replicate_arm(R4.arms["ce4_lm"], 2)
    assert arm.epochs == 8 and dict(arm.overrides)["trainer.max_steps"] == 4000


def test_the_language_model_claims_run_on_a_gpu_and_parse_through_the_cli():
    """Every arm of the revision-4 language-model claims trains on one CUDA device (refused where none
    is visible) for 2,000 steps, and its arguments parse through the Lightning CLI (nothing built)."""
    from lightning_modules.cli import main

    keys = ("logz_lr_sensitivity_lm_r4", "z_loss_lm_r4", "entmax15_lm_r4")
    arms = {k for c in R4.claims if c.key in keys for k in c.arms}
    assert arms == {"ce4_lm_sweep", "logz4_lm_sweep", "logz3_lm_sweep", "ce4_lm", "z4_lm", "entmax4_lm"}
    for k in sorted(arms):
        arm = R4.arms[k]
        assert dict(arm.overrides)["trainer.max_steps"] == 2000, k
        for p in (arm.grid_points()[0], arm.grid_points()[-1]):
            args = rp.runs.run_args(arm, 0, p, phase="eval", quick=False)
            assert rp.running.needs_gpu(args), k
            cli = main(args=["--config", os.path.join(ROOT, arm.recipe), "--trainer.logger=false"], run=False)
            cfg = cli.parser.parse_args(["--config", os.path.join(ROOT, arm.recipe), *args])
            assert cfg.trainer.accelerator == "gpu" and cfg.trainer.max_steps == 2000, k
            assert cfg.trainer.precision == "bf16-mixed" and cfg.model.init_args.num_layers == 4, k
            assert cfg.data.init_args.exclude_tests is False, k
            if "model.init_args.embedding_dim" in p:
                assert cfg.model.init_args.embedding_dim == p["model.init_args.embedding_dim"], k


# ------------------------------------------------------------------------------------------
# end to end, instant runs: the command line, the report, the independent recomputation
# ------------------------------------------------------------------------------------------
def _lm_claims_file(tmp_path) -> str:
    """The sensitivity claim and its arms as declared, but on the CPU (no trainer.accelerator)."""
    with open(R4_FILE) as fh:
        raw = yaml.safe_load(fh)
    raw["claims"] = [c for c in raw["claims"] if c["key"] == "logz_lr_sensitivity_lm_r4"]
    raw["arms"] = {k: dict(raw["arms"][k]) for k in raw["claims"][0]["arms"]}
    for a in raw["arms"].values():
        a["overrides"] = {k: v for k, v in a["overrides"].items() if k not in ("trainer.accelerator", "trainer.devices")}
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def _final_nll(arm: str, lr: float, width: int, seed: int) -> float:
    """A made-up final validation loss: a bowl in log10(lr) around 3e-3; cross-entropy degrades at the
    two highest rates (and diverges at 0.1 on width 512), the penalty arms much less."""
    x = math.log10(lr) - math.log10(0.003)
    v = 3.2 + 0.6 * x * x + (0.1 if width == 256 else 0.0) + 0.01 * (seed - 1000)
    if lr >= 0.03:
        v += {"ce4_lm_sweep": 2.0, "logz4_lm_sweep": 0.4, "logz3_lm_sweep": 0.3}[arm] + 0.05 * (seed - 1000)
    return v


def _instant(monkeypatch):
    started = []

    def execute(run, *, quick, workdir, threads, fresh, timeout, isolation="fork"):
        if not fresh and (row := rp.running.cached_row(run, quick=quick, workdir=workdir)) is not None:
            return row
        started.append((run.arm.key, run.phase, run.seed))
        args = run.args(quick)
        folder = rp.running._run_dir(run, args, workdir)
        os.makedirs(folder, exist_ok=True)
        p = dict(run.params)
        width, lr = p.get("model.init_args.embedding_dim", 256), p["model.init_args.lr"]
        if run.arm.key == "ce4_lm_sweep" and lr == 0.1 and width == 512:  # diverges, as a real run fails
            res = {"ok": False, "error": "ValueError: cross_entropy: logits contains NaN or +inf (3 NaN); check the "
                                         "model output for overflow or divergence"}
        else:
            nll = _final_nll(run.arm.key, lr, width, run.seed if run.phase == "tune" else 1000)
            pen = run.arm.key != "ce4_lm_sweep"
            test = {} if run.phase == "tune" else {
                "test/nll": nll + 0.002 * run.seed, "test/ppl": math.exp(nll), "test/top1": 0.62 - 0.02 * nll,
                "test/top5": 0.8, "test/logz_mean": 0.3 + 0.01 * run.seed if pen else 8.7,
                "test/logz_std": 0.4 if pen else 0.9, "test/bigram_top1": 0.3, "test/bigram_ppl": 60.0,
                "test/unigram_top1": 0.05}
            res = {"ok": True, "epochs": 3, "steps": 2000, "wall_seconds": 1.0, "code": "test",
                   "code_hash": rp.running._code_hash(run.arm), "data": {"test_split": "lm"},
                   "fit_metrics": {"train/logz_mean": 0.5, "train/spikes": 0.0},
                   "trace": {"train/logz_mean": [[0, 9.0], [1990, 0.4 if pen else 8.8]]},
                   "val_metrics": {"val/nll": nll, "val/top1": 0.62 - 0.02 * nll}, "test_metrics": test}
        with open(os.path.join(folder, "result.json"), "w") as fh:
            json.dump(res, fh)
        return rp.running._row(run, args, res)

    monkeypatch.setattr(rp.running, "execute", execute)
    return started


def test_the_sweep_claim_runs_reports_and_recomputes(tmp_path, monkeypatch):
    path = _lm_claims_file(tmp_path)
    started = _instant(monkeypatch)
    out = tmp_path / "out"
    code = rp.cli.main(["--claims-file", path, "--out", str(out), "--workdir", str(tmp_path / "w"), "--jobs", "2",
                        "--allow-dirty"])
    assert code == 0
    assert sum(p == "tune" for _, p, _ in started) == 3 * 12 * 3  # the whole sweep, never widened
    assert sum(p == "eval" for _, p, _ in started) == 3 * 5
    with open(out / "language_model_runs.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert "trace" in rows[0] and json.loads(next(r["trace"] for r in rows if r["ok"] == "True"))["train/logz_mean"]
    # every arm's evaluation runs use its point of best mean validation top-1 (lowest loss): 3e-3 at width 512
    for r in rows:
        if r["phase"] == "eval":
            assert json.loads(r["params"]) == {"model.init_args.embedding_dim": 512, "model.init_args.num_heads": 8,
                                               "model.init_args.lr": 0.003}
    # the expected sample, from the definition: 3 tuning seeds x 2 widths
    diffs = []
    for seed in (1000, 1001, 1002):
        for width in (256, 512):
            s = {}
            for arm in ("logz4_lm_sweep", "ce4_lm_sweep"):
                vals = [float("nan") if (arm, lr, width) == ("ce4_lm_sweep", 0.1, 512) else
                        _final_nll(arm, lr, width, seed) for lr in LRS]
                s[arm] = _sens(vals, 9.0109)
            diffs.append(s["logz4_lm_sweep"] - s["ce4_lm_sweep"])
    ci = stats.interval(diffs, method="t", confidence=0.95)
    assert ci.high < 0
    md = (out / "language_model.md").read_text()
    block = md.split("(`logz_lr_sensitivity_lm_r4`)", 1)[1].split("\n## ", 1)[0]
    assert "learning-rate sensitivity of final nll (capped at 9.0109; tuning sweep per embedding_dim)" in block
    assert f"{ci.mean:+.4f}" in block and "| primary | 6 |" in block
    assert "Learning-rate sweep: final val/nll at each learning rate" in block
    ce512 = [r for r in block.splitlines() if r.startswith("| cross-entropy, learning-rate sweep (LM, GPU) | 512 |")]
    # the diverged runs at the cap, counted; then the sweep's sensitivity, mean over the 3 tuning seeds
    s_ce512 = sum(_sens([float("nan") if lr == 0.1 else _final_nll("ce4_lm_sweep", lr, 512, seed) for lr in LRS],
                        9.0109) for seed in (1000, 1001, 1002)) / 3
    assert len(ce512) == 1 and ce512[0].endswith(f"| 9.0109 (n=3) | 3 | {s_ce512:.4f} (n=3) |"), ce512
    assert "**Verdict: reproduced" in block
    summary = (out / "summary.md").read_text()
    assert "1 claims tested: 1 reproduced" in summary
    # the sweep's figure: final loss against the learning rate, and each rate's per-step log Z
    assert (out / "language_model_sweep.png").stat().st_size > 10000 and "![language_model_sweep]" in md
    spec = importlib.util.spec_from_file_location("recompute_revision4", os.path.join(ROOT, "benchmarks",
                                                                                       "recompute_revision4.py"))
    rc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rc)
    assert rc.main(["--claims-file", path, "--results", str(out), "--resamples", "200"]) == 0


def test_the_penalty_that_did_not_act_leaves_the_claim_not_tested(tmp_path, monkeypatch):
    """The manipulation check reads the penalty arm's mean test log Z against 1 (absolute): a penalty
    that left log Z at 8.7 makes the claim *not tested*, whatever the sweep says."""
    rows = []
    for arm in ("logz4_lm_sweep", "ce4_lm_sweep", "logz3_lm_sweep"):
        for seed in range(5):
            rows.append({"benchmark": "language_model", "arm": arm, "phase": "eval", "seed": seed, "ok": True,
                         "params": "{}", "error": "", "test/logz_mean": 8.7, "test/nll": 3.0, "test/top1": 0.5,
                         "test/bigram_top1": 0.3, "test/logz_std": 0.5, "data": "{}"})
        for seed in (1000, 1001, 1002):
            for width in (256, 512):
                rows += _sweep(arm, seed, width, [_final_nll(arm, lr, width, seed) for lr in LRS])
    res = rp.analysis.claim_results(CLAIM, rows, seeds=list(range(5)), method="t", confidence=0.95, revision=4,
                                    arms=R4.arms)
    assert res["rev3"].primary.verdict == stats.REPRODUCED and res["rev3"].verdict == stats.NOT_TESTED
    assert [m.passed for m in res["rev3"].manipulation] == [False, True]


# ------------------------------------------------------------------------------------------
# the worker's per-step trace
# ------------------------------------------------------------------------------------------
def _worker():
    spec = importlib.util.spec_from_file_location("_reproduce_worker", os.path.join(ROOT, "benchmarks",
                                                                                    "_reproduce_worker.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_worker_keeps_the_per_step_loss_and_log_z_thinned_to_200_points(tmp_path):
    with open(tmp_path / "metrics.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["epoch", "step", "train/loss", "train/logz_mean", "val/nll"])
        for step in range(0, 5000, 10):
            w.writerow([step // 1000, step, 9.0 - step / 1000, 9.0 - step / 600, ""])
        w.writerow([4, 4999, "", "", 3.5])  # a validation row: not in the trace
    trainer = types.SimpleNamespace(loggers=[types.SimpleNamespace(log_dir=str(tmp_path))])
    trace = _worker()._trace(trainer)
    assert set(trace) == {"train/loss", "train/logz_mean"}
    lz = trace["train/logz_mean"]
    assert len(lz) == 200 and lz[0] == [0, 9.0] and lz[-1] == [4990, pytest.approx(9.0 - 4990 / 600, rel=1e-5)]
    assert all(a[0] < b[0] for a, b in zip(lz, lz[1:]))
    assert _worker()._trace(types.SimpleNamespace(loggers=[])) == {}


def test_prepare_data_builds_each_distinct_data_set_once(capsys):
    """``--prepare-data`` (run by ``scripts/gpu_claims.sh`` before the runs start side by side):
    one DataModule per distinct data section of the selected claims' arms, its ``prepare_data()``
    called, nothing run; two arms with the same data share one."""
    code = rp.cli.main(["--claims-file", R4_FILE, "--claims", "sparsemax_r4", "--prepare-data"])
    out = capsys.readouterr().out
    # the claim's arms and those of their widening group (tuned with them): sparse4 and ce4 share one data set
    arms = [k for g in rp.tuning.plan_groups(R4, ["sparse4", "ce4"]) for k in g]
    distinct = {json.dumps(rp.claims.data_config(R4.arms[k]), sort_keys=True) for k in arms}
    assert json.dumps(rp.claims.data_config(R4.arms["sparse4"]), sort_keys=True) == \
        json.dumps(rp.claims.data_config(R4.arms["ce4"]), sort_keys=True)
    assert code == 0 and f"reproduce_results: {len(distinct)} of {len(distinct)} data set(s) prepared" in out
    assert out.count("reproduce_results: prepared the data of ") == len(distinct) < len(arms)
    assert "(lightning_modules.data.MNISTDataModule)" in out
