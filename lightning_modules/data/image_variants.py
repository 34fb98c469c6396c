"""Splits and benchmark variants shared by the small image DataModules (digits, MNIST-5k).

A subclass only says where its images come from (:meth:`ImageSplitsDataModule._load`: ``(N, H, W)``
float32 in ``[0, 1]`` and ``(N,)`` int64 labels); everything else lives here:

* a stratified train / val / test split drawn from a generator seeded by ``seed``, or, with
  ``test_seed``, a test split drawn from ``test_seed`` alone (the same for every ``seed``: only the
  train / val split, the training order and the variants vary with ``seed``);
  :meth:`ImageSplitsDataModule.test_split_fingerprint` names the test split a run evaluated on;
* :class:`ClassificationVariantsDataModule`: the full, low-data (``train_fraction``), long-tailed
  (``imbalance_factor``: ``n_c = floor(n_max * IF ** (-c / (C - 1)))``, balanced val / test),
  label-noise (``noise_rate``, ``noise_type``) and soft-target variants, applied to the training
  split only; with ``linear_probe=True``, :meth:`ClassificationVariantsDataModule.floor_metrics`
  gives a trained reference on the same split (a multinomial logistic regression on the raw pixels
  of the training split as trained on: :func:`linear_probe_metrics`), the competence floor a
  network trained on that split must beat;
* :class:`SegmentationVariantsDataModule`: each image as a ``C + 1``-class segmentation map from
  its ink (background ``0``, the class ``y + 1`` on inked pixels), soft labels from the ink
  intensity or their threshold;
* :class:`SeededEpochSampler`: the training order, drawn from ``(seed, epoch)`` only, so every
  model trained with the same ``seed`` sees the same batches whatever else consumes the global RNG
  (a paired comparison of losses), and an optional class-balanced mode (every class equally likely,
  drawn with replacement) for the second stage of a two-stage long-tail protocol.
"""

from __future__ import annotations

import math
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, Sampler, TensorDataset

from ..base import BenchmarkDataModule, check_test_seed, split_fingerprint

__all__ = [
    "ASYMMETRIC_FLIPS",
    "split_fingerprint",
    "ClassificationVariantsDataModule",
    "ImageSplitsDataModule",
    "SeededEpochSampler",
    "SegmentationVariantsDataModule",
    "linear_probe_metrics",
    "segmentation_reference_metrics",
    "long_tailed_counts",
    "stratified_split",
    "stratified_split_fixed_test",
]

#: Class-dependent ("asymmetric") noise between visually similar digits, as in Patrini et al.
#: (CVPR 2017) for MNIST: 2 -> 7, 3 -> 8, 5 <-> 6, 7 -> 1. Other classes keep their labels.
ASYMMETRIC_FLIPS: Dict[int, int] = {2: 7, 3: 8, 5: 6, 6: 5, 7: 1}


def _check(cond: bool, cls: str, problem: str, got: object, hint: str) -> None:
    if not cond:
        raise ValueError(f"{cls}: {problem} (got {got!r}); {hint}")


#: The L2 strengths the linear probe chooses from on the validation split (largest first: each fit
#: starts from the previous one's weights).
PROBE_L2 = (1e-1, 1e-2, 1e-3, 1e-4)
#: Images larger than this side are average-pooled to it before the probe (32 x 32 -> 16 x 16: the
#: same test accuracy on MNIST-5k, 0.914 vs 0.912 at full size, in a seventh of the time).
PROBE_SIDE = 16


def _fit_softmax_regression(x: Tensor, y: Tensor, n_cls: int, l2: float, init: Optional[Tensor]) -> Tensor:
    """Weights ``(D + 1, C)`` (the last row the bias) of ``mean CE(softmax(x W + b), y) + l2/2 |W|^2``
    in float64 by L-BFGS (strong Wolfe line search); ``y`` class ids ``(N,)`` or distributions
    ``(N, C)``."""
    n, d = x.shape
    xb = torch.cat([x, x.new_ones(n, 1)], dim=1)
    target = F.one_hot(y, n_cls).to(x.dtype) if y.dim() == 1 else y.to(x.dtype)
    w = (init.clone() if init is not None else x.new_zeros(d + 1, n_cls)).requires_grad_(True)
    opt = torch.optim.LBFGS([w], lr=1.0, max_iter=300, tolerance_grad=1e-9, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        logp = torch.log_softmax(xb @ w, dim=1)
        loss = -(target * logp).sum(1).mean() + 0.5 * l2 * w[:-1].pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach()


def _class_accuracies(pred: Tensor, y: Tensor, n_cls: int) -> Tensor:
    """Per-class accuracy ``(C,)`` (``nan`` for a class without examples)."""
    hits = torch.bincount(y[pred == y], minlength=n_cls).double()
    counts = torch.bincount(y, minlength=n_cls).double()
    return torch.where(counts > 0, hits / counts.clamp_min(1), torch.full_like(hits, float("nan")))


def linear_probe_metrics(
    train: Tuple[Tensor, Tensor], val: Tuple[Tensor, Tensor], evaluate: Tuple[Tensor, Tensor],
    num_classes: int, tail_classes: Sequence[int] = (),
) -> Dict[str, float]:
    """A trained reference: multinomial logistic regression on raw pixels.

    Fits ``softmax(x W + b)`` on the flattened training images (average-pooled to at most
    :data:`PROBE_SIDE` pixels a side) and their targets as given (class ids
    or distributions: the noisy, long-tailed or low-data labels a network would train on) by
    L-BFGS in float64, once per L2 strength of :data:`PROBE_L2`, chooses the strength with the best
    validation top-1 (ties: the stronger), and scores ``evaluate``. Deterministic (no random state).

    Returns ``top1_linear``, ``balanced_acc_linear`` (mean per-class accuracy), and with
    ``tail_classes`` also ``acc_head_linear`` / ``acc_tail_linear``, plus ``l2_linear`` (the chosen
    strength)."""
    # the fit needs autograd even when called from a test or validation loop (inference mode)
    with torch.inference_mode(False), torch.enable_grad():
        return _linear_probe(train, val, evaluate, num_classes, tail_classes, _probe_flat)


#: Ink thresholds the segmentation reference chooses from (fitted on the training maps).
REFERENCE_THRESHOLDS = tuple(round(0.02 * k, 2) for k in range(1, 50))


def segmentation_reference_metrics(
    train: Tuple[Tensor, Tensor, Tensor], val: Tuple[Tensor, Tensor], evaluate: Tuple[Tensor, Tensor],
    num_classes: int,
) -> Dict[str, float]:
    """A trained reference for the ink segmentation maps: two linear models, no network.

    ``train`` = ``(images (N, 1, S, S), image classes (N,), hard maps (N, S, S))``, ``val`` = ``(images,
    image classes)``, ``evaluate`` = ``(images, hard maps)``. The reference predicts background where
    a pixel's intensity is at most ``t`` and, elsewhere, the class ``1 +`` the linear probe's class of
    the whole image (:func:`linear_probe_metrics`' multinomial logistic regression on the pooled raw
    pixels, its L2 strength chosen on ``val``). ``t`` is the threshold of :data:`REFERENCE_THRESHOLDS`
    with the best ink-vs-background pixel accuracy on the training maps (ties: the lower). Scored
    like the segmenter (torchmetrics, set level, macro over ``num_classes`` map classes, background
    included): ``dice_linear``, ``dice_fg_linear`` (background excluded), ``miou_linear``,
    ``pixel_acc_linear`` and ``threshold_linear`` (the chosen ``t``). What a segmenter must beat to
    have learned more than a threshold and a linear classifier."""
    from ..metrics import segmentation_metrics, update_segmentation_metrics

    x_tr, y_tr, maps_tr = train
    v = x_tr[:, 0].reshape(-1).double()
    ink = (maps_tr > 0).reshape(-1)
    accs = [float(((v > t) == ink).double().mean()) for t in REFERENCE_THRESHOLDS]
    t = REFERENCE_THRESHOLDS[max(range(len(accs)), key=lambda k: (accs[k], -k))]
    x_ev, maps_ev = evaluate
    with torch.inference_mode(False), torch.enable_grad():
        pred_cls, _ = _probe_predict((x_tr, y_tr), val, x_ev, num_classes - 1, _probe_flat)
    pred = torch.where(x_ev[:, 0] > t, (pred_cls + 1).view(-1, 1, 1), torch.zeros_like(pred_cls).view(-1, 1, 1))
    metrics = segmentation_metrics(num_classes, full=True, ece_bins=None)  # the segmenter's own metrics
    update_segmentation_metrics(metrics, pred, maps_ev.long())
    out = {f"{name}_linear": float(v) for name, v in metrics.compute().items()}
    out["threshold_linear"] = float(t)
    return out


def _probe_flat(x: Tensor) -> Tensor:
    if x.dim() == 4 and (x.shape[-2] > PROBE_SIDE or x.shape[-1] > PROBE_SIDE):
        x = F.adaptive_avg_pool2d(x, (min(x.shape[-2], PROBE_SIDE), min(x.shape[-1], PROBE_SIDE)))
    return x.reshape(x.shape[0], -1).double()


def _probe_predict(train, val, evaluate_x, num_classes, flat) -> Tuple[Tensor, float]:
    """The linear probe's class predictions on ``evaluate_x`` and its chosen L2 strength."""
    xtr, ytr = flat(train[0].clone()), train[1].clone()
    xva, yva = flat(val[0]), val[1]
    best: Optional[Tuple[float, float, Tensor]] = None
    w: Optional[Tensor] = None
    for l2 in PROBE_L2:
        w = _fit_softmax_regression(xtr, ytr, num_classes, l2, w)
        acc = float((torch.cat([xva, xva.new_ones(len(xva), 1)], 1) @ w).argmax(1).eq(yva).double().mean())
        if best is None or acc > best[0]:
            best = (acc, l2, w)
    assert best is not None
    _, l2, w = best
    xe = flat(evaluate_x)
    return (torch.cat([xe, xe.new_ones(len(xe), 1)], 1) @ w).argmax(1), float(l2)


def _linear_probe(train, val, evaluate, num_classes, tail_classes, flat) -> Dict[str, float]:
    pred, l2 = _probe_predict(train, val, evaluate[0], num_classes, flat)
    ye = evaluate[1]
    per_class = _class_accuracies(pred, ye, num_classes)
    out = {"top1_linear": float(pred.eq(ye).double().mean()),
           "balanced_acc_linear": float(per_class[~per_class.isnan()].mean()),
           "l2_linear": float(l2)}
    tail = [c for c in range(num_classes) if c in set(tail_classes)]
    if tail:
        head = [c for c in range(num_classes) if c not in set(tail)]
        for name, classes in (("head", head), ("tail", tail)):
            v = per_class[classes]
            out[f"acc_{name}_linear"] = float(v[~v.isnan()].mean())
    return out


def stratified_split(
    labels: Tensor, fractions: Tuple[float, ...], generator: torch.Generator
) -> List[Tensor]:
    """Split indices per class: part ``k`` gets ``round(fractions[k] * n_c)`` of class ``c``; the
    last part takes the rest. Returns sorted index tensors."""
    parts: List[List[Tensor]] = [[] for _ in range(len(fractions) + 1)]
    for c in torch.unique(labels).tolist():
        idx = torch.nonzero(labels == c).flatten()
        idx = idx[torch.randperm(idx.numel(), generator=generator)]
        start = 0
        for k, frac in enumerate(fractions):
            n = int(round(frac * idx.numel()))
            parts[k].append(idx[start:start + n])
            start += n
        parts[-1].append(idx[start:])
    return [torch.sort(torch.cat(p)).values for p in parts]


def stratified_split_fixed_test(
    labels: Tensor, test_fraction: float, val_fraction: float, test_generator: torch.Generator,
    generator: torch.Generator,
) -> List[Tensor]:
    """``[test, val, train]`` with the per-class sizes of ``stratified_split(labels, (test_fraction,
    val_fraction), g)``, but the test part of each class drawn from ``test_generator`` alone (so it is
    the same whatever ``generator`` is) and the val / train parts from ``generator``, among the
    class's remaining indices in ascending order. Returns sorted index tensors."""
    parts: List[List[Tensor]] = [[], [], []]
    for c in torch.unique(labels).tolist():
        idx = torch.nonzero(labels == c).flatten()
        n_test = int(round(test_fraction * idx.numel()))
        n_val = int(round(val_fraction * idx.numel()))
        perm = idx[torch.randperm(idx.numel(), generator=test_generator)]
        test = perm[:n_test]
        rest = torch.sort(perm[n_test:]).values
        rest = rest[torch.randperm(rest.numel(), generator=generator)]
        parts[0].append(test)
        parts[1].append(rest[:n_val])
        parts[2].append(rest[n_val:])
    return [torch.sort(torch.cat(p)).values for p in parts]


def long_tailed_counts(n_max: int, num_classes: int, imbalance_factor: float) -> List[int]:
    """``n_c = floor(n_max * IF ** (-c / (C - 1)))`` (at least 1), class 0 the head."""
    if num_classes == 1:
        return [n_max]
    return [max(1, int(math.floor(n_max * imbalance_factor ** (-c / (num_classes - 1))))) for c in range(num_classes)]


def _upsample(images: Tensor, size: int) -> Tensor:
    """``(N, h, w)`` -> ``(N, 1, size, size)``, bilinear, values stay in ``[0, 1]``."""
    x = images.unsqueeze(1)
    if size != x.shape[-1] or size != x.shape[-2]:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.clamp_(0.0, 1.0).contiguous()


class SeededEpochSampler(Sampler[int]):
    """Training order from ``(seed, epoch)`` alone; optionally class-balanced.

    Epoch ``e`` (set by Lightning through :meth:`set_epoch`; otherwise the number of completed
    iterations) yields ``torch.randperm(n)`` of a generator seeded with ``seed * 1_000_003 + e``.
    With ``class_balanced = True`` it yields ``n`` indices drawn with replacement so that each class
    present in ``labels`` is equally likely (class-balanced sampling, as in cRT), from the same
    generator. The mode can be switched between epochs; the DataLoader need not be rebuilt.
    """

    def __init__(self, labels: Tensor, seed: int) -> None:
        self.labels = labels.clone()
        self.seed = int(seed)
        self.epoch: Optional[int] = None
        self._iterations = 0
        self.class_balanced = False

    def __len__(self) -> int:
        return int(self.labels.numel())

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _generator(self) -> torch.Generator:
        e = self.epoch if self.epoch is not None else self._iterations
        return torch.Generator().manual_seed(self.seed * 1_000_003 + int(e))

    def indices(self) -> Tensor:
        g = self._generator()
        n = self.labels.numel()
        if not self.class_balanced:
            return torch.randperm(n, generator=g)
        classes = torch.unique(self.labels)
        counts = (self.labels.unsqueeze(1) == classes.unsqueeze(0)).sum(0).double()
        pos = torch.searchsorted(classes, self.labels)
        weights = 1.0 / counts[pos]  # each class sums to 1
        return torch.multinomial(weights, n, replacement=True, generator=g)

    def __iter__(self) -> Iterator[int]:
        idx = self.indices()
        self._iterations += 1
        return iter(idx.tolist())


class ImageSplitsDataModule(BenchmarkDataModule):
    """Loading, stratified splitting and loaders; subclasses implement :meth:`_load` and
    :meth:`_build` (the variant of the training split)."""

    _name = "ImageSplitsDataModule"

    def __init__(
        self,
        *,
        image_size: int,
        batch_size: int,
        eval_batch_size: Optional[int],
        val_fraction: float,
        test_fraction: float,
        shuffle: bool,
        num_workers: int,
        seed: int,
        test_seed: Optional[int] = None,
    ) -> None:
        super().__init__()
        cls = self._name
        _check(isinstance(image_size, int) and image_size >= 8, cls, "image_size must be an integer >= 8",
               image_size, "timm backbones need >= 32 pixels for 5 stride-2 stages; 32 is the default")
        _check(isinstance(batch_size, int) and batch_size >= 1, cls, "batch_size must be a positive integer",
               batch_size, "pass e.g. 64")
        _check(eval_batch_size is None or (isinstance(eval_batch_size, int) and eval_batch_size >= 1), cls,
               "eval_batch_size must be a positive integer or None", eval_batch_size, "None uses batch_size")
        for name, frac in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            _check(0.0 < frac < 1.0, cls, f"{name} must be in (0, 1)", frac, "pass e.g. 0.15")
        _check(val_fraction + test_fraction < 1.0, cls, "val_fraction + test_fraction must be below 1",
               val_fraction + test_fraction, "leave room for the training split")
        self.image_size = image_size
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.val_fraction = float(val_fraction)
        self.test_fraction = float(test_fraction)
        self.shuffle = bool(shuffle)
        self.num_workers = int(num_workers)
        self.seed = int(seed)
        self.test_seed = check_test_seed(cls, test_seed, "the test split")
        self.in_chans = 1
        self._test_indices: Optional[Tensor] = None
        self._splits: Optional[Dict[str, TensorDataset]] = None
        self._train_sampler: Optional[SeededEpochSampler] = None
        self._class_balanced = False

    # -- subclasses ---------------------------------------------------------------------------
    def _load(self) -> Tuple[Tensor, Tensor]:
        """``(images (N, H, W) float32 in [0, 1], labels (N,) int64)``, fresh copies."""
        raise NotImplementedError

    def _build(self, images: Tensor, labels: Tensor, split: Dict[str, Tensor], g: torch.Generator) -> Dict[str, TensorDataset]:
        raise NotImplementedError

    # -- Lightning hooks ----------------------------------------------------------------------
    def prepare_data(self) -> None:
        self._load()  # fails early, naming the package, when the data's package is missing

    def setup(self, stage: Optional[str] = None) -> None:
        if self._splits is not None:
            return
        images, labels = self._load()
        g = torch.Generator().manual_seed(self.seed)
        if self.test_seed is None:  # the test split varies with seed (revision 2's runs)
            test, val, train = stratified_split(labels, (self.test_fraction, self.val_fraction), g)
        else:  # one test split for every seed
            test, val, train = stratified_split_fixed_test(labels, self.test_fraction, self.val_fraction,
                                                           torch.Generator().manual_seed(self.test_seed), g)
        self._test_indices = test
        # pre-shuffle the training split once (seeded), so that ``shuffle=False`` still gives
        # mixed batches and a DDP run with ``shuffle=False`` sees the single-process batches
        train = train[torch.randperm(train.numel(), generator=g)]
        self._splits = self._build(images, labels, {"train": train, "val": val, "test": test}, g)

    # -- class-balanced sampling (stage 2 of the two-stage long-tail protocol) -----------------
    @property
    def class_balanced_sampling(self) -> bool:
        """Whether training batches are drawn class-balanced (with replacement)."""
        return self._class_balanced

    def set_class_balanced_sampling(self, enabled: bool = True) -> None:
        """Switch the training order to class-balanced sampling (or back), from the next epoch.

        Needs ``shuffle=True`` and a single process (the seeded sampler; under DDP the loaders
        shard with a ``DistributedSampler``, which has no class-balanced mode)."""
        if enabled and not self.shuffle:
            raise ValueError(f"{self._name}: class-balanced sampling needs shuffle=True (got shuffle=False); "
                             "it draws a fresh class-balanced sample each epoch")
        if enabled and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise RuntimeError(f"{self._name}: class-balanced sampling is single-process only (got world size "
                               f"{dist.get_world_size()}); run the second stage on one device")
        self._class_balanced = bool(enabled)
        if self._train_sampler is not None:
            self._train_sampler.class_balanced = self._class_balanced

    def _train_labels(self) -> Tensor:
        assert self._splits is not None
        y = self._splits["train"].tensors[1]
        return y.argmax(1) if y.is_floating_point() and y.dim() == 2 else y

    def _loader(self, split: str, train: bool) -> DataLoader:
        if self._splits is None:
            self.setup()
        assert self._splits is not None
        data = self._splits[split]
        shuffle = train and self.shuffle
        sampler: Optional[Sampler] = None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # shard explicitly (Lightning keeps a DistributedSampler it is given): its own sampler
            # would always shuffle the training split, ignoring ``shuffle``
            sampler = DistributedSampler(data, shuffle=shuffle, seed=self.seed, drop_last=False)
        elif shuffle:
            # the order depends on (seed, epoch) only: arms of a paired comparison see the same batches
            if self._train_sampler is None:
                self._train_sampler = SeededEpochSampler(self._train_labels(), self.seed)
            self._train_sampler.class_balanced = self._class_balanced
            sampler = self._train_sampler
        return DataLoader(
            data,
            batch_size=self.batch_size if train else self.eval_batch_size,
            shuffle=False,
            sampler=sampler,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False)

    def test_split_fingerprint(self) -> str:
        """:func:`split_fingerprint` of the test split's indices into the loaded images (after
        ``setup``; reading it runs ``setup`` first)."""
        if self._test_indices is None:
            self._splits = None
            self.setup()
        assert self._test_indices is not None
        return split_fingerprint(self._test_indices)

    def _cached_floor(self, stage: str, fit) -> Dict[str, float]:
        """``fit(train, val, evaluate)`` (each a split's tensors) once per ``stage``, cached in the
        subclass's ``_floors``; ``{}`` without ``linear_probe`` (nothing is fitted)."""
        if stage not in ("val", "test"):
            raise ValueError(f"{self._name}.floor_metrics: stage must be 'val' or 'test' (got {stage!r})")
        if not getattr(self, "linear_probe", False):
            return {}
        if stage not in self._floors:
            if self._splits is None:
                self.setup()
            assert self._splits is not None
            self._floors[stage] = fit(*(self._splits[k].tensors for k in ("train", "val", stage)))
        return dict(self._floors[stage])

    def split_sizes(self) -> Dict[str, int]:
        """Number of examples per split (after ``setup``)."""
        if self._splits is None:
            self.setup()
        assert self._splits is not None
        return {k: len(v) for k, v in self._splits.items()}


class ClassificationVariantsDataModule(ImageSplitsDataModule):
    """Classification with the full, low-data, long-tailed, label-noise and soft-target variants
    (argument meanings: :class:`~lightning_modules.data.DigitsDataModule`)."""

    _name = "ClassificationVariantsDataModule"
    _num_classes = 10

    def __init__(
        self,
        *,
        image_size: int,
        batch_size: int,
        eval_batch_size: Optional[int],
        val_fraction: float,
        test_fraction: float,
        train_fraction: float,
        imbalance_factor: float,
        noise_rate: float,
        noise_type: str,
        soft_targets: bool,
        soft_neighbours: int,
        shuffle: bool,
        num_workers: int,
        seed: int,
        test_seed: Optional[int] = None,
        linear_probe: bool = False,
    ) -> None:
        super().__init__(image_size=image_size, batch_size=batch_size, eval_batch_size=eval_batch_size,
                         val_fraction=val_fraction, test_fraction=test_fraction, shuffle=shuffle,
                         num_workers=num_workers, seed=seed, test_seed=test_seed)
        cls = self._name
        _check(isinstance(linear_probe, bool), cls, "linear_probe must be True or False", linear_probe,
               "True fits the linear-probe reference once, for floor_metrics")
        self.linear_probe = linear_probe
        self._floors: Dict[str, Dict[str, float]] = {}
        _check(0.0 < train_fraction <= 1.0, cls, "train_fraction must be in (0, 1]", train_fraction,
               "the low-data benchmark uses 0.1")
        _check(math.isfinite(imbalance_factor) and imbalance_factor >= 1.0, cls,
               "imbalance_factor must be a finite number >= 1", imbalance_factor,
               "1 is balanced; the long-tailed benchmarks use up to ~50")
        _check(0.0 <= noise_rate < 1.0, cls, "noise_rate must be in [0, 1)", noise_rate, "pass e.g. 0.4")
        _check(noise_type in ("symmetric", "asymmetric"), cls, "noise_type must be 'symmetric' or 'asymmetric'",
               noise_type, "choose one of the two")
        _check(isinstance(soft_neighbours, int) and soft_neighbours >= 1, cls,
               "soft_neighbours must be a positive integer", soft_neighbours, "pass e.g. 10")
        n_cls = self._num_classes
        self.train_fraction = float(train_fraction)
        self.imbalance_factor = float(imbalance_factor)
        self.noise_rate = float(noise_rate)
        self.noise_type = noise_type
        self.soft_targets = bool(soft_targets)
        self.soft_neighbours = soft_neighbours
        self.num_classes = n_cls
        # LT: n_c decreases with c, so the tail is the upper half of the class ids
        self.tail_classes: List[int] = list(range(n_cls - n_cls // 2, n_cls)) if self.imbalance_factor > 1.0 else []
        self._class_counts: Optional[Tensor] = None
        self.noise_mask: Optional[Tensor] = None  # True where a training label was changed

    def _build(self, images, labels, split, g):
        n_cls = self.num_classes
        train = split["train"]
        y = labels[train]
        keep: List[Tensor] = []
        if self.imbalance_factor > 1.0:
            n_max = min(int((y == c).sum()) for c in range(n_cls))
            counts = long_tailed_counts(n_max, n_cls, self.imbalance_factor)
        else:
            counts = [int((y == c).sum()) for c in range(n_cls)]
        for c in range(n_cls):
            pos = torch.nonzero(y == c).flatten()  # already in shuffled order
            n = counts[c]
            if self.train_fraction < 1.0:
                n = max(1, int(round(self.train_fraction * n)))
            keep.append(pos[:n])
        kept = torch.sort(torch.cat(keep)).values  # keep the pre-shuffled order
        train = train[kept]
        clean = labels[train].clone()
        noisy = self._add_noise(clean, g)
        self.noise_mask = noisy != clean
        self._class_counts = torch.bincount(noisy, minlength=n_cls)

        x = {k: _upsample(images[v], self.image_size) for k, v in (("train", train), ("val", split["val"]),
                                                                    ("test", split["test"]))}
        if self.soft_targets:
            y_train: Tensor = self._soft(images[train].flatten(1), noisy)
        else:
            y_train = noisy
        return {
            "train": TensorDataset(x["train"], y_train),
            "val": TensorDataset(x["val"], labels[split["val"]]),
            "test": TensorDataset(x["test"], labels[split["test"]]),
        }

    @property
    def class_counts(self) -> Tensor:
        """Per-class counts of the training split as trained on (after subsampling, the long tail and
        label noise): ``(num_classes,)`` int64. Read before ``setup`` (the CLI links it into a loss's
        ``class_counts`` / ``class_prior`` before the model is built), it runs ``setup`` first."""
        if self._class_counts is None:
            self.setup()
        assert self._class_counts is not None
        return self._class_counts

    def floor_metrics(self, stage: str) -> Dict[str, float]:
        """The trained reference on the ``stage`` ("val" or "test") split: :func:`linear_probe_metrics`
        fitted on this DataModule's training split (its targets as trained on), the L2 strength
        chosen on the validation split. Computed once per stage and cached; empty without
        ``linear_probe`` (nothing is fitted). The classifier logs them at test as
        ``test/top1_linear`` etc.: the competence floors of the claims file."""
        return self._cached_floor(stage, lambda tr, va, ev: linear_probe_metrics(
            (tr[0], tr[1]), (va[0], va[1]), (ev[0], ev[1]), self.num_classes, self.tail_classes))

    def _add_noise(self, y: Tensor, g: torch.Generator) -> Tensor:
        n_cls = self.num_classes
        y = y.clone()
        if self.noise_rate == 0.0:
            return y
        if self.noise_type == "symmetric":
            n = int(round(self.noise_rate * y.numel()))
            idx = torch.randperm(y.numel(), generator=g)[:n]
            shift = torch.randint(1, n_cls, (n,), generator=g)  # a different class, uniformly
            y[idx] = (y[idx] + shift) % n_cls
            return y
        clean = y.clone()  # select on the clean labels: a flipped 2 -> 7 is not flipped again to 1
        for src, dst in ASYMMETRIC_FLIPS.items():
            pos = torch.nonzero(clean == src).flatten()
            n = int(round(self.noise_rate * pos.numel()))
            idx = pos[torch.randperm(pos.numel(), generator=g)[:n]]
            y[idx] = dst
        return y

    def _soft(self, pixels: Tensor, y: Tensor) -> Tensor:
        k = min(self.soft_neighbours, pixels.shape[0] - 1)
        d = torch.cdist(pixels.double(), pixels.double())
        d.fill_diagonal_(-1.0)  # the image itself comes first
        nn_idx = d.topk(k + 1, dim=1, largest=False).indices
        votes = F.one_hot(y[nn_idx], self.num_classes).sum(1).float()
        return votes / votes.sum(1, keepdim=True)


class SegmentationVariantsDataModule(ImageSplitsDataModule):
    """Each image as a ``C + 1``-class segmentation map from its ink (argument meanings:
    :class:`~lightning_modules.data.DigitsSegmentationDataModule`)."""

    _name = "SegmentationVariantsDataModule"
    _num_classes = 10  # image classes; the maps have one more (background)

    def __init__(
        self,
        *,
        image_size: int,
        label_type: str,
        threshold: float,
        batch_size: int,
        eval_batch_size: Optional[int],
        val_fraction: float,
        test_fraction: float,
        shuffle: bool,
        num_workers: int,
        seed: int,
        test_seed: Optional[int] = None,
        linear_probe: bool = False,
    ) -> None:
        super().__init__(image_size=image_size, batch_size=batch_size, eval_batch_size=eval_batch_size,
                         val_fraction=val_fraction, test_fraction=test_fraction, shuffle=shuffle,
                         num_workers=num_workers, seed=seed, test_seed=test_seed)
        cls = self._name
        _check(label_type in ("soft", "hard"), cls, "label_type must be 'soft' or 'hard'", label_type,
               "soft labels come from the ink intensity, hard labels from its threshold")
        _check(0.0 < threshold < 1.0, cls, "threshold must be in (0, 1)", threshold, "pass e.g. 0.5")
        _check(isinstance(linear_probe, bool), cls, "linear_probe must be True or False", linear_probe,
               "True fits the segmentation reference once, for floor_metrics")
        self.label_type = label_type
        self.threshold = float(threshold)
        self.num_classes = self._num_classes + 1
        self.linear_probe = linear_probe
        self._floors: Dict[str, Dict[str, float]] = {}
        self._digits: Dict[str, Tensor] = {}

    def _train_labels(self) -> Tensor:  # maps have no single class: shuffle by position only
        assert self._splits is not None
        return torch.zeros(len(self._splits["train"]), dtype=torch.int64)

    @classmethod
    def segmentation_targets(cls, x: Tensor, digits: Tensor, threshold: float, label_type: str) -> Tensor:
        """Targets for images ``x (N, 1, S, S)`` of classes ``digits (N,)``: ``(N, S, S)`` ids or
        ``(N, C + 1, S, S)`` soft labels."""
        v = x[:, 0]
        if label_type == "hard":
            return torch.where(v > threshold, (digits + 1).view(-1, 1, 1), torch.zeros_like(digits).view(-1, 1, 1))
        soft = torch.zeros(x.shape[0], cls._num_classes + 1, *v.shape[1:], dtype=x.dtype)
        soft[:, 0] = 1.0 - v
        soft.scatter_(1, (digits + 1).view(-1, 1, 1, 1).expand(-1, 1, *v.shape[1:]), v.unsqueeze(1))
        return soft

    def _build(self, images, labels, split, g):
        out = {}
        for name, idx in split.items():
            x = _upsample(images[idx], self.image_size)
            self._digits[name] = labels[idx]
            out[name] = TensorDataset(x, self.segmentation_targets(x, labels[idx], self.threshold, self.label_type))
        return out

    def floor_metrics(self, stage: str) -> Dict[str, float]:
        """The trained reference on the ``stage`` ("val" or "test") split:
        :func:`segmentation_reference_metrics` (an ink threshold fitted on the training maps and
        the linear probe's image class, fitted on the training images), scored against the hard
        maps. Computed once per stage and cached; empty without ``linear_probe``. The segmenter
        logs them at test as ``test/dice_linear`` etc.: the competence floors of the claims file."""
        from ..metrics import hard_target

        return self._cached_floor(stage, lambda tr, va, ev: segmentation_reference_metrics(
            (tr[0], self._digits["train"], hard_target(tr[1])), (va[0], self._digits["val"]),
            (ev[0], hard_target(ev[1])), self.num_classes))
