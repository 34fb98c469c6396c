"""A small decoder-only transformer language model trained with any registered logits loss, or with
the many-class path on its hidden states, routed by the loss's registry declaration.

:class:`DecoderLM` is plain torch: token + learned position embeddings, ``num_layers`` pre-LN blocks
(causal self-attention with :func:`torch.nn.functional.scaled_dot_product_attention` and
``is_causal=True``, then a GELU MLP of width ``4 x embedding_dim``), a final LayerNorm, and an output
layer that is its own ``nn.Linear`` or the token embedding (``tie_weights``).

:class:`LanguageModel` routes the loss by what its registry entry takes
(:func:`~lightning_modules.routing.loss_route`), never by its name:

* ``"logits"`` losses (cross-entropy, Z-loss, log-Z penalty, sparsemax / entmax, ...) get the full
  ``(tokens, vocabulary)`` logits and the next-token ids, ``-100`` (the loss's ``ignore_index``) at
  padding;
* ``"embeddings"`` losses that own the head (``linear_cross_entropy``) get the final hidden states
  ``(tokens, embedding_dim)`` and compute the output layer themselves (the loss owns the output
  weight, which ``tie_weights`` ties to the token embedding), so the full logits are never
  materialised in training. Evaluation takes the logits from the loss's ``.logits`` in chunks of
  ``eval_chunk_tokens`` rows.

Logged metrics (:mod:`lightning_modules.lm_metrics`):

* training, per step: ``train/loss``, ``train/logz_mean`` and ``train/logz_std`` (``log Z =
  logsumexp(logits)`` over the step's target tokens, on the steps the trainer logs --
  ``log_every_n_steps`` -- since a head-owning loss needs a second pass without gradient, in row
  chunks, to get them), ``train/spikes`` (steps so far whose loss exceeded ``spike_factor`` x the
  median of the previous ``spike_window`` losses), ``train/tokens_per_s`` (target tokens per second of
  training-step wall time since the start of fit) and ``train/peak_memory_mb`` (peak process RSS
  on CPU, ``torch.cuda.max_memory_allocated`` on a GPU);
* validation / test, per epoch: ``loss`` (per target token), ``softmax_ppl`` (perplexity of the
  softmax of the same logits, for every loss), ``ppl`` (perplexity of the loss's own predictive
  distribution, :func:`~lightning_modules.routing.predict_proba`, logged only when the registry
  says the loss normalises over the classes -- ``softmax`` -- so not for the Z-loss; it is ``inf``
  for a sparse mapping as soon as one target token gets probability 0, which is the honest value),
  ``top1`` / ``top5`` (next-token accuracy by :func:`~lightning_modules.routing.predict_scores`),
  ``logz_mean`` / ``logz_std`` and, for a loss whose predictive distribution is sparse
  (:func:`~lightning_modules.routing.has_sparse_probabilities`: sparsemax / entmax), ``support`` (mean number of tokens with probability > 0) and ``zero_prob`` (the fraction of
  target tokens given probability 0), plus ``peak_memory_mb``; with ``unigram_reference`` (the
  default) also a no-training reference on the same tokens: ``unigram_top1`` / ``unigram_top5``
  (always predicting the training split's most frequent tokens) and ``unigram_ppl`` /
  ``unigram_nll`` (the training split's add-one-smoothed token frequencies), and a trained one:
  ``bigram_top1`` / ``bigram_top5`` / ``bigram_ppl`` / ``bigram_nll`` of a Witten-Bell
  interpolated bigram model of the training split's tokens (:class:`~lightning_modules.lm_metrics.BigramReference`,
  given the token before each target), the competence floors of the language-model claims.
"""

from __future__ import annotations

import math
import time
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import losses
from losses import InputKind

from ..base import BenchmarkModule, seeded_init
from ..lm_metrics import BigramReference, SpikeCounter, TokenMetrics, logz_stats, peak_memory_mb, token_values
from ..routing import has_own_prediction, has_sparse_probabilities, predict_proba, predict_scores

__all__ = ["DecoderLM", "LanguageModel"]

IGNORE_INDEX = -100


class _Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (u.view(b, t, self.heads, d // self.heads).transpose(1, 2) for u in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.mlp(self.ln2(x)))


class DecoderLM(nn.Module):
    """Decoder-only transformer (module docstring).

    Args:
        vocab_size: number of tokens (the output classes).
        embedding_dim: model width ``D``.
        num_layers: pre-LN blocks.
        num_heads: attention heads (``embedding_dim`` divisible by it).
        context_length: longest input (learned position embeddings).
        dropout: dropout on the embeddings, attention and residual branches.
        head: build an output layer (``False`` when the loss owns it).
        tie_weights: the output layer is the token embedding (``logits = h @ E^T``).

    ``forward(input)`` maps ids ``(B, T)`` to the final hidden states ``(B, T, D)``;
    :meth:`logits` maps hidden states to ``(..., vocab_size)`` logits.
    """

    def __init__(self, vocab_size: int, embedding_dim: int = 192, num_layers: int = 3, num_heads: int = 4,
                 context_length: int = 256, dropout: float = 0.0, head: bool = True, tie_weights: bool = False) -> None:
        super().__init__()
        if embedding_dim % num_heads:
            raise ValueError(f"DecoderLM: embedding_dim must be divisible by num_heads (got {embedding_dim}, "
                             f"{num_heads}); e.g. 192 and 4")
        self.vocab_size, self.embedding_dim, self.context_length = vocab_size, embedding_dim, context_length
        self.tok = nn.Embedding(vocab_size, embedding_dim)
        self.pos = nn.Embedding(context_length, embedding_dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(_Block(embedding_dim, num_heads, dropout) for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(embedding_dim)
        self.tie_weights = bool(tie_weights)
        self.head = nn.Linear(embedding_dim, vocab_size, bias=False) if head and not tie_weights else None
        self.has_head = bool(head)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * num_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, input: Tensor) -> Tensor:
        t = input.shape[1]
        if t > self.context_length:
            raise ValueError(f"DecoderLM: the input has {t} tokens, more than context_length={self.context_length}; "
                             "raise context_length or shorten the data's seq_len")
        pos = torch.arange(t, device=input.device)
        x = self.drop(self.tok(input) + self.pos(pos))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def logits(self, hidden: Tensor) -> Tensor:
        if self.tie_weights:
            return F.linear(hidden, self.tok.weight)
        if self.head is None:
            raise RuntimeError("DecoderLM.logits: this model has no output layer (the loss owns it)")
        return self.head(hidden)


class LanguageModel(BenchmarkModule):
    """Causal language model on a :class:`DecoderLM`, routed by the loss's registry declaration.

    Args:
        loss: a ``"logits"`` loss (full logits over the vocabulary) or an ``"embeddings"`` loss that
            owns the head (``LinearCrossEntropyLoss``: hidden states, the loss owns the output layer).
        num_classes: vocabulary size (linked from the DataModule by the CLI).
        embedding_dim: model width (linked into a head-owning loss's ``embedding_dim``).
        num_layers, num_heads, context_length, dropout: the :class:`DecoderLM`.
        tie_weights: tie the output layer to the token embedding (for a head-owning loss, its
            weight becomes the embedding; the loss's bias, if any, stays its own).
        spike_factor: a training step whose loss exceeds this multiple of the running median is a
            spike (``train/spikes``).
        spike_window: number of previous step losses in the running median.
        eval_chunk_tokens: tokens per chunk when evaluation materialises logits (bounds memory).
        unigram_reference: log the unigram and bigram reference metrics (module docstring) when the
            DataModule has a ``stream("train")`` of token ids.
        init_seed: when set, the model is initialised from ``torch.manual_seed(init_seed)`` (the
            global RNG restored afterwards), so arms of a comparison start from the same weights.
        lr, weight_decay: AdamW.
    """

    loss_kinds = (InputKind.LOGITS, InputKind.EMBEDDINGS)
    loss_task = "a language model"
    loss_hint = "use a logits loss (e.g. losses.CrossEntropyLoss) or an embeddings loss that owns the head " \
                "(losses.LinearCrossEntropyLoss)"
    loss_example = "losses.CrossEntropyLoss()"

    def __init__(
        self,
        loss: nn.Module,
        num_classes: int = 0,
        embedding_dim: int = 192,
        num_layers: int = 3,
        num_heads: int = 4,
        context_length: int = 256,
        dropout: float = 0.0,
        tie_weights: bool = False,
        spike_factor: float = 2.0,
        spike_window: int = 50,
        eval_chunk_tokens: int = 1024,
        unigram_reference: bool = True,
        init_seed: Optional[int] = None,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(loss, lr=lr, weight_decay=weight_decay)
        owner = type(self).__name__
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"{owner}: num_classes (the vocabulary size) must be an int >= 2 (got {num_classes!r}); "
                             "it is linked from the DataModule by the CLI, or pass it")
        if getattr(loss, "reduction", "mean") != "mean":
            raise ValueError(f"{owner}: the loss must average over the target tokens (got reduction="
                             f"{getattr(loss, 'reduction', None)!r}); build it with reduction='mean'")
        self.loss = loss
        self.num_classes, self.embedding_dim = num_classes, embedding_dim
        #: support / zero-probability metrics only for a sparse predictive distribution (no name checks)
        self.sparse_probabilities = has_sparse_probabilities(loss, num_classes)
        self.tie_weights = bool(tie_weights)
        owns = self.route.owns_head
        if owns:
            for name, want in (("num_classes", num_classes), ("embedding_dim", embedding_dim)):
                got = getattr(loss, name, want)
                if got != want:
                    raise ValueError(f"{owner}: the loss's {name} is {got} but the model's is {want} (got {got} != "
                                     f"{want}); leave the loss's sizes to the CLI links or pass matching ones")
        with seeded_init(init_seed):  # the same start for every loss (paired comparisons)
            self.decoder = DecoderLM(num_classes, embedding_dim, num_layers, num_heads, context_length, dropout,
                                     head=not owns, tie_weights=tie_weights and not owns)
        if owns and self.tie_weights:
            self.loss.weight = self.decoder.tok.weight  # one parameter: the embedding is the output layer
        spec = losses.spec_for_module(type(loss))
        self._normalised = True if spec is None else bool(spec.softmax)  # a distribution to take a perplexity of
        self.spike_factor, self.spike_window = float(spike_factor), int(spike_window)
        self.spikes = SpikeCounter(self.spike_factor, self.spike_window, min_history=min(10, self.spike_window))
        self.eval_chunk_tokens = int(eval_chunk_tokens)
        self.eval_metrics = nn.ModuleDict({s: TokenMetrics(IGNORE_INDEX) for s in ("val", "test")})
        self.unigram_reference = bool(unigram_reference)
        self._unigram: Optional[Tensor] = None
        self._bigram: Optional[BigramReference] = None
        self._tokens = 0
        self._seconds = 0.0
        self._t0: Optional[float] = None

    # -- model ---------------------------------------------------------------------------------
    def forward(self, input: Tensor) -> Tensor:
        """Next-token logits ``(B, T, vocab)`` of ids ``(B, T)`` (materialised; for inference)."""
        return self._logits(self.decoder(input))

    def _logits(self, hidden: Tensor) -> Tensor:
        return self.loss.logits(hidden) if self.route.owns_head else self.decoder.logits(hidden)

    def _loss(self, hidden: Tensor, target: Tensor, stats: bool = False):
        """The routed loss over the flattened tokens, the logits when they were materialised, and, with
        ``stats``, the loss's own statistics (:class:`losses.LossStats`: per-token ``log Z``, token
        accuracy) when it gives them from its pass (``forward_with_stats``)."""
        h = hidden.reshape(-1, hidden.shape[-1])
        y = target.reshape(-1)
        if self.route.kind == InputKind.LOGITS:
            logits = self.decoder.logits(h)
            return self.loss(logits, y), logits, None
        with_stats = getattr(self.loss, "forward_with_stats", None)
        if stats and callable(with_stats):  # the loss owns the output layer and reports log Z from its pass
            out = with_stats(h, y)
            return out.loss, None, out
        return self.loss(h, y), None, None  # the loss owns the output layer: hidden states only

    @torch.no_grad()
    def _logz(self, hidden: Tensor) -> Tensor:
        """``logsumexp`` of the logits of ``hidden (N, D)``, row chunks of :attr:`eval_chunk_tokens`."""
        return torch.cat([torch.logsumexp(self._logits(c).float(), -1)
                          for c in hidden.split(self.eval_chunk_tokens)]) if len(hidden) else hidden.new_zeros(0)

    # -- training ------------------------------------------------------------------------------
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._t0 = time.perf_counter()

    def training_step(self, batch: Dict[str, Tensor], batch_idx: int) -> Tensor:
        hidden = self.decoder(batch["input"])
        target = batch["target"].reshape(-1)
        every = max(1, int(getattr(self.trainer, "log_every_n_steps", 1) or 1)) if self._trainer is not None else 1
        logged = batch_idx % every == 0  # log Z and the accuracy on the logged steps only
        loss, logits, stats = self._loss(hidden, batch["target"], stats=logged)
        valid = target != IGNORE_INDEX
        n = int(valid.sum())
        self._batch_tokens = n
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=n)
        if logged:
            with torch.no_grad():  # from the logits, or the loss's own pass; else a second pass over the head
                top1 = None
                if stats is not None:
                    lz, top1 = stats.lse.float(), stats.accuracy
                elif logits is not None:
                    lz = torch.logsumexp(logits.detach().float(), -1)
                    top1 = (logits.detach().argmax(-1) == target)[valid].float().mean() if n else None
                else:
                    lz = self._logz(hidden.detach().reshape(-1, hidden.shape[-1]))
                mean, std = logz_stats(lz[valid])
            self.log("train/logz_mean", mean.float(), on_step=True, on_epoch=False, batch_size=n)
            self.log("train/logz_std", std.float(), on_step=True, on_epoch=False, batch_size=n)
            if top1 is not None:  # token accuracy of the training batch (largest logit = target)
                self.log("train/top1", top1.float(), on_step=True, on_epoch=False, batch_size=n)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._t0 is not None:
            self._seconds += time.perf_counter() - self._t0
            self._tokens += getattr(self, "_batch_tokens", 0)
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None:
            self.spikes.update(float(loss.detach()))
        self.log("train/spikes", float(self.spikes.count), on_step=True, on_epoch=False)
        if self._seconds > 0:
            self.log("train/tokens_per_s", self._tokens / self._seconds, on_step=True, on_epoch=False)
        self.log("train/peak_memory_mb", peak_memory_mb(self.device), on_step=True, on_epoch=False)

    def on_fit_start(self) -> None:
        super().on_fit_start()
        self._tokens, self._seconds = 0, 0.0
        self.spikes.reset()

    # -- evaluation ----------------------------------------------------------------------------
    def _unigram_logp(self) -> Optional[Tensor]:
        """Add-one-smoothed log-frequencies of the training split's tokens (``None`` without a
        DataModule that exposes ``stream("train")``)."""
        if not self.unigram_reference:
            return None
        if self._unigram is None:
            dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
            if dm is None or not callable(getattr(dm, "stream", None)):
                return None
            counts = torch.bincount(dm.stream("train").long(), minlength=self.num_classes)[:self.num_classes]
            counts = counts.double() + 1.0
            self._unigram = (counts / counts.sum()).log()
        return self._unigram

    def _bigram_reference(self) -> Optional[BigramReference]:
        """The Witten-Bell bigram model of the training split's tokens (``None`` as the unigram)."""
        logp = self._unigram_logp()
        if logp is None:
            return None
        if self._bigram is None:
            dm = self._trainer.datamodule
            self._bigram = BigramReference(dm.stream("train"), self.num_classes, logp)
        return self._bigram

    def on_validation_epoch_start(self) -> None:
        self.eval_metrics["val"].set_unigram(self._unigram_logp())
        self.eval_metrics["val"].set_bigram(self._bigram_reference())

    def on_test_epoch_start(self) -> None:
        self.eval_metrics["test"].set_unigram(self._unigram_logp())
        self.eval_metrics["test"].set_bigram(self._bigram_reference())

    def _eval_step(self, stage: str, batch: Dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        hidden = self.decoder(batch["input"])
        loss, full, _ = self._loss(hidden, batch["target"])  # no statistics: the eval metrics compute their own
        h = hidden.reshape(-1, hidden.shape[-1])
        y = batch["target"].reshape(-1)
        n = int((y != IGNORE_INDEX).sum())
        metric = self.eval_metrics[stage]
        own = has_own_prediction(self.loss)
        first = True
        records = self._item_records(stage)
        per_token = [] if records is not None else None
        # a logits loss already materialised the logits; a head-owning loss's come in row chunks
        chunks = full.split(self.eval_chunk_tokens) if full is not None else \
            (self._logits(hc) for hc in h.split(self.eval_chunk_tokens))
        prevs = batch["input"].reshape(-1).split(self.eval_chunk_tokens)  # the token before each target
        for logits, yc, vc in zip(chunks, y.split(self.eval_chunk_tokens), prevs):
            logits = logits.float()
            scores = predict_scores(self.loss, logits, dim=-1) if own else None
            probs = predict_proba(self.loss, logits, dim=-1)
            metric.update(loss.detach() * n if first else loss.new_zeros(()), logits,
                          probs, yc, scores=scores,
                          sparse=self.sparse_probabilities, prev=vc)
            if per_token is not None:
                per_token.append(token_values(logits, probs, yc, scores=scores, ignore_index=IGNORE_INDEX))
            first = False
        if records is not None:
            b = batch["target"].shape[0]
            row = {k: torch.cat([d[k] for d in per_token]).reshape(b, -1).sum(1) for k in per_token[0]}
            records.add("sequences", item=records.positions(b, dataloader_idx), **row)

    # -- per-item test records (lightning_modules.records) ---------------------------------------
    def item_record_spec(self) -> Dict[str, Any]:
        """Per-item test records: one row per test sequence (window), token sums (``lightning_modules.records``)."""
        cols = {"item": "index of the window in the test split (consecutive windows of the test stream)",
                "tokens": "target tokens of the window (padding excluded)",
                "nll": "summed -log p(target) under the loss's predictive distribution (inf at probability 0)",
                "softmax_nll": "summed -log softmax(logits)[target]",
                "top1": "target tokens ranked first", "top5": "target tokens among the 5 best-ranked",
                "logz": "summed log Z = logsumexp(logits)", "logz_sq": "summed (log Z)^2",
                "support": "summed number of tokens with probability > 0",
                "zero": "target tokens given probability 0"}
        t = "sequences"
        metrics: Dict[str, Dict[str, Any]] = {
            "test/top1": {"agg": "ratio", "columns": ["top1", "tokens"]},
            "test/top5": {"agg": "ratio", "columns": ["top5", "tokens"]},
            "test/softmax_nll": {"agg": "ratio", "columns": ["softmax_nll", "tokens"]},
            "test/softmax_ppl": {"agg": "exp_ratio", "columns": ["softmax_nll", "tokens"]},
            "test/logz_mean": {"agg": "ratio", "columns": ["logz", "tokens"]},
            "test/logz_std": {"agg": "std_ratio", "columns": ["logz", "logz_sq", "tokens"]},
        }
        if self._normalised:
            metrics["test/nll"] = {"agg": "ratio", "columns": ["nll", "tokens"]}
            metrics["test/ppl"] = {"agg": "exp_ratio", "columns": ["nll", "tokens"]}
        if self.sparse_probabilities:
            metrics["test/support"] = {"agg": "ratio", "columns": ["support", "tokens"]}
            metrics["test/zero_prob"] = {"agg": "ratio", "columns": ["zero", "tokens"]}
        for m in metrics.values():
            m["table"] = t
        return {"kind": "language_model", "tables": {t: {"columns": cols}}, "metrics": metrics,
                "notes": "token-weighted: each metric is sum(column) / sum(tokens) over the windows (exp of it "
                         "for the perplexities); not per item: loss (the loss module's batch means), the "
                         "unigram and bigram references and peak memory"}

    def _eval_epoch_end(self, stage: str) -> None:
        metric = self.eval_metrics[stage]
        if int(metric.tokens) == 0 and not self.trainer.sanity_checking:
            metric.reset()
            return
        values = metric.compute()
        metric.reset()
        if not self._normalised:
            values.pop("ppl", None)
            values.pop("nll", None)
        for k, v in values.items():
            self.log(f"{stage}/{k}", v.float(), on_step=False, on_epoch=True)
        self.log(f"{stage}/peak_memory_mb", peak_memory_mb(self.device), on_step=False, on_epoch=True)
