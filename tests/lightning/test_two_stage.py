"""The fair-protocol options of ``VisionClassifier``: two-stage long-tail training (frozen features,
class-balanced sampling, head reset and retrained), the same initial weights across losses
(``init_seed``), the per-stage cosine schedule, parameter-group learning rates and the logged WCDAS
scale / concentrations. Real (tiny) fits on MNIST-5k-LT with a small timm backbone."""

from __future__ import annotations

import math

import pytest
import pytorch_lightning as pl
import torch

import losses
from lightning_modules.data import MNISTDataModule
from lightning_modules.models import VisionClassifier

BACKBONE = "test_resnet"


def _trainer(epochs, batches, callbacks=()):
    return pl.Trainer(max_epochs=epochs, limit_train_batches=batches, limit_val_batches=0, num_sanity_val_steps=0,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", devices=1, callbacks=list(callbacks))


def _model(loss=None, **kw):
    kw.setdefault("lr", 2e-3)
    return VisionClassifier(loss=loss or losses.CrossEntropyLoss(), backbone=BACKBONE, num_classes=10,
                            embedding_dim=16, robust_eval=False, **kw)


class Recorder(pl.Callback):
    def __init__(self):
        self.labels = {}
        self.lrs = []
        self.snap = {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.labels.setdefault(trainer.current_epoch, []).append(batch[1].clone())
        self.lrs.append([g["lr"] for g in trainer.optimizers[0].param_groups])
        if batch_idx == 0:
            self.snap[trainer.current_epoch] = {k: v.detach().clone() for k, v in module.state_dict().items()}

    def on_train_epoch_end(self, trainer, module):
        self.snap[f"end{trainer.current_epoch}"] = {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.fixture(scope="module")
def two_stage_run():
    pl.seed_everything(0)
    dm = MNISTDataModule(imbalance_factor=50.0, batch_size=48, seed=0)
    model = _model(two_stage_epoch=2, lr_schedule="cosine", stage2_lr=1e-2, init_seed=0)
    rec = Recorder()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _trainer(4, 5, [rec]).fit(model, datamodule=dm)
    return dm, model, rec, init


def test_stage2_freezes_features_and_resets_head(two_stage_run):
    dm, model, rec, init = two_stage_run
    end1, start2, final = rec.snap["end1"], rec.snap[2], model.state_dict()
    body = [k for k in final if k.startswith(("net.backbone.", "net.projection."))]
    head = [k for k in final if k.startswith("net.head.")]
    assert body and head
    # stage 1 trained the features; stage 2 left them (and the batch-norm statistics) untouched
    assert any(not torch.equal(init[k], end1[k]) for k in body if init[k].is_floating_point())
    for k in body:
        assert torch.equal(end1[k], final[k]), k
    # the head restarts from its initial values at stage 2, then trains
    for k in head:
        assert torch.equal(start2[k], init[k]), k
        assert not torch.equal(final[k], init[k]), k
    assert all(not p.requires_grad for p in model.net.backbone.parameters())
    assert all(p.requires_grad for p in model.net.head.parameters())
    assert not model.net.backbone.training  # eval mode: batch-norm statistics frozen


def test_stage2_samples_class_balanced(two_stage_run):
    dm, _, rec, _ = two_stage_run
    counts = dm.class_counts.double()
    natural_tail = float(counts[5:].sum() / counts.sum())  # 97 / 975 ~ 0.10
    stage1 = torch.cat(rec.labels[0] + rec.labels[1])
    stage2 = torch.cat(rec.labels[2] + rec.labels[3])
    tail1 = float((stage1 >= 5).double().mean())
    tail2 = float((stage2 >= 5).double().mean())
    # 480 draws each; balanced: p(tail) = 0.5 (sd 0.023); natural ~0.10 (sd 0.014)
    assert abs(tail1 - natural_tail) < 0.08, (tail1, natural_tail)
    assert abs(tail2 - 0.5) < 0.1, tail2
    assert dm.class_balanced_sampling


def test_cosine_schedule_restarts_at_stage2(two_stage_run):
    _, _, rec, _ = two_stage_run
    lrs = [g[0] for g in rec.lrs]
    assert len(lrs) == 20  # 4 epochs x 5 batches
    # stage 1: 10 steps from 2e-3; stage 2: 10 steps from 1e-2 (hand formula)
    ref = [2e-3 * 0.5 * (1 + math.cos(math.pi * t / 10)) for t in range(10)]
    ref += [1e-2 * 0.5 * (1 + math.cos(math.pi * t / 10)) for t in range(10)]
    assert lrs == pytest.approx(ref, rel=1e-9, abs=1e-15)


def test_init_seed_gives_every_loss_the_same_start():
    torch.manual_seed(1)
    a = _model(losses.CrossEntropyLoss(), init_seed=7)
    torch.rand(1000)  # a loss or anything else drawing from the global RNG in between
    b = _model(losses.BCEWithLogitsLoss(), init_seed=7)
    sa, sb = a.net.state_dict(), b.net.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    c = _model(losses.CrossEntropyLoss(), init_seed=8)
    assert not all(torch.equal(sa[k], c.net.state_dict()[k]) for k in sa)
    g = torch.random.get_rng_state()
    _model(init_seed=9)
    assert torch.equal(g, torch.random.get_rng_state())  # the global RNG is left as it was


def test_wcdas_scale_group_and_logged_scale_rho():
    pl.seed_everything(0)
    dm = MNISTDataModule(imbalance_factor=50.0, batch_size=32, seed=0)
    loss = losses.WCDASLoss(embedding_dim=16, num_classes=10)
    model = _model(loss, param_lrs={"loss.scale_logit": 0.5}, two_stage_epoch=1, init_seed=0)
    rec = Recorder()
    t = _trainer(2, 3, [rec])
    t.fit(model, datamodule=dm)
    groups = t.optimizers[0].param_groups
    by_name = {g["name"]: g for g in groups}
    assert by_name["loss.scale_logit"]["lr"] == 0.5 and by_name["default"]["lr"] == 2e-3
    assert [id(p) for p in by_name["loss.scale_logit"]["params"]] == [id(loss.scale_logit)]
    # stage 2 of a head-owning loss: every loss parameter restarts from its initial value
    assert float(rec.snap[1]["loss.scale_logit"]) == 0.0
    assert float(loss.scale_logit.detach()) != 0.0  # and the scale moved in stage 2
    res = t.test(model, datamodule=dm, verbose=False)[0]
    s = 1.0 + torch.nn.functional.softplus(loss.scale_logit.detach())
    assert res["test/loss_scale"] == pytest.approx(float(s), rel=1e-6)
    rho = torch.sigmoid(loss.concentration_logit.detach().clamp(max=losses.embedding.wcdas.G_MAX))
    assert res["test/loss_rho_mean"] == pytest.approx(float(rho.mean()), rel=1e-6)
    assert res["test/loss_rho_9"] == pytest.approx(float(rho[9]), rel=1e-6)
    assert "test/acc_class_9" in res and "test/acc_tail" in res


def test_bad_options():
    with pytest.raises(ValueError, match="lr_schedule"):
        _model(lr_schedule="step")
    with pytest.raises(ValueError, match="two_stage_epoch"):
        _model(two_stage_epoch=0)
