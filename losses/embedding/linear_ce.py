"""The many-class path: linear layer + softmax cross-entropy without the N x C logits (docs/losses/linear_cross_entropy.md)."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor, nn

from .._core import (
    once_differentiable,
    check_ignore_index,
    auto_extra_repr,
    check_bool,
    check_class_weight,
    check_int,
    check_finite,
    check_floating,
    check_ids_in_range,
    check_integer_target,
    check_number,
    check_reduction,
    check_tensor,
    compute_dtype,
    reduce_loss,
    reduce_weighted_values,
    value_error,
)
from .._heads import (check_head_embeddings, check_softmax_classes, chunked_row_stats,
                      chunked_softmax_backward, default_chunk_size, drop_rows,
                      subtract_target_term)
from .._core import no_autocast
from .._precision import matmul
from .._registry import id_unit_weights, register
from .._softcap import apply_softcap, check_softcap
from .._stats import LossStats, token_stats
from .. import kernels

__all__ = ["linear_cross_entropy", "LinearCrossEntropyLoss"]

class _LinearCrossEntropy(torch.autograd.Function):
    """Per-row ``(1-eps)(lse - z_y) + eps(lse - mean_k z_k) + coef * lse^2`` over class chunks.

    Forward keeps only an online log-sum-exp per row; backward recomputes each chunk's logits
    and accumulates the gradients of the embeddings, weight and bias chunk by chunk.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, target, valid, chunk, eps, coef, dtype, cap=None, cw=None):  # noqa: D102
        c = weight.shape[0]
        xc = x.to(dtype)
        cwc = None if cw is None else cw.to(dtype)
        # the online log-sum-exp, the running argmax (token accuracy) and, for smoothing under a
        # cap, the (class-weighted) sum of the capped logits
        m, s, z_sum, pred = chunked_row_stats(xc, weight, bias, chunk=chunk, dtype=dtype, cap=cap,
                                              sum_capped=eps > 0 and cap is not None, class_weight=cwc)
        lse = m + torch.log(s)
        safe = torch.where(valid, target, torch.zeros_like(target))
        w_y = weight.index_select(0, safe).to(dtype)
        z_y = (xc * w_y).sum(dim=1)
        if bias is not None:
            z_y = z_y + bias.index_select(0, safe).to(dtype)
        dcap_y = torch.ones_like(z_y)  # d capped z_y / d z_y
        if cap is not None:
            t_y = torch.tanh(z_y / cap)
            z_y, dcap_y = cap * t_y, 1.0 - t_y * t_y
        cw_y = None if cwc is None else cwc.index_select(0, safe)  # the class weight of each row's target
        nll = lse - z_y if cw_y is None else cw_y * (lse - z_y)
        loss = (1.0 - eps) * nll
        if eps > 0:
            if cap is None:  # the (weighted) sum of the logits from one matvec
                w_mean = weight.to(dtype).sum(dim=0) if cwc is None else cwc @ weight.to(dtype)
                z_sum = xc @ w_mean
                if bias is not None:
                    z_sum = z_sum + (bias.to(dtype).sum() if cwc is None else cwc @ bias.to(dtype))
            total_w = float(c) if cwc is None else cwc.sum()
            loss = loss + (eps / c) * (total_w * lse - z_sum)
        pen = coef * lse * lse
        if coef > 0:
            loss = loss + (pen if cw_y is None else cw_y * pen)
        loss = torch.where(valid, loss, torch.zeros_like(loss))
        ctx.save_for_backward(x, weight, bias, safe, valid, lse, dcap_y, cwc)
        ctx.chunk, ctx.eps, ctx.coef, ctx.dtype, ctx.cap = chunk, eps, coef, dtype, cap
        lse_out = lse.detach().clone()
        ctx.mark_non_differentiable(lse_out, pred)
        return loss, lse_out, pred

    @staticmethod
    @once_differentiable("linear_cross_entropy_loss")
    def backward(ctx, grad_loss, _grad_lse=None, _grad_pred=None):  # noqa: D102
        # the chunked matmuls run in the compute dtype even when backward() is called inside
        # an autocast region
        with no_autocast(grad_loss):
            return _LinearCrossEntropy._backward(ctx, grad_loss)

    @staticmethod
    def _backward(ctx, grad_loss):
        x, weight, bias, safe, valid, lse, dcap_y, cwc = ctx.saved_tensors
        chunk, eps, coef, dtype, cap = ctx.chunk, ctx.eps, ctx.coef, ctx.dtype, ctx.cap
        c = weight.shape[0]
        g = torch.where(valid, grad_loss.to(dtype), torch.zeros((), dtype=dtype, device=x.device))
        # d loss / d z_k = (1 + 2 coef lse) p_k - (1-eps) [k=y] - eps/C; with class weights w:
        # (w_y ((1-eps) + 2 coef lse) + eps W / C) p_k - (1-eps) w_y [k=y] - eps w_k / C, W = sum_k w_k
        if cwc is None:
            g_soft = g * (1.0 + 2.0 * coef * lse)
        else:
            cw_y = cwc.index_select(0, safe)
            g_soft = g * (cw_y * ((1.0 - eps) + 2.0 * coef * lse) + (eps / c) * cwc.sum())
        xc = x.to(dtype)
        need_x, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2]
        # dz = p * g_soft - eps/C * g (* w_k), written in place over the recomputed logits
        gx, gw, gb = chunked_softmax_backward(xc, weight, bias, lse, g, g_soft, chunk=chunk, dtype=dtype, cap=cap,
                                              eps=eps, num_classes=c, need_x=need_x, need_w=need_w, need_b=need_b,
                                              class_weight=cwc)
        # the target term -(1-eps) z_y
        gy = (1.0 - eps) * g * dcap_y
        if cwc is not None:
            gy = gy * cw_y
        subtract_target_term(gx, gw, gb, gy, weight, xc, safe, dtype)
        return (
            None if gx is None else gx.to(x.dtype),
            None if gw is None else gw.to(weight.dtype),
            None if gb is None else gb.to(bias.dtype),
            None, None, None, None, None, None, None, None,
        )


def linear_cross_entropy(
    embeddings: Tensor,
    target: Tensor,
    weight: Tensor,
    *,
    bias: Optional[Tensor] = None,
    chunk_size: Optional[int] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    logz_coef: float = 0.0,
    softcap: Optional[float] = None,
    class_weight: Optional[Tensor] = None,
    return_stats: bool = False,
) -> Union[Tensor, LossStats]:
    r"""Cross-entropy of a linear classifier without materialising the ``N x C`` logits.

    Equal to ``F.cross_entropy(embeddings @ weight.T + bias, target)`` (and, with the options,
    to label smoothing and the PaLM log-Z penalty ``logz_coef * logsumexp(z)^2`` of
    :func:`losses.cross_entropy_with_logz_penalty`):

    ``z_ik = <embeddings_i, weight_k> + bias_k``;
    ``L_i = (1-eps)(lse_i - z_{i,y_i}) + eps(lse_i - mean_k z_ik) + logz_coef * lse_i^2``,
    ``lse_i = logsumexp_k z_ik``.

    The log-sum-exp is computed online over class chunks of ``chunk_size`` classes (``None``:
    about 4M logits per chunk, i.e. ``max(256, 2**22 // N)`` classes) in float32 or wider, and a
    custom backward recomputes each chunk's logits to accumulate the gradients of
    ``embeddings``, ``weight`` and ``bias``; peak extra memory is one ``N x chunk_size`` block
    instead of the ``N x C`` logits and their gradient.

    Shapes: ``embeddings (N, D)``, ``target (N,)`` integer ids, ``weight (C, D)``, ``bias (C,)``.
    Unit: the row (unit weight 0 where ``target == ignore_index``); ``"none"`` gives ``(N,)``.
    Half-precision inputs are upcast chunk by chunk; the loss is float32 (float64 for float64
    inputs) and gradients come back in each input's dtype. Inside ``torch.autocast`` the logits
    are still computed in float32 (autocast is switched off in the forward and the backward).
    ``C >= 2`` (one class: ``ValueError``). No double backward.

    ``softcap``: ``None`` (off) or a positive float ``c``; every logit becomes
    ``c * tanh(z_ik / c)`` before the softmax, the label-smoothing mean and the log-Z penalty
    (final-logit soft-capping, Gemma 2, arXiv:2408.00118), chunk by chunk as well.

    ``class_weight``: ``None`` or a ``(C,)`` tensor of non-negative class weights ``w``, as
    ``F.cross_entropy(..., weight=w)``: ``L_i = w_{y_i} [(1-eps)(lse_i - z_{i,y_i}) +
    logz_coef * lse_i^2] + (eps / C) sum_k w_k (lse_i - z_ik)``, ``"none"`` gives ``L_i``,
    ``"sum"`` ``sum_i L_i`` and ``"mean"`` ``sum_i L_i / sum_i w_{y_i}`` over the non-ignored rows.
    (The name ``weight`` is the classifier's.)

    ``return_stats=True`` returns a :class:`losses.LossStats` ``(loss, lse, penalty, accuracy,
    count)`` computed in the same pass: the per-row ``log Z`` (what cut-cross-entropy's
    ``return_lse`` gives), the penalty part of the loss and the token accuracy (the running argmax
    over the chunks) that Liger-Kernel returns with ``return_z_loss`` / ``return_token_accuracy``.

    **On a GPU** (CUDA ``embeddings`` and ``weight`` in one dtype, bfloat16 or float16) the head
    takes its GPU path (``losses/kernels/triton_linear.py``; ``LOSSES_TRITON=0`` switches it off):
    the chunk logits are half-precision matmuls on the tensor cores (float32 accumulation, the chunk
    kept in the input dtype, as ``embeddings @ weight.T`` would be), one Triton pass per chunk folds
    them into float32 row statistics, and the backward writes each chunk's ``weight`` gradient once
    (float32 accumulation over all rows inside the matmul) and accumulates the ``embeddings``
    gradient in float32: four ``N x D x C`` matmuls in all, one ``N x chunk`` block and an
    ``N x D`` float32 buffer of extra memory, no ``N x C`` logits. ``chunk_size=None`` there means
    about 64 MiB of logits per chunk.

    The chunked online softmax follows the memory-efficient cross-entropy used for large
    vocabularies (e.g. M. Wijmans et al., *Cut Your Losses in Large-Vocabulary Language Models*,
    ICLR 2025, arXiv:2411.09009); the maths is plain softmax cross-entropy.

    >>> import torch, losses
    >>> x, w = torch.randn(4, 3), torch.randn(10, 3)
    >>> y = torch.tensor([0, 9, 3, -100])
    >>> ref = torch.nn.functional.cross_entropy(x @ w.T, y)
    >>> bool(torch.allclose(losses.linear_cross_entropy(x, y, w, chunk_size=3), ref, atol=1e-6))
    True
    """
    fn = "linear_cross_entropy"
    check_floating(fn, "embeddings", embeddings)
    check_floating(fn, "weight", weight)
    check_integer_target(fn, target)
    check_reduction(fn, reduction)
    check_number(fn, "label_smoothing", label_smoothing, low=0.0, high=1.0)
    check_number(fn, "logz_coef", logz_coef, low=0.0)
    cap = check_softcap(fn, softcap)
    check_bool(fn, "return_stats", return_stats)
    if embeddings.dim() != 2:
        raise value_error(fn, "embeddings must have shape (N, D)", f"shape {tuple(embeddings.shape)}",
                          "flatten leading dimensions with embeddings.reshape(-1, D)")
    if weight.dim() != 2 or weight.shape[1] != embeddings.shape[1]:
        raise value_error(fn, f"weight must have shape (C, {embeddings.shape[1]})", f"shape {tuple(weight.shape)}",
                          "weight holds one row of size D per class")
    if target.shape != (embeddings.shape[0],):
        raise value_error(fn, f"target must have shape ({embeddings.shape[0]},)", f"shape {tuple(target.shape)}",
                          "pass one class id per embedding row")
    c = weight.shape[0]
    if c == 0:
        raise value_error(fn, "weight must hold at least one class", "C=0", "pass a (C, D) weight with C >= 1")
    check_softmax_classes(fn, c, arg="weight.shape[0] (the number of classes C)")
    if bias is not None:
        check_tensor(fn, "bias", bias)
        if bias.shape != (c,):
            raise value_error(fn, f"bias must have shape ({c},)", f"shape {tuple(bias.shape)}", "one bias per class")
    if chunk_size is not None:
        check_int(fn, "chunk_size", chunk_size, low=1, allow_none=True, hint="use None to choose it from N and C")
    if class_weight is not None:
        class_weight = check_class_weight(fn, class_weight, c, name="class_weight").to(embeddings.device)
    check_finite(fn, "embeddings", embeddings)
    check_finite(fn, "weight", weight)
    if bias is not None:
        check_finite(fn, "bias", bias)
    check_ids_in_range(fn, target, c, ignore_index)
    dtype = compute_dtype(embeddings, weight, bias)
    chunk = min(c, chunk_size if chunk_size is not None else default_chunk_size(embeddings.shape[0], c))
    valid = target != ignore_index
    if (embeddings.dtype in (torch.bfloat16, torch.float16) and weight.dtype == embeddings.dtype
            and weight.device == embeddings.device and class_weight is None and not return_stats
            and kernels.use_triton(embeddings)):
        # the GPU path: half-precision matmuls on the tensor cores, Triton passes over each chunk,
        # float32 statistics and gradient accumulation (losses/kernels/triton_linear.py)
        from ..kernels import triton_linear

        k = triton_linear.chunk_columns(embeddings.shape[0], c, embeddings.element_size(), chunk_size)
        with no_autocast(embeddings, weight):
            values = triton_linear.linear_cross_entropy_rows(
                drop_rows(embeddings, valid), weight, bias, target.long(), chunk=k, softcap=cap,
                label_smoothing=float(label_smoothing), logz_coef=float(logz_coef), ignore_index=ignore_index)
            return reduce_loss(values, valid.to(torch.float32), reduction)
    with no_autocast(embeddings, weight):  # logits in float32 (or float64) under autocast too
        values, lse, pred = _LinearCrossEntropy.apply(
            drop_rows(embeddings, valid), weight, bias, target.long(), valid, chunk, float(label_smoothing),
            float(logz_coef), dtype, cap, class_weight)
        # no anchors needed: the autograd Function returns (zero) gradients for every input even
        # when all rows are ignored
        units = valid.to(dtype)
        # each row's target class weight (0 on ignored rows), where there are class weights
        w_y = None if class_weight is None else units * class_weight.to(dtype).index_select(
            0, torch.where(valid, target, torch.zeros_like(target)).long())
        # values already carry w_y (as F.cross_entropy's "none"); "mean" then divides by sum w_y
        loss = reduce_loss(values, units, reduction) if w_y is None else reduce_weighted_values(values, w_y, reduction)
        if not return_stats:
            return loss
        pen = float(logz_coef) * lse * lse
        penalty = reduce_loss(pen, units, reduction) if w_y is None else reduce_weighted_values(w_y * pen, w_y, reduction)
        return token_stats(loss, lse, penalty, pred, target.long(), valid)


class LinearCrossEntropyLoss(nn.Module):
    """Chunked linear-classifier cross-entropy as a module, owning the classifier; the maths is
    :func:`losses.linear_cross_entropy` (the ``N x C`` logits are never materialised).

    Args:
        embedding_dim: the feature size ``D``.
        num_classes: the number of classes ``C >= 2``.
        bias: own a bias ``(C,)`` (default True).
        chunk_size: classes per chunk, or ``None`` (default) to choose it from ``N`` and ``C``.
        ignore_index: target id whose rows are skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        label_smoothing: ``eps`` in ``[0, 1]`` (default 0.0).
        logz_coef: weight ``>= 0`` of the log-Z penalty ``lse^2`` (default 0.0).
        softcap: ``None`` (default, off) or ``c > 0``: logits become ``c * tanh(z / c)``.
        class_weight: optional per-class weights ``(C,)`` as ``F.cross_entropy``'s ``weight``,
            stored as the buffer ``class_weight`` (default None).

    ``forward(embeddings, target)``: ``embeddings (N, D)``, ``target`` ids ``(N,)``. Returns a
    scalar for ``"mean"``/``"sum"``, ``(N,)`` for ``"none"``. ``.logits(embeddings)`` gives the
    full ``(N, C)`` logits for evaluation.

    Parameters: ``weight (C, D)`` and ``bias (C,)`` (or None), with ``nn.Linear`` initialisation.
    """

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        *,
        bias: bool = True,
        chunk_size: Optional[int] = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        logz_coef: float = 0.0,
        softcap: Optional[float] = None,
        class_weight: Optional[Tensor] = None,
    ) -> None:
        super().__init__()
        fn = "LinearCrossEntropyLoss"
        self.softcap = check_softcap(fn, softcap)
        for name, v in (("embedding_dim", embedding_dim), ("num_classes", num_classes)):
            check_int(fn, name, v, low=1, hint=f"pass the {name.replace('_', ' ')}")
        check_softmax_classes(fn, num_classes, arg="num_classes")
        check_reduction(fn, reduction)
        check_number(fn, "label_smoothing", label_smoothing, low=0.0, high=1.0)
        check_number(fn, "logz_coef", logz_coef, low=0.0)
        check_int(fn, "chunk_size", chunk_size, low=1, allow_none=True, hint="use None to choose it from N and C")
        check_bool(fn, "bias", bias)
        self.embedding_dim, self.num_classes = embedding_dim, num_classes
        self.chunk_size = chunk_size
        self.label_smoothing, self.logz_coef = float(label_smoothing), float(logz_coef)
        self.ignore_index, self.reduction = check_ignore_index(type(self).__name__, ignore_index), reduction
        linear = nn.Linear(embedding_dim, num_classes, bias=bias)
        self.weight = linear.weight
        self.register_parameter("bias", linear.bias if bias else None)
        if class_weight is not None:
            class_weight = check_class_weight(fn, torch.as_tensor(class_weight), num_classes, name="class_weight")
        self.register_buffer("class_weight", None if class_weight is None else torch.as_tensor(class_weight))

    def forward(self, embeddings: Tensor, target: Tensor) -> Tensor:
        """The cross-entropy of the owned classifier's logits against ``target``.

        Args:
            embeddings: floating features ``(N, embedding_dim)``.
            target: integer class ids ``(N,)``.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-row losses ``(N,)`` (``"none"``).
        """
        return self._loss(embeddings, target, False)

    def forward_with_stats(self, embeddings: Tensor, target: Tensor) -> LossStats:
        """:meth:`forward` and, from the same chunked pass, the per-row ``log Z``, the penalty part and
        the accuracy (:class:`losses.LossStats`; ``linear_cross_entropy(..., return_stats=True)``)."""
        return self._loss(embeddings, target, True)

    def _loss(self, embeddings: Tensor, target: Tensor, return_stats: bool) -> Union[Tensor, LossStats]:
        check_head_embeddings("linear_cross_entropy", type(self).__name__, embeddings, self.embedding_dim)
        return linear_cross_entropy(embeddings, target, self.weight, bias=self.bias, chunk_size=self.chunk_size,
                                    label_smoothing=self.label_smoothing, logz_coef=self.logz_coef,
                                    ignore_index=self.ignore_index, reduction=self.reduction, softcap=self.softcap,
                                    class_weight=self.class_weight, return_stats=return_stats)

    def logits(self, embeddings: Tensor) -> Tensor:
        """``embeddings @ weight.T + bias`` over all classes (materialised; for evaluation),
        soft-capped as in the loss when ``softcap`` is set."""
        name = type(self).__name__
        check_head_embeddings(name + ".logits", name, embeddings, self.embedding_dim)
        dtype = compute_dtype(embeddings, self.weight)
        with no_autocast(embeddings, self.weight):
            z = matmul(embeddings.to(dtype), self.weight.to(dtype).T)
            z = z if self.bias is None else z + self.bias.to(dtype)
            return apply_softcap(z, self.softcap)

    extra_repr = auto_extra_repr

    _repr_omit_none = ("softcap", "class_weight")

    def _repr_values(self) -> dict:
        return {"bias": self.bias is not None}


register(
    "linear_cross_entropy",
    function=linear_cross_entropy,
    module=LinearCrossEntropyLoss,
    inputs="embeddings",
    unit="row",
    unit_weights=id_unit_weights,
    arxiv="2411.09009",
    paper="Chunked linear + softmax cross-entropy (many-class path; cf. Wijmans et al., ICLR 2025)",
    owns_head=True,
    softmax=True,
    example_kwargs={"embedding_dim": 8, "num_classes": 5},
)
