"""What every step of the reproduction shares: the repository's paths, the default claims file and
the statistics module (``benchmarks/stats.py``, which holds the verdict rules).

``stats.py`` is loaded from its file under the name ``reproduce_stats`` (once per process), so the
reproduction never picks up another module called ``stats`` from ``sys.path``.
"""

from __future__ import annotations

import importlib.util
import os
import sys

#: the ``benchmarks/`` folder (it holds this package, the worker script, the claims file and ``stats.py``)
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(HERE)
CLAIMS_FILE = os.path.join(HERE, "claims.yaml")


def _load_stats():
    """``benchmarks/stats.py`` as the module ``reproduce_stats`` (loaded once per process)."""
    name = "reproduce_stats"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "stats.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


stats = _load_stats()
