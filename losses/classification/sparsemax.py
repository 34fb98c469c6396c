"""Sparsemax, entmax-1.5 and bisection entmax: activations and Fenchel-Young losses (docs/losses/sparsemax.md).

``entmax_alpha(z) = argmax_{p in simplex} <p, z> + H_alpha(p)`` with the Tsallis entropy
``H_alpha(p) = (1 - sum_j p_j^alpha) / (alpha (alpha - 1))``; ``alpha = 2`` is sparsemax
(Martins & Astudillo, ICML 2016, arXiv:1602.02068), ``alpha = 1.5`` is entmax-1.5 (Peters,
Niculae & Martins, ACL 2019, arXiv:1905.05702). The matching Fenchel-Young losses
(Blondel, Martins & Niculae, JMLR 2020, arXiv:1901.02324) are
``L(z; q) = <p* - q, z> + H_alpha(p*) - H_alpha(q)`` with ``p* = entmax_alpha(z)``; their
gradient is ``p* - q``.

The reference implementation is ``deep-spin/entmax`` (MIT); paper and reference maths agree, so
there is no ``variant``. Nothing here is derived from its code.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn

from .._core import (
    all_kept,
    check_logits_dim,
    as_index,
    check_ignore_index,
    auto_extra_repr,
    _checking,
    check_class_target,
    check_distribution,
    check_finite,
    check_floating,
    check_ids_in_range,
    check_int,
    check_masked_logits,
    check_number,
    check_reduction,
    check_softmax_classes,
    check_tensor,
    compute_dtype,
    flatten_logits_and_target,
    move_class_dim_last,
    no_autocast,
    reduce_loss,
    type_error,
    upcast,
    value_error,
    zero_rows,
)
from .._registry import N_EXAMPLE, C_EXAMPLE, position_unit_weights, register
from ._entmax_ops import EntmaxBisectFunction, ExactEntmaxFunction, FYLossFunction
from .. import kernels
from ._targets import fused_divisor, kernel_result, kernel_rows

__all__ = [
    "sparsemax",
    "entmax15",
    "entmax_bisect",
    "sparsemax_loss",
    "entmax15_loss",
    "entmax_bisect_loss",
    "SparsemaxLoss",
    "Entmax15Loss",
    "EntmaxBisectLoss",
]

AlphaLike = Union[float, Tensor]


# --------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------


def _check_dim(fn: str, input: Tensor, dim: object) -> int:
    index = as_index(dim)
    if index is None:
        raise type_error(fn, "dim must be an int", type(dim).__name__, "pass the index of the class dimension")
    dim = index
    nd = max(input.dim(), 1)
    if not -nd <= dim < nd:
        raise value_error(fn, f"dim out of range for a {input.dim()}-D input", dim,
                          f"use a dim in [{-nd}, {nd - 1}]")
    return dim % nd


def _check_k(fn: str, k: object) -> Optional[int]:
    # a non-integer k is TypeError, k < 1 ValueError
    return check_int(fn, "k", k, low=1, allow_none=True, what="None or a positive int",
                     hint="k is only a partial-sort size for speed; use None for the full search")


def _check_n_iter(fn: str, n_iter: object) -> int:
    return check_int(fn, "n_iter", n_iter, low=1, what="a positive int", hint="use the default n_iter=50")


_ALPHA_HINT = "alpha must exceed 1 (alpha=1 is softmax); parametrise a learnable alpha as 1 + softplus(.)"


def _check_alpha(fn: str, alpha: object) -> None:
    """Float alphas are checked here; tensor alphas get a data check (host sync)."""
    if isinstance(alpha, Tensor):
        check_floating(fn, "alpha", alpha)
        if _checking() and alpha.numel() > 0:
            bad = ~(alpha > 1) | ~torch.isfinite(alpha)
            if bool(bad.any()):
                a = alpha.detach()
                raise value_error(fn, "alpha must be finite and > 1", f"min={float(a.min())}", _ALPHA_HINT)
        return
    check_number(fn, "alpha", alpha, low=1.0, low_inclusive=False, hint=_ALPHA_HINT)


def _last_dim_2d(x: Tensor, dim: int) -> tuple:
    """Move ``dim`` last and flatten the rest: ``(M, C)`` plus what is needed to undo it."""
    moved = x.movedim(dim, -1)
    rows = math.prod(moved.shape[:-1])  # explicit: reshape(-1, 0) is ambiguous for an empty dim
    return moved.reshape(rows, moved.shape[-1]), moved.shape


def _alpha_rows_activation(fn: str, alpha: AlphaLike, input: Tensor, dim: int, dtype) -> Tensor:
    """Alpha as an ``(M, 1)`` (per row) or ``(1, 1)`` tensor in ``dtype``.

    A tensor alpha is a scalar, or broadcastable to ``input`` with size 1 along ``dim``
    (e.g. ``(N, 1)`` for ``(N, C)`` and ``dim=-1``), or shaped like ``input`` without ``dim``
    (e.g. ``(N,)``).
    """
    if not isinstance(alpha, Tensor):
        return torch.full((1, 1), float(alpha), dtype=dtype, device=input.device)
    a = alpha.to(dtype)
    if a.dim() == 0:
        return a.reshape(1, 1)
    batch_shape = tuple(s for i, s in enumerate(input.shape) if i != dim)
    if a.dim() == input.dim() - 1 and tuple(a.shape) == batch_shape:
        a = a.unsqueeze(dim)
    if a.dim() != input.dim() or a.shape[dim] != 1:
        raise value_error(fn, f"tensor alpha must be a scalar, shaped {batch_shape} (one per row), or "
                          f"broadcastable to the input {tuple(input.shape)} with size 1 on dim {dim}",
                          f"shape {tuple(alpha.shape)}", "pass one alpha per row")
    try:
        target_shape = list(input.shape)
        target_shape[dim] = 1
        a = a.expand(target_shape)
    except RuntimeError:
        raise value_error(fn, f"tensor alpha must broadcast to the input {tuple(input.shape)} with size 1 on "
                          f"dim {dim}", f"shape {tuple(alpha.shape)}", "pass one alpha per row") from None
    return a.movedim(dim, -1).reshape(-1, 1)


# --------------------------------------------------------------------------------------
# activations
# --------------------------------------------------------------------------------------


def _activation(fn: str, function, input: Tensor, dim: int, *extra, out_dtype=None) -> Tensor:
    """Run a mapping in float32 (float64 for float64 input), outside autocast, and return it in
    ``out_dtype`` (default: the input's dtype, as :func:`torch.softmax`)."""
    check_floating(fn, "input", input)
    d = _check_dim(fn, input, dim)
    check_finite(fn, "input", input, allow_neg_inf=True, neg_inf_note="-inf is allowed (probability 0)")
    dtype = compute_dtype(input)
    out_dtype = input.dtype if out_dtype is None else out_dtype
    if input.dim() == 0:
        raise value_error(fn, "input must have at least one dimension", "a 0-D tensor",
                          "pass a vector of scores")
    with no_autocast(input.device.type):
        z2, moved_shape = _last_dim_2d(upcast(input, dtype), d)
        if z2.numel() == 0:
            return (z2 * 0).reshape(moved_shape).movedim(-1, d).to(out_dtype)
        p = function.apply(z2, *extra)
        return p.reshape(moved_shape).movedim(-1, d).to(out_dtype)


def sparsemax(input: Tensor, *, dim: int = -1, k: Optional[int] = None) -> Tensor:
    r"""Sparsemax, the Euclidean projection of the scores onto the probability simplex.

    Along ``dim``, with :math:`\Delta` the probability simplex and
    :math:`z_{(1)} \ge z_{(2)} \ge \dots` the sorted scores:

    .. math::

        \operatorname{sparsemax}(z) = \arg\min_{p \in \Delta} \lVert p - z \rVert^2 = [z - \tau]_+,

        k^* = \max\Big\{k : 1 + k z_{(k)} > \sum_{j \le k} z_{(j)}\Big\}, \qquad
        \tau = \frac{\sum_{j \le k^*} z_{(j)} - 1}{k^*}.

    This is ``entmax_alpha`` with ``alpha = 2``.

    Paper: A. F. T. Martins, R. F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
    Attention and Multi-Label Classification*, ICML 2016, arXiv:1602.02068.

    Args:
        input: scores of any shape (any floating dtype); ``-inf`` entries are masks (probability 0).
            A slice without any finite score gives all zeros. NaN or ``+inf`` is a ``ValueError``
            (a data check, off under ``losses.validation(False)``).
        dim: the dimension normalised over (negative values count from the end).
        k: ``None`` computes the threshold exactly over all entries (a full sort on GPU; on CPU
            the fastest exact search for the batch shape: a sort-free Newton search over the
            candidates ``z > max - 1``, a top-k partial sort with doubling, or the sort, see
            docs/performance.md; under ``torch.compile`` on CPU that search is one opaque operator
            of the graph, ``losses::exact_entmax_threshold``); an int uses ``torch.topk``
            with ``k`` entries and redoes the batch with ``2k`` while some slice's support
            reaches ``k`` (a speed option only: the result is the same; on CPU the shape-chosen
            search above is used whatever ``k`` is, as it was measured at least as fast as any
            given ``k``). Deciding to redo is a host sync.

    Returns:
        Probabilities shaped like ``input``, in the input's dtype (as :func:`torch.softmax`).
        Half inputs (and everything under ``torch.autocast``) are computed in float32: the
        threshold is found in float32, where rows sum to one to about 1e-6, and only the
        result is rounded to the input dtype.
        The backward pass uses ``dz = v - mean_S(v)`` on the support ``S`` (0 elsewhere);
        double backward raises ``RuntimeError``. Same maths as ``deep-spin/entmax``'s
        ``sparsemax``.

    >>> import torch, losses
    >>> losses.sparsemax(torch.tensor([[2.0, 1.5, -1.0]]))
    tensor([[0.7500, 0.2500, 0.0000]])
    """
    fn = "sparsemax"
    k = _check_k(fn, k)
    return _activation(fn, ExactEntmaxFunction, input, dim, "sparsemax", k)


def entmax15(input: Tensor, *, dim: int = -1, k: Optional[int] = None) -> Tensor:
    r"""Entmax with ``alpha = 1.5``: a sparse softmax between softmax and sparsemax.

    ``entmax15(z) = argmax_{p in simplex} <p, z> + H_1.5(p) = [z/2 - tau]_+^2`` along ``dim``,
    ``H_1.5(p) = (1 - sum_j p_j^1.5) / 0.75``. ``tau`` is exact: with ``x = z/2`` sorted
    decreasingly and ``mu_k``, ``m_k`` the mean and mean square of its top ``k``,
    ``tau_k = mu_k - sqrt(max((1 - k (m_k - mu_k^2)) / k, 0))`` and
    ``k* = #{k : tau_k <= x_(k)}``.

    Paper: B. Peters, V. Niculae, A. F. T. Martins, *Sparse Sequence-to-Sequence Models*,
    ACL 2019, arXiv:1905.05702.

    Args and returns as :func:`sparsemax` (``k``: optional partial-sort size). Backward:
    ``dz = g v - (<g, v> / sum g) g`` with ``g = sqrt(p)``; double backward raises
    ``RuntimeError``. Same maths as ``deep-spin/entmax``'s ``entmax15``.

    >>> import torch, losses
    >>> p = losses.entmax15(torch.tensor([[1.0, 0.5, -2.0]]))
    >>> p
    tensor([[0.6740, 0.3260, 0.0000]])
    >>> float(p.sum())
    1.0
    """
    fn = "entmax15"
    k = _check_k(fn, k)
    return _activation(fn, ExactEntmaxFunction, input, dim, "entmax15", k)


def entmax_bisect(input: Tensor, *, alpha: AlphaLike = 1.5, dim: int = -1, n_iter: int = 50) -> Tensor:
    r"""Entmax for any ``alpha > 1`` by bisection, differentiable in ``input`` and ``alpha``.

    ``entmax_alpha(z) = argmax_{p in simplex} <p, z> + H_alpha(p) = [(alpha - 1) z - tau]_+^(1/(alpha - 1))``
    with ``H_alpha(p) = (1 - sum_j p_j^alpha) / (alpha (alpha - 1))``. After subtracting the row
    max, ``x = (alpha - 1) z`` and ``tau`` is bisected on ``[max x - 1, max x - (1/C)^(alpha - 1)]``
    for ``n_iter`` steps; ``p`` is then renormalised. ``alpha = 2`` is :func:`sparsemax`,
    ``alpha = 1.5`` is :func:`entmax15` (to ~1e-6 in float32, ~1e-12 in float64 at ``n_iter=50``);
    ``alpha -> 1`` tends to softmax.

    Paper: B. Peters, V. Niculae, A. F. T. Martins, *Sparse Sequence-to-Sequence Models*,
    ACL 2019, arXiv:1905.05702 (bisection and the alpha gradient).

    Args:
        input: scores (any floating dtype); ``-inf`` entries are masks.
        alpha: a float ``> 1`` or a tensor (a scalar, one value per slice shaped like ``input``
            without ``dim``, or broadcastable to ``input`` with size 1 on ``dim``); a tensor
            alpha receives the gradient
            ``sum_i v_i [(p_i - pt_i)/(alpha-1)^2 - (p_i log p_i - pt_i sum_j p_j log p_j)/(alpha-1)]``,
            ``pt = p^(2-alpha) / sum_S p^(2-alpha)``. Use ``1 + softplus(.)`` for a learnable alpha.
        dim: the dimension normalised over.
        n_iter: bisection steps (the reference's default, 50).

    Returns:
        Probabilities shaped like ``input`` in the input's dtype (computed in float32 for half
        inputs and under ``torch.autocast``; float64 when ``input`` or a tensor ``alpha`` is
        float64, and a tensor ``alpha`` of a wider dtype promotes the result). Double backward
        raises ``RuntimeError``.

    >>> import torch, losses
    >>> z = torch.tensor([[2.0, 1.5, -1.0]], dtype=torch.float64)
    >>> losses.entmax_bisect(z, alpha=2.0)
    tensor([[0.7500, 0.2500, 0.0000]], dtype=torch.float64)
    """
    fn = "entmax_bisect"
    n_iter = _check_n_iter(fn, n_iter)
    _check_alpha(fn, alpha)
    check_floating(fn, "input", input)
    d = _check_dim(fn, input, dim)
    dtype = compute_dtype(input, alpha if isinstance(alpha, Tensor) else None)
    a = _alpha_rows_activation(fn, alpha, input, d, dtype)
    a_float = None if isinstance(alpha, Tensor) else float(alpha)
    out_dtype = torch.promote_types(input.dtype, alpha.dtype) if isinstance(alpha, Tensor) else input.dtype
    return _activation(fn, EntmaxBisectFunction, input.to(dtype) if input.dtype != dtype else input, dim, a, n_iter,
                       a_float, out_dtype=out_dtype)


# --------------------------------------------------------------------------------------
# Fenchel-Young losses
# --------------------------------------------------------------------------------------


def _alpha_rows_loss(fn: str, alpha: AlphaLike, input: Tensor, out_shape: tuple, dtype) -> Tensor:
    """Loss alpha as ``(M, 1)``/``(1, 1)``: a scalar, or one value per position, i.e. broadcastable
    to the ``"none"`` shape ``(N, d1..dk)`` (a size-1 class dim on dim 1 is also accepted)."""
    if not isinstance(alpha, Tensor):
        return torch.full((1, 1), float(alpha), dtype=dtype, device=input.device)
    a = alpha.to(dtype)
    if a.dim() == 0:
        return a.reshape(1, 1)
    if a.dim() == input.dim() and a.shape[1] == 1:
        a = a.squeeze(1)
    try:
        a = a.expand(out_shape)
    except RuntimeError:
        raise value_error(fn, f"tensor alpha must be a scalar or broadcast to the per-position shape {out_shape}",
                          f"shape {tuple(alpha.shape)}", "pass one alpha per position (row)") from None
    return a.reshape(-1, 1)


#: the widest rows the GPU kernel of the exact losses takes (one row in registers)
_FY_MAX = 32768

def _fy_loss(
    fn: str,
    kind: str,
    input: Tensor,
    target: Tensor,
    *,
    alpha: Optional[AlphaLike],
    k: Optional[int],
    n_iter: int,
    ignore_index: int,
    reduction: str,
) -> Tensor:
    check_floating(fn, "input", input)
    check_tensor(fn, "target", target)
    check_reduction(fn, reduction)
    if alpha is not None:
        _check_alpha(fn, alpha)
    check_logits_dim(fn, input, target)
    c = input.shape[1]
    if c == 0:
        raise value_error(fn, "input needs at least one class on dim 1", f"shape {tuple(input.shape)}",
                          "pass scores for C >= 1 classes")
    check_softmax_classes(fn, c)
    soft = check_class_target(fn, input, target, soft=True, soft_name="distribution")
    alpha_t = alpha if isinstance(alpha, Tensor) else None
    dtype = compute_dtype(input, alpha_t, target if soft else None)
    out_shape = (input.shape[0],) + tuple(input.shape[2:])
    search: Tuple[Optional[Tensor], Optional[Tensor]] = (None, None)  # raw scores and kept rows (traced)
    if soft:
        check_finite(fn, "target", target)
        check_distribution(fn, "target", target, dim=1, tol=1e-4)
        check_masked_logits(fn, "input", input)
        z2 = move_class_dim_last(upcast(input, dtype))
        q2 = move_class_dim_last(upcast(target, dtype))
        y2, weights = None, None
    elif kind != "bisect" and dtype == torch.float32 and c <= _FY_MAX and kernels.use_triton(input):
        # one fused row kernel (losses/kernels/triton_rows.py): the row in registers, the exact
        # threshold by bisection and the support's closed form, the gradient p* - e_y
        x2d, ids, _ = kernel_rows(fn, input, target, ignore_index)
        out = kernels.triton_rows_module().fenchel_young_rows(x2d, ids, entmax=kind == "entmax15", reduction=reduction,
                                                              ignore_index=ignore_index)
        return kernel_result(out, out_shape, reduction)
    else:
        _, t2, _ = flatten_logits_and_target(fn, input, target)
        check_ids_in_range(fn, target, c, ignore_index)
        valid = t2 != ignore_index
        finite = check_masked_logits(fn, "input", input, active=valid)
        z2 = move_class_dim_last(upcast(input, dtype))
        q2 = None
        if all_kept(valid):  # no ignored position (seen on the host): ids as they are, unit weights 1
            y2, weights = t2.long(), None
        else:
            raw = z2
            z2 = zero_rows(z2, valid, verified_finite=finite)
            if z2 is not raw:  # zeroed by a where (traced, or off CPU): a compiled CPU search reads raw, valid
                search = (raw, valid.reshape(-1))
            y2 = torch.where(valid, t2, torch.zeros_like(t2)).long()
            weights = valid.to(dtype)
    a2 = None if alpha is None else _alpha_rows_loss(fn, alpha, input, out_shape, dtype)
    with no_autocast(input.device.type):
        a_float = None if alpha is None or isinstance(alpha, Tensor) else float(alpha)
        divisor = fused_divisor(None if weights is None else weights, reduction, z2.shape[0])
        if divisor is not None:  # unit weights 1, "mean" / "sum": reduced inside the Function
            return FYLossFunction.apply(z2, y2, q2, a2, kind, k, n_iter, a_float, divisor, *search)
        if z2.shape[0] == 0:
            values = z2.sum(dim=-1)
        else:
            values = FYLossFunction.apply(z2, y2, q2, a2, kind, k, n_iter, a_float, None, *search)
        values = values.reshape(out_shape)
        if weights is not None:
            weights = weights.reshape(out_shape)
        # values depend on input (and a tensor alpha) through FYLossFunction, whose backward gives
        # exact zeros for ignored positions, so no extra anchors are needed for the all-ignored case
        return reduce_loss(values, weights, reduction)


_LOSS_TARGET_DOC = """
    Args:
        input: scores ``(N, C)`` or ``(N, C, d1, ..., dk)`` (classes on dim 1, ``C >= 2``, any
            floating dtype; half inputs and calls under ``torch.autocast`` are computed in
            float32). ``C = 1`` raises ``ValueError`` (the loss would be identically 0; use
            :func:`bce_with_logits_loss`). ``-inf`` scores are masks ("this class does not exist
            for this row"): they are outside the support, ``p*_j z_j`` is taken as 0 there, the
            value equals the loss with the class removed and the gradient there is exactly 0. A
            target on a ``-inf`` score gives ``+inf`` (exactly) with the finite gradient
            ``p* - e_y``. NaN, ``+inf`` and an active row with no finite score raise
            ``ValueError`` (data checks); ignored rows are zeroed before the maths, so they give
            exactly zero gradients even if they hold ``+-inf`` (validation off).
        target: integer class ids ``(N, d1, ..., dk)`` (``ignore_index`` positions give 0 and
            leave the mean; float labels of that shape raise ``TypeError``), or a float
            distribution shaped like ``input`` (non-negative, summing
            to 1 over dim 1 within 1e-4 - a data check; ``ignore_index`` does not apply; the
            target gradient ``-z + q^(alpha-1)/(alpha-1)`` is returned, with ``z`` shifted by its
            row max).
        ignore_index: id whose positions are ignored (default -100).
        reduction: ``"none"`` (shape ``(N, d1, ..., dk)``), ``"mean"`` (over non-ignored
            positions) or ``"sum"``. All positions ignored gives an exact, graph-attached 0.

    Unit: the position (unit weight 1, 0 where ignored). The loss is
    returned in float64 if an input is float64, else float32. Gradient ``p* - q`` via a custom
    ``autograd.Function`` (double backward raises ``RuntimeError``); values are clamped at 0
    against rounding. Differences from ``deep-spin/entmax``: a single tensor is returned (no
    tuple), ``reduction`` follows this library (no ``"elementwise_mean"``), ``ignore_index=-100``
    works, all-ignored batches and ``-inf`` inputs give no NaN, and ``k`` works for any ``dim``.
"""


def sparsemax_loss(
    input: Tensor,
    target: Tensor,
    *,
    k: Optional[int] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Sparsemax loss: the Fenchel-Young loss of sparsemax (Gini entropy ``H_2``).

    .. math::

        L(z; q) = \langle p^* - q, z \rangle + H_2(p^*) - H_2(q),

        p^* = \operatorname{sparsemax}(z), \qquad H_2(p) = \tfrac{1}{2}\big(1 - \lVert p \rVert^2\big)

    (``z`` = ``input`` along dim 1, ``q`` = ``target``). For a class id ``y`` this is the closed
    form :math:`L = -z_y + \frac{1}{2}\sum_{j \in S} (z_j^2 - \tau^2) + \frac{1}{2}`
    (:math:`S` the support, :math:`\tau` the sparsemax threshold), computed from ``tau`` and the
    support only. ``L >= 0``, and
    ``L = 0`` iff ``p* = q`` (for ids: iff ``z_y >= 1 + max_{j != y} z_j``); the gradient is
    ``sparsemax(z) - onehot(y)``.

    Paper: A. F. T. Martins, R. F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
    Attention and Multi-Label Classification*, ICML 2016, arXiv:1602.02068. Fenchel-Young view:
    M. Blondel, A. F. T. Martins, V. Niculae, JMLR 2020, arXiv:1901.02324. The paper and the
    reference (``deep-spin/entmax``, MIT) agree; no ``variant``.

    ``k``: ``None`` finds the threshold exactly over all classes (full sort on GPU, the fastest
    exact search for the shape on CPU, also under ``torch.compile``; see :func:`sparsemax`); an int uses
    a top-``k`` partial sort on GPU, redone with ``2k`` while some row's support reaches ``k`` (same
    result, faster for many classes; on CPU the shape-chosen search decides). The loss is computed from ``tau`` and the support only and
    the backward reuses the saved ``p*``.
    {args}
    >>> import torch, losses
    >>> z = torch.tensor([[0.5, 0.0, -3.0]])
    >>> losses.sparsemax_loss(z, torch.tensor([0]))   # (1 - t)^2 / 4 at t = 0.5
    tensor(0.0625)
    """
    fn = "sparsemax_loss"
    k = _check_k(fn, k)
    return _fy_loss(fn, "sparsemax", input, target, alpha=None, k=k, n_iter=0,
                    ignore_index=ignore_index, reduction=reduction)


def entmax15_loss(
    input: Tensor,
    target: Tensor,
    *,
    k: Optional[int] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Entmax-1.5 loss: the Fenchel-Young loss of entmax-1.5 (Tsallis entropy ``H_1.5``).

    ``L(z; q) = <p* - q, z> + H_1.5(p*) - H_1.5(q)`` with ``p* = entmax15(z)`` (``z`` =
    ``input`` along dim 1, ``q`` = ``target``), ``H_1.5(p) = (1 - sum_j p_j^1.5) / 0.75``. For a
    class id ``y``: ``L = H_1.5(p*) + <p*, z> - z_y``, computed from the threshold ``tau`` and the
    support (``z_j/2 = sqrt(p*_j) + tau`` there). ``L >= 0`` with equality iff ``p* = q``; the
    gradient is ``p* - q``.

    Paper: B. Peters, V. Niculae, A. F. T. Martins, *Sparse Sequence-to-Sequence Models*,
    ACL 2019, arXiv:1905.05702; Fenchel-Young losses: Blondel et al., JMLR 2020,
    arXiv:1901.02324. Reference: ``deep-spin/entmax`` (MIT); same maths, no ``variant``.

    ``k``: optional top-``k`` partial-sort size, as in :func:`sparsemax_loss`.
    {args}
    >>> import torch, losses
    >>> z = torch.tensor([[4.0, 0.0, -1.0]])
    >>> losses.entmax15_loss(z, torch.tensor([0]))   # p* is one-hot on class 0
    tensor(0.)
    """
    fn = "entmax15_loss"
    k = _check_k(fn, k)
    return _fy_loss(fn, "entmax15", input, target, alpha=None, k=k, n_iter=0,
                    ignore_index=ignore_index, reduction=reduction)


def entmax_bisect_loss(
    input: Tensor,
    target: Tensor,
    *,
    alpha: AlphaLike = 1.5,
    n_iter: int = 50,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Entmax-alpha loss for any ``alpha > 1`` (bisection), differentiable in ``alpha``.

    ``L(z; q) = <p* - q, z> + H_alpha(p*) - H_alpha(q)`` with ``p* = entmax_bisect(z, alpha)``
    (``z`` = ``input`` along dim 1, ``q`` = ``target``) and
    ``H_alpha(p) = (1 - sum_j p_j^alpha) / (alpha (alpha - 1))``. Gradients: ``p* - q`` for
    ``input`` and, by Danskin's theorem, ``dH_alpha(p*)/dalpha - dH_alpha(q)/dalpha`` for a
    tensor ``alpha`` (a scalar, or one value per position broadcastable to ``(N, d1..dk)``).
    ``alpha = 2`` and ``1.5`` give :func:`sparsemax_loss` and :func:`entmax15_loss`.
    ``alpha <= 1`` raises ``ValueError``; use ``1 + softplus(.)`` for a learnable alpha.

    Paper: B. Peters, V. Niculae, A. F. T. Martins, *Sparse Sequence-to-Sequence Models*,
    ACL 2019, arXiv:1905.05702; Blondel et al., JMLR 2020, arXiv:1901.02324. Defaults
    ``alpha=1.5, n_iter=50`` as the reference ``deep-spin/entmax`` (MIT); same maths.
    {args}
    >>> import torch, losses
    >>> z = torch.tensor([[0.5, 0.0, -3.0]], dtype=torch.float64)
    >>> round(float(losses.entmax_bisect_loss(z, torch.tensor([0]), alpha=2.0)), 6)
    0.0625
    """
    fn = "entmax_bisect_loss"
    n_iter = _check_n_iter(fn, n_iter)
    return _fy_loss(fn, "bisect", input, target, alpha=alpha, k=None, n_iter=n_iter,
                    ignore_index=ignore_index, reduction=reduction)


for _f in (sparsemax_loss, entmax15_loss, entmax_bisect_loss):
    _f.__doc__ = _f.__doc__.replace("    {args}\n", _LOSS_TARGET_DOC + "\n")
del _f


# --------------------------------------------------------------------------------------
# modules
# --------------------------------------------------------------------------------------


def _wide(x: Tensor) -> Tensor:
    """Half logits upcast to float32 (the loss's compute dtype) for ``predict_proba``."""
    return upcast(x, compute_dtype(x)) if isinstance(x, Tensor) and x.is_floating_point() else x


class _ExactEntmaxLoss(nn.Module):
    """The module form shared by :class:`SparsemaxLoss` and :class:`Entmax15Loss`: the same
    arguments (``k``, ``ignore_index``, ``reduction``), the loss function and its mapping set by the
    subclass (``_loss``, ``_mapping``)."""

    #: its predictive distribution (``predict_proba``) gives classes probability exactly 0, so
    #: support sizes and zero-probability shares are meaningful metrics for it
    sparse_probabilities = True

    def __init__(self, *, k: Optional[int] = None, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__()
        name = type(self).__name__
        check_reduction(name, reduction)
        self.k = _check_k(name, k)
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The loss of ``input`` against ``target``.

        Args:
            input: logits ``(N, C)`` or ``(N, C, d1..dk)``, classes on dim 1.
            target: integer class ids ``(N,)`` or ``(N, d1..dk)``.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-position losses ``(N, d1..dk)`` (``"none"``).
        """
        return self._loss(input, target, k=self.k, ignore_index=self.ignore_index, reduction=self.reduction)

    def predict_proba(self, input: Tensor) -> Tensor:
        """The loss's own (sparse) output distribution over classes (dim 1), in float32 (float64
        for float64 logits) like the loss itself, also for half logits."""
        return self._mapping(_wide(input), dim=1, k=self.k)

    extra_repr = auto_extra_repr


class SparsemaxLoss(_ExactEntmaxLoss):
    """Sparsemax loss as a module (Martins & Astudillo, ICML 2016, arXiv:1602.02068);
    the maths is :func:`losses.sparsemax_loss`.

    Args:
        k: ``None`` (default: exact threshold) or an int, the ``torch.topk`` size tried first
            (a speed option only: the result is the same; on CPU the shape-chosen search decides).
        ignore_index: target id whose positions are skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    ``forward(input, target)``: ``input (N, C)`` or ``(N, C, d1..dk)`` logits, ``target`` ids
    ``(N,)`` / ``(N, d1..dk)``. Returns a scalar for ``"mean"``/``"sum"``, ``(N, d1..dk)`` for
    ``"none"``. ``.predict_proba(input)`` gives the loss's own sparse distribution over dim 1
    (:func:`losses.sparsemax`). No parameters or buffers.

    >>> import torch, losses
    >>> losses.SparsemaxLoss()(torch.tensor([[2.0, 0.0]]), torch.tensor([0]))
    tensor(0.)
    """

    _loss = staticmethod(sparsemax_loss)
    _mapping = staticmethod(sparsemax)


class Entmax15Loss(_ExactEntmaxLoss):
    """1.5-entmax loss as a module (Peters et al., ACL 2019, arXiv:1905.05702);
    the maths is :func:`losses.entmax15_loss`.

    Args:
        k: ``None`` (default: exact threshold) or an int, the ``torch.topk`` size tried first
            (a speed option only: the result is the same; on CPU the shape-chosen search decides).
        ignore_index: target id whose positions are skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    ``forward(input, target)``: ``input (N, C)`` or ``(N, C, d1..dk)`` logits, ``target`` ids
    ``(N,)`` / ``(N, d1..dk)``. Returns a scalar for ``"mean"``/``"sum"``, ``(N, d1..dk)`` for
    ``"none"``. ``.predict_proba(input)`` gives the loss's own sparse distribution over dim 1
    (:func:`losses.entmax15`). No parameters or buffers.

    >>> import torch, losses
    >>> losses.Entmax15Loss(reduction="sum")(torch.tensor([[4.0, 0.0]]), torch.tensor([0]))
    tensor(0.)
    """

    _loss = staticmethod(entmax15_loss)
    _mapping = staticmethod(entmax15)


class EntmaxBisectLoss(nn.Module):
    """alpha-entmax loss (bisection) as a module (Peters et al., ACL 2019, arXiv:1905.05702);
    the maths is :func:`losses.entmax_bisect_loss`.

    Args:
        alpha: the entmax exponent, a float ``> 1`` (default 1.5).
        n_iter: bisection steps (default 50).
        ignore_index: target id whose positions are skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    ``forward(input, target)``: ``input (N, C)`` or ``(N, C, d1..dk)`` logits, ``target`` ids
    ``(N,)`` / ``(N, d1..dk)``. Returns a scalar for ``"mean"``/``"sum"``, ``(N, d1..dk)`` for
    ``"none"``. ``.predict_proba(input)`` gives the loss's own sparse distribution over dim 1.
    No parameters or buffers.

    ``alpha`` is a float hyperparameter here; for a learnable alpha call
    :func:`entmax_bisect_loss` with ``alpha = 1 + softplus(param)``.

    >>> import torch, losses
    >>> losses.EntmaxBisectLoss(alpha=2.0)(torch.tensor([[2.0, 0.0]]), torch.tensor([0]))
    tensor(0.)
    """

    #: its predictive distribution gives classes probability exactly 0 (for ``alpha > 1``)
    sparse_probabilities = True

    def __init__(self, *, alpha: float = 1.5, n_iter: int = 50, ignore_index: int = -100,
                 reduction: str = "mean") -> None:
        super().__init__()
        check_reduction("EntmaxBisectLoss", reduction)
        self.alpha = check_number("EntmaxBisectLoss", "alpha", alpha, low=1.0, low_inclusive=False,
                                  hint=_ALPHA_HINT)
        self.n_iter = _check_n_iter("EntmaxBisectLoss", n_iter)
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The alpha-entmax loss of ``input`` against ``target``.

        Args:
            input: logits ``(N, C)`` or ``(N, C, d1..dk)``, classes on dim 1.
            target: integer class ids ``(N,)`` or ``(N, d1..dk)``.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-position losses ``(N, d1..dk)`` (``"none"``).
        """
        return entmax_bisect_loss(input, target, alpha=self.alpha, n_iter=self.n_iter,
                                  ignore_index=self.ignore_index, reduction=self.reduction)

    def predict_proba(self, input: Tensor) -> Tensor:
        """The loss's own (sparse) output distribution, ``entmax_bisect`` over classes (dim 1), in float32
        (float64 for float64 logits) like the loss itself, also for half logits."""
        return entmax_bisect(_wide(input), alpha=self.alpha, dim=1, n_iter=self.n_iter)

    extra_repr = auto_extra_repr


# --------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------


def _example_inputs(*, generator: Optional[torch.Generator] = None, dtype=torch.float32, case: str = "random"):
    """Default logits/ids examples; ``"extreme"`` adds -inf masks (never on the target)."""
    x = torch.randn((N_EXAMPLE, C_EXAMPLE), generator=generator, dtype=torch.float64)
    t = torch.randint(0, C_EXAMPLE, (N_EXAMPLE,), generator=generator)
    if case == "extreme":
        x = x * 1e4
        mask = torch.zeros(N_EXAMPLE, C_EXAMPLE, dtype=torch.bool)
        mask[0, :] = True  # a row with one finite score
        mask[1, (t[1] + 1) % C_EXAMPLE] = True
        mask[2, (t[2] + 2) % C_EXAMPLE] = True
        mask[torch.arange(N_EXAMPLE), t] = False
        x = x.masked_fill(mask, float("-inf"))
    elif case == "ignored":
        t = torch.full_like(t, -100)
    return (x.to(dtype), t), {}


_SPARSEMAX_PAPER = ("A. F. T. Martins, R. F. Astudillo, From Softmax to Sparsemax: A Sparse Model of Attention "
                    "and Multi-Label Classification, ICML 2016")
_ENTMAX_PAPER = "B. Peters, V. Niculae, A. F. T. Martins, Sparse Sequence-to-Sequence Models, ACL 2019"

register("sparsemax", function=sparsemax_loss, module=SparsemaxLoss, inputs="logits", unit="position",
         unit_weights=position_unit_weights, arxiv="1602.02068", paper=_SPARSEMAX_PAPER,
         example_inputs=_example_inputs, softmax=True, masks=("neg_inf",), soft_targets=True)
register("entmax15", function=entmax15_loss, module=Entmax15Loss, inputs="logits", unit="position",
         unit_weights=position_unit_weights, arxiv="1905.05702", paper=_ENTMAX_PAPER,
         example_inputs=_example_inputs, softmax=True, masks=("neg_inf",), soft_targets=True)
register("entmax_bisect", function=entmax_bisect_loss, module=EntmaxBisectLoss, inputs="logits", unit="position",
         unit_weights=position_unit_weights, arxiv="1905.05702", paper=_ENTMAX_PAPER,
         example_inputs=_example_inputs, softmax=True, masks=("neg_inf",), soft_targets=True)
