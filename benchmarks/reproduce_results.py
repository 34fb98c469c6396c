"""Reproduce the papers' claims declared in ``benchmarks/claims.yaml``: the command's entry point.

The pipeline (tune -> evaluate -> compare -> report) lives in the package ``benchmarks/reproduce/``;
its ``__init__`` describes the steps in order and names the module of each. This file only puts
``benchmarks/`` on ``sys.path`` and calls :func:`reproduce.cli.main`, so that the command the
reports and the docs quote keeps working::

    python benchmarks/reproduce_results.py --help
    python benchmarks/reproduce_results.py --claims wcdas,wcdas_2stage --out /tmp/res
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from reproduce.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
