"""Metrics of the language-model benchmark (:class:`~lightning_modules.models.LanguageModel`).

* :class:`TokenMetrics` -- one ``torchmetrics.Metric`` with sum-reduced states (so it syncs across
  DDP ranks) over the target tokens of an evaluation stage: the loss per token, the negative
  log-likelihood under the loss's predictive distribution (``nll``; its exponential ``ppl``), the
  same under the softmax of the same logits (``softmax_nll`` / ``softmax_ppl``), top-1 / top-5
  accuracy, the mean support size of the predictive distribution and the fraction of target
  tokens it gives probability 0 (``zero_prob``), and the mean and standard deviation of
  ``log Z = logsumexp(logits)``.
* :class:`BigramReference` -- a Witten-Bell interpolated bigram model of the training tokens, the
  trained competence floor beside the unigram one.
* :func:`sparse_target_stats` -- support sizes and zero-probability targets of a distribution.
* :func:`logz_stats` -- mean and (population) standard deviation of ``log Z`` over tokens.
* :class:`SpikeCounter` -- counts loss spikes: a step whose loss exceeds ``factor`` times the
  median of the previous ``window`` step losses.
* :func:`peak_memory_mb` -- the process's peak resident memory on CPU (:func:`~lightning_modules.metrics.peak_rss_mb`, ``nan``
  where the platform has no ``resource`` module), ``torch.cuda.max_memory_allocated`` on a CUDA
  device.
"""

from __future__ import annotations

import collections
import math
import statistics
from typing import Deque, Dict, Optional, Tuple

import torch
from torch import Tensor
from torchmetrics import Metric

from .metrics import peak_rss_mb

__all__ = ["TokenMetrics", "BigramReference", "SpikeCounter", "sparse_target_stats", "token_values", "logz_stats",
           "peak_memory_mb"]


def sparse_target_stats(probs: Tensor, target: Tensor, ignore_index: int = -100) -> Tuple[Tensor, Tensor, Tensor]:
    """``(support, zero_target, valid)`` for ``probs (N, C)`` and ``target (N,)``: the number of
    classes with probability > 0 per row, whether the target class has probability exactly 0,
    and the rows whose target is not ``ignore_index`` (the first two are 0 there)."""
    valid = target != ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target))
    support = (probs > 0).sum(-1)
    zero = probs.gather(-1, safe.unsqueeze(-1)).squeeze(-1) <= 0
    return support * valid, zero & valid, valid


def logz_stats(logz: Tensor) -> Tuple[Tensor, Tensor]:
    """Mean and population standard deviation of ``log Z`` values (float64); ``nan`` when empty."""
    z = logz.detach().double().flatten()
    if z.numel() == 0:
        nan = torch.tensor(float("nan"), dtype=torch.float64)
        return nan, nan
    mean = z.mean()
    return mean, ((z - mean) ** 2).mean().sqrt()


class SpikeCounter:
    """Loss spikes: a step whose loss exceeds ``factor`` x the median of the previous ``window``
    losses counts as one (once ``min_history`` losses have been seen). Non-finite losses count as
    spikes and are not added to the history. ``count`` is the number so far."""

    def __init__(self, factor: float = 2.0, window: int = 50, min_history: int = 10) -> None:
        if not (factor > 1.0 and math.isfinite(factor)):
            raise ValueError(f"SpikeCounter: factor must be a finite float > 1 (got {factor!r}); e.g. 2.0")
        if int(window) < 1 or int(min_history) < 1:
            raise ValueError(f"SpikeCounter: window and min_history must be >= 1 (got {window!r}, {min_history!r})")
        self.factor, self.window, self.min_history = float(factor), int(window), int(min_history)
        self.history: Deque[float] = collections.deque(maxlen=self.window)
        self.count = 0

    def update(self, loss: float) -> bool:
        """Record one step's loss; returns whether it was a spike."""
        loss = float(loss)
        if not math.isfinite(loss):
            self.count += 1
            return True
        spike = len(self.history) >= self.min_history and loss > self.factor * statistics.median(self.history)
        self.count += int(spike)
        self.history.append(loss)
        return spike

    def reset(self) -> None:
        self.history.clear()
        self.count = 0


def peak_memory_mb(device: Optional[torch.device] = None) -> float:
    """Peak memory in MiB: ``torch.cuda.max_memory_allocated`` on a CUDA ``device``, else the
    process's peak resident set size (``ru_maxrss``)."""
    if device is not None and torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    return peak_rss_mb()



def token_values(logits: Tensor, probs: Tensor, target: Tensor, *, scores: Optional[Tensor] = None,
                 ignore_index: int = -100) -> Dict[str, Tensor]:
    """Per-token values behind :class:`TokenMetrics` (the per-item test records): for ``logits``,
    ``probs (N, C)`` and ``target (N,)``, each ``(N,)`` and 0 at ``ignore_index``: ``tokens`` (1 for a
    target token), ``nll`` (``-log p(target)``, float64, ``inf`` at probability 0), ``softmax_nll``,
    ``top1`` / ``top5`` hits (ranked by ``scores`` where given, else the logits), ``logz``
    (``logsumexp(logits)``), ``logz_sq``, ``support`` (classes with probability > 0) and ``zero``
    (the target has probability 0) -- the terms :meth:`TokenMetrics.update` sums."""
    logits = logits.detach().float()
    probs = probs.detach().float()
    support, zero, valid = sparse_target_stats(probs, target, ignore_index)
    safe = torch.where(valid, target, torch.zeros_like(target))
    lse = torch.logsumexp(logits, -1)
    softmax_nll = lse - logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    p_t = probs.gather(-1, safe.unsqueeze(-1)).squeeze(-1).double()
    ranked = logits if scores is None else scores
    top = ranked.topk(min(5, ranked.shape[-1]), dim=-1).indices
    hit = top == safe.unsqueeze(-1)
    v64 = valid.double()
    zeros = torch.zeros_like(v64)
    lse64 = lse.double()
    return {"tokens": v64, "nll": torch.where(valid, -torch.log(p_t), zeros),
            "softmax_nll": torch.where(valid, softmax_nll.double(), zeros), "top1": (hit[:, 0] & valid).double(),
            "top5": (hit.any(-1) & valid).double(), "logz": torch.where(valid, lse64, zeros),
            "logz_sq": torch.where(valid, lse64 ** 2, zeros), "support": support.double(), "zero": zero.double()}


class BigramReference:
    """A bigram model of a token stream with Witten-Bell interpolation (no knob to tune):

    ``p(w | v) = (c(v, w) + n(v) p1(w)) / (c(v) + n(v))``

    where ``c(v, w)`` counts ``v`` followed by ``w`` in the stream, ``c(v) = sum_w c(v, w)``,
    ``n(v)`` is the number of distinct tokens seen after ``v`` and ``p1`` the unigram distribution
    given as ``unigram_logp (C,)``; a token never seen as a predecessor (``c(v) = 0``) falls back to
    ``p1``. The counts are kept sparse (the sorted pair keys ``v * C + w``), so a vocabulary of
    tens of thousands costs memory in the number of distinct pairs, not ``C^2``.

    ``log_prob(prev, target)``: ``log p(target | prev)``, float64. ``topk(prev, k)``: the ``k``
    most probable next tokens after each ``prev`` (ties in an arbitrary order)."""

    def __init__(self, stream: Tensor, num_classes: int, unigram_logp: Tensor, *, row_chunk: int = 256) -> None:
        c = int(num_classes)
        s = stream.detach().long().cpu().reshape(-1)
        if s.numel() and (int(s.min()) < 0 or int(s.max()) >= c):
            raise ValueError(f"BigramReference: token ids must be in [0, {c}) (got {int(s.min())} ... {int(s.max())})")
        if unigram_logp.shape != (c,):
            raise ValueError(f"BigramReference: unigram_logp must have shape ({c},) (got {tuple(unigram_logp.shape)})")
        self.num_classes, self.row_chunk = c, int(row_chunk)
        keys, counts = torch.unique(s[:-1] * c + s[1:], return_counts=True)  # sorted
        self.keys, self.pair_counts = keys, counts.double()
        self.prev_counts = torch.bincount(s[:-1], minlength=c).double()
        self.followers = torch.bincount(keys // c, minlength=c).double()
        self.p1 = unigram_logp.detach().double().cpu().exp()

    def _pair(self, prev: Tensor, target: Tensor) -> Tensor:
        if self.keys.numel() == 0:
            return torch.zeros(prev.shape, dtype=torch.float64)
        q = prev * self.num_classes + target
        i = torch.searchsorted(self.keys, q).clamp(max=self.keys.numel() - 1)
        return torch.where(self.keys[i] == q, self.pair_counts[i], torch.zeros((), dtype=torch.float64))

    def log_prob(self, prev: Tensor, target: Tensor) -> Tensor:
        prev, target = prev.long().cpu(), target.long().cpu()
        n_v, c_v = self.followers[prev], self.prev_counts[prev]
        p1 = self.p1[target]
        p = torch.where(c_v > 0, (self._pair(prev, target) + n_v * p1) / (c_v + n_v).clamp_min(1.0), p1)
        return p.log()

    def topk(self, prev: Tensor, k: int = 5) -> Tensor:
        prev = prev.long().cpu()
        k = min(int(k), self.num_classes)
        uniq, inverse = torch.unique(prev, return_inverse=True)
        tops = torch.empty(uniq.numel(), k, dtype=torch.long)
        starts = torch.searchsorted(self.keys, uniq * self.num_classes)
        ends = torch.searchsorted(self.keys, (uniq + 1) * self.num_classes)
        for a in range(0, uniq.numel(), self.row_chunk):
            rows = uniq[a:a + self.row_chunk]
            n_v = self.followers[rows][:, None]
            # the numerator of p(w | v); the rows of unseen predecessors are p1 itself
            score = torch.where(self.prev_counts[rows][:, None] > 0, n_v * self.p1[None, :], self.p1[None, :])
            for j in range(rows.numel()):
                lo, hi = int(starts[a + j]), int(ends[a + j])
                if hi > lo:
                    score[j].index_add_(0, self.keys[lo:hi] % self.num_classes, self.pair_counts[lo:hi])
            tops[a:a + rows.numel()] = score.topk(k, dim=1).indices
        return tops[inverse]


class TokenMetrics(Metric):
    """Per-token evaluation metrics of one stage (module docstring), accumulated as sums.

    ``update(loss_sum, logits, probs, target, sparse=...)``: ``loss_sum`` the summed loss of the
    batch's target tokens, ``logits (N, C)`` and ``probs (N, C)`` (the loss's predictive
    distribution) of the same ``N`` tokens, ``target (N,)`` with ``ignore_index`` at padding.
    ``compute()`` returns a dict: ``loss``, ``nll``, ``ppl``, ``softmax_nll``, ``softmax_ppl``,
    ``top1``, ``top5``, ``logz_mean``, ``logz_std`` and, when a sparse distribution was seen,
    ``support`` and ``zero_prob``. ``nll`` is ``inf`` when any target token got probability 0.

    A no-training reference on the same tokens: after :meth:`set_unigram` (log-probabilities
    ``(C,)`` of a unigram model, e.g. the training split's token frequencies) ``compute()`` also
    returns ``unigram_top1`` / ``unigram_top5`` (accuracy of always predicting the most frequent
    tokens), ``unigram_nll`` and ``unigram_ppl``; after :meth:`set_bigram` (a
    :class:`BigramReference`) and with ``prev`` (the token before each target) given to ``update``,
    also ``bigram_top1`` / ``bigram_top5`` / ``bigram_nll`` / ``bigram_ppl``.
    """

    full_state_update = False

    def __init__(self, ignore_index: int = -100, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ignore_index = int(ignore_index)
        for name in ("tokens", "loss_sum", "nll_sum", "softmax_nll_sum", "top1", "top5", "support", "zero",
                     "logz_sum", "logz_sq", "sparse", "unigram_top1", "unigram_top5", "unigram_nll_sum",
                     "bigram_tokens", "bigram_top1", "bigram_top5", "bigram_nll_sum"):
            self.add_state(name, default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.unigram: Optional[Tensor] = None
        self.bigram: Optional[BigramReference] = None

    def set_bigram(self, ref: Optional["BigramReference"]) -> None:
        """The bigram reference (``None``: none); read where ``update`` gets ``prev``."""
        self.bigram = ref

    def set_unigram(self, logp: Optional[Tensor]) -> None:
        """Log-probabilities ``(C,)`` of the unigram reference (``None``: no reference)."""
        self.unigram = None if logp is None else logp.detach().double()

    def update(self, loss_sum: Tensor, logits: Tensor, probs: Tensor, target: Tensor, *, scores: Optional[Tensor] = None,
               sparse: bool = False, prev: Optional[Tensor] = None) -> None:
        logits = logits.detach().float()
        probs = probs.detach().float()
        support, zero, valid = sparse_target_stats(probs, target, self.ignore_index)
        safe = torch.where(valid, target, torch.zeros_like(target))
        lse = torch.logsumexp(logits, -1)
        softmax_nll = (lse - logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1))[valid]
        p_t = probs.gather(-1, safe.unsqueeze(-1)).squeeze(-1)[valid].double()
        ranked = logits if scores is None else scores
        k = min(5, ranked.shape[-1])
        top = ranked.topk(k, dim=-1).indices
        hit = top == safe.unsqueeze(-1)
        self.tokens += valid.sum()
        self.loss_sum += loss_sum.detach().double()
        self.nll_sum += (-torch.log(p_t)).sum()  # +inf when a target has probability 0
        self.softmax_nll_sum += softmax_nll.double().sum()
        self.top1 += hit[:, 0][valid].sum()
        self.top5 += hit.any(-1)[valid].sum()
        self.logz_sum += lse[valid].double().sum()
        self.logz_sq += (lse[valid].double() ** 2).sum()
        if self.unigram is not None:
            u = self.unigram.to(target.device)
            uk = u.topk(k).indices
            t = safe[valid]
            self.unigram_top1 += (t == uk[0]).sum()
            self.unigram_top5 += (t.unsqueeze(-1) == uk).any(-1).sum()
            self.unigram_nll_sum += (-u[t]).sum()
        if self.bigram is not None and prev is not None:
            t, v = safe[valid], prev.reshape(-1)[valid]
            bk = self.bigram.topk(v, k).to(target.device)
            tc = t.to(bk.device)
            self.bigram_tokens += valid.sum()
            self.bigram_top1 += (bk[:, 0] == tc).sum()
            self.bigram_top5 += (bk == tc.unsqueeze(-1)).any(-1).sum()
            self.bigram_nll_sum += (-self.bigram.log_prob(v, t)).sum().to(self.bigram_nll_sum.device)
        if sparse:
            self.sparse += 1
            self.support += support.double().sum()
            self.zero += zero.sum()

    def compute(self) -> Dict[str, Tensor]:
        n = self.tokens.clamp_min(1)
        mean_lz = self.logz_sum / n
        out = {
            "loss": self.loss_sum / n,
            "nll": self.nll_sum / n,
            "softmax_nll": self.softmax_nll_sum / n,
            "top1": self.top1 / n,
            "top5": self.top5 / n,
            "logz_mean": mean_lz,
            "logz_std": (self.logz_sq / n - mean_lz ** 2).clamp_min(0).sqrt(),
        }
        out["ppl"] = out["nll"].exp()
        out["softmax_ppl"] = out["softmax_nll"].exp()
        if self.unigram is not None:
            out["unigram_top1"] = self.unigram_top1 / n
            out["unigram_top5"] = self.unigram_top5 / n
            out["unigram_nll"] = self.unigram_nll_sum / n
            out["unigram_ppl"] = out["unigram_nll"].exp()
        if self.bigram is not None and self.bigram_tokens > 0:
            nb = self.bigram_tokens
            out["bigram_top1"] = self.bigram_top1 / nb
            out["bigram_top5"] = self.bigram_top5 / nb
            out["bigram_nll"] = self.bigram_nll_sum / nb
            out["bigram_ppl"] = out["bigram_nll"].exp()
        if self.sparse > 0:
            out["support"] = self.support / n
            out["zero_prob"] = self.zero / n
        return out
