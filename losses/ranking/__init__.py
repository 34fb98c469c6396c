"""Ranking / retrieval losses: scores ``(B, L)`` + positives, or positive / negative scores."""

__all__: list = []

from .decoupled import *  # noqa: F401,F403,E402
from .decoupled import __all__ as _decoupled_all  # noqa: E402
from .psl import *  # noqa: F401,F403,E402
from .psl import __all__ as _psl_all  # noqa: E402

__all__ += [*_decoupled_all, *_psl_all]
