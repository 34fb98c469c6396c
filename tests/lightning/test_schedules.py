"""Learning-rate schedules through the real CLI: the language-model recipes warm up and decay per
optimiser step (``lightning_modules.optim.WarmupCosine``), ``--lr_scheduler`` alone drives the
module's own optimiser, ``--optimizer`` with ``--lr_scheduler`` steps per optimiser step too, and a
module with a schedule of its own says why it cannot take another."""

from __future__ import annotations

import math
import os

import pytest
import torch

from lightning_modules.optim import WarmupCosine

from .test_language_model import ROOT, SMALL, cache  # noqa: F401  (the token-cache fixture)

pytestmark = pytest.mark.slow

TRAINER = ["--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false",
           "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1", "--trainer.max_epochs=1"]
TINY_LM = ["--model.init_args.embedding_dim=16", "--model.init_args.num_layers=1", "--model.init_args.num_heads=2"]


def _lm_args(cache_dir, root, steps):
    data = [f"--data.init_args.{k}={v}" for k, v in {**SMALL, "max_tokens": 8192, "max_eval_tokens": 256,
                                                      "cache_dir": cache_dir}.items()]
    return ["fit", "--config", os.path.join(ROOT, "configs/language_model/cross_entropy.yaml"),
            f"--trainer.default_root_dir={root}", f"--trainer.limit_train_batches={steps}",
            "--trainer.val_check_interval=1.0", *data, *TINY_LM, *TRAINER]


def test_warmup_cosine_by_hand():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2.0)
    sched = WarmupCosine(opt, warmup_steps=2, total_steps=6, min_lr_ratio=0.25)
    seen = []
    for _ in range(8):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    cos = [0.25 + 0.75 * 0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(5)]
    assert seen == pytest.approx([2.0 * f for f in [0.5, 1.0, *cos, 0.25]])
    late = WarmupCosine(torch.optim.SGD([p], lr=1.0), warmup_fraction=0.25)
    late.set_total_steps(8)  # the trainer's count, before the first step: the warmup's first rate
    assert late.warmup_steps == 2 and late.optimizer.param_groups[0]["lr"] == 0.5
    for bad, match in (({"warmup_steps": 3, "total_steps": 3}, "total_steps must exceed the warmup"),
                       ({"warmup_fraction": 1.0}, "warmup_fraction must be in"),
                       ({"min_lr_ratio": 2.0}, "min_lr_ratio must be in"),
                       ({"warmup_steps": 1, "warmup_fraction": 0.1}, "not both")):
        with pytest.raises(ValueError, match=match):
            WarmupCosine(torch.optim.SGD([p], lr=1.0), **bad)


def test_language_model_recipe_warms_up_and_decays_per_step(tmp_path, cache):  # noqa: F811
    from lightning_modules.cli import main

    cli = main(args=_lm_args(cache, tmp_path, 20))
    (config,) = cli.trainer.lr_scheduler_configs
    sched = config.scheduler
    assert isinstance(sched, WarmupCosine) and config.interval == "step"
    assert cli.trainer.global_step == 20 and sched.last_epoch == 20  # stepped once per optimiser step
    assert sched.total_steps == 20 and sched.warmup_steps == 1  # 5% of the run's 20 steps
    base = sched.base_lrs[0]
    assert base == pytest.approx(1e-3)  # the recipe's rate
    # the module's own optimiser (AdamW), driven to 10% of the rate at the end of the run
    assert isinstance(sched.optimizer, torch.optim.AdamW)
    assert sched.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * base)


def test_lr_scheduler_alone_and_with_an_optimizer_step_per_step(tmp_path, cache):  # noqa: F811
    from lightning_modules.cli import main

    args = [a for a in _lm_args(cache, tmp_path / "a", 6)]
    cli = main(args=args + ["--lr_scheduler=torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size=2",
                            "--lr_scheduler.gamma=0.5"])
    (config,) = cli.trainer.lr_scheduler_configs
    assert isinstance(config.scheduler, torch.optim.lr_scheduler.StepLR) and config.interval == "step"
    assert isinstance(config.scheduler.optimizer, torch.optim.AdamW)  # the module's own optimiser
    assert config.scheduler.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.5 ** 3)  # 6 steps
    cli = main(args=_lm_args(cache, tmp_path / "b", 6) + [
        "--optimizer=torch.optim.SGD", "--optimizer.lr=0.1", "--lr_scheduler=torch.optim.lr_scheduler.StepLR",
        "--lr_scheduler.step_size=3", "--lr_scheduler.gamma=0.1"])
    (config,) = cli.trainer.lr_scheduler_configs
    assert isinstance(config.scheduler.optimizer, torch.optim.SGD) and config.interval == "step"
    assert config.scheduler.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.1 ** 2)


def test_a_module_with_its_own_schedule_refuses_a_second_one(tmp_path, capsys):
    from lightning_modules.cli import main

    args = ["fit", "--config", os.path.join(ROOT, "configs/mnist/cross_entropy.yaml"),
            f"--trainer.default_root_dir={tmp_path}", "--trainer.limit_train_batches=1", *TRAINER,
            "--lr_scheduler=torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size=2"]
    with pytest.raises(SystemExit) as exit_info:
        main(args=args)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert ("VisionClassifier: --lr_scheduler needs the module's optimiser alone, but its configure_optimizers "
            "returns dict (it sets a schedule of its own: set its lr_schedule to 'constant'") in err, err
