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

from .margin import *  # noqa: F401,F403,E402
from .margin import __all__ as _margin_all  # noqa: E402
from .partial_fc import *  # noqa: F401,F403,E402
from .partial_fc import __all__ as _partial_fc_all  # noqa: E402

__all__ += [*_margin_all, *_partial_fc_all]
