"""Vocabulary-parallel linear cross-entropy: the many-class head sharded over ranks by class rows,
the loss exact and without the N x C logits (docs/losses/linear_cross_entropy.md)."""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from .._core import (
    _checking,
    check_finite,
    check_floating,
    check_ids_in_range,
    check_int,
    check_integer_target,
    check_number,
    check_reduction,
    check_softmax_classes,
    check_tensor,
    compute_dtype,
    no_autocast,
    once_differentiable,
    reduce_loss,
    value_error,
)
from .._distributed import world_size
from .._heads import (chunked_row_stats, chunked_softmax_backward, default_chunk_size, drop_rows,
                      subtract_target_term)
from .._softcap import check_softcap
from .linear_ce import linear_cross_entropy

__all__ = ["vocab_parallel_linear_cross_entropy"]

_FN = "vocab_parallel_linear_cross_entropy"


class _VocabParallelLinearCrossEntropy(torch.autograd.Function):
    """Per-row ``(1-eps)(lse - z_y) + eps(lse - mean_k z_k) + coef * lse^2`` over a head whose class
    rows are split over the ranks of ``group``.

    Forward: each rank folds its shard's chunks into an online row maximum and exp-sum (and the sum
    of the capped logits for label smoothing) and takes the target logit of the rows whose target
    it holds; one MAX and one SUM all-reduce combine them. Backward: each rank recomputes its chunks,
    writes its shard's weight and bias gradients and all-reduces (SUM) its partial embeddings
    gradient, so every rank returns the full embeddings gradient.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, local_y, in_shard, valid, chunk, eps, coef, dtype, cap,  # noqa: D102
                num_classes, group):
        n, cr = x.shape[0], weight.shape[0]
        xc = x.to(dtype)
        # this shard's online row maximum and exp-sum (and, under a cap, the sum of its capped logits)
        m, s, z_sum, _ = chunked_row_stats(xc, weight, bias, chunk=chunk, dtype=dtype, cap=cap,
                                           sum_capped=eps > 0 and cap is not None)
        if eps > 0 and cap is None:  # the sum of the shard's logits from one matvec
            z_sum = xc @ weight.to(dtype).sum(dim=0)
            if bias is not None:
                z_sum = z_sum + bias.to(dtype).sum()
        # the target logit, on the rank that holds the target's row (0 elsewhere)
        z_y = torch.zeros((n,), dtype=dtype, device=x.device)
        dcap_y = torch.ones((n,), dtype=dtype, device=x.device)  # d capped z_y / d z_y
        if cr > 0:
            z_y = (xc * weight.index_select(0, local_y).to(dtype)).sum(dim=1)
            if bias is not None:
                z_y = z_y + bias.index_select(0, local_y).to(dtype)
            if cap is not None:
                t_y = torch.tanh(z_y / cap)
                z_y, dcap_y = cap * t_y, 1.0 - t_y * t_y
            z_y = torch.where(in_shard, z_y, torch.zeros((), dtype=dtype, device=x.device))
        # 1) the global row maximum; 2) the rescaled exp-sums, target logits and logit sums, summed
        m_all = m.clone()
        dist.all_reduce(m_all, op=dist.ReduceOp.MAX, group=group)
        parts = [s * torch.exp(m - m_all), z_y] + ([z_sum] if eps > 0 else [])  # exp(-inf) = 0: empty shard
        sums = torch.stack(parts)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)
        lse = m_all + torch.log(sums[0])
        loss = (1.0 - eps) * (lse - sums[1])
        if eps > 0:
            loss = loss + eps * (lse - sums[2] / num_classes)
        if coef > 0:
            loss = loss + coef * lse * lse
        loss = torch.where(valid, loss, torch.zeros((), dtype=dtype, device=x.device))
        ctx.save_for_backward(x, weight, bias, local_y, in_shard, valid, lse, dcap_y)
        ctx.chunk, ctx.eps, ctx.coef, ctx.dtype, ctx.cap = chunk, eps, coef, dtype, cap
        ctx.num_classes, ctx.group = num_classes, group
        return loss

    @staticmethod
    @once_differentiable(_FN)
    def backward(ctx, grad_loss):  # noqa: D102
        with no_autocast(grad_loss):
            return _VocabParallelLinearCrossEntropy._backward(ctx, grad_loss)

    @staticmethod
    def _backward(ctx, grad_loss):
        x, weight, bias, local_y, in_shard, valid, lse, dcap_y = ctx.saved_tensors
        chunk, eps, coef, dtype, cap = ctx.chunk, ctx.eps, ctx.coef, ctx.dtype, ctx.cap
        c, cr = ctx.num_classes, weight.shape[0]
        zero = torch.zeros((), dtype=dtype, device=x.device)
        g = torch.where(valid, grad_loss.to(dtype), zero)
        g_soft = g * (1.0 + 2.0 * coef * lse)  # dz_k = (1 + 2 coef lse) p_k - (1-eps) [k=y] - eps/C
        xc = x.to(dtype)
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        gx, gw, gb = chunked_softmax_backward(xc, weight, bias, lse, g, g_soft, chunk=chunk, dtype=dtype, cap=cap,
                                              eps=eps, num_classes=c, need_x=need_x, need_w=need_w, need_b=need_b)
        if cr > 0:  # the target term -(1-eps) z_y, on the rank that holds the target's row
            gy = torch.where(in_shard, (1.0 - eps) * g * dcap_y, zero)
            subtract_target_term(gx, gw, gb, gy, weight, xc, local_y, dtype)
        if need_x:  # the partial embeddings gradients of the shards add up to the full one
            dist.all_reduce(gx, op=dist.ReduceOp.SUM, group=ctx.group)
        return (
            None if gx is None else gx.to(x.dtype),
            None if gw is None else gw.to(weight.dtype),
            None if gb is None else gb.to(bias.dtype),
            None, None, None, None, None, None, None, None, None, None,
        )


def _gather_layout(row: List[int], group: Optional[object], device: torch.device) -> List[List[int]]:
    """Every rank's ``row`` of integers (one small all-gather)."""
    t = torch.tensor(row, dtype=torch.long, device=device)
    out = [torch.zeros_like(t) for _ in range(world_size(group))]
    dist.all_gather(out, t, group=group)
    return [[int(v) for v in o.tolist()] for o in out]


def _check_layout(rows: List[List[int]], checked_targets: bool) -> int:
    """The shards of every rank (``[class_start, C_r, num_classes or -1, N, D, dtype, target hash, ...]``)
    tile ``[0, num_classes)`` and agree on the batch; returns ``num_classes``. The same table
    reaches every rank, so every rank raises the same error."""
    table = ", ".join(f"rank {r}: [{a}, {a + c})" for r, (a, c, *_rest) in enumerate(rows))
    for col, name, hint in ((3, "N (embeddings.shape[0])", "pass the same (replicated) batch on every rank"),
                            (4, "D (embeddings.shape[1])", "every rank's shard of one head has the same D"),
                            (5, "the compute dtype (float64 when any input is float64, else float32)",
                             "pass the same dtypes on every rank")):
        values = [r[col] for r in rows]
        if len(set(values)) != 1:
            raise value_error(_FN, f"every rank must pass the same {name}", f"{values} by rank", hint)
    if checked_targets and len({r[6] for r in rows}) != 1:
        raise value_error(_FN, "every rank must pass the same target", "different targets on some ranks",
                          "the batch (embeddings and target) is replicated over the ranks of a vocabulary-parallel "
                          "head; broadcast it from one rank or feed every rank the same batch")
    given = sorted({r[2] for r in rows if r[2] >= 0})
    if len(given) > 1:
        raise value_error(_FN, "every rank must pass the same num_classes", f"{[r[2] for r in rows]} by rank",
                          "pass the size of the whole head everywhere, or None on every rank to sum the shards")
    total = sum(r[1] for r in rows)
    c = given[0] if given else total
    for r, (a, n, *_rest) in enumerate(rows):
        if n > 0 and a + n > c:  # an empty shard's class_start does not matter (torch.chunk's offsets)
            raise value_error(_FN, f"class_start + weight_shard.shape[0] must be <= num_classes ({c})",
                              f"class_start={a}, C_r={n} on rank {r}",
                              "rank r holds rows [class_start, class_start + C_r) of the (num_classes, D) head")
    spans = sorted((a, a + n) for a, n, *_rest in rows if n > 0)
    end = 0
    for a, b in spans:
        if a != end or b > c:
            raise value_error(_FN, f"the shards (class_start, weight_shard.shape[0]) must tile [0, {c}) without "
                              "gaps or overlaps", table,
                              "rank r holds rows [class_start, class_start + C_r) of the (num_classes, D) head; "
                              "check class_start on each rank")
        end = b
    if end != c:
        raise value_error(_FN, f"the shards (class_start, weight_shard.shape[0]) must tile [0, {c}) without gaps "
                          "or overlaps", table, f"the shards cover [0, {end}); check class_start and num_classes")
    return c


def _target_hash(target: Tensor) -> int:
    t = target.long()
    return int((t * torch.arange(1, t.numel() + 1, device=t.device)).sum() + 7919 * t.sum())


def vocab_parallel_linear_cross_entropy(
    embeddings: Tensor,
    target: Tensor,
    weight_shard: Tensor,
    *,
    bias_shard: Optional[Tensor] = None,
    class_start: int,
    num_classes: Optional[int] = None,
    group: Optional[object] = None,
    chunk_size: Optional[int] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    logz_coef: float = 0.0,
    softcap: Optional[float] = None,
) -> Tensor:
    r""":func:`losses.linear_cross_entropy` of a head whose classes are split over the ranks of a
    process group (a vocabulary-parallel, i.e. tensor-parallel, output layer).

    Rank ``r`` holds rows ``[class_start, class_start + C_r)`` of the ``(C, D)`` classifier as
    ``weight_shard (C_r, D)`` (and ``bias_shard (C_r,)``) and the same ``embeddings (N, D)`` and
    ``target (N,)`` (global class ids) as every other rank. The loss is exactly that of
    :func:`losses.linear_cross_entropy` on the concatenated head:

    ``z_ik = <embeddings_i, weight_k> + bias_k`` (``softcap=c``: ``c * tanh(z_ik / c)``);
    ``L_i = (1-eps)(lse_i - z_{i,y_i}) + eps(lse_i - mean_k z_ik) + logz_coef * lse_i^2``,
    ``lse_i = logsumexp_k z_ik`` over all ``C = num_classes`` classes; ``L_i = 0`` where
    ``target == ignore_index``. ``"none"`` gives ``(N,)``, ``"sum"`` the sum and ``"mean"`` the
    mean over the non-ignored rows; every rank returns the same value.

    Each rank computes, chunk by chunk over its shard (``chunk_size`` classes; ``None``: about 4M
    logits per chunk), its row maximum ``m_r`` and exp-sum ``s_r`` online, the sum of its (capped)
    logits (label smoothing only) and the target logit of the rows whose target is in its shard
    (0 elsewhere); then ``M = max_r m_r``, ``S = sum_r s_r exp(m_r - M)`` and ``lse = M + log S``.
    The backward recomputes each chunk's logits, ``dz = (1 + 2 logz_coef lse) p - (1-eps) onehot(y)
    - eps / C`` (times ``1 - tanh^2(z / c)`` with ``softcap``), and returns this rank's
    ``weight_shard`` and ``bias_shard`` gradients and the **full** ``embeddings`` gradient: the
    partial gradients of the shards are all-reduced (summed), as the input gradient of a
    tensor-parallel column-parallel head is, because every rank holds a replica of the
    embeddings and of the graph that made them. No ``N x C`` (nor ``N x C_r``) logits are kept.

    Communication over ``group`` (``None``: the default group): one all-gather of 8 integers per
    rank (the shard layout, the batch shape and the outcome of the data checks, so that a bad input
    on one rank raises the same ``ValueError`` on every rank: the shards must tile
    ``[0, num_classes)`` and every rank must pass the same ``N``, ``D``, compute dtype and, with the
    data checks on, the same targets); forward, one all-reduce (MAX) of ``N`` floats and one (SUM)
    of ``2N`` floats (``3N`` with ``label_smoothing > 0``: the rescaled exp-sums, the target logits
    and the logit sums, packed into one call); backward, one all-reduce (SUM) of the ``N x D``
    embeddings gradient. Every rank must make the call with the same arguments apart from its
    shard, and every rank must run the backward (collectives).

    ``num_classes``: the size ``C`` of the whole head (``None``: the sum of the shards' sizes);
    ``class_start + C_r <= num_classes``; a rank may hold no classes (``C_r = 0``, any
    ``class_start``).

    Without an initialised process group and with ``group=None`` (and on a group of one rank),
    there is one rank: ``weight_shard`` must be the whole head (``class_start=0``, ``num_classes``
    ``None`` or ``C_r``) and the call is :func:`losses.linear_cross_entropy` (with its GPU path).
    On more ranks the chunks are computed in float32 (float64 for float64 inputs) on every device.

    **DTensor / FSDP2.** A head stored as a DTensor sharded on dim 0 (``Shard(0)``, e.g. by a
    tensor-parallel ``ColwiseParallel`` plan for the output projection): pass
    ``weight.to_local()`` and its offset (``rank * ceil(C / world)`` for torch's even split: the
    ``torch.chunk`` layout, whose last shards may be smaller or empty) with the
    tensor-parallel group, and the replicated hidden states. FSDP2 (``fully_shard``) shards
    parameters for storage, not the vocabulary: its forward gathers the full weight, so call
    :func:`losses.linear_cross_entropy` as usual, or use this function under a tensor-parallel plan.

    Shapes: ``embeddings (N, D)``, ``target (N,)`` integer ids in ``[0, num_classes)`` or
    ``ignore_index``, ``weight_shard (C_r, D)``, ``bias_shard (C_r,)``. No class weights; no double
    backward.

    >>> import torch, losses
    >>> x, w, y = torch.randn(4, 3), torch.randn(10, 3), torch.tensor([0, 9, 3, -100])
    >>> one_rank = losses.vocab_parallel_linear_cross_entropy(x, y, w, class_start=0)
    >>> bool(torch.allclose(one_rank, losses.linear_cross_entropy(x, y, w)))
    True
    """
    fn = _FN
    check_floating(fn, "embeddings", embeddings)
    check_floating(fn, "weight_shard", weight_shard)
    check_integer_target(fn, target)
    check_reduction(fn, reduction)
    check_number(fn, "label_smoothing", label_smoothing, low=0.0, high=1.0)
    check_number(fn, "logz_coef", logz_coef, low=0.0)
    cap = check_softcap(fn, softcap)
    class_start = check_int(fn, "class_start", class_start, low=0,
                            hint="pass the index of this rank's first class row in the whole head")
    num_classes = check_int(fn, "num_classes", num_classes, low=1, allow_none=True,
                            hint="pass the size of the whole head, or None to sum the shards' sizes")
    if chunk_size is not None:
        check_int(fn, "chunk_size", chunk_size, low=1, allow_none=True, hint="use None to choose it from N and C_r")
    if embeddings.dim() != 2:
        raise value_error(fn, "embeddings must have shape (N, D)", f"shape {tuple(embeddings.shape)}",
                          "flatten leading dimensions with embeddings.reshape(-1, D)")
    n, d = embeddings.shape
    if weight_shard.dim() != 2 or weight_shard.shape[1] != d:
        raise value_error(fn, f"weight_shard must have shape (C_r, {d})", f"shape {tuple(weight_shard.shape)}",
                          "weight_shard holds this rank's rows of the (num_classes, D) head")
    if target.shape != (n,):
        raise value_error(fn, f"target must have shape ({n},)", f"shape {tuple(target.shape)}",
                          "pass one global class id per embedding row")
    cr = weight_shard.shape[0]
    if bias_shard is not None:
        check_tensor(fn, "bias_shard", bias_shard)
        if bias_shard.shape != (cr,):
            raise value_error(fn, f"bias_shard must have shape ({cr},)", f"shape {tuple(bias_shard.shape)}",
                              "one bias per class row of weight_shard")
    if num_classes is not None:
        check_softmax_classes(fn, num_classes, arg="num_classes")
    dtype = compute_dtype(embeddings, weight_shard, bias_shard)
    if group is None and not (dist.is_available() and dist.is_initialized()):
        world = 1
    else:
        if not (dist.is_available() and dist.is_initialized()):
            raise value_error(fn, "a group was passed but torch.distributed is not initialised", repr(group),
                              "call torch.distributed.init_process_group first, or pass group=None for one rank")
        world = dist.get_world_size(group)
    if world == 1:
        c = cr if num_classes is None else num_classes
        if class_start + cr > c:
            raise value_error(fn, f"class_start + weight_shard.shape[0] must be <= num_classes ({c})",
                              f"class_start={class_start}, C_r={cr}",
                              "this rank's rows [class_start, class_start + C_r) must lie inside the head")
        if class_start != 0 or cr != c:
            raise value_error(fn, f"on one rank weight_shard must be the whole head (class_start=0, C_r={c})",
                              f"class_start={class_start}, C_r={cr}, num_classes={num_classes}",
                              "initialise torch.distributed and call this on every rank of the group, or pass "
                              "the whole weight")
        check_softmax_classes(fn, c, arg="weight_shard.shape[0] (the number of classes C on one rank)")
        for name, t in (("embeddings", embeddings), ("weight_shard", weight_shard), ("bias_shard", bias_shard)):
            if t is not None:
                check_finite(fn, name, t)
        check_ids_in_range(fn, target, c, ignore_index)
        return linear_cross_entropy(embeddings, target, weight_shard, bias=bias_shard, chunk_size=chunk_size,
                                    ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing,
                                    logz_coef=logz_coef, softcap=cap)
    checking = _checking()
    # the data checks of this rank's tensors are shared with every rank before anyone raises, so that
    # no rank is left waiting in a collective
    not_finite = {}
    for name, t in (("embeddings", embeddings), ("weight_shard", weight_shard), ("bias_shard", bias_shard)):
        try:
            if t is not None:
                check_finite(fn, name, t)
        except ValueError as exc:
            not_finite[name] = exc
    row = [class_start, cr, -1 if num_classes is None else num_classes, n, d, int(dtype == torch.float64),
           _target_hash(target) if checking else 0, len(not_finite)]
    rows = _gather_layout(row, group, embeddings.device)
    if not_finite:
        raise next(iter(not_finite.values()))
    bad = [r for r, values in enumerate(rows) if values[7]]
    if bad:
        raise value_error(fn, "the inputs of another rank contain NaN or infinite values", f"ranks {bad}",
                          "see the error raised on those ranks; check the model output for overflow or divergence")
    c = _check_layout(rows, checking)
    check_softmax_classes(fn, c, arg="num_classes (the sum of the shards' sizes)")
    check_ids_in_range(fn, target, c, ignore_index, hint="target holds global class ids; check num_classes "
                       "or set ignore_index")
    chunk = max(1, min(cr, chunk_size if chunk_size is not None else default_chunk_size(n, cr)))
    y = target.long()
    valid = target != ignore_index
    in_shard = valid & (y >= class_start) & (y < class_start + cr)
    local_y = torch.where(in_shard, y - class_start, torch.zeros_like(y))
    with no_autocast(embeddings, weight_shard):
        values = _VocabParallelLinearCrossEntropy.apply(
            drop_rows(embeddings, valid), weight_shard, bias_shard, local_y, in_shard, valid, chunk,
            float(label_smoothing), float(logz_coef), dtype, cap, c, group)
        return reduce_loss(values, valid.to(dtype), reduction)
