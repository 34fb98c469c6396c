"""WCDAS: Wrapped Cauchy Distributed Angular Softmax (docs/losses/wcdas.md).

B. Han, *Wrapped Cauchy Distributed Angular Softmax for Long-Tailed Visual Recognition*,
ICML 2023, arXiv:2305.18732. The reference repository (``boranhan/WCDAS_code``) has no licence
file; nothing here is taken from it but the maths.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._core import (
    _checking,
    check_ignore_index,
    auto_extra_repr,
    check_int,
    check_choice,
    check_finite,
    check_floating,
    check_ids_in_range,
    check_number,
    check_reduction,
    compute_dtype,
    reduce_loss,
    upcast,
    value_error,
)
from .._heads import check_embeddings_and_target, check_head_embeddings, check_softmax_classes, drop_rows
from .._precision import matmul, softplus
from .._registry import id_unit_weights, register

__all__ = ["wcdas_logits", "wcdas_loss", "WCDASLoss"]

VARIANTS = ("paper", "reference")
DELTA = 1e-6
#: ``g`` is clamped at ``log((1 - delta) / delta)`` so that ``rho <= 1 - delta``.
G_MAX = math.log((1.0 - DELTA) / DELTA)
_REFERENCE_PI = 3.14


def _check_head(fn: str, embeddings: Tensor, weight: Tensor, concentration_logit: Tensor,
                scale: Union[Tensor, float]) -> None:
    check_floating(fn, "embeddings", embeddings)
    check_floating(fn, "weight", weight)
    check_floating(fn, "concentration_logit", concentration_logit)
    if embeddings.dim() != 2:
        raise value_error(fn, "embeddings must have shape (N, D)", f"shape {tuple(embeddings.shape)}",
                          "flatten the features to one vector per sample")
    d = embeddings.shape[1]
    if weight.dim() != 2 or weight.shape[1] != d or weight.shape[0] < 1:
        raise value_error(fn, f"weight must have shape (C, {d}) for embeddings of shape {tuple(embeddings.shape)}",
                          f"shape {tuple(weight.shape)}", "pass one weight row per class")
    c = weight.shape[0]
    if tuple(concentration_logit.shape) != (c,):
        raise value_error(fn, f"concentration_logit must have shape ({c},), one per class",
                          f"shape {tuple(concentration_logit.shape)}", "pass one concentration logit g_k per class")
    if isinstance(scale, Tensor):
        check_floating(fn, "scale", scale)
        if scale.numel() != 1:
            raise value_error(fn, "scale must be a scalar (the effective s > 0)", f"shape {tuple(scale.shape)}",
                              "pass a float or a 0-dim tensor")
    else:
        check_number(fn, "scale", scale, low=0.0, low_inclusive=False, hint="pass the effective scale s > 0")
    check_finite(fn, "embeddings", embeddings)
    check_finite(fn, "weight", weight)
    check_finite(fn, "concentration_logit", concentration_logit)
    if isinstance(scale, Tensor) and _checking():  # one host sync for both data checks of the scale
        s = scale.detach()
        if not bool((torch.isfinite(s) & (s > 0)).all()):
            check_finite(fn, "scale", scale)  # NaN / inf: its own message
            raise value_error(fn, "scale must be finite and satisfy scale > 0", f"{float(s):.6g}",
                              "pass s > 0; a trained scale is 1 + softplus(scale_logit), which always is")


def _logits(embeddings: Tensor, weight: Tensor, concentration_logit: Tensor, scale: Union[Tensor, float],
            variant: str) -> Tensor:
    """The WCDAS logits without checks (computed in float32 or wider, autocast off)."""
    dtype = compute_dtype(embeddings, weight, concentration_logit, scale if isinstance(scale, Tensor) else None)
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        x = F.normalize(upcast(embeddings, dtype), p=2.0, dim=1, eps=1e-12)
        w = F.normalize(upcast(weight, dtype), p=2.0, dim=1, eps=1e-12)
        cos = matmul(x, w.transpose(0, 1)).clamp(-1.0, 1.0)  # (N, C)
        g = upcast(concentration_logit, dtype)
        s = upcast(scale, dtype).reshape(()) if isinstance(scale, Tensor) else scale
        if variant == "reference":
            rho = torch.sigmoid(g)
            num = 1.0 - rho * rho
            den = 2.0 * _REFERENCE_PI * (1.0 + rho * rho - 2.0 * rho * cos)
            return s * num / den
        g = g.clamp(max=G_MAX)
        rho = torch.sigmoid(g)
        one_minus_rho = torch.sigmoid(-g)
        num = one_minus_rho * (1.0 + rho)
        den = 2.0 * math.pi * (one_minus_rho * one_minus_rho + 2.0 * rho * (1.0 - cos))
        return s * num / den


def wcdas_logits(
    embeddings: Tensor,
    weight: Tensor,
    concentration_logit: Tensor,
    scale: Union[Tensor, float],
    *,
    variant: str = "paper",
) -> Tensor:
    r"""WCDAS logits: ``s`` times the wrapped Cauchy density of the angle between ``x_i`` and ``w_k``.

    With ``x = embeddings`` ``(N, D)``, ``W = weight`` ``(C, D)``, ``g = concentration_logit``
    ``(C,)`` and the effective scale ``s = scale`` (a float or 0-dim tensor, ``> 0``)::

        c_ik = clamp(<normalize(x_i), normalize(w_k)>, -1, 1)
        g_k <- min(g_k, log((1 - delta) / delta)),  delta = 1e-6
        rho_k = sigmoid(g_k),   1 - rho_k computed as sigmoid(-g_k)
        z_ik = s (1 - rho_k)(1 + rho_k) / (2 pi [(1 - rho_k)^2 + 2 rho_k (1 - c_ik)])

    which equals ``s * f(theta_ik; rho_k)`` with the wrapped Cauchy density
    ``f(theta; rho) = (1/2pi) (1 - rho^2) / (1 + rho^2 - 2 rho cos theta)``, in a form that stays
    finite as ``rho -> 1`` (the largest logit is at most ``s (1 + rho) / (2 pi (1 - rho))``,
    about ``3.2e5 * s``). ``variant="reference"`` uses 3.14 for pi, the raw denominator
    ``1 + rho^2 - 2 rho c`` and no clamp on ``g``, as the reference code.

    Returns ``(N, C)`` logits in the compute dtype (float32 for half inputs, also under autocast,
    whose backward runs in float32 too).

    Paper: B. Han, "Wrapped Cauchy Distributed Angular Softmax for Long-Tailed Visual
    Recognition", ICML 2023, arXiv:2305.18732.

    >>> import math, torch, losses
    >>> z = losses.wcdas_logits(torch.ones(1, 2), torch.eye(2), torch.zeros(2), 2 * math.pi)
    >>> [round(v, 4) for v in z[0].tolist()]   # rho = 0.5, c = 0.7071: 0.75 / (0.25 + 0.2929)
    [1.3815, 1.3815]
    """
    fn = "wcdas_logits"
    check_choice(fn, "variant", variant, VARIANTS)
    _check_head(fn, embeddings, weight, concentration_logit, scale)
    return _logits(embeddings, weight, concentration_logit, scale, variant)


def wcdas_loss(
    embeddings: Tensor,
    target: Tensor,
    weight: Tensor,
    concentration_logit: Tensor,
    scale: Union[Tensor, float],
    *,
    variant: str = "paper",
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""WCDAS loss: softmax cross-entropy over the wrapped Cauchy angular logits.

    ``L_i = CE(z_i, y_i) = logsumexp_k z_ik - z_{i, y_i}`` with ``z = wcdas_logits(embeddings,
    weight, concentration_logit, scale, variant=variant)`` (see :func:`wcdas_logits` for the
    formula: ``c_ik`` the cosine between ``x_i`` and ``w_k``, ``rho_k = sigmoid(g_k)`` the per-class
    concentration, ``s = scale`` the effective scale, ``s = 1 + softplus(s_hat)`` when trained as
    :class:`WCDASLoss` does).

    Shapes: ``embeddings (N, D)``, ``target (N,)`` ids in ``[0, C)``, ``weight (C, D)``,
    ``concentration_logit (C,)``, ``scale`` a float or 0-dim tensor. Unit: the row, unit weight 1
    for non-ignored rows; ``"none"`` gives ``(N,)`` (0 on ignored rows), ``"mean"`` divides by the
    number of non-ignored rows; all rows ignored gives an exact, graph-attached 0.

    Defaults follow the paper's CIFAR-LT setting (``g_0 = 0``, ``rho_0 = 0.5``, trainable scale);
    ``variant="reference"`` reproduces the reference code's 3.14, raw denominator and unclamped
    ``g``.

    Paper: B. Han, "Wrapped Cauchy Distributed Angular Softmax for Long-Tailed Visual
    Recognition", ICML 2023, arXiv:2305.18732.

    >>> import math, torch, losses
    >>> x, W = torch.randn(4, 3), torch.randn(5, 3)
    >>> g = torch.full((5,), -50.0)       # rho -> 0: every logit is s / 2pi, the loss log C
    >>> round(float(losses.wcdas_loss(x, torch.tensor([0, 1, 2, 3]), W, g, 2.0)), 4) == round(math.log(5), 4)
    True
    """
    fn = "wcdas_loss"
    check_choice(fn, "variant", variant, VARIANTS)
    check_reduction(fn, reduction)
    check_embeddings_and_target(fn, embeddings, target)
    _check_head(fn, embeddings, weight, concentration_logit, scale)
    check_softmax_classes(fn, weight.shape[0], arg="weight.shape[0] (the number of classes C)")
    check_ids_in_range(fn, target, weight.shape[0], ignore_index)
    logits = _logits(drop_rows(embeddings, target != ignore_index), weight, concentration_logit, scale, variant)
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        values = F.cross_entropy(logits, target.long(), ignore_index=ignore_index, reduction="none")
        valid = (target != ignore_index).to(logits.dtype)
        return reduce_loss(values, valid, reduction,
                           anchors=(embeddings, weight, concentration_logit,
                                    scale if isinstance(scale, Tensor) else None))


class WCDASLoss(nn.Module):
    """WCDAS (arXiv:2305.18732) as a module, owning the angular head; the maths is
    :func:`losses.wcdas_loss`.

    Args:
        embedding_dim: the feature size ``D``.
        num_classes: the number of classes ``C >= 2``.
        concentration_init: initial ``g_0`` of every class's concentration logit (default 0.0).
        scale: ``None`` (default: a trainable scale) or a fixed ``s > 0``.
        variant: ``"paper"`` (default) or ``"reference"``.
        ignore_index: target id whose rows are skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    ``forward(embeddings, target)``: ``embeddings (N, D)``, ``target`` ids ``(N,)``. Returns a
    scalar for ``"mean"``/``"sum"``, ``(N,)`` for ``"none"``.

    Parameters: ``weight`` ``(num_classes, embedding_dim)`` (``nn.Linear`` initialisation),
    ``concentration_logit`` ``(num_classes,)`` filled with ``concentration_init`` (``g_0``, the value
    before the sigmoid: 0.0 gives ``rho_0 = 0.5`` as the CIFAR-LT config; ImageNet-LT uses -1.0,
    iNaturalist +1.0 with ``scale=250.0``), and either a trainable ``scale_logit`` ``s_hat`` (``scale=None``,
    ``s = 1 + softplus(s_hat)``, starting at ``s_hat = 0``, ``s ~ 1.693``) or a fixed buffer ``scale``.

    ``.logits(embeddings)`` gives the ``(N, C)`` logits for prediction, ``.concentration()`` the
    ``rho`` used in them and ``.effective_scale()`` the ``s``.
    """

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        *,
        concentration_init: float = 0.0,
        scale: Optional[float] = None,
        variant: str = "paper",
        ignore_index: int = -100,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        name = "WCDASLoss"
        for key, val in (("embedding_dim", embedding_dim), ("num_classes", num_classes)):
            check_int(name, key, val, low=1, hint=f"pass the {key}")
        check_softmax_classes(name, num_classes, arg="num_classes")
        check_reduction(name, reduction)
        check_choice(name, "variant", variant, VARIANTS)
        self.concentration_init = check_number(name, "concentration_init", concentration_init)
        self.embedding_dim = embedding_dim
        self.num_classes = num_classes
        self.variant = variant
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction
        self.weight = nn.Parameter(torch.empty(num_classes, embedding_dim))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's initialisation
        self.concentration_logit = nn.Parameter(torch.full((num_classes,), self.concentration_init))
        if scale is None:
            self.scale_logit = nn.Parameter(torch.zeros(()))
            self.register_buffer("scale", None)
        else:
            s = check_number(name, "scale", scale, low=0.0, low_inclusive=False, hint="pass s > 0 or None")
            self.register_parameter("scale_logit", None)
            self.register_buffer("scale", torch.tensor(s))

    def effective_scale(self) -> Tensor:
        """The scale ``s``: ``1 + softplus(scale_logit)`` if trainable, else the fixed buffer."""
        if self.scale_logit is not None:
            return 1.0 + softplus(self.scale_logit)  # exact (no linear cut-off above 20)
        return self.scale

    def concentration(self) -> Tensor:
        """``rho = sigmoid(g)`` per class, with ``g`` clamped as the logits do (paper variant)."""
        g = self.concentration_logit
        if self.variant == "paper":
            g = g.clamp(max=G_MAX)
        return torch.sigmoid(g)

    def logits(self, embeddings: Tensor) -> Tensor:
        """``(N, num_classes)`` WCDAS logits (:func:`wcdas_logits`) of the owned head."""
        check_head_embeddings("WCDASLoss.logits", "WCDASLoss", embeddings, self.embedding_dim)
        return wcdas_logits(embeddings, self.weight, self.concentration_logit, self.effective_scale(),
                            variant=self.variant)

    def forward(self, embeddings: Tensor, target: Tensor) -> Tensor:
        """The WCDAS loss of the embeddings against the owned head.

        Args:
            embeddings: floating features ``(N, embedding_dim)``.
            target: integer class ids ``(N,)``.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-row losses ``(N,)`` (``"none"``).
        """
        check_head_embeddings("wcdas_loss", "WCDASLoss", embeddings, self.embedding_dim)
        return wcdas_loss(embeddings, target, self.weight, self.concentration_logit, self.effective_scale(),
                          variant=self.variant, ignore_index=self.ignore_index, reduction=self.reduction)

    extra_repr = auto_extra_repr

    def _repr_values(self) -> dict:
        return {"scale": None if self.scale is None else float(self.scale)}


register(
    "wcdas",
    function=wcdas_loss,
    module=WCDASLoss,
    inputs="embeddings",
    unit="row",
    unit_weights=id_unit_weights,
    arxiv="2305.18732",
    paper="B. Han, Wrapped Cauchy Distributed Angular Softmax for Long-Tailed Visual Recognition, ICML 2023",
    owns_head=True,
    softmax=True,
    example_kwargs={"embedding_dim": 8, "num_classes": 5},
)
