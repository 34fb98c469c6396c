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

import functools
from typing import Any, List, NamedTuple, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._core import check_bool, check_ignore_index, check_int, check_number, type_error, value_error
from .._softcap import apply_softcap, check_softcap
from .._stats import LossStats, token_stats
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
    "shifted_targets",
    "patch_causal_lm",
    "logit_transform",
    "LogitTransform",
    "DEFAULT_LOGZ_COEF",
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


#: The one default of every callable here and of :func:`patch_causal_lm`: no log-Z penalty, so
#: that each equals Hugging Face's own loss unless asked otherwise (PaLM's value is 1e-4).
DEFAULT_LOGZ_COEF = 0.0


def shifted_targets(labels: Tensor, ignore_index: int = -100, shift_labels: Optional[Tensor] = None) -> Tensor:
    """The target of every position of a causal LM's ``(B, T, V)`` logits, ``(B, T)``: position
    ``t`` predicts ``labels[:, t + 1]`` and the last position ``ignore_index``, or
    ``shift_labels`` as given (already aligned, e.g. by a padding-free collator or under context
    parallelism; then ``labels`` is not read). The logits keep all ``T`` positions, so nothing
    of size ``B x T x V`` is copied (the shift moves the ``(B, T)`` labels instead)."""
    if shift_labels is not None:
        return shift_labels
    return F.pad(labels, (0, 1), value=ignore_index)[..., 1:]


def _check_owned_loss(owner: str, loss: Optional[nn.Module]) -> None:
    if loss is None:
        return
    if not isinstance(loss, nn.Module):
        raise type_error(owner, "loss must be an nn.Module", type(loss).__name__,
                         "pass e.g. losses.Entmax15Loss(reduction='sum')")
    if getattr(loss, "reduction", None) != "sum":
        raise value_error(owner, "loss must be built with reduction='sum'", repr(getattr(loss, "reduction", None)),
                          "the callable divides the sum by the number of target tokens")


class _Options:
    """The options every callable here checks the same way (``"<owner>: ..."`` errors), and the
    statistics of its last call."""

    def __init__(self, owner: str, *, logz_coef: float, label_smoothing: float, softcap: Optional[float],
                 ignore_index: int, stats: bool) -> None:
        self.owner = owner
        self.logz_coef = check_number(owner, "logz_coef", logz_coef, low=0.0)
        self.label_smoothing = check_number(owner, "label_smoothing", label_smoothing, low=0.0, high=1.0)
        self.softcap = check_softcap(owner, softcap)
        self.ignore_index = check_ignore_index(owner, ignore_index)
        self.stats = check_bool(owner, "stats", stats)
        #: the :class:`losses.LossStats` of the last call when built with ``stats=True``
        self.last_stats: Optional[LossStats] = None


class _TokenLoss(_Options):
    """Shared maths: summed token loss over ``(N, C)`` logits and ``(N,)`` ids."""

    def __init__(self, owner: str, *, loss: Optional[nn.Module], logz_coef: float, label_smoothing: float,
                 softcap: Optional[float], ignore_index: int, stats: bool = False) -> None:
        require("transformers", "transformers", owner)
        super().__init__(owner, logz_coef=logz_coef, label_smoothing=label_smoothing, softcap=softcap,
                         ignore_index=ignore_index, stats=stats)
        _check_owned_loss(owner, loss)
        if loss is not None and (self.logz_coef or self.label_smoothing or self.softcap is not None):
            raise value_error(owner, "logz_coef, label_smoothing and softcap apply to the built-in "
                              "cross-entropy only", f"loss={type(loss).__name__}",
                              "configure the given loss itself, or leave loss=None")
        self.loss = loss

    def summed(self, logits: Tensor, target: Tensor) -> Tensor:
        if self.loss is None and self.stats and self.label_smoothing == 0:
            # cross-entropy (+ the penalty) with log Z from the pass that computes the loss
            st = cross_entropy_with_logz_penalty(logits, target, coef=self.logz_coef, ignore_index=self.ignore_index,
                                                 reduction="sum", softcap=self.softcap, return_stats=True)
            self.last_stats = st
            return st.loss
        if self.loss is not None:
            keep = target != self.ignore_index
            total = self.loss(logits[keep], target[keep])
        elif self.logz_coef > 0 and self.label_smoothing == 0:
            total = cross_entropy_with_logz_penalty(logits, target, coef=self.logz_coef,
                                                    ignore_index=self.ignore_index, reduction="sum",
                                                    softcap=self.softcap)
        else:
            total = cross_entropy_loss(logits, target, label_smoothing=self.label_smoothing,
                                       ignore_index=self.ignore_index, reduction="sum", softcap=self.softcap)
        lse = None
        if self.logz_coef > 0 and self.label_smoothing > 0 and self.loss is None:
            # label smoothing and the penalty together: the penalty term added to the smoothed CE
            lse = _row_lse(logits, self.softcap)
            keep = target != self.ignore_index
            total = total + self.logz_coef * torch.where(keep, lse * lse, torch.zeros_like(lse)).sum()
        if self.stats:  # label smoothing or a loss of its own: log Z read from the logits once more
            self.last_stats = self._stats(total, logits, target, lse)
        return total

    def _stats(self, total: Tensor, logits: Tensor, target: Tensor, lse: Optional[Tensor]) -> LossStats:
        with torch.no_grad():
            keep = target != self.ignore_index
            if lse is None:
                lse = _row_lse(logits, self.softcap)
            pen = self.logz_coef * torch.where(keep, lse * lse, torch.zeros_like(lse)).sum()
            return token_stats(total, lse.detach(), pen, logits.argmax(dim=-1), target, keep)


def _row_lse(logits: Tensor, softcap: Optional[float]) -> Tensor:
    """``log Z`` per row of the (soft-capped) logits, in float32 or wider (``-inf`` stays a mask)."""
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return torch.logsumexp(apply_softcap(z, softcap), dim=-1)


class SequenceClassificationLoss(_TokenLoss):
    """``compute_loss_func`` for sequence classification: ``outputs.logits (B, C)``, ``labels (B,)``
    class ids (``ignore_index`` rows skipped).

    Args:
        loss: optional library logits loss built with ``reduction="sum"`` (default: softmax
            cross-entropy / the log-Z penalty below).
        logz_coef: PaLM log-Z penalty coefficient ("z-loss" in PaLM and Liger-Kernel's
            ``lse_square_scale``; default :data:`DEFAULT_LOGZ_COEF` = 0, plain cross-entropy).
        label_smoothing: as :func:`torch.nn.functional.cross_entropy` (with or without the penalty).
        softcap: final-logit soft-capping (``None`` = off).
        ignore_index: the label that marks "no target" (-100).
        stats: keep a :class:`losses.LossStats` of each call in ``last_stats`` (log Z per row, the
            penalty part, the accuracy): from the pass that computes the loss
            (:func:`losses.cross_entropy_with_logz_penalty` with ``return_stats=True``), or, with
            label smoothing or ``loss=``, from one more read of the logits.
    """

    def __init__(self, *, loss: Optional[nn.Module] = None, logz_coef: float = DEFAULT_LOGZ_COEF,
                 label_smoothing: float = 0.0, softcap: Optional[float] = None, ignore_index: int = -100,
                 stats: bool = False) -> None:
        super().__init__("SequenceClassificationLoss", loss=loss, logz_coef=logz_coef,
                         label_smoothing=label_smoothing, softcap=softcap, ignore_index=ignore_index, stats=stats)

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

    def __call__(self, outputs: Any, labels: Optional[Tensor], num_items_in_batch: Optional[Union[int, Tensor]] = None,
                 shift_labels: Optional[Tensor] = None) -> Tensor:
        logits = _field(outputs, "logits", self.owner)
        if labels is None and shift_labels is None:
            raise value_error(self.owner, "labels are required", "labels=None",
                              "give the dataset a 'labels' column (input_ids with -100 at padding)")
        aligned = labels if shift_labels is None else shift_labels
        if logits.dim() != 3 or aligned.shape != logits.shape[:2]:
            what = "labels" if shift_labels is None else "shift_labels"
            raise value_error(self.owner, f"logits must be (B, T, V) and {what} (B, T)",
                              f"shapes {tuple(logits.shape)} and {tuple(aligned.shape)}", "pass token-level labels")
        target = shifted_targets(labels, self.ignore_index, shift_labels) if self.causal else aligned
        target = target.reshape(-1)
        total = self.summed(logits.reshape(-1, logits.shape[-1]), target)
        return normalize_by_items(total, (target != self.ignore_index).sum(), num_items_in_batch)


class CausalLMLoss(_LMLoss):
    """``compute_loss_func`` for causal language modelling: ``outputs.logits (B, T, V)`` and
    ``labels (B, T)`` (usually the ``input_ids``, -100 at padding); position ``t`` predicts
    ``labels[:, t + 1]`` (:func:`shifted_targets`: the labels move, the logits are not copied).
    ``__call__(outputs, labels, num_items_in_batch=None, shift_labels=None)``: ``shift_labels``
    ``(B, T)`` are targets already aligned with the positions (as Hugging Face's
    ``ForCausalLMLoss`` takes them); ``labels`` may then be ``None``. Arguments as
    :class:`SequenceClassificationLoss`."""

    causal = True

    def __init__(self, *, loss: Optional[nn.Module] = None, logz_coef: float = DEFAULT_LOGZ_COEF,
                 label_smoothing: float = 0.0, softcap: Optional[float] = None, ignore_index: int = -100,
                 stats: bool = False) -> None:
        super().__init__("CausalLMLoss", loss=loss, logz_coef=logz_coef, label_smoothing=label_smoothing,
                         softcap=softcap, ignore_index=ignore_index, stats=stats)


class MaskedLMLoss(_LMLoss):
    """``compute_loss_func`` for masked (or any token-level) language modelling: position ``t``
    predicts ``labels[:, t]`` (-100 at the positions that are not predicted); ``shift_labels``,
    when given, are used in place of ``labels``. Arguments as :class:`SequenceClassificationLoss`."""

    causal = False

    def __init__(self, *, loss: Optional[nn.Module] = None, logz_coef: float = DEFAULT_LOGZ_COEF,
                 label_smoothing: float = 0.0, softcap: Optional[float] = None, ignore_index: int = -100,
                 stats: bool = False) -> None:
        super().__init__("MaskedLMLoss", loss=loss, logz_coef=logz_coef, label_smoothing=label_smoothing,
                         softcap=softcap, ignore_index=ignore_index, stats=stats)


class _HeadLoss(_Options):
    """The head-level maths shared by :class:`LinearCrossEntropyCausalLMLoss` and
    :func:`patch_causal_lm`: ``sum_t linear_cross_entropy(scale * h_t, y_t, W, bias=scale * b)``."""

    def __init__(self, owner: str, *, logz_coef: float, label_smoothing: float, softcap: Optional[float],
                 chunk_size: Optional[int], ignore_index: int, class_weight: Optional[Tensor], stats: bool) -> None:
        super().__init__(owner, logz_coef=logz_coef, label_smoothing=label_smoothing, softcap=softcap,
                         ignore_index=ignore_index, stats=stats)
        if chunk_size is not None:
            check_int(owner, "chunk_size", chunk_size, low=1, allow_none=True,
                      hint="use None to choose it from N and V")
        self.chunk_size = chunk_size
        self.class_weight = class_weight

    def head_sum(self, hidden: Tensor, target: Tensor, weight: Tensor, bias: Optional[Tensor], *,
                 scale: float = 1.0, softcap: Optional[float] = None) -> Tensor:
        if scale != 1.0:
            hidden = hidden * scale
            bias = None if bias is None else bias * scale
        out = linear_cross_entropy(hidden, target, weight, bias=bias, chunk_size=self.chunk_size,
                                   ignore_index=self.ignore_index, reduction="sum",
                                   label_smoothing=self.label_smoothing, logz_coef=self.logz_coef,
                                   softcap=softcap, class_weight=self.class_weight, return_stats=self.stats)
        if self.stats:
            self.last_stats = out
            return out.loss
        return out


class LinearCrossEntropyCausalLMLoss(_HeadLoss):
    """``compute_loss_func`` for a causal LM through the chunked many-class path.

    ``loss = sum_t linear_cross_entropy(h_t, labels_{t+1}, head.weight, bias=head.bias) / num_items``
    with ``h = outputs.hidden_states[-1]`` (the input of the output head; the model must be
    configured with ``output_hidden_states=True``), the log-Z penalty ``logz_coef`` (default
    :data:`DEFAULT_LOGZ_COEF` = 0, as every callable here; PaLM used 1e-4), ``label_smoothing``,
    ``softcap`` and ``class_weight`` as :func:`losses.linear_cross_entropy`, class chunks of
    ``chunk_size`` (``None``: chosen from the sizes). Equal in value and gradient to
    :class:`CausalLMLoss` with the same options on ``head(h)``. The model still builds its own
    logits in ``forward``: :func:`patch_causal_lm` is the way to train without them.

    Args:
        head: the output layer (``model.get_output_embeddings()``; an ``nn.Linear`` or anything with a
            ``(V, D)`` ``weight`` and an optional ``(V,)`` ``bias``; a tied embedding works).
        causal: ``True`` shifts the labels as :class:`CausalLMLoss`; ``False`` as :class:`MaskedLMLoss`.
        stats: keep the :class:`losses.LossStats` of each call (same pass) in ``last_stats``.
    """

    def __init__(self, head: nn.Module, *, logz_coef: float = DEFAULT_LOGZ_COEF, label_smoothing: float = 0.0,
                 softcap: Optional[float] = None, chunk_size: Optional[int] = None, ignore_index: int = -100,
                 causal: bool = True, class_weight: Optional[Tensor] = None, stats: bool = False) -> None:
        owner = "LinearCrossEntropyCausalLMLoss"
        require("transformers", "transformers", owner)
        weight = getattr(head, "weight", None)
        if not isinstance(weight, Tensor) or weight.dim() != 2:
            raise type_error(owner, "head must have a (V, D) weight", type(head).__name__,
                             "pass model.get_output_embeddings()")
        if not isinstance(causal, bool):
            raise type_error(owner, "causal must be a bool", type(causal).__name__, "pass True or False")
        super().__init__(owner, logz_coef=logz_coef, label_smoothing=label_smoothing, softcap=softcap,
                         chunk_size=chunk_size, ignore_index=ignore_index, class_weight=class_weight, stats=stats)
        self.head = head
        self.causal = causal

    def __call__(self, outputs: Any, labels: Optional[Tensor], num_items_in_batch: Optional[Union[int, Tensor]] = None,
                 shift_labels: Optional[Tensor] = None) -> Tensor:
        hidden = _field(outputs, "hidden_states", self.owner)[-1]
        aligned = labels if shift_labels is None else shift_labels
        if aligned is None or hidden.dim() != 3 or aligned.shape != hidden.shape[:2]:
            raise value_error(self.owner, "hidden states must be (B, T, D) and labels (B, T)",
                              f"shapes {tuple(hidden.shape)} and {None if aligned is None else tuple(aligned.shape)}",
                              "pass token-level labels")
        target = (shifted_targets(labels, self.ignore_index, shift_labels) if self.causal else aligned).reshape(-1)
        bias = getattr(self.head, "bias", None)
        total = self.head_sum(hidden.reshape(-1, hidden.shape[-1]), target, self.head.weight,
                              bias if isinstance(bias, Tensor) else None, softcap=self.softcap)
        return normalize_by_items(total, (target != self.ignore_index).sum(), num_items_in_batch)


# --------------------------------------------------------------------------------------
# patching a causal LM so that training never builds its logits
# --------------------------------------------------------------------------------------


class LogitTransform(NamedTuple):
    """What a causal LM does to its head's output before the loss: ``softcap(scale * head(h))``,
    ``softcap(z) = c * tanh(z / c)`` (``None``: off)."""

    scale: float = 1.0
    softcap: Optional[float] = None

    def apply(self, logits: Tensor) -> Tensor:
        """The transform on given head outputs (for checks and evaluation)."""
        z = logits * self.scale if self.scale != 1.0 else logits
        return z if self.softcap is None else self.softcap * torch.tanh(z / self.softcap)


def _config_value(model: nn.Module, name: str) -> Optional[float]:
    config = getattr(model, "config", None)
    for cfg in (config, getattr(config, "text_config", None), getattr(config, "get_text_config", lambda: None)()):
        value = getattr(cfg, name, None) if cfg is not None else None
        if value is not None:
            return float(value)
    return None


def logit_transform(model: nn.Module) -> LogitTransform:
    """The transform between a causal LM's output head and its loss, read from the model and its
    config (or its ``text_config``): Cohere's ``logit_scale`` and ``output_multiplier`` (multiply),
    Granite's ``logits_scaling`` (divides), ``final_logit_softcapping`` (Gemma 2 and later) or
    ``logits_soft_cap`` (RecurrentGemma): ``c * tanh(z / c)`` after the scaling. A model that does
    something else to its logits is caught by :func:`patch_causal_lm`'s first-call check."""
    scale = 1.0
    own = getattr(model, "logit_scale", None)
    if isinstance(own, (int, float)) and not isinstance(own, bool):
        scale *= float(own)
    elif isinstance(own, Tensor) and own.numel() == 1:
        scale *= float(own)
    else:
        value = _config_value(model, "logit_scale")
        if value is not None:
            scale *= value
    multiplier = _config_value(model, "output_multiplier")
    if multiplier is not None:
        scale *= multiplier
    divisor = _config_value(model, "logits_scaling")
    if divisor is not None:
        scale /= divisor
    cap = _config_value(model, "final_logit_softcapping")
    return LogitTransform(scale=scale, softcap=cap if cap is not None else _config_value(model, "logits_soft_cap"))


def patch_causal_lm(model: nn.Module, loss: Optional[nn.Module] = None, *, logz_coef: float = DEFAULT_LOGZ_COEF,
                    label_smoothing: float = 0.0, chunk_size: Optional[int] = None,
                    class_weight: Optional[Tensor] = None, ignore_index: int = -100, stats: bool = False,
                    check_transform: bool = True) -> nn.Module:
    """Make a Hugging Face ``...ForCausalLM`` compute its training loss from the hidden states,
    without ever building the ``(B, T, V)`` logits. Returns the model (patched in place).

    A call of the patched ``model(...)`` **with** ``labels`` (or ``shift_labels``) runs the model
    up to its output head, takes the head's input ``h (B, T, D)`` there and returns the model's
    own output class with ``loss`` set and ``logits=None`` (as Liger-Kernel's patched models do):

    ``loss = sum_t linear_cross_entropy(scale * h_t, y_t, W, bias=scale * b, softcap=c) / n``

    with the head's ``W`` / ``b``, ``y`` the shifted labels (:func:`shifted_targets`, or the
    ``shift_labels`` given), ``n`` the ``num_items_in_batch`` the ``Trainer`` passes (else this
    batch's target count) and ``scale`` / ``c`` the model's own logit transform read from its
    config (:func:`logit_transform`: Cohere ``logit_scale``, Granite ``logits_scaling``, Gemma 2
    ``final_logit_softcapping``). With the defaults it equals the unpatched model's built-in loss.
    A call **without** labels (evaluation, ``generate``) runs the original ``forward`` unchanged.

    Args:
        model: a causal LM whose ``forward`` calls ``get_output_embeddings()`` once on the final
            hidden states (every ``...ForCausalLM`` of ``transformers`` does).
        loss: ``None`` (the chunked cross-entropy above), or any library logits loss built with
            ``reduction="sum"`` (e.g. ``losses.Entmax15Loss(reduction="sum")``): the logits of the
            non-ignored positions are then built (transform included) and passed to it.
        logz_coef, label_smoothing, chunk_size, class_weight: as :func:`losses.linear_cross_entropy`
            (``logz_coef`` is PaLM's "z-loss"; default 0).
        ignore_index: the label that marks "no target" (-100).
        stats: keep the :class:`losses.LossStats` of each training call in
            ``model.loss_stats`` (log Z, the penalty part, the token accuracy; same pass).
        check_transform: on the first training call, check the transform read from the config on
            the first position's logits against the model's own (one ``B x V`` head product) and
            raise ``ValueError`` if the model transforms its logits in another way.

    Works with the ``Trainer`` (which then passes ``num_items_in_batch`` to ``forward``, so
    gradient accumulation is normalised as the model's own loss) and with a plain loop. Call it
    before wrapping the model (``torch.compile``, DDP, FSDP).
    """
    owner = "patch_causal_lm"
    require("transformers", "transformers", owner)
    if not isinstance(model, nn.Module) or not callable(getattr(model, "get_output_embeddings", None)):
        raise type_error(owner, "model must be a transformers model with an output head", type(model).__name__,
                         "pass a ...ForCausalLM model")
    head = model.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None), Tensor):
        raise value_error(owner, "the model has no output head with a (V, D) weight", type(model).__name__,
                          "pass a ...ForCausalLM model")
    if getattr(model, "_losses_patched", False):
        raise value_error(owner, "the model is patched already", type(model).__name__, "patch a model once")
    _check_owned_loss(owner, loss)
    if loss is not None and (logz_coef or label_smoothing or class_weight is not None):
        raise value_error(owner, "logz_coef, label_smoothing and class_weight apply to the built-in cross-entropy "
                          "only", f"loss={type(loss).__name__}", "configure the given loss itself, or leave loss=None")
    check_bool(owner, "check_transform", check_transform)
    maths = _HeadLoss(owner, logz_coef=logz_coef, label_smoothing=label_smoothing, softcap=None,
                      chunk_size=chunk_size, ignore_index=ignore_index, class_weight=class_weight, stats=stats)
    transform = logit_transform(model)
    original = model.forward
    state = {"checked": not check_transform}

    @functools.wraps(original)
    def forward(*args: Any, labels: Optional[Tensor] = None, shift_labels: Optional[Tensor] = None,
                num_items_in_batch: Optional[Union[int, Tensor]] = None, **kwargs: Any) -> Any:
        if labels is None and shift_labels is None:
            return original(*args, **kwargs)
        captured: List[Tensor] = []
        raw: List[Tensor] = []  # the head's output at the first position, on the checked call
        head_forward = head.forward
        first = state["checked"] is False

        def capture(hidden: Tensor) -> Tensor:
            # the head's input is all we need; the model's own transform then runs on the first
            # position's logits only (for the check) or on an empty tensor
            captured.append(hidden)
            if first:
                with torch.no_grad():
                    raw.append(head_forward(hidden[..., :1, :].detach()))
                return raw[-1].clone()  # the model may transform its copy in place
            return hidden.new_zeros(hidden.shape[:-1] + (0,))

        head.forward = capture
        try:
            out = original(*args, **kwargs)
        finally:
            del head.forward  # back to the class's forward
        if len(captured) != 1:
            raise RuntimeError(f"{owner}: the model called its output head {len(captured)} times in one forward "
                               "(expected once, on the final hidden states); this model cannot be patched")
        hidden = captured[0]
        if first:
            _check_transform(owner, model, out, raw[0], transform)
            state["checked"] = True
        target = shifted_targets(labels, maths.ignore_index, shift_labels)
        if target.shape != hidden.shape[:-1]:
            raise value_error(owner, "labels must be (B, T) like the input ids", f"shape {tuple(target.shape)}",
                              "pass token-level labels")
        target = target.reshape(-1).to(hidden.device)
        flat = hidden.reshape(-1, hidden.shape[-1])
        weight, bias = head.weight, getattr(head, "bias", None)
        bias = bias if isinstance(bias, Tensor) else None
        if loss is None:
            total = maths.head_sum(flat, target, weight, bias, scale=transform.scale, softcap=transform.softcap)
            if stats:
                model.loss_stats = maths.last_stats
        else:
            keep = target != maths.ignore_index
            total = loss(transform.apply(head_forward(flat[keep])), target[keep])
        value = normalize_by_items(total, (target != maths.ignore_index).sum(), num_items_in_batch)
        return _with_loss(out, value)

    model.forward = forward
    model._losses_patched = True
    return model


def _with_loss(out: Any, loss: Tensor) -> Any:
    if isinstance(out, tuple):  # return_dict=False: (loss, the rest without the logits)
        return (loss,) + tuple(out[1:])
    fields = {k: v for k, v in out.items() if k not in ("loss", "logits")}
    return type(out)(loss=loss, logits=None, **fields)


def _check_transform(owner: str, model: nn.Module, out: Any, raw: Tensor, transform: LogitTransform) -> None:
    """The model's own logits of the first position (``out``) against ``transform`` applied to the
    head's output there (``raw``); ``ValueError`` when they differ."""
    theirs = out.logits if not isinstance(out, tuple) else out[0]
    with torch.no_grad():
        ours = transform.apply(raw)
    if not isinstance(theirs, Tensor) or theirs.shape != ours.shape or not torch.allclose(
            theirs.float(), ours.float(), rtol=1e-3, atol=1e-3):
        raise ValueError(
            f"{owner}: {type(model).__name__} transforms its logits in a way not read from its config (got "
            f"{transform}); patching would change its loss: train it with CausalLMLoss on its logits, or "
            "pass check_transform=False if you know the transform read is right")
