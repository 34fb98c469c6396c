"""Route a loss by its registry declaration (``docs/conventions.md``, Registry), never by its name.

A LightningModule asks :func:`loss_route` what a loss takes and calls it accordingly; it holds
no loss-specific ``if`` branches. Losses outside the registry (e.g. ``torch.nn.CrossEntropyLoss``)
are treated as logits losses.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from torch import nn

import losses


@dataclasses.dataclass(frozen=True)
class LossRoute:
    """What a loss module's ``forward`` takes.

    kind: ``"I"`` logits + target, ``"E"`` embeddings + target, ``"S"`` scores + target,
    ``"P"`` positive / negative scores, ``"M"`` model + inputs + target.
    owns_head: the loss owns class weights and gives evaluation logits via ``.logits``.
    auxiliary: the loss is added (with a weight) to a main loss.
    name: registry name (``None`` for losses outside the registry).
    """

    kind: str
    owns_head: bool
    auxiliary: bool
    name: Optional[str]


def _spec_for(loss: nn.Module) -> Optional["losses.LossSpec"]:
    matches = [s for s in losses.list_losses() if type(loss) is s.module]
    if not matches:
        return None
    # several registry names can share one module (margin_softmax / cosine_softmax): any of
    # them describes the inputs equally well
    return matches[0]


def loss_route(loss: nn.Module) -> LossRoute:
    spec = _spec_for(loss)
    if spec is None:
        return LossRoute(kind="I", owns_head=hasattr(loss, "logits"), auxiliary=False, name=None)
    return LossRoute(kind=spec.kind, owns_head=spec.owns_head, auxiliary=spec.auxiliary, name=spec.name)


def ddp_ignored_parameter_names(module: nn.Module) -> Tuple[str, ...]:
    """Fully qualified names of parameters that sub-modules ask DDP not to average
    (``ddp_ignored_parameters()``, e.g. Partial FC's sharded class centres)."""
    ignored = set()
    for sub in module.modules():
        fn = getattr(sub, "ddp_ignored_parameters", None)
        if callable(fn):
            ignored.update(id(p) for p in fn())
    return tuple(name for name, p in module.named_parameters() if id(p) in ignored)
