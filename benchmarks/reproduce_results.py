"""Reproduce the papers' claims of ``docs/benchmarks.md`` with the project's Lightning recipes.

For every row of the table "What each family should show" this runs the family's recipe(s) and
its baseline recipe(s) (``configs/<benchmark>/*.yaml``) through the project's CLI -- ``fit``,
then ``test`` from the checkpoint that fit saved (the end of the last epoch) -- over several
seeds, collects the ``test/...`` metrics the LightningModules log, and writes

* ``<out>/<benchmark>.md`` for ``vision``, ``segmentation``, ``recommendation``, ``retrieval``:
  one table per claim (metric mean +- sd per loss, n seeds, epochs, wall time) and the claim's
  checks with a verdict computed from the numbers (never hand-written);
* ``<out>/summary.md``: one line per claim;
* ``<out>/*.png``: plots (per-class accuracy on digits-LT, Recall@20 per loss on ML-100k, R@1
  per loss on code search, R@1 against the InfoNCE temperature, one panel per claim);
* ``<out>/raw_runs.csv``: every run (recipe, seed, overrides, wall times, data sizes, metrics).

Usage (one command regenerates everything; about an hour on 2 CPU cores)::

    python benchmarks/reproduce_results.py                    # 3 seeds, every benchmark
    python benchmarks/reproduce_results.py --seeds 5 --benchmarks vision,retrieval
    python benchmarks/reproduce_results.py --claims gol,psl --out /tmp/res
    python benchmarks/reproduce_results.py --quick --out /tmp/res   # 1 seed, 1 epoch, 2 batches

Each run is a fresh process (``benchmarks/_reproduce_worker.py``, which calls
``lightning_modules.cli.main`` -- the entry point of ``python -m lightning_modules`` -- for
``fit`` and then ``test``), so no state leaks between runs. ``--jobs`` runs that many processes
at once with ``max(1, cpus // jobs)`` torch threads each (never more threads than cores). Seeds
vary ``--seed_everything``, the DataModule's ``seed`` (split, subsampling, label noise,
shuffling, negatives) and a loss's own ``seed`` where the recipe sets one. Finished runs are
kept in ``--workdir`` keyed by their exact overrides and parsed recipe, so an interrupted
reproduction resumes (``--fresh`` ignores them; use it after changing the library).

Verdicts (per check; ``d`` = family mean - baseline mean, sign-adjusted so that ``d > 0`` is
better, ``s = sqrt((sd_f^2 + sd_b^2) / 2)``):

* ``better`` (the claim says "better" or ">="): ``|d| <= s`` -> "inconclusive (within 1 sd)",
  ``d > s`` -> "reproduced", ``d < -s`` -> "not reproduced";
* ``not_worse`` ("competitive", "similar", "small cost", "matches"): "reproduced" when
  ``d >= -max(s, tol)``, else "not reproduced";
* ``equal`` ("equals"): "reproduced" when ``|d| <= max(s, tol)``, else "not reproduced";
* ``below`` (a level, e.g. mean support size < number of classes): "reproduced" when
  ``mean + sd < level``, "not reproduced" when ``mean - sd >= level``, else inconclusive.

A claim is "reproduced" when all its checks are; "not reproduced" when any check is not;
otherwise "inconclusive (within 1 sd)". With fewer than 2 seeds there is no sd and every check
that needs one is "inconclusive (n < 2)".
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "_reproduce_worker.py")
BENCHMARKS = ("vision", "segmentation", "recommendation", "retrieval")

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive (within 1 sd)"
INCONCLUSIVE_N = "inconclusive (n < 2)"

QUICK_ARGS = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
              "--trainer.limit_test_batches=2", "--trainer.num_sanity_val_steps=0"]


# ------------------------------------------------------------------------------------------
# what runs
# ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Arm:
    """One loss configuration: a recipe plus overrides, trained ``epochs`` epochs per seed."""

    key: str
    label: str
    recipe: str
    benchmark: str
    epochs: int
    overrides: Tuple[str, ...] = ()
    fit: bool = True  # False: test the untrained model (zero-shot reference)
    cost: float = 40.0  # rough run time in seconds (2 cores, shared), to start long runs first

    def recipe_text(self) -> str:
        with open(os.path.join(ROOT, self.recipe)) as fh:
            return fh.read()

    def loss_has_seed(self) -> bool:
        import yaml

        cfg = yaml.safe_load(self.recipe_text()) or {}
        loss = (((cfg.get("model") or {}).get("init_args") or {}).get("loss") or {})
        return "seed" in (loss.get("init_args") or {})


@dataclasses.dataclass(frozen=True)
class Check:
    """``metric`` of arm ``family`` against arm ``baseline`` (or a fixed ``level``)."""

    metric: str
    family: str
    baseline: Optional[str] = None
    kind: str = "better"  # better | not_worse | equal | below
    higher_is_better: bool = True
    tol: float = 0.0
    level: Optional[float] = None
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Claim:
    key: str
    family: str
    benchmark: str
    data: str
    claim: str
    arms: Tuple[str, ...]
    metrics: Tuple[str, ...]
    checks: Tuple[Check, ...]
    plot_metric: str
    notes: str = ""


V, S, R, T = "vision", "segmentation", "recommendation", "retrieval"


def _arms() -> Dict[str, Arm]:
    arms = [
        # digits (full): 18 steps / epoch
        Arm("ce", "cross-entropy", "configs/vision/cross_entropy.yaml", V, 5, cost=130),
        Arm("z_loss", "Z-loss", "configs/vision/z_loss.yaml", V, 5, cost=55),
        Arm("sparsemax", "sparsemax loss", "configs/vision/sparsemax.yaml", V, 5, cost=55),
        Arm("adv", "smooth adversarial comp-sum", "configs/vision/adversarial_comp_sum.yaml", V, 3, cost=290),
        Arm("ce_noisy", "cross-entropy (40% noise)", "configs/vision/cross_entropy_noisy.yaml", V, 6, cost=90),
        Arm("comp_sum_noisy", "comp-sum tau=1.5 (40% noise)", "configs/vision/comp_sum_noisy.yaml", V, 6, cost=90),
        # digits low-data (10%): 2 steps / epoch
        Arm("ce_lowdata", "cross-entropy (10% data)", "configs/vision/cross_entropy_lowdata.yaml", V, 30, cost=50),
        Arm("opl_lowdata", "CE + OPL (10% data)", "configs/vision/opl_lowdata.yaml", V, 30, cost=55),
        # digits-LT (IF 50): 5 steps / epoch
        Arm("ce_lt", "cross-entropy (LT)", "configs/vision/cross_entropy_lt.yaml", V, 15, cost=55),
        Arm("bce_lt", "BCE (LT)", "configs/vision/bce_with_logits_lt.yaml", V, 15, cost=55),
        Arm("gol_lt", "GOL (LT)", "configs/vision/gol_lt.yaml", V, 15, cost=55),
        Arm("cosine_lt", "cosine softmax (LT)", "configs/vision/cosine_softmax_lt.yaml", V, 15, cost=55),
        Arm("wcdas_lt", "WCDAS (LT)", "configs/vision/wcdas_lt.yaml", V, 15, cost=60),
        # digits segmentation
        Arm("dml_soft", "DML, soft labels", "configs/segmentation/dice_semimetric_soft.yaml", S, 4, cost=75),
        Arm("dml_hard", "DML, hard labels", "configs/segmentation/dice_semimetric_hard.yaml", S, 4, cost=75),
        Arm("dice_hard", "soft Dice, hard labels", "configs/segmentation/soft_dice_hard.yaml", S, 4, cost=75),
        # MovieLens-100k
        Arm("bpr", "BPR", "configs/recommendation/bpr.yaml", R, 10, cost=48),
        Arm("ssm", "sampled softmax", "configs/recommendation/sampled_softmax.yaml", R, 10, cost=35),
        Arm("psl_tanh", "PSL tanh", "configs/recommendation/psl_tanh.yaml", R, 10, cost=35),
        Arm("psl_atan", "PSL atan", "configs/recommendation/psl_atan.yaml", R, 10, cost=35),
        Arm("psl_relu", "PSL relu", "configs/recommendation/psl_relu.yaml", R, 10, cost=35),
        Arm("full_softmax", "full softmax (CE)", "configs/recommendation/full_softmax.yaml", R, 10, cost=50),
        Arm("pfc_01", "Partial FC r=0.1", "configs/recommendation/partial_fc.yaml", R, 10, cost=50),
        Arm("pfc_10", "Partial FC r=1.0 (full margin softmax)", "configs/recommendation/partial_fc.yaml", R, 10,
            ("--model.init_args.loss.init_args.sample_rate=1.0",), cost=50),
        Arm("ds_users", "decoupled softmax (users)", "configs/recommendation/decoupled_softmax_users.yaml", R, 10, cost=40),
        Arm("infonce_users", "InfoNCE (users)", "configs/recommendation/infonce_users.yaml", R, 10, cost=40),
        # retrieval
        Arm("chat_ds", "decoupled softmax (chatterbot)", "configs/retrieval/chatterbot_decoupled_softmax.yaml", T, 10, cost=40),
        Arm("chat_infonce", "InfoNCE (chatterbot)", "configs/retrieval/chatterbot_infonce.yaml", T, 10, cost=40),
        Arm("chat_zero", "zero-shot MiniLM (chatterbot)", "configs/retrieval/chatterbot_infonce.yaml", T, 0,
            fit=False, cost=15),
        Arm("stdlib_infonce", "InfoNCE tau=0.05 (stdlib)", "configs/retrieval/stdlib_infonce.yaml", T, 3, cost=40),
        Arm("stdlib_ds", "decoupled softmax tau=0.05 (stdlib)", "configs/retrieval/stdlib_infonce.yaml", T, 3,
            ("--model.init_args.loss=losses.DecoupledSoftmaxLoss",
             "--model.init_args.loss.init_args.temperature=0.05"), cost=40),
        Arm("stdlib_zero", "zero-shot MiniLM (stdlib)", "configs/retrieval/stdlib_infonce.yaml", T, 0, fit=False, cost=15),
        Arm("stdlib_nbc", "softmax + NBC (stdlib)", "configs/retrieval/stdlib_nbc_softmax.yaml", T, 3, cost=95),
        Arm("stdlib_softmax", "softmax alone (stdlib)", "configs/retrieval/stdlib_softmax.yaml", T, 3, cost=95),
    ]
    for tau in TEMPERATURES:
        if tau != 0.05:
            arms.append(Arm(f"stdlib_infonce_t{tau:g}", f"InfoNCE tau={tau:g} (stdlib)",
                            "configs/retrieval/stdlib_infonce.yaml", T, 3,
                            (f"--model.init_args.loss.init_args.temperature={tau:g}",)))
    return {a.key: a for a in arms}


TEMPERATURES = (0.02, 0.05, 0.2, 0.5)


def _claims() -> List[Claim]:
    C = Check
    return [
        Claim("z_loss", "Z-loss", V, "digits (full)", "competitive top-1 with CE; better top-k ranking scores",
              ("z_loss", "ce"), ("test/top1", "test/top5", "test/ece"),
              (C("test/top1", "z_loss", "ce", "not_worse", tol=0.01),
               C("test/top5", "z_loss", "ce", "better")), "test/top1"),
        Claim("sparsemax", "sparsemax loss", V, "digits (full)",
              "similar accuracy to CE with sparse output distributions (report mean support size)",
              ("sparsemax", "ce"), ("test/top1", "test/support", "test/sparsemax_support", "test/ece"),
              (C("test/top1", "sparsemax", "ce", "not_worse", tol=0.01),
               C("test/support", "sparsemax", None, "below", level=10.0,
                 note="mean support of sparsemax(logits) below the 10 classes (softmax: always 10)")),
              "test/top1",
              notes="`test/support` is the support of the loss's own predictive distribution (only losses "
                    "with `predict_proba`); `test/sparsemax_support` is the support sparsemax would give the "
                    "logits of any loss."),
        Claim("comp_sum", "comp-sum (tau)", V, "digits + 40% symmetric label noise (clean test)",
              "tau in (1, 2) (generalised CE / MAE-like) more robust to label noise than CE",
              ("comp_sum_noisy", "ce_noisy"), ("test/top1", "test/balanced_acc", "test/ece"),
              (C("test/top1", "comp_sum_noisy", "ce_noisy", "better"),), "test/top1"),
        Claim("adversarial", "smooth adversarial comp-sum", V, "digits (full)",
              "higher robust accuracy under PGD than CE training, small clean-accuracy cost",
              ("adv", "ce"), ("test/robust_acc", "test/top1"),
              (C("test/robust_acc", "adv", "ce", "better"),
               C("test/top1", "adv", "ce", "not_worse", tol=0.05, note="small cost: at most 5 points")),
              "test/robust_acc",
              notes="Robust accuracy: PGD-10 on cross-entropy, l-inf, eps 8/255, step 2/255, random start "
                    "(the recipes' `robust_eval`). The adversarial arm trains 3 epochs (each step runs a "
                    "10-step attack, ~11x the cost of a CE step), cross-entropy 5 (it is shared with the "
                    "Z-loss and sparsemax claims): the clean-accuracy comparison is, if anything, unfavourable "
                    "to the adversarial loss."),
        Claim("opl", "OPL", V, "digits low-data (10% of the training split)",
              "CE + OPL >= CE; tighter intra-class / wider inter-class cosine",
              ("opl_lowdata", "ce_lowdata"), ("test/top1", "test/cos_intra", "test/cos_inter"),
              (C("test/top1", "opl_lowdata", "ce_lowdata", "better"),
               C("test/cos_intra", "opl_lowdata", "ce_lowdata", "better"),
               C("test/cos_inter", "opl_lowdata", "ce_lowdata", "better", higher_is_better=False)),
              "test/top1"),
        Claim("gol", "GOL", V, "digits-LT (imbalance factor 50, balanced test)",
              "better tail-class accuracy than CE / BCE",
              ("gol_lt", "ce_lt", "bce_lt"), ("test/acc_tail", "test/acc_head", "test/top1", "test/balanced_acc"),
              (C("test/acc_tail", "gol_lt", "ce_lt", "better"),
               C("test/acc_tail", "gol_lt", "bce_lt", "better")), "test/acc_tail"),
        Claim("wcdas", "WCDAS", V, "digits-LT (imbalance factor 50, balanced test)",
              "better tail-class and overall balanced accuracy than CE / cosine softmax",
              ("wcdas_lt", "ce_lt", "cosine_lt"), ("test/acc_tail", "test/acc_head", "test/balanced_acc"),
              (C("test/acc_tail", "wcdas_lt", "ce_lt", "better"),
               C("test/acc_tail", "wcdas_lt", "cosine_lt", "better"),
               C("test/balanced_acc", "wcdas_lt", "ce_lt", "better"),
               C("test/balanced_acc", "wcdas_lt", "cosine_lt", "better")), "test/balanced_acc"),
        Claim("dice", "Dice semimetric", S, "digits-seg (11 classes, soft labels from ink intensity)",
              "soft-label training with DML >= hard-label (thresholded) training on Dice score and calibration; "
              "equals soft Dice on hard labels",
              ("dml_soft", "dml_hard", "dice_hard"), ("test/dice", "test/dice_fg", "test/ece", "test/pixel_acc"),
              (C("test/dice", "dml_soft", "dml_hard", "better"),
               C("test/dice", "dml_soft", "dice_hard", "better"),
               C("test/ece", "dml_soft", "dml_hard", "better", higher_is_better=False),
               C("test/ece", "dml_soft", "dice_hard", "better", higher_is_better=False),
               C("test/dice", "dml_hard", "dice_hard", "equal", tol=1e-3,
                 note="DML on hard labels equals soft Dice (same seed, same steps)")), "test/dice",
              notes="Dice is computed against the thresholded (hard) map for every arm. On hard labels the two "
                    "losses agree to float32 rounding on the same inputs, but rounding differences grow over "
                    "training, so same-seed runs end at different models: the equality check compares the seed "
                    "means within the pooled sd (the exact equality of values and gradients is a unit test of "
                    "the losses)."),
        Claim("nbc", "NBC-softmax", T, "stdlib docstring -> code pairs",
              "softmax + NBC >= softmax alone on retrieval metrics",
              ("stdlib_nbc", "stdlib_softmax", "stdlib_zero"), ("test/r@1", "test/r@10", "test/mrr@10", "test/ndcg@10"),
              (C("test/r@1", "stdlib_nbc", "stdlib_softmax", "better"),
               C("test/ndcg@10", "stdlib_nbc", "stdlib_softmax", "better")), "test/r@1"),
        Claim("partial_fc", "Partial FC", R, "ML-100k next-item (1,682 item classes)",
              "sample_rate 0.1 matches full-softmax accuracy at a fraction of time and memory",
              ("pfc_01", "pfc_10", "full_softmax"), ("test/recall@20", "test/ndcg@20", "fit_s_per_epoch", "peak_rss_mb"),
              (C("test/recall@20", "pfc_01", "pfc_10", "not_worse", tol=0.005),
               C("test/recall@20", "pfc_01", "full_softmax", "not_worse", tol=0.005),
               C("fit_s_per_epoch", "pfc_01", "pfc_10", "better", higher_is_better=False)), "test/recall@20",
              notes="`fit_s_per_epoch` is the fit wall time divided by the epochs (the machine was shared, so "
                    "single timings vary by 2-4x); `peak_rss_mb` the peak RSS of the whole run process. At 1,682 classes the "
                    "centres are 0.4 MB, so memory differences are below the process noise; the many-class "
                    "time and memory comparison (up to 1e6 classes) is in the performance benchmark "
                    "(`benchmarks/perf_losses.py --suite partial_fc`)."),
        Claim("decoupled_ml100k", "decoupled softmax", R, "ML-100k users -> all their training items",
              "beats InfoNCE when queries have several positives",
              ("ds_users", "infonce_users"), ("test/recall@20", "test/ndcg@20", "test/hr@10", "test/ndcg@10"),
              (C("test/recall@20", "ds_users", "infonce_users", "better"),
               C("test/ndcg@20", "ds_users", "infonce_users", "better")), "test/recall@20"),
        Claim("decoupled", "decoupled softmax", T, "chatterbot Q -> A (multi-positive), stdlib pairs (one positive)",
              "beats InfoNCE when queries have several positives; equal with one positive",
              ("chat_ds", "chat_infonce", "chat_zero", "stdlib_ds", "stdlib_infonce"),
              ("test/r@1", "test/r@10", "test/mrr@10", "test/ndcg@10"),
              (C("test/r@1", "chat_ds", "chat_infonce", "better"),
               C("test/ndcg@10", "chat_ds", "chat_infonce", "better"),
               C("test/r@1", "stdlib_ds", "stdlib_infonce", "equal", tol=1e-3,
                 note="one positive per query: the two losses coincide")), "test/r@1"),
        Claim("psl", "PSL", R, "ML-100k matrix factorisation",
              "PSL (tanh/atan/relu) >= sampled softmax >= BPR on Recall@20 / NDCG@20",
              ("psl_tanh", "psl_atan", "psl_relu", "ssm", "bpr"), ("test/recall@20", "test/ndcg@20", "test/hr@10"),
              tuple(C(m, p, "ssm", "better") for p in ("psl_tanh", "psl_atan", "psl_relu")
                    for m in ("test/recall@20", "test/ndcg@20"))
              + (C("test/recall@20", "ssm", "bpr", "better"), C("test/ndcg@20", "ssm", "bpr", "better")),
              "test/recall@20",
              notes="Every arm runs its recipe unchanged (10 epochs): PSL and sampled softmax share cosine "
                    "scores, temperature 0.05, score scale 0.5 and a pool of 256 uniformly sampled negatives per "
                    "batch; BPR uses one sampled negative per pair and dot scores."),
    ]


def _runs_for(claims: Sequence[Claim], arms: Dict[str, Arm], extra_arms: Sequence[str] = ()) -> List[Arm]:
    keys: List[str] = []
    for c in claims:
        for k in c.arms:
            if k not in keys:
                keys.append(k)
    for k in extra_arms:
        if k not in keys:
            keys.append(k)
    return [arms[k] for k in keys]


# ------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------
def _code_version() -> str:
    """Commit of HEAD (plus ``-dirty`` when the library / Lightning layer / recipes differ)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "losses", "lightning_modules", "configs"],
                               cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        return (head or "unknown") + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_args(arm: Arm, seed: int, quick: bool) -> List[str]:
    """CLI overrides of one (arm, seed) run; used for both ``fit`` and ``test``."""
    args = [f"--seed_everything={seed}", f"--data.init_args.seed={seed}"]
    if arm.loss_has_seed():
        args.append(f"--model.init_args.loss.init_args.seed={seed}")
    args += list(arm.overrides)
    if quick:
        args += QUICK_ARGS
    else:
        e = max(1, arm.epochs)
        # no validation loop (nothing here reads it; the checkpoint is the end of the last epoch,
        # and PGD robust validation alone costs as much as several training epochs)
        args += [f"--trainer.max_epochs={e}", "--trainer.num_sanity_val_steps=0", "--trainer.limit_val_batches=0"]
    return args


def _run_key(arm: Arm, seed: int, args: Sequence[str]) -> str:
    """Identifies a finished run for resuming: recipe path and parsed content, overrides, fit or not. (Not
    the code version: other work may commit while a long reproduction runs; use ``--fresh``
    after changing the library.)"""
    import yaml

    parsed = yaml.safe_load(arm.recipe_text())  # comments do not count
    blob = json.dumps([arm.recipe, parsed, list(args), arm.fit], sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def execute(arm: Arm, seed: int, *, quick: bool, workdir: str, threads: int, code: str, fresh: bool,
            timeout: float) -> dict:
    args = run_args(arm, seed, quick)
    key = _run_key(arm, seed, args)
    run_dir = os.path.join(workdir, f"{arm.key}__s{seed}__{key}")
    out = os.path.join(run_dir, "result.json")
    if not fresh and os.path.exists(out):
        with open(out) as fh:
            res = json.load(fh)
        if res.get("ok"):
            res["cached"] = True
            return _row(arm, seed, args, res)
    if os.path.isdir(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir, exist_ok=True)
    spec = {"config": os.path.join(ROOT, arm.recipe), "root": os.path.join(run_dir, "logs"),
            "fit_args": args, "test_args": args, "fit": arm.fit,
            "recipe_sha": hashlib.sha1(arm.recipe_text().encode()).hexdigest()[:12]}
    spec_path = os.path.join(run_dir, "spec.json")
    with open(spec_path, "w") as fh:
        json.dump(spec, fh, indent=1)
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                "OPENBLAS_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"})
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    started = _dt.datetime.now().isoformat(timespec="seconds")
    code_at_start = _code_version()  # the working tree this run imports (others may commit meanwhile)
    t0 = time.perf_counter()
    with open(os.path.join(run_dir, "log.txt"), "w") as log:
        try:
            subprocess.run([sys.executable, WORKER, spec_path, out], cwd=ROOT, env=env, stdout=log,
                           stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    wall = time.perf_counter() - t0
    if os.path.exists(out):
        with open(out) as fh:
            res = json.load(fh)
    else:
        res = {"ok": False, "error": f"no result after {wall:.0f} s (timeout {timeout:.0f} s or crash); see "
                                     f"{os.path.join(run_dir, 'log.txt')}"}
    res["process_seconds"] = wall
    res["recipe_sha"] = spec["recipe_sha"]  # the recipe file as this run read it
    res["code"], res["started"] = code_at_start, started
    # keep the result, drop checkpoints and logs of successful runs (disk)
    if res.get("ok"):
        shutil.rmtree(os.path.join(run_dir, "logs"), ignore_errors=True)
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1, sort_keys=True)
    return _row(arm, seed, args, res)


def _row(arm: Arm, seed: int, args: Sequence[str], res: dict) -> dict:
    epochs = int(res.get("epochs", 0)) if arm.fit else 0
    fit_s = float(res.get("fit_seconds", 0.0))
    row = {
        "benchmark": arm.benchmark, "arm": arm.key, "loss": arm.label, "recipe": arm.recipe,
        "recipe_sha": res.get("recipe_sha", ""), "code": res.get("code", ""), "started": res.get("started", ""),
        "seed": seed,
        "epochs": epochs, "overrides": " ".join(arm.overrides), "ok": bool(res.get("ok")),
        "error": (res.get("error") or "")[:300],
        "fit_seconds": round(fit_s, 3), "test_seconds": round(float(res.get("test_seconds", 0.0)), 3),
        "run_seconds": round(float(res.get("wall_seconds", 0.0)), 3),
        "fit_s_per_epoch": round(fit_s / epochs, 4) if epochs else "",
        "peak_rss_mb": round(float(res.get("peak_rss_mb", 0.0)), 1) if res.get("ok") else "",
        "threads": (res.get("versions") or {}).get("threads", ""),
        "data": json.dumps(res.get("data", {}), sort_keys=True),
        "cached": bool(res.get("cached", False)),
        "_versions": res.get("versions", {}),
    }
    for k, v in sorted((res.get("test_metrics") or {}).items()):
        row[k] = v
    return row


def run_all(runs: Sequence[Tuple[Arm, int]], *, jobs: int, threads: int, quick: bool, workdir: str, code: str,
            fresh: bool, timeout: float, log=print) -> List[dict]:
    order = sorted(runs, key=lambda r: (-r[0].cost, r[1]))
    rows: List[dict] = []
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(execute, arm, seed, quick=quick, workdir=workdir, threads=threads, code=code,
                               fresh=fresh, timeout=timeout): (arm, seed) for arm, seed in order}
        for i, fut in enumerate(as_completed(futures), 1):
            arm, seed = futures[fut]
            row = fut.result()
            rows.append(row)
            status = "cached" if row["cached"] else ("ok" if row["ok"] else "FAILED " + row["error"][:200])
            log(f"[{i}/{len(order)} {time.perf_counter() - t0:7.0f}s] {arm.key} seed {seed}: {status} "
                f"({row['run_seconds']:.0f} s)", flush=True)
    key = {(a.key, s): i for i, (a, s) in enumerate(runs)}
    rows.sort(key=lambda r: key[(r["arm"], r["seed"])])
    return rows


# ------------------------------------------------------------------------------------------
# statistics and verdicts
# ------------------------------------------------------------------------------------------
def values(rows: Iterable[dict], arm: str, metric: str) -> List[float]:
    out = []
    for r in rows:
        if r["arm"] == arm and r["ok"]:
            v = r.get(metric, "")
            if v not in ("", None):
                v = float(v)
                if math.isfinite(v):
                    out.append(v)
    return out


def mean_sd(xs: Sequence[float]) -> Tuple[float, float, int]:
    """``(mean, sample sd, n)``; sd is ``nan`` for ``n < 2``, mean ``nan`` for ``n == 0``."""
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan"), 0
    m = statistics.fmean(xs)
    return m, (statistics.stdev(xs) if n > 1 else float("nan")), n


def fmt(m: float, s: float) -> str:
    if not math.isfinite(m):
        return "n/a"
    if not math.isfinite(s):
        return f"{m:.4f}"
    return f"{m:.4f} ± {s:.4f}"


def parse_fmt(cell: str) -> Tuple[float, float]:
    """Inverse of :func:`fmt` (for tests)."""
    cell = cell.strip()
    if cell == "n/a":
        return float("nan"), float("nan")
    if "±" in cell:
        a, b = cell.split("±")
        return float(a), float(b)
    return float(cell), float("nan")


def verdict(check: Check, fam: Sequence[float], base: Sequence[float]) -> Tuple[str, dict]:
    """The verdict of one check and the numbers it was computed from (see the module docstring)."""
    mf, sf, nf = mean_sd(fam)
    info = {"family_mean": mf, "family_sd": sf, "n_family": nf}
    if nf == 0:
        return "no data", info
    if check.kind == "below":
        info["level"] = check.level
        if nf < 2:
            return INCONCLUSIVE_N, info
        if mf + sf < check.level:
            return REPRODUCED, info
        if mf - sf >= check.level:
            return NOT_REPRODUCED, info
        return INCONCLUSIVE, info
    mb, sb, nb = mean_sd(base)
    info.update(baseline_mean=mb, baseline_sd=sb, n_baseline=nb)
    if nb == 0:
        return "no data", info
    sign = 1.0 if check.higher_is_better else -1.0
    d = sign * (mf - mb)
    pooled = math.sqrt((sf ** 2 + sb ** 2) / 2) if nf > 1 and nb > 1 else float("nan")
    info.update(diff=mf - mb, pooled_sd=pooled)
    if check.kind == "better":
        if not math.isfinite(pooled):
            return INCONCLUSIVE_N, info
        if abs(d) <= pooled:
            return INCONCLUSIVE, info
        return (REPRODUCED if d > 0 else NOT_REPRODUCED), info
    thr = max(pooled if math.isfinite(pooled) else 0.0, check.tol)
    info["threshold"] = thr
    if not math.isfinite(pooled) and abs(d) > check.tol:
        return INCONCLUSIVE_N, info
    if check.kind == "not_worse":
        return (REPRODUCED if d >= -thr else NOT_REPRODUCED), info
    if check.kind == "equal":
        return (REPRODUCED if abs(d) <= thr else NOT_REPRODUCED), info
    raise ValueError(f"verdict: unknown check kind {check.kind!r}")


def claim_verdict(verdicts: Sequence[str]) -> str:
    k = sum(v == REPRODUCED for v in verdicts)
    n = len(verdicts)
    if n and k == n:
        return REPRODUCED
    if any(v == NOT_REPRODUCED for v in verdicts):
        return f"{NOT_REPRODUCED} ({k} of {n} checks reproduced)"
    if any(v == INCONCLUSIVE_N for v in verdicts):
        return f"{INCONCLUSIVE_N} ({k} of {n} checks reproduced)"
    return f"{INCONCLUSIVE} ({k} of {n} checks reproduced)"


def _check_text(c: Check, arms: Dict[str, Arm]) -> str:
    m = c.metric.replace("test/", "")
    arrow = "" if c.higher_is_better else " (lower is better)"
    fam = arms[c.family].label
    if c.kind == "below":
        return f"{m} of {fam} < {c.level:g}"
    base = arms[c.baseline].label
    if c.kind == "better":
        return f"{m}: {fam} > {base}{arrow}"
    if c.kind == "not_worse":
        return f"{m}: {fam} >= {base} - max(sd, {c.tol:g}){arrow}"
    return f"{m}: {fam} = {base} within max(sd, {c.tol:g})"


# ------------------------------------------------------------------------------------------
# reports
# ------------------------------------------------------------------------------------------
CSV_FIXED = ["benchmark", "arm", "loss", "recipe", "recipe_sha", "code", "started", "seed", "epochs", "overrides", "ok", "error", "fit_seconds",
             "fit_s_per_epoch", "test_seconds", "run_seconds", "peak_rss_mb", "threads", "cached", "data"]


def write_csv(rows: Sequence[dict], path: str) -> None:
    metrics = sorted({k for r in rows for k in r if k.startswith("test/")})
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIXED + metrics, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in CSV_FIXED + metrics})


def read_csv(path: str) -> List[dict]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        r["ok"] = r["ok"] == "True"
        r["seed"] = int(r["seed"])
    return rows


def _data_lines(rows: Sequence[dict], arms: Dict[str, Arm], keys: Sequence[str]) -> List[str]:
    """One line per distinct data set description (first ok run of each arm)."""
    seen: Dict[str, List[str]] = {}
    for k in keys:
        for r in rows:
            if r["arm"] == k and r["ok"]:
                d = json.loads(r["data"]) if isinstance(r["data"], str) else r["data"]
                d = {a: b for a, b in d.items() if a not in ("sys_version", "stdlib_dir")}
                desc = ", ".join(f"{a}={b}" for a, b in sorted(d.items()))
                seen.setdefault(desc, []).append(arms[k].label)
                break
    return [f"- {', '.join(v)} (seed {min(r['seed'] for r in rows if r['arm'] in keys)}): {k}"
            for k, v in seen.items()]


def _runs_code(rows: Sequence[dict]) -> str:
    """Distinct code versions of ``rows`` and when the runs started."""
    timed = sorted((r["started"], r.get("code") or "unknown") for r in rows if r.get("started"))
    if not timed:
        return ", ".join(sorted({r.get("code") or "unknown" for r in rows}))
    codes = list(dict.fromkeys(c for _, c in timed))
    span = f"runs started {timed[0][0].replace('T', ' ')} to {timed[-1][0].replace('T', ' ')}"
    if len(codes) == 1:
        return f"{codes[0]} ({span})"
    return f"{len(codes)} successive commits, {codes[0]} (first run) to {codes[-1]} (last run) ({span})"


def _versions(rows: Sequence[dict]) -> dict:
    for r in rows:
        if r.get("_versions"):
            return r["_versions"]
    return {}


def write_markdown(benchmark: str, claims: Sequence[Claim], rows: Sequence[dict], arms: Dict[str, Arm],
                   meta: dict, path: str, pngs: Sequence[str], extra_sections: Sequence[str] = ()) -> List[dict]:
    """Write ``<benchmark>.md``; returns the claim summaries (for ``summary.md``)."""
    v = meta.get("versions", {})
    bench_rows = [r for r in rows if r["benchmark"] == benchmark]
    lines = [f"# Reproduced results: {benchmark}", "",
             "Generated by `python benchmarks/reproduce_results.py` "
             f"({meta['mode']}); every number below is computed from `raw_runs.csv`; verdicts are computed "
             "by the script from the numbers (rules in the module docstring of "
             "`benchmarks/reproduce_results.py`).", "",
             f"- command: `{meta['command']}`",
             f"- code: the runs imported the working tree of `main` at {_runs_code(bench_rows)} (git HEAD when each "
             f"run started, per run in `raw_runs.csv`); report generated {meta['date']} at {meta['code']}",
             f"- Python {v.get('python', platform.python_version())}; sys.version: `{v.get('sys_version', sys.version)}`",
             f"- torch {v.get('torch', '?')}, pytorch-lightning {v.get('pytorch_lightning', '?')}; "
             f"{meta['cpus']} CPUs ({meta['cpu']}), {meta['jobs']} run(s) at a time with {meta['threads']} "
             "torch thread(s) each (the machine was shared with other work: wall times are indicative)",
             f"- seeds: {', '.join(str(s) for s in meta['seeds'])} (each seed sets `--seed_everything`, the "
             "DataModule's `seed` -- split, subsampling, label noise, shuffling, negatives -- and a loss's own "
             "`seed` where the recipe has one)",
             "- each run: `fit` for the epochs shown (no validation loop), then `test` from the checkpoint "
             "fit saved (the end of the last epoch); `run s` is the wall time of the whole run process", ""]
    failed = [r for r in bench_rows if not r["ok"]]
    if failed:
        lines += ["**Failed runs** (excluded from the statistics):", ""]
        lines += [f"- {r['arm']} seed {r['seed']}: {r['error']}" for r in failed]
        lines.append("")
    summaries = []
    for c in claims:
        lines += [f"## {c.family}: {c.claim}", "", f"Data: {c.data}.", ""]
        head = ["loss", "recipe", "n", "epochs", *[m.replace("test/", "") for m in c.metrics], "run s"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for k in c.arms:
            a = arms[k]
            n = len([r for r in bench_rows if r["arm"] == k and r["ok"]])
            ep = sorted({int(r["epochs"]) for r in bench_rows if r["arm"] == k and r["ok"]})
            cells = [a.label, f"`{os.path.basename(a.recipe)}`" + (" *" if a.overrides else ""), str(n),
                     "/".join(str(e) for e in ep) or "-"]
            for m in c.metrics:
                mm, ss, _ = mean_sd(values(bench_rows, k, m))
                cells.append(fmt(mm, ss))
            rm, _, _ = mean_sd(values(bench_rows, k, "run_seconds"))
            cells.append(f"{rm:.0f}" if math.isfinite(rm) else "n/a")
            lines.append("| " + " | ".join(cells) + " |")
        over = [arms[k] for k in c.arms if arms[k].overrides]
        if over:
            lines.append("")
            lines += [f"\\* {a.label}: `{' '.join(a.overrides)}`" for a in over]
        zero = [arms[k].label for k in c.arms if not arms[k].fit]
        if zero:
            lines += ["", f"{', '.join(zero)}: `test` of the untrained model (identity towers), a reference."]
        lines += ["", "| check | family | baseline | difference | pooled sd | verdict |", "|---|---|---|---|---|---|"]
        vs, key_numbers = [], []
        for ch in c.checks:
            fam = values(bench_rows, ch.family, ch.metric)
            base = values(bench_rows, ch.baseline, ch.metric) if ch.baseline else []
            vd, info = verdict(ch, fam, base)
            vs.append(vd)
            bcell = fmt(info.get("baseline_mean", float("nan")), info.get("baseline_sd", float("nan"))) \
                if ch.baseline else f"level {ch.level:g}"
            key_numbers.append(f"{ch.metric.replace('test/', '')} {fmt(info['family_mean'], info['family_sd'])} "
                               + (f"vs {bcell}" if ch.baseline else f"(level {ch.level:g})"))
            diff = info.get("diff", float("nan"))
            pooled = info.get("pooled_sd", float("nan"))
            text = _check_text(ch, arms) + (f" ({ch.note})" if ch.note else "")
            lines.append(f"| {text} | {fmt(info['family_mean'], info['family_sd'])} | {bcell} | "
                         f"{diff:+.4f} | {pooled:.4f} | {vd} |".replace("+nan", "n/a").replace("| nan |", "| n/a |"))
        cv = claim_verdict(vs)
        lines += ["", f"**Verdict: {cv}.**", ""]
        if c.notes:
            lines += [c.notes, ""]
        summaries.append({"claim": c, "verdict": cv, "checks": vs, "first": key_numbers[0] if key_numbers else ""})
    lines += ["## Data", ""]
    keys = [k for c in claims for k in c.arms]
    lines += _data_lines(bench_rows, arms, list(dict.fromkeys(keys)))
    lines.append("")
    for sec in extra_sections:
        lines += [sec, ""]
    if pngs:
        lines += ["## Plots", ""]
        lines += [f"![{os.path.splitext(p)[0]}]({p})" for p in pngs]
        lines.append("")
    with open(path, "w") as fh:
        fh.write("\n".join(lines))
    return summaries


def temperature_section(rows: Sequence[dict], arms: Dict[str, Arm]) -> str:
    lines = ["## Reference: InfoNCE temperature on stdlib code search", "",
             "`configs/retrieval/stdlib_infonce.yaml` with `--model.init_args.loss.init_args.temperature` "
             "overridden (docs/benchmarks.md reference: zero-shot R@1 0.526, tau=0.05 0.616, tau=0.5 0.486 on "
             "2,257 train / 1,000 test pairs, Python 3.11).", "",
             "| temperature | n | R@1 | R@10 | nDCG@10 |", "|---|---|---|---|---|"]
    for label, key in [("zero-shot", "stdlib_zero")] + [(f"{t:g}", _temp_key(t)) for t in TEMPERATURES]:
        if key not in arms:
            continue
        cells = [label, str(len(values(rows, key, "test/r@1")))]
        for m in ("test/r@1", "test/r@10", "test/ndcg@10"):
            mm, ss, _ = mean_sd(values(rows, key, m))
            cells.append(fmt(mm, ss))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _temp_key(t: float) -> str:
    return "stdlib_infonce" if t == 0.05 else f"stdlib_infonce_t{t:g}"


# ------------------------------------------------------------------------------------------
# plots
# ------------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(ax, rows, keys, arms, metric, title):
    ms, ss = [], []
    for k in keys:
        m, s, _ = mean_sd(values(rows, k, metric))
        ms.append(m if math.isfinite(m) else 0.0)
        ss.append(s if math.isfinite(s) else 0.0)
    x = range(len(keys))
    ax.bar(x, ms, yerr=ss, capsize=3, color=[f"C{i}" for i in range(len(keys))])
    ax.set_xticks(list(x))
    ax.set_xticklabels([arms[k].label for k in keys], rotation=30, ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(metric.replace("test/", ""), fontsize=8)
    lo = min((m - s for m, s in zip(ms, ss)), default=0.0)
    hi = max((m + s for m, s in zip(ms, ss)), default=1.0)
    if hi > lo:
        pad = 0.15 * (hi - lo) + 1e-3
        ax.set_ylim(max(0.0, lo - pad) if lo > 0 else lo - pad, hi + pad)


def plot_claims(benchmark, claims, rows, arms, path) -> None:
    plt = _plt()
    n = len(claims)
    cols = min(3, n)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.6 * nrows), squeeze=False)
    for ax, c in zip(axes.flat, claims):
        _bars(ax, rows, list(c.arms), arms, c.plot_metric, f"{c.family}: {c.plot_metric.replace('test/', '')}")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(f"{benchmark}: mean ± sd over seeds (test split)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_per_class(rows, arms, keys, path, num_classes=10, tail=(5, 6, 7, 8, 9)) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.8))
    w = 0.8 / max(1, len(keys))
    for i, k in enumerate(keys):
        ms, ss = [], []
        for c in range(num_classes):
            m, s, _ = mean_sd(values(rows, k, f"test/acc_class_{c}"))
            ms.append(m if math.isfinite(m) else 0.0)
            ss.append(s if math.isfinite(s) else 0.0)
        ax.bar([c + (i - (len(keys) - 1) / 2) * w for c in range(num_classes)], ms, w, yerr=ss, capsize=2,
               label=arms[k].label)
    ax.axvspan(min(tail) - 0.5, max(tail) + 0.5, color="0.9", zorder=0)
    ax.text(min(tail) - 0.4, 1.02, "tail classes (fewest training images)", fontsize=8)
    ax.set_xticks(range(num_classes))
    ax.set_xlabel("digit class (training images per class decrease with the class id, IF 50)")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1.1)
    ax.legend(fontsize=7, ncol=3, loc="lower left")
    ax.set_title("digits-LT: per-class test accuracy, mean ± sd over seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_metric(rows, arms, keys, metric, title, path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5, 0.8 * len(keys) + 2), 3.8))
    _bars(ax, rows, keys, arms, metric, title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_temperature(rows, arms, path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ts, ms, ss = [], [], []
    for t in TEMPERATURES:
        k = _temp_key(t)
        if k in arms:
            m, s, _ = mean_sd(values(rows, k, "test/r@1"))
            if math.isfinite(m):
                ts.append(t)
                ms.append(m)
                ss.append(s if math.isfinite(s) else 0.0)
    ax.errorbar(ts, ms, yerr=ss, marker="o", capsize=3, label="InfoNCE (trained towers)")
    z, zs, _ = mean_sd(values(rows, "stdlib_zero", "test/r@1"))
    if math.isfinite(z):
        ax.axhline(z, color="0.5", ls="--", label="zero-shot MiniLM")
    ax.set_xscale("log")
    ax.set_xticks(list(TEMPERATURES))
    ax.set_xticklabels([f"{t:g}" for t in TEMPERATURES])
    ax.minorticks_off()
    ax.set_xlabel("InfoNCE temperature")
    ax.set_ylabel("test R@1")
    ax.set_title("stdlib code search: R@1 vs temperature", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    cpus = os.cpu_count() or 1
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3, help="number of seeds (0..N-1; default 3)")
    p.add_argument("--benchmarks", default=",".join(BENCHMARKS),
                   help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    p.add_argument("--claims", default="", help="comma-separated claim keys (default: all of --benchmarks): "
                   + ",".join(c.key for c in _claims()))
    p.add_argument("--quick", action="store_true",
                   help="1 seed, 1 epoch, 2 train / 1 val / 2 test batches (CI smoke run; numbers meaningless)")
    p.add_argument("--out", default=os.path.join(ROOT, "results"), help="output folder (default results/)")
    p.add_argument("--jobs", type=int, default=cpus, help="runs at once (default: CPU count); each gets "
                   "max(1, cpus // jobs) torch threads")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "losses-reproduce"),
                   help="per-run folders (checkpoints are deleted after test; results are kept for --resume)")
    p.add_argument("--fresh", action="store_true", help="ignore finished runs in --workdir")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per run before it is killed")
    p.add_argument("--no-temperature", action="store_true", help="skip the InfoNCE temperature sweep")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    arms = _arms()
    benches = [b.strip() for b in args.benchmarks.split(",") if b.strip()]
    bad = [b for b in benches if b not in BENCHMARKS]
    if bad:
        raise SystemExit(f"reproduce_results: unknown benchmark(s) {bad}; choose from {BENCHMARKS}")
    claims = [c for c in _claims() if c.benchmark in benches]
    if args.claims:
        want = [c.strip() for c in args.claims.split(",") if c.strip()]
        unknown = [w for w in want if w not in {c.key for c in _claims()}]
        if unknown:
            raise SystemExit(f"reproduce_results: unknown claim(s) {unknown}")
        claims = [c for c in claims if c.key in want]
    if not claims:
        raise SystemExit("reproduce_results: nothing to run (check --benchmarks / --claims)")
    seeds = [0] if args.quick else list(range(max(1, args.seeds)))
    temperature = ("retrieval" in benches and not args.no_temperature and not args.quick
                   and (not args.claims or "decoupled" in args.claims or "nbc" in args.claims))
    extra = [_temp_key(t) for t in TEMPERATURES] + ["stdlib_zero"] if temperature else []
    arm_list = _runs_for(claims, arms, extra)
    runs = [(a, s) for a in arm_list for s in seeds]
    cpus = os.cpu_count() or 1
    jobs = max(1, min(args.jobs, len(runs)))
    threads = max(1, cpus // jobs)
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.workdir, exist_ok=True)
    code = _code_version()
    print(f"reproduce_results: {len(runs)} runs ({len(arm_list)} configurations x {len(seeds)} seeds), "
          f"{jobs} at a time, {threads} thread(s) each; workdir {args.workdir}", flush=True)
    rows = run_all(runs, jobs=jobs, threads=threads, quick=args.quick, workdir=args.workdir, code=code,
                   fresh=args.fresh, timeout=args.timeout)
    wall = time.perf_counter() - t_start
    write_csv(rows, os.path.join(args.out, "raw_runs.csv"))
    meta = {
        "mode": ("quick smoke run: 1 seed, 1 epoch, 2 batches -- the numbers are meaningless" if args.quick
                 else f"{len(seeds)} seeds"),
        "command": "python benchmarks/reproduce_results.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "code": code, "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "versions": _versions(rows),
        "cpus": cpus, "cpu": _cpu_name(), "jobs": jobs, "threads": threads, "seeds": seeds,
    }
    summary: List[dict] = []
    for b in BENCHMARKS:
        bc = [c for c in claims if c.benchmark == b]
        if not bc:
            continue
        pngs = [f"{b}.png"]
        plot_claims(b, bc, rows, arms, os.path.join(args.out, pngs[0]))
        sections = []
        keys_b = list(dict.fromkeys(k for c in bc for k in c.arms))
        if b == "vision" and any(k in keys_b for k in ("gol_lt", "wcdas_lt")):
            lt = [k for k in ("ce_lt", "bce_lt", "gol_lt", "cosine_lt", "wcdas_lt") if k in keys_b]
            plot_per_class(rows, arms, lt, os.path.join(args.out, "vision_lt_per_class.png"))
            pngs.append("vision_lt_per_class.png")
        if b == "recommendation":
            keys = [k for k in ("bpr", "ssm", "psl_tanh", "psl_atan", "psl_relu", "full_softmax", "pfc_01",
                                "pfc_10", "infonce_users", "ds_users") if k in keys_b]
            plot_metric(rows, arms, keys, "test/recall@20", "ML-100k: Recall@20 per loss (mean ± sd)",
                        os.path.join(args.out, "recommendation_recall20.png"))
            pngs.append("recommendation_recall20.png")
        if b == "retrieval":
            keys = [k for k in ("stdlib_zero", "stdlib_softmax", "stdlib_nbc", "stdlib_infonce", "stdlib_ds",
                                "chat_zero", "chat_infonce", "chat_ds") if k in keys_b or k in extra]
            plot_metric(rows, arms, keys, "test/r@1", "code search / chatterbot: R@1 per loss (mean ± sd)",
                        os.path.join(args.out, "retrieval_r1.png"))
            pngs.append("retrieval_r1.png")
            if temperature:
                plot_temperature(rows, arms, os.path.join(args.out, "retrieval_temperature.png"))
                pngs.append("retrieval_temperature.png")
                sections.append(temperature_section(rows, arms))
        summary += write_markdown(b, bc, rows, arms, meta, os.path.join(args.out, f"{b}.md"), pngs, sections)
    run_total = sum(float(r["run_seconds"] or 0.0) for r in rows)
    reused = sum(bool(r["cached"]) for r in rows)
    lines = ["# Reproduced claims: summary", "",
             f"`{meta['command']}` ({meta['mode']}; code {code}; {meta['date']}). {len(runs)} runs "
             f"({len(arm_list)} configurations x {len(seeds)} seeds), {jobs} at a time: {run_total / 60:.0f} min "
             f"of run time in all (sum over runs); this invocation took {wall / 60:.1f} min and reused {reused} "
             "finished runs from `--workdir`. Details, numbers and plots: one file per benchmark.", "",
             "| family | data | claim | first check (mean ± sd, family vs baseline) | verdict | details |",
             "|---|---|---|---|---|---|"]
    for s in summary:
        c = s["claim"]
        lines.append(f"| {c.family} | {c.data} | {c.claim} | {s['first']} | {s['verdict']} | "
                     f"[{c.benchmark}.md]({c.benchmark}.md) |")
    lines.append("")
    with open(os.path.join(args.out, "summary.md"), "w") as fh:
        fh.write("\n".join(lines))
    n_fail = sum(not r["ok"] for r in rows)
    print(f"reproduce_results: wrote {args.out} in {wall / 60:.1f} min; {n_fail} failed run(s)", flush=True)
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
