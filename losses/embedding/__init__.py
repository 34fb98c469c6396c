"""Embedding losses: embeddings ``(N, D)`` + class ids ``(N,)``; some own a head (class weights)."""

__all__: list = []

from .linear_ce import *  # noqa: F401,F403,E402
from .linear_ce import __all__ as _linear_ce_all  # noqa: E402

__all__ += list(_linear_ce_all)

from .opl import *  # noqa: F401,F403,E402
from .opl import __all__ as _opl_all  # noqa: E402
from .nbc import *  # noqa: F401,F403,E402
from .nbc import __all__ as _nbc_all  # noqa: E402
from .wcdas import *  # noqa: F401,F403,E402
from .wcdas import __all__ as _wcdas_all  # noqa: E402

__all__ += [*_opl_all, *_nbc_all, *_wcdas_all]
