"""Checks shared by the losses that own a classification head (embedding_dim x num_classes).

* :func:`check_head_embeddings`: a head built for ``embedding_dim`` features called with
  embeddings of another width gets an error that names ``embeddings`` and the head's
  ``embedding_dim`` (not the class weights the user never passed).
* :func:`check_head_sizes`: ``embedding_dim`` and ``num_classes`` of a margin-softmax head
  (ArcFace / CosFace, Partial FC) are ints >= 1.
* :func:`default_chunk_size` / :func:`chunk_logits` / :func:`chunked_row_stats` /
  :func:`chunked_softmax_backward`: the class chunks of the chunked linear heads
  (:func:`losses.linear_cross_entropy` and its vocabulary-parallel form), forward and backward.
* :func:`check_softmax_classes`: a softmax over a single class is identically 0 and trains
  nothing, so ``num_classes = 1`` (or a one-row class weight) is a ``ValueError`` that points to
  the one-logit alternative (``docs/conventions.md``, degenerate inputs).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from ._core import check_floating, check_int, check_integer_target, check_softmax_classes, value_error

__all__ = ["check_head_embeddings", "check_head_sizes", "check_embeddings_and_target", "check_softmax_classes",
           "drop_rows", "CHUNK_ELEMENTS", "default_chunk_size", "chunk_logits", "chunked_row_stats", "chunked_softmax_backward",
           "subtract_target_term"]


def check_head_embeddings(fn: str, head: str, embeddings: object, embedding_dim: int) -> None:
    """``embeddings`` of shape ``(N, D)`` with ``D != embedding_dim`` raise ``ValueError``.

    Other mistakes (not a tensor, not 2-D) are left to the loss function's own checks.
    """
    if isinstance(embeddings, Tensor) and embeddings.dim() == 2 and embeddings.shape[1] != embedding_dim:
        raise value_error(
            fn,
            f"embeddings must have shape (N, {embedding_dim}) to match {head}(embedding_dim={embedding_dim})",
            f"shape {tuple(embeddings.shape)}",
            f"build the head with embedding_dim={embeddings.shape[1]} or project the features to "
            f"{embedding_dim} dimensions",
        )


def check_head_sizes(fn: str, embedding_dim: int, num_classes: int) -> None:
    """``embedding_dim`` and ``num_classes`` are ints >= 1 (else the ``check_int`` error of ``fn``)."""
    for name, v in (("embedding_dim", embedding_dim), ("num_classes", num_classes)):
        check_int(fn, name, v, low=1, hint=f"pass {name} as an int >= 1")


def check_embeddings_and_target(fn: str, embeddings: Tensor, target: Tensor) -> None:
    """``embeddings`` a floating ``(N, D)`` tensor and ``target`` integer ids of shape ``(N,)``."""
    check_floating(fn, "embeddings", embeddings)
    check_integer_target(fn, target)
    if embeddings.dim() != 2:
        raise value_error(fn, "embeddings must have shape (N, D)", f"shape {tuple(embeddings.shape)}",
                          "flatten the features to one vector per sample")
    if tuple(target.shape) != (embeddings.shape[0],):
        raise value_error(fn, f"target must have shape ({embeddings.shape[0]},), one id per embedding",
                          f"shape {tuple(target.shape)}", "pass one class id per row of embeddings")


def drop_rows(x: Tensor, valid: Tensor) -> Tensor:
    """``x`` with the rows where ``valid`` is False replaced by zeros (gradient exactly 0 there).

    Ignored rows are dropped before any arithmetic, so their content, even ``inf``/NaN with the
    data checks off, never reaches the value or the gradients of the other rows and parameters.
    """
    return torch.where(valid.reshape(-1, *([1] * (x.dim() - 1))).to(x.device), x,
                       torch.zeros((), dtype=x.dtype, device=x.device))


#: Target size, in elements, of one chunk of logits (N x chunk): 2**22 floats = 16 MiB in fp32.
CHUNK_ELEMENTS = 1 << 22


def default_chunk_size(n: int, c: int) -> int:
    """Classes per chunk of a chunked linear head: about :data:`CHUNK_ELEMENTS` logits, at least 256."""
    return int(max(256, min(c, CHUNK_ELEMENTS // max(n, 1))))


def chunk_logits(xc: Tensor, weight: Tensor, bias: Optional[Tensor], start: int, chunk: int,
                 dtype: torch.dtype) -> Tensor:
    """Logits of classes ``[start, start + chunk)`` as a fresh ``(N, chunk)`` tensor."""
    w = weight[start:start + chunk].to(dtype)
    if bias is None:
        return xc @ w.T
    return torch.addmm(bias[start:start + chunk].to(dtype), xc, w.T)


def chunked_row_stats(xc: Tensor, weight: Tensor, bias: Optional[Tensor], *, chunk: int, dtype: torch.dtype,
                      cap: Optional[float], sum_capped: bool = False,
                      class_weight: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Optional[Tensor], Tensor]:
    """One pass over the class chunks of a linear head (the forward of the chunked heads).

    For the rows of ``xc (N, D)`` and the classes of ``weight (C_r, D)`` (``bias (C_r,)``), chunk by
    chunk, with the logits soft-capped (``cap * tanh(z / cap)``) when ``cap`` is set: the running
    row maximum ``m`` and ``s = sum_k exp(z_k - m)`` (so ``log Z = m + log s``), the first index of
    the largest logit, and with ``sum_capped`` the sum of the capped logits, weighted by
    ``class_weight`` when given (label smoothing under a cap needs it; without a cap it is one
    matvec, done by the caller). Returns ``(m, s, z_sum or None, argmax)``.
    """
    n, c = xc.shape[0], weight.shape[0]
    m = torch.full((n,), -math.inf, dtype=dtype, device=xc.device)
    s = torch.zeros((n,), dtype=dtype, device=xc.device)
    z_sum = torch.zeros((n,), dtype=dtype, device=xc.device) if sum_capped else None
    pred = torch.zeros((n,), dtype=torch.long, device=xc.device)
    for start in range(0, c, chunk):
        z = chunk_logits(xc, weight, bias, start, chunk, dtype)
        if cap is not None:
            z = z.div_(cap).tanh_().mul_(cap)
        if z_sum is not None:
            z_sum += z.sum(dim=1) if class_weight is None else z @ class_weight[start:start + chunk]
        z_max, z_arg = z.max(dim=1)
        pred = torch.where(z_max > m, z_arg + start, pred)  # strict: the first largest class wins
        m_new = torch.maximum(m, z_max)
        s = s * torch.exp(m - m_new) + z.sub_(m_new.unsqueeze(1)).exp_().sum(dim=1)
        m = m_new
    return m, s, z_sum, pred


def chunked_softmax_backward(xc: Tensor, weight: Tensor, bias: Optional[Tensor], lse: Tensor, g: Tensor,
                             g_soft: Tensor, *, chunk: int, dtype: torch.dtype, cap: Optional[float], eps: float,
                             num_classes: int, need_x: bool, need_w: bool, need_b: bool,
                             class_weight: Optional[Tensor] = None
                             ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """The softmax part of the chunked heads' gradient, recomputing each chunk's logits.

    Per chunk ``dz_k = g_soft p_k - (eps / C) g w_k`` (``w_k = 1`` without ``class_weight``;
    ``p_k = exp(z_k - lse)`` of the capped logits, times ``1 - tanh^2`` under a cap), accumulated
    into ``d xc = sum dz W`` and written into ``d weight = dz^T xc`` and ``d bias = sum_rows dz`` of
    the chunk's rows. The target's term is the caller's. Returns ``(gx, gw, gb)`` (``None`` where not
    needed), in ``dtype``.
    """
    c = weight.shape[0]
    gx = torch.zeros_like(xc) if need_x else None
    gw = torch.empty((c, weight.shape[1]), dtype=dtype, device=xc.device) if need_w else None
    gb = torch.empty((c,), dtype=dtype, device=xc.device) if need_b else None
    for start in range(0, c, chunk):
        dz = chunk_logits(xc, weight, bias, start, chunk, dtype)  # overwritten in place with dL/dz
        dcap = None
        if cap is not None:  # capped logits, and the chain rule factor 1 - tanh^2 below
            t = dz.div_(cap).tanh_()
            dcap = 1.0 - t * t
            dz = t.mul_(cap)
        dz.sub_(lse.unsqueeze(1)).exp_().mul_(g_soft.unsqueeze(1))
        if eps > 0:
            if class_weight is None:
                dz.sub_((eps / num_classes) * g.unsqueeze(1))
            else:
                dz.sub_((eps / num_classes) * g.unsqueeze(1) * class_weight[start:start + chunk].unsqueeze(0))
        if dcap is not None:
            dz.mul_(dcap)
        if need_x:
            gx.addmm_(dz, weight[start:start + chunk].to(dtype))
        if need_w:
            torch.mm(dz.T, xc, out=gw[start:start + chunk])
        if need_b:
            gb[start:start + chunk] = dz.sum(dim=0)
    return gx, gw, gb


def subtract_target_term(gx: Optional[Tensor], gw: Optional[Tensor], gb: Optional[Tensor], gy: Tensor,
                         weight: Tensor, xc: Tensor, ids: Tensor, dtype: torch.dtype) -> None:
    """The target's term ``-gy_i`` on ``dL/dz_{i, ids_i}`` of a chunked head, in place: ``d xc -= gy
    W[ids]``, ``d weight[ids] -= gy xc``, ``d bias[ids] -= gy`` (each where not ``None``)."""
    if gx is not None:
        gx.sub_(gy.unsqueeze(1) * weight.index_select(0, ids).to(dtype))
    if gw is not None:
        gw.index_add_(0, ids, -gy.unsqueeze(1) * xc)
    if gb is not None:
        gb.index_add_(0, ids, -gy)
