"""Checks shared by the losses that own a classification head (embedding_dim x num_classes).

* :func:`check_head_embeddings`: a head built for ``embedding_dim`` features called with
  embeddings of another width gets an error that names ``embeddings`` and the head's
  ``embedding_dim`` (not the class weights the user never passed).
* :func:`check_head_sizes`: ``embedding_dim`` and ``num_classes`` of a margin-softmax head
  (ArcFace / CosFace, Partial FC) are ints >= 1.
* :func:`default_chunk_size` / :func:`chunk_logits`: the class chunks of the chunked linear heads
  (:func:`losses.linear_cross_entropy` and its vocabulary-parallel form).
* :func:`check_softmax_classes`: a softmax over a single class is identically 0 and trains
  nothing, so ``num_classes = 1`` (or a one-row class weight) is a ``ValueError`` that points to
  the one-logit alternative (``docs/conventions.md``, degenerate inputs).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ._core import check_floating, check_int, check_integer_target, check_softmax_classes, value_error

__all__ = ["check_head_embeddings", "check_head_sizes", "check_embeddings_and_target", "check_softmax_classes", "drop_rows",
           "CHUNK_ELEMENTS", "default_chunk_size", "chunk_logits"]


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
