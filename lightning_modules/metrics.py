"""Classification, calibration, robustness and feature-geometry metrics of the vision benchmarks.

torchmetrics where it has the metric (top-k / balanced accuracy, ECE, Dice score); small
``torchmetrics.Metric`` subclasses with sum-reduced states (so they sync across DDP ranks) where
it does not:

* :class:`PerClassAccuracy` -- per-class recall with ``nan`` for classes absent from the data
  seen, plus head/tail means.
* :class:`FeatureCosine` -- the exact mean intra-class and inter-class cosine similarity of
  features over all pairs of the evaluated set, from per-class sums of normalised features.

the stage collections :func:`classification_metrics` and :func:`segmentation_metrics` (the latter
updated by :func:`update_segmentation_metrics`, shared by the segmenter and the segmentation
competence floor so both are scored alike), and functions: :func:`hard_target`, :func:`sparsemax_support_size`, :func:`predictive_probabilities` (the loss's own
predictive distribution when it exposes ``predict_proba``, else softmax; an alias of
:func:`lightning_modules.routing.predict_proba`) and :func:`pgd_attack`
(l-inf / l2 PGD on cross-entropy, for robust accuracy), and :func:`peak_rss_mb` (the process's peak
resident memory, which the identity and language-model benchmarks report).
"""

from __future__ import annotations

import sys
from typing import Callable, Dict, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassCalibrationError, MulticlassJaccardIndex
from torchmetrics.segmentation import DiceScore

from .routing import predict_proba

__all__ = [
    "PerClassAccuracy",
    "BalancedAccuracy",
    "FeatureCosine",
    "sparsemax_support_size",
    "predictive_probabilities",
    "pgd_attack",
    "classification_metrics",
    "segmentation_metrics",
    "update_segmentation_metrics",
    "hard_target",
    "peak_rss_mb",
]


# --------------------------------------------------------------------------------------------
# metric objects
# --------------------------------------------------------------------------------------------
class PerClassAccuracy(Metric):
    """Per-class accuracy (recall) ``correct_c / count_c``; ``nan`` for a class never seen.

    ``compute()`` returns the ``(C,)`` vector; :meth:`split` gives the mean over given classes,
    ignoring absent ones (head / tail accuracy on digits-LT).
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, num_classes: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_classes = int(num_classes)
        self.add_state("correct", default=torch.zeros(self.num_classes, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros(self.num_classes, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:  # preds: logits (N, C) or ids (N,)
        if preds.dim() == target.dim() + 1:
            preds = preds.argmax(1)
        preds, target = preds.flatten(), target.flatten()
        valid = (target >= 0) & (target < self.num_classes)
        preds, target = preds[valid], target[valid]
        self.count += torch.bincount(target, minlength=self.num_classes).to(self.count)
        self.correct += torch.bincount(target[preds == target], minlength=self.num_classes).to(self.correct)

    def compute(self) -> Tensor:
        acc = self.correct / self.count
        return torch.where(self.count > 0, acc, torch.full_like(acc, float("nan")))

    @staticmethod
    def split(per_class: Tensor, classes: Sequence[int]) -> Tensor:
        """Mean accuracy over ``classes`` that were seen (``nan`` if none was)."""
        sel = per_class[list(classes)]
        sel = sel[~torch.isnan(sel)]
        return sel.mean() if sel.numel() else torch.tensor(float("nan"), dtype=per_class.dtype)


class BalancedAccuracy(PerClassAccuracy):
    """Balanced accuracy: the mean per-class recall over the classes present in the targets
    (``sklearn.metrics.balanced_accuracy_score``). A class absent from the targets does not
    count, also when it is predicted (torchmetrics' macro accuracy would count it as recall 0);
    ``nan`` before any target."""

    def compute(self) -> Tensor:  # type: ignore[override]
        per_class = super().compute()
        return self.split(per_class, range(self.num_classes))


class FeatureCosine(Metric):
    """Mean intra-class and inter-class cosine of features over all ordered pairs ``i != j``.

    With ``u_i = f_i / ||f_i||`` and per-class sums ``S_c = sum_{y_i = c} u_i``, ``n_c`` members
    (zero features count as ``u = 0``; ``z`` = number of non-zero features per class):
    ``intra = sum_c (||S_c||^2 - z_c) / sum_c n_c (n_c - 1)`` and
    ``inter = (||sum_c S_c||^2 - sum_c ||S_c||^2) / (n^2 - sum_c n_c^2)``, exactly the means of
    ``<u_i, u_j>`` over same-class and different-class pairs (the quantities OPL acts on).
    """

    full_state_update = False

    def __init__(self, num_classes: int, dim: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_classes = int(num_classes)
        self.dim = int(dim)
        self.add_state("sums", default=torch.zeros(self.num_classes, self.dim, dtype=torch.float64),
                       dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros(self.num_classes, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("nonzero", default=torch.zeros(self.num_classes, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, features: Tensor, target: Tensor) -> None:
        valid = (target >= 0) & (target < self.num_classes)
        f, y = features[valid].detach().double(), target[valid]
        norm = f.norm(dim=1, keepdim=True)
        u = f / norm.clamp_min(1e-12)
        self.sums.index_add_(0, y, u)
        self.count += torch.bincount(y, minlength=self.num_classes).to(self.count)
        self.nonzero += torch.bincount(y[norm.flatten() > 0], minlength=self.num_classes).to(self.nonzero)

    def compute(self) -> Dict[str, Tensor]:
        nan = torch.tensor(float("nan"), dtype=torch.float64, device=self.count.device)
        sq = (self.sums * self.sums).sum(1)
        n = self.count.sum()
        intra_pairs = (self.count * (self.count - 1)).sum()
        inter_pairs = n * n - (self.count * self.count).sum()
        total = self.sums.sum(0)
        intra = (sq - self.nonzero).sum() / intra_pairs if intra_pairs > 0 else nan
        inter = ((total * total).sum() - sq.sum()) / inter_pairs if inter_pairs > 0 else nan
        return {"intra": intra, "inter": inter}


def classification_metrics(num_classes: int, *, full: bool, ece_bins: int = 15) -> MetricCollection:
    """torchmetrics objects of one stage: ``top1`` (+ ``top5``, ``balanced_acc``, ``ece`` when
    ``full``). ``top5`` only with more than 5 classes (with 5 or fewer it is 1.0 whatever the
    model does). ``ece`` expects probabilities."""
    metrics: Dict[str, Metric] = {"top1": MulticlassAccuracy(num_classes, top_k=1, average="micro")}
    if full:
        if num_classes > 5:
            metrics["top5"] = MulticlassAccuracy(num_classes, top_k=5, average="micro")
        metrics["balanced_acc"] = BalancedAccuracy(num_classes)
        metrics["ece"] = MulticlassCalibrationError(num_classes, n_bins=ece_bins, norm="l1")
    # each metric is updated on its own (ECE takes probabilities): no shared compute groups
    return MetricCollection(metrics, compute_groups=False)


def segmentation_metrics(num_classes: int, *, full: bool, ece_bins: Optional[int] = 15) -> MetricCollection:
    """torchmetrics objects of one stage of a segmentation map over ``num_classes`` map classes:
    ``dice`` (torchmetrics ``DiceScore``, per class over the whole set, macro, background included);
    with ``full`` also ``dice_fg`` (background excluded), ``miou`` (Jaccard index per class over the
    whole set, macro) and ``pixel_acc``, and ``ece`` (pixel level, expects probabilities) unless
    ``ece_bins`` is ``None``. Update them with :func:`update_segmentation_metrics`."""

    def dice(include_background: bool) -> DiceScore:
        return DiceScore(num_classes=num_classes, include_background=include_background, average="macro",
                         aggregation_level="global", input_format="index")

    metrics: Dict[str, Metric] = {"dice": dice(True)}
    if full:
        metrics.update({"dice_fg": dice(False), "miou": MulticlassJaccardIndex(num_classes, average="macro"),
                        "pixel_acc": MulticlassAccuracy(num_classes, average="micro")})
        if ece_bins is not None:
            metrics["ece"] = MulticlassCalibrationError(num_classes, n_bins=ece_bins, norm="l1")
    return MetricCollection(metrics)


def update_segmentation_metrics(metrics: MetricCollection, preds: Tensor, ids: Tensor,
                                probs: Optional[Callable[[], Tensor]] = None) -> None:
    """Update :func:`segmentation_metrics` with predicted and true maps ``(N, H, W)`` of class ids
    (the Dice scores take the maps, the pixel metrics the flattened pixels); ``ece`` takes the
    ``(N, C, H, W)`` probabilities ``probs()`` returns, computed once and only if ``ece`` is there."""
    p: Optional[Tensor] = None
    for name, m in metrics.items(keep_base=True):
        if name.endswith("ece"):
            if p is None:
                assert probs is not None, "update_segmentation_metrics: ece needs probs"
                p = probs()
            m.update(p.movedim(1, -1).reshape(-1, p.shape[1]), ids.reshape(-1))
        elif name.endswith(("pixel_acc", "miou")):
            m.update(preds.reshape(-1), ids.reshape(-1))
        else:
            m.update(preds, ids)


# --------------------------------------------------------------------------------------------
# functions
# --------------------------------------------------------------------------------------------
def hard_target(target: Tensor, class_dim: int = 1) -> Tensor:
    """Class ids of a target: itself for integer ids, the argmax over classes for soft labels."""
    return target.argmax(class_dim) if target.is_floating_point() else target


def sparsemax_support_size(logits: Tensor, dim: int = 1) -> Tensor:
    """``|supp(sparsemax(z))|`` per row: ``max{k : 1 + k z_(k) > sum_{j<=k} z_(j)}`` with ``z``
    sorted decreasingly along ``dim`` (Martins & Astudillo, 2016). Returns int64, the class dim
    removed; rows of ``-inf`` masks count only finite entries."""
    z = logits.detach().movedim(dim, -1).double()
    z = torch.where(torch.isfinite(z), z, torch.full_like(z, -1e300))
    zs = z.sort(dim=-1, descending=True).values
    zs = zs - zs[..., :1]  # shift invariance, keeps the cumulative sums small
    k = torch.arange(1, zs.shape[-1] + 1, dtype=zs.dtype, device=zs.device)
    cond = 1 + k * zs > zs.cumsum(-1)
    return cond.sum(-1)  # the condition holds exactly for k = 1..k*


#: The loss's predictive distribution (its ``predict_proba`` where it has one, else softmax); its one
#: home is :func:`lightning_modules.routing.predict_proba`, next to :func:`~lightning_modules.routing.predict_scores`.
predictive_probabilities = predict_proba


def pgd_attack(
    model: Callable[[Tensor], Tensor],
    inputs: Tensor,
    target: Tensor,
    *,
    epsilon: float = 8 / 255,
    step_size: float = 2 / 255,
    steps: int = 10,
    norm: str = "linf",
    clip: Optional[tuple] = (0.0, 1.0),
    random_start: bool = True,
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    """Projected gradient ascent on ``cross_entropy(model(x'), target)`` within the ``epsilon``
    ball (Madry et al., 2018); returns detached adversarial inputs.

    ``norm="linf"`` steps ``step_size * sign(g)`` and projects onto the box; ``"l2"`` steps along
    ``g / ||g||`` per sample and projects onto the ball; inputs are clipped to ``clip``. The
    random start is uniform in the box (linf) / a scaled Gaussian direction (l2), drawn from
    ``generator`` (on the CPU, so results do not depend on the device). Gradients are taken
    with respect to the inputs only (``autograd.grad``): no parameter ``.grad`` is touched. The
    caller chooses the model's mode (evaluate in ``eval()``). Works inside Lightning's
    validation / test loops (inference mode is lifted locally).
    """
    if norm not in ("linf", "l2"):
        raise ValueError(f"pgd_attack: norm must be 'linf' or 'l2' (got {norm!r}); choose one of the two")
    if epsilon < 0 or steps < 0:
        raise ValueError(f"pgd_attack: epsilon and steps must be >= 0 (got {epsilon!r}, {steps!r}); pass e.g. 8/255, 10")
    with torch.inference_mode(False), torch.enable_grad():
        x0 = inputs.detach().clone()
        y = target.detach().clone()
        x = x0.clone()
        if random_start and epsilon > 0:
            if norm == "linf":
                noise = (torch.rand(x0.shape, generator=generator, dtype=torch.float32) * 2 - 1) * epsilon
            else:
                noise = torch.randn(x0.shape, generator=generator, dtype=torch.float32)
                noise = noise / noise.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *[1] * (x0.dim() - 1))
                noise = noise * epsilon * torch.rand(x0.shape[0], generator=generator).view(-1, *[1] * (x0.dim() - 1))
            x = x + noise.to(device=x0.device, dtype=x0.dtype)
        if clip is not None:
            x = x.clamp(*clip)
        for _ in range(int(steps)):
            x.requires_grad_(True)
            loss = F.cross_entropy(model(x).float(), y, reduction="sum")
            (grad,) = torch.autograd.grad(loss, x)
            with torch.no_grad():
                if norm == "linf":
                    x = x + step_size * grad.sign()
                    x = torch.max(torch.min(x, x0 + epsilon), x0 - epsilon)
                else:
                    shape = (-1, *[1] * (x0.dim() - 1))
                    g = grad / grad.flatten(1).norm(dim=1).clamp_min(1e-12).view(shape)
                    x = x + step_size * g
                    delta = x - x0
                    dn = delta.flatten(1).norm(dim=1).view(shape)
                    x = x0 + delta * torch.clamp(epsilon / dn.clamp_min(1e-12), max=1.0)
                if clip is not None:
                    x = x.clamp(*clip)
            x = x.detach()
    return x.detach()


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (``getrusage`` ``ru_maxrss``: KiB on
    Linux, bytes on macOS); ``nan`` where the platform has no ``resource`` module (Windows)."""
    try:
        import resource  # POSIX only
    except ImportError:  # pragma: no cover - Windows: no peak RSS without extra packages
        return float("nan")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2 ** 20 if sys.platform == "darwin" else rss / 2 ** 10
