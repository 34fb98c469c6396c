"""NBC-Softmax: softmax cross-entropy plus a batch-level centroid-separation term (docs/losses/nbc_softmax.md).

G. K. Kulatilleke, S. S. Chandra, M. Portmann, *NBC-Softmax: Darkweb Author fingerprinting and
migration tracking*, arXiv preprint 2022, arXiv:2212.08184. The reference repository
(``gayanku/NBC-Softmax``) has no licence file; nothing here is taken from it but the maths.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._core import (
    check_ignore_index,
    auto_extra_repr,
    check_bool,
    check_int,
    _checking,
    attached_zero,
    check_choice,
    check_finite,
    check_floating,
    check_ids_in_range,
    check_number,
    check_reduction,
    check_tensor,
    compute_dtype,
    reduce_weighted_values,
    upcast,
    value_error,
)
from .._distributed import all_gather_no_grad, all_gather_with_grad
from .._heads import check_embeddings_and_target, check_head_embeddings, check_softmax_classes, drop_rows
from .._core import no_autocast
from .._precision import matmul
from .._registry import register

__all__ = ["nbc_loss", "nbc_softmax_loss", "NBCSoftmaxLoss"]

VARIANTS = ("paper", "reference")
_REF_LOG_EPS = 1e-10  # the reference adds 1e-10 inside the log
_LOG_REF_EPS = math.log(_REF_LOG_EPS)


def _check_labels(fn: str, target: Tensor, num_classes: Optional[int], ignore_index: int) -> None:
    """Data check: ids < 0 other than ``ignore_index`` (and ``>= num_classes`` when known)."""
    if num_classes is not None:
        check_ids_in_range(fn, target, num_classes, ignore_index)
        return
    if not _checking() or target.numel() == 0:
        return
    bad = (target != ignore_index) & (target < 0)
    if bool(bad.any()):
        raise value_error(fn, "target has negative class ids other than ignore_index",
                          f"min={int(target[bad].min())}, ignore_index={ignore_index}",
                          "class ids must be >= 0; mark rows to skip with ignore_index")


def _nbc_term(z: Tensor, target: Tensor, valid: Tensor, scale: float, num_classes: Optional[int],
              variant: str) -> Tensor:
    """``L_NBC`` on upcast embeddings ``z`` (no checks); exactly 0 when no row is valid.

    The classes present in the batch get one slot each, found without a host sync and with
    static shapes (``torch.compile`` / CUDA-graph friendly): sort the ids (ignored rows last),
    number the runs of equal ids, and ``index_add`` each row into its run's slot. There are at
    most ``N`` slots, so the memory is ``O(N*D + N**2)`` whatever the total number of classes
    (never an ``N x K x D`` or ``K x D`` tensor); unused slots are masked out.
    """
    n, d = z.shape
    ids = target.long()
    sentinel = torch.iinfo(torch.int64).max  # ignored rows sort last and form no class
    key = torch.where(valid, ids, torch.full_like(ids, sentinel))
    sorted_key, order = torch.sort(key)
    starts = torch.ones(n, dtype=torch.long, device=z.device)
    starts[1:] = (sorted_key[1:] != sorted_key[:-1]).long()
    slot = torch.empty_like(order).scatter_(0, order, torch.cumsum(starts, 0) - 1)  # run index per row
    w = valid.to(z.dtype)
    sums = torch.zeros((n, d), dtype=z.dtype, device=z.device).index_add(0, slot, z * w.unsqueeze(1))
    counts = torch.zeros(n, dtype=z.dtype, device=z.device).index_add(0, slot, w)
    present = counts > 0  # the slots of C_B
    mu = F.normalize(sums / torch.where(present, counts, torch.ones_like(counts)).unsqueeze(1), p=2.0, dim=1,
                     eps=1e-12)
    sim = matmul(mu, mu.transpose(0, 1))
    eye = torch.eye(n, dtype=torch.bool, device=z.device)
    logits = (scale * sim).masked_fill(eye, 0.0)  # diagonal zeroed (not removed): exp(0) = 1 per row
    # a present row ranges over present columns only; absent rows stay finite and are dropped
    logits = logits.masked_fill(present.unsqueeze(1) & ~present.unsqueeze(0), -math.inf)
    per_class = torch.logsumexp(logits, dim=1)
    if variant == "reference":
        per_class = torch.logaddexp(per_class, torch.full_like(per_class, _LOG_REF_EPS))
    per_class = torch.where(present, per_class, torch.zeros_like(per_class))
    k_b = present.sum().to(z.dtype)
    out = per_class.sum() / torch.where(k_b > 0, k_b, torch.ones_like(k_b))
    return out / num_classes if variant == "reference" else out


def nbc_loss(
    embeddings: Tensor,
    target: Tensor,
    *,
    scale: float = 0.2,
    num_classes: Optional[int] = None,
    variant: str = "paper",
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""The NBC term: log-sum-exp of scaled cosines between the class centroids of a batch.

    With ``z = embeddings`` (``(N, D)``), ``y = target`` (``(N,)``), the classes present in the
    batch ``C_B = unique(y)`` (rows with ``ignore_index`` dropped first) and ``kappa = scale``::

        mu_c   = normalize(mean_{i: y_i = c} z_i)                 (normalize(v) = v / max(||v||, 1e-12))
        S_cc'  = <mu_c, mu_c'> for c != c',   S_cc = 0            (diagonal zeroed, not removed)
        L_NBC  = mean_{c in C_B} log sum_{c' in C_B} exp(kappa * S_cc')
               = mean_c log(1 + sum_{c' != c} exp(kappa * S_cc'))

    ``kappa`` multiplies the cosine (the paper's "tau", 0.2 single-task and 0.3 multi-task); a
    temperature ``T`` is ``scale = 1 / T``. Centroids come from ``index_add`` over the classes
    present in the batch (at most ``N`` slots, found by sorting the ids: no host sync, static
    shapes), never an ``N x K x D`` or ``K x D`` tensor, so tens of thousands of classes cost
    nothing extra: memory ``O(N*D + N**2)``.

    Variants: ``"paper"`` (default) as above. ``"reference"`` multiplies ``L_NBC`` by ``1/K``
    (``K = num_classes``, the total number of classes) and adds ``1e-10`` inside the log, as the
    reference code; ``num_classes`` is required iff ``variant="reference"`` (with ``"paper"`` it is
    optional and only enables the ``target < num_classes`` data check).

    Batch-level loss: only ``reduction="mean"``. One block (one class or one sample) gives 0
    with zero gradient; an empty or all-ignored batch gives an exact, graph-attached 0. A zero
    centroid has cosine 0 with all others. Labels ``< 0`` other than ``ignore_index`` (and
    ``>= num_classes`` when given) raise ``ValueError`` (a data check).

    Paper: G. K. Kulatilleke, S. S. Chandra, M. Portmann, "NBC-Softmax: Darkweb Author
    fingerprinting and migration tracking", arXiv preprint 2022, arXiv:2212.08184.

    >>> import math, torch, losses
    >>> z = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]])
    >>> y = torch.tensor([0, 0, 1])
    >>> abs(float(losses.nbc_loss(z, y)) - math.log(2.0)) < 1e-6   # orthogonal centroids: cos = 0
    True
    """
    fn = "nbc_loss"
    check_embeddings_and_target(fn, embeddings, target)
    check_reduction(fn, reduction, allowed=("mean",))
    scale = check_number(fn, "scale", scale, low=0.0)
    check_choice(fn, "variant", variant, VARIANTS)
    num_classes = _check_num_classes(fn, num_classes, variant)
    check_finite(fn, "embeddings", embeddings)
    _check_labels(fn, target, num_classes, ignore_index)
    dtype = compute_dtype(embeddings)
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        valid = target != ignore_index
        z = upcast(drop_rows(embeddings, valid), dtype)
        term = _nbc_term(z, target, valid, scale, num_classes, variant)
        return term + attached_zero(embeddings, dtype=dtype)


def _check_num_classes(fn: str, num_classes: Optional[int], variant: str) -> Optional[int]:
    if num_classes is None:
        if variant == "reference":
            raise value_error(fn, "variant='reference' needs num_classes (it scales L_NBC by 1/K)", None,
                              "pass num_classes=K, the total number of classes")
        return None
    check_int(fn, "num_classes", num_classes, low=1, hint="pass the total number of classes")
    return num_classes


def nbc_softmax_loss(
    embeddings: Tensor,
    target: Tensor,
    weight: Tensor,
    *,
    scale: float = 0.2,
    nbc_weight: float = 0.5,
    variant: str = "paper",
    bias: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""NBC-Softmax: ``(1 - lambda) * CE(z W^T + b, y) + lambda * L_NBC(z, y)``.

    ``z = embeddings`` ``(N, D)``, ``y = target`` ``(N,)`` ids in ``[0, K)``, ``W = weight``
    ``(K, D)``, ``b = bias`` ``(K,)`` (optional), ``lambda = nbc_weight`` in ``[0, 1]``,
    ``kappa = scale >= 0``. CE is the softmax cross-entropy averaged over the non-ignored rows;
    ``L_NBC`` is :func:`nbc_loss` (centroid separation of the classes present in the batch)::

        L_NBC = mean_{c in C_B} log(1 + sum_{c' in C_B, c' != c} exp(kappa * <mu_c, mu_c'>))

    with ``mu_c`` the normalised mean embedding of class ``c`` in the batch.

    Variants: ``"paper"`` (default: ``scale=0.2``, ``lambda=0.5``). ``"reference"`` scales
    ``L_NBC`` by ``1/K`` with ``K = weight.shape[0]`` and adds ``1e-10`` inside its log, so the
    effective NBC weight is ``lambda / K``; the reference's optional 16-dim projection is not
    provided (the published runs used none) and its eps-free cosine (NaN on zero centroids) is
    not reproduced.

    Batch-level loss: only ``reduction="mean"``. An empty or all-ignored batch gives an exact,
    graph-attached 0 with zero gradients for ``embeddings``, ``weight`` and ``bias``. Ids outside
    ``[0, K)`` other than ``ignore_index`` raise ``ValueError`` (a data check). Half inputs are
    computed in float32, float64 stays float64; inside ``torch.autocast`` the forward and backward
    still run in float32. ``K >= 2`` (one class: ``ValueError``).

    Paper: G. K. Kulatilleke, S. S. Chandra, M. Portmann, "NBC-Softmax: Darkweb Author
    fingerprinting and migration tracking", arXiv preprint 2022, arXiv:2212.08184.

    >>> import torch, losses
    >>> z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    >>> W = torch.zeros(3, 2)                     # uniform softmax: CE = log 3
    >>> loss = losses.nbc_softmax_loss(z, torch.tensor([0, 1]), W, nbc_weight=0.0)
    >>> round(float(loss), 4)
    1.0986
    """
    fn = "nbc_softmax_loss"
    check_embeddings_and_target(fn, embeddings, target)
    check_reduction(fn, reduction, allowed=("mean",))
    scale = check_number(fn, "scale", scale, low=0.0)
    nbc_weight = check_number(fn, "nbc_weight", nbc_weight, low=0.0, high=1.0)
    check_choice(fn, "variant", variant, VARIANTS)
    check_floating(fn, "weight", weight)
    d = embeddings.shape[1]
    if weight.dim() != 2 or weight.shape[1] != d or weight.shape[0] < 1:
        raise value_error(fn, f"weight must have shape (K, {d}) for embeddings of shape {tuple(embeddings.shape)}",
                          f"shape {tuple(weight.shape)}", "pass the classifier weight, one row per class")
    k = weight.shape[0]
    check_softmax_classes(fn, k, arg="weight.shape[0] (the number of classes K)")
    if bias is not None:
        check_floating(fn, "bias", bias)
        if tuple(bias.shape) != (k,):
            raise value_error(fn, f"bias must have shape ({k},)", f"shape {tuple(bias.shape)}",
                              "pass one bias per class or bias=None")
    check_finite(fn, "embeddings", embeddings)
    check_finite(fn, "weight", weight)
    if bias is not None:
        check_finite(fn, "bias", bias)
    check_ids_in_range(fn, target, k, ignore_index)

    dtype = compute_dtype(embeddings, weight, bias)
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        valid = target != ignore_index
        z = upcast(drop_rows(embeddings, valid), dtype)
        w = upcast(weight, dtype)
        b = None if bias is None else upcast(bias, dtype)
        term = _nbc_term(z, target, valid, scale, k, variant)
        logits = matmul(z, w.t()) if b is None else matmul(z, w.t()) + b
        ce_rows = F.cross_entropy(logits, target.long(), ignore_index=ignore_index, reduction="none")
        ce = reduce_weighted_values(ce_rows, valid.to(dtype), "mean")
        # empty / all-ignored batch: both terms are exactly 0; the anchors give zero gradients
        return (1.0 - nbc_weight) * ce + nbc_weight * term + attached_zero(embeddings, weight, bias, dtype=dtype)


class NBCSoftmaxLoss(nn.Module):
    """NBC-Softmax (arXiv:2212.08184) as a module, owning the classifier; the maths is
    :func:`losses.nbc_softmax_loss`.

    Args:
        embedding_dim: the feature size ``D``.
        num_classes: the number of classes ``K >= 2``.
        scale: ``kappa >= 0``, the scale of the centroid cosines (default 0.2).
        nbc_weight: ``lambda`` in ``[0, 1]`` mixing CE and the NBC term (default 0.5).
        bias: give the classifier a bias (default True).
        variant: ``"paper"`` (default) or ``"reference"``.
        ignore_index: target id whose rows are skipped (default -100).
        reduction: only ``"mean"`` (a batch-level loss).
        gather_distributed: compute the loss of the global batch under DDP (default False).

    ``forward(embeddings, target)``: ``embeddings (N, D)``, ``target`` ids ``(N,)``; returns a
    scalar. ``.logits(embeddings)`` gives the ``(N, K)`` class scores for prediction.

    Parameters: ``classifier = nn.Linear(embedding_dim, num_classes, bias=bias)``.

    ``gather_distributed=True`` all-gathers embeddings (sum-backward) and labels over the default
    process group and computes the loss of the global batch on every rank: the classifier gets its
    single-process gradient on every rank and each rank's embeddings ``world_size`` x theirs
    (docs/conventions.md Distributed). Every rank must pass the same batch size (else
    ``ValueError``).
    """

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        *,
        scale: float = 0.2,
        nbc_weight: float = 0.5,
        bias: bool = True,
        variant: str = "paper",
        ignore_index: int = -100,
        reduction: str = "mean",
        gather_distributed: bool = False,
    ) -> None:
        super().__init__()
        name = "NBCSoftmaxLoss"
        for key, val in (("embedding_dim", embedding_dim), ("num_classes", num_classes)):
            check_int(name, key, val, low=1, hint=f"pass the {key}")
        check_softmax_classes(name, num_classes, arg="num_classes")
        check_reduction(name, reduction, allowed=("mean",))
        self.scale = check_number(name, "scale", scale, low=0.0)
        self.nbc_weight = check_number(name, "nbc_weight", nbc_weight, low=0.0, high=1.0)
        check_choice(name, "variant", variant, VARIANTS)
        self.embedding_dim = embedding_dim
        self.num_classes = num_classes
        self.variant = variant
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction
        self.gather_distributed = check_bool(name, "gather_distributed", gather_distributed)
        self.classifier = nn.Linear(embedding_dim, num_classes, bias=check_bool(name, "bias", bias))

    def logits(self, embeddings: Tensor) -> Tensor:
        """Class scores ``embeddings @ W^T + b`` (in the compute dtype), shape ``(N, num_classes)``."""
        check_tensor("NBCSoftmaxLoss.logits", "embeddings", embeddings)
        check_head_embeddings("NBCSoftmaxLoss.logits", "NBCSoftmaxLoss", embeddings, self.embedding_dim)
        w, b = self.classifier.weight, self.classifier.bias
        dtype = compute_dtype(embeddings, w, b)
        with no_autocast(embeddings, w):
            z = matmul(upcast(embeddings, dtype), upcast(w, dtype).t())
            return z if b is None else z + upcast(b, dtype)

    def forward(self, embeddings: Tensor, target: Tensor) -> Tensor:
        """The NBC-Softmax loss of the embeddings (gathered over ranks with ``gather_distributed``).

        Args:
            embeddings: floating features ``(N, embedding_dim)``.
            target: integer class ids ``(N,)``.

        Returns:
            The scalar loss.
        """
        check_head_embeddings("nbc_softmax_loss", "NBCSoftmaxLoss", embeddings, self.embedding_dim)
        if self.gather_distributed:
            fn = "NBCSoftmaxLoss"
            embeddings = all_gather_with_grad(embeddings, fn=fn)
            target = all_gather_no_grad(target, fn=fn)
        return nbc_softmax_loss(embeddings, target, self.classifier.weight, scale=self.scale,
                                nbc_weight=self.nbc_weight, variant=self.variant, bias=self.classifier.bias,
                                ignore_index=self.ignore_index, reduction=self.reduction)

    extra_repr = auto_extra_repr

    def _repr_values(self) -> dict:
        return {"bias": self.classifier.bias is not None}


register(
    "nbc_softmax",
    function=nbc_softmax_loss,
    module=NBCSoftmaxLoss,
    inputs="embeddings",
    unit="batch",
    unit_weights=None,
    arxiv="2212.08184",
    paper="Kulatilleke, Chandra, Portmann, NBC-Softmax: Darkweb Author fingerprinting and migration tracking, "
          "arXiv 2022",
    owns_head=True,
    softmax=True,
    example_kwargs={"embedding_dim": 8, "num_classes": 5},
)
