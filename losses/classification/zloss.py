"""The Z-loss of de Brébisson & Vincent and, separately, the PaLM / T5X log-Z penalty (docs/losses/z_loss.md).

The two share a name in the literature but are different losses:

* :func:`z_loss` (:class:`ZLoss`) — A. de Brébisson, P. Vincent, *The Z-loss: a shift and scale
  invariant classification loss belonging to the Spherical Family*, arXiv preprint 2016,
  arXiv:1604.08859. A softplus of the standardised target logit.
* :func:`logz_penalty` and :func:`cross_entropy_with_logz_penalty`
  (:class:`CrossEntropyWithLogZPenalty`) — the ``κ (log Z)²`` penalty of A. Chowdhery et al.,
  *PaLM: Scaling Language Modeling with Pathways*, JMLR 2023, arXiv:2204.02311 (the ST-MoE router
  z-loss, arXiv:2202.08906, when applied to router logits).

Both are written as custom :class:`torch.autograd.Function` objects whose backward writes the
``(M, C)`` gradient in one pass from per-row statistics saved by the forward, so they cost about
as much as :func:`torch.nn.functional.cross_entropy` at large ``C`` (they are bandwidth-bound).
Implemented from the maths only.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn

from .._core import (
    _compiling,
    add_at_target,
    check_logits_dim,
    once_differentiable,
    check_ignore_index,
    auto_extra_repr,
    check_bool,
    check_finite,
    check_floating,
    check_integer_target,
    check_masked_logits,
    check_number,
    check_reduction,
    check_tensor,
    compute_dtype,
    move_class_dim_last,
    no_autocast,
    reduce_loss,
    type_error,
    upcast,
    value_error,
    zero_rows,
)
from .._registry import position_unit_weights, register
from .._softcap import apply_softcap, check_softcap
from .._stats import LossStats, token_stats
from .. import kernels
from ..kernels import rows_native
from ..kernels import triton_rows_module as triton_rows
from .._precision import softplus
from ._targets import (class_ids, fused_divisor, kernel_result, kernel_rows, reduced_sum, row_exp, row_max_exp,
                       row_max_logsum)

__all__ = [
    "z_loss",
    "ZLoss",
    "logz_penalty",
    "cross_entropy_with_logz_penalty",
    "CrossEntropyWithLogZPenalty",
]


# --------------------------------------------------------------------------------------
# shared helpers (also used by comp_sum.py)
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# 1a. Z-loss
# --------------------------------------------------------------------------------------


class _ZLossFunction(torch.autograd.Function):
    """Per-row Z-loss with the closed-form gradient written in one pass."""

    @staticmethod
    def forward(ctx, x: Tensor, y: Tensor, a: float, b: float, eps: float, divisor: Optional[int] = None) -> Tensor:
        c = x.shape[1]
        mu = x.mean(dim=1, keepdim=True)
        d = x - mu  # centred logits (saved: the backward is one fused pass over them)
        v = torch.linalg.vector_norm(d, dim=1).square() / c  # centred population variance
        sigma = torch.sqrt(v + eps)
        z_c = d.gather(1, y.unsqueeze(1)).squeeze(1) / sigma
        t = a * (b - z_c)
        ctx.save_for_backward(d, y, sigma, z_c, torch.sigmoid(t))
        ctx.divisor = divisor
        return reduced_sum(softplus(t) / a, divisor)

    @staticmethod
    @once_differentiable("z_loss")
    def backward(ctx, g: Tensor):
        d, y, sigma, z_c, s = ctx.saved_tensors
        c = d.shape[1]
        if ctx.divisor is not None:  # the reduction was done in the forward: one scalar gradient
            g = g / ctx.divisor
        gs = g * s
        # dL/do_k = -gs [(delta_kc - 1/C)/sigma - z_c z_k/(C sigma)]
        #         = A (o_k - mu) + B - delta_kc gs/sigma
        coef = (gs * z_c / (c * sigma * sigma)).unsqueeze(1)
        offset = (gs / (c * sigma)).unsqueeze(1)
        # two passes with one per-row operand each (vectorised), faster on CPU than one addcmul
        # with two broadcast operands
        grad = torch.mul(d, coef).add_(offset)
        grad = add_at_target(grad, y, -gs / sigma)
        return grad, None, None, None, None, None


def _zloss_reduced(x: Tensor, y: Tensor, a: float, b: float, eps: float, divisor: int,
                   need_grad: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """``sum_rows(softplus(a (b - z_y)) / a) / divisor`` and its gradient (no autograd), the
    per-row factors of :class:`_ZLossFunction`'s backward with ``g = 1`` and the divisor folded in as
    Python numbers; the gradient is written into the buffer of the centred logits."""
    c = x.shape[1]
    col = y.unsqueeze(1)
    d = x - x.mean(dim=1, keepdim=True)
    inv_s = torch.linalg.vector_norm(d, dim=1).square_().div_(c).add_(eps).rsqrt_()  # 1 / sigma
    z_c = d.gather(1, col).squeeze(1).mul_(inv_s)
    t = z_c.mul(-a).add_(a * b)  # a (b - z_c)
    total = softplus(t).sum().mul_(1.0 / (a * divisor))
    if not need_grad:
        return total, None
    ks = torch.sigmoid(t).mul_(inv_s)  # s / sigma
    offset = ks * (1.0 / (c * divisor))  # gs / (C sigma)
    coef = (offset * z_c).mul_(inv_s)  # gs z_c / (C sigma^2)
    grad = d.mul_(coef.unsqueeze(1)).add_(offset.unsqueeze(1))
    grad.scatter_add_(1, col, ks.mul_(-1.0 / divisor).unsqueeze(1))  # - gs / sigma at the target
    return total, grad


class _ZLossReducedFunction(torch.autograd.Function):
    """Z-loss reduced to one number (no ignored position, ``"mean"`` / ``"sum"``): the forward also
    writes the gradient (in the buffer of the centred logits), the backward scales it by the
    incoming gradient (not at all for ``loss.backward()``'s seed of 1). A second backward through a
    retained graph recomputes it."""

    @staticmethod
    def forward(ctx, x: Tensor, y: Tensor, a: float, b: float, eps: float, divisor: int, grad_mode: bool = True) -> Tensor:
        # grad_mode: torch.is_grad_enabled() at the call (inside forward it is always off); under
        # torch.no_grad() no gradient is written
        total, grad = _zloss_reduced(x, y, a, b, eps, divisor, grad_mode and bool(ctx.needs_input_grad[0]))
        ctx.save_for_backward(x, y)
        ctx.grad = grad
        ctx.options = (a, b, eps, divisor)
        return total

    @staticmethod
    @once_differentiable("z_loss")
    def backward(ctx, g: Tensor):
        grad = ctx.grad
        ctx.grad = None  # hand the buffer over to autograd
        if grad is None:  # a second backward through a retained graph
            x, y = ctx.saved_tensors
            grad = _zloss_reduced(x, y, *ctx.options, True)[1]
        if not (g.device.type == "cpu" and not _compiling() and g.item() == 1.0):
            grad = grad.mul_(g)
        return grad, None, None, None, None, None, None


def z_loss(
    input: Tensor,
    target: Tensor,
    *,
    a: float = 1.0,
    b: float = 0.0,
    eps: float = 1e-6,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Z-loss: softplus of the standardised target logit (shift and scale invariant).

    For each position with logits ``o = input[i, :, ...]`` (``C`` classes) and class id
    ``c = target[i, ...]`` (``eps`` is :math:`\varepsilon`):

    .. math::

        \mu = \frac{1}{C}\sum_k o_k, \qquad
        v = \frac{1}{C}\sum_k (o_k - \mu)^2 \quad \text{(centred population variance)},

        \sigma = \sqrt{v + \varepsilon}, \qquad z_k = \frac{o_k - \mu}{\sigma}, \qquad
        L = \frac{1}{a}\operatorname{softplus}\big(a\,(b - z_c)\big).

    ``a > 0`` sets the sharpness and ``b`` is the target z-margin. Since ``z_c <= sqrt(C - 1)``,
    with ``b >= sqrt(C - 1)`` the loss never saturates. The loss is invariant to
    ``o -> lambda * o + beta`` (``lambda > 0``) up to ``eps``, which only matters when
    ``v`` is comparable to ``eps``. All-equal logits (a zero-initialised head) give
    ``softplus(a*b)/a`` (``log 2`` at the defaults) with a finite gradient of order
    ``eps**-0.5``.

    Gradient (exact for any ``eps``, used by the custom backward):
    ``dL/do_k = -sigmoid(a(b - z_c)) * [(delta_kc - 1/C)/sigma - z_c z_k/(C sigma)]``.

    This is **not** the PaLM / T5X "z-loss" ``kappa * (log Z)^2``; that one is
    :func:`logz_penalty` / :func:`cross_entropy_with_logz_penalty`.

    Args:
        input: logits ``(N, C)`` or ``(N, C, d1, ..., dk)``, classes on dim 1, ``C >= 3``;
            any floating dtype (half is computed in float32). Must be finite: the Z-loss
            standardises over *all* classes, so a ``-inf`` entry cannot mean "class absent" here
            and raises ``ValueError`` (data check) whose hint names the alternatives (drop the
            class from the input, or use :func:`cross_entropy_loss`, where ``-inf`` is a mask).
        target: integer class ids ``(N,)`` or ``(N, d1, ..., dk)``; float targets raise
            :class:`TypeError`.
        a: sharpness ``a > 0`` (default 1, as the authors' code).
        b: target z-margin (default 0, as the authors' code; the paper tunes ``(a, b)``).
        eps: ``> 0``, added to the variance inside the square root.
        ignore_index: positions with this id give 0 and leave the ``"mean"`` denominator.
        reduction: ``"none"`` (shape ``(N, d1, ..., dk)``), ``"mean"`` or ``"sum"``.

    Unit: the position, weight 1 (0 if ignored). Ignored positions are zeroed before the maths, so
    they give exactly zero gradients even when they hold ``+-inf`` (with validation off).
    Under ``torch.autocast`` the forward and backward run in float32 (float64 for float64 input).

    Paper: A. de Brébisson, P. Vincent, *The Z-loss: a shift and scale invariant classification
    loss belonging to the Spherical Family*, arXiv preprint 2016, arXiv:1604.08859. The reference
    code (``pascal20100/factored_output_layer``) uses ``a=1, b=0``, sums over the batch (use
    ``reduction="sum"``) and ``sigma = sqrt(mean(o^2) - mu^2) + 1e-12``, which gives NaN
    gradients on constant rows; here ``eps`` sits inside the root, so values differ from it
    by about ``eps/(2v)`` relative. The spherical-family factored update is out of scope.

    >>> import torch, losses
    >>> x = torch.tensor([[2.0, 0.0, -2.0]])
    >>> z_c = 2.0 / (8.0 / 3.0 + 1e-6) ** 0.5
    >>> bool(torch.isclose(losses.z_loss(x, torch.tensor([0])),
    ...                    torch.nn.functional.softplus(torch.tensor(-z_c))))
    True
    >>> round(float(losses.z_loss(torch.zeros(2, 4), torch.tensor([1, 3]))), 4)  # log 2
    0.6931
    """
    fn = "z_loss"
    check_floating(fn, "input", input)
    check_integer_target(fn, target)
    check_reduction(fn, reduction)
    a = check_number(fn, "a", a, low=0.0, low_inclusive=False)
    b = check_number(fn, "b", b)
    eps = check_number(fn, "eps", eps, low=0.0, low_inclusive=False)
    c = input.shape[1] if input.dim() >= 2 else None
    if c is not None and c < 3:
        raise value_error(
            fn,
            "needs at least 3 classes",
            f"C={c}",
            "with C=2 the target z-score is always ±1, so the loss is constant and its gradient zero "
            "— use binary_cross_entropy_with_logits",
        )
    if kernels.use_triton(input):  # one fused row kernel (losses/kernels/triton_rows.py)
        x2d, ids, out_shape = kernel_rows(fn, input, target, ignore_index, softmax=False,
                                          finite_hint=_ZLOSS_NEG_INF_HINT)
        out = triton_rows().z_loss_rows(x2d, ids, a=a, b=b, eps=eps, ignore_index=ignore_index, reduction=reduction)
        return kernel_result(out, out_shape, reduction)
    x2d, y, valid, out_shape = class_ids(fn, input, target, ignore_index, softmax=False, none_if_all_kept=True)
    finite = check_finite(fn, "input", input, hint=_ZLOSS_NEG_INF_HINT)
    dtype = compute_dtype(input)
    done = _cpu_kernel("z_loss", x2d, target, dtype, reduction, (a, b, eps), ignore_index)
    if done is not None:
        return done
    with no_autocast(input.device.type):
        x = upcast(x2d, dtype)
        divisor = fused_divisor(valid, reduction, y.numel())
        if divisor is not None:  # nothing ignored, "mean" / "sum": reduced inside the Function
            return _ZLossReducedFunction.apply(x, y, a, b, eps, divisor, torch.is_grad_enabled())
        if valid is not None:
            x = zero_rows(x, valid, verified_finite=finite)
        values = _ZLossFunction.apply(x, y, a, b, eps)
        return reduce_loss(values.reshape(out_shape), _weights(valid, out_shape, dtype), reduction)


def _cpu_kernel(kind: str, x2d: Tensor, target: Tensor, dtype: torch.dtype, reduction: str, params: tuple,
                ignore_index: int) -> Optional[Tensor]:
    """The loss through the CPU kernel (losses/kernels/rows_native.py) where it applies (float32
    compute, CPU, eagerly), after the caller's checks, in the positions' shape for ``"none"``;
    ``None`` otherwise or where the kernel hands the batch back."""
    if dtype != torch.float32 or x2d.device.type != "cpu" or not rows_native.ready():
        return None
    x = upcast(x2d, dtype)
    if not rows_native.usable(x):
        return None
    with no_autocast("cpu"):
        out = rows_native.run(kind, x, target.reshape(-1), reduction, params=params, ignore_index=ignore_index)
    return out if out is None or reduction != "none" else out.reshape(target.shape)


def _weights(valid: Optional[Tensor], out_shape: tuple, dtype: torch.dtype) -> Optional[Tensor]:
    """Unit weights of the positions: ``valid`` as ``dtype``, or ``None`` (all 1) without ignored ones."""
    return None if valid is None else valid.reshape(out_shape).to(dtype)


_ZLOSS_NEG_INF_HINT = ("z_loss standardises the logits over all C classes, so -inf cannot remove a class; "
                       "drop masked classes from the input, or use cross_entropy_loss / comp_sum_loss, "
                       "where -inf entries are masks")


class ZLoss(nn.Module):
    """Z-loss as a module (de Brébisson & Vincent, arXiv:1604.08859); the maths is
    :func:`losses.z_loss`.

    Not the PaLM log-Z penalty; see :class:`CrossEntropyWithLogZPenalty` for that.

    Args:
        a: scale of the standardised logits, ``a > 0`` (default 1.0).
        b: offset of the standardised logits (default 0.0).
        eps: variance floor ``> 0`` in ``sigma = sqrt(v + eps)`` (default 1e-6).
        ignore_index: target id whose positions are skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    ``forward(input, target)``: ``input (N, C)`` or ``(N, C, d1..dk)`` logits (``C >= 3``),
    ``target`` ids ``(N,)`` / ``(N, d1..dk)``. Returns a scalar for ``"mean"``/``"sum"``,
    ``(N, d1..dk)`` for ``"none"``. No parameters or buffers.

    >>> import torch, losses
    >>> losses.ZLoss(a=2.0)
    ZLoss(a=2.0, b=0.0, eps=1e-06, ignore_index=-100, reduction='mean')
    """

    def __init__(
        self,
        *,
        a: float = 1.0,
        b: float = 0.0,
        eps: float = 1e-6,
        ignore_index: int = -100,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        fn = "ZLoss"
        check_reduction(fn, reduction)
        self.a = check_number(fn, "a", a, low=0.0, low_inclusive=False)
        self.b = check_number(fn, "b", b)
        self.eps = check_number(fn, "eps", eps, low=0.0, low_inclusive=False)
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The Z-loss of ``input`` against ``target``.

        Args:
            input: logits ``(N, C)`` or ``(N, C, d1..dk)``, classes on dim 1.
            target: integer class ids ``(N,)`` or ``(N, d1..dk)``.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-position losses ``(N, d1..dk)`` (``"none"``).
        """
        return z_loss(input, target, a=self.a, b=self.b, eps=self.eps, ignore_index=self.ignore_index,
                      reduction=self.reduction)

    extra_repr = auto_extra_repr


# --------------------------------------------------------------------------------------
# 1b. log-Z penalty (PaLM / T5X "z-loss")
# --------------------------------------------------------------------------------------


class _LogSumExpFunction(torch.autograd.Function):
    """Row-wise ``logsumexp`` with a one-pass softmax backward."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        m, log_s = row_max_logsum(x)
        ctx.save_for_backward(x, m, log_s)
        return m + log_s

    @staticmethod
    @once_differentiable("logz_penalty")
    def backward(ctx, g: Tensor):
        x, m, log_s = ctx.saved_tensors
        grad = torch.sub(x, m.unsqueeze(1))
        grad.sub_(log_s.unsqueeze(1)).exp_().mul_(g.unsqueeze(1))  # softmax * g
        return grad


class _CrossEntropyLogZFunction(torch.autograd.Function):
    """Row-wise ``(ce, logZ)`` with ``ce = logZ - x_y``; backward
    ``softmax * (g_ce + g_lse) - g_ce * onehot(y)`` in one pass."""

    @staticmethod
    def forward(ctx, x: Tensor, y: Tensor) -> Tuple[Tensor, Tensor]:
        m, log_s = row_max_logsum(x)
        ctx.save_for_backward(x, y, m, log_s)
        x_y = x.gather(1, y.unsqueeze(1)).squeeze(1)
        return (m - x_y) + log_s, m + log_s

    @staticmethod
    @once_differentiable("cross_entropy_with_logz_penalty")
    def backward(ctx, g_ce: Tensor, g_lse: Tensor):
        x, y, m, log_s = ctx.saved_tensors
        return _ce_logz_grad(x, y, m, log_s, g_ce, g_ce + g_lse), None


def _ce_logz_grad(x: Tensor, y: Tensor, m: Tensor, log_s: Tensor, g_ce: Tensor, g_p: Tensor) -> Tensor:
    """``softmax(x) * g_p - onehot(y) * g_ce`` per row, written in one pass over ``(M, C)``.

    When every ``g_p >= 0`` is seen on the host (CPU, eager: the usual case, ``loss.backward()``
    of a mean or sum) the factor goes into the exponent, ``exp(x - (log Z - log g_p))``: two
    passes over ``(M, C)`` instead of four (``g_p = 0`` gives ``exp(-inf) = 0``)."""
    if (x.device.type == "cpu" and not _compiling() and g_p.numel() > 0 and bool((g_p >= 0).all())):
        grad = torch.sub(x, ((m + log_s) - torch.log(g_p)).unsqueeze(1)).exp_()
    else:
        grad = torch.sub(x, m.unsqueeze(1))
        grad.sub_(log_s.unsqueeze(1)).exp_().mul_(g_p.unsqueeze(1))
    return add_at_target(grad, y, -g_ce)


def _logz_seed_grad(x: Tensor, y: Tensor, m: Tensor, lse: Tensor, coef: float, divisor: int,
                    e: Optional[Tensor] = None, s_sum: Optional[Tensor] = None) -> Tensor:
    """The gradient of the reduced ``ce + coef (log Z)^2`` for an incoming gradient of 1:
    ``softmax * g_p - onehot(y) / divisor`` with ``g_p = (1 + 2 coef log Z) / divisor``, written as
    ``E = exp(x - m)`` (the forward's buffer, or rebuilt) times ``g_p / S`` per row: one pass."""
    if e is None:
        e, s_sum = row_exp(x, m)
    assert s_sum is not None
    g_p = lse.mul(2.0 * coef / divisor).add_(1.0 / divisor)
    grad = e.mul_(g_p.div_(s_sum).unsqueeze(1))
    return add_at_target(grad, y, torch.full((), -1.0 / divisor, dtype=x.dtype, device=x.device))


class _CrossEntropyLogZMeanFunction(torch.autograd.Function):
    """``sum_rows((log Z - x_y) + coef (log Z)^2) / divisor`` (no ignored row): the loss reduced in
    the forward, so the backward gets one scalar and writes the gradient of
    :class:`_CrossEntropyLogZFunction` for ``g_ce = g / divisor``, ``g_lse = 2 coef log Z g_ce``."""

    @staticmethod
    def forward(ctx, x: Tensor, y: Tensor, coef: float, divisor: int, grad_mode: bool = True) -> Tensor:
        # on CPU, eagerly, the gradient for loss.backward()'s seed of 1 is written here, from the
        # log-sum-exp's own exp(x - m) buffer; the backward hands it over (grad_mode:
        # torch.is_grad_enabled() at the call, as inside forward it is always off)
        ctx.fused = grad_mode and bool(ctx.needs_input_grad[0]) and x.device.type == "cpu" and not _compiling() and x.shape[1] > 0
        e = s_sum = None
        if ctx.fused:
            m, e, s_sum = row_max_exp(x)
            log_s = s_sum.log()
        else:
            m, log_s = row_max_logsum(x)
        ctx.save_for_backward(x, y, m, log_s)
        ctx.coef, ctx.divisor = coef, divisor
        x_y = x.gather(1, y.unsqueeze(1)).squeeze(1)
        lse = m + log_s
        ctx.grad = _logz_seed_grad(x, y, m, lse, coef, divisor, e, s_sum) if ctx.fused else None
        return reduced_sum(((m - x_y) + log_s) + coef * lse.square(), divisor)

    @staticmethod
    @once_differentiable("cross_entropy_with_logz_penalty")
    def backward(ctx, g: Tensor):
        grad = ctx.grad
        ctx.grad = None  # hand the buffer over to autograd
        x, y, m, log_s = ctx.saved_tensors
        if ctx.fused and g.item() == 1.0:
            if grad is None:  # a second backward through a retained graph: the same arithmetic
                grad = _logz_seed_grad(x, y, m, m + log_s, ctx.coef, ctx.divisor)
            return grad, None, None, None, None
        g_ce = g / ctx.divisor
        g_lse = (2.0 * ctx.coef) * (m + log_s) * g_ce
        return _ce_logz_grad(x, y, m, log_s, g_ce, g_ce + g_lse), None, None, None, None


def logz_penalty(
    input: Tensor,
    *,
    coef: float = 1e-4,
    mask: Optional[Tensor] = None,
    reduction: str = "mean",
) -> Tensor:
    r"""The log-partition penalty ``coef * (log Z)^2`` alone (PaLM / T5X "z-loss").

    Per position with logits ``o = input[i, :, ...]``: ``log Z = logsumexp_k o_k`` (computed in
    float32 or wider) and ``L = coef * (log Z)^2``. It pushes the softmax normaliser towards
    ``Z = 1`` (self-normalisation) and keeps logits from drifting, as used in PaLM
    (``coef = kappa = 1e-4``) and, on router logits, as the ST-MoE router z-loss. Add it to a
    main loss, or use :func:`cross_entropy_with_logz_penalty` for the fused CE + penalty.

    Gradient: ``dL/do = 2 * coef * log Z * softmax(o)``.

    This is **not** the de Brébisson–Vincent Z-loss; that one is :func:`z_loss`.

    Args:
        input: logits ``(N, C)`` or ``(N, C, d1, ..., dk)``, classes on dim 1. ``-inf`` entries
            are masks ("this class does not exist for this row"): ``log Z`` is taken over the
            other classes and the gradient there is exactly 0. NaN, ``+inf`` and a kept
            position without a finite score raise ``ValueError`` (data checks).
        coef: ``kappa >= 0`` (default 1e-4, PaLM; T5X defaults it to 0).
        mask: optional bool ``(N, d1, ..., dk)``, ``True`` = keep; masked positions give 0 and
            leave the ``"mean"`` denominator.
        reduction: ``"none"`` (shape ``(N, d1, ..., dk)``), ``"mean"`` or ``"sum"`` (T5X sums).

    Unit: the position, weight ``mask`` (1 without a mask). Masked-out positions are zeroed before
    the maths (exactly zero gradients even if they hold ``+-inf``). Under ``torch.autocast`` the
    computation runs in float32 (or float64).

    Paper: A. Chowdhery et al., *PaLM: Scaling Language Modeling with Pathways*, JMLR 2023,
    arXiv:2204.02311; router form: B. Zoph et al., *ST-MoE*, arXiv:2202.08906. Reference:
    ``google-research/t5x`` ``cross_entropy_with_logits`` (JAX).

    >>> import torch, losses
    >>> x = torch.zeros(1, 4)          # log Z = log 4
    >>> bool(torch.isclose(losses.logz_penalty(x, coef=1.0), torch.log(torch.tensor(4.0)) ** 2))
    True
    """
    fn = "logz_penalty"
    check_floating(fn, "input", input)
    check_reduction(fn, reduction)
    coef = check_number(fn, "coef", coef, low=0.0)
    check_logits_dim(fn, input)
    c = input.shape[1]
    if c < 1:
        raise value_error(fn, "input needs at least one class", f"C={c}", "pass logits with C >= 1")
    out_shape = (input.shape[0],) + tuple(input.shape[2:])
    weights = None
    if mask is not None:
        check_tensor(fn, "mask", mask)
        if mask.dtype != torch.bool:
            raise type_error(fn, "mask must be a bool tensor (True = keep)", str(mask.dtype), "pass mask.bool()")
        if tuple(mask.shape) != out_shape:
            raise value_error(fn, f"mask shape must be {out_shape} for input of shape {tuple(input.shape)}",
                              f"shape {tuple(mask.shape)}", "pass one flag per position")
    finite = check_masked_logits(fn, "input", input, active=mask)
    dtype = compute_dtype(input)
    x2d = upcast(move_class_dim_last(input), dtype)
    if mask is not None:
        x2d = zero_rows(x2d, mask.reshape(-1), verified_finite=finite)
    with no_autocast(input.device.type):
        lse = _LogSumExpFunction.apply(x2d)
        values = (coef * lse.square()).reshape(out_shape)
        if mask is None:
            weights = torch.ones(out_shape, dtype=dtype, device=input.device)
        else:
            weights = mask.to(dtype)
        return reduce_loss(values, weights, reduction)


def cross_entropy_with_logz_penalty(
    input: Tensor,
    target: Tensor,
    *,
    coef: float = 1e-4,
    ignore_index: int = -100,
    reduction: str = "mean",
    return_penalty: bool = False,
    softcap: Optional[float] = None,
    inplace_backward: bool = False,
    return_stats: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor], LossStats]:
    r"""Softmax cross-entropy plus the PaLM log-Z penalty: ``(log Z - o_y) + coef * (log Z)^2``.

    Per position with logits ``o = input[i, :, ...]`` and class id ``y = target[i, ...]``:
    ``log Z = logsumexp_k o_k`` (float32 or wider) and ``L = (log Z - o_y) + coef * (log Z)^2``.
    Gradient: ``dL/do = (1 + 2 coef log Z) * softmax(o) - onehot(y)``, written by a custom
    backward in one pass (the cost of :func:`F.cross_entropy`).

    This is **not** the de Brébisson–Vincent Z-loss; that one is :func:`z_loss`.

    Args:
        input: logits ``(N, C)`` or ``(N, C, d1, ..., dk)``, classes on dim 1, ``C >= 2``
            (``C = 1`` raises ``ValueError``: the cross-entropy part would be identically 0).
            ``-inf`` entries are masks: the value equals the loss with those classes removed and
            their gradient is exactly 0; a target on a masked class gives ``+inf`` (exactly, with
            the finite gradient ``(1 + 2 coef log Z) softmax - onehot``). NaN, ``+inf`` and a
            non-ignored position without a finite logit raise ``ValueError`` (data checks).
        target: integer ids ``(N,)`` / ``(N, d1, ..., dk)``; float targets raise ``TypeError``.
        coef: ``kappa >= 0`` (default 1e-4, PaLM; T5X defaults it to 0).
        ignore_index: positions with this id give 0 and leave the ``"mean"`` denominator.
        reduction: ``"none"``, ``"mean"`` or ``"sum"`` (T5X sums over tokens: use ``"sum"``).
        return_penalty: also return the penalty part ``coef * (log Z)^2`` alone, reduced the
            same way (for logging; it is already included in the loss).
        softcap: ``None`` (off) or a positive float ``c``: the logits become
            ``c * tanh(o / c)`` before the softmax and the penalty (final-logit soft-capping,
            Gemma 2, arXiv:2408.00118).
        inplace_backward: on the GPU kernel path (CUDA logits in float32 / bfloat16 / float16:
            one fused Triton row kernel, ``LOSSES_TRITON=0`` switches it off), write the gradient
            over the logits' own storage; after ``backward()`` ``input`` holds its gradient, so
            use it only when nothing reads the logits afterwards (see
            :func:`losses.cross_entropy_loss`). Elsewhere it changes nothing.

        return_stats: return a :class:`losses.LossStats` ``(loss, lse, penalty, accuracy,
            count)``: the per-position ``log Z`` (shaped like ``target``, 0 where ignored) from the
            pass that computes the loss, the penalty part reduced like the loss, and the share of
            non-ignored positions whose largest logit is the target (one more read of the logits).
            With ``coef=0`` this is plain cross-entropy with its statistics. (Takes the unfused
            path, which keeps ``log Z`` per row.)

    Returns:
        the loss, or ``(loss, penalty)`` when ``return_penalty``, or :class:`losses.LossStats`
        when ``return_stats``.

    Unit: the position, weight 1 (0 if ignored). Ignored positions are zeroed before the maths
    (exactly zero gradients even if they hold ``+-inf`` with validation off). Under
    ``torch.autocast`` the computation runs in float32 (or float64).

    Paper: A. Chowdhery et al., *PaLM: Scaling Language Modeling with Pathways*, JMLR 2023,
    arXiv:2204.02311 (kappa = 1e-4); ST-MoE router z-loss, arXiv:2202.08906. Reference:
    ``google-research/t5x`` ``cross_entropy_with_logits`` (Apache-2.0, JAX; sums, coefficient 0
    by default).

    >>> import torch, losses
    >>> x, y = torch.randn(4, 6), torch.tensor([0, 5, 2, 1])
    >>> loss, pen = losses.cross_entropy_with_logz_penalty(x, y, coef=1e-2, return_penalty=True)
    >>> ref = torch.nn.functional.cross_entropy(x, y) + 1e-2 * torch.logsumexp(x, 1).square().mean()
    >>> bool(torch.isclose(loss, ref)), bool(torch.isclose(pen, 1e-2 * torch.logsumexp(x, 1).square().mean()))
    (True, True)
    """
    fn = "cross_entropy_with_logz_penalty"
    check_floating(fn, "input", input)
    check_integer_target(fn, target)
    check_reduction(fn, reduction)
    coef = check_number(fn, "coef", coef, low=0.0)
    check_bool(fn, "return_penalty", return_penalty)
    cap = check_softcap(fn, softcap)
    check_bool(fn, "inplace_backward", inplace_backward)
    check_bool(fn, "return_stats", return_stats)
    if return_stats and return_penalty:
        raise value_error(fn, "return_stats and return_penalty are exclusive", "both True",
                          "use return_stats=True alone: LossStats.penalty is the penalty part")
    if kernels.use_triton(input):  # one fused row kernel (losses/kernels/triton_rows.py)
        x2d, ids, out_shape = kernel_rows(fn, input, target, ignore_index)
        if return_stats:
            pred = x2d.detach().argmax(dim=1)
            ce, lse = triton_rows().softmax_rows(x2d, ids, softcap=cap, ignore_index=ignore_index,
                                                 inplace=inplace_backward)
            valid = ids != ignore_index
            units = valid.reshape(out_shape).to(ce.dtype)
            pen_rows = coef * lse.square()
            loss = reduce_loss((ce + pen_rows).reshape(out_shape), units, reduction)
            penalty = reduce_loss(pen_rows.reshape(out_shape), units, reduction)
            return token_stats(loss, lse, penalty, pred, ids, valid, out_shape)
        if reduction == "none":
            ce, lse = triton_rows().softmax_rows(x2d, ids, softcap=cap, ignore_index=ignore_index,
                                                 inplace=inplace_backward)
            penalty = (coef * lse.square()).reshape(out_shape)  # 0 on ignored rows (their lse is 0)
            loss = ce.reshape(out_shape) + penalty
        else:
            loss, penalty = triton_rows().softmax_reduced(x2d, ids, reduction=reduction, softcap=cap, coef=coef,
                                                          ignore_index=ignore_index, inplace=inplace_backward)
        return (loss, penalty) if return_penalty else loss
    x2d, y, valid, out_shape = class_ids(fn, input, target, ignore_index, none_if_all_kept=True)
    finite = check_masked_logits(fn, "input", x2d, active=valid)
    dtype = compute_dtype(input)
    if not return_penalty and not return_stats and cap is None:
        done = _cpu_kernel("logz", x2d, target, dtype, reduction, (coef,), ignore_index)
        if done is not None:
            return done
    with no_autocast(input.device.type):
        x = upcast(x2d, dtype)
        divisor = None if (return_penalty or return_stats) else fused_divisor(valid, reduction, y.numel())
        if divisor is not None:  # nothing ignored, "mean" / "sum": reduced inside the Function
            return _CrossEntropyLogZMeanFunction.apply(apply_softcap(x, cap), y, coef, divisor,
                                                          torch.is_grad_enabled())
        if valid is not None:
            x = zero_rows(x, valid, verified_finite=finite)
        ce, lse = _CrossEntropyLogZFunction.apply(apply_softcap(x, cap), y)
        penalty = coef * lse.square()
        weights = _weights(valid, out_shape, dtype)
        loss = reduce_loss((ce + penalty).reshape(out_shape), weights, reduction)
        if return_penalty:
            return loss, reduce_loss(penalty.reshape(out_shape), weights, reduction)
        if return_stats:
            keep = torch.ones_like(y, dtype=torch.bool) if valid is None else valid
            return token_stats(loss, lse, reduce_loss(penalty.reshape(out_shape), weights, reduction),
                               x2d.detach().argmax(dim=1), y, keep, out_shape)
        return loss


class CrossEntropyWithLogZPenalty(nn.Module):
    """Cross-entropy plus the log-Z penalty ``coef * (log Z)^2`` (PaLM, arXiv:2204.02311) as a module;
    the maths is :func:`losses.cross_entropy_with_logz_penalty`.

    Not the de Brébisson–Vincent Z-loss; see :class:`ZLoss` for that.

    Args:
        coef: weight ``>= 0`` of the penalty (default 1e-4).
        ignore_index: target id whose positions are skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        return_penalty: also return the penalty part alone, reduced the same way (default False).
        softcap: ``None`` (default, off) or ``c > 0``: logits become ``c * tanh(input / c)``.
        inplace_backward: on the GPU kernel path, write the gradient over the logits (default
            False; see :func:`losses.cross_entropy_loss` for when that is safe).

    ``forward(input, target)``: ``input (N, C)`` or ``(N, C, d1..dk)`` logits, ``target`` ids
    ``(N,)`` / ``(N, d1..dk)``. Returns a scalar for ``"mean"``/``"sum"``, ``(N, d1..dk)`` for
    ``"none"``, or the pair ``(loss, penalty)`` when ``return_penalty``. No parameters or buffers.

    >>> import losses
    >>> losses.CrossEntropyWithLogZPenalty(coef=1e-3)
    CrossEntropyWithLogZPenalty(coef=0.001, ignore_index=-100, reduction='mean', return_penalty=False)
    """

    def __init__(
        self,
        *,
        coef: float = 1e-4,
        ignore_index: int = -100,
        reduction: str = "mean",
        return_penalty: bool = False,
        softcap: Optional[float] = None,
        inplace_backward: bool = False,
    ) -> None:
        super().__init__()
        fn = "CrossEntropyWithLogZPenalty"
        self.inplace_backward = check_bool(fn, "inplace_backward", inplace_backward)
        self.softcap = check_softcap(fn, softcap)
        check_reduction(fn, reduction)
        self.coef = check_number(fn, "coef", coef, low=0.0)
        check_bool(fn, "return_penalty", return_penalty)
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction
        self.return_penalty = return_penalty

    def forward(self, input: Tensor, target: Tensor) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """The penalised cross-entropy of ``input`` against ``target``.

        Args:
            input: logits ``(N, C)`` or ``(N, C, d1..dk)``, classes on dim 1.
            target: integer class ids ``(N,)`` or ``(N, d1..dk)``.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or ``(N, d1..dk)`` (``"none"``); with ``return_penalty``
            the pair ``(loss, penalty)``, both reduced that way.
        """
        return cross_entropy_with_logz_penalty(input, target, coef=self.coef, ignore_index=self.ignore_index,
                                               reduction=self.reduction, return_penalty=self.return_penalty,
                                               softcap=self.softcap, inplace_backward=self.inplace_backward)

    extra_repr = auto_extra_repr

    _repr_omit_none = ("softcap",)
    _repr_omit_false = ("inplace_backward",)


register(
    "z_loss",
    function=z_loss,
    module=ZLoss,
    inputs="logits",
    unit="position",
    unit_weights=position_unit_weights,
    arxiv="1604.08859",
    paper="A. de Brébisson, P. Vincent, The Z-loss: a shift and scale invariant classification loss "
          "belonging to the Spherical Family, arXiv 2016",
)
register(
    "logz_penalty",
    function=cross_entropy_with_logz_penalty,
    module=CrossEntropyWithLogZPenalty,
    inputs="logits",
    unit="position",
    unit_weights=position_unit_weights,
    arxiv="2204.02311",
    paper="A. Chowdhery et al., PaLM: Scaling Language Modeling with Pathways, JMLR 2023",
    softmax=True,
    masks=("neg_inf",),
)
