"""Benchmark DataModules over data that ships inside installed packages (nothing downloads),
and DataModules for your own data (``ImageFolderDataModule``, ``InteractionsDataModule``,
``PairsDataModule``) that any recipe can select by ``class_path``."""

from .digits import *  # noqa: F401,F403
from .digits import __all__ as _digits_all
from .embedding_cache import MissingDataPackageError
from .mnist import MNISTDataModule, MNISTSegmentationDataModule, load_mnist5k_tensors
from .movielens import MovieLensDataModule
from .retrieval import RetrievalDataModule

__all__ = [*_digits_all, "MissingDataPackageError", "MNISTDataModule", "MNISTSegmentationDataModule",
           "load_mnist5k_tensors", "MovieLensDataModule", "RetrievalDataModule"]
from .image_folder import ImageFolderDataModule  # noqa: E402  (own data)
from .interactions import InteractionsDataModule  # noqa: E402
from .pairs import PairsDataModule  # noqa: E402

__all__ += ["ImageFolderDataModule", "InteractionsDataModule", "PairsDataModule"]
from .identities import IdentitiesDataModule  # noqa: E402  (synthetic many-class identities)
__all__ += ["IdentitiesDataModule"]
from .language_model import LanguageModelDataModule  # noqa: E402  (causal language modelling)
__all__ += ["LanguageModelDataModule"]
