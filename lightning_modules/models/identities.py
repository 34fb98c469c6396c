"""An embedding model for many identities: an MLP over feature vectors and a head-owning loss.

:class:`IdentityEmbedder` trains on :class:`~lightning_modules.data.IdentitiesDataModule`. The loss
is routed by its registry declaration (:func:`~lightning_modules.routing.loss_route`): an ``"embeddings"``
loss that owns the class centres (Partial FC, margin softmax, ...) gets the embeddings and the
identity ids, and closed-set logits come from its ``.logits``; a ``"logits"`` loss (e.g.
``torch.nn.CrossEntropyLoss``) gets the logits of a linear head the model owns. Other routes are
rejected.

Logged metrics (``val/`` and ``test/``):

* ``top1``, ``top5``: closed-set identification over all ``num_classes`` identities (the held-out
  samples of the training identities), ranked by the loss's own prediction rule
  (:func:`~lightning_modules.routing.predict_scores`: its ``predict_proba`` where it has one, else
  the logits);
* ``open_rank1``, ``open_tar_far``: open-set 1:N search of the probes of held-out identities
  against their gallery by cosine of the embeddings
  (:func:`~lightning_modules.data.identities.identification_metrics`; TAR at FAR ``far``);
* ``open_rank1_raw``, ``open_rank1_fixed``, ``top1_fixed`` (test only): the no-training levels of the
  same test split that the DataModule computes
  (:meth:`~lightning_modules.data.IdentitiesDataModule.floor_metrics`: the raw input and the
  generator's own fixed projection), the competence floors of the many-class claims;
* cost, measured during ``fit`` and saved in the checkpoint, so a ``test`` from that checkpoint
  logs it as ``test/train_step_ms`` (mean wall time of a training step: forward, backward and
  optimiser step, from ``on_train_batch_start`` to ``on_train_batch_end``, the first step of the
  fit excluded as warm-up), ``test/train_peak_rss_mb`` (the process's peak resident set size at
  the end of training, ``getrusage`` ``ru_maxrss``: data, model and training together) and
  ``test/train_rss_increase_mb`` (that peak minus the resident set size at the start of
  training: what the training steps added); on CUDA also ``test/train_cuda_peak_mb``
  (``torch.cuda.max_memory_allocated``). During ``fit`` they are logged as ``train/step_ms`` etc.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric

from losses import InputKind

from ..base import BenchmarkModule, seeded_init
from ..data.identities import identification_metrics
from ..metrics import peak_rss_mb
from ..optim import build_optimizer
from ..routing import head_logits, predict_scores

__all__ = ["IdentityEmbedder", "current_rss_mb", "peak_rss_mb"]

LR_SCHEDULES = ("cosine", "constant")
NORMS = ("layer", "none")
OPTIMIZERS = ("adamw", "sgd")


def current_rss_mb() -> float:
    """Resident set size of this process now, in MiB (``/proc/self/statm``; 0 where absent)."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except (OSError, ValueError, IndexError):
        return 0.0


class IdentityEmbedder(BenchmarkModule):
    """MLP ``input_dim -> hidden_dim (x depth, LayerNorm, ReLU) -> embedding_dim`` with a pluggable loss.

    Args:
        loss: an ``"embeddings"`` loss that owns a head (``num_classes`` and ``embedding_dim`` are linked
            into it by the CLI), or a ``"logits"`` loss (the model then owns a linear head).
        num_classes, input_dim: linked from the DataModule.
        embedding_dim: the embedding width.
        hidden_dim, depth: the MLP (``depth`` hidden layers).
        norm: ``"layer"`` (a LayerNorm before each ReLU: per sample, so a DDP run equals a single
            process run) or ``"none"``.
        lr, weight_decay: the optimiser's; ``optimizer`` ``"adamw"`` or ``"sgd"`` (with ``momentum``,
            the Partial FC paper's choice: a centre that is not sampled gets a zero gradient,
            which AdamW's moments and SGD's momentum treat differently); ``lr_schedule`` ``"cosine"`` (per step, to 0 at the end of the
            fit) or ``"constant"``. With ``PartialFCLoss(sparse_grad=True)`` the centres get
            ``SparseAdam`` (beside AdamW) or plain SGD (beside SGD), which move only the sampled
            centres (``lightning_modules.optim``).
        init_seed: when set, the MLP (and the model's own head) are initialised from
            ``torch.manual_seed(init_seed)`` with the global RNG restored afterwards, so the arms
            of a paired comparison start from the same weights.
        far: the false accept rate of ``open_tar_far``.
    """

    loss_kinds = (InputKind.LOGITS, InputKind.EMBEDDINGS)
    loss_task = "an identity model"
    loss_hint = "use an embeddings loss that owns a head (e.g. PartialFCLoss) or a logits loss"

    def __init__(
        self,
        loss: nn.Module,
        num_classes: int = 0,
        input_dim: int = 0,
        embedding_dim: int = 128,
        hidden_dim: int = 256,
        depth: int = 2,
        norm: str = "layer",
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        lr_schedule: str = "cosine",
        optimizer: str = "adamw",
        momentum: float = 0.9,
        init_seed: Optional[int] = None,
        far: float = 1e-3,
    ) -> None:
        super().__init__(loss, lr=lr, weight_decay=weight_decay)
        name = type(self).__name__
        for arg, v in (("num_classes", num_classes), ("input_dim", input_dim), ("embedding_dim", embedding_dim),
                       ("hidden_dim", hidden_dim)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: {arg} must be a positive integer (got {v!r}); num_classes and "
                                 "input_dim are linked from the DataModule by the CLI, or pass them")
        if norm not in NORMS:
            raise ValueError(f"{name}: norm must be one of {NORMS} (got {norm!r})")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"{name}: optimizer must be one of {OPTIMIZERS} (got {optimizer!r})")
        if lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"{name}: lr_schedule must be one of {LR_SCHEDULES} (got {lr_schedule!r})")
        self.loss = loss
        self.num_classes = num_classes
        self.input_dim = input_dim
        self.embedding_dim = embedding_dim
        self.lr_schedule = lr_schedule
        self.optimizer_name = optimizer
        self.momentum = float(momentum)
        self.init_seed = init_seed
        self.far = float(far)
        with seeded_init(init_seed):  # the same start for every loss (paired comparisons)
            layers: List[nn.Module] = []
            width = input_dim
            for _ in range(int(depth)):
                layers += [nn.Linear(width, hidden_dim), nn.LayerNorm(hidden_dim) if norm == "layer" else nn.Identity(),
                           nn.ReLU()]
                width = hidden_dim
            layers.append(nn.Linear(width, embedding_dim))
            self.net = nn.Sequential(*layers)
            self.head = None if self.route.owns_head else nn.Linear(embedding_dim, num_classes)
        self.eval_metrics = nn.ModuleDict({stage: nn.ModuleDict({m: MeanMetric() for m in ("top1", "top5")})
                                           for stage in ("val", "test")})
        self._open: Dict[str, List[Tensor]] = {}
        self._perf: Dict[str, float] = {}
        self._step_times: List[float] = []
        self._t0 = 0.0
        self._fit_steps = 0

    # -- model --------------------------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        """The embeddings ``(N, embedding_dim)``."""
        return self.net(x)

    def logits(self, embeddings: Tensor) -> Tensor:
        """Closed-set logits: the loss's ``.logits`` when it owns the head, else the model's head
        (:func:`~lightning_modules.routing.head_logits`)."""
        return head_logits(self.loss, self.route, embeddings, self.head)

    def configure_optimizers(self) -> Any:
        # a loss with sparse_grad=True (Partial FC's centres) gets SparseAdam / plain SGD for those rows
        opt = build_optimizer(self, [{"params": list(self.parameters())}], optimizer=self.optimizer_name, lr=self.lr,
                              weight_decay=self.weight_decay, momentum=self.momentum)
        if self.lr_schedule == "constant":
            return opt
        total = max(1, int(self.trainer.estimated_stepping_batches))
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: 0.5 * (1.0 + math.cos(math.pi * min(1.0, step / total))))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # -- training and its cost ------------------------------------------------------------------
    def training_step(self, batch, batch_idx: int) -> Tensor:
        x, y = batch
        emb = self(x)
        loss = self.loss(emb, y) if self.route.owns_head else self.loss(self.logits(emb), y)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=y.numel())
        index = getattr(self.loss, "last_index", None)
        if self.route.owns_head and isinstance(index, Tensor):
            # how many centres the step's softmax saw (Partial FC: k = the batch's positives and sampled
            # negatives) and the positives' share of them: below 1, some of the k are sampled negatives
            # (at 1 the "sample" is the batch's positives and nothing was sampled)
            n, k, pos = y.numel(), float(index.numel()), float(torch.unique(y).numel())
            self.log("train/softmax_classes", k, on_step=False, on_epoch=True, batch_size=n)
            self.log("train/positive_classes", pos, on_step=False, on_epoch=True, batch_size=n)
            self.log("train/positive_share", pos / k if k else float("nan"), on_step=False, on_epoch=True,
                     batch_size=n)
        return loss

    def on_train_start(self) -> None:
        self._rss_start = current_rss_mb()
        self._step_times = []
        self._fit_steps = 0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - self._t0
        self._fit_steps += 1
        if self._fit_steps > 1:  # the first step of the fit is warm-up
            self._step_times.append(dt)

    def _update_perf(self) -> None:
        times = self._step_times
        perf = {"train_step_ms": 1000.0 * sum(times) / len(times) if times else float("nan"),
                "train_peak_rss_mb": peak_rss_mb(),
                "train_rss_increase_mb": max(0.0, peak_rss_mb() - getattr(self, "_rss_start", 0.0)),
                "train_steps_timed": float(len(times))}
        if self.device.type == "cuda":
            perf["train_cuda_peak_mb"] = torch.cuda.max_memory_allocated(self.device) / 2 ** 20
        self._perf = perf

    def on_train_epoch_end(self) -> None:
        self._update_perf()
        for k, v in self._perf.items():
            if k != "train_steps_timed" and math.isfinite(v):
                self.log(f"train/{k[len('train_'):]}", v, on_step=False, on_epoch=True, sync_dist=False,
                         rank_zero_only=True)

    def on_save_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        if self._fit_steps:
            self._update_perf()
        if self._perf:
            checkpoint["identities_perf"] = dict(self._perf)

    def on_load_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        self._perf = dict(checkpoint.get("identities_perf") or {})

    # -- evaluation -----------------------------------------------------------------------------
    def _eval_step(self, stage: str, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        if dataloader_idx == 0:
            x, y = batch
            scores = predict_scores(self.loss, self.logits(self(x)))  # the loss's own rule, else the logits
            top = scores.topk(min(5, scores.shape[1]), dim=1).indices
            hit = top == y[:, None]
            self.eval_metrics[stage]["top1"].update(hit[:, 0].float())
            self.eval_metrics[stage]["top5"].update(hit.any(1).float())
            records = self._item_records(stage)
            if records is not None:
                records.add("closed", item=records.positions(y.shape[0], dataloader_idx), target=y, pred=top[:, 0],
                            top1=hit[:, 0], top5=hit.any(1))
        else:
            x, ident, role, idx = batch
            emb = F.normalize(self(x).float(), dim=1)
            self._open.setdefault(stage, []).append(
                torch.cat([emb, ident[:, None].float(), role[:, None].float(), idx[:, None].float()], dim=1))

    # -- per-item test records (lightning_modules.records) ---------------------------------------
    @staticmethod
    def _record_probes(records, gallery: Tensor, gallery_id: Tensor, probes: Tensor, probe_id: Tensor,
                       probe_index: Tensor) -> None:
        """Per-probe open-set rank-1 hits, for the probes ``identification_metrics`` scores."""
        from ..data.identities import _rank1

        keep = torch.isin(probe_id.cpu(), gallery_id.cpu())
        hit = _rank1(gallery, gallery_id, probes[keep.to(probes.device)], probe_id.cpu()[keep], None)
        records.add("open", item=probe_index.cpu()[keep], identity=probe_id.cpu()[keep], open_rank1=hit)

    def item_record_spec(self) -> Dict[str, Any]:
        """Per-item test records: closed-set test samples and open-set probes (``lightning_modules.records``)."""
        closed = {"item": "index of the sample in the closed-set test split", "target": "identity",
                  "pred": "best-ranked identity (the loss's own prediction rule)", "top1": "closed-set top-1 hit",
                  "top5": "the identity among the 5 best-ranked"}
        open_ = {"item": "index of the probe in the open-set test split (gallery and probes)",
                 "identity": "the probe's identity", "open_rank1": "the nearest gallery sample (cosine) has the "
                 "probe's identity"}
        metrics = {"test/top1": {"table": "closed", "agg": "mean", "columns": ["top1"]},
                   "test/top5": {"table": "closed", "agg": "mean", "columns": ["top5"]},
                   "test/open_rank1": {"table": "open", "agg": "mean", "columns": ["open_rank1"]}}
        return {"kind": "many_class", "tables": {"closed": {"columns": closed}, "open": {"columns": open_}},
                "metrics": metrics,
                "notes": "open rows are the probes whose identity has a gallery sample (those the metric "
                         "scores); not per item: open_tar_far (a threshold over all probe-gallery pairs), "
                         "the floor and cost metrics"}

    def _eval_epoch_end(self, stage: str) -> None:
        for m in ("top1", "top5"):
            metric = self.eval_metrics[stage][m]
            if metric.update_count:
                self.log(f"{stage}/{m}", metric.compute(), on_step=False, on_epoch=True)
            metric.reset()
        rows = self._open.pop(stage, [])
        if rows:
            table = torch.cat(rows)
            if self.trainer.world_size > 1:  # every rank holds an equal-length padded shard
                table = self.all_gather(table).reshape(-1, table.shape[1])
            idx = table[:, -1].long()
            order = torch.argsort(idx, stable=True)
            table, idx = table[order], idx[order]
            first = torch.ones_like(idx, dtype=torch.bool)
            first[1:] = idx[1:] != idx[:-1]  # drop the padding's repeats
            table = table[first]
            emb, ident, role = table[:, :-3], table[:, -3].long(), table[:, -2].long()
            g, p = role == 0, role == 1
            res = identification_metrics(emb[g], ident[g], emb[p], ident[p], far=self.far)
            records = self._item_records(stage)
            if records is not None and math.isfinite(res["rank1"]):
                self._record_probes(records, emb[g], ident[g], emb[p], ident[p], table[:, -1].long()[p])
            for k in ("rank1", "tar_at_far"):
                if math.isfinite(res[k]):
                    self.log(f"{stage}/open_{'tar_far' if k == 'tar_at_far' else k}", res[k], on_step=False,
                             on_epoch=True, sync_dist=False)
        if stage == "test":
            dm = getattr(self.trainer, "datamodule", None)
            if dm is not None and hasattr(dm, "floor_metrics"):  # the no-training levels of the same split
                for k, v in dm.floor_metrics(stage).items():
                    if math.isfinite(v):
                        self.log(f"test/{k}", v, on_step=False, on_epoch=True, sync_dist=False)
            for k, v in self._perf.items():
                if k != "train_steps_timed" and math.isfinite(v):
                    self.log(f"test/{k}", v, on_step=False, on_epoch=True, sync_dist=False)
