"""Embedding losses: embeddings ``(N, D)`` + class ids ``(N,)``; some own a head (class weights).

Every public module here is imported on import and its ``__all__`` re-exported (so into ``losses``
and ``losses.functional`` too): a new family file needs no line in this file."""

from .._registry import export_modules

__all__ = export_modules(__name__, __path__, globals())
