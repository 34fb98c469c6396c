"""Route a loss by its registry declaration (``docs/conventions.md``, Registry), never by its name.

A LightningModule asks :func:`loss_route` what a loss takes and calls it accordingly; it holds
no loss-specific ``if`` branches. The entry is found along the loss's class hierarchy
(:func:`losses.spec_for_module`): a subclass of a registered loss (``class MyArcFace(
losses.MarginSoftmaxLoss)``) routes as its parent, and a loss class registered with
:func:`losses.register` routes by its own entry. ``torch.nn`` losses (subclasses of
``torch.nn.modules.loss._Loss``, e.g. ``torch.nn.CrossEntropyLoss``) take ``(input, target)``
and are routed as logits losses; any other unregistered module is an error that says how to
register it.

Prediction has one home too: every module turns its model output into predictions with
:func:`head_logits` (the loss's ``.logits(embeddings)`` when it owns the head, else the model's
head), :func:`predict_scores` (top-k accuracy, argmax predictions, rankings) and
:func:`predict_proba` (calibration): the loss's own ``predict_proba(input)`` where it has one, the
softmax / order of the logits otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

import losses
from losses import InputKind


@dataclasses.dataclass(frozen=True)
class LossRoute:
    """What a loss module's ``forward`` takes, and whether it can train a model on its own.

    kind: a :class:`losses.InputKind`: ``"logits"`` (logits + target), ``"embeddings"``
    (embeddings + target), ``"scores"`` (scores + target), ``"pairs"`` (positive / negative
    scores) or ``"model"`` (model + inputs + target).
    owns_head: the loss owns class weights and gives evaluation logits via ``.logits``.
    auxiliary: the loss is added (with a weight) to a main loss.
    name: registry name (``None`` for ``torch.nn`` losses outside the registry).
    query_keys: (``"scores"``) ``forward`` also takes ``(query, keys, target)`` and scores the
    pairs itself (``losses.in_batch_scores``); otherwise it gets the score matrix.
    loss_name: the loss's class name, for messages.
    """

    kind: str
    owns_head: bool
    auxiliary: bool
    name: Optional[str]
    query_keys: bool = False
    loss_name: str = "loss"

    @property
    def arguments(self) -> Tuple[str, ...]:
        """``forward``'s positional arguments (``losses.INPUT_KINDS[kind]``)."""
        return losses.INPUT_KINDS[self.kind]

    @property
    def trains_alone(self) -> bool:
        """The loss is a training signal on its own: not auxiliary, and an embeddings loss only
        if it owns the head that turns embeddings into predictions."""
        return not self.auxiliary and (self.kind != InputKind.EMBEDDINGS or self.owns_head)

    @property
    def needs_main_loss(self) -> bool:
        """The loss is only added to a main loss (auxiliary, or an embeddings loss without a head)."""
        return not self.trains_alone

    def require_main(self, owner: str, kinds: Sequence[str], *, task: str, hint: str) -> None:
        """Raise ``ValueError("<owner>: ...")`` unless the loss takes one of ``kinds`` and
        :attr:`trains_alone` (``task``: what it would train, e.g. ``"a recommender"``)."""
        if self.kind not in kinds:
            reason = f"takes inputs of kind {self.kind!r}, not one of {list(kinds)}"
        elif self.auxiliary:
            reason = "is an auxiliary loss (added to a main loss)"
        elif not self.trains_alone:
            reason = "is an embedding loss that owns no head"
        else:
            return
        raise ValueError(f"{owner}: {self.loss_name} {reason} (got kind {self.kind!r}, auxiliary={self.auxiliary}, "
                         f"owns_head={self.owns_head}), so it cannot train {task} on its own; {hint}")


def loss_route(loss: nn.Module) -> LossRoute:
    """The :class:`LossRoute` of ``loss``: its registry entry along its class hierarchy, or the
    logits route for ``torch.nn`` losses; ``ValueError`` for any other unregistered module."""
    cls = type(loss)
    spec = losses.spec_for_module(cls)
    if spec is not None:
        return LossRoute(kind=spec.kind, owns_head=spec.owns_head, auxiliary=spec.auxiliary, name=spec.name,
                         query_keys=spec.query_keys, loss_name=cls.__name__)
    if isinstance(loss, nn.modules.loss._Loss):  # torch's own losses take (input, target)
        return LossRoute(kind=InputKind.LOGITS, owns_head=hasattr(loss, "logits"), auxiliary=False, name=None,
                         loss_name=cls.__name__)
    raise ValueError(
        f"loss_route: {cls.__name__} is not a registered loss (got {cls.__module__}.{cls.__qualname__}); register "
        "it with losses.register(name, function=..., module=..., inputs=..., ...) or subclass a registered loss "
        "(docs/contributing.md, Adding a loss)"
    )


def ddp_ignored_parameter_names(module: nn.Module) -> Tuple[str, ...]:
    """Fully qualified names of parameters that sub-modules ask DDP not to average
    (``ddp_ignored_parameters()``, e.g. Partial FC's sharded class centres)."""
    ignored = set()
    for sub in module.modules():
        fn = getattr(sub, "ddp_ignored_parameters", None)
        if callable(fn):
            ignored.update(id(p) for p in fn())
    return tuple(name for name, p in module.named_parameters() if id(p) in ignored)


# -- prediction: the one rule every module scores its metrics with ------------------------------
def head_logits(loss: nn.Module, route: LossRoute, embeddings: Tensor,
                head: Optional[Callable[[Tensor], Tensor]]) -> Tensor:
    """The class logits of ``embeddings``: the loss's ``.logits(embeddings)`` when it owns the head
    (``route.owns_head``), else the model's own ``head(embeddings)``."""
    if route.owns_head:
        return loss.logits(embeddings)
    if head is None:
        raise RuntimeError(f"head_logits: the model has no head and {route.loss_name} owns none "
                           "(got head=None, owns_head=False); build the model's head when the loss does not own it")
    return head(embeddings)


def has_own_prediction(loss: Optional[nn.Module]) -> bool:
    """Whether ``loss`` defines its own prediction rule (a callable ``predict_proba(input)``)."""
    return callable(getattr(loss, "predict_proba", None))


#: the probe row's spread: softmax gives every class at least exp(-20) ~ 2e-9 (no exact 0 in float32)
_PROBE_SPREAD = 20.0


def has_sparse_probabilities(loss: Optional[nn.Module], num_classes: int) -> bool:
    """Whether ``loss``'s predictive distribution can give a class probability exactly 0
    (sparsemax, 1.5-entmax: the support-size metrics mean something only then).

    A loss may declare it as a boolean attribute ``sparse_probabilities``; otherwise the answer
    is read from what the loss does, never from its name: its own ``predict_proba`` (a loss
    without one predicts by the softmax, which is never sparse) is applied to one probe row of
    ``num_classes`` logits spread evenly from 0 down to -20, and the distribution is sparse if it
    holds an exact 0 there (the softmax of that row does not: its smallest value is about 2e-9).
    A ``predict_proba`` that fails on the probe counts as not sparse.
    """
    declared = getattr(loss, "sparse_probabilities", None)
    if isinstance(declared, bool):
        return declared
    if not has_own_prediction(loss) or int(num_classes) < 2:
        return False
    probe = torch.linspace(0.0, -_PROBE_SPREAD, int(num_classes)).unsqueeze(0)
    params = next(iter(loss.parameters()), None) if isinstance(loss, nn.Module) else None
    buffers = next(iter(loss.buffers()), None) if isinstance(loss, nn.Module) else None
    ref = params if params is not None else buffers
    if ref is not None:
        probe = probe.to(ref.device)
    try:
        with torch.no_grad():
            probs = loss.predict_proba(probe)
    except Exception:
        return False
    return bool((probs == 0).any())


def predict_proba(loss: Optional[nn.Module], logits: Tensor, dim: int = 1) -> Tensor:
    """The predictive distribution over classes (``dim``) that the trained loss implies.

    ``logits`` are what the loss takes as its input (for a loss that owns a head: its
    ``.logits(embeddings)``, :func:`head_logits`). A loss with its own rule exposes
    ``predict_proba(input) -> probabilities`` (sparsemax / entmax: ``sparsemax(input)``; a
    logit-adjusted loss: the softmax of the unadjusted input) and that is used; otherwise the
    softmax of ``logits``. No name checks.
    """
    if has_own_prediction(loss):
        return loss.predict_proba(logits)
    return torch.softmax(logits.float(), dim=dim)


def predict_scores(loss: Optional[nn.Module], logits: Tensor, dim: int = 1) -> Tensor:
    """Scores over classes (``dim``) whose order is the loss's prediction: the input of top-k
    accuracy, argmax predictions and rankings in every benchmark module.

    Without a rule of its own (no ``predict_proba``) these are ``logits`` unchanged, so top-1 is
    their argmax. With one, classes are ordered by ``loss.predict_proba(logits)``, ties (e.g. the
    zeros of a sparse distribution) broken by ``logits``, and the scores are ``C - rank`` (float,
    larger = better, strictly ordered; ``C`` the number of classes); for a rule that is
    non-decreasing in the logits (softmax, sparsemax, entmax) this is exactly the order of the
    logits, so every metric keeps its value.
    """
    if not has_own_prediction(loss):
        return logits
    logits = logits.detach()
    probs = loss.predict_proba(logits).detach()
    n = logits.shape[dim]
    by_logits = logits.float().argsort(dim=dim, descending=True, stable=True)
    order = by_logits.gather(dim, probs.float().gather(dim, by_logits).argsort(dim=dim, descending=True, stable=True))
    shape = [1] * logits.dim()
    shape[dim] = n
    ranks = torch.arange(n, device=logits.device).view(shape).expand_as(order)
    rank = torch.empty_like(order).scatter_(dim, order, ranks)
    return (n - rank).to(torch.float32)
