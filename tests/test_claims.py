"""``benchmarks/claims.yaml``: every claim declares a direction or a margin, a tuning grid with an equal
budget per arm (the clean arms of its did checks included) that tunes the learning rate, enough seeds
and one step budget; every recipe it names exists and parses through the CLI with the arm's overrides;
the validator rejects broken files."""

from __future__ import annotations

import copy
import dataclasses
import os
import sys

import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # as benchmarks/reproduce_results.py puts it there
import reproduce as rp  # noqa: E402  (the reproduction package: rp.claims, rp.runs, rp.tuning, ...)
import reproduce.cli  # noqa: E402,F401  (the command line imports every step's module)

CF = rp.claims.load_claims()


def test_claims_file_is_valid():
    assert rp.claims.validate_claims(CF) == []


def test_every_vision_and_segmentation_family_is_claimed():
    families = {c.family for c in CF.claims}
    assert {"Z-loss", "sparsemax loss", "comp-sum (tau)", "smooth adversarial comp-sum", "OPL", "GOL", "WCDAS",
            "Dice semimetric"} <= families
    assert {"vision", "segmentation"} <= {c.benchmark for c in CF.claims}


def test_every_recommendation_and_retrieval_family_is_claimed():
    claimed = {(c.family, c.benchmark) for c in CF.claims}
    assert {("PSL", "recommendation"), ("GOL", "recommendation"), ("Z-loss", "recommendation"),
            ("Partial FC", "recommendation"), ("decoupled softmax", "recommendation"),
            ("decoupled softmax", "retrieval"), ("soft top-k", "retrieval"), ("NBC-softmax", "retrieval")} <= claimed
    keys = {c.key: c for c in CF.claims}
    # PSL: plain, popularity shift (the same runs, debiased test metrics) and false negatives
    assert keys["psl_popularity_shift"].arms == keys["psl"].arms
    for k in keys["psl_false_negatives"].arms:
        assert dict(CF.arms[k].overrides)["data.init_args.false_negatives"] > 0
    for k in keys["psl"].arms + keys["gol_items"].arms + keys["z_loss_topk"].arms:
        assert dict(CF.arms[k].overrides)["data.init_args.split"] == "random"
    for k in ("psl_tanh_rs", "ssm_rs", "psl_tanh_fn"):  # the temperature is tuned for every PSL / SSM arm
        assert "model.init_args.loss.init_args.temperature" in dict(CF.arms[k].grid)
    # one positive per query: the two losses are the same function -- an equivalence with a declared
    # margin, read as a sanity check (never counted as a reproduction)
    assert {(ch.kind, ch.rule_kind()) for ch in keys["decoupled_softmax_stdlib"].checks} == {("sanity", "equivalent")}
    assert "train/softmax_classes" in keys["partial_fc_ml100k"].metrics


def test_every_check_has_a_direction_margin_or_level_and_every_arm_a_grid():
    for c in CF.claims:
        assert c.seeds >= 5, c.key
        arms = [CF.arms[k] for k in c.arms]
        assert len({a.epochs for a in arms}) == 1, c.key  # one step budget
        # one tuning budget for every arm the claim runs, the clean arms of its did checks included
        assert len({len(CF.arms[k].grid_points()) for k in c.run_arms()}) == 1, c.key
        for a in arms:
            assert len(a.grid_points()) >= 2 and a.select.startswith("val/") and os.path.isfile(os.path.join(ROOT, a.recipe))
            if a.seconds < 60 and all(CF.arms[k].seconds < 60 for k in c.arms):
                assert c.seeds >= 10, c.key
        for ch in c.checks:
            kind = ch.rule_kind()  # a sanity check is read with its rule
            if ch.kind == "did":
                assert ch.baseline in c.arms and ch.margin is None and set(ch.clean_arms()) <= set(CF.arms)
            elif kind in ("higher", "lower"):
                assert ch.baseline in c.arms and ch.margin is None
            elif kind in ("equivalent", "not_worse"):
                assert ch.baseline in c.arms and ch.margin > 0
            else:
                assert kind in ("below", "above") and ch.level is not None
    assert min(CF.tuning_seeds) >= 100  # tuning seeds never coincide with evaluation seeds 0 .. n-1


def test_revision_3_every_arm_tunes_the_learning_rate():
    """Every grid point of every arm sets a learning rate; an arm tuning a knob of its own tunes it
    as a product with the learning rate (or, as WCDAS's explicit points, every knob setting at each
    learning rate)."""
    for a in CF.arms.values():
        assert a.untuned_lr_points() == [], a.key
        keys = [k for k, _ in a.grid]
        if len(keys) > 1:
            assert keys[0].split(".")[-1] in rp.claims.LR_KEYS and len(a.grid_points()) == \
                len(dict(a.grid)[keys[0]]) * len(dict(a.grid)[keys[1]]), a.key
    for key in ("wcdas_lt", "wcdas_lt_2s"):
        pts = CF.arms[key].grid_points()
        lrs = sorted({p["model.init_args.lr"] for p in pts})
        scales = [p.get("model.init_args.loss.init_args.scale") for p in pts]
        assert len(lrs) == 3 and len(pts) == 9 and scales == [None, 16.0, 32.0] * 3, key
    # the arms that tuned only their knob before revision 3 now tune it at three learning rates
    for key, knob in (("z_loss", "a"), ("comp_sum_noisy", "tau"), ("opl_lowdata", "aux_weight"),
                      ("cosine_lt", "scale"), ("psl_tanh_rs", "temperature"), ("ssm_fn", "temperature"),
                      ("nbc_stdlib", "nbc_weight"), ("pfc_10", "scale"), ("infonce_chat", "temperature")):
        grid = {k.split(".")[-1]: v for k, v in CF.arms[key].grid}
        assert len(grid["lr"]) == 3 and len(grid[knob]) >= 3, key


def test_long_tail_arms_run_single_and_two_stage():
    lt = {k: a for k, a in CF.arms.items() if "imbalance_factor" in str(a.recipe_config().get("data"))}
    single = {a.recipe for a in lt.values() if "model.init_args.two_stage_epoch" not in dict(a.overrides)}
    two = {a.recipe for a in lt.values() if "model.init_args.two_stage_epoch" in dict(a.overrides)}
    # CE, BCE, GOL, cosine softmax, WCDAS, logit-adjusted CE, balanced softmax, each in both protocols
    assert len(single) == 7 and single == two
    for a in lt.values():
        if "model.init_args.two_stage_epoch" in dict(a.overrides):
            assert 0 < dict(a.overrides)["model.init_args.two_stage_epoch"] < a.epochs
    wcdas = CF.arms["wcdas_lt"]
    scales = [p.get("model.init_args.loss.init_args.scale") for p in wcdas.grid_points()]
    assert None in scales and any(s is not None for s in scales)  # a scale that can move, and fixed ones
    assert "scale" not in wcdas.recipe_config()["model"]["init_args"]["loss"]["init_args"]  # trainable by default
    assert wcdas.recipe_config()["model"]["init_args"]["param_lrs"]["loss.scale_logit"] > 0


def test_long_tail_claims_compare_with_logit_adjustment_and_balanced_softmax():
    """The MNIST-LT claims gain the logit-adjusted loss and balanced softmax as baselines, in secondary
    checks; their recipes are cross-entropy's but for the loss (the prior is linked from the DataModule)."""
    import yaml

    keys = {c.key: c for c in CF.claims}
    primary = {"gol": ("test/acc_tail", "bce_lt"), "gol_2stage": ("test/acc_tail", "bce_lt_2s"),
               "wcdas": ("test/balanced_acc", "ce_lt"), "wcdas_2stage": ("test/balanced_acc", "ce_lt_2s")}
    for key, (metric, baseline) in primary.items():
        c = keys[key]
        sfx = "_2s" if key.endswith("2stage") else ""
        assert {f"la_lt{sfx}", f"bsm_lt{sfx}"} <= set(c.arms), key
        assert (c.primary().metric, c.primary().baseline) == (metric, baseline), key  # unchanged
        new = [ch for ch in c.checks if ch.baseline in (f"la_lt{sfx}", f"bsm_lt{sfx}")]
        assert len(new) == 2 and all(not ch.primary and ch.kind == "higher" and ch.family == c.primary().family
                                     and ch.metric == metric for ch in new), key
        arms = [CF.arms[k] for k in c.arms]
        assert len({(a.epochs, a.seconds, a.select, len(a.grid_points())) for a in arms}) == 1, key
        assert len({tuple(a.overrides) for a in arms}) == 1, key
    ce = yaml.safe_load(open(os.path.join(ROOT, "configs/mnist/cross_entropy_lt.yaml")))
    for recipe, loss in (("configs/mnist/logit_adjusted_lt.yaml", "losses.LogitAdjustedLoss"),
                         ("configs/mnist/balanced_softmax_lt.yaml", "losses.BalancedSoftmaxLoss")):
        cfg = yaml.safe_load(open(os.path.join(ROOT, recipe)))
        assert cfg["model"]["init_args"].pop("loss")["class_path"] == loss
        base = copy.deepcopy(ce)
        base["model"]["init_args"].pop("loss")
        assert cfg == base, recipe  # backbone, budget, data and schedule: cross-entropy's


def test_long_tail_baselines_link_the_class_prior_from_the_data():
    """The logit-adjusted loss's class_prior and balanced softmax's class_counts come from the
    DataModule's training split (MNIST-LT: 350 ... 7), through the CLI."""
    import torch
    from lightning_modules.cli import main

    for key, buf in (("la_lt", "class_prior"), ("bsm_lt_2s", "class_counts")):
        a = CF.arms[key]
        args = rp.runs.run_args(a, 0, a.grid_points()[0], phase="tune", quick=True)
        cli = main(args=["--config", os.path.join(ROOT, a.recipe), *args, "--trainer.logger=false",
                         "--trainer.enable_checkpointing=false"], run=False)
        counts = torch.as_tensor(list(cli.datamodule.class_counts), dtype=torch.float64)
        got = getattr(cli.model.loss, buf).to(torch.float64)
        want = counts / counts.sum() if buf == "class_prior" else counts
        assert counts[0] == 350 and counts[-1] == 7 and torch.allclose(got, want), key


def test_validator_rejects_broken_claims():
    c = CF.claims[0]
    ch = c.checks[0]
    bad_checks = (dataclasses.replace(ch, kind="equivalent", margin=None),
                  dataclasses.replace(ch, kind="sideways"),
                  dataclasses.replace(ch, kind="higher", baseline=ch.family))
    broken = dataclasses.replace(c, checks=bad_checks, seeds=3)
    arms = dict(CF.arms)
    a0 = arms[c.arms[0]]
    arms[c.arms[0]] = dataclasses.replace(a0, grid=a0.grid + (("model.init_args.weight_decay", (0.0, 1e-4)),),
                                          recipe="configs/mnist/missing.yaml", select="test/top1")
    cf = dataclasses.replace(CF, claims=(broken,), arms=arms)
    text = "\n".join(rp.claims.validate_claims(cf))
    for fragment in ("needs a positive margin declared up front", "kind 'sideways'", "must be another arm",
                     "seeds", "unequal tuning budgets", "does not exist", "validation metric"):
        assert fragment in text, fragment
    unknown = dataclasses.replace(c, arms=("no_such_arm",) + c.arms[1:])
    assert "not declared under arms" in "\n".join(rp.claims.validate_claims(dataclasses.replace(CF, claims=(unknown,))))


def test_validator_requires_every_arm_to_tune_the_learning_rate():
    """Revision 3: an arm whose grid tunes only its knob (at the recipe's learning rate), or an explicit
    points grid with a point that sets no learning rate, is reported; revision 2 did not require it."""
    arms = dict(CF.arms)
    z = arms["z_loss"]
    arms["z_loss"] = dataclasses.replace(z, grid=(("model.init_args.loss.init_args.a", (0.5, 1.0, 2.0)),))
    w = arms["wcdas_lt"]
    arms["wcdas_lt"] = dataclasses.replace(w, points=((),) + w.points[1:])  # {}: the recipe's lr
    # a learning rate by its other name passes
    arms["ce"] = dataclasses.replace(arms["ce"], grid=(("model.init_args.optimizer.learning_rate", (0.1, 0.2)),))
    problems = rp.claims.validate_claims(dataclasses.replace(CF, arms=arms))
    text = "\n".join(problems)
    assert "arm 'z_loss': revision 3 tunes the learning rate of every arm, but its grid tunes no learning rate" in text
    assert "arm 'wcdas_lt': revision 3 tunes the learning rate of every arm, but 1 of its 9 grid points set none" in text
    assert not any(p.startswith("arm 'ce':") for p in problems)
    old = dataclasses.replace(CF, arms=arms, revision=2)
    assert "tunes the learning rate" not in "\n".join(rp.claims.validate_claims(old))


def test_validator_requires_equal_budgets_over_the_clean_arms_of_did_checks():
    """The equal-budget rule covers every arm a claim runs: a did check's clean arms (possibly another
    claim's) must have the claim's grid size too."""
    c = next(c for c in CF.claims if c.key == "comp_sum")
    assert set(c.run_arms()) - set(c.arms) == {"comp_sum_clean", "ce"}
    arms = dict(CF.arms)
    clean = arms["comp_sum_clean"]
    arms["comp_sum_clean"] = dataclasses.replace(clean, grid=clean.grid[:1])  # 3 learning rates, not 3 x 3
    problems = [p for p in rp.claims.validate_claims(dataclasses.replace(CF, arms=arms))
                if "unequal tuning budgets" in p]
    assert len(problems) == 1 and problems[0].startswith("claim 'comp_sum': unequal tuning budgets")
    assert "'comp_sum_clean': 3" in problems[0] and "'ce_noisy': 9" in problems[0]


def test_run_args_pair_the_arms():
    ce, z = CF.arms["ce"], CF.arms["z_loss"]
    a = rp.runs.run_args(ce, 3, {"model.init_args.lr": 0.005}, phase="eval", quick=False)
    b = rp.runs.run_args(z, 3, {"model.init_args.loss.init_args.a": 2.0}, phase="eval", quick=False)
    # revision 3 (the file's evaluation section): one test split for every seed, a validation pass per
    # epoch in evaluation runs (the learning curve)
    shared = ["--seed_everything=3", "--data.init_args.seed=3", "--data.init_args.test_seed=7",
              "--model.init_args.init_seed=3", "--trainer.max_epochs=10", "--trainer.check_val_every_n_epoch=1"]
    for arg in shared:
        assert arg in a and arg in b
    assert "--trainer.limit_val_batches=0" not in a
    # read as revision 2 made its runs: a test split per seed, no validation in evaluation runs
    old = rp.claims.without_evaluation(CF).arms["ce"]
    c = rp.runs.run_args(old, 3, {"model.init_args.lr": 0.005}, phase="eval", quick=False)
    assert "--trainer.limit_val_batches=0" in c and not any("test_seed" in x for x in c)
    # MovieLens, retrieval and the synthetic identities take it too; a DataModule without test_seed (the
    # language model's, whose test files are fixed by a hash of their path) gets no such argument
    for name, has in (("MovieLens", True), ("Retrieval", True), ("Identities", True), ("LanguageModel", False)):
        arm = next(x for x in CF.arms.values() if name in x.recipe_config()["data"]["class_path"])
        assert ("--data.init_args.test_seed=7" in rp.runs.run_args(arm, 0, {}, phase="eval", quick=False)) == has, name
    assert "--model.init_args.lr=0.005" in a and "--model.init_args.loss.init_args.a=2.0" in b
    # the OOD sets are scored by evaluation runs of MNIST arms only: tuning runs keep their arguments
    ood = "--data.init_args.ood=digits8x8,uniform_noise"
    assert ood in a and ood in b and c.count(ood) == 0
    assert ood not in rp.runs.run_args(ce, 1000, {"model.init_args.lr": 0.005}, phase="tune", quick=False)
    for name in ("MovieLens", "Retrieval", "Identities", "LanguageModel", "Segmentation"):
        arm = next(x for x in CF.arms.values() if name in x.recipe_config()["data"]["class_path"])
        args = rp.runs.run_args(arm, 0, {}, phase="eval", quick=False)
        assert not any(x.startswith("--data.init_args.ood") for x in args)
    bad = dataclasses.replace(CF, evaluation={**CF.evaluation, "ood": ""})
    assert any(p.startswith("evaluation.ood must be") for p in rp.claims.validate_claims(bad))
    t = rp.runs.run_args(CF.arms["wcdas_lt_2s"], 1000, CF.arms["wcdas_lt_2s"].grid_points()[1], phase="tune",
                         quick=False)
    assert "--model.init_args.two_stage_epoch=15" in t and "--model.init_args.loss.init_args.scale=16.0" in t
    assert "--trainer.check_val_every_n_epoch=20" in t and "--trainer.limit_val_batches=0" not in t
    adv = rp.runs.run_args(CF.arms["adv_eps01"], 2, {}, phase="eval", quick=False)
    assert "--model.init_args.loss.init_args.seed=2" in adv  # the attack's own seed follows the run's


@pytest.mark.slow
def test_every_arm_parses_through_the_cli():
    """Each distinct (recipe, overrides, last grid point) instantiates through LightningCLI. The
    first through the entry point (``main``); the others re-use that CLI's parser (built from the
    signatures, the same for every recipe: ~0.2 s each of 70) and run its parse and instantiation
    steps, the ones ``main`` runs."""
    from lightning_modules.cli import main

    seen = set()
    cli = None
    for a in CF.arms.values():
        point = a.grid_points()[-1]  # the last point: a fixed WCDAS scale, the largest learning rates
        args = rp.runs.run_args(a, 0, point, phase="eval", quick=True)
        key = (a.recipe, tuple(args))
        if key in seen:
            continue
        seen.add(key)
        full = ["--config", os.path.join(ROOT, a.recipe), *args, "--trainer.logger=false",
                "--trainer.enable_checkpointing=false"]
        if cli is None:
            cli = main(args=full, run=False)
        else:
            cli.parse_arguments(cli.parser, full)
            cli.before_instantiate_classes()
            cli.instantiate_classes()
        for k, v in point.items():
            if k.startswith("model.init_args.loss.init_args."):
                name = k.rsplit(".", 1)[-1]
                got = getattr(cli.model.loss, name, None)
                if name == "scale" and hasattr(cli.model.loss, "effective_scale"):
                    got = None if cli.model.loss.scale_logit is not None else float(cli.model.loss.scale)
                assert got == v, (a.key, k, got)
        if "model.init_args.two_stage_epoch" in dict(a.overrides):
            assert cli.model.two_stage_epoch == dict(a.overrides)["model.init_args.two_stage_epoch"]
        if a.recipe_config()["model"]["class_path"].endswith(rp.runs.INIT_SEED_MODELS):
            assert cli.model.hparams.init_seed == 0
    assert len(seen) >= 16


def test_identical_runs_of_two_arms_share_one_key():
    """ce and ce_robust (revision 2's adversarial baseline) differ only in their selection metric: a
    shared setting is one run, not two."""
    r2 = rp.claims.load_claims(os.path.join(ROOT, "results", "revision2", "claims.yaml"))
    ce, ce_r = r2.arms["ce"], r2.arms["ce_robust"]
    p = ce.grid_points()[1]
    a, b = rp.runs.Run(ce, 0, "eval", tuple(p.items())), rp.runs.Run(ce_r, 0, "eval", tuple(p.items()))
    assert rp.running._run_key(a, a.args(False)) == rp.running._run_key(b, b.args(False))
    c = rp.runs.Run(ce, 0, "tune", tuple(p.items()))
    assert rp.running._run_key(a, a.args(False)) != rp.running._run_key(c, c.args(False))


# ------------------------------------------------------------------------------------------------
# protocol revision 3
# ------------------------------------------------------------------------------------------------
def test_revision_3_every_claim_has_one_primary_check_and_floors():
    assert CF.revision == 3
    for c in CF.claims:
        assert sum(ch.primary for ch in c.checks) == 1, c.key
        assert c.primary() is not None and c.floors, c.key
        for metric, floor in c.floors:
            assert metric in c.metrics and (isinstance(floor, (int, float)) or floor.startswith("test/")), c.key
    keys = {c.key: c for c in CF.claims}
    # the paper's main claim decides: top-k ranking for Z-loss, balanced accuracy for WCDAS, tail accuracy
    # against the paper's baseline (BCE) for GOL
    assert keys["z_loss"].primary().metric == "test/top5"
    assert keys["wcdas"].primary().metric == "test/balanced_acc"
    assert keys["gol"].primary().baseline == "bce_lt"


def test_revision_3_check_kinds_in_the_claims_file():
    keys = {c.key: c for c in CF.claims}
    sanity = {(c.key, ch.metric) for c in CF.claims for ch in c.checks if ch.kind == "sanity"}
    # identities and by-construction levels: never counted as reproductions
    assert {("sparsemax", "test/support"), ("dice", "test/dice"), ("decoupled_softmax_stdlib", "test/r@1")} <= sanity
    assert keys["decoupled_softmax_stdlib"].primary().kind == "sanity"
    # ">=" claims are non-inferiority checks with a margin
    for key in ("nbc_softmax", "psl", "opl", "dice"):
        assert keys[key].primary().kind == "not_worse" and keys[key].primary().margin > 0, key
    # robustness claims: difference in differences, primary
    did = {c.key: c.primary() for c in CF.claims if c.primary().kind == "did"}
    assert set(did) == {"comp_sum", "psl_popularity_shift", "psl_false_negatives", "logz_penalty_lm_high_lr"}
    assert did["psl_popularity_shift"].clean_metric == "test/recall@20"
    assert (did["psl_false_negatives"].clean_family, did["psl_false_negatives"].clean_baseline) == ("psl_tanh_rs", "ssm_rs")
    assert keys["comp_sum"].run_arms() == ("comp_sum_noisy", "ce_noisy", "comp_sum_clean", "ce")
    assert dict(CF.arms["comp_sum_clean"].overrides)["data.init_args.noise_rate"] == 0.0
    # OPL's objective is |mean inter-class cosine| -> 0: the check compares absolute values
    inter = next(ch for ch in keys["opl"].checks if ch.metric == "test/cos_inter")
    assert inter.transform == "abs" and inter.kind == "lower"


def test_language_model_claims():
    """The LM claims: log-Z penalty (perplexity non-inferiority; stability at high learning rates as
    a difference in differences against the normal-rate pair), Z-loss (top-k at vocabulary 8,192),
    1.5-entmax (top-1 non-inferiority, support reported); every arm tunes the learning rate over an
    equal grid; the floors are the unigram reference's columns of the same runs."""
    keys = {c.key: c for c in CF.claims if c.benchmark == "language_model"}
    assert set(keys) == {"logz_penalty_lm", "logz_penalty_lm_high_lr", "z_loss_lm", "entmax15_lm"}
    prim = {k: c.primary() for k, c in keys.items()}
    assert (prim["logz_penalty_lm"].kind, prim["logz_penalty_lm"].better) == ("not_worse", "lower")
    assert prim["logz_penalty_lm"].metric == "test/nll" and prim["logz_penalty_lm"].margin > 0
    hi = prim["logz_penalty_lm_high_lr"]
    assert (hi.kind, hi.better, hi.clean_family, hi.clean_baseline) == ("did", "lower", "logz_lm", "ce_lm")
    assert (prim["z_loss_lm"].metric, prim["z_loss_lm"].kind) == ("test/top5", "higher")
    assert (prim["entmax15_lm"].metric, prim["entmax15_lm"].kind) == ("test/top1", "not_worse")
    assert {"test/support", "test/zero_prob"} <= set(keys["entmax15_lm"].metrics)
    grids = {}
    for c in keys.values():
        for a in c.run_arms():
            arm = CF.arms[a]
            assert [k for k, _ in arm.grid] == ["model.init_args.lr"] and len(arm.grid_points()) == 3, a
            assert arm.recipe.startswith("configs/language_model/claims/"), a
            grids[a] = dict(arm.grid)["model.init_args.lr"]
        for metric, floor in c.floors:
            assert floor == metric.replace("test/", "test/unigram_") and floor in c.metrics, (c.key, metric)
    # the stressed arms' learning rates all lie above the normal grid
    assert min(grids["ce_lm_hi"]) > max(grids["ce_lm"]) and grids["logz_lm_hi"] == grids["ce_lm_hi"]


def test_revision_2_claims_file_is_frozen_beside_its_runs():
    old = rp.claims.load_claims(os.path.join(ROOT, "results", "revision2", "claims.yaml"))
    assert old.revision == 2 and rp.claims.validate_claims(old) == []
    assert old.evaluation == {} and all(a.test_seed is None and not a.curves and a.ood is None for a in old.arms.values())
    assert not any(ch.primary or ch.kind in ("did", "sanity") for c in old.claims for ch in c.checks)


def test_validator_rejects_broken_revision_3_claims():
    c = next(c for c in CF.claims if c.key == "opl")
    ch = c.checks[0]
    none = dataclasses.replace(c, checks=tuple(dataclasses.replace(x, primary=False) for x in c.checks), floors=())
    two = dataclasses.replace(c, checks=tuple(dataclasses.replace(x, primary=True) for x in c.checks),
                              floors=(("test/top1", "val/top1"), ("test/nope", 0.1)))
    bad_checks = (dataclasses.replace(ch, kind="sanity", rule=None),
                  dataclasses.replace(ch, kind="did", margin=None),  # no clean side
                  dataclasses.replace(ch, kind="did", margin=None, clean_family="no_such_arm"),
                  dataclasses.replace(ch, transform="square"),
                  dataclasses.replace(ch, effect=-0.01))
    bad = dataclasses.replace(c, checks=bad_checks)
    text = "\n".join(rp.claims.validate_claims(dataclasses.replace(CF, claims=(none, two, bad))))
    for fragment in ("exactly one check must be primary: true (the one that states the paper's main claim; got 0)",
                     "got 3)", "declare floors", "must be a number or a test/ column", "floor metric 'test/nope'",
                     "a sanity check needs a rule", "needs a clean side that differs", "clean arm 'no_such_arm'",
                     "transform 'square'", "effect (the paper's reported effect) must be a positive number"):
        assert fragment in text, fragment


def test_validator_requires_the_revision_3_evaluation_section():
    for ev, fragment in (({}, "revision 3 declares test_seed"), ({"test_seed": 1.5, "curves": True}, "must be an integer"),
                         ({"test_seed": 7, "curves": "yes"}, "curves must be true or false"),
                         ({"test_seed": 7, "curves": True, "tests": 1}, "unknown key(s) ['tests']")):
        assert fragment in "\n".join(rp.claims.validate_claims(dataclasses.replace(CF, evaluation=ev))), fragment
    assert CF.evaluation == {"test_seed": 7, "curves": True, "ood": "digits8x8,uniform_noise"}
    assert rp.claims.validate_claims(CF) == []


def test_revision_4_claims_file_is_valid_and_runs_the_papers_update():
    """``benchmarks/claims_revision4.yaml``: the claims re-declared under revision 4 validate; every claim
    declares its deviations from the paper's setup, and the Partial FC arms train their centres with
    the sampled-centre update (only the sampled centres move), checked by a manipulation check that
    negatives were sampled at all."""
    cf = rp.claims.load_claims(os.path.join(ROOT, "benchmarks", "claims_revision4.yaml"))
    assert cf.revision == 4 and rp.claims.validate_claims(cf) == []
    assert len(cf.tuning_seeds) >= 3
    for c in cf.claims:
        assert c.fidelity, c.key
        prim = c.primary()
        if prim.kind in ("not_worse", "equivalent"):
            assert prim.relative_margin is not None and prim.margin is None, c.key
    pfc = next(c for c in cf.claims if c.key == "pfc_cosface_r4")
    for k in pfc.arms:
        assert dict(cf.arms[k].overrides)["model.init_args.loss.init_args.sparse_grad"] is True, k
    assert {(m.arm, m.metric, m.op, m.level) for m in pfc.manipulation} == {
        ("cos4_pfc01", "train/positive_share", "<", 1), ("cos4_pfc03", "train/positive_share", "<", 1)}
    # 100,000 identities: on one GPU, with the sampled update, the full softmax's runs declared longest
    # (the queue starts them first: the gate); the arguments parse through the CLI (on a machine
    # without CUDA the trainer is not built: the command line refuses such runs there)
    big = next(c for c in cf.claims if c.key == "pfc_cosface_c1e5_r4")
    assert {(m.arm, m.metric, m.op, m.level) for m in big.manipulation} == {("c1e5_pfc01", "train/positive_share", "<", 1)}
    assert cf.arms["c1e5_pfc10"].seconds > cf.arms["c1e5_pfc01"].seconds
    from lightning_modules.cli import main

    cli = None
    for k in big.arms:
        arm = cf.arms[k]
        assert dict(arm.overrides)["model.init_args.loss.init_args.sparse_grad"] is True, k
        args = rp.runs.run_args(arm, 0, arm.grid_points()[-1], phase="eval", quick=False)
        assert rp.running.needs_gpu(args), k
        full = ["--config", os.path.join(ROOT, arm.recipe), *args]
        if cli is None:
            cli = main(args=["--config", os.path.join(ROOT, arm.recipe), "--trainer.logger=false"], run=False)
        cfg = cli.parser.parse_args(full)
        assert cfg.trainer.accelerator == "gpu" and cfg.model.init_args.loss.init_args.sparse_grad is True, k
