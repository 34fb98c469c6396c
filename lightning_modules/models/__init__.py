"""Benchmark LightningModules; each routes its loss by the registry declaration."""

from .vision import *  # noqa: F401,F403
from .vision import __all__ as _vision_all
from .recommender import Recommender
from .retriever import DualEncoderRetriever
from .identities import IdentityEmbedder
from .language_model import DecoderLM, LanguageModel

__all__ = [*_vision_all, "Recommender", "DualEncoderRetriever", "IdentityEmbedder", "DecoderLM", "LanguageModel"]
