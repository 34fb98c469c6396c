"""Every recommendation / retrieval recipe runs through the real CLI: fit (1 epoch, 2 batches),
then validate and test from the checkpoint that fit saved (docs/conventions.md, CI sizing); plus the
checkpoint round trip through ``load_from_checkpoint`` for recipes whose loss owns parameters.

Recipes run unchanged except for the CI shortening of ``run_recipe``, no sanity-check pass and,
for recommendation, batch sizes of 256 (training) and 64 (evaluation).
The stdlib recipes run on a fixed 120-query subset of their pairs (``max_queries``), in training
batches of 40 (2 batches of the 80 training queries). The retrieval
recipes share the test session's embedding cache (``tests/conftest.py`` points
``$LOSSES_CACHE_DIR`` at a temporary folder), which the first of them fills.
"""

from __future__ import annotations

import glob
import importlib
import math
import os
import sys

import pytest
import pytorch_lightning as pl
import torch
import yaml

from tests.lightning.recipe_utils import assert_same_state, run_recipe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = sorted(
    os.path.relpath(p, ROOT)
    for d in ("recommendation", "retrieval")
    for p in glob.glob(os.path.join(ROOT, "configs", d, "*.yaml"))
)
METRICS = {
    "recommendation": {"recall@20", "ndcg@20", "hr@10", "ndcg@10"},
    "retrieval": {"r@1", "r@10", "mrr@10", "ndcg@10"},
}
EXTRA = ["--trainer.num_sanity_val_steps=0"]


def _extra_metrics(recipe: str, stage: str) -> set:
    """The recipe's declared ``extra_metrics``; a ``debiased_`` view exists in test batches only."""
    names = set((_config(recipe)["model"]["init_args"].get("extra_metrics") or []))
    return names if stage == "test" else {n for n in names if not n.startswith("debiased_")}


#: the stdlib recipes run on a fixed subset of the pairs (the full set is 5,472 pairs, 10,944 texts
#: to encode once with MiniLM, minutes on 2 cores; these 120 queries' texts, seconds); the recipe itself
#: is unchanged but for the batch size, so that the 80 training queries still make 2 batches
STDLIB_SUBSET = {"max_queries": 120, "val_size": 20, "test_size": 20, "batch_size": 40}


def _data_overrides(recipe: str) -> dict:
    # recommendation: smaller batches, so that the 2 evaluation batches rank 128 users, not 512
    if "recommendation" in recipe:
        return {"batch_size": 256, "eval_batch_size": 64}
    return dict(STDLIB_SUBSET) if "/stdlib_" in recipe else {}


def _extra(recipe: str) -> list:
    return [*EXTRA, *(f"--data.init_args.{k}={v}" for k, v in _data_overrides(recipe).items())]

pytestmark = pytest.mark.slow


def _config(recipe: str) -> dict:
    with open(os.path.join(ROOT, recipe)) as fh:
        return yaml.safe_load(fh)


def _import(path: str):
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


_CACHE: dict = {}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    def get(recipe: str) -> dict:
        if recipe not in _CACHE:
            tmp = tmp_path_factory.mktemp(os.path.splitext(os.path.basename(recipe))[0])
            _CACHE[recipe] = run_recipe(os.path.join(ROOT, recipe), tmp, extra=_extra(recipe))
        return _CACHE[recipe]

    return get


def test_every_loss_family_of_these_benchmarks_has_a_recipe():
    losses_used = {_config(r)["model"]["init_args"]["loss"]["class_path"] for r in RECIPES}
    assert {"losses.PSLLoss", "losses.SampledSoftmaxLoss", "losses.BPRLoss", "losses.CrossEntropyLoss",
            "losses.PartialFCLoss", "losses.DecoupledSoftmaxLoss", "losses.InfoNCELoss", "losses.SoftTopKLoss",
            "losses.NBCSoftmaxLoss", "losses.LinearCrossEntropyLoss", "losses.GumbelBCELoss",
            "losses.BCEWithLogitsLoss", "losses.ZLoss"} <= losses_used
    activations = {_config(r)["model"]["init_args"]["loss"].get("init_args", {}).get("activation") for r in RECIPES}
    assert {"tanh", "atan", "relu"} <= activations


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_fit_then_validate_and_test_from_checkpoint(recipe, results):
    out = results(recipe)
    names = METRICS[recipe.split(os.sep)[1]]
    assert math.isfinite(out["fit"]["train/loss"])
    assert {k for k in out["validate"] if k.startswith("val/")} == {
        f"val/{n}" for n in names | _extra_metrics(recipe, "val")}
    assert {k for k in out["test"] if k.startswith("test/")} == {
        f"test/{n}" for n in names | _extra_metrics(recipe, "test")}
    for stage in ("validate", "test"):
        for k, v in out[stage].items():
            assert 0.0 <= v <= 1.0, (k, v)
    # validate restores the checkpoint written after fit's validation: the same weights, the same numbers
    for n in names | _extra_metrics(recipe, "val"):
        assert out["validate"][f"val/{n}"] == pytest.approx(out["fit"][f"val/{n}"], abs=1e-6)
    # the data set's counts (and sys.version) are logged with the run
    with open(os.path.join(os.path.dirname(os.path.dirname(out["ckpt"])), "hparams.yaml")) as fh:
        logged = yaml.safe_load(fh)
    key = "data/users" if "recommendation" in recipe else "data/pairs"
    assert logged[key] > 0 and isinstance(logged["data/dataset"], str)
    if "retrieval" in recipe:
        assert logged["data/sys_version"] == sys.version


@pytest.mark.parametrize("recipe", ["configs/recommendation/partial_fc.yaml",
                                    "configs/retrieval/stdlib_nbc_softmax.yaml",
                                    "configs/recommendation/psl_tanh.yaml"])
def test_checkpoint_round_trip_rebuilds_loss_and_metrics(recipe, results):
    out = results(recipe)
    cfg = _config(recipe)
    model_cls = _import(cfg["model"]["class_path"])
    loss_cfg = cfg["model"]["init_args"]["loss"]
    model = model_cls.load_from_checkpoint(out["ckpt"])
    assert type(model.loss) is _import(loss_cfg["class_path"])
    for key, value in (loss_cfg.get("init_args") or {}).items():
        got = getattr(model.loss, key)
        assert (list(got) if isinstance(got, tuple) else got) == value, key
    state = torch.load(out["ckpt"], map_location="cpu", weights_only=False)["state_dict"]
    own = model.state_dict()
    assert set(own) == set(state)
    for key in state:
        assert_same_state(own[key], state[key], key)
    if model.route.owns_head:
        assert any(k.startswith("loss.") for k in state)  # the loss-owned head is in the checkpoint
    data_cls = _import(cfg["data"]["class_path"])
    dm = data_cls(**{**cfg["data"]["init_args"], **_data_overrides(recipe)})
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=2)
    res = trainer.validate(model, datamodule=dm, verbose=False)[0]
    assert res == pytest.approx({k: v for k, v in out["validate"].items() if k.startswith("val/")}, abs=1e-6)


@pytest.mark.parametrize("recipe", ["configs/recommendation/partial_fc.yaml",
                                    "configs/retrieval/chatterbot_decoupled_softmax.yaml"])
def test_print_config_fed_back_reproduces_the_run(recipe, results, tmp_path, capsys):
    from lightning_modules.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", os.path.join(ROOT, recipe), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "class_path: " in printed and "embedding_dim" in printed
    config = tmp_path / "printed.yaml"
    config.write_text(printed)
    again = run_recipe(str(config), tmp_path / "run", extra=_extra(recipe))
    first = results(recipe)
    for stage in ("fit", "validate", "test"):
        assert again[stage] == pytest.approx(first[stage], abs=1e-6), stage
