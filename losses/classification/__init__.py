"""Classification losses: logits ``(N, C, *)`` + class ids ``(N, *)`` or soft / multi-hot targets."""

from .baselines import *  # noqa: F401,F403
from .baselines import __all__ as _baselines_all

__all__ = list(_baselines_all)
