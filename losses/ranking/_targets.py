"""Shared internals of the in-batch ranking losses (docs/losses/decoupled_softmax.md).

Argument checks, the parsing of ``scores`` / ``target`` / ``mask`` into positives and available
candidates, the Gumbel sampling of positives, the seeded-module base class and the registry's
unit weights and examples, used by :mod:`losses.ranking.decoupled`, :mod:`losses.ranking.soft_topk`
and :mod:`losses.ranking.in_batch`. Private: nothing here is public API.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .._core import (
    as_index,
    check_ignore_index,
    check_seed,
    check_int,
    _checking,
    check_finite,
    check_floating,
    check_ids_in_range,
    check_tensor,
    compute_dtype,
    type_error,
    upcast,
    value_error,
)
from .._random import GeneratorStateMixin

__all__: list = []

VARIANTS = ("paper", "reference")
_REFERENCE_MASK = -100.0  # the reference overwrites positives' scaled scores with -100
_PAPER_DEXML = "N. Gupta et al., Dual-Encoders for Extreme Multi-label Classification, ICLR 2024"


# --------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------


def _check_mask_value(fn: str, value: object) -> None:
    if value is None:
        return
    args = (fn, "mask_value must be None, a finite real number or -inf", repr(value),
            "use -100.0 (the reference) or float('-inf') (exact removal)")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise type_error(*args)  # a wrong kind of argument
    if math.isnan(value) or value == math.inf:
        raise value_error(*args)


def _check_k(fn: str, k: object) -> Union[int, str]:
    """``k`` as a Python int (NumPy integers and one-element integer tensors included), or
    ``"num_positives"``."""
    if isinstance(k, str) and k == "num_positives":
        return k
    args = (fn, "k must be an int with 0 < k < L or 'num_positives'", repr(k),
            "pass the number of labels the soft top-k keeps")
    if isinstance(k, str):
        raise value_error(*args)
    index = as_index(k)
    if index is None:
        raise type_error(*args)  # a wrong kind of argument (float, None, bool)
    if index < 1:
        raise value_error(*args)
    return index


def _check_n_iter(fn: str, n_iter: object) -> None:
    check_int(fn, "n_iter", n_iter, low=1, what="an int >= 1", hint="32 bisection steps are the default")


def _check_seed(fn: str, seed: object) -> None:
    check_seed(fn, seed)


# --------------------------------------------------------------------------------------
# targets and candidates
# --------------------------------------------------------------------------------------


def _check_scores(fn: str, scores: object) -> None:
    check_floating(fn, "scores", scores)
    if scores.dim() != 2:
        raise value_error(fn, "scores must have shape (B, L)", f"shape {tuple(scores.shape)}",
                          "pass one row of label scores per query")


def _check_candidate_mask(fn: str, mask: object, scores: Tensor) -> Optional[Tensor]:
    """``mask`` (bool, the scores' shape, True = exclude) or ``None``."""
    if mask is None:
        return None
    check_tensor(fn, "mask", mask)
    if mask.dtype != torch.bool:
        raise type_error(fn, "mask must be a bool tensor (True = exclude the candidate)", str(mask.dtype),
                         "pass mask.bool(); use target for the positives")
    if tuple(mask.shape) != tuple(scores.shape):
        raise value_error(fn, f"mask must have the scores' shape {tuple(scores.shape)}", f"shape {tuple(mask.shape)}",
                          "pass one flag per score (True = exclude)")
    return mask.to(scores.device)


def _rows_list(flags: Tensor) -> str:
    rows = flags.nonzero().flatten()
    return f"rows {rows[:8].tolist()}{' ...' if rows.numel() > 8 else ''}"


def _available(fn: str, scores: Tensor, mask: Optional[Tensor], pos: Tensor) -> Tuple[Tensor, Tensor]:
    """``(avail, pos)``: the candidates that exist (not masked, score not ``-inf``) and the positives
    among them. Data checks: a removed positive and a row without any candidate raise
    ``ValueError``; with validation off a removed positive is dropped from the positives."""
    avail = scores.detach() != -math.inf
    if mask is not None:
        avail = avail & ~mask
    if _checking() and scores.numel() > 0:
        _check_candidates(fn, (pos & ~avail).any(dim=1), ~avail.any(dim=1))
    return avail, pos & avail


def _check_candidates(fn: str, removed: Tensor, empty: Tensor) -> None:
    """Data checks on ``(B,)`` row flags: a positive removed by the mask or a ``-inf`` score, and a
    row without any candidate, raise ``ValueError``."""
    if bool(removed.any()):
        raise value_error(fn, "mask or a -inf score removes a positive", _rows_list(removed),
                          "a positive must stay a candidate: unmark it in mask or drop it from target")
    if bool(empty.any()):
        raise value_error(fn, "a row has no finite score (every candidate is masked or -inf)",
                          _rows_list(empty), "keep at least one candidate per row or drop the row")


def _check_id_shape(fn: str, target: Tensor, b: int, n_labels: int) -> None:
    """Integer ids of ``(B, L)`` scores: shape ``(B,)`` or ``(B, P)``."""
    if target.dim() not in (1, 2) or target.shape[0] != b:
        raise value_error(fn, f"integer target must have shape ({b},) or ({b}, P) for scores of shape ({b}, {n_labels})",
                          f"shape {tuple(target.shape)}", "pass one id per row or id lists padded with ignore_index")


def _check_two_candidates(fn: str, scores: Tensor) -> None:
    if scores.shape[1] < 2:
        raise value_error(fn, "scores must have at least 2 candidates per row; with one the loss is identically 0",
                          f"shape {tuple(scores.shape)}",
                          "score more candidates per query, or use losses.bce_with_logits_loss for one score")


def _check_not_a_mask(fn: str, target: Tensor, num_labels: int) -> None:
    """Data check: an integer (B, L) target holding only 0 and 1 is almost surely a mask."""
    if (target.dim() == 2 and target.shape[1] == num_labels and num_labels > 2 and target.numel() > 0
            and _checking() and bool(((target == 0) | (target == 1)).all())):
        raise type_error(fn, "integer target of shape (B, L) looks like a multi-hot mask", "values in {0, 1}",
                         "pass target.bool() or pad id lists with ignore_index")


def _ranking_targets(fn: str, scores: Tensor, target: object, ignore_index: int,
                     dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """``(pos, y)``: bool positives ``(B, L)`` and relevance ``y`` (0 off the positives)."""
    check_ignore_index(fn, ignore_index)  # also where a bool or float target makes it unused
    check_tensor(fn, "target", target)
    b, n_labels = scores.shape
    if target.is_complex():
        raise type_error(fn, "target must be bool, float or integer", str(target.dtype), "pass a real tensor")
    if target.dtype == torch.bool or target.is_floating_point():
        if target.shape != scores.shape:
            kind = "bool" if target.dtype == torch.bool else "float"
            raise value_error(fn, f"{kind} target must have the scores' shape {tuple(scores.shape)}",
                              f"shape {tuple(target.shape)}", "pass integer ids of shape (B,) or (B, P) otherwise")
        if target.dtype == torch.bool:
            return target, target.to(dtype)
        check_finite(fn, "target", target)
        pos = target > 0
        y = upcast(target, dtype)
        return pos, torch.where(pos, y, torch.zeros_like(y))
    # integer ids
    _check_id_shape(fn, target, b, n_labels)
    _check_not_a_mask(fn, target, n_labels)
    check_ids_in_range(fn, target, n_labels, ignore_index, hint="ids index the columns of scores; pad with ignore_index")
    ids = target if target.dim() == 2 else target.unsqueeze(1)
    # ignored ids (and, with validation off, out-of-range ids) go to a dummy column L that is
    # dropped afterwards; scatter gives set semantics for repeated ids
    valid = (ids != ignore_index) & (ids >= 0) & (ids < n_labels)
    safe = torch.where(valid, ids, torch.full_like(ids, n_labels)).long()
    pos = torch.zeros(b, n_labels + 1, dtype=torch.bool, device=scores.device)
    pos = pos.scatter(1, safe, True)[:, :n_labels]
    return pos, pos.to(dtype)


def _masked_logsumexp(x: Tensor, keep: Tensor) -> Tensor:
    """Row-wise logsumexp over ``keep``; ``-inf`` (with zero, NaN-free gradients) where empty."""
    has = keep.any(dim=1)
    neg_inf = torch.full((), -math.inf, dtype=x.dtype, device=x.device)
    z = torch.where(keep & has.unsqueeze(1), x, neg_inf)
    z = torch.where(has.unsqueeze(1), z, torch.zeros_like(z))
    return torch.where(has, torch.logsumexp(z, dim=1), neg_inf)


def _gumbel(shape: Tuple[int, ...], generator: Optional[torch.Generator], device: torch.device) -> Tensor:
    gen_device = generator.device if generator is not None else device
    u = torch.rand(shape, generator=generator, device=gen_device, dtype=torch.float64)
    u = u.clamp_min(torch.finfo(torch.float64).tiny)
    return (-torch.log(-torch.log(u))).to(device)


def _sample_keys(pos: Tensor, y: Tensor, generator: Optional[torch.Generator]) -> Tensor:
    """Gumbel keys ``log y + G`` on the positives (``-inf`` elsewhere): the arg-max is a draw from
    ``Categorical(y / sum y)`` and sorting gives draws without replacement."""
    g = _gumbel(tuple(pos.shape), generator, pos.device)
    logy = torch.log(torch.where(pos, y.detach().double(), torch.ones((), dtype=torch.float64, device=pos.device)))
    return torch.where(pos, logy + g, torch.full((), -math.inf, dtype=torch.float64, device=pos.device))


def _loss_dtype(scores: Tensor, target: Tensor) -> torch.dtype:
    return compute_dtype(scores, target if isinstance(target, Tensor) and target.is_floating_point() else None)


def _scaled(scores: Tensor, avail: Tensor, pos: Tensor, dtype: torch.dtype, temperature: float) -> Tensor:
    """``scores / T`` in ``dtype`` with 0 (a finite placeholder, zero gradient) where excluded and
    in rows without a positive (unit weight 0), so that nothing there, even ``inf``/NaN with the
    data checks off, reaches the value or the gradient."""
    s = upcast(scores, dtype)
    keep = avail & pos.any(dim=1, keepdim=True)
    return torch.where(keep, s, torch.zeros((), dtype=dtype, device=s.device)) / temperature


# --------------------------------------------------------------------------------------
# modules and registry
# --------------------------------------------------------------------------------------


class _SeededModule(GeneratorStateMixin):
    """Holds an optional private ``torch.Generator`` created lazily (on CPU) from ``seed``; its
    state is in ``state_dict()`` (so a resumed run draws what the uninterrupted run would have),
    and deepcopy and pickle carry it, so copies reproduce the same draws."""

    seed: Optional[int]

    def _generator_or_none(self) -> Optional[torch.Generator]:
        return self._seeded_generator(torch.device("cpu"))


def _row_unit_weights(scores: Tensor, target: Tensor, *, ignore_index: int = -100, **_: object) -> Tensor:
    """Row weights of the docs/losses/decoupled_softmax.md losses: 1 for a row with at least one positive, else 0."""
    pos, _ = _ranking_targets("unit_weights", scores, target, ignore_index, torch.float64)
    return pos.any(dim=1).double()


def _example_scores(*, generator: Optional[torch.Generator] = None, dtype=torch.float32, case: str = "random"):
    """``(scores (6, 7), bool target)``; ``"extreme"``: scores x1e4 with ``-inf`` on some negatives
    (never a positive; every row keeps at least 4 candidates); ``"ignored"``: no positives."""
    b, n = 6, 7
    x = torch.randn((b, n), generator=generator, dtype=torch.float64)
    t = torch.zeros(b, n, dtype=torch.bool)
    t[torch.arange(b), torch.arange(b) % n] = True
    t[0, 1] = True  # one row with two positives
    if case == "extreme":
        x = x * 1e4
        drop = torch.zeros(b, n, dtype=torch.bool)
        drop[0, 4:] = True
        drop[1, 0] = True
        drop[2, [0, 1, 3]] = True
        x = x.masked_fill(drop & ~t, -math.inf)
    elif case == "ignored":
        t = torch.zeros_like(t)
    return (x.to(dtype), t), {}
