"""Loss callables for the Hugging Face ``Trainer(compute_loss_func=...)``.

``Trainer`` calls ``compute_loss_func(outputs, labels, num_items_in_batch=...)`` with the model's
outputs and the batch's ``labels`` (it pops them from the inputs, so the model computes no loss
of its own)::

    from transformers import Trainer
    from losses.integrations.transformers import CausalLMLoss

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      compute_loss_func=CausalLMLoss(logz_coef=1e-4, softcap=30.0))

* :class:`SequenceClassificationLoss` -- ``logits (B, C)``, ``labels (B,)``.
* :class:`CausalLMLoss` -- ``logits (B, T, V)``, ``labels (B, T)``; the prediction at position
  ``t`` targets ``labels[:, t + 1]`` (the shift happens here, as in Hugging Face's own causal LM
  loss).
* :class:`MaskedLMLoss` -- the same without the shift (masked / token-level modelling).
* :class:`LinearCrossEntropyCausalLMLoss` -- the chunked many-class path
  (:func:`losses.linear_cross_entropy`) on the last hidden states and the model's output head,
  with the log-Z penalty: the ``(tokens x vocabulary)`` logits and their gradient are never
  materialised by the loss. The model must return hidden states
  (``model.config.output_hidden_states = True``); it still computes its own ``logits`` in
  ``forward`` unless told not to (e.g. ``logits_to_keep=1`` as a model input, where the model
  supports it).

Every callable ignores ``labels == ignore_index`` (-100, Hugging Face's padding label) and, when
the ``Trainer`` gives ``num_items_in_batch`` (the number of non-ignored target tokens over all
the micro-batches of one optimiser step), returns the **sum** of the token losses divided by it,
so that the micro-batch losses of a gradient-accumulation step add up to the loss of the whole
step (the ``Trainer`` then does not divide by the accumulation steps). Without it, the mean over
this batch's non-ignored targets.

For causal LMs the ``Trainer`` counts ``labels[..., 1:]`` (the shifted targets) only when the
model declares a causal LM loss (``model.loss_type == "ForCausalLM"``, set automatically for
classes named ``...ForCausalLM``); for others (e.g. ``GPT2LMHeadModel``) it counts every label,
position 0 included, and the accumulated loss would be divided by too many tokens. Call
:func:`count_shifted_labels` on such a model before building the ``Trainer``.

The token loss is softmax cross-entropy (``label_smoothing`` as :func:`torch.nn.functional.cross_entropy`)
or, with ``logz_coef > 0``, cross-entropy plus the PaLM log-Z penalty
``logz_coef * logsumexp(z)^2`` (:func:`losses.cross_entropy_with_logz_penalty`); ``softcap``
applies final-logit soft-capping ``softcap * tanh(z / softcap)`` before both (Gemma 2,
arXiv:2408.00118). Any other logits loss of the library can be passed as ``loss=`` (a module
built with ``reduction="sum"``, e.g. ``losses.Entmax15Loss(reduction="sum")``).

Importing this module imports nothing beyond torch; building a callable checks that
``transformers`` is installed (``pip install softmax-losses[integrations]``).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from .._core import check_ignore_index, check_number, type_error, value_error
from .._softcap import check_softcap
from ..classification.baselines import cross_entropy_loss
from ..classification.zloss import cross_entropy_with_logz_penalty
from ..embedding.linear_ce import linear_cross_entropy
from ._require import require

__all__ = [
    "SequenceClassificationLoss",
    "CausalLMLoss",
    "MaskedLMLoss",
    "LinearCrossEntropyCausalLMLoss",
    "normalize_by_items",
    "count_shifted_labels",
]


def _field(outputs: Any, name: str, owner: str) -> Tensor:
    value = outputs.get(name) if isinstance(outputs, dict) else getattr(outputs, name, None)
    if value is None and name == "logits" and isinstance(outputs, (tuple, list)) and outputs:
        value = outputs[0]
    if value is None:
        hint = ("set model.config.output_hidden_states = True" if name == "hidden_states"
                else "use a model head that returns logits")
        raise value_error(owner, f"the model outputs have no {name!r}", type(outputs).__name__, hint)
    return value


def normalize_by_items(total: Tensor, count: Tensor, num_items_in_batch: Optional[Union[int, Tensor]]) -> Tensor:
    """``total / num_items_in_batch`` when the Trainer gives it, else ``total / count`` (the
    number of non-ignored targets of this batch; 1 when there are none, so the loss is 0)."""
    if num_items_in_batch is not None:
        denom = torch.as_tensor(num_items_in_batch, device=total.device).to(total.dtype)
    else:
        denom = count.to(total.dtype)
    return total / torch.where(denom > 0, denom, torch.ones_like(denom))


def count_shifted_labels(model: nn.Module) -> nn.Module:
    """Make the ``Trainer`` count the shifted targets ``labels[..., 1:]`` in ``num_items_in_batch``
    for a causal LM whose class name does not say so (sets ``model.loss_type = "ForCausalLM"``
    where it is unset; the model's own forward is unchanged). Returns the model."""
    if getattr(model, "loss_type", None) is None:
        model.loss_type = "ForCausalLM"
    return model


class _TokenLoss:
    """Shared maths: summed token loss over ``(N, C)`` logits and ``(N,)`` ids."""

    def __init__(self, owner: str, *, loss: Optional[nn.Module], logz_coef: float, label_smoothing: float,
                 softcap: Optional[float], ignore_index: int) -> None:
        require("transformers", "transformers", owner)
        self.owner = owner
        self.logz_coef = check_number(owner, "logz_coef", logz_coef, low=0.0)
        self.label_smoothing = check_number(owner, "label_smoothing", label_smoothing, low=0.0, high=1.0)
        self.softcap = check_softcap(owner, softcap)
        self.ignore_index = check_ignore_index(owner, ignore_index)
        if loss is not None:
            if not isinstance(loss, nn.Module):
                raise type_error(owner, "loss must be an nn.Module", type(loss).__name__,
                                 "pass e.g. losses.Entmax15Loss(reduction='sum')")
            if getattr(loss, "reduction", None) != "sum":
                raise value_error(owner, "loss must be built with reduction='sum'",
                                  repr(getattr(loss, "reduction", None)),
                                  "the callable divides the sum by the number of target tokens")
            if self.logz_coef or self.label_smoothing or self.softcap is not None:
                raise value_error(owner, "logz_coef, label_smoothing and softcap apply to the built-in "
                                  "cross-entropy only", f"loss={type(loss).__name__}",
                                  "configure the given loss itself, or leave loss=None")
        if self.logz_coef and self.label_smoothing:
            raise value_error(owner, "label_smoothing is not available together with logz_coef > 0",
                              f"label_smoothing={label_smoothing}, logz_coef={logz_coef}",
                              "use LinearCrossEntropyCausalLMLoss, which has both, or one of them")
        self.loss = loss

    def summed(self, logits: Tensor, target: Tensor) -> Tensor:
        if self.loss is not None:
            keep = target != self.ignore_index
            return self.loss(logits[keep], target[keep])
        if self.logz_coef > 0:
            return cross_entropy_with_logz_penalty(logits, target, coef=self.logz_coef, ignore_index=self.ignore_index,
                                                   reduction="sum", softcap=self.softcap)
        return cross_entropy_loss(logits, target, label_smoothing=self.label_smoothing, ignore_index=self.ignore_index,
                                  reduction="sum", softcap=self.softcap)


class SequenceClassificationLoss(_TokenLoss):
    """``compute_loss_func`` for sequence classification: ``outputs.logits (B, C)``, ``labels (B,)``
    class ids (``ignore_index`` rows skipped).

    Args:
        loss: optional library logits loss built with ``reduction="sum"`` (default: softmax
            cross-entropy / the log-Z penalty below).
        logz_coef: PaLM log-Z penalty coefficient (0 = plain cross-entropy).
        label_smoothing: as :func:`torch.nn.functional.cross_entropy` (with ``logz_coef=0``).
        softcap: final-logit soft-capping (``None`` = off).
        ignore_index: the label that marks "no target" (-100).
    """

    def __init__(self, *, loss: Optional[nn.Module] = None, logz_coef: float = 0.0, label_smoothing: float = 0.0,
                 softcap: Optional[float] = None, ignore_index: int = -100) -> None:
        super().__init__("SequenceClassificationLoss", loss=loss, logz_coef=logz_coef,
                         label_smoothing=label_smoothing, softcap=softcap, ignore_index=ignore_index)

    def __call__(self, outputs: Any, labels: Tensor, num_items_in_batch: Optional[Union[int, Tensor]] = None) -> Tensor:
        logits = _field(outputs, "logits", self.owner)
        if labels is None:
            raise value_error(self.owner, "labels are required", "labels=None", "give the dataset a 'labels' column")
        if logits.dim() != 2 or labels.shape != logits.shape[:1]:
            raise value_error(self.owner, "logits must be (B, C) and labels (B,)",
                              f"shapes {tuple(logits.shape)} and {tuple(labels.shape)}",
                              "multi-label targets need a BCE loss, not this callable")
        total = self.summed(logits, labels)
        return normalize_by_items(total, (labels != self.ignore_index).sum(), num_items_in_batch)


class _LMLoss(_TokenLoss):
    causal = True

    def __call__(self, outputs: Any, labels: Tensor, num_items_in_batch: Optional[Union[int, Tensor]] = None) -> Tensor:
        logits = _field(outputs, "logits", self.owner)
        if labels is None:
            raise value_error(self.owner, "labels are required", "labels=None",
                              "give the dataset a 'labels' column (input_ids with -100 at padding)")
        if logits.dim() != 3 or labels.shape != logits.shape[:2]:
            raise value_error(self.owner, "logits must be (B, T, V) and labels (B, T)",
                              f"shapes {tuple(logits.shape)} and {tuple(labels.shape)}", "pass token-level labels")
        if self.causal:
            logits, labels = logits[:, :-1], labels[:, 1:]
        target = labels.reshape(-1)
        total = self.summed(logits.reshape(-1, logits.shape[-1]), target)
        return normalize_by_items(total, (target != self.ignore_index).sum(), num_items_in_batch)


class CausalLMLoss(_LMLoss):
    """``compute_loss_func`` for causal language modelling: ``outputs.logits (B, T, V)`` and
    ``labels (B, T)`` (usually the ``input_ids``, -100 at padding); position ``t`` predicts
    ``labels[:, t + 1]``. Arguments as :class:`SequenceClassificationLoss`."""

    causal = True

    def __init__(self, *, loss: Optional[nn.Module] = None, logz_coef: float = 0.0, label_smoothing: float = 0.0,
                 softcap: Optional[float] = None, ignore_index: int = -100) -> None:
        super().__init__("CausalLMLoss", loss=loss, logz_coef=logz_coef, label_smoothing=label_smoothing,
                         softcap=softcap, ignore_index=ignore_index)


class MaskedLMLoss(_LMLoss):
    """``compute_loss_func`` for masked (or any token-level) language modelling: position ``t``
    predicts ``labels[:, t]`` (-100 at the positions that are not predicted). Arguments as
    :class:`SequenceClassificationLoss`."""

    causal = False

    def __init__(self, *, loss: Optional[nn.Module] = None, logz_coef: float = 0.0, label_smoothing: float = 0.0,
                 softcap: Optional[float] = None, ignore_index: int = -100) -> None:
        super().__init__("MaskedLMLoss", loss=loss, logz_coef=logz_coef, label_smoothing=label_smoothing,
                         softcap=softcap, ignore_index=ignore_index)


class LinearCrossEntropyCausalLMLoss:
    """``compute_loss_func`` for a causal LM through the chunked many-class path.

    ``loss = sum_t linear_cross_entropy(h_t, labels_{t+1}, head.weight, bias=head.bias) / num_items``
    with ``h = outputs.hidden_states[-1]`` (the input of the output head; the model must be
    configured with ``output_hidden_states=True``), the log-Z penalty ``logz_coef`` (PaLM default
    1e-4), ``label_smoothing`` and ``softcap`` as :func:`losses.linear_cross_entropy`, class chunks
    of ``chunk_size`` (``None``: chosen from the sizes). Equal in value and gradient to
    :class:`CausalLMLoss` with the same options on ``head(h)``.

    Args:
        head: the output layer (``model.get_output_embeddings()``; an ``nn.Linear`` or anything with a
            ``(V, D)`` ``weight`` and an optional ``(V,)`` ``bias``; a tied embedding works).
        causal: ``True`` shifts the labels as :class:`CausalLMLoss`; ``False`` as :class:`MaskedLMLoss`.
    """

    def __init__(self, head: nn.Module, *, logz_coef: float = 1e-4, label_smoothing: float = 0.0,
                 softcap: Optional[float] = None, chunk_size: Optional[int] = None, ignore_index: int = -100,
                 causal: bool = True) -> None:
        owner = "LinearCrossEntropyCausalLMLoss"
        require("transformers", "transformers", owner)
        weight = getattr(head, "weight", None)
        if not isinstance(weight, Tensor) or weight.dim() != 2:
            raise type_error(owner, "head must have a (V, D) weight", type(head).__name__,
                             "pass model.get_output_embeddings()")
        if not isinstance(causal, bool):
            raise type_error(owner, "causal must be a bool", type(causal).__name__, "pass True or False")
        self.owner = owner
        self.head = head
        self.logz_coef = check_number(owner, "logz_coef", logz_coef, low=0.0)
        self.label_smoothing = check_number(owner, "label_smoothing", label_smoothing, low=0.0, high=1.0)
        self.softcap = check_softcap(owner, softcap)
        self.chunk_size = chunk_size
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.causal = causal

    def __call__(self, outputs: Any, labels: Tensor, num_items_in_batch: Optional[Union[int, Tensor]] = None) -> Tensor:
        hidden = _field(outputs, "hidden_states", self.owner)[-1]
        if labels is None or hidden.dim() != 3 or labels.shape != hidden.shape[:2]:
            raise value_error(self.owner, "hidden states must be (B, T, D) and labels (B, T)",
                              f"shapes {tuple(hidden.shape)} and {None if labels is None else tuple(labels.shape)}",
                              "pass token-level labels")
        if self.causal:
            hidden, labels = hidden[:, :-1], labels[:, 1:]
        target = labels.reshape(-1)
        bias = getattr(self.head, "bias", None)
        total = linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), target, self.head.weight,
                                     bias=bias if isinstance(bias, Tensor) else None, chunk_size=self.chunk_size,
                                     ignore_index=self.ignore_index, reduction="sum",
                                     label_smoothing=self.label_smoothing, logz_coef=self.logz_coef,
                                     softcap=self.softcap)
        return normalize_by_items(total, (target != self.ignore_index).sum(), num_items_in_batch)
