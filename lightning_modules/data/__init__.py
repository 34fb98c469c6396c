"""Benchmark DataModules over data that ships inside installed packages (nothing downloads)."""

from .digits import *  # noqa: F401,F403
from .digits import __all__ as _digits_all
from .embedding_cache import MissingDataPackageError
from .mnist import MNISTDataModule, MNISTSegmentationDataModule, load_mnist5k_tensors
from .movielens import MovieLensDataModule
from .retrieval import RetrievalDataModule

__all__ = [*_digits_all, "MissingDataPackageError", "MNISTDataModule", "MNISTSegmentationDataModule",
           "load_mnist5k_tensors", "MovieLensDataModule", "RetrievalDataModule"]
