"""In-batch scores: every query against every (optionally all-gathered) key.

:func:`in_batch_scores` turns ``(query (B, D), keys (K, D), target)`` into the ``scores (B, L)``
and target that :func:`losses.decoupled_softmax_loss`, :func:`losses.infonce_loss` and
:func:`losses.soft_topk_loss` take; the modules of those losses route ``forward(query, keys,
target)`` through it (and reduce over the global batch with ``gather_distributed``) by
``module_forward``. Re-exported from :mod:`losses.ranking.decoupled`.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from .._core import (
    _checking,
    check_ignore_index,
    check_finite,
    check_floating,
    check_ids_in_range,
    check_tensor,
    compute_dtype,
    reduce_loss,
    type_error,
    upcast,
    value_error,
)
from .._distributed import all_gather_no_grad, all_gather_with_grad, is_distributed, rank, world_size
from .._core import check_bool, no_autocast
from .._precision import matmul
from ._targets import _check_not_a_mask, _ranking_targets, _rows_list

__all__ = ["in_batch_scores"]


def in_batch_scores(
    query: Tensor,
    keys: Tensor,
    target: Tensor,
    *,
    gather_distributed: bool = False,
    mask: Optional[Tensor] = None,
    ignore_index: int = -100,
) -> Tuple[Tensor, Tensor]:
    r"""Score every query against every key: ``scores = query @ keys_all.T`` and the matching target.

    ``query (B, D)``, ``keys (K, D)``; ``target`` names each query's positive keys among this
    rank's ``K`` keys: integer ids ``(B,)`` / ``(B, P)`` (padded with ``ignore_index``) or a bool /
    float ``(B, K)`` mask. With ``gather_distributed=True`` under an initialised multi-rank
    process group, ``keys`` are all-gathered from every rank (a global negative pool, rank order;
    the backward sums the gradients over ranks) and the target is moved into global columns: ids
    are offset by ``rank * K`` (``ignore_index`` stays), masks are placed in this rank's column
    block of a ``(B, world_size * K)`` zero mask. Every rank must pass the same ``K``. Without a
    process group (or with the flag off) ``keys_all = keys`` and ``target`` is returned as is.

    ``mask`` (bool, ``True`` = exclude, e.g. a known false negative) has shape ``(B, K)`` (this
    rank's keys; gathered: placed in this rank's column block, the other ranks' keys stay in) or
    ``(B, world_size * K)`` (every key); the returned scores are ``-inf`` there (gradient
    exactly 0), which the ranking losses treat as a missing candidate. A mask that removes a
    positive is a ``ValueError`` (a data check, as in the losses). A non-integer ``ignore_index``
    is a ``TypeError``.

    Computed in float32 or wider (float64 if either input is float64). Used by the modules of
    :func:`decoupled_softmax_loss`, :func:`infonce_loss` and :func:`soft_topk_loss` for
    ``forward(query, keys, target)`` (Gupta et al., arXiv:2310.10636).

    >>> import torch, losses
    >>> q, k = torch.eye(2), torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    >>> scores, t = losses.in_batch_scores(q, k, torch.tensor([0, 1]))
    >>> scores
    tensor([[1., 0.],
            [0., 2.]])
    """
    return _in_batch_scores(query, keys, target, gather_distributed=gather_distributed, mask=mask,
                            ignore_index=ignore_index, own_data_checks=True)


def _in_batch_scores(query: Tensor, keys: Tensor, target: Tensor, *, gather_distributed: bool,
                     mask: Optional[Tensor], ignore_index: int, own_data_checks: bool) -> Tuple[Tensor, Tensor]:
    """:func:`in_batch_scores`. ``own_data_checks=False`` (the ranking modules) skips its data checks
    of non-finite embeddings and of a mask that removes a positive: the module's loss then checks the
    scores it is given (NaN or ``+inf`` scores, a positive whose score the mask set to ``-inf``), so a
    training step does not pay for both."""
    fn = "in_batch_scores"
    check_floating(fn, "query", query)
    check_floating(fn, "keys", keys)
    check_tensor(fn, "target", target)
    check_bool(fn, "gather_distributed", gather_distributed)
    check_ignore_index(fn, ignore_index)
    if query.dim() != 2 or keys.dim() != 2 or query.shape[1] != keys.shape[1]:
        raise value_error(fn, "query and keys must have shapes (B, D) and (K, D) with the same D",
                          f"shapes {tuple(query.shape)} and {tuple(keys.shape)}", "pass one embedding per row")
    if own_data_checks:
        check_finite(fn, "query", query)
        check_finite(fn, "keys", keys)
    dtype = compute_dtype(query, keys)
    q = upcast(query, dtype)
    kk = upcast(keys, dtype)
    if mask is not None:
        check_tensor(fn, "mask", mask)
        if mask.dtype != torch.bool:
            raise type_error(fn, "mask must be a bool tensor (True = exclude the key)", str(mask.dtype),
                             "pass mask.bool()")
    gathered = gather_distributed and is_distributed()
    n_world = world_size() if gathered else 1
    if mask is not None:
        shapes = [(query.shape[0], keys.shape[0])] + ([(query.shape[0], n_world * keys.shape[0])] if gathered else [])
        if tuple(mask.shape) not in shapes:
            raise value_error(fn, "mask must have shape " + " or ".join(str(t) for t in shapes)
                              + ", one flag per (query, key)", f"shape {tuple(mask.shape)}",
                              "pass True where a key must not be a candidate for the query")
        if gathered and tuple(mask.shape) == shapes[0]:
            r_, w_ = rank(), n_world
            n_keys = keys.shape[0]
            mask = torch.cat([mask.new_zeros(query.shape[0], r_ * n_keys), mask,
                              mask.new_zeros(query.shape[0], (w_ - r_ - 1) * n_keys)], dim=1)
    if gathered:
        n_keys = keys.shape[0]
        r, w = rank(), world_size()
        if target.dtype == torch.bool or target.is_floating_point():
            if target.shape != (query.shape[0], n_keys):
                raise value_error(fn, f"mask target must have shape ({query.shape[0]}, {n_keys}), one column per key",
                                  f"shape {tuple(target.shape)}", "pass integer ids of the positive keys otherwise")
            left = target.new_zeros(query.shape[0], r * n_keys)
            right = target.new_zeros(query.shape[0], (w - r - 1) * n_keys)
            target = torch.cat([left, target, right], dim=1)
        else:
            if target.dim() not in (1, 2) or target.shape[0] != query.shape[0]:
                raise value_error(fn, f"integer target must have shape ({query.shape[0]},) or ({query.shape[0]}, P)",
                                  f"shape {tuple(target.shape)}", "pass one id per query or padded id lists")
            _check_not_a_mask(fn, target, n_keys)
            check_ids_in_range(fn, target, n_keys, ignore_index, hint="ids index this rank's keys; pad with ignore_index")
            target = torch.where(target != ignore_index, target + r * n_keys, target)
        kk = all_gather_with_grad(kk, fn=fn)
    with no_autocast(q, kk):
        scores = matmul(q, kk.T)
        if mask is not None:
            scores = torch.where(mask.to(scores.device), torch.full((), -math.inf, dtype=scores.dtype,
                                                                    device=scores.device), scores)
    if own_data_checks and mask is not None and _checking() and scores.numel() > 0:  # a masked positive
        pos, _ = _ranking_targets(fn, scores, target, ignore_index, scores.dtype)
        removed = (pos & mask.to(pos.device)).any(dim=1)
        if bool(removed.any()):
            raise value_error(fn, "mask removes a positive", _rows_list(removed),
                              "a positive must stay a candidate: unmark it in mask or drop it from target")
    return scores, target


def module_forward(module: nn.Module, rows_fn, a: Tensor, b: Tensor, c: Optional[Tensor],
                   mask: Optional[Tensor] = None) -> Tensor:
    """``forward(scores, target)`` or ``forward(query, keys, target)``, reduced over the global
    batch when ``gather_distributed`` (docs/conventions.md Distributed)."""
    if c is None:
        scores, target, anchors = a, b, (a,)
    else:
        scores, target = _in_batch_scores(a, b, c, gather_distributed=module.gather_distributed, mask=mask,
                                          ignore_index=module.ignore_index, own_data_checks=False)
        anchors, mask = (a, b), None
    with no_autocast(scores):
        values, weights = rows_fn(scores, target, mask)
        if module.reduction != "none" and module.gather_distributed and is_distributed():
            fn = type(module).__name__
            values = all_gather_with_grad(values, fn=fn)
            weights = all_gather_no_grad(weights, fn=fn)
        return reduce_loss(values, weights, module.reduction, anchors=anchors)
