"""scikit-learn's bundled ``load_digits`` as vision benchmarks (``docs/benchmarks.md``, vision rows).

1,797 real 8x8 handwritten digits (UCI), read from the file scikit-learn installs; nothing touches
the network. Pixels are scaled to ``[0, 1]`` (``value / 16``, no standardisation, so adversarial
budgets such as ``8/255`` mean what they say) and upsampled bilinearly to ``image_size`` (32 by
default) so that timm backbones with ``in_chans=1`` can take them.

* :class:`DigitsDataModule` -- stratified train / val / test split, and the variants of the
  benchmark table, all applied to the *training* split only (val and test stay clean and
  balanced): a low-data ``train_fraction``; digits-LT with
  ``n_c = n_max * imbalance_factor ** (-c / (C - 1))``; label noise (``noise_rate``,
  ``noise_type="symmetric" | "asymmetric"``); soft targets (``soft_targets=True``).
* :class:`DigitsSegmentationDataModule` -- each digit as an 11-class segmentation map: inked pixels
  get class ``digit + 1``, the rest background ``0``; soft labels from the ink intensity
  (``label_type="soft"``, ``(11, H, W)`` with ``v`` on the digit's channel and ``1 - v`` on the
  background) or their threshold (``label_type="hard"``, ``(H, W)`` ids).

Every random choice (split, subsampling, noise) is drawn from a generator seeded by ``seed``.
"""

from __future__ import annotations

import functools
import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ..base import BenchmarkDataModule

__all__ = ["DigitsDataModule", "DigitsSegmentationDataModule", "load_digits_tensors", "ASYMMETRIC_FLIPS"]

NUM_DIGITS = 10

#: Class-dependent ("asymmetric") noise between visually similar digits, as in Patrini et al.
#: (CVPR 2017) for MNIST: 2 -> 7, 3 -> 8, 5 <-> 6, 7 -> 1. Other classes keep their labels.
ASYMMETRIC_FLIPS: Dict[int, int] = {2: 7, 3: 8, 5: 6, 6: 5, 7: 1}


def load_digits_tensors() -> Tuple[Tensor, Tensor]:
    """``(images (1797, 8, 8) float32 in [0, 1], labels (1797,) int64)`` from scikit-learn.

    Raises ``ModuleNotFoundError`` naming the package when scikit-learn is not installed (the data
    ships inside it; nothing is downloaded). The parsed file is cached per process; callers get
    fresh copies.
    """
    images, labels = _load_digits_cached(_sklearn_load_digits())
    return images.clone(), labels.clone()


@functools.lru_cache(maxsize=1)
def _load_digits_cached(load_digits) -> Tuple[Tensor, Tensor]:
    bunch = load_digits()
    return torch.as_tensor(bunch.images, dtype=torch.float32) / 16.0, torch.as_tensor(bunch.target, dtype=torch.int64)


def _sklearn_load_digits():
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # the package (and so the bundled data) is missing
        raise ModuleNotFoundError(
            "DigitsDataModule: the digits data ships with scikit-learn, which is not installed "
            f"(got ImportError: {exc}); install it with `pip install scikit-learn` "
            "(or `pip install softmax-losses[data]`)",
            name="sklearn",
        ) from exc
    return load_digits


def _check(cond: bool, cls: str, problem: str, got: object, hint: str) -> None:
    if not cond:
        raise ValueError(f"{cls}: {problem} (got {got!r}); {hint}")


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


def long_tailed_counts(n_max: int, num_classes: int, imbalance_factor: float) -> List[int]:
    """``n_c = floor(n_max * IF ** (-c / (C - 1)))`` (at least 1), class 0 the head."""
    if num_classes == 1:
        return [n_max]
    return [max(1, int(math.floor(n_max * imbalance_factor ** (-c / (num_classes - 1))))) for c in range(num_classes)]


def _upsample(images: Tensor, size: int) -> Tensor:
    """``(N, 8, 8)`` -> ``(N, 1, size, size)``, bilinear, values stay in ``[0, 1]``."""
    x = images.unsqueeze(1)
    if size != x.shape[-1]:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.clamp_(0.0, 1.0).contiguous()


class _DigitsBase(BenchmarkDataModule):
    """Shared loading, splitting and loaders."""

    _name = "DigitsDataModule"

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
        self.in_chans = 1
        self._splits: Optional[Dict[str, TensorDataset]] = None

    # -- subclasses ---------------------------------------------------------------------------
    def _build(self, images: Tensor, labels: Tensor, split: Dict[str, Tensor], g: torch.Generator) -> Dict[str, TensorDataset]:
        raise NotImplementedError

    # -- Lightning hooks ----------------------------------------------------------------------
    def prepare_data(self) -> None:
        load_digits_tensors()  # fails early, naming the package, when scikit-learn is missing

    def setup(self, stage: Optional[str] = None) -> None:
        if self._splits is not None:
            return
        images, labels = load_digits_tensors()
        g = torch.Generator().manual_seed(self.seed)
        test, val, train = stratified_split(labels, (self.test_fraction, self.val_fraction), g)
        # pre-shuffle the training split once (seeded), so that ``shuffle=False`` still gives
        # mixed batches and a DDP run with ``shuffle=False`` sees the single-process batches
        train = train[torch.randperm(train.numel(), generator=g)]
        self._splits = self._build(images, labels, {"train": train, "val": val, "test": test}, g)

    def _loader(self, split: str, train: bool) -> DataLoader:
        if self._splits is None:
            self.setup()
        assert self._splits is not None
        data = self._splits[split]
        shuffle = train and self.shuffle
        sampler = None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # shard explicitly (Lightning keeps a DistributedSampler it is given): its own sampler
            # would always shuffle the training split, ignoring ``shuffle``
            sampler = DistributedSampler(data, shuffle=shuffle, seed=self.seed, drop_last=False)
            shuffle = False
        return DataLoader(
            data,
            batch_size=self.batch_size if train else self.eval_batch_size,
            shuffle=shuffle,
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

    def split_sizes(self) -> Dict[str, int]:
        """Number of examples per split (after ``setup``)."""
        if self._splits is None:
            self.setup()
        assert self._splits is not None
        return {k: len(v) for k, v in self._splits.items()}


class DigitsDataModule(_DigitsBase):
    """Digits classification: full, low-data, long-tailed, label-noise and soft-target variants.

    Args:
        image_size: side of the upsampled images (``(1, image_size, image_size)``).
        batch_size / eval_batch_size: training / evaluation batch sizes (``None``: the same).
        val_fraction, test_fraction: stratified fractions of all 1,797 images held out.
        train_fraction: low-data variant: keep ``round(train_fraction * n_c)`` (>= 1) training
            images per class (docs/benchmarks.md: 10%).
        imbalance_factor: digits-LT when > 1: keep ``n_c = floor(n_max * IF ** (-c / (C - 1)))``
            training images of class ``c`` (``n_max`` = the smallest per-class training count
            before subsampling); class 0 is the head. Val and test stay balanced.
        noise_rate: fraction of training labels replaced. ``"symmetric"``: exactly
            ``round(rate * N)`` labels, each set to a uniformly drawn *other* class;
            ``"asymmetric"``: exactly ``round(rate * n_c)`` labels of each source class of
            :data:`ASYMMETRIC_FLIPS` flipped to its similar class.
        soft_targets: training targets become float distributions ``(C,)``: the label histogram
            of the image and its ``soft_neighbours`` nearest training images (Euclidean, raw
            pixels), i.e. soft labels from real visual ambiguity. Val/test targets stay ids.
        shuffle: shuffle training batches each epoch (the split itself is always shuffled once,
            seeded). Under DDP the loaders shard with a ``DistributedSampler`` that honours
            ``shuffle`` (seeded by ``seed``); with ``shuffle=False`` rank ``r`` of ``W`` reads
            examples ``r, r + W, ...``, so ``W`` processes at batch size ``B`` see the same global
            batches as one process at ``W * B``.
        seed: seed of every random choice of the split and the variants.

    Batches are ``(images (B, 1, S, S) float32 in [0, 1], target)``; target is ``(B,)`` int64 or,
    with ``soft_targets``, ``(B, C)`` float32. ``tail_classes`` lists the classes whose training
    count is in the lower half (digits-LT only; empty otherwise) for head/tail metrics;
    ``class_counts`` holds the per-class training counts after ``setup``.
    """

    _name = "DigitsDataModule"

    def __init__(
        self,
        *,
        image_size: int = 32,
        batch_size: int = 64,
        eval_batch_size: Optional[int] = None,
        val_fraction: float = 0.15,
        test_fraction: float = 0.2,
        train_fraction: float = 1.0,
        imbalance_factor: float = 1.0,
        noise_rate: float = 0.0,
        noise_type: str = "symmetric",
        soft_targets: bool = False,
        soft_neighbours: int = 10,
        shuffle: bool = True,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(image_size=image_size, batch_size=batch_size, eval_batch_size=eval_batch_size,
                         val_fraction=val_fraction, test_fraction=test_fraction, shuffle=shuffle,
                         num_workers=num_workers, seed=seed)
        self.save_hyperparameters()  # checkpoints carry the data settings (load_from_checkpoint)
        cls = self._name
        _check(0.0 < train_fraction <= 1.0, cls, "train_fraction must be in (0, 1]", train_fraction,
               "the low-data benchmark uses 0.1")
        _check(math.isfinite(imbalance_factor) and imbalance_factor >= 1.0, cls,
               "imbalance_factor must be a finite number >= 1", imbalance_factor,
               "1 is balanced; digits-LT uses up to ~50")
        _check(0.0 <= noise_rate < 1.0, cls, "noise_rate must be in [0, 1)", noise_rate, "pass e.g. 0.4")
        _check(noise_type in ("symmetric", "asymmetric"), cls, "noise_type must be 'symmetric' or 'asymmetric'",
               noise_type, "choose one of the two")
        _check(isinstance(soft_neighbours, int) and soft_neighbours >= 1, cls,
               "soft_neighbours must be a positive integer", soft_neighbours, "pass e.g. 10")
        self.train_fraction = float(train_fraction)
        self.imbalance_factor = float(imbalance_factor)
        self.noise_rate = float(noise_rate)
        self.noise_type = noise_type
        self.soft_targets = bool(soft_targets)
        self.soft_neighbours = soft_neighbours
        self.num_classes = NUM_DIGITS
        # LT: n_c decreases with c, so the tail is the upper half of the class ids
        self.tail_classes: List[int] = (
            list(range(NUM_DIGITS - NUM_DIGITS // 2, NUM_DIGITS)) if self.imbalance_factor > 1.0 else []
        )
        self.class_counts: Optional[Tensor] = None
        self.noise_mask: Optional[Tensor] = None  # True where a training label was changed

    def _build(self, images, labels, split, g):
        train = split["train"]
        y = labels[train]
        keep: List[Tensor] = []
        if self.imbalance_factor > 1.0:
            n_max = min(int((y == c).sum()) for c in range(NUM_DIGITS))
            counts = long_tailed_counts(n_max, NUM_DIGITS, self.imbalance_factor)
        else:
            counts = [int((y == c).sum()) for c in range(NUM_DIGITS)]
        for c in range(NUM_DIGITS):
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
        self.class_counts = torch.bincount(noisy, minlength=NUM_DIGITS)

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

    def _add_noise(self, y: Tensor, g: torch.Generator) -> Tensor:
        y = y.clone()
        if self.noise_rate == 0.0:
            return y
        if self.noise_type == "symmetric":
            n = int(round(self.noise_rate * y.numel()))
            idx = torch.randperm(y.numel(), generator=g)[:n]
            shift = torch.randint(1, NUM_DIGITS, (n,), generator=g)  # a different class, uniformly
            y[idx] = (y[idx] + shift) % NUM_DIGITS
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
        votes = F.one_hot(y[nn_idx], NUM_DIGITS).sum(1).float()
        return votes / votes.sum(1, keepdim=True)


class DigitsSegmentationDataModule(_DigitsBase):
    """Digits as 11-class segmentation maps (docs/benchmarks.md, Dice semimetric row).

    The image is upsampled to ``image_size``; a pixel with ink intensity ``v > threshold`` gets the
    digit's class ``digit + 1``, the others background ``0`` (``num_classes = 11``).

    Args:
        label_type: ``"soft"``: float ``(11, S, S)`` targets with ``v`` on the digit's channel
            and ``1 - v`` on the background (argmax = the hard label, up to ties at the
            threshold 0.5); ``"hard"``: int64 ``(S, S)`` ids, the thresholded map.
        threshold: the ink threshold of the hard label (0.5 makes the soft label's argmax agree).
        the rest: as :class:`DigitsDataModule` (stratified by digit).

    Batches are ``(images (B, 1, S, S), target)`` for every split, so validation losses are
    comparable with training; metrics use the hard map.
    """

    _name = "DigitsSegmentationDataModule"

    def __init__(
        self,
        *,
        image_size: int = 32,
        label_type: str = "soft",
        threshold: float = 0.5,
        batch_size: int = 64,
        eval_batch_size: Optional[int] = None,
        val_fraction: float = 0.15,
        test_fraction: float = 0.2,
        shuffle: bool = True,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(image_size=image_size, batch_size=batch_size, eval_batch_size=eval_batch_size,
                         val_fraction=val_fraction, test_fraction=test_fraction, shuffle=shuffle,
                         num_workers=num_workers, seed=seed)
        self.save_hyperparameters()
        cls = self._name
        _check(label_type in ("soft", "hard"), cls, "label_type must be 'soft' or 'hard'", label_type,
               "soft labels come from the ink intensity, hard labels from its threshold")
        _check(0.0 < threshold < 1.0, cls, "threshold must be in (0, 1)", threshold, "pass e.g. 0.5")
        self.label_type = label_type
        self.threshold = float(threshold)
        self.num_classes = NUM_DIGITS + 1

    @staticmethod
    def segmentation_targets(x: Tensor, digits: Tensor, threshold: float, label_type: str) -> Tensor:
        """Targets for images ``x (N, 1, S, S)`` of ``digits (N,)``: ``(N, S, S)`` ids or
        ``(N, 11, S, S)`` soft labels."""
        v = x[:, 0]
        if label_type == "hard":
            return torch.where(v > threshold, (digits + 1).view(-1, 1, 1), torch.zeros_like(digits).view(-1, 1, 1))
        soft = torch.zeros(x.shape[0], NUM_DIGITS + 1, *v.shape[1:], dtype=x.dtype)
        soft[:, 0] = 1.0 - v
        soft.scatter_(1, (digits + 1).view(-1, 1, 1, 1).expand(-1, 1, *v.shape[1:]), v.unsqueeze(1))
        return soft

    def _build(self, images, labels, split, g):
        out = {}
        for name, idx in split.items():
            x = _upsample(images[idx], self.image_size)
            out[name] = TensorDataset(x, self.segmentation_targets(x, labels[idx], self.threshold, self.label_type))
        return out
