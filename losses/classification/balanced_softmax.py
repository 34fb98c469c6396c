"""Balanced softmax: cross-entropy on logits shifted by the log class counts, for long-tailed labels.

J. Ren, C. Yu, S. Sheng, X. Ma, H. Zhao, S. Yi, H. Li, *Balanced Meta-Softmax for Long-Tailed
Visual Recognition*, NeurIPS 2020, arXiv:2007.10740. Written from the maths of its equation (4).
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import Tensor, nn

from .._core import (
    as_class_vector,
    _checking,
    auto_extra_repr,
    check_floating,
    check_ignore_index,
    check_logits_dim,
    check_reduction,
    check_softmax_classes,
    check_tensor,
    compute_dtype,
    value_error,
)
from .._registry import position_unit_weights, register
from ._cross_entropy import softmax_cross_entropy

__all__ = ["balanced_softmax_loss", "BalancedSoftmaxLoss"]

CountsLike = Union[Tensor, Sequence[float]]


def _as_counts(fn: str, class_counts: object) -> Tensor:
    return as_class_vector(fn, "class_counts", class_counts, example="[500, 120, 8]",
                           what="the number of training samples of each class")


def _check_counts(fn: str, counts: Tensor, c: int) -> None:
    if tuple(counts.shape) != (c,):
        raise value_error(fn, f"class_counts must have shape ({c},), one count per class",
                          f"shape {tuple(counts.shape)}", "pass one count per class of input's dim 1")
    if _checking() and counts.numel() > 0:
        n = counts.detach()
        if n.is_floating_point():
            bad = ~torch.isfinite(n) | (n < 0)
        else:
            bad = n < 0
        if bool(bad.any()):
            first = int(bad.nonzero()[0, 0])
            raise value_error(fn, "class_counts must be non-negative and finite", f"class {first}: {n[first].item()}",
                              "count the training labels of each class")
        if not bool((n > 0).any()):
            raise value_error(fn, "class_counts is zero for every class", "all 0",
                              "count the training labels of each class")


def _check_targets_seen(fn: str, target: Tensor, counts: Tensor, ignore_index: int) -> None:
    """Data check: no target (id, or probability mass) on a class with count 0."""
    if not _checking() or target.numel() == 0:
        return
    unseen = (counts.detach() == 0).to(target.device)
    if not bool(unseen.any()):
        return
    if target.is_floating_point():
        mass = target.detach().movedim(1, -1)[..., unseen]
        hit = bool((mass > 0).any())
    else:
        valid = target != ignore_index
        ids = torch.where(valid, target, torch.zeros_like(target)).long()
        hit = bool((valid & unseen[ids.clamp(0, unseen.numel() - 1)]).any())
    if hit:
        classes = unseen.nonzero().flatten().tolist()
        raise value_error(fn, "target falls on a class with class_counts 0", f"zero-count classes {classes[:8]}",
                          "count the classes on the split the targets come from (a class never seen in training "
                          "is excluded from the softmax)")


def balanced_softmax_loss(
    input: Tensor,
    target: Tensor,
    class_counts: CountsLike,
    *,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Balanced softmax cross-entropy (Ren et al., NeurIPS 2020).

    With logits ``f = input[i, :, ...]``, class id ``y`` and the training counts ``n``:

    .. math::

        \ell = -\log \frac{n_y e^{f_y}}{\sum_k n_k e^{f_k}}

    i.e. :func:`losses.cross_entropy_loss` of ``input + log(class_counts)``: the softmax of the
    training distribution, whose label prior is ``n / sum(n)``, is fitted, so that ``softmax(f)``
    estimates the balanced (uniform-prior) posterior. Predict with the *unadjusted* logits
    (:meth:`BalancedSoftmaxLoss.predict_proba` gives ``softmax(input)``).

    **Classes with count 0.** ``log 0 = -inf``, the paper's maths taken as written: such a class
    is removed from the training softmax exactly as a ``-inf`` logit is (it adds nothing to the
    value and its logits get a gradient of exactly 0), so a class absent from the training split
    is neither pushed up nor down. A target on such a class is a contradiction (the counts must
    come from the split the targets are drawn from) and raises ``ValueError`` (a data check).

    Args:
        input: logits ``(N, C)`` or ``(N, C, d1, ..., dk)``, classes on dim 1, ``C >= 2``.
            ``-inf`` entries are masks (as in :func:`losses.cross_entropy_loss`); NaN and ``+inf``
            raise ``ValueError`` (data checks).
        target: integer ids ``(N,)`` / ``(N, d1, ..., dk)``, or class probabilities shaped like
            ``input`` (non-negative, summing to 1).
        class_counts: the number of training samples per class, a ``(C,)`` tensor (integer or
            float) or a list of ``C`` numbers: finite, non-negative, not all zero (``ValueError``
            otherwise: data checks; a wrong length is always checked). Only ratios matter, so
            frequencies give the same loss. Its gradient is not meant to be used.
        weight: optional per-class weights ``(C,)``, as in :func:`losses.cross_entropy_loss`.
        ignore_index: positions with this id give 0 and leave the ``"mean"`` denominator.
        reduction: ``"none"`` (shape ``(N, d1, ..., dk)``), ``"mean"`` or ``"sum"``.

    Unit: the position, weight ``weight[y]`` (1 without ``weight``), 0 where ``y ==
    ignore_index``; ``"mean"`` divides by the summed unit weights, as ``F.cross_entropy``. An
    all-ignored batch gives an exact, graph-attached 0. Half inputs are computed in float32,
    float64 stays float64, under ``torch.autocast`` the maths runs in float32.

    Paper: J. Ren, C. Yu, S. Sheng, X. Ma, H. Zhao, S. Yi, H. Li, *Balanced Meta-Softmax for
    Long-Tailed Visual Recognition*, NeurIPS 2020, arXiv:2007.10740. This is the balanced softmax
    alone, without the paper's meta-sampler. It equals :func:`losses.logit_adjusted_loss` with
    ``tau = 1`` wherever every count is positive.

    >>> import torch, losses
    >>> x, y = torch.tensor([[1.0, 0.5, -1.0]]), torch.tensor([2])
    >>> counts = torch.tensor([700, 200, 100])
    >>> ref = torch.nn.functional.cross_entropy(x + counts.float().log(), y)
    >>> bool(torch.isclose(losses.balanced_softmax_loss(x, y, counts), ref))
    True
    """
    fn = "balanced_softmax_loss"
    check_floating(fn, "input", input)
    counts = _as_counts(fn, class_counts)
    check_logits_dim(fn, input, target)
    check_softmax_classes(fn, input.shape[1])  # one class: the cross-entropy hint, before the lengths
    _check_counts(fn, counts, input.shape[1])
    check_tensor(fn, "target", target)
    _check_targets_seen(fn, target, counts, ignore_index)
    work = torch.promote_types(compute_dtype(input), counts.dtype if counts.is_floating_point() else torch.float32)
    shift = torch.log(counts.to(device=input.device, dtype=work))  # log 0 = -inf: the class is removed
    return softmax_cross_entropy(fn, input, target, weight=weight, ignore_index=ignore_index, reduction=reduction,
                                 logit_shift=shift)


class BalancedSoftmaxLoss(nn.Module):
    """Balanced softmax as a module (Ren et al., NeurIPS 2020, arXiv:2007.10740); the maths is
    :func:`losses.balanced_softmax_loss`.

    Args:
        class_counts: training samples per class ``(C,)`` (a tensor or a list of non-negative
            numbers), stored as the buffer ``class_counts``. Required.
        weight: optional per-class weights ``(C,)``, stored as the buffer ``weight``.
        ignore_index: target id whose positions are skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    ``forward(input, target)``: ``input (N, C)`` or ``(N, C, d1..dk)`` logits, ``target`` ids
    ``(N,)`` / ``(N, d1..dk)`` or probabilities shaped like ``input``. Returns a scalar for
    ``"mean"``/``"sum"``, ``(N, d1..dk)`` for ``"none"``.

    ``predict_proba(input)``: ``softmax(input)`` over dim 1, the unadjusted (balanced) prediction
    (the Lightning modules use it for accuracy and calibration).

    Buffers: ``class_counts`` (``(C,)``; a list or integer counts are kept in float64),
    ``weight`` (``(C,)`` or None).

    >>> import losses
    >>> losses.BalancedSoftmaxLoss(class_counts=[500, 120, 8])
    BalancedSoftmaxLoss(ignore_index=-100, reduction='mean')
    """

    def __init__(
        self,
        *,
        class_counts: CountsLike,
        weight: Optional[Tensor] = None,
        ignore_index: int = -100,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_reduction(name, reduction)
        counts = _as_counts(name, class_counts)
        if counts.dim() != 1:
            raise value_error(name, "class_counts must be 1-D, one count per class", f"shape {tuple(counts.shape)}",
                              "pass one count per class")
        if not counts.is_floating_point():
            counts = counts.double()  # counts are kept exactly (a list is float64 already)
        self.ignore_index = check_ignore_index(name, ignore_index)
        self.reduction = reduction
        self.register_buffer("class_counts", counts.clone())
        self.register_buffer("weight", None if weight is None else torch.as_tensor(weight))

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The balanced softmax loss of ``input`` against ``target``.

        Args:
            input: logits ``(N, C)`` or ``(N, C, d1..dk)``, classes on dim 1.
            target: class ids ``(N,)`` / ``(N, d1..dk)`` or probabilities shaped like ``input``.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-position losses ``(N, d1..dk)`` (``"none"``).
        """
        return balanced_softmax_loss(input, target, self.class_counts, weight=self.weight,
                                     ignore_index=self.ignore_index, reduction=self.reduction)

    def predict_proba(self, input: Tensor) -> Tensor:
        """``softmax(input)`` over the classes (dim 1): the unadjusted prediction (at least float32)."""
        x = input if input.dtype == torch.float64 else input.float()
        return torch.softmax(x, dim=1)

    extra_repr = auto_extra_repr


register(
    "balanced_softmax",
    function=balanced_softmax_loss,
    module=BalancedSoftmaxLoss,
    inputs="logits",
    unit="position",
    unit_weights=position_unit_weights,
    arxiv="2007.10740",
    paper="J. Ren, C. Yu, S. Sheng, X. Ma, H. Zhao, S. Yi, H. Li, Balanced Meta-Softmax for Long-Tailed Visual "
          "Recognition, NeurIPS 2020",
    example_kwargs={"class_counts": [40, 25, 15, 12, 8]},  # C = 5, the registry's example logits
    softmax=True,
    masks=("neg_inf",),
    soft_targets=True,
    class_weight=True,
    weighted_mean=True,
    tensor_args=("class_counts", "weight"),
)
