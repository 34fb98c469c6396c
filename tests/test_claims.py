"""``benchmarks/claims.yaml``: every claim declares a direction or a margin, a tuning grid with an equal
budget per arm, enough seeds and one step budget; every recipe it names exists and parses through
the CLI with the arm's overrides; the validator rejects broken files."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module():
    spec = importlib.util.spec_from_file_location("reproduce_results", os.path.join(ROOT, "benchmarks",
                                                                                   "reproduce_results.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


rr = _module()
CF = rr.load_claims()


def test_claims_file_is_valid():
    assert rr.validate_claims(CF) == []


def test_every_vision_and_segmentation_family_is_claimed():
    families = {c.family for c in CF.claims}
    assert {"Z-loss", "sparsemax loss", "comp-sum (tau)", "smooth adversarial comp-sum", "OPL", "GOL", "WCDAS",
            "Dice semimetric"} <= families
    assert {"vision", "segmentation"} <= {c.benchmark for c in CF.claims}  # and the many-class benchmark


def test_every_check_has_a_direction_margin_or_level_and_every_arm_a_grid():
    for c in CF.claims:
        assert c.seeds >= 5, c.key
        arms = [CF.arms[k] for k in c.arms]
        assert len({a.epochs for a in arms}) == 1, c.key  # one step budget
        assert len({len(a.grid_points()) for a in arms}) == 1, c.key  # one tuning budget
        for a in arms:
            assert len(a.grid_points()) >= 2 and a.select.startswith("val/") and os.path.isfile(os.path.join(ROOT, a.recipe))
            if a.seconds < 60 and all(CF.arms[k].seconds < 60 for k in c.arms):
                assert c.seeds >= 10, c.key
        for ch in c.checks:
            if ch.kind in ("higher", "lower"):
                assert ch.baseline in c.arms and ch.margin is None
            elif ch.kind in ("equivalent", "not_worse"):
                assert ch.baseline in c.arms and ch.margin > 0
            else:
                assert ch.kind in ("below", "above") and ch.level is not None
    assert min(CF.tuning_seeds) >= 100  # tuning seeds never coincide with evaluation seeds 0 .. n-1


def test_long_tail_arms_run_single_and_two_stage():
    lt = {k: a for k, a in CF.arms.items() if "imbalance_factor" in str(a.recipe_config().get("data"))}
    single = {a.recipe for a in lt.values() if "model.init_args.two_stage_epoch" not in dict(a.overrides)}
    two = {a.recipe for a in lt.values() if "model.init_args.two_stage_epoch" in dict(a.overrides)}
    assert len(single) == 5 and single == two  # CE, BCE, GOL, cosine softmax, WCDAS, each in both protocols
    for a in lt.values():
        if "model.init_args.two_stage_epoch" in dict(a.overrides):
            assert 0 < dict(a.overrides)["model.init_args.two_stage_epoch"] < a.epochs
    wcdas = CF.arms["wcdas_lt"]
    scales = [p.get("model.init_args.loss.init_args.scale") for p in wcdas.grid_points()]
    assert None in scales and any(s is not None for s in scales)  # a scale that can move, and fixed ones
    assert "scale" not in wcdas.recipe_config()["model"]["init_args"]["loss"]["init_args"]  # trainable by default
    assert wcdas.recipe_config()["model"]["init_args"]["param_lrs"]["loss.scale_logit"] > 0


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
    text = "\n".join(rr.validate_claims(cf))
    for fragment in ("needs a positive margin declared up front", "kind 'sideways'", "must be another arm",
                     "seeds", "unequal tuning budgets", "does not exist", "validation metric"):
        assert fragment in text, fragment
    unknown = dataclasses.replace(c, arms=("no_such_arm",) + c.arms[1:])
    assert "not declared under arms" in "\n".join(rr.validate_claims(dataclasses.replace(CF, claims=(unknown,))))


def test_run_args_pair_the_arms():
    ce, z = CF.arms["ce"], CF.arms["z_loss"]
    a = rr.run_args(ce, 3, {"model.init_args.lr": 0.005}, phase="eval", quick=False)
    b = rr.run_args(z, 3, {"model.init_args.loss.init_args.a": 2.0}, phase="eval", quick=False)
    shared = ["--seed_everything=3", "--data.init_args.seed=3", "--model.init_args.init_seed=3",
              "--trainer.max_epochs=10", "--trainer.limit_val_batches=0"]
    for arg in shared:
        assert arg in a and arg in b
    assert "--model.init_args.lr=0.005" in a and "--model.init_args.loss.init_args.a=2.0" in b
    t = rr.run_args(CF.arms["wcdas_lt_2s"], 1000, CF.arms["wcdas_lt_2s"].grid_points()[1], phase="tune",
                    quick=False)
    assert "--model.init_args.two_stage_epoch=15" in t and "--model.init_args.loss.init_args.scale=16.0" in t
    assert "--trainer.check_val_every_n_epoch=20" in t and "--trainer.limit_val_batches=0" not in t
    adv = rr.run_args(CF.arms["adv"], 2, {}, phase="eval", quick=False)
    assert "--model.init_args.loss.init_args.seed=2" in adv  # the attack's own seed follows the run's


def test_every_arm_parses_through_the_cli():
    """Each distinct (recipe, overrides, last grid point) instantiates through LightningCLI."""
    from lightning_modules.cli import main

    seen = set()
    for a in CF.arms.values():
        point = a.grid_points()[-1]  # the last point: a fixed WCDAS scale, the largest learning rates
        args = rr.run_args(a, 0, point, phase="eval", quick=True)
        key = (a.recipe, tuple(args))
        if key in seen:
            continue
        seen.add(key)
        cli = main(args=["--config", os.path.join(ROOT, a.recipe), *args, "--trainer.logger=false",
                         "--trainer.enable_checkpointing=false"], run=False)
        for k, v in point.items():
            if k.startswith("model.init_args.loss.init_args."):
                name = k.rsplit(".", 1)[-1]
                got = getattr(cli.model.loss, name, None)
                if name == "scale" and hasattr(cli.model.loss, "effective_scale"):
                    got = None if cli.model.loss.scale_logit is not None else float(cli.model.loss.scale)
                assert got == v, (a.key, k, got)
        if "model.init_args.two_stage_epoch" in dict(a.overrides):
            assert cli.model.two_stage_epoch == dict(a.overrides)["model.init_args.two_stage_epoch"]
        assert cli.model.hparams.init_seed == 0
    assert len(seen) >= 16


def test_identical_runs_of_two_arms_share_one_key():
    """ce and ce_robust differ only in their selection metric: a shared setting is one run, not two."""
    ce, ce_r = CF.arms["ce"], CF.arms["ce_robust"]
    p = ce.grid_points()[1]
    a, b = rr.Run(ce, 0, "eval", tuple(p.items())), rr.Run(ce_r, 0, "eval", tuple(p.items()))
    assert rr._run_key(a, a.args(False)) == rr._run_key(b, b.args(False))
    c = rr.Run(ce, 0, "tune", tuple(p.items()))
    assert rr._run_key(a, a.args(False)) != rr._run_key(c, c.args(False))
