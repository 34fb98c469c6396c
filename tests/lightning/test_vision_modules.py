"""VisionClassifier / VisionSegmenter routing and the metric helpers, on a tiny timm backbone
(``test_resnet``) so the checks stay fast; the real recipes run in test_vision_recipes.py."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn

import losses
from lightning_modules.data import DigitsDataModule, DigitsSegmentationDataModule
from lightning_modules.metrics import (
    BalancedAccuracy,
    FeatureCosine,
    PerClassAccuracy,
    pgd_attack,
    predictive_probabilities,
    sparsemax_support_size,
)
from lightning_modules.models import VisionClassifier, VisionSegmenter

TINY = dict(backbone="test_resnet", num_classes=10, embedding_dim=16, robust_eval=False)


def _batch(n=6, seed=0, soft=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    if soft:
        q = torch.rand(n, 10, generator=g)
        return x, q / q.sum(1, keepdim=True)
    return x, y


def _model(loss, **kw):
    torch.manual_seed(0)
    return VisionClassifier(loss, **{**TINY, **kw}).eval()


def _trainer(**kw):
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, **kw)


# ---------------------------------------------------------------------------------------------
# routing
# ---------------------------------------------------------------------------------------------
def test_logits_loss_gets_head_logits():
    model = _model(losses.CrossEntropyLoss())
    x, y = _batch()
    main, aux, feats, logits = model._losses(x, y)
    assert aux is None and feats.shape == (6, 16) and logits.shape == (6, 10)
    torch.testing.assert_close(logits, model.net.head(model.net.backbone(x) @ model.net.projection.weight.T
                                                      + model.net.projection.bias))
    torch.testing.assert_close(main, F.cross_entropy(logits, y))
    torch.testing.assert_close(model(x), logits)
    assert model.hparams["loss"] is model.loss  # saved, not ignored


def test_soft_targets_reach_logits_loss_as_given():
    model = _model(losses.CrossEntropyLoss())
    x, q = _batch(soft=True)
    main, _, _, logits = model._losses(x, q)
    torch.testing.assert_close(main, -(q * F.log_softmax(logits, 1)).sum(1).mean())


def test_head_owning_loss_gets_features_and_supplies_logits():
    loss = losses.WCDASLoss(16, 10)
    model = _model(loss)
    assert model.net.head is None  # the loss owns the classifier
    x, y = _batch()
    main, _, feats, logits = model._losses(x, y)
    torch.testing.assert_close(feats, model.net.features(x))
    torch.testing.assert_close(main, loss(feats, y))
    torch.testing.assert_close(logits, loss.logits(feats))
    torch.testing.assert_close(model(x), loss.logits(model.net.features(x)))
    # embedding losses receive class ids: soft targets are reduced to their argmax
    _, q = _batch(soft=True)
    main_soft, _, _, _ = model._losses(x, q)
    torch.testing.assert_close(main_soft, loss(feats, q.argmax(1)))


def test_model_aware_loss_gets_model_mapping_images_to_logits():
    # docs/losses/adversarial_comp_sum.md test fact: nu = 0, rho = 1 equals comp_sum_loss, i.e. CE at tau = 1, on the
    # logits of the model the loss was handed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", losses.ExperimentalWarning)
        loss = losses.AdversarialCompSumLoss(nu=0.0, tau=1.0, steps=1, seed=0)
    model = _model(loss)
    x, y = _batch()
    main, _, feats, logits = model._losses(x, y)
    torch.testing.assert_close(main, F.cross_entropy(model.net(x), y))
    torch.testing.assert_close(logits, model.net(x))
    assert not model.training  # the loss restored the mode it found


def test_auxiliary_feature_loss_is_added_with_its_weight():
    model = _model(losses.CrossEntropyLoss(), aux_loss=losses.OrthogonalProjectionLoss(gamma=0.5), aux_weight=0.3)
    x, y = _batch(n=12)
    main, aux, feats, logits = model._losses(x, y)
    torch.testing.assert_close(main, F.cross_entropy(logits, y))
    torch.testing.assert_close(aux, losses.opl_loss(feats, y, gamma=0.5))
    total = model._log_losses("train", main, aux, 12)  # no trainer attached: logging is a no-op
    torch.testing.assert_close(total, main + 0.3 * aux)
    (g_aux,) = torch.autograd.grad(aux, model.net.projection.weight, retain_graph=True)
    assert g_aux.abs().sum() > 0  # the auxiliary loss trains the features


@pytest.mark.parametrize(
    "make, err, match",
    [
        (lambda: losses.OrthogonalProjectionLoss(), ValueError, "auxiliary loss"),
        (lambda: losses.InfoNCELoss(), ValueError, "kind 'scores'"),
        (lambda: losses.BPRLoss(), ValueError, "kind 'pairs'"),
        (lambda: "cross_entropy", TypeError, "must be an nn.Module"),
    ],
)
def test_unroutable_losses_raise(make, err, match):
    with pytest.raises(err, match="VisionClassifier: .*" + match):
        VisionClassifier(make(), **TINY)


def test_bad_sizes_and_aux_kind_raise():
    with pytest.raises(ValueError, match="VisionClassifier: num_classes must be a positive integer"):
        VisionClassifier(losses.CrossEntropyLoss(), backbone="test_resnet")
    with pytest.raises(ValueError, match="VisionClassifier: aux_loss must take logits"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", losses.ExperimentalWarning)
            VisionClassifier(losses.CrossEntropyLoss(), aux_loss=losses.AdversarialCompSumLoss(nu=1.0), **TINY)
    with pytest.raises(ValueError, match="VisionSegmenter: the segmenter routes dense logits losses"):
        VisionSegmenter(losses.WCDASLoss(16, 11), backbone="test_resnet", num_classes=11)


def test_fit_logs_every_metric_with_robust_accuracy():
    """A short real fit with robust evaluation on (PGD-2 here for speed) and LT head/tail."""
    dm = DigitsDataModule(batch_size=32, imbalance_factor=10.0)
    model = VisionClassifier(losses.CrossEntropyLoss(), **{**TINY, "robust_eval": True, "pgd_steps": 2})
    trainer = _trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=2)
    trainer.fit(model, datamodule=dm)
    m = trainer.callback_metrics
    for k in ("train/loss", "train/top1", "val/loss", "val/top1", "val/top5", "val/balanced_acc", "val/ece",
              "val/robust_acc", "val/cos_intra", "val/cos_inter", "val/acc_head",
              "val/acc_tail", "val/acc_class_0"):
        assert k in m and math.isfinite(float(m[k])), k
    per_class = torch.tensor([float(m[f"val/acc_class_{c}"]) for c in range(10) if f"val/acc_class_{c}" in m])
    assert float(m["val/acc_tail"]) == pytest.approx(
        torch.tensor([float(m[f"val/acc_class_{c}"]) for c in range(5, 10) if f"val/acc_class_{c}" in m]).mean().item())
    assert 0 <= per_class.min() and per_class.max() <= 1
    # cross-entropy's softmax is never sparse: no support sizes; 10 classes: top-5 is logged
    assert "val/support" not in m and "val/sparsemax_support" not in m


@pytest.mark.slow
def test_pgd_adversarial_training_and_robust_accuracy_at_several_radii():
    """``train_pgd_epsilon``: the batch a training step sees is its PGD adversarial version, inside
    the l-inf ball and the image range, crafted in eval mode (batch-norm statistics untouched, modes
    restored) and seeded; ``robust_epsilons``: one robust accuracy per radius, and the radius of the
    main attack reproduces ``robust_acc`` exactly (the same attack, the same seeds)."""
    torch.manual_seed(0)
    eps = 0.1
    model = VisionClassifier(losses.CrossEntropyLoss(), **{**TINY, "robust_eval": True, "pgd_steps": 2,
                                                            "robust_epsilons": [8 / 255, 0.3],
                                                            "train_pgd_epsilon": eps, "train_pgd_steps": 3})
    assert model.train_pgd == {"epsilon": eps, "step_size": pytest.approx(2.5 * eps / 3), "steps": 3}
    model.train()
    x = torch.rand(16, 1, 32, 32)
    y = torch.randint(0, 10, (16,))
    bn = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    adv = model._adversarial_batch(x, y)
    assert model.training and all(m.training for m in model.modules())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in bn.items())
    assert (adv - x).abs().max() <= eps + 1e-6 and adv.min() >= 0 and adv.max() <= 1
    assert not torch.equal(adv, x) and torch.equal(adv, model._adversarial_batch(x, y))  # seeded
    with torch.no_grad():
        model.eval()
        clean, attacked = (F.cross_entropy(model(t), y).item() for t in (x, adv))
    assert attacked > clean  # the ascent raised the loss it attacks

    model.train()
    dm = DigitsDataModule(batch_size=32)
    trainer = _trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1)
    trainer.fit(model, datamodule=dm)
    m = trainer.callback_metrics
    assert float(m[f"val/robust_acc@{8 / 255:g}"]) == float(m["val/robust_acc"])
    assert 0 <= float(m["val/robust_acc@0.3"]) <= 1 and math.isfinite(float(m["train/loss"]))


@pytest.mark.parametrize("kwargs, match", [
    ({"train_pgd_epsilon": -0.1}, "train_pgd_epsilon must be a finite radius"),
    ({"train_pgd_epsilon": float("nan")}, "train_pgd_epsilon must be a finite radius"),
    ({"train_pgd_epsilon": 0.1, "train_pgd_steps": 0}, "train_pgd_steps must be a positive integer"),
    ({"robust_epsilons": [0.1, 0.0], "robust_eval": True}, "robust_epsilons must be positive"),
    ({"robust_epsilons": [0.1]}, "robust_epsilons needs robust_eval=true"),
    ({"test_attacks": ["apgd-ce"]}, "test_attacks needs robust_eval=true"),
    ({"test_attacks": ["autoattack"], "robust_eval": True}, "test_attacks must name distinct attacks"),
    ({"test_attacks": ["apgd-ce", "apgd-ce"], "robust_eval": True}, "test_attacks must name distinct attacks"),
    ({"test_attacks": ["apgd-ce"], "robust_eval": True, "test_attack_iters": 0}, "test_attack_iters must be"),
    ({"test_attacks": ["apgd-ce"], "robust_eval": True, "test_attack_restarts": 1.5}, "test_attack_restarts must be"),
    ({"robust_eval": True, "test_masking_checks": True}, "test_masking_checks needs test_attacks"),
])
def test_adversarial_options_refuse_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VisionClassifier(losses.CrossEntropyLoss(), **{**TINY, **kwargs})


def test_test_attack_ensemble_is_the_worst_case_of_its_attacks_at_test_only(tmp_path):
    """``test_attacks``: at test, per batch, the worst case over the listed attacks at every radius
    (the same numbers as calling lightning_modules.attacks.robust_accuracy on the batch); never at
    validation; recorded per item; at radius 0 nothing can break an image, so it is the top-1."""
    from lightning_modules.attacks import robust_accuracy
    from lightning_modules.records import TestItemRecorder, load_test_items
    from lightning_modules.routing import predict_scores

    torch.manual_seed(0)
    kw = {**TINY, "robust_eval": True, "pgd_steps": 2, "pgd_epsilon": 0.1, "pgd_step_size": 0.025,
          "robust_epsilons": [0.3], "test_attacks": ["apgd-ce", "apgd-dlr"], "test_attack_iters": 4}
    model = VisionClassifier(losses.CrossEntropyLoss(), **kw)
    dm = DigitsDataModule(seed=0, eval_batch_size=48)
    path = str(tmp_path / "items.npz")
    trainer = _trainer(limit_test_batches=1, limit_val_batches=1, callbacks=[TestItemRecorder(path)])
    trainer.test(model, datamodule=dm, verbose=False)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    x, y = next(iter(dm.test_dataloader()))
    for name, eps in (("robust_acc_ensemble", 0.1), ("robust_acc_ensemble@0.3", 0.3)):
        ref = robust_accuracy(model, x, y, eps=eps, attacks=("apgd-ce", "apgd-dlr"), n_iter=4, batch_size=48,
                              seed=0, predict=lambda out: predict_scores(model.loss, out))
        assert m[f"test/{name}"] == pytest.approx(ref.robust_accuracy, abs=1e-6), name
        assert m[f"test/{name}"] <= m["test/top1"] + 1e-6
    assert m["test/robust_acc_ensemble@0.3"] <= m["test/robust_acc_ensemble"] + 1e-6
    rec = load_test_items(path)
    assert rec.aggregate()["test/robust_acc_ensemble"] == pytest.approx(m["test/robust_acc_ensemble"], abs=1e-6)
    trainer.validate(model, datamodule=dm, verbose=False)
    assert not any("ensemble" in k for k in trainer.callback_metrics)
    # radius 0: the attacks cannot move an image, the ensemble's robust accuracy is the clean top-1
    zero = VisionClassifier(losses.CrossEntropyLoss(), **{**kw, "pgd_epsilon": 0.0, "robust_epsilons": []})
    zero.load_state_dict(model.state_dict())
    trainer = _trainer(limit_test_batches=1)
    trainer.test(zero, datamodule=dm, verbose=False)
    m0 = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert m0["test/robust_acc_ensemble"] == pytest.approx(m0["test/top1"], abs=1e-6)


def test_masking_checks_read_the_attacks_and_flag_a_model_without_input_gradients(tmp_path):
    """``test_masking_checks``: per test image, APGD-CE at radius 1 (the same numbers as calling
    robust_accuracy on the batch), an exactly-zero input gradient, and robust under the ensemble but
    broken by PGD, each logged and recorded. A model that quantises its input (zero input gradient
    everywhere) keeps its images through the radius-1 attack and is flagged on every image."""
    from lightning_modules.attacks import robust_accuracy
    from lightning_modules.records import TestItemRecorder, load_test_items
    from lightning_modules.routing import predict_scores

    torch.manual_seed(0)
    kw = {**TINY, "robust_eval": True, "pgd_steps": 2, "pgd_epsilon": 0.1, "pgd_step_size": 0.025,
          "test_attacks": ["apgd-ce", "apgd-dlr"], "test_attack_iters": 4, "test_masking_checks": True}
    model = VisionClassifier(losses.CrossEntropyLoss(), **kw)
    dm = DigitsDataModule(seed=0, eval_batch_size=48)
    path = str(tmp_path / "items.npz")
    trainer = _trainer(limit_test_batches=1, callbacks=[TestItemRecorder(path)])
    trainer.test(model, datamodule=dm, verbose=False)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    x, y = next(iter(dm.test_dataloader()))
    ref = robust_accuracy(model, x, y, eps=1.0, attacks=("apgd-ce",), n_iter=4, batch_size=48, seed=0,
                          predict=lambda out: predict_scores(model.loss, out))
    assert m["test/robust_acc_unbounded"] == pytest.approx(ref.robust_accuracy, abs=1e-6)
    assert m["test/zero_grad_frac"] == 0.0
    cols = load_test_items(path).tables["items"]
    missed = np.asarray(cols["robust_acc_ensemble"], bool) & ~np.asarray(cols["robust_acc"], bool)
    assert m["test/ensemble_missed"] == pytest.approx(missed.mean(), abs=1e-6)
    for name in ("robust_acc_unbounded", "zero_grad_frac", "ensemble_missed"):
        assert load_test_items(path).aggregate()[f"test/{name}"] == pytest.approx(m[f"test/{name}"], abs=1e-6)
    # an input quantised to 5 levels: every input gradient is 0, so no gradient attack moves an image
    masked = VisionClassifier(losses.CrossEntropyLoss(), **kw)
    masked.load_state_dict(model.state_dict())
    masked.register_forward_pre_hook(lambda mod, args: (torch.round(args[0] * 4) / 4,))
    trainer = _trainer(limit_test_batches=1)
    trainer.test(masked, datamodule=dm, verbose=False)
    mm = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert mm["test/zero_grad_frac"] == 1.0
    assert mm["test/robust_acc_unbounded"] == pytest.approx(mm["test/top1"], abs=1e-6) and mm["test/top1"] > 0.02


def test_pgd_training_refuses_a_loss_with_its_own_attack():
    loss = losses.AdversarialCompSumLoss(tau=1.0, rho=1.0, nu=1.0, epsilon=0.1, steps=1, step_size=0.1, seed=0)
    with pytest.raises(ValueError, match="runs its own attack"):
        VisionClassifier(loss, **{**TINY, "train_pgd_epsilon": 0.1})


def test_segmenter_miou_equals_an_independent_count():
    """``miou``: per class, |predicted AND true| / |predicted OR true| over every evaluated pixel,
    averaged over the classes present in either (float64 loop over the classes)."""
    torch.manual_seed(0)
    model = VisionSegmenter(losses.CrossEntropyLoss(), backbone="test_resnet", num_classes=11).eval()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.rand(4, 1, 32, 32, generator=g), torch.randint(0, 11, (4, 32, 32), generator=g))
               for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log outside a trainer
        with torch.no_grad():
            for b in batches:
                model._step("val", b)
    got = float(model.eval_metrics["val"]["miou"].compute())
    with torch.no_grad():
        pred = torch.cat([model(x).argmax(1) for x, _ in batches]).flatten()
    true = torch.cat([y for _, y in batches]).flatten()
    ious = []
    for c in range(11):
        union = ((pred == c) | (true == c)).sum().item()
        if union:
            ious.append(((pred == c) & (true == c)).sum().item() / union)
    assert got == pytest.approx(float(np.mean(np.array(ious, dtype=np.float64))), abs=1e-6)


def test_segmenter_shapes_metrics_and_targets():
    torch.manual_seed(0)
    model = VisionSegmenter(losses.CrossEntropyLoss(), backbone="test_resnet", num_classes=11).eval()
    x = torch.rand(3, 1, 32, 32)
    assert model(x).shape == (3, 11, 32, 32)
    for label_type, loss in (("soft", losses.DiceSemimetricLoss()), ("hard", losses.SoftDiceLoss())):
        dm = DigitsSegmentationDataModule(batch_size=32, label_type=label_type)
        torch.manual_seed(0)
        model = VisionSegmenter(loss, backbone="test_resnet", num_classes=11)
        trainer = _trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1)
        trainer.fit(model, datamodule=dm)
        m = trainer.callback_metrics
        for k in ("train/loss", "train/dice", "val/loss", "val/dice", "val/dice_fg", "val/miou", "val/pixel_acc",
                  "val/ece"):
            assert k in m and math.isfinite(float(m[k])), k
        # the logged Dice score against an independent computation on the same batch
        xb, tb = next(iter(dm.val_dataloader()))
        hard = tb.argmax(1) if tb.is_floating_point() else tb
        with torch.no_grad():
            pred = model.eval()(xb).argmax(1)
        dices = []
        for c in range(11):
            p, t = pred == c, hard == c
            denom = int(p.sum() + t.sum())
            if denom:
                dices.append(2 * int((p & t).sum()) / denom)
        assert float(m["val/dice"]) == pytest.approx(sum(dices) / len(dices), abs=1e-5)
        acc = float((pred == hard).float().mean())
        assert float(m["val/pixel_acc"]) == pytest.approx(acc, abs=1e-6)


# ---------------------------------------------------------------------------------------------
# metric helpers
# ---------------------------------------------------------------------------------------------
def test_feature_cosine_matches_pairwise_loops():
    g = torch.Generator().manual_seed(1)
    f = torch.randn(9, 4, generator=g, dtype=torch.float64)
    f[3] = 0.0  # a zero feature has cosine 0 with everything
    y = torch.tensor([0, 0, 1, 1, 1, 2, 2, 0, 2])
    metric = FeatureCosine(3, 4)
    metric.update(f[:4], y[:4])
    metric.update(f[4:], y[4:])
    out = metric.compute()
    u = f / f.norm(dim=1, keepdim=True).clamp_min(1e-12)
    same, diff = [], []
    for i, j in itertools.permutations(range(9), 2):
        (same if y[i] == y[j] else diff).append(float(u[i] @ u[j]))
    assert float(out["intra"]) == pytest.approx(sum(same) / len(same), abs=1e-12)
    assert float(out["inter"]) == pytest.approx(sum(diff) / len(diff), abs=1e-12)


def test_per_class_accuracy_and_split():
    m = PerClassAccuracy(4)
    logits = torch.eye(4)[[0, 1, 1, 3, 3, 0]]  # predictions 0, 1, 1, 3, 3, 0
    target = torch.tensor([0, 1, 0, 3, 0, 0])
    m.update(logits, target)
    acc = m.compute()
    assert acc[0] == pytest.approx(2 / 4) and acc[1] == 1.0 and torch.isnan(acc[2]) and acc[3] == 1.0
    assert float(PerClassAccuracy.split(acc, [2, 3])) == 1.0  # the absent class is ignored
    assert float(PerClassAccuracy.split(acc, [0, 1])) == pytest.approx(0.75)
    assert torch.isnan(PerClassAccuracy.split(acc, [2]))


def test_balanced_accuracy_averages_the_classes_present_in_the_targets():
    # class 2 is predicted but absent from the targets: it does not count (sklearn's definition;
    # torchmetrics' macro accuracy gives 0.5 here, counting it as recall 0)
    m = BalancedAccuracy(3)
    m.update(torch.tensor([0, 0, 1, 2]), torch.tensor([0, 0, 1, 1]))
    assert float(m.compute()) == pytest.approx((1.0 + 0.5) / 2)
    m.update(torch.eye(3)[[2]], torch.tensor([2]))  # logits; class 2 now present and right
    assert float(m.compute()) == pytest.approx((1.0 + 0.5 + 1.0) / 3)
    assert torch.isnan(BalancedAccuracy(3).compute())


def test_sparsemax_support_size_matches_sparsemax():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(50, 7, generator=g) * torch.tensor([0.1, 1.0, 5.0] * 16 + [1.0, 1.0])[:, None]
    z[3, 2] = float("-inf")
    ref = (losses.sparsemax(z, dim=1) > 0).sum(1)
    assert torch.equal(sparsemax_support_size(z), ref)
    zz = torch.randn(2, 5, 3, 3, generator=g)  # class dim 1 with spatial dims
    assert torch.equal(sparsemax_support_size(zz), (losses.sparsemax(zz, dim=1) > 0).sum(1))


def test_predictive_probabilities_uses_the_loss_mapping_when_exposed():
    z = torch.randn(4, 6)
    torch.testing.assert_close(predictive_probabilities(losses.CrossEntropyLoss(), z), torch.softmax(z, 1))

    class WithMapping(nn.Module):
        def predict_proba(self, logits):
            return losses.sparsemax(logits, dim=1)

    torch.testing.assert_close(predictive_probabilities(WithMapping(), z), losses.sparsemax(z, dim=1))


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_pgd_attack_stays_in_budget_and_raises_the_loss(norm):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 5))
    x = torch.rand(8, 1, 4, 4)
    y = torch.randint(0, 5, (8,))
    eps = 0.1
    with torch.inference_mode():  # as in Lightning's evaluation loops
        adv = pgd_attack(model, x, y, epsilon=eps, step_size=0.03, steps=10, norm=norm,
                         generator=torch.Generator().manual_seed(0))
    assert not adv.requires_grad and adv.min() >= 0 and adv.max() <= 1
    delta = (adv - x).flatten(1)
    size = delta.abs().max(1).values if norm == "linf" else delta.norm(dim=1)
    assert torch.all(size <= eps + 1e-6)
    assert all(p.grad is None for p in model.parameters())  # only input gradients were taken
    with torch.no_grad():
        assert F.cross_entropy(model(adv), y) > F.cross_entropy(model(x), y)
    same = pgd_attack(model, x, y, epsilon=0.0, steps=3)
    torch.testing.assert_close(same, x)
    with pytest.raises(ValueError, match="pgd_attack: norm must be"):
        pgd_attack(model, x, y, norm="l1")


# ---------------------------------------------------------------------------------------------
# confidence metrics (lightning_modules/confidence.py) logged by the classifier
# ---------------------------------------------------------------------------------------------

def test_classifier_logs_the_confidence_metrics_of_the_test_set():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ~3,600 small forwards: one thread is ~10x cheaper on a busy 2-core machine
    try:
        _confidence_metrics_case()
    finally:
        torch.set_num_threads(threads)


def _confidence_metrics_case():
    import pytorch_lightning as pl

    import losses
    from lightning_modules.confidence import expected_calibration_error
    from lightning_modules.data import MNISTDataModule
    from lightning_modules.models import VisionClassifier

    torch.manual_seed(0)
    model = VisionClassifier(losses.SparsemaxLoss(), backbone="test_resnet", num_classes=10, embedding_dim=16,
                             robust_eval=False)
    dm = MNISTDataModule(ood="digits8x8,uniform_noise", image_size=16, eval_batch_size=200, seed=0)  # 16: cheap
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_test_batches=2,
                         limit_val_batches=2)
    trainer.test(model, datamodule=dm, verbose=False)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # independent: the same 400 test images through the model, float64 numpy
    model.eval()
    xs, ys = zip(*[b for _, b in zip(range(2), dm.test_dataloader())])
    x, y = torch.cat(xs), torch.cat(ys)
    with torch.no_grad():
        logits = model(x)
        probs = model.loss.predict_proba(logits).double().numpy()
    yn = y.numpy()
    py = probs[np.arange(len(yn)), yn]
    assert m["test/nll"] == pytest.approx(float(np.mean(-np.log(np.maximum(py, 1e-12)))), rel=1e-5)
    assert m["test/nll_zero_frac"] == pytest.approx(float(np.mean(py == 0)), abs=1e-6)
    assert m["test/ece"] == pytest.approx(expected_calibration_error(torch.tensor(probs), y), abs=1e-5)
    assert 0.0 <= m["test/aurc"] <= 1.0
    with torch.no_grad():
        ood = model.loss.predict_proba(model(dm.ood_sets()["digits8x8"])).double().numpy().max(1)
    msp = probs.max(1)
    pairs = np.mean((msp[:, None] > ood[None, :]) + 0.5 * (msp[:, None] == ood[None, :]))
    assert m["test/ood_auroc_msp"] == pytest.approx(float(pairs), abs=1e-5)
    for k in ("test/ood_auroc_energy", "test/ood_noise_auroc_msp", "test/ood_noise_auroc_energy"):
        assert 0.0 <= m[k] <= 1.0, k
    # validation (a pass per epoch in the learning-curve runs) scores the in-distribution metrics only
    trainer.validate(model, datamodule=dm, verbose=False)
    val = set(trainer.callback_metrics)
    assert "val/aurc" in val and not any(k.startswith("val/ood") for k in val)


def test_segmenter_input_skip_head():
    """``input_skip=k``: the upsampled features and the input image, concatenated, through a 3x3
    convolution to k channels, ReLU and a 1x1 convolution: the same output shape, the input's pixels
    reach each logit directly (a pixel-level change of the input moves that pixel's logits even with
    the backbone's features held), gradients reach the backbone and the head; bad values refused."""
    torch.manual_seed(0)
    model = VisionSegmenter(losses.CrossEntropyLoss(), backbone="test_resnet", num_classes=11, input_skip=8).eval()
    convs = [m for m in model.head if isinstance(m, torch.nn.Conv2d)]
    feat = model.backbone.feature_info.channels()[-1]
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == [(feat + 1, 8, (3, 3)), (8, 11, (1, 1))]
    x = torch.rand(2, 1, 32, 32)
    assert model(x).shape == (2, 11, 32, 32)
    # the head alone on fixed features: one input pixel changes only its 3x3 neighbourhood's logits
    up = torch.nn.functional.interpolate(model.backbone(x)[-1], size=(32, 32), mode="bilinear", align_corners=False)
    x2 = x.clone()
    x2[0, 0, 10, 20] += 1.0
    with torch.no_grad():
        d = (model.head(torch.cat([up, x2], 1)) - model.head(torch.cat([up, x], 1))).abs().sum(1)[0]
    changed = torch.nonzero(d > 0)
    assert changed.numel() > 0 and int(changed[:, 0].min()) >= 9 and int(changed[:, 0].max()) <= 11
    assert int(changed[:, 1].min()) >= 19 and int(changed[:, 1].max()) <= 21
    model.train()
    loss = model.loss(model(x), torch.randint(0, 11, (2, 32, 32)))
    loss.backward()
    assert all(p.grad is not None for p in model.head.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.backbone.parameters())
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="input_skip"):
            VisionSegmenter(losses.CrossEntropyLoss(), backbone="test_resnet", num_classes=11, input_skip=bad)


@pytest.mark.parametrize("input_skip", [0, 8])
def test_segmenter_global_context_branch(input_skip):
    """``global_context=k``: the deepest level's features, averaged over the image, through a linear
    layer and ReLU to k channels, broadcast beside every position's features: a change of that
    image-level vector moves the logits of every pixel; gradients reach the branch; bad values refused."""
    torch.manual_seed(0)
    model = VisionSegmenter(losses.CrossEntropyLoss(), backbone="test_resnet", num_classes=11,
                            input_skip=input_skip, global_context=6).eval()
    stride4, deepest = model.backbone.feature_info.channels()
    assert model.context[0].in_features == deepest and model.context[0].out_features == 6
    first = model.head[0] if input_skip else model.head
    assert first.in_channels == stride4 + 6 + (1 if input_skip else 0)
    x = torch.rand(2, 1, 32, 32)
    out = model(x)
    assert out.shape == (2, 11, 32, 32)
    with torch.no_grad():
        model.context[0].bias.add_(5.0)  # a different image-level vector, the same pixels
        moved = (model(x) - out).abs().sum(1)
    assert bool((moved > 0).all())
    model.train()
    model.loss(model(x), torch.randint(0, 11, (2, 32, 32))).backward()
    assert model.context[0].weight.grad is not None and model.context[0].weight.grad.abs().sum() > 0
    plain = VisionSegmenter(losses.CrossEntropyLoss(), backbone="test_resnet", num_classes=11)
    assert plain.context is None and len(plain.backbone.feature_info.channels()) == 1
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="global_context"):
            VisionSegmenter(losses.CrossEntropyLoss(), backbone="test_resnet", num_classes=11, global_context=bad)


@pytest.mark.parametrize("soft", [False, True], ids=["hard", "soft"])
def test_segmenter_objective_adds_pixelwise_cross_entropy_with_its_weight(soft):
    """``loss_weight * loss + ce_weight * CE``: the logged objective against an independent float64
    computation of the Dice semimetric (dataset aggregate, smooth 1: 1 - T with T = (|x|+|y|-|x-y|+2s) /
    (|x|+|y|+2s) per class, mean over classes) and of the pixel-wise cross-entropy (mean over pixels of
    -sum_c y_c log p_c); the two parts are logged as ``main_loss`` and ``ce_loss``; gradients reach
    the model; the weights' bad values are refused, naming the argument."""
    g = torch.Generator().manual_seed(3)
    x = torch.rand(3, 1, 32, 32, generator=g)
    if soft:
        v = torch.rand(3, 32, 32, generator=g)
        digit = torch.randint(1, 11, (3,), generator=g)
        y = torch.zeros(3, 11, 32, 32)
        y[:, 0] = 1 - v
        y[torch.arange(3), digit] = v
    else:
        y = torch.randint(0, 11, (3, 32, 32), generator=g)
    torch.manual_seed(0)
    model = VisionSegmenter(losses.DiceSemimetricLoss(), backbone="test_resnet", num_classes=11,
                            loss_weight=0.75, ce_weight=0.25).eval()
    logged = {}
    model.log = lambda name, value, **kw: logged.__setitem__(name, value)  # metric objects too (log_dict)
    with torch.no_grad():
        total = model._step("val", (x, y))
        z = model(x).double()
    p = torch.softmax(z, 1)
    t = y.double() if soft else F.one_hot(y, 11).permute(0, 3, 1, 2).double()
    dims = (0, 2, 3)
    px, ty, diff = p.sum(dims), t.sum(dims), (p - t).abs().sum(dims)
    dml = (1 - (px + ty - diff + 2) / (px + ty + 2)).mean()
    ce = -(t * torch.log_softmax(z, 1)).sum(1).mean()
    assert float(logged["val/main_loss"]) == pytest.approx(float(dml), abs=1e-5)
    assert float(logged["val/ce_loss"]) == pytest.approx(float(ce), abs=1e-5)
    assert float(total) == pytest.approx(float(0.75 * dml + 0.25 * ce), abs=1e-5)
    assert float(logged["val/loss"]) == pytest.approx(float(total), abs=1e-6)

    model.train()
    model.zero_grad()
    model._step("train", (x, y)).backward()
    assert all(q.grad is not None and bool(torch.isfinite(q.grad).all()) for q in model.head.parameters())

    alone = VisionSegmenter(losses.DiceSemimetricLoss(), backbone="test_resnet", num_classes=11)
    assert (alone.loss_weight, alone.ce_weight) == (1.0, 0.0)
    for name, bad in (("ce_weight", -0.1), ("ce_weight", float("nan")), ("loss_weight", 0.0),
                      ("loss_weight", float("inf")), ("ce_weight", True), ("loss_weight", "1")):
        with pytest.raises(ValueError, match=name):
            VisionSegmenter(losses.DiceSemimetricLoss(), backbone="test_resnet", num_classes=11, **{name: bad})
