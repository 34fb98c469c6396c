"""Classification losses: logits ``(N, C, *)`` + class ids ``(N, *)`` or soft / multi-hot targets."""

from .baselines import *  # noqa: F401,F403
from .baselines import __all__ as _baselines_all

__all__ = list(_baselines_all)

from .zloss import *  # noqa: F401,F403
from .zloss import __all__ as _zloss_all
from .comp_sum import *  # noqa: F401,F403
from .comp_sum import __all__ as _comp_sum_all
from .adversarial import *  # noqa: F401,F403
from .adversarial import __all__ as _adversarial_all

__all__ += list(_zloss_all) + list(_comp_sum_all) + list(_adversarial_all)

from .gol import *  # noqa: F401,F403
from .gol import __all__ as _gol_all

__all__ += list(_gol_all)

from .sparsemax import *  # noqa: F401,F403
from .sparsemax import __all__ as _sparsemax_all

__all__ += list(_sparsemax_all)

from .dice import *  # noqa: F401,F403
from .dice import __all__ as _dice_all

__all__ += list(_dice_all)
