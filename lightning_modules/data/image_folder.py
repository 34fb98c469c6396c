"""Your own images, one folder per class, for the vision models (``VisionClassifier``).

Layout (torchvision ``ImageFolder``; class ids follow the sorted folder names)::

    images/
      cat/  001.png  002.jpg ...
      dog/  ...

Either one ``root`` folder split into train / val / test by the stratified, seeded fractions
``val_fraction`` / ``test_fraction`` (the split of the digits benchmarks), or separate
``train_dir`` / ``val_dir`` (/ ``test_dir``; without it the test split is the validation folder)
with the same class folders. Images are resized to ``image_size`` x ``image_size``, converted to
``channels`` (1: grayscale, 3: RGB) and scaled to ``[0, 1]``; batches are
``(images (B, C, S, S) float32, target (B,) int64)`` as in the digits benchmarks, so every vision
recipe can swap its ``data:`` block for this one. ``num_classes`` and ``in_chans`` are linked into
the model by the CLI::

    python -m lightning_modules fit --config configs/own_data/image_folder.yaml \\
        --data.init_args.root=/path/to/images
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, Subset

from ..base import BenchmarkDataModule
from .image_variants import stratified_split

__all__ = ["ImageFolderDataModule"]


def _fail(problem: str, got: object, hint: str) -> None:
    raise ValueError(f"ImageFolderDataModule: {problem} (got {got!r}); {hint}")


def _torchvision():
    try:
        import torchvision
        from torchvision import transforms
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"ImageFolderDataModule: needs torchvision, which is not installed (got ImportError: {exc}); "
            "install it with `pip install softmax-losses[vision]`", name="torchvision") from exc
    return torchvision, transforms


class _ToRGB:
    """PIL image -> RGB (a picklable transform, for worker processes)."""

    def __call__(self, image):
        return image.convert("RGB")


class ImageFolderDataModule(BenchmarkDataModule):
    """Image classification from class folders (see the module docstring).

    Args:
        root: one folder of class folders, split by ``val_fraction`` / ``test_fraction``.
        train_dir, val_dir, test_dir: separate folders instead of ``root`` (``test_dir``
            optional: the validation folder is then also the test set).
        image_size: side of the resized images.
        channels: 1 (grayscale) or 3 (RGB).
        val_fraction, test_fraction: stratified fractions held out from ``root``.
        batch_size / eval_batch_size: training / evaluation batch sizes (``None``: the same).
        shuffle: shuffle training batches each epoch.
        seed: seed of the split and of the shuffling.
    """

    def __init__(
        self,
        root: Optional[str] = None,
        *,
        train_dir: Optional[str] = None,
        val_dir: Optional[str] = None,
        test_dir: Optional[str] = None,
        image_size: int = 32,
        channels: int = 3,
        val_fraction: float = 0.15,
        test_fraction: float = 0.2,
        batch_size: int = 64,
        eval_batch_size: Optional[int] = None,
        shuffle: bool = True,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if (root is None) == (train_dir is None):
            _fail("give either root (split by fractions) or train_dir and val_dir", {"root": root, "train_dir": train_dir},
                  "pass --data.init_args.root=/path/to/images")
        if train_dir is not None and val_dir is None:
            _fail("train_dir needs val_dir", val_dir, "pass the validation folder too, or use root")
        if root is not None and (val_dir is not None or test_dir is not None):
            _fail("val_dir / test_dir go with train_dir, not root", {"val_dir": val_dir, "test_dir": test_dir},
                  "drop them, or pass train_dir instead of root")
        if channels not in (1, 3):
            _fail("channels must be 1 or 3", channels, "1 converts to grayscale, 3 to RGB")
        if not isinstance(image_size, int) or image_size < 8:
            _fail("image_size must be an integer >= 8", image_size, "timm backbones want >= 32")
        for name, frac in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0.0 < frac < 1.0:
                _fail(f"{name} must be in (0, 1)", frac, "pass e.g. 0.15")
        if val_fraction + test_fraction >= 1.0:
            _fail("val_fraction + test_fraction must be below 1", val_fraction + test_fraction,
                  "leave room for the training split")
        dirs = {"root": root, "train_dir": train_dir, "val_dir": val_dir, "test_dir": test_dir}
        for name, d in dirs.items():
            if d is not None and not Path(d).expanduser().is_dir():
                _fail(f"{name} is not a folder", d, "point it at a folder with one sub-folder per class")
        self.root, self.train_dir, self.val_dir, self.test_dir = root, train_dir, val_dir, test_dir
        self.image_size, self.channels = image_size, channels
        self.val_fraction, self.test_fraction = float(val_fraction), float(test_fraction)
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size or batch_size)
        self.shuffle, self.num_workers, self.seed = bool(shuffle), int(num_workers), int(seed)
        # sizes must be known before the model is built: read the class folders now
        self.classes: List[str] = self._classes(root or train_dir)
        for name in ("val_dir", "test_dir"):
            d = dirs[name]
            if d is not None and self._classes(d) != self.classes:
                _fail(f"{name} has other class folders than train_dir", self._classes(d),
                      f"use the same class folders {self.classes}")
        self.num_classes = len(self.classes)
        self.in_chans = channels
        self.tail_classes: List[int] = []
        self._splits: Optional[Dict[str, torch.utils.data.Dataset]] = None

    @staticmethod
    def _classes(folder: str) -> List[str]:
        found = sorted(p.name for p in Path(folder).expanduser().iterdir() if p.is_dir())
        if len(found) < 2:
            _fail("needs at least two class folders", found, f"put one sub-folder per class under {folder}")
        return found

    def _dataset(self, folder: str):
        torchvision, transforms = _torchvision()
        steps = [transforms.Resize((self.image_size, self.image_size))]
        steps.append(transforms.Grayscale(1) if self.channels == 1 else _ToRGB())
        steps.append(transforms.ToTensor())
        return torchvision.datasets.ImageFolder(str(Path(folder).expanduser()), transform=transforms.Compose(steps))

    @property
    def meta(self) -> Dict[str, object]:
        sizes = self.split_sizes()
        return {"dataset": "image_folder", "classes": self.num_classes, **{f"{k}_images": v for k, v in sizes.items()}}

    def setup(self, stage: Optional[str] = None) -> None:
        if self._splits is not None:
            return
        if self.root is not None:
            full = self._dataset(self.root)
            labels = torch.as_tensor(full.targets, dtype=torch.long)
            g = torch.Generator().manual_seed(self.seed)
            test, val, train = stratified_split(labels, (self.test_fraction, self.val_fraction), g)
            self._splits = {"train": Subset(full, train.tolist()), "val": Subset(full, val.tolist()),
                            "test": Subset(full, test.tolist())}
        else:
            val = self._dataset(self.val_dir)
            self._splits = {"train": self._dataset(self.train_dir), "val": val,
                            "test": self._dataset(self.test_dir) if self.test_dir else val}
        for name, data in self._splits.items():
            if len(data) == 0:
                _fail(f"the {name} split is empty", 0, "add images or change the fractions")

    @property
    def class_counts(self) -> torch.Tensor:
        """Per-class counts of the training split: ``(num_classes,)`` int64 (reads the folder listing:
        ``setup`` runs first if it has not; the CLI links it into a loss's ``class_counts`` /
        ``class_prior`` before the model is built)."""
        self.setup()
        train = self._splits["train"]
        if isinstance(train, Subset):
            targets = torch.as_tensor(train.dataset.targets, dtype=torch.long)[torch.as_tensor(train.indices)]
        else:
            targets = torch.as_tensor(train.targets, dtype=torch.long)
        return torch.bincount(targets, minlength=self.num_classes)

    def split_sizes(self) -> Dict[str, int]:
        self.setup()
        return {k: len(v) for k, v in self._splits.items()}

    def _loader(self, split: str, train: bool) -> DataLoader:
        self.setup()
        data = self._splits[split]
        shuffle = train and self.shuffle
        sampler = None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            sampler = DistributedSampler(data, shuffle=shuffle, seed=self.seed, drop_last=False)
            shuffle = False
        gen = torch.Generator().manual_seed(self.seed) if shuffle else None
        return DataLoader(data, batch_size=self.batch_size if train else self.eval_batch_size, shuffle=shuffle,
                          sampler=sampler, generator=gen, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False)
