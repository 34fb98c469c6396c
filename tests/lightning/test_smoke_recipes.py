"""Every registered loss trains through the real LightningCLI from a recipe generated out of its
registry record (``lightning_modules.recipes.smoke_config``), so a newly registered loss is covered
without a hand-written YAML. All entries run in this one process: ``fit`` with
``--trainer.fast_dev_run=true`` (one training and one validation batch) on 16-pixel digits with a
tiny backbone, or on MovieLens-100k for scores / pairs losses.
"""

from __future__ import annotations

import math

import pytest
import torch
import yaml

import losses
from lightning_modules.cli import main
from lightning_modules.recipes import LINKED_LOSS_ARGS, class_path, smoke_config

NAMES = sorted(s.name for s in losses.list_losses())


def _run(cfg: dict, tmp_path, extra=()):
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return main(args=["fit", "--config", str(path), "--trainer.fast_dev_run=true",
                      f"--trainer.default_root_dir={tmp_path}", *extra])


@pytest.mark.slow  # about 100 s for the 26 entries on 2 CPU cores
@pytest.mark.parametrize("name", NAMES)
def test_generated_smoke_recipe_trains_through_the_cli(name, tmp_path):
    spec = losses.get_loss_spec(name)
    cfg = smoke_config(name)
    init = cfg["model"]["init_args"]
    own = init["aux_loss"] if "aux_loss" in init else init["loss"]
    assert own["class_path"] == class_path(spec.module)
    assert not set(own.get("init_args", {})) & set(LINKED_LOSS_ARGS)  # linked by the CLI, never written
    cli = _run(cfg, tmp_path)
    model = cli.model
    assert isinstance(model.aux_loss if "aux_loss" in init else model.loss, spec.module)
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if torch.is_tensor(v) and v.numel() == 1}
    assert math.isfinite(metrics["train/loss"]), metrics
    assert any(k.startswith("val/") for k in metrics), metrics  # the evaluation ran as well


def test_smoke_config_unknown_name_and_printing(capsys):
    from lightning_modules.recipes import main as recipes_main

    with pytest.raises(ValueError, match="unknown loss name"):
        smoke_config("no_such_loss")
    assert recipes_main(["cross_entropy"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg == smoke_config("cross_entropy")
    assert recipes_main(["no_such_loss"]) == 2
