"""Availability checks for the optional libraries the adapters plug into (never imported here)."""

from __future__ import annotations

import importlib.util

__all__ = ["require"]

EXTRA = "integrations"


def require(import_name: str, dist: str, what: str) -> None:
    """Raise ``ModuleNotFoundError`` naming the ``integrations`` extra when ``import_name`` is
    not installed. Looks the package up with :func:`importlib.util.find_spec`, so nothing is
    imported (``import losses`` stays torch-only)."""
    try:
        found = importlib.util.find_spec(import_name) is not None
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        found = False
    if not found:
        raise ModuleNotFoundError(
            f"{what}: needs `{dist}`, which is not installed (got no module named {import_name!r}); install it "
            f"with `pip install softmax-losses[{EXTRA}]` or `pip install {dist}`",
            name=import_name,
        )
