"""The CLI on the vision recipes: --print_config round trip, stacked --config files, size links."""

from __future__ import annotations

import os

import pytest
import yaml

from lightning_modules.cli import main
from tests.lightning.recipe_utils import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CFG = lambda *p: os.path.join(ROOT, "configs", *p)  # noqa: E731
FAST = ["--data.init_args.batch_size=4", "--trainer.num_sanity_val_steps=0"]


def _print_config(capsys, args) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(args=args)
    assert info.value.code in (0, None)
    return capsys.readouterr().out


@pytest.mark.slow
def test_print_config_fed_back_reproduces_the_run(tmp_path, capsys):
    recipe = CFG("vision", "opl_lowdata.yaml")  # main + auxiliary loss: nested class_path entries
    printed = _print_config(capsys, ["fit", "--config", recipe, "--model.init_args.robust_eval=false", "--print_config"])
    cfg = yaml.safe_load(printed)
    assert cfg["model"]["init_args"]["loss"]["class_path"] == "losses.CrossEntropyLoss"
    assert cfg["model"]["init_args"]["aux_loss"]["init_args"]["gamma"] == 0.5
    path = tmp_path / "printed.yaml"
    path.write_text(printed)
    a = run_cli("fit", recipe, tmp_path / "a", [*FAST, "--model.init_args.robust_eval=false"])
    b = run_cli("fit", str(path), tmp_path / "b", FAST)
    ma = {k: float(v) for k, v in a.trainer.callback_metrics.items()}
    mb = {k: float(v) for k, v in b.trainer.callback_metrics.items()}
    assert ma.keys() == mb.keys() and {"val/loss", "val/top1", "train/aux_loss_epoch"} <= set(ma)
    assert ma == mb  # same seed, same config, deterministic CPU run
    # and printing the printed config gives the same config again
    assert _print_config(capsys, ["fit", "--config", str(path), "--print_config"]) == printed


def test_sizes_are_linked_into_model_and_loss():
    cli = main(["--config", CFG("vision", "wcdas_lt.yaml"), "--model.init_args.embedding_dim=32"], run=False)
    model, dm = cli.model, cli.datamodule
    assert (model.hparams.num_classes, model.hparams.in_chans) == (dm.num_classes, dm.in_chans) == (10, 1)
    assert (model.loss.num_classes, model.loss.embedding_dim) == (10, 32)
    assert model.loss.weight.shape == (10, 32)
    assert model.net.head is None and model.net.projection.out_features == 32
    cli = main(["--config", CFG("segmentation", "dice_semimetric_soft.yaml")], run=False)
    assert cli.model.num_classes == cli.datamodule.num_classes == 11
    assert cli.model.head.out_channels == 11


def test_stacked_configs_override_the_loss(tmp_path):
    override = tmp_path / "zloss.yaml"
    override.write_text(
        "model:\n  init_args:\n    loss:\n      class_path: losses.ZLoss\n      init_args:\n        a: 2.0\n"
        "data:\n  init_args:\n    noise_rate: 0.2\n"
    )
    cli = main(["--config", CFG("vision", "cross_entropy.yaml"), "--config", str(override)], run=False)
    assert type(cli.model.loss).__name__ == "ZLoss" and cli.model.loss.a == 2.0
    assert cli.datamodule.noise_rate == 0.2 and cli.datamodule.batch_size == 64
    assert cli.trainer.max_epochs == 10  # from the first file


def test_a_named_subcommand_builds_only_its_parser_and_help_still_lists_all(capsys, monkeypatch):
    """``fit ...`` builds the fit parser alone (the other three were never read: ~0.4 s of every
    start); ``--help`` without a subcommand builds and lists all four, as Lightning does."""
    from pytorch_lightning.cli import LightningCLI

    built = []
    original = LightningCLI._prepare_subcommand_parser

    def spy(self, klass, subcommand, **kwargs):
        built.append(subcommand)
        return original(self, klass, subcommand, **kwargs)

    monkeypatch.setattr(LightningCLI, "_prepare_subcommand_parser", spy)
    fit_help = _print_config(capsys, ["fit", "--help"])
    assert built == ["fit"] and "--trainer.max_epochs" in fit_help and "--ckpt_path" in fit_help
    built.clear()
    top_help = _print_config(capsys, ["--help"])
    assert built == ["fit", "validate", "test", "predict"]
    assert all(name in top_help for name in built)
    built.clear()
    printed = yaml.safe_load(_print_config(capsys, ["test", "--config", CFG("mnist", "z_loss.yaml"), "--print_config"]))
    assert built == ["test"] and printed["model"]["init_args"]["loss"]["class_path"] == "losses.ZLoss"
