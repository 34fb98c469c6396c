"""MkDocs hook: copy MathJax 3 from the installed ``django-static-mathjax`` wheel (PyPI) into the
built site, so formulas are typeset with no network and no JavaScript is committed.

Only the CommonHTML TeX bundle and its web fonts are copied (about 2 MB). The wheel is part of the
``docs`` extra (``pip install -e ".[docs]"``).
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

BUNDLE = "tex-chtml.js"
FONTS = Path("output") / "chtml" / "fonts" / "woff-v2"


def _mathjax_dir() -> Path:
    try:
        root = resources.files("mathjax") / "static" / "mathjax" / "es5"
    except ModuleNotFoundError as exc:  # pragma: no cover - message for a missing extra
        raise RuntimeError(
            "mathjax_assets: MathJax is not installed (got no 'mathjax' package); "
            'install the docs extra: pip install -e ".[docs]"'
        ) from exc
    path = Path(str(root))
    if not (path / BUNDLE).is_file():
        raise RuntimeError(f"mathjax_assets: {BUNDLE} not found (got {path}); reinstall django-static-mathjax")
    return path


def on_post_build(config, **kwargs) -> None:
    src = _mathjax_dir()
    dst = Path(config["site_dir"]) / "assets" / "mathjax"
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / BUNDLE, dst / BUNDLE)
    shutil.copytree(src / FONTS, dst / FONTS, dirs_exist_ok=True)
