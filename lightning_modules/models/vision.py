"""Vision LightningModules: any timm backbone, any registered loss, routed by its declaration.

:class:`VisionClassifier` (digits and its variants) and :class:`VisionSegmenter` (the digits
segmentation maps). Neither holds a loss-specific branch: :func:`~lightning_modules.routing.loss_route`
says what the loss's ``forward`` takes (``docs/conventions.md``, Registry) and the module calls it so.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from losses import InputKind

from ..base import BenchmarkModule, seeded_init
from ..confidence import aurc, energy_score, msp_score, negative_log_likelihood, ood_auroc
from ..optim import build_optimizer, reset_parameter_state
from ..metrics import (
    FeatureCosine,
    PerClassAccuracy,
    classification_metrics,
    pgd_attack,
    segmentation_metrics,
    sparsemax_support_size,
    update_segmentation_metrics,
)
from ..metrics import hard_target as _hard_target
from ..routing import LossRoute, has_sparse_probabilities, head_logits, loss_route, predict_proba, predict_scores
from .pretrained import load_pretrained_file

__all__ = ["VisionClassifier", "VisionSegmenter", "ClassifierNet"]


def _timm():
    try:
        import timm
    except ImportError as exc:
        raise ModuleNotFoundError(
            "vision models need timm, which is not installed "
            f"(got ImportError: {exc}); install it with `pip install timm` (or `pip install softmax-losses[vision]`)",
            name="timm",
        ) from exc
    return timm


def _positive(cls: str, name: str, value: object, hint: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{cls}: {name} must be a positive integer (got {value!r}); {hint}")


class ClassifierNet(nn.Module):
    """backbone -> linear projection to ``embedding_dim`` (the features) -> optional linear head.

    ``forward(x)`` gives the head's logits (what model-aware losses attack); ``features(x)`` the
    ``(N, embedding_dim)`` embeddings that embedding losses take.
    """

    def __init__(self, backbone: nn.Module, projection: nn.Module, head: Optional[nn.Module]) -> None:
        super().__init__()
        self.backbone = backbone
        self.projection = projection
        self.head = head

    def features(self, x: Tensor) -> Tensor:
        return self.projection(self.backbone(x))

    def forward(self, x: Tensor) -> Tensor:
        if self.head is None:
            raise RuntimeError("ClassifierNet: no head (the loss owns it); call the loss's .logits(features)")
        return self.head(self.features(x))


def _robust_key(eps: float) -> str:
    """Name of the robust accuracy at radius ``eps`` (a ModuleDict key cannot hold '.' or '@'):
    ``robust_at_0p1``; logged as ``robust_acc@0.1``."""
    return f"robust_at_{eps:g}".replace(".", "p")


def _robust_epsilons(cls: str, values: Sequence[float], robust_eval: bool) -> List[float]:
    out = []
    for v in values or ():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{cls}: robust_epsilons must be positive finite radii (got {list(values)!r}); "
                             "pass e.g. [0.1, 0.2, 0.3]")
        out.append(float(v))
    if out and not robust_eval:
        raise ValueError(f"{cls}: robust_epsilons needs robust_eval=true (got robust_eval=false); "
                         "turn robust evaluation on or drop robust_epsilons")
    return out


#: Attacks :func:`lightning_modules.attacks.robust_accuracy` runs (``test_attacks``).
TEST_ATTACKS = ("apgd-ce", "apgd-dlr", "pgd", "pgd-ce", "pgd-margin")


def _test_attacks(cls: str, attacks: Sequence[str], iters: int, restarts: int, robust_eval: bool) -> List[str]:
    names = list(attacks or ())
    bad = [a for a in names if a not in TEST_ATTACKS]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"{cls}: test_attacks must name distinct attacks of {TEST_ATTACKS} (got {names!r}); "
                         "the AutoAttack-style pair is ['apgd-ce', 'apgd-dlr']")
    for name, v in (("test_attack_iters", iters), ("test_attack_restarts", restarts)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{cls}: {name} must be a positive integer (got {v!r}); e.g. 100 iterations, 1 restart")
    if names and not robust_eval:
        raise ValueError(f"{cls}: test_attacks needs robust_eval=true (got robust_eval=false); the ensemble "
                         "attacks the radii of the robust evaluation (pgd_epsilon and robust_epsilons)")
    return names


def _train_pgd(cls: str, epsilon: float, steps: int, step_size: Optional[float], route) -> Optional[Dict[str, float]]:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not math.isfinite(epsilon) or epsilon < 0:
        raise ValueError(f"{cls}: train_pgd_epsilon must be a finite radius >= 0 (got {epsilon!r}); 0 turns "
                         "adversarial training off, MNIST's usual radii are 0.1-0.3")
    if epsilon == 0:
        return None
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"{cls}: train_pgd_steps must be a positive integer (got {steps!r}); pass e.g. 10")
    if route.kind == InputKind.MODEL:
        raise ValueError(f"{cls}: train_pgd_epsilon is for losses that take logits or embeddings; the loss "
                         f"{route.name!r} runs its own attack (set train_pgd_epsilon: 0)")
    size = 2.5 * epsilon / steps if step_size is None else float(step_size)
    if not math.isfinite(size) or size <= 0:
        raise ValueError(f"{cls}: train_pgd_step_size must be positive (got {step_size!r}); None gives 2.5 * eps / steps")
    return dict(epsilon=float(epsilon), step_size=size, steps=int(steps))


class VisionClassifier(BenchmarkModule):
    """Image classifier for the digits benchmarks, trained with any registered loss.

    Args:
        loss: the loss module (``class_path`` / ``init_args`` in YAML). Routed by its registry
            kind: ``"logits"`` gets the head's logits and the target; ``"embeddings"`` with a
            head (``owns_head``: WCDAS, NBC-softmax, margin / cosine softmax, Partial FC) gets the
            features, and its ``.logits(features)`` are the evaluation logits (the model then has
            no head of its own); ``"model"`` (adversarial comp-sum) gets ``(model, images, target)``
            with ``model`` mapping images to logits. ``"scores"`` / ``"pairs"`` kinds, auxiliary
            losses and head-less embedding losses as the main loss raise ``ValueError``
            (:meth:`~lightning_modules.routing.LossRoute.require_main`).
        backbone: any timm model name, built with ``pretrained=False`` (no download),
            ``in_chans`` and ``num_classes=0`` (pooled features), plus ``backbone_kwargs``.
        num_classes / in_chans: linked from the DataModule by the CLI.
        embedding_dim: width of the linear feature projection after the backbone (the
            embeddings; linked into a head-owning loss's ``embedding_dim``).
        aux_loss / aux_weight: an auxiliary loss (OPL) added as ``loss + aux_weight * aux_loss``;
            routed by its own kind (``"embeddings"``: features, ``"logits"``: logits).
        lr / weight_decay: AdamW.
        robust_eval: compute robust accuracy under PGD in validation and test (``pgd_steps``
            steps of ``pgd_step_size`` within the l-inf ball ``pgd_epsilon``, random start from
            ``pgd_seed``; the defaults are PGD-10, eps 8/255, step 2/255).
        robust_epsilons: further l-inf radii at which validation and test also report robust
            accuracy, as ``{stage}/robust_acc@{eps}`` (e.g. ``[0.1, 0.2, 0.3]``, the usual MNIST
            radii), each with ``pgd_steps`` steps of ``eps * pgd_step_size / pgd_epsilon`` (the
            main attack's step-to-radius ratio; ``eps / 4`` when ``pgd_epsilon`` is 0). Needs
            ``robust_eval``.
        test_attacks: at test only, also the worst case over an ensemble of stronger attacks
            (:func:`lightning_modules.attacks.robust_accuracy`: an image counts as robust only if it
            is classified correctly and no attack of the list breaks it, each attack running on
            the images still robust), at ``pgd_epsilon`` and every ``robust_epsilons`` radius,
            logged as ``test/robust_acc_ensemble`` and ``test/robust_acc_ensemble@{eps}``. E.g.
            ``["apgd-ce", "apgd-dlr"]`` (Auto-PGD with the cross-entropy and the DLR loss, the
            AutoAttack-style evaluation of Croce and Hein, 2020) or ``["pgd-margin"]`` with
            ``test_attack_restarts: 10`` (PGD with a margin loss and restarts). ``()`` (default): off.
            The attacks see the evaluation logits and judge success by the loss's own prediction
            rule. Needs ``robust_eval``. Costly: ``test_attack_iters`` (default 100) gradient steps
            per attack and restart.
        test_attack_iters / test_attack_restarts: iterations and random restarts of each test attack.
        test_masking_checks: at test only, beside the ensemble, the per-image numbers that flag
            gradient masking (Athalye et al., 2018; Carlini et al., 2019), each logged and recorded
            per test image: ``test/robust_acc_unbounded`` (APGD-CE at radius 1, the whole [0, 1]
            box, ``test_attack_iters`` steps: a model whose gradients lead anywhere is broken on
            almost every image), ``test/zero_grad_frac`` (images whose cross-entropy input gradient
            is exactly 0) and ``test/ensemble_missed`` (images the ensemble left robust at
            ``pgd_epsilon`` that the PGD attack of ``robust_acc`` broke: the stronger attacks must
            not be weaker). Needs ``test_attacks``. ``False`` (default): off.
        train_pgd_epsilon: PGD adversarial training (Madry et al., ICLR 2018) for any loss that
            takes logits or embeddings: each training batch is replaced by its adversarial
            examples against the current model, ``train_pgd_steps`` steps of
            ``train_pgd_step_size`` (``None``: ``2.5 * eps / steps``) inside the l-inf ball of this
            radius, random start, crafted with the model in eval mode (as the adversarial comp-sum
            loss crafts its own); the loss then trains on them. ``0`` (default): off. Not with a
            loss that runs its own attack (``"model"`` kind).
        ece_bins: bins of the expected calibration error.
        init_seed: when set, the backbone, the projection and the model's own head are initialised
            from ``torch.manual_seed(init_seed)`` (the global RNG is restored afterwards), so arms
            of a paired comparison that share the architecture start from the same weights
            whatever their losses draw.
        lr_schedule: ``"constant"`` (default) or ``"cosine"``: per step, ``lr * (1 + cos(pi t)) / 2``
            with ``t`` the fraction of the stage's steps done (one stage, or each of the two).
        param_lrs: learning rates for parameters whose name (``named_parameters``) matches a
            ``fnmatch`` pattern, e.g. ``{"loss.scale_logit": 0.05}`` gives WCDAS's trainable scale
            its own rate; every other parameter uses ``lr``.
        two_stage_epoch: two-stage long-tail protocol: epochs ``0 .. two_stage_epoch - 1`` train
            everything (stage 1); at epoch ``two_stage_epoch`` the backbone and projection are
            frozen (``requires_grad=False``, kept in eval mode), the classifier head -- the model's
            linear head, or every parameter of a loss that owns the head -- is reset to its
            initial values (a fresh optimiser state too), and the DataModule switches to
            class-balanced sampling (``set_class_balanced_sampling``); the remaining epochs
            retrain the head (for cross-entropy: cRT). ``None``: one stage.
        stage2_lr: learning rate of stage 2 (``None``: ``lr``).
        pretrained_file: initialise the backbone from a local weights file (never downloads); see
            :func:`~lightning_modules.models.pretrained.load_pretrained_file`. Rebuilding the model from a checkpoint reads the file
            again (then overwritten by the checkpoint's weights), so it must still exist.

    Embedding losses (kind ``"embeddings"``, main or auxiliary) receive class ids; soft targets are
    reduced to their argmax for them, and for every metric. Logits losses get the target as given.

    Predictions follow the loss's own rule (:func:`~lightning_modules.routing.predict_scores`):
    ``top1``, ``top5``, ``balanced_acc``, the per-class and robust accuracies rank the classes by the
    loss's ``predict_proba`` where it has one (ties broken by the logits), else by the logits (the
    model's head, or the loss's ``.logits`` when it owns the head).

    Metrics (``<stage>/<name>``): ``loss`` (total; also ``main_loss``/``aux_loss`` with an
    auxiliary loss), ``top1``; in val/test also ``top5`` (with more than 5 classes),
    ``balanced_acc``, ``ece`` (of the loss's predictive distribution, see
    :func:`~lightning_modules.routing.predict_proba`), ``acc_class_<c>``, ``acc_head``/``acc_tail``
    (when the DataModule has ``tail_classes``), ``robust_acc`` (and, at test with ``test_attacks``,
    ``robust_acc_ensemble``); for a loss whose predictive
    distribution is sparse (:func:`~lightning_modules.routing.has_sparse_probabilities`:
    sparsemax, 1.5-entmax) ``sparsemax_support`` (mean support size of ``sparsemax(logits)``) and
    ``support`` (mean support of the loss's own distribution); ``cos_intra``/``cos_inter`` (mean cosine of features within / across
    classes); the confidence metrics of :mod:`lightning_modules.confidence` over the whole
    evaluated set: ``nll`` and ``nll_zero_frac`` (the predictive distribution's NLL with
    probabilities clipped at ``1e-12``, and the fraction of targets it gave probability 0: sparse
    mappings do), ``aurc`` (selective prediction by the maximum probability, the prediction being
    the loss's own rule), and, at test, when the DataModule declares OOD sets (``MNISTDataModule(ood=...)``),
    ``ood_auroc_msp`` / ``ood_auroc_energy`` against ``digits8x8`` and ``ood_noise_auroc_msp`` /
    ``ood_noise_auroc_energy`` against ``uniform_noise`` (scores: maximum predictive probability,
    and ``logsumexp`` of the evaluation logits, higher = more in-distribution). ``ece`` is the
    top-label ECE of 15 equal-width bins (torchmetrics; the same definition as
    :func:`lightning_modules.confidence.expected_calibration_error`). At test, a DataModule built with
    ``linear_probe=True`` adds its trained reference on the same split (``top1_linear``,
    ``balanced_acc_linear``, ``acc_head_linear`` / ``acc_tail_linear``, ``l2_linear``: a logistic
    regression on raw pixels, the competence floor of the claims file).
    """

    loss_kinds = (InputKind.LOGITS, InputKind.EMBEDDINGS, InputKind.MODEL)
    loss_task = "a classifier"
    loss_hint = ("a classifier routes logits, embeddings (with a head) or model losses; pass an auxiliary or "
                 "head-less embedding loss as aux_loss next to a main loss such as losses.CrossEntropyLoss()")
    loss_example = "losses.CrossEntropyLoss()"

    def __init__(
        self,
        loss: nn.Module,
        backbone: str = "resnet10t",
        num_classes: int = 0,
        in_chans: int = 1,
        embedding_dim: int = 64,
        aux_loss: Optional[nn.Module] = None,
        aux_weight: float = 1.0,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        robust_eval: bool = True,
        pgd_epsilon: float = 8 / 255,
        pgd_step_size: float = 2 / 255,
        pgd_steps: int = 10,
        pgd_seed: int = 0,
        robust_epsilons: Sequence[float] = (),
        test_attacks: Sequence[str] = (),
        test_attack_iters: int = 100,
        test_attack_restarts: int = 1,
        test_masking_checks: bool = False,
        train_pgd_epsilon: float = 0.0,
        train_pgd_steps: int = 10,
        train_pgd_step_size: Optional[float] = None,
        ece_bins: int = 15,
        backbone_kwargs: Optional[Dict[str, Any]] = None,
        init_seed: Optional[int] = None,
        lr_schedule: str = "constant",
        param_lrs: Optional[Dict[str, float]] = None,
        two_stage_epoch: Optional[int] = None,
        stage2_lr: Optional[float] = None,
        pretrained_file: Optional[str] = None,
    ) -> None:
        super().__init__(loss, lr=lr, weight_decay=weight_decay)
        cls = "VisionClassifier"
        if lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"{cls}: lr_schedule must be 'constant' or 'cosine' (got {lr_schedule!r}); "
                             "cosine anneals each stage's learning rate to 0")
        if two_stage_epoch is not None and (isinstance(two_stage_epoch, bool) or not isinstance(two_stage_epoch, int)
                                            or two_stage_epoch < 1):
            raise ValueError(f"{cls}: two_stage_epoch must be a positive integer or None (got {two_stage_epoch!r}); "
                             "stage 2 starts at that epoch, after at least one epoch of stage 1")
        self.lr_schedule = lr_schedule
        self.param_lrs = dict(param_lrs or {})
        self.two_stage_epoch = two_stage_epoch
        self.stage2_lr = float(stage2_lr) if stage2_lr is not None else None
        self._stage2 = False
        _positive(cls, "num_classes", num_classes, "link it from the DataModule (the CLI does) or pass it")
        _positive(cls, "in_chans", in_chans, "digits images have 1 channel")
        _positive(cls, "embedding_dim", embedding_dim, "pass e.g. 64")
        self.aux_route: Optional[LossRoute] = None
        if aux_loss is not None:
            self.aux_route = loss_route(aux_loss)
            if self.aux_route.kind not in (InputKind.LOGITS, InputKind.EMBEDDINGS):
                raise ValueError(f"{cls}: aux_loss must take logits or embeddings "
                                 f"(got kind {self.aux_route.kind!r} for {type(aux_loss).__name__}); "
                                 "use an auxiliary feature loss such as losses.OrthogonalProjectionLoss()")
        self.num_classes = num_classes
        self.aux_weight = float(aux_weight)
        self.robust_eval = bool(robust_eval)
        self.pgd = dict(epsilon=float(pgd_epsilon), step_size=float(pgd_step_size), steps=int(pgd_steps))
        self.pgd_seed = int(pgd_seed)
        self.robust_epsilons = _robust_epsilons(cls, robust_epsilons, self.robust_eval)
        ratio = self.pgd["step_size"] / self.pgd["epsilon"] if self.pgd["epsilon"] > 0 else 0.25
        # the evaluation attacks: (metric key, logged name, pgd_attack arguments), the main one first
        self._attacks = [("robust", "robust_acc", self.pgd)] + [
            (_robust_key(eps), f"robust_acc@{eps:g}", dict(epsilon=eps, step_size=eps * ratio, steps=self.pgd["steps"]))
            for eps in self.robust_epsilons]
        self.train_pgd = _train_pgd(cls, train_pgd_epsilon, train_pgd_steps, train_pgd_step_size, self.route)
        self.test_attacks = _test_attacks(cls, test_attacks, test_attack_iters, test_attack_restarts, self.robust_eval)
        self.test_attack = dict(n_iter=int(test_attack_iters), restarts=int(test_attack_restarts))
        if test_masking_checks and not self.test_attacks:
            raise ValueError(f"{cls}: test_masking_checks needs test_attacks (got test_attacks={list(test_attacks)!r}); "
                             "the checks read the ensemble, e.g. test_attacks: [apgd-ce, apgd-dlr]")
        self.test_masking_checks = bool(test_masking_checks)
        # the ensemble's radii at test: (metric key, logged name, radius), the main radius first
        self._ensemble = [] if not self.test_attacks else [("ensemble", "robust_acc_ensemble", self.pgd["epsilon"])] + [
            (f"ensemble_{_robust_key(eps)}", f"robust_acc_ensemble@{eps:g}", eps) for eps in self.robust_epsilons]

        timm = _timm()
        with seeded_init(init_seed):  # the same start for every loss (paired comparisons)
            body = timm.create_model(backbone, pretrained=False, in_chans=in_chans, num_classes=0,
                                     **(backbone_kwargs or {}))
            projection = nn.Linear(body.num_features, embedding_dim)
            head = None if self.route.owns_head else nn.Linear(embedding_dim, num_classes)
        self.net = ClassifierNet(body, projection, head)
        self.loss = loss
        self.aux_loss = aux_loss
        #: the loss's predictive distribution can hold exact zeros (declared, or probed: no name checks)
        self.sparse_probabilities = has_sparse_probabilities(loss, num_classes)
        if pretrained_file is not None:
            load_pretrained_file(self.net.backbone, pretrained_file)

        self.train_metrics = classification_metrics(num_classes, full=False).clone(prefix="train/")
        # per evaluation stage: the logged collection, and the metrics logged one by one
        self.eval_metrics = nn.ModuleDict({
            stage: classification_metrics(num_classes, full=True, ece_bins=ece_bins).clone(prefix=f"{stage}/")
            for stage in ("val", "test")})
        self.eval_stats = nn.ModuleDict({stage: nn.ModuleDict({
            "per_class": PerClassAccuracy(num_classes),
            "feature_cos": FeatureCosine(num_classes, embedding_dim),
            "sparsemax_support": MeanMetric(),
            "support": MeanMetric(),
            **{key: MulticlassAccuracy(num_classes, average="micro") for key, _, _ in self._attacks},
            **{key: MeanMetric() for key, _, _ in self._ensemble},
            **({name: MeanMetric() for name, _ in self.MASKING_COLUMNS} if self.test_masking_checks else {}),
        }) for stage in ("val", "test")})
        self._tail_classes: List[int] = []
        # per evaluation stage: probabilities, logits, predictions and targets of the epoch (the
        # confidence metrics need the whole set); emptied at the end of each evaluation epoch
        self._confidence_buffers: Dict[str, Dict[str, List[Tensor]]] = {"val": {}, "test": {}}
        # the head's initial values, restored at the start of stage 2 (two-stage protocol)
        self._head_init = {k: v.detach().clone() for k, v in self._head_parameters().items()}

    # -- optimisation: schedule, parameter groups, two-stage protocol -----------------------------
    def _head_parameters(self) -> Dict[str, nn.Parameter]:
        """The classifier head: the model's linear head, or every parameter of a head-owning loss."""
        named = dict(self.named_parameters())
        prefix = "loss." if self.route.owns_head else "net.head."
        return {k: p for k, p in named.items() if k.startswith(prefix)}

    def configure_optimizers(self) -> Any:
        import fnmatch

        groups: Dict[str, List[nn.Parameter]] = {}
        for name, p in self.named_parameters():
            pattern = next((pat for pat in self.param_lrs if fnmatch.fnmatchcase(name, pat)), None)
            groups.setdefault(pattern or "", []).append(p)
        params = [{"params": ps, "lr": self.param_lrs[k] if k else self.lr, "name": k or "default"}
                  for k, ps in groups.items()]
        opt = build_optimizer(self, params, lr=self.lr, weight_decay=self.weight_decay)  # sparse_grad: SparseAdam
        if self.lr_schedule == "constant" and self.two_stage_epoch is None:
            return opt
        scheduler = torch.optim.lr_scheduler.LambdaLR(opt, self._lr_factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _steps(self) -> tuple:
        """``(steps of stage 1, total steps)`` of this fit."""
        total = int(self.trainer.estimated_stepping_batches)
        if self.two_stage_epoch is None:
            return total, total
        epochs = max(1, int(self.trainer.max_epochs or 1))
        per_epoch = max(1, total // epochs)
        return min(total, per_epoch * self.two_stage_epoch), total

    def _lr_factor(self, step: int) -> float:
        import math

        if not hasattr(self, "_stage_steps"):
            self._stage_steps = self._steps()
        s1, total = self._stage_steps
        if self.two_stage_epoch is not None and step >= s1:
            base = (self.stage2_lr / self.lr) if self.stage2_lr is not None else 1.0
            t, n = step - s1, max(1, total - s1)
        else:
            base, t, n = 1.0, step, max(1, s1)
        if self.lr_schedule == "constant":
            return base
        return base * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t / n)))

    def train(self, mode: bool = True):
        super().train(mode)
        if self._stage2:  # frozen features: batch-norm statistics stay those of stage 1
            self.net.backbone.eval()
            self.net.projection.eval()
        return self

    def on_train_epoch_start(self) -> None:
        if self.two_stage_epoch is None or self._stage2 or self.current_epoch < self.two_stage_epoch:
            return
        dm = getattr(self.trainer, "datamodule", None)
        if not callable(getattr(dm, "set_class_balanced_sampling", None)):
            raise RuntimeError("VisionClassifier: two_stage_epoch needs a DataModule with class-balanced "
                               f"sampling (got {type(dm).__name__}); use DigitsDataModule or MNISTDataModule")
        self._stage2 = True
        for module in (self.net.backbone, self.net.projection):
            module.requires_grad_(False)
        self.train(self.training)
        if self.current_epoch == self.two_stage_epoch:  # not when resuming inside stage 2
            opts = self.optimizers()
            opts = opts if isinstance(opts, list) else [opts]
            with torch.no_grad():
                for name, p in self._head_parameters().items():
                    p.copy_(self._head_init[name])
                    for opt in opts:  # fresh moments for the re-initialised head
                        reset_parameter_state(opt, p)
        dm.set_class_balanced_sampling(True)
        self.log("train/stage", 2.0, on_step=False, on_epoch=True)

    # -- model ----------------------------------------------------------------------------------
    def logits_from_features(self, features: Tensor) -> Tensor:
        """Evaluation logits: the loss's head when it owns one, else the model's head
        (:func:`~lightning_modules.routing.head_logits`)."""
        return head_logits(self.loss, self.route, features, self.net.head)

    def forward(self, x: Tensor) -> Tensor:
        return self.logits_from_features(self.net.features(x))

    def setup(self, stage: str) -> None:
        super().setup(stage)
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        self._tail_classes = [int(c) for c in getattr(dm, "tail_classes", None) or []]

    # -- loss routing ---------------------------------------------------------------------------
    def _losses(self, x: Tensor, target: Tensor):
        """``(main, aux or None, features, logits)`` for a batch, by the losses' routes."""
        ids = _hard_target(target)
        if self.route.kind == InputKind.MODEL:
            main = self.loss(self.net, x, target)
            if self.aux_loss is not None:  # the auxiliary loss needs features with a graph
                features = self.net.features(x)
                logits = self.logits_from_features(features)
            else:  # features and logits for the metrics only
                with torch.no_grad():
                    features = self.net.features(x)
                    logits = self.logits_from_features(features)
        else:
            features = self.net.features(x)
            if self.route.owns_head:
                main = self.loss(features, ids)
                with torch.no_grad():
                    logits = self.logits_from_features(features)
            else:
                logits = self.logits_from_features(features)
                main = self.loss(logits, target)
        aux = None
        if self.aux_loss is not None:
            if self.aux_route.kind == InputKind.EMBEDDINGS:
                aux = self.aux_loss(features, ids)
            else:
                aux = self.aux_loss(logits, target)
        return main, aux, features, logits

    def _log_losses(self, stage: str, main: Tensor, aux: Optional[Tensor], n: int) -> Tensor:
        total = main if aux is None else main + self.aux_weight * aux
        kw = dict(on_step=stage == "train", on_epoch=True, batch_size=n, sync_dist=True)
        self.log(f"{stage}/loss", total.detach(), prog_bar=True, **kw)
        if aux is not None:
            self.log(f"{stage}/main_loss", main.detach(), **kw)
            self.log(f"{stage}/aux_loss", aux.detach(), **kw)
        return total

    # -- steps ----------------------------------------------------------------------------------
    def _adversarial_batch(self, x: Tensor, target: Tensor) -> Tensor:
        """PGD adversarial examples of a training batch (``train_pgd_epsilon``), crafted with every
        submodule in eval mode (batch-norm statistics untouched) and the modes restored after; the
        random start is seeded by ``pgd_seed`` and the global step (reproducible runs)."""
        modes = [(m, m.training) for m in self.modules()]
        self.eval()
        try:
            g = torch.Generator().manual_seed(self.pgd_seed + 1_000_003 + int(self.global_step))
            return pgd_attack(self, x, _hard_target(target), generator=g, **self.train_pgd)
        finally:
            for m, mode in modes:
                m.training = mode

    def training_step(self, batch, batch_idx: int) -> Tensor:
        x, target = batch
        if self.train_pgd is not None:
            x = self._adversarial_batch(x, target)
        main, aux, _, logits = self._losses(x, target)
        total = self._log_losses("train", main, aux, x.shape[0])
        self.train_metrics.update(predict_scores(self.loss, logits.detach()), _hard_target(target))
        self.log_dict(self.train_metrics, on_step=False, on_epoch=True)
        return total

    def _eval_step(self, stage: str, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, target = batch
        ids = _hard_target(target)
        if self.route.kind == InputKind.MODEL:  # the loss runs its own attack: needs autograd
            with torch.inference_mode(False), torch.enable_grad():
                main, aux, features, logits = self._losses(x.clone(), target.clone())
                main, features, logits = main.detach(), features.detach(), logits.detach()
                aux = None if aux is None else aux.detach()
        else:
            main, aux, features, logits = self._losses(x, target)
        self._log_losses(stage, main, aux, x.shape[0])
        probs = predict_proba(self.loss, logits)
        scores = predict_scores(self.loss, logits)  # the loss's own prediction rule, else the logits
        metrics, stats = self.eval_metrics[stage], self.eval_stats[stage]
        for name, m in metrics.items(keep_base=True):
            m.update(probs if name.endswith("ece") else scores, ids)
        self.log_dict(metrics, on_step=False, on_epoch=True)
        stats["per_class"].update(scores, ids)
        stats["feature_cos"].update(features, ids)
        if self.sparse_probabilities:  # support sizes mean something only for a sparse distribution
            sm = stats["sparsemax_support"]
            sm.update(sparsemax_support_size(logits).float())
            self.log(f"{stage}/sparsemax_support", sm, on_step=False, on_epoch=True)
            sup = stats["support"]
            sup.update((probs > 0).sum(1).float())
            self.log(f"{stage}/support", sup, on_step=False, on_epoch=True)
        buf = self._confidence_buffers[stage]
        for key, value in (("probs", probs), ("logits", logits), ("pred", scores.argmax(1)), ("target", ids)):
            buf.setdefault(key, []).append(value.detach())
        records = self._item_records(stage)
        row = self._item_row(records, x.shape[0], dataloader_idx, probs, scores, logits, ids) if records else None
        if self.robust_eval:  # each attack from the same seeded random start
            for key, name, attack in self._attacks:
                g = torch.Generator().manual_seed(self.pgd_seed + batch_idx)
                x_adv = pgd_attack(self, x, ids, generator=g, **attack)
                adv_scores = predict_scores(self.loss, self(x_adv))
                stats[key].update(adv_scores, ids)
                self.log(f"{stage}/{name}", stats[key], on_step=False, on_epoch=True)
                hits = adv_scores.argmax(1) == ids
                if key == "robust":
                    pgd_hits = hits
                if row is not None:
                    row[name] = hits
        if stage == "test" and self._ensemble:  # the stronger attacks: test only (costly)
            from ..attacks import robust_accuracy

            for key, name, eps in self._ensemble:
                res = robust_accuracy(self, x, ids, eps=eps, attacks=self.test_attacks, batch_size=x.shape[0],
                                      seed=self.pgd_seed + batch_idx, clip=(0.0, 1.0),
                                      predict=lambda out: predict_scores(self.loss, out), **self.test_attack)
                stats[key].update(res.robust.float())
                self.log(f"{stage}/{name}", stats[key], on_step=False, on_epoch=True)
                if row is not None:
                    row[name] = res.robust
                if key == "ensemble":
                    ensemble_robust = res.robust
            if self.test_masking_checks:
                self._masking_step(x, ids, batch_idx, ensemble_robust, pgd_hits, stats, row)
        if row is not None:
            records.add("items", **row)

    #: The per-image masking numbers of ``test_masking_checks``: (logged name, what one image's value says).
    MASKING_COLUMNS = (
        ("robust_acc_unbounded", "not broken by APGD-CE at radius 1 (the whole [0, 1] box)"),
        ("zero_grad_frac", "the cross-entropy's input gradient is exactly 0"),
        ("ensemble_missed", "robust under the test ensemble at pgd_epsilon but broken by the PGD attack of robust_acc"),
    )

    def _masking_step(self, x: Tensor, ids: Tensor, batch_idx: int, ensemble_robust: Tensor, pgd_hits: Tensor,
                      stats, row) -> None:
        """``test_masking_checks``: one test batch's gradient-masking numbers (:attr:`MASKING_COLUMNS`);
        ``ensemble_robust`` / ``pgd_hits``: the batch's images robust under the test ensemble and
        under the PGD attack of ``robust_acc``, both at ``pgd_epsilon``."""
        from ..attacks import robust_accuracy, zero_gradient

        unbounded = robust_accuracy(self, x, ids, eps=1.0, attacks=("apgd-ce",), batch_size=x.shape[0],
                                    seed=self.pgd_seed + batch_idx, clip=(0.0, 1.0), n_iter=self.test_attack["n_iter"],
                                    predict=lambda out: predict_scores(self.loss, out)).robust
        values = {"robust_acc_unbounded": unbounded, "zero_grad_frac": zero_gradient(self, x, ids),
                  "ensemble_missed": ensemble_robust & ~pgd_hits.to(ensemble_robust.device)}
        for name, _ in self.MASKING_COLUMNS:
            stats[name].update(values[name].float())
            self.log(f"test/{name}", stats[name], on_step=False, on_epoch=True)
            if row is not None:
                row[name] = values[name]

    # -- per-item test records (lightning_modules.records) ---------------------------------------
    def _item_row(self, records, n: int, dataloader_idx: int, probs: Tensor, scores: Tensor, logits: Tensor,
                  ids: Tensor) -> Dict[str, Tensor]:
        """The per-item columns of one test batch (:meth:`item_record_spec`)."""
        from ..confidence import NLL_EPS

        p64 = probs.detach().double()
        p_true = p64.gather(1, ids[:, None]).squeeze(1)
        pred = scores.argmax(1)
        conf, prob_pred = probs.detach().max(dim=1)  # as torchmetrics' calibration error bins them
        row = {"item": records.positions(n, dataloader_idx), "target": ids, "pred": pred, "correct": pred == ids,
               "p_true": p_true, "nll": -torch.log(p_true.clamp_min(NLL_EPS)), "nll_zero": p_true <= 0,
               "confidence": p64.max(dim=1).values, "ece_confidence": conf.float(), "ece_correct": prob_pred == ids}
        if self.num_classes > 5:
            row["top5"] = (scores.topk(5, dim=1).indices == ids[:, None]).any(1)
        if self.sparse_probabilities:
            row["sparsemax_support"] = sparsemax_support_size(logits).float()
            row["support"] = (probs > 0).sum(1).float()
        return row

    def item_record_spec(self) -> Dict[str, Any]:
        """Per-item test records: one row per test image (``lightning_modules.records``)."""
        cols = {
            "item": "index of the image in the test split (the test loader's order)",
            "target": "true class (argmax of a soft label)",
            "pred": "predicted class (the loss's own prediction rule)",
            "correct": "top-1 hit: pred == target",
            "top5": "the target among the 5 best-ranked classes (more than 5 classes only)",
            "p_true": "probability of the true class under the loss's predictive distribution",
            "nll": "-log(max(p_true, 1e-12))",
            "nll_zero": "p_true == 0 (a sparse distribution gave the target probability 0)",
            "confidence": "maximum predictive probability, float64 (AURC's confidence)",
            "ece_confidence": "maximum predictive probability, float32 (ECE's binned confidence)",
            "ece_correct": "argmax of the predictive distribution == target (ECE's accuracy)",
            "sparsemax_support": "|support of sparsemax(logits)| (sparse distributions only)",
            "support": "number of classes with probability > 0 (sparse distributions only)",
        }
        metrics: Dict[str, Dict[str, Any]] = {
            "test/top1": {"agg": "mean", "columns": ["correct"]},
            "test/balanced_acc": {"agg": "class_mean", "columns": ["correct", "target"]},
            "test/ece": {"agg": "ece", "columns": ["ece_confidence", "ece_correct"],
                         "bins": int(self.eval_metrics["test"]["ece"].n_bins)},
            "test/nll": {"agg": "mean", "columns": ["nll"]},
            "test/nll_zero_frac": {"agg": "mean", "columns": ["nll_zero"]},
            "test/aurc": {"agg": "aurc", "columns": ["confidence", "correct"]},
        }
        if self.num_classes > 5:
            metrics["test/top5"] = {"agg": "mean", "columns": ["top5"]}
        for c in range(self.num_classes):
            metrics[f"test/acc_class_{c}"] = {"agg": "class_mean", "columns": ["correct", "target"], "classes": [c]}
        if self._tail_classes:
            tail = [c for c in range(self.num_classes) if c in self._tail_classes]
            head = [c for c in range(self.num_classes) if c not in self._tail_classes]
            for name, classes in (("head", head), ("tail", tail)):
                metrics[f"test/acc_{name}"] = {"agg": "class_mean", "columns": ["correct", "target"],
                                               "classes": classes}
        if self.sparse_probabilities:
            for name in ("sparsemax_support", "support"):
                metrics[f"test/{name}"] = {"agg": "mean", "columns": [name]}
        if self.robust_eval:
            for _, name, _ in self._attacks:
                cols[name] = f"top-1 hit on the PGD adversarial example of {name}"
                metrics[f"test/{name}"] = {"agg": "mean", "columns": [name]}
        for _, name, _ in self._ensemble:
            cols[name] = f"robust under every test attack ({', '.join(self.test_attacks)}) at the radius of {name}"
            metrics[f"test/{name}"] = {"agg": "mean", "columns": [name]}
        if self.test_masking_checks:
            for name, what in self.MASKING_COLUMNS:
                cols[name] = what
                metrics[f"test/{name}"] = {"agg": "mean", "columns": [name]}
        for m in metrics.values():
            m["table"] = "items"
        return {"kind": "classifier", "tables": {"items": {"columns": cols}}, "metrics": metrics,
                "tail_classes": list(self._tail_classes),
                "notes": "not per item: loss (batch means of the loss), cos_intra / cos_inter (pairs of "
                         "items), the OOD AUROCs (against the OOD sets) and the loss's own scale / "
                         "concentrations"}

    def _eval_epoch_end(self, stage: str) -> None:
        per_class_metric = self.eval_stats[stage]["per_class"]
        per_class = per_class_metric.compute()
        out: Dict[str, Tensor] = {}
        for c, v in enumerate(per_class):
            if not torch.isnan(v):
                out[f"{stage}/acc_class_{c}"] = v.float()
        if self._tail_classes:
            tail = [c for c in range(self.num_classes) if c in self._tail_classes]
            head = [c for c in range(self.num_classes) if c not in self._tail_classes]
            for name, classes in (("head", head), ("tail", tail)):
                v = PerClassAccuracy.split(per_class, classes)
                if not torch.isnan(v):
                    out[f"{stage}/acc_{name}"] = v.float()
        per_class_metric.reset()
        cos_metric = self.eval_stats[stage]["feature_cos"]
        for k, v in cos_metric.compute().items():
            if not torch.isnan(v):
                out[f"{stage}/cos_{k}"] = v.float()
        cos_metric.reset()
        out.update(self._confidence_metrics(stage))
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if stage == "test" and callable(getattr(dm, "floor_metrics", None)):  # a trained reference, same split
            for k, v in dm.floor_metrics(stage).items():
                if math.isfinite(v):
                    out[f"test/{k}"] = torch.tensor(float(v), dtype=torch.float32, device=self.device)
        with torch.no_grad():  # a head's own scale / concentrations (WCDAS), as trained so far
            if callable(getattr(self.loss, "effective_scale", None)):
                out[f"{stage}/loss_scale"] = self.loss.effective_scale().detach().float().reshape(())
            if callable(getattr(self.loss, "concentration", None)):
                rho = self.loss.concentration().detach().float().flatten()
                out[f"{stage}/loss_rho_mean"] = rho.mean()
                out[f"{stage}/loss_rho_min"] = rho.min()
                out[f"{stage}/loss_rho_max"] = rho.max()
                for c, v in enumerate(rho):
                    out[f"{stage}/loss_rho_{c}"] = v
        if out:  # already reduced over ranks by the metrics' own sync; sync_dist averages equal values
            self.log_dict(out, sync_dist=True)


    # -- confidence metrics ---------------------------------------------------------------------
    def _gathered(self, t: Tensor) -> Tensor:
        """``t`` from every rank, concatenated (under DDP a DistributedSampler's padding repeats a few
        samples); the tensor itself in one process."""
        if self._trainer is None or self.trainer.world_size <= 1:
            return t
        g = self.all_gather(t)
        return g.reshape(-1, *t.shape[1:])

    OOD_PREFIX = {"digits8x8": "ood", "uniform_noise": "ood_noise"}

    def _confidence_metrics(self, stage: str) -> Dict[str, Tensor]:
        buf = self._confidence_buffers[stage]
        self._confidence_buffers[stage] = {}
        if not buf.get("target"):
            return {}
        probs = self._gathered(torch.cat(buf["probs"]))
        logits = self._gathered(torch.cat(buf["logits"]))
        pred = self._gathered(torch.cat(buf["pred"]))
        target = self._gathered(torch.cat(buf["target"]))
        nll, zero = negative_log_likelihood(probs, target)
        msp_in = msp_score(probs)
        out = {f"{stage}/nll": nll, f"{stage}/nll_zero_frac": zero, f"{stage}/aurc": aurc(msp_in, pred == target)}
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        # at test only: a validation pass per epoch (the learning curves) would score the OOD sets
        # every epoch, more than doubling an MNIST-5k evaluation run, and nothing selects on them
        sets = dm.ood_sets() if stage == "test" and callable(getattr(dm, "ood_sets", None)) else {}
        if sets:
            energy_in = energy_score(logits)
            bs = int(getattr(dm, "eval_batch_size", None) or getattr(dm, "batch_size", 256) or 256)
            with torch.no_grad():
                for name, images in sets.items():
                    chunks = [self(images[i:i + bs].to(self.device)) for i in range(0, images.shape[0], bs)]
                    ood_logits = torch.cat(chunks)
                    ood_probs = predict_proba(self.loss, ood_logits)
                    prefix = self.OOD_PREFIX.get(name, f"ood_{name}")
                    out[f"{stage}/{prefix}_auroc_msp"] = ood_auroc(msp_in, msp_score(ood_probs))
                    out[f"{stage}/{prefix}_auroc_energy"] = ood_auroc(energy_in, energy_score(ood_logits))
        return {k: torch.tensor(float(v), dtype=torch.float32, device=self.device) for k, v in out.items()}


class VisionSegmenter(BenchmarkModule):
    """Semantic segmentation of the digits maps: timm ``features_only`` backbone, a 1x1
    convolution head and bilinear upsampling to ``(N, num_classes, H, W)`` logits.

    Args:
        loss: a logits loss (kind ``"logits"``; Dice semimetric, soft Dice, cross-entropy, ...) taking
            ``(N, C, H, W)`` logits and ``(N, H, W)`` ids or ``(N, C, H, W)`` soft labels.
        backbone: timm model name (``pretrained=False``, ``features_only=True``).
        feature_index: which feature level feeds the head (timm ``out_indices``; 1 = stride 4,
            i.e. 8x8 maps for 32x32 inputs: the resolution of the original digits).
        num_classes / in_chans: linked from the DataModule (11 / 1).
        input_skip: ``0`` (default): the head is the 1x1 convolution of the upsampled features.
            ``k > 0``: a skip connection from the input, as in U-Net's last stage: the features,
            upsampled to the input's resolution, are concatenated with the input image and refined
            by a 3x3 convolution to ``k`` channels, ReLU and a 1x1 convolution to the classes, so
            the head can draw boundaries at the input's resolution while the class comes from the
            deep features (the stride-4 head alone cannot place a boundary finer than 4 pixels).
        global_context: ``0`` (default): none. ``k > 0``: an image-level branch, as DeepLabv3's
            image pooling: the backbone's deepest features, averaged over the image, through a
            linear layer to ``k`` channels and ReLU, broadcast to every pixel and concatenated with
            the features the head reads (before the input skip's refinement, where there is one).
            Every pixel then sees what the whole image shows (a digit's class is a property of the
            image, which stride-4 features of a small receptive field see only in part).
        init_seed / lr_schedule: as :class:`VisionClassifier` (the same initial weights for every
            loss; ``"cosine"`` anneals the learning rate to 0 over the fit's steps).
        pretrained_file: initialise the backbone's feature levels from a local weights file of the
            same timm architecture (never downloads; :func:`~lightning_modules.models.pretrained.load_pretrained_file`).
        loss_weight / ce_weight: the training objective is ``loss_weight * loss + ce_weight * CE``,
            CE the pixel-wise softmax cross-entropy against the same targets (class ids, or the soft
            labels as probabilities). Defaults ``1.0`` / ``0.0``: the loss alone. The Dice semimetric
            and Jaccard metric papers' released code trains a region loss beside cross-entropy,
            ``loss_weight=0.75, ce_weight=0.25``: a region loss alone can settle on predicting the
            largest class (here the background) everywhere, which the pixel-wise term keeps away from.

    Metrics: ``loss`` (the objective; with ``ce_weight > 0`` also ``main_loss``, the loss alone, and
    ``ce_loss``); ``dice`` (torchmetrics ``DiceScore``: per-class Dice over the whole set,
    macro mean, background included) in every stage; in val/test also ``dice_fg`` (without
    background), ``miou`` (the Jaccard index per class over the whole set, intersection over union
    of the predicted and true pixels, macro mean, background included; a class absent from both
    the predictions and the targets is left out of the mean), ``pixel_acc`` and ``ece`` (pixel-level expected calibration error of the
    loss's predictive distribution). Metrics compare with the hard map (argmax of soft labels); the
    predicted map is the argmax of :func:`~lightning_modules.routing.predict_scores` (the loss's
    own ``predict_proba`` where it has one, else the logits). With a DataModule built with
    ``linear_probe=True``, the test also logs its trained reference on the same split
    (``test/dice_linear``, ``test/dice_fg_linear``, ``test/miou_linear``, ``test/pixel_acc_linear``:
    an ink threshold and a linear probe's image class), the competence floors.
    """

    loss_example = "losses.SoftDiceLoss()"

    def __init__(
        self,
        loss: nn.Module,
        backbone: str = "resnet10t",
        num_classes: int = 0,
        in_chans: int = 1,
        feature_index: int = 1,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        ece_bins: int = 15,
        backbone_kwargs: Optional[Dict[str, Any]] = None,
        init_seed: Optional[int] = None,
        lr_schedule: str = "constant",
        pretrained_file: Optional[str] = None,
        input_skip: int = 0,
        global_context: int = 0,
        loss_weight: float = 1.0,
        ce_weight: float = 0.0,
    ) -> None:
        super().__init__(loss, lr=lr, weight_decay=weight_decay)
        cls = "VisionSegmenter"
        for name, value in (("loss_weight", loss_weight), ("ce_weight", ce_weight)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{cls}: {name} must be a finite number >= 0 (got {value!r}); the objective is "
                                 "loss_weight * loss + ce_weight * cross-entropy, e.g. 0.75 and 0.25")
        if loss_weight == 0:
            raise ValueError(f"{cls}: loss_weight must be > 0 (got {loss_weight!r}): the model's loss must act; "
                             "to train cross-entropy alone pass loss=losses.CrossEntropyLoss()")
        self.loss_weight = float(loss_weight)
        self.ce_weight = float(ce_weight)
        if isinstance(input_skip, bool) or not isinstance(input_skip, int) or input_skip < 0:
            raise ValueError(f"{cls}: input_skip must be an int >= 0 (got {input_skip!r}); 0 = no skip "
                             "connection, e.g. 32 = refine the upsampled features with the input in 32 channels")
        if isinstance(global_context, bool) or not isinstance(global_context, int) or global_context < 0:
            raise ValueError(f"{cls}: global_context must be an int >= 0 (got {global_context!r}); 0 = none, e.g. "
                             "64 = the image's pooled deepest features in 64 channels beside every pixel's")
        self.input_skip = input_skip
        self.global_context = global_context
        if lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"{cls}: lr_schedule must be 'constant' or 'cosine' (got {lr_schedule!r}); "
                             "cosine anneals the learning rate to 0")
        self.lr_schedule = lr_schedule
        _positive(cls, "num_classes", num_classes, "link it from the DataModule (the CLI does) or pass it")
        _positive(cls, "in_chans", in_chans, "digits images have 1 channel")
        timm = _timm()
        with seeded_init(init_seed):  # the same start for every loss (paired comparisons)
            levels = (feature_index, -1) if global_context else (feature_index,)
            self.backbone = timm.create_model(backbone, pretrained=False, in_chans=in_chans, features_only=True,
                                              out_indices=levels, **(backbone_kwargs or {}))
            feat = self.backbone.feature_info.channels()[0]
            self.context = None
            if global_context:
                self.context = nn.Sequential(nn.Linear(self.backbone.feature_info.channels()[-1], global_context),
                                             nn.ReLU())
                feat += global_context
            if input_skip:
                self.head = nn.Sequential(nn.Conv2d(feat + in_chans, input_skip, kernel_size=3, padding=1), nn.ReLU(),
                                          nn.Conv2d(input_skip, num_classes, kernel_size=1))
            else:
                self.head = nn.Conv2d(feat, num_classes, kernel_size=1)
        self.loss = loss
        self.num_classes = num_classes
        if pretrained_file is not None:  # the feature levels the head uses, from a full backbone's weights
            load_pretrained_file(self.backbone, pretrained_file, allow_unexpected=True)

        self.train_metrics = segmentation_metrics(num_classes, full=False).clone(prefix="train/")
        self.eval_metrics = nn.ModuleDict({
            stage: segmentation_metrics(num_classes, full=True, ece_bins=ece_bins).clone(prefix=f"{stage}/")
            for stage in ("val", "test")})

    def check_route(self, route: LossRoute) -> None:
        """Only dense logits losses (kind ``"logits"``) that train alone and own no head."""
        if route.kind != InputKind.LOGITS or route.auxiliary or route.owns_head:
            raise ValueError(f"VisionSegmenter: the segmenter routes dense logits losses (kind 'logits') only "
                             f"(got kind {route.kind!r} for {route.loss_name}); use a Dice / Jaccard / "
                             "cross-entropy loss")

    def configure_optimizers(self) -> Any:
        import math

        opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        if self.lr_schedule == "constant":
            return opt
        total = max(1, int(self.trainer.estimated_stepping_batches))
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: 0.5 * (1.0 + math.cos(math.pi * min(1.0, step / total))))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def forward(self, x: Tensor) -> Tensor:
        levels = self.backbone(x)
        feats = levels[0]
        if self.context is not None:  # the image-level branch, broadcast to every position
            ctx = self.context(levels[-1].mean(dim=(-2, -1)))
            feats = torch.cat([feats, ctx[:, :, None, None].expand(-1, -1, *feats.shape[-2:])], dim=1)
        if self.input_skip:  # upsample the features, then refine them with the input at its resolution
            up = F.interpolate(feats, size=x.shape[-2:], mode="bilinear", align_corners=False)
            return self.head(torch.cat([up, x], dim=1))
        return F.interpolate(self.head(feats), size=x.shape[-2:], mode="bilinear", align_corners=False)

    def _step(self, stage: str, batch) -> Tensor:
        x, target = batch
        logits = self(x)
        main = self.loss(logits, target)
        loss = self.loss_weight * main  # exact for the default weight 1
        kw = dict(on_step=stage == "train", on_epoch=True, batch_size=x.shape[0], sync_dist=True)
        if self.ce_weight:
            ce = F.cross_entropy(logits.float(), target.float() if target.is_floating_point() else target)
            loss = loss + self.ce_weight * ce
            self.log(f"{stage}/main_loss", main.detach(), **kw)
            self.log(f"{stage}/ce_loss", ce.detach(), **kw)
        self.log(f"{stage}/loss", loss.detach(), prog_bar=True, **kw)
        ids = _hard_target(target)
        preds = predict_scores(self.loss, logits.detach()).argmax(1)  # the loss's own rule, else the logits'
        metrics = self.train_metrics if stage == "train" else self.eval_metrics[stage]
        update_segmentation_metrics(metrics, preds, ids, lambda: predict_proba(self.loss, logits.detach()))
        self.log_dict(metrics, on_step=False, on_epoch=True)
        return loss

    def training_step(self, batch, batch_idx: int) -> Tensor:
        return self._step("train", batch)

    def _eval_epoch_end(self, stage: str) -> None:
        """At test: the DataModule's trained reference on the same split (``floor_metrics``: an ink
        threshold and a linear probe's image class), logged as ``test/dice_linear`` etc."""
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if stage != "test" or not callable(getattr(dm, "floor_metrics", None)):
            return
        out = {f"test/{k}": torch.tensor(float(v), dtype=torch.float32, device=self.device)
               for k, v in dm.floor_metrics(stage).items() if math.isfinite(v)}
        if out:
            self.log_dict(out, sync_dist=True)

    def _eval_step(self, stage: str, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._step(stage, batch)
        records = self._item_records(stage)
        if records is not None:
            self._record_items(records, batch, dataloader_idx)

    # -- per-item test records (lightning_modules.records) ---------------------------------------
    @torch.no_grad()
    def _record_items(self, records, batch, dataloader_idx: int) -> None:
        """Per-image pixel counts per class (what the set-level Dice / IoU sum over images)."""
        x, target = batch
        ids = _hard_target(target)
        preds = predict_scores(self.loss, self(x)).argmax(1)
        n, c = ids.shape[0], self.num_classes
        flat_p, flat_t = preds.reshape(n, -1), ids.reshape(n, -1)
        base = (torch.arange(n, device=ids.device) * c)[:, None]

        def counts(values: Tensor, mask: Optional[Tensor] = None) -> Tensor:
            v = (values + base).reshape(-1)
            if mask is not None:
                v = v[mask.reshape(-1)]
            return torch.bincount(v, minlength=n * c).reshape(n, c)

        inter = counts(flat_t, flat_p == flat_t)
        pred_px, true_px = counts(flat_p), counts(flat_t)
        union = pred_px + true_px - inter
        present = union > 0
        dice_img = torch.where(present, 2 * inter / (pred_px + true_px).clamp_min(1), torch.zeros_like(inter, dtype=torch.float))
        iou_img = torch.where(present, inter / union.clamp_min(1), torch.zeros_like(inter, dtype=torch.float))
        k = present.sum(1).clamp_min(1)
        records.add("images", item=records.positions(n, dataloader_idx), intersection=inter, pred_pixels=pred_px,
                    true_pixels=true_px, correct_pixels=(flat_p == flat_t).sum(1), pixels=torch.full(
                        (n,), flat_t.shape[1], dtype=torch.long),
                    dice=dice_img.sum(1) / k, iou=iou_img.sum(1) / k)

    def item_record_spec(self) -> Dict[str, Any]:
        """Per-item test records: one row per test image (``lightning_modules.records``)."""
        cols = {
            "item": "index of the image in the test split (the test loader's order)",
            "intersection": "(classes,) pixels predicted as the class and labelled with it",
            "pred_pixels": "(classes,) pixels predicted as the class",
            "true_pixels": "(classes,) pixels labelled with the class",
            "correct_pixels": "pixels whose predicted class is the label",
            "pixels": "pixels of the image",
            "dice": "the image's own Dice: mean over the classes present in its prediction or label",
            "iou": "the image's own IoU: mean over the classes present in its prediction or label",
        }
        t = "images"
        metrics = {
            "test/dice": {"table": t, "agg": "set_ratio", "columns": ["intersection", "pred_pixels", "true_pixels"],
                          "scale": 2.0},
            "test/dice_fg": {"table": t, "agg": "set_ratio", "columns": ["intersection", "pred_pixels", "true_pixels"],
                             "scale": 2.0, "first_class": 1},
            "test/miou": {"table": t, "agg": "set_ratio", "columns": ["intersection", "pred_pixels", "true_pixels"],
                          "subtract": 1.0},
            "test/pixel_acc": {"table": t, "agg": "ratio", "columns": ["correct_pixels", "pixels"]},
        }
        return {"kind": "segmentation", "tables": {t: {"columns": cols}}, "metrics": metrics,
                "notes": "dice / dice_fg / miou are set-level: per class the sums over images, then the mean "
                         "over the classes with pixels in the predictions or labels (resample rows, then "
                         "aggregate); the per-image dice / iou columns are the images' own scores and do not "
                         "average to them. Not per item: loss (batch means), ece (pixel-level bins)"}
