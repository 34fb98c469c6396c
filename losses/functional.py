"""The pure functional forms of every loss (also re-exported as ``losses.<name>``)."""

import inspect as _inspect

from . import classification as _classification
from . import embedding as _embedding
from . import ranking as _ranking

__all__ = []
for _pkg in (_classification, _embedding, _ranking):
    for _name in _pkg.__all__:
        _obj = getattr(_pkg, _name)
        if _inspect.isfunction(_obj):
            globals()[_name] = _obj
            __all__.append(_name)
del _pkg, _name, _obj
