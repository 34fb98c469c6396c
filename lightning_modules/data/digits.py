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

Every random choice (split, subsampling, noise) is drawn from a generator seeded by ``seed``; with
``test_seed`` the test split is drawn from ``test_seed`` alone (the same for every ``seed``).
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
from torch import Tensor

from .image_variants import ASYMMETRIC_FLIPS, ClassificationVariantsDataModule, SegmentationVariantsDataModule

__all__ = ["DigitsDataModule", "DigitsSegmentationDataModule", "load_digits_tensors", "ASYMMETRIC_FLIPS"]


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



class DigitsDataModule(ClassificationVariantsDataModule):
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
            seeded). In one process the order comes from ``(seed, epoch)`` alone
            (:class:`~lightning_modules.data.image_variants.SeededEpochSampler`), so models
            trained with the same ``seed`` see the same batches; ``set_class_balanced_sampling()``
            switches it to class-balanced sampling (stage 2 of the two-stage protocol). Under DDP the loaders shard with a ``DistributedSampler`` that honours
            ``shuffle`` (seeded by ``seed``); with ``shuffle=False`` rank ``r`` of ``W`` reads
            examples ``r, r + W, ...``, so ``W`` processes at batch size ``B`` see the same global
            batches as one process at ``W * B``.
        seed: seed of every random choice of the split and the variants.
        test_seed: ``None`` (default): the test split is drawn from ``seed`` with the others (a
            new test split per seed, as revision 2's runs were made). An integer: the test split
            is drawn from ``test_seed`` alone, the same for every ``seed`` (protocol revision 3);
            the validation / training split, the variants, the order and the initial weights still
            vary with ``seed``. :meth:`test_split_fingerprint` names the test split (SHA-256 of
            its sorted indices, 12 hex digits).
        linear_probe: ``True`` gives :meth:`floor_metrics` a trained reference on the same split: a
            multinomial logistic regression on the raw pixels of the training split as trained on
            (its noisy, long-tailed or low-data labels), L2 strength chosen on validation
            (:func:`~lightning_modules.data.image_variants.linear_probe_metrics`); the classifier
            logs it at test as ``test/top1_linear``, ``test/balanced_acc_linear`` and, long-tailed,
            ``test/acc_head_linear`` / ``test/acc_tail_linear``: a competence floor. ``False``
            (default): nothing is fitted.

    Batches are ``(images (B, 1, S, S) float32 in [0, 1], target)``; target is ``(B,)`` int64 or,
    with ``soft_targets``, ``(B, C)`` float32. ``tail_classes`` lists the classes whose training
    count is in the lower half (digits-LT only; empty otherwise) for head/tail metrics;
    ``class_counts`` holds the per-class training counts (reading it runs ``setup`` first).
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
        test_seed: Optional[int] = None,
        linear_probe: bool = False,
    ) -> None:
        super().__init__(image_size=image_size, batch_size=batch_size, eval_batch_size=eval_batch_size,
                         val_fraction=val_fraction, test_fraction=test_fraction, train_fraction=train_fraction,
                         imbalance_factor=imbalance_factor, noise_rate=noise_rate, noise_type=noise_type,
                         soft_targets=soft_targets, soft_neighbours=soft_neighbours, shuffle=shuffle,
                         num_workers=num_workers, seed=seed, test_seed=test_seed,
                         linear_probe=linear_probe)
        self.save_hyperparameters()  # checkpoints carry the data settings (load_from_checkpoint)

    def _load(self) -> Tuple[Tensor, Tensor]:
        return load_digits_tensors()


class DigitsSegmentationDataModule(SegmentationVariantsDataModule):
    """Digits as 11-class segmentation maps (docs/benchmarks.md, Dice semimetric row).

    The image is upsampled to ``image_size``; a pixel with ink intensity ``v > threshold`` gets the
    digit's class ``digit + 1``, the others background ``0`` (``num_classes = 11``).

    Args:
        label_type: ``"soft"``: float ``(11, S, S)`` targets with ``v`` on the digit's channel
            and ``1 - v`` on the background (argmax = the hard label, up to ties at the
            threshold 0.5); ``"hard"``: int64 ``(S, S)`` ids, the thresholded map.
        threshold: the ink threshold of the hard label (0.5 makes the soft label's argmax agree).
        linear_probe: ``True`` gives :meth:`floor_metrics` a trained reference on the same split:
            an ink threshold fitted on the training maps plus the linear probe's class of each
            image (:func:`~lightning_modules.data.image_variants.segmentation_reference_metrics`);
            the segmenter logs it at test as ``test/dice_linear``, ``test/miou_linear``, ...
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
        test_seed: Optional[int] = None,
        linear_probe: bool = False,
    ) -> None:
        super().__init__(image_size=image_size, label_type=label_type, threshold=threshold, batch_size=batch_size,
                         eval_batch_size=eval_batch_size, val_fraction=val_fraction, test_fraction=test_fraction,
                         shuffle=shuffle, num_workers=num_workers, seed=seed, test_seed=test_seed,
                         linear_probe=linear_probe)
        self.save_hyperparameters()

    def _load(self) -> Tuple[Tensor, Tensor]:
        return load_digits_tensors()
