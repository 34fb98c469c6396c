"""Orthogonal Projection Loss (OPL), an auxiliary loss on penultimate features (docs/losses/opl.md).

K. Ranasinghe, M. Naseer, M. Hayat, S. Khan, F. S. Khan, *Orthogonal Projection Loss*, ICCV 2021,
arXiv:2103.14021. Reference code: ``kahnchana/opl`` (MIT); implemented here from the maths only.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._core import (
    check_ignore_index,
    auto_extra_repr,
    check_bool,
    attached_zero,
    check_choice,
    check_finite,
    check_number,
    check_reduction,
    compute_dtype,
    upcast,
)
from .._distributed import all_gather_no_grad, all_gather_with_grad
from .._heads import check_embeddings_and_target, drop_rows
from .._precision import matmul
from .._registry import register

__all__ = ["opl_loss", "OrthogonalProjectionLoss"]

VARIANTS = ("paper", "reference")
NEG_TERMS = ("abs_of_mean", "mean_abs", "mean")
_REF_EPS = 1e-6  # the reference divides pair sums by (count + 1e-6)


def opl_loss(
    embeddings: Tensor,
    target: Tensor,
    *,
    gamma: float = 0.5,
    variant: str = "paper",
    neg_term: Optional[str] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    return_stats: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor, Tensor]]:
    r"""Orthogonal Projection Loss: pull same-class features together, push classes orthogonal.

    With ``f = embeddings`` (``(N, D)``), ``y = target`` (``(N,)`` integer ids) and the cosine
    matrix ``G_ij = <normalize(f_i), normalize(f_j)>`` (``normalize(v) = v / max(||v||, 1e-12)``)::

        P = {(i, j): i != j, y_i == y_j},   N = {(i, j): y_i != y_j}          (ordered pairs)
        s = mean_P G   (0 if P is empty),   d = mean_N G   (0 if N is empty)
        L = (1 - s) + gamma * |d|

    Rows whose id equals ``ignore_index`` are dropped first; any other integer is a class id
    (ids are only compared for equality, so negative ids are allowed). ``L`` is one number for
    the whole batch (batch-level loss): only ``reduction="mean"`` is accepted.

    Variants (``variant``) and the negative term (``neg_term`` overrides the variant's form):

    * ``"paper"`` (default): ``gamma * |mean_N G|`` (``neg_term="abs_of_mean"``), means with the
      empty-set rule above.
    * ``"reference"``: ``gamma * mean_N |G|`` (``neg_term="mean_abs"``) with every mean taken as
      ``sum / (count + 1e-6)``, as the code behind the published numbers.
    * ``neg_term="mean"``: ``gamma * mean_N G`` without an absolute value, the top-level
      ``loss.py`` the reference README tells users to copy.

    The three forms agree on non-negative (post-ReLU) features. ``|.|`` has subgradient 0 at 0.

    Defaults: ``gamma=0.5`` as the reference README (its ImageNet scripts use 2.0); the paper's
    equation ``(1 - s) + |d|`` is ``gamma=1.0``. Train with ``CE + lambda * L`` (README:
    ``lambda = 1``; ImageNet scripts: 0.1).

    Edge cases: an empty or all-ignored batch gives an exact, graph-attached 0; all ids distinct
    give ``s = 0``; one sample gives ``L = 1`` with zero gradient; one class gives ``d = 0``;
    zero features have cosine 0 with everything and a finite gradient.

    Args:
        embeddings: ``(N, D)`` floating features (any sign; half inputs are computed in float32,
            also inside ``torch.autocast``, forward and backward). Ignored rows are dropped
            before any arithmetic (their values never matter).
        target: ``(N,)`` integer class ids.
        gamma: weight of the negative term, ``>= 0``.
        variant: ``"paper"`` or ``"reference"``.
        neg_term: ``None`` (as the variant says), ``"abs_of_mean"``, ``"mean_abs"`` or ``"mean"``.
        ignore_index: id of rows to drop.
        reduction: only ``"mean"``.
        return_stats: also return ``s`` and ``d`` (``mean_P G`` and ``mean_N G`` with the
            variant's means), both in ``[-1, 1]``.

    Returns:
        The scalar loss in the compute dtype, or ``(loss, s, d)`` if ``return_stats``.

    Paper: K. Ranasinghe, M. Naseer, M. Hayat, S. Khan, F. S. Khan, "Orthogonal Projection Loss",
    ICCV 2021, arXiv:2103.14021.

    >>> import torch, losses
    >>> f = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    >>> float(losses.opl_loss(f, torch.tensor([0, 0, 1])))  # s = 1, d = 0
    0.0
    >>> loss, s, d = losses.opl_loss(f, torch.tensor([0, 1, 1]), gamma=1.0, return_stats=True)
    >>> float(s), float(d), float(loss)
    (0.0, 0.5, 1.5)
    """
    fn = "opl_loss"
    check_embeddings_and_target(fn, embeddings, target)
    check_reduction(fn, reduction, allowed=("mean",))
    check_ignore_index(fn, ignore_index)
    check_bool(fn, "return_stats", return_stats)
    gamma = check_number(fn, "gamma", gamma, low=0.0)
    check_choice(fn, "variant", variant, VARIANTS)
    if neg_term is not None:
        check_choice(fn, "neg_term", neg_term, NEG_TERMS)
    form = neg_term if neg_term is not None else ("abs_of_mean" if variant == "paper" else "mean_abs")
    check_finite(fn, "embeddings", embeddings)

    dtype = compute_dtype(embeddings)
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        valid = target != ignore_index  # ignored rows are dropped (zeroed) before any arithmetic
        f = F.normalize(upcast(drop_rows(embeddings, valid), dtype), p=2.0, dim=1, eps=1e-12)
        g = matmul(f, f.transpose(0, 1))  # (N, N) cosines

        pair_valid = valid.unsqueeze(1) & valid.unsqueeze(0)
        same = target.unsqueeze(1) == target.unsqueeze(0)
        n = embeddings.shape[0]
        off_diag = ~torch.eye(n, dtype=torch.bool, device=embeddings.device)
        pos = (same & off_diag & pair_valid).to(dtype)
        neg = (~same & pair_valid).to(dtype)
        n_pos, n_neg = pos.sum(), neg.sum()

        if variant == "paper":
            def mean_over(values: Tensor, mask: Tensor, count: Tensor) -> Tensor:
                return (values * mask).sum() / torch.where(count > 0, count, torch.ones_like(count))
        else:
            def mean_over(values: Tensor, mask: Tensor, count: Tensor) -> Tensor:
                return (values * mask).sum() / (count + _REF_EPS)

        s = mean_over(g, pos, n_pos)
        d = mean_over(g, neg, n_neg)
        if form == "abs_of_mean":
            neg_value = d.abs()
        elif form == "mean_abs":
            neg_value = mean_over(g.abs(), neg, n_neg)
        else:
            neg_value = d
        loss = (1.0 - s) + gamma * neg_value
        # empty / all-ignored batch: exact 0, still attached to the graph (zero gradients)
        loss = torch.where(valid.any(), loss, torch.zeros((), dtype=dtype, device=loss.device))
        loss = loss + attached_zero(embeddings, dtype=dtype)
    if return_stats:
        return loss, s, d
    return loss


class OrthogonalProjectionLoss(nn.Module):
    """Orthogonal Projection Loss (arXiv:2103.14021) as a module; the maths is
    :func:`losses.opl_loss`.

    An auxiliary loss: add ``lambda * OrthogonalProjectionLoss()(features, target)`` to the
    classification loss. It owns no parameters or buffers (and has no ``.logits``).

    Args:
        gamma: weight ``>= 0`` of the negative term (default 0.5).
        variant: ``"paper"`` (default) or ``"reference"``.
        neg_term: ``None`` (default: as the variant says), ``"abs_of_mean"``, ``"mean_abs"`` or
            ``"mean"``.
        ignore_index: target id whose rows are dropped (default -100).
        reduction: only ``"mean"`` (a batch-level loss).
        return_stats: also return the positive and negative means ``(s, d)`` (default False).
        gather_distributed: compute the loss of the global batch under DDP (default False).

    ``forward(embeddings, target)``: ``embeddings (N, D)``, ``target`` ids ``(N,)``; returns a
    scalar, or ``(loss, s, d)`` with ``return_stats``.

    ``gather_distributed=True`` all-gathers the embeddings (the backward sums over ranks) and the
    labels from every rank of the default process group and computes the loss of the global
    batch, identical on every rank; each rank's features receive ``world_size`` x their
    single-process gradient, which DDP's averaging turns back into the single-process step.
    Every rank must pass the same batch size (else ``ValueError``). Without an initialised
    multi-rank process group it is a no-op.
    """

    def __init__(
        self,
        *,
        gamma: float = 0.5,
        variant: str = "paper",
        neg_term: Optional[str] = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        return_stats: bool = False,
        gather_distributed: bool = False,
    ) -> None:
        super().__init__()
        name = "OrthogonalProjectionLoss"
        check_reduction(name, reduction, allowed=("mean",))
        self.gamma = check_number(name, "gamma", gamma, low=0.0)
        check_choice(name, "variant", variant, VARIANTS)
        if neg_term is not None:
            check_choice(name, "neg_term", neg_term, NEG_TERMS)
        self.variant = variant
        self.neg_term = neg_term
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction
        self.return_stats = check_bool("OrthogonalProjectionLoss", "return_stats", return_stats)
        self.gather_distributed = check_bool("OrthogonalProjectionLoss", "gather_distributed", gather_distributed)

    def forward(self, embeddings: Tensor, target: Tensor):
        """The OPL of ``embeddings`` (gathered over ranks with ``gather_distributed``).

        Args:
            embeddings: floating features ``(N, D)``.
            target: integer class ids ``(N,)``.

        Returns:
            The scalar loss, or ``(loss, s, d)`` when ``return_stats``.
        """
        if self.gather_distributed:
            fn = "OrthogonalProjectionLoss"
            embeddings = all_gather_with_grad(embeddings, fn=fn)
            target = all_gather_no_grad(target, fn=fn)
        return opl_loss(embeddings, target, gamma=self.gamma, variant=self.variant, neg_term=self.neg_term,
                        ignore_index=self.ignore_index, reduction=self.reduction, return_stats=self.return_stats)

    extra_repr = auto_extra_repr


register(
    "opl",
    function=opl_loss,
    module=OrthogonalProjectionLoss,
    inputs="embeddings",
    unit="batch",
    unit_weights=None,
    arxiv="2103.14021",
    paper="Ranasinghe et al., Orthogonal Projection Loss, ICCV 2021",
    auxiliary=True,
    example_kwargs={},
)
