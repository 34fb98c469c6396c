"""Partial FC: margin softmax over a sampled subset of class centres, optionally sharded over ranks
(``docs/losses/partial_fc.md`` and ``docs/conventions.md`` "Distributed").

Single process: :func:`partial_fc_loss` keeps every positive class of the batch and draws the rest of
``k = floor(sample_rate·C)`` classes uniformly without replacement, then computes
:func:`~losses.embedding.margin.margin_softmax_loss` over those centres only.

Model parallel (:class:`PartialFCLoss` with ``distributed=True``): rank ``r`` owns the contiguous
shard of ``n_r = C // W + (r < C % W)`` centres; embeddings (with gradient) and labels are
all-gathered, each rank samples ``floor(sample_rate·n_r)`` of its own classes (positives first) and the
row log-sum-exp is assembled by all-reducing the row maxima and then the sums of exponentials.
"""

from __future__ import annotations

import copy
from typing import Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn import functional as F

from .._core import (
    NO_IGNORE,
    check_ignore_index,
    auto_extra_repr,
    check_seed,
    check_bool,
    _checking,
    _compiling,
    check_finite,
    check_ids_in_range,
    check_integer_target,
    check_number,
    check_reduction,
    compute_dtype,
    reduce_loss,
    upcast,
    value_error,
)
from .._distributed import all_gather_no_grad, all_gather_with_grad, all_reduce_with_grad, is_distributed
from .._distributed import rank as _rank
from .._distributed import world_size as _world_size
from .._heads import check_head_embeddings, check_head_sizes, check_softmax_classes, drop_rows
from .._core import no_autocast
from .._random import GeneratorStateMixin
from .._registry import id_unit_weights, register
from .margin import (
    check_head_inputs,
    check_margin_hparams,
    cosine_logits,
    margin_row_losses,
)

__all__ = ["partial_fc_loss", "PartialFCLoss"]


def shard_range(num_classes: int, world_size: int, rank: int) -> Tuple[int, int]:
    """``(start, n_r)`` of rank ``rank``'s contiguous shard: ``n_r = C // W + (r < C % W)``."""
    base, extra = divmod(num_classes, world_size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def _check_rate(fn: str, sample_rate: float) -> float:
    return check_number(fn, "sample_rate", sample_rate, low=0.0, high=1.0, low_inclusive=False,
                        hint="choose a fraction of the classes in (0, 1], e.g. 0.1")


def _top_with_positives(keys: Tensor, pos: Tensor, k: int) -> Tensor:
    """Sorted ``pos`` plus the ``k - |pos|`` non-positive classes with the largest uniform ``keys``."""
    keys = keys.index_fill(0, pos, 2.0)  # uniform keys lie in [0, 1): positives always win
    return torch.topk(keys, k, sorted=False).indices.sort().values


def _uniform_keys(n: int, generator: Optional[torch.Generator], device: torch.device) -> Tensor:
    gdev = generator.device if generator is not None else device
    return torch.rand(n, generator=generator, device=gdev).to(device)


def _check_index(fn: str, index: object, positives: Tensor, num_classes: int, device: torch.device) -> Tensor:
    check_integer_target(fn, index, name="index")
    assert isinstance(index, Tensor)
    if index.dim() != 1:
        raise value_error(fn, "index must be a 1-D tensor of class ids", f"shape {tuple(index.shape)}",
                          "pass the sorted ids of the classes to use")
    idx = index.to(device=device, dtype=torch.long)
    check_ids_in_range(fn, idx, num_classes, NO_IGNORE, name="index", hint="pass class ids in [0, num_classes)")
    if _checking():
        if idx.numel() > 1 and not bool((idx[1:] > idx[:-1]).all()):
            raise value_error(fn, "index must be sorted and unique (strictly increasing)",
                              f"{idx[:8].tolist()}{' ...' if idx.numel() > 8 else ''}",
                              "pass torch.unique(index), which also sorts")
        missing = positives[~torch.isin(positives, idx)]
        if missing.numel() > 0:
            raise value_error(fn, "index must contain every positive class of the batch",
                              f"missing {missing[:8].tolist()}{' ...' if missing.numel() > 8 else ''}",
                              "add the batch's labels, e.g. torch.unique(torch.cat([index, target]))")
    return idx


def _rows(weight: Tensor, chosen: Tensor, sparse: bool = False) -> Tensor:
    """``weight[chosen]`` for sorted unique ``chosen``; ``weight`` itself when every row is chosen
    (rate 1.0, or a batch whose positives cover every class), which skips a ``(C, D)`` copy forward
    and a dense zero-filled ``(C, D)`` scatter backward. ``sparse``: an embedding lookup whose
    gradient for ``weight`` is a sparse ``(C, D)`` tensor holding the chosen rows only."""
    if sparse:
        return F.embedding(chosen, weight, sparse=True)
    if chosen.numel() == weight.shape[0]:
        return weight
    return weight.index_select(0, chosen)


def _no_rows(embeddings: Tensor, weight: Tensor, n: int, dtype: torch.dtype, reduction: str,
             sparse: bool = False) -> Tensor:
    """No valid row anywhere: an exact, graph-attached 0 (zeros for ``"none"``); with ``sparse`` the
    centres' gradient is a sparse tensor with no rows."""
    zeros = torch.zeros(n, dtype=dtype, device=embeddings.device)
    anchor = _rows(weight, torch.zeros(0, dtype=torch.long, device=weight.device), True) if sparse else weight
    return reduce_loss(zeros, zeros, reduction, anchors=(embeddings, anchor))


def _partial_fc(
    fn: str,
    embeddings: Tensor,
    target: Tensor,
    weight: Tensor,
    *,
    sample_rate: float,
    scale: float,
    margin: Sequence[float],
    variant: str,
    interclass_filtering_threshold: float,
    index: Optional[Tensor],
    generator: Optional[torch.Generator],
    ignore_index: int,
    reduction: str,
    sparse_grad: bool = False,
) -> Tuple[Tensor, Tensor]:
    """Single-process Partial FC; returns ``(loss, I)`` with ``I`` the sorted class ids used."""
    rate = _check_rate(fn, sample_rate)
    check_bool(fn, "sparse_grad", sparse_grad)
    s, m, thr = check_margin_hparams(fn, scale=scale, margin=margin, variant=variant,
                                     interclass_filtering_threshold=interclass_filtering_threshold)
    check_reduction(fn, reduction)
    check_head_inputs(fn, embeddings, target, weight)
    num_classes = weight.shape[0]
    check_softmax_classes(fn, num_classes, arg="weight.shape[0] (the number of classes C)")
    check_ids_in_range(fn, target, num_classes, ignore_index)
    check_finite(fn, "embeddings", embeddings)
    dtype = compute_dtype(embeddings, weight)
    valid = target != ignore_index
    pos = torch.unique(target[valid]).long().to(weight.device)
    if pos.numel() == 0:  # no valid row: nothing is sampled and the generator is not advanced
        return _no_rows(embeddings, weight, embeddings.shape[0], dtype, reduction, sparse_grad), pos
    if index is not None:
        chosen = _check_index(fn, index, pos, num_classes, weight.device)
    else:
        k = int(rate * num_classes)
        chosen = pos if pos.numel() >= k else _top_with_positives(
            _uniform_keys(num_classes, generator, weight.device), pos, k)
    w = upcast(_rows(weight, chosen, sparse_grad), dtype)
    check_finite(fn, "weight", w)
    first = chosen[:1].to(target.device)
    y = torch.searchsorted(chosen, torch.where(valid, target.long(), first).to(chosen.device))
    y = y.clamp_(max=chosen.numel() - 1)  # in range even for an unchecked index without some positive
    with no_autocast(embeddings, weight):
        values = margin_row_losses(upcast(drop_rows(embeddings, valid), dtype), w, y.to(embeddings.device), valid,
                                   scale=s, margin=m,
                                   variant=variant, threshold=thr)
        return reduce_loss(values, valid.to(dtype), reduction), chosen


def partial_fc_loss(
    embeddings: Tensor,
    target: Tensor,
    weight: Tensor,
    *,
    sample_rate: float = 0.1,
    scale: float = 64.0,
    margin: Sequence[float] = (1.0, 0.5, 0.0),
    variant: str = "paper",
    interclass_filtering_threshold: float = 0.0,
    index: Optional[Tensor] = None,
    generator: Optional[torch.Generator] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    sparse_grad: bool = False,
) -> Tensor:
    r"""Partial FC: margin softmax over the batch's positive classes plus uniformly sampled others.

    Sampling: ``k = floor(sample_rate·C)`` and ``P = unique(target)`` (ignored rows dropped). If
    ``|P| >= k`` then ``I = P``; otherwise ``I`` is ``P`` plus ``k - |P|`` other classes drawn uniformly
    without replacement (from ``generator``; ``None``: the global RNG of ``weight``'s device). ``I``
    is sorted and each label is remapped to its position in ``I``. ``index`` fixes ``I`` instead: it
    must be sorted, unique, in ``[0, C)`` and contain every positive, else ``ValueError``.

    Loss: :func:`~losses.margin_softmax_loss` on the centres ``weight[I]``:
    ``L_i = logsumexp_{k in I} z_ik - z_{i,y_i}`` with ``z_ik = s·c_ik``,
    ``z_{i,y_i} = s·psi(c_{i,y_i})``, ``psi(c) = cos(m1·arccos c + m2) - m3`` and the same ``scale``,
    ``margin``, ``variant`` (``"paper"``: exact gradient, ArcFace fallback; ``"reference"``:
    insightface's straight-through margin and forward-only cap at ``-log 1e-30``) and
    ``interclass_filtering_threshold``. Unsampled centres get zero gradient (optimiser momentum or
    weight decay can still move them, as in insightface v2). ``sample_rate=1.0`` is exactly
    :func:`~losses.margin_softmax_loss`.

    ``sparse_grad=True`` (default False) makes the gradient of ``weight`` a sparse ``(C, D)`` tensor
    that holds the ``|I|`` sampled rows only (as ``nn.Embedding(sparse=True)``), for optimisers that
    take sparse gradients (``torch.optim.SparseAdam``, ``torch.optim.SGD``): then an unsampled
    centre is not moved at all (no momentum, no decay: the papers' update of the sampled centres
    only), and the optimiser's work and the gradient's memory scale with ``k`` instead of ``C``.
    Dense optimisers such as ``AdamW`` reject sparse gradients; the loss and the sampled rows'
    gradient are the same either way. Under ``DistributedDataParallel`` use it with
    :class:`PartialFCLoss` ``(distributed=True)``: DDP averages sparse gradients of
    ``nn.Embedding`` weights only, and the module raises ``ValueError`` when DDP would average its
    sparse centres.

    Shapes: ``embeddings (N, D)``, ``target (N,)`` integer ids, ``weight (C, D)``, ``index (|I|,)``;
    ``"none"`` gives ``(N,)``. Unit: the row (0 for ``ignore_index`` rows). Logits in float32 or
    wider. Labels outside ``[0, C)`` raise ``ValueError`` (the reference silently treats them as
    belonging to another rank).

    Papers: X. An et al., *Partial FC: Training 10 Million Identities on a Single Machine*, ICCV
    Workshops 2021, arXiv:2010.05222; X. An et al., *Killing Two Birds with One Stone: Efficient and
    Robust Training of Face Recognition CNNs by Partial FC*, CVPR 2022, arXiv:2203.15565. The
    default ``sample_rate = 0.1`` is the paper's headline setting (insightface's WebFace42M configs
    use CosFace ``m3 = 0.4`` at 0.2-0.3). For the model-parallel form see :class:`PartialFCLoss`.

    >>> import torch, losses
    >>> x, w, y = torch.randn(4, 3), torch.randn(10, 3), torch.tensor([1, 1, 7, 8])
    >>> full = losses.margin_softmax_loss(x, y, w)
    >>> bool(torch.isclose(losses.partial_fc_loss(x, y, w, sample_rate=1.0), full))
    True
    >>> g = torch.Generator().manual_seed(0)
    >>> losses.partial_fc_loss(x, y, w, sample_rate=0.5, generator=g).shape
    torch.Size([])
    """
    loss, _ = _partial_fc(
        "partial_fc_loss", embeddings, target, weight, sample_rate=sample_rate, scale=scale, margin=margin,
        variant=variant, interclass_filtering_threshold=interclass_filtering_threshold, index=index,
        generator=generator, ignore_index=ignore_index, reduction=reduction, sparse_grad=sparse_grad,
    )
    return loss


# --------------------------------------------------------------------------------------
# model-parallel pieces
# --------------------------------------------------------------------------------------


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by ``factor`` (the world size, docs/conventions.md, distributed (d))."""

    @staticmethod
    def forward(ctx, x, factor):  # type: ignore[override]
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad * ctx.factor, None


def _sum_over_ranks(x: Tensor, group: object, coupled: bool) -> Tensor:
    """Sum of ``x`` over ranks, identical everywhere.

    ``coupled=False`` (every rank computes the same global loss): the gradient stays local, so each
    rank's shard gets exactly its single-process gradient. ``coupled=True`` (``"none"``: each rank
    returns its own rows): the backward all-reduces too, so every shard sees every rank's rows.
    """
    if coupled:
        return all_reduce_with_grad(x, "sum", group)
    total = x.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total + (x - x.detach())


class PartialFCLoss(GeneratorStateMixin):
    """Partial FC (arXiv:2010.05222) as a module, optionally model-parallel; the maths is
    :func:`losses.partial_fc_loss`.

    Args:
        embedding_dim: the feature size ``D``.
        num_classes: the number of classes ``C >= 2``.
        sample_rate: fraction in ``(0, 1]`` of the classes sampled per call, positives first
            (default 0.1).
        scale: the logit scale ``s`` (default 64.0).
        margin: ``(m1, m2, m3)`` of ``cos(m1 * theta + m2) - m3`` on the target cosine (default
            ``(1.0, 0.5, 0.0)``, ArcFace).
        variant: ``"paper"`` (default) or ``"reference"``.
        interclass_filtering_threshold: non-target cosines above it become 0 when ``> 0``
            (default 0.0, off).
        ignore_index: target id whose rows are skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        seed: ``None`` (default: the global RNG) or the seed of a private sampling generator.
        distributed: shard the centres over the ranks of ``process_group`` (default False).
        process_group: the group to shard over (default None: the world group).
        sparse_grad: give ``weight`` a sparse gradient of the sampled rows only, for
            ``torch.optim.SparseAdam`` or ``SGD`` (default False; see :func:`losses.partial_fc_loss`).

    ``forward(embeddings, target, *, index=None)``: ``embeddings (N, D)``, ``target`` ids
    ``(N,)``, optional class ids ``index`` to use instead of sampling. Returns a scalar for
    ``"mean"``/``"sum"``, ``(N,)`` for ``"none"``.

    Parameters: ``weight``, the class centres (this rank's shard when distributed).

    Owns the class centres ``weight`` (``N(0, 0.01^2)``) and, with ``seed``, a private
    ``torch.Generator`` (created on the weight's device at first use). Its state is part of
    ``state_dict()`` (the ``_extra_state`` entry), so a run resumed from a checkpoint samples
    exactly the classes the uninterrupted run would have sampled; a state_dict saved without it
    still loads (the generator is then kept as it is). Deep copies and pickles carry it too. ``forward(embeddings, target, *, index=None)``;
    ``.last_index`` holds the class ids sampled in the last call; ``.logits(embeddings)`` is
    ``scale·cos`` over all ``C`` classes without margin.

    ``distributed=True`` (with ``process_group``, default the world group) shards the centres:
    rank ``r`` holds rows ``[start_r, start_r + n_r)`` of the ``(C, D)`` matrix,
    ``n_r = C // W + (r < C % W)``. Each call all-gathers the embeddings (unequal batch sizes raise
    ``ValueError``) and labels, samples ``floor(sample_rate·n_r)`` of its classes, positives first
    (so the total sample differs from the single-process ``floor(sample_rate·C)``; the losses agree
    for ``sample_rate=1.0`` or a shared ``index``), and combines the row log-sum-exp by all-reducing the
    maxima, then the sums of exponentials. Every rank returns the loss of the global batch
    (``"mean"`` divides by the global count of valid rows; ``"none"`` returns this rank's rows); the
    shard gets the single-process gradient of its rows and this rank's embeddings ``W`` times their
    single-process gradient, which DDP's averaging turns back into the single-process step. The
    shard must not be DDP-averaged: :meth:`ddp_ignored_parameters` lists it. ``state_dict()``
    all-gathers the full ``(C, D)`` weight (rank order) and ``load_state_dict()`` keeps this rank's
    rows, so checkpoints do not depend on the world size. If the module is built before the process
    group exists (as in Lightning), it holds all ``C`` rows until the first call after the group is
    up (``forward``, ``logits``, ``state_dict`` or ``load_state_dict``), which keeps its own rows.
    All ranks must make these calls together. ``.last_index`` holds this rank's sampled (global)
    ids; ``.logits`` gathers the centres (no gradient). Without an initialised multi-rank group
    the module is single-process. The process group is not pickled (a pickled copy uses the
    default group); a deep copy shares it.

    >>> import torch, losses
    >>> head = losses.PartialFCLoss(8, 100, sample_rate=0.1, seed=0)
    >>> loss = head(torch.randn(4, 8), torch.tensor([3, 3, 50, 99]))
    >>> head.last_index.numel()
    10
    """

    sparse_grad: bool = False  # modules pickled before the option existed load as dense

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        *,
        sample_rate: float = 0.1,
        scale: float = 64.0,
        margin: Tuple[float, float, float] = (1.0, 0.5, 0.0),
        variant: str = "paper",
        interclass_filtering_threshold: float = 0.0,
        ignore_index: int = -100,
        reduction: str = "mean",
        seed: Optional[int] = None,
        distributed: bool = False,
        process_group: Optional[object] = None,
        sparse_grad: bool = False,
    ) -> None:
        super().__init__()
        fn = "PartialFCLoss"
        check_head_sizes(fn, embedding_dim, num_classes)
        check_softmax_classes(fn, num_classes, arg="num_classes")
        rate = _check_rate(fn, sample_rate)
        s, m, thr = check_margin_hparams(fn, scale=scale, margin=margin, variant=variant,
                                         interclass_filtering_threshold=interclass_filtering_threshold)
        check_reduction(fn, reduction)
        check_seed(fn, seed)
        check_bool(fn, "distributed", distributed)
        check_bool(fn, "sparse_grad", sparse_grad)
        self.embedding_dim = embedding_dim
        self.num_classes = num_classes
        self.sample_rate = rate
        self.scale = s
        self.margin = m
        self.variant = variant
        self.interclass_filtering_threshold = thr
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction
        self.seed = seed
        self.distributed = distributed
        self.process_group = process_group
        self.sparse_grad = sparse_grad
        self._world = _world_size(process_group) if distributed and is_distributed(process_group) else 1
        _, rows = shard_range(num_classes, self._world, _rank(process_group) if self._world > 1 else 0)
        self.weight = nn.Parameter(torch.empty(rows, embedding_dim).normal_(0.0, 0.01))
        self.last_index: Optional[Tensor] = None
        self._generator: Optional[torch.Generator] = None

    # ---- randomness ------------------------------------------------------------------

    def _get_generator(self, device: torch.device) -> Optional[torch.Generator]:
        return self._seeded_generator(device)

    def __getstate__(self):
        state = super().__getstate__()
        state["process_group"] = None
        return state

    def __deepcopy__(self, memo):
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        new.process_group = self.process_group
        return new

    # ---- sharding --------------------------------------------------------------------

    def _group(self):
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def _sync_shard(self) -> None:
        """Keep only this rank's rows once a multi-rank process group exists."""
        if not self.distributed:
            return
        world = _world_size(self.process_group) if is_distributed(self.process_group) else 1
        if world == self._world:
            return
        if self._world != 1:
            raise value_error("PartialFCLoss", "the process group's world size changed since the centres were sharded",
                              f"{self._world} -> {world}",
                              "save a state_dict (it holds all centres) and load it into a new module")
        start, rows = shard_range(self.num_classes, world, _rank(self.process_group))
        with torch.no_grad():
            self.weight.data = self.weight.data[start:start + rows].clone()
        self.weight.grad = None
        self._world = world

    def _check_not_averaged_sparse(self) -> None:
        """Replicated centres with a sparse gradient cannot be averaged by DDP: its reducer takes
        sparse gradients only from ``nn.Embedding(sparse=True)`` and fails deep in backward with an
        unrelated message. Say so at the forward instead (only inside a DDP forward that averages
        ``weight``; a DDP that ignores it, or no DDP, is left alone)."""
        ddp_cls = getattr(getattr(nn, "parallel", None), "DistributedDataParallel", None)
        ddp = getattr(ddp_cls, "_active_ddp_module", None)
        if ddp is None or not (self.weight.requires_grad and torch.is_grad_enabled()):
            return
        ignored = getattr(ddp, "parameters_to_ignore", ())
        for name, p in ddp.module.named_parameters():
            if p is self.weight:
                if name not in ignored:
                    raise value_error(
                        "PartialFCLoss", "sparse_grad=True needs sharded centres under DistributedDataParallel",
                        f"distributed={self.distributed}, parameter {name!r} averaged by DDP",
                        "DDP cannot average a sparse gradient of a parameter that is not an nn.Embedding's: pass "
                        "distributed=True (each rank owns a shard of the centres, which DDP must ignore: "
                        "ddp_ignored_parameters()) or sparse_grad=False")
                return

    def ddp_ignored_parameters(self) -> list:
        """Parameters DDP must not average (the sharded centres when ``distributed=True``)."""
        return [self.weight] if self.distributed else []

    def _gather_weight(self) -> Tensor:
        """The full ``(C, D)`` centres, shards concatenated in rank order (no gradient)."""
        sizes = [shard_range(self.num_classes, self._world, r)[1] for r in range(self._world)]
        w = self.weight.detach()
        buf = w.new_zeros(max(sizes), w.shape[1])
        buf[: w.shape[0]] = w
        parts = [torch.empty_like(buf) for _ in sizes]
        dist.all_gather(parts, buf, group=self.process_group)
        return torch.cat([p[:n] for p, n in zip(parts, sizes)])

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.distributed:
            self._sync_shard()
            if self._world > 1:
                destination[prefix + "weight"] = self._gather_weight()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + "weight"
        if self.distributed:
            self._sync_shard()
        full = state_dict.get(key)
        if (self._world > 1 and isinstance(full, Tensor) and full.dim() == 2
                and full.shape[0] == self.num_classes and self.weight.shape[0] != self.num_classes):
            start, rows = shard_range(self.num_classes, self._world, _rank(self.process_group))
            state_dict = dict(state_dict)
            state_dict[key] = full[start:start + rows]
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # ---- forward ---------------------------------------------------------------------

    def forward(self, embeddings: Tensor, target: Tensor, *, index: Optional[Tensor] = None) -> Tensor:
        """The Partial FC loss over the sampled (or given) classes; sets ``.last_index``.

        Args:
            embeddings: floating features ``(N, embedding_dim)``.
            target: integer class ids ``(N,)``.
            index: optional sorted, unique class ids ``(|I|,)`` to use instead of sampling (every
                positive of the batch included).

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-row losses ``(N,)`` (``"none"``).
        """
        check_head_embeddings("partial_fc_loss", type(self).__name__, embeddings, self.embedding_dim)
        if self.sparse_grad and not _compiling():  # a configuration check, not traced
            self._check_not_averaged_sparse()
        self._sync_shard()
        if self._world > 1:
            return self._forward_sharded(embeddings, target, index)
        loss, chosen = _partial_fc(
            "partial_fc_loss", embeddings, target, self.weight, sample_rate=self.sample_rate, scale=self.scale,
            margin=self.margin, variant=self.variant,
            interclass_filtering_threshold=self.interclass_filtering_threshold, index=index,
            generator=self._get_generator(self.weight.device), ignore_index=self.ignore_index,
            reduction=self.reduction, sparse_grad=self.sparse_grad,
        )
        self.last_index = chosen.detach()
        return loss

    def _forward_sharded(self, embeddings: Tensor, target: Tensor, index: Optional[Tensor]) -> Tensor:
        fn = "partial_fc_loss"
        group = self._group()
        world, r = self._world, _rank(self.process_group)
        num_classes = self.num_classes
        start, rows = shard_range(num_classes, world, r)
        check_head_inputs(fn, embeddings, target, self.weight, min_classes=0)
        device = self.weight.device
        n = embeddings.shape[0]
        x_all = all_gather_with_grad(embeddings, self.process_group, fn=fn)
        y_all = all_gather_no_grad(target.long(), self.process_group, fn=fn)
        check_ids_in_range(fn, y_all, num_classes, self.ignore_index)
        check_finite(fn, "embeddings", x_all)
        dtype = compute_dtype(embeddings, self.weight)
        valid = y_all != self.ignore_index
        pos_all = torch.unique(y_all[valid]).to(device)
        if pos_all.numel() == 0:  # the same decision on every rank (gathered labels)
            self.last_index = torch.empty(0, dtype=torch.long, device=device)
            return _no_rows(embeddings, self.weight, n, dtype, self.reduction, self.sparse_grad)
        in_shard = valid & (y_all >= start) & (y_all < start + rows)
        pos = pos_all[(pos_all >= start) & (pos_all < start + rows)] - start
        if index is None:
            k = int(self.sample_rate * rows)
            gen = self._get_generator(device)
            if gen is not None:  # every rank draws all C keys: the streams stay in step
                keys = _uniform_keys(num_classes, gen, device)[start:start + rows]
                chosen = pos if pos.numel() >= k else _top_with_positives(keys, pos, k)
            else:
                chosen = pos if pos.numel() >= k else _top_with_positives(_uniform_keys(rows, None, device), pos, k)
        else:
            idx = _check_index(fn, index, pos_all, num_classes, device)
            chosen = idx[(idx >= start) & (idx < start + rows)] - start
        self.last_index = (chosen + start).detach()
        w = upcast(_rows(self.weight, chosen, self.sparse_grad), dtype)
        if _checking():  # the same verdict on every rank
            bad = (~torch.isfinite(w)).sum().reshape(1)
            dist.all_reduce(bad, group=group)
            if int(bad) > 0:
                raise value_error(fn, "weight contains NaN or infinite values", f"{int(bad)} in the sampled centres",
                                  "check the optimiser step for overflow or divergence")
        y_dev = y_all.to(device)
        if chosen.numel() > 0:
            y_loc = torch.searchsorted(chosen, (y_dev - start).clamp(min=0))
            y_loc = torch.where(in_shard.to(device), y_loc, torch.zeros_like(y_loc)).clamp(max=chosen.numel() - 1)
        else:
            y_loc = torch.zeros_like(y_dev)
        x = _ScaleGrad.apply(upcast(drop_rows(x_all, valid), dtype), float(world))
        coupled = self.reduction == "none"
        with no_autocast(x, w):
            values = margin_row_losses(
                x, w, y_loc.to(x.device), in_shard.to(x.device), scale=self.scale, margin=self.margin,
                variant=self.variant, threshold=self.interclass_filtering_threshold, group=group,
                global_sum=lambda v: _sum_over_ranks(v, group, coupled),
            )
        weights = valid.to(device=values.device, dtype=dtype)
        if coupled:
            mine = slice(r * n, (r + 1) * n)
            return reduce_loss(values[mine], weights[mine], "none")
        return reduce_loss(values, weights, self.reduction)

    def logits(self, embeddings: Tensor) -> Tensor:
        """``scale·cos(embeddings, weight)`` over all ``C`` classes, no margin, shape ``(N, C)``.

        Distributed: the shards are all-gathered (every rank must call it) and no gradient flows.
        """
        name = type(self).__name__
        check_head_embeddings(name + ".logits", name, embeddings, self.embedding_dim)
        self._sync_shard()
        if self._world > 1:
            with torch.no_grad():
                return cosine_logits(embeddings, self._gather_weight(), self.scale)
        return cosine_logits(embeddings, self.weight, self.scale)

    extra_repr = auto_extra_repr

    _repr_skip = ("process_group",)


register(
    "partial_fc",
    function=partial_fc_loss,
    module=PartialFCLoss,
    inputs="embeddings",
    unit="row",
    unit_weights=id_unit_weights,
    arxiv="2010.05222",
    paper="X. An et al., Partial FC: Training 10 Million Identities on a Single Machine, ICCV Workshops 2021",
    owns_head=True,
    softmax=True,
    example_kwargs={"embedding_dim": 8, "num_classes": 5, "sample_rate": 0.5, "seed": 0},
)
