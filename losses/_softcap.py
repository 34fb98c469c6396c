"""Final-logit soft-capping ``softcap * tanh(logits / softcap)``, shared by the softmax losses that offer it.

Soft-capping bounds every logit to ``(-softcap, softcap)`` smoothly before the softmax (Gemma 2
caps its final logits at 30; G. Team, *Gemma 2: Improving Open Language Models at a Practical
Size*, arXiv:2408.00118). ``-inf`` entries stay ``-inf`` (a mask stays a mask) with zero
gradient there.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ._core import type_error, value_error

__all__ = ["check_softcap", "apply_softcap"]


def check_softcap(fn: str, softcap: object) -> Optional[float]:
    """``None`` (off) or a positive finite float; a bool or non-number is a ``TypeError``,
    zero, a negative, NaN or infinity a ``ValueError``."""
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise type_error(fn, "softcap must be None or a positive float", type(softcap).__name__,
                         "pass e.g. softcap=30.0, or None to switch soft-capping off")
    value = float(softcap)
    if not math.isfinite(value) or value <= 0.0:
        raise value_error(fn, "softcap must be a positive finite float", softcap,
                          "pass e.g. softcap=30.0, or None to switch soft-capping off")
    return value


def apply_softcap(x: Tensor, softcap: Optional[float]) -> Tensor:
    """``softcap * tanh(x / softcap)`` (``x`` itself when ``softcap`` is None); ``-inf`` stays ``-inf``."""
    if softcap is None:
        return x
    capped = torch.tanh(x / softcap) * softcap
    return torch.where(x == -math.inf, x, capped)
