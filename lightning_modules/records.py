"""Per-item test records: one row per test item with the quantities behind each logged test metric.

A test run logs aggregates (``test/top1``, ``test/recall@20``, ...). A two-level bootstrap over
training seeds and test items needs the per-item values behind them, in a stable item order.
:class:`TestItemRecorder` is a callback that, during ``test`` only, has the benchmark module record
those values and writes them to one ``.npz`` file at the end of the test::

    trainer = pl.Trainer(callbacks=[TestItemRecorder("runs/seed0/test_items.npz")])
    trainer.test(model, datamodule=dm)
    records = load_test_items("runs/seed0/test_items.npz")
    records.aggregate()          # {"test/top1": ..., ...}: the logged test metrics, from the rows

or from the command line (``lightning_modules.cli``)::

    python -m lightning_modules test --config RECIPE.yaml --ckpt_path=CKPT \\
        --trainer.callbacks+=lightning_modules.records.TestItemRecorder \\
        --trainer.callbacks.path=runs/seed0/test_items.npz

Off by default: without the callback the modules compute nothing extra (one attribute check per
test batch). ``fit`` / ``validate`` never record (the callback acts on ``test`` alone).

**File.** A NumPy ``.npz`` (compressed) holding one array per column, named ``<table>/<column>``,
and ``header``: a JSON string (a 0-d unicode array, loadable without pickle) with

* ``format`` (``"test-item-records"``), ``version``, ``module`` (the LightningModule's class),
  ``kind`` (``classifier``, ``segmentation``, ``recommendation``, ``retrieval``, ``many_class``,
  ``language_model``), ``datamodule``, ``test_split`` (the DataModule's test-split fingerprint, where
  it has one), ``world_size``;
* ``tables``: per table its number of ``rows``, its ``key`` column (``item``: the item id, rows
  sorted by it and unique) and ``columns`` (name -> what it holds);
* ``metrics``: per logged metric (``test/...``) the table, the columns and the aggregation that
  gives the logged value back from the rows (:func:`aggregate_metric`);
* ``logged``: the scalar ``test/...`` metrics the run logged, as floats.

**Item ids.** Recommendation rows are users (the user id), retrieval rows queries (the query id),
open-set rows probes (their index in the open-set split); the other tables are keyed by the item's
position in its test loader's order (the test split's own order: the loaders do not shuffle at
test), read from the loader's sampler (a ``DistributedSampler`` under DDP), so a DDP run gives the
same ids as one process. Under DDP every rank records its own items; the callback gathers them
(``all_gather_object``), drops the padding's repeats by item id and rank 0 writes the file.

**Aggregations** (``metrics[name]["agg"]``): ``mean`` (mean of a column over the rows), ``nanmean``
(rows holding ``nan`` do not count: a view's users without positives), ``ratio`` (sum / sum:
token-weighted means of the language model, pixel accuracy), ``exp_ratio`` (``exp`` of a ratio:
perplexities), ``std_ratio`` (population standard deviation from per-row sums, sums of squares and
counts), ``class_mean`` (mean over classes of the per-class mean of a column: balanced and per-class
accuracy, head / tail accuracy; classes without rows do not count), ``ece`` (top-label expected
calibration error of equal-width bins, as torchmetrics computes it), ``aurc`` and ``set_ratio``
(per class ``sum(a) / sum(b)`` over the rows, then the mean over the classes with a non-zero
denominator: the segmentation Dice / IoU of the whole set).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import pytorch_lightning as pl
import torch
from torch import Tensor

__all__ = ["TestItemRecorder", "ItemRecords", "TestItems", "load_test_items", "aggregate_metric",
           "ranking_per_query", "FORMAT", "VERSION"]

FORMAT = "test-item-records"
VERSION = 1


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        value = value.detach()
        if value.dtype == torch.bfloat16 or value.dtype == torch.float16:
            value = value.float()
        return value.cpu().numpy()
    return np.asarray(value)


class ItemRecords:
    """The rows of one test run, collected by the module while :class:`TestItemRecorder` is attached.

    A module calls :meth:`positions` for the ids of a positional table and :meth:`add` with one
    tensor per column (first dimension: the batch's items; an ``item`` column among them)."""

    def __init__(self, trainer: Optional["pl.Trainer"] = None) -> None:
        self.trainer = trainer
        self._rows: Dict[str, Dict[str, List[np.ndarray]]] = {}
        self._seen: Dict[int, int] = {}
        self._orders: Dict[int, Optional[List[int]]] = {}

    # -- item ids --------------------------------------------------------------------------------
    def _loader_order(self, dataloader_idx: int) -> Optional[List[int]]:
        """The indices the test loader ``dataloader_idx`` reads on this rank, in order (its
        sequential or non-shuffling distributed sampler); ``None`` when they cannot be known."""
        from torch.utils.data import DistributedSampler, SequentialSampler

        trainer = self.trainer
        loaders = getattr(trainer, "test_dataloaders", None) if trainer is not None else None
        if loaders is None:
            return None
        if not isinstance(loaders, (list, tuple)):
            loaders = [loaders]
        if dataloader_idx >= len(loaders):
            return None
        sampler = getattr(loaders[dataloader_idx], "sampler", None)
        if isinstance(sampler, SequentialSampler) or (isinstance(sampler, DistributedSampler) and not sampler.shuffle):
            return [int(i) for i in iter(sampler)]
        return None

    def positions(self, n: int, dataloader_idx: int = 0) -> Tensor:
        """Ids of the next ``n`` items of test loader ``dataloader_idx``: their indices in the
        test split (the loader's sampler order; rank ``r`` of ``W`` without a readable sampler:
        ``r + W * position``, a non-shuffling ``DistributedSampler``'s order)."""
        if dataloader_idx not in self._orders:
            self._orders[dataloader_idx] = self._loader_order(dataloader_idx)
        start = self._seen.get(dataloader_idx, 0)
        self._seen[dataloader_idx] = start + int(n)
        order = self._orders[dataloader_idx]
        if order is not None and start + n <= len(order):
            return torch.tensor(order[start:start + n], dtype=torch.long)
        world = int(getattr(self.trainer, "world_size", 1) or 1) if self.trainer is not None else 1
        rank = int(getattr(self.trainer, "global_rank", 0) or 0) if self.trainer is not None else 0
        return rank + world * torch.arange(start, start + int(n), dtype=torch.long)

    # -- rows ------------------------------------------------------------------------------------
    def add(self, table: str, **columns: Any) -> None:
        """Append rows to ``table``: one value per item in each column (``item`` required)."""
        if "item" not in columns:
            raise ValueError(f"ItemRecords.add: every table needs an 'item' column (got {sorted(columns)} for "
                             f"{table!r})")
        arrays = {k: _numpy(v) for k, v in columns.items()}
        n = arrays["item"].shape[0]
        for k, v in arrays.items():
            if v.ndim == 0 or v.shape[0] != n:
                raise ValueError(f"ItemRecords.add: column {k!r} of {table!r} has shape {v.shape}, not {n} rows "
                                 "(one value per item)")
        rows = self._rows.setdefault(table, {})
        if rows and set(rows) != set(arrays):
            raise ValueError(f"ItemRecords.add: table {table!r} got columns {sorted(arrays)} after {sorted(rows)}")
        for k, v in arrays.items():
            rows.setdefault(k, []).append(v)

    def local_tables(self) -> Dict[str, Dict[str, np.ndarray]]:
        """This process's rows, concatenated per column."""
        return {t: {k: np.concatenate(v) for k, v in cols.items()} for t, cols in self._rows.items()}


def _merge(parts: Sequence[Mapping[str, Mapping[str, np.ndarray]]]) -> Dict[str, Dict[str, np.ndarray]]:
    """The tables of every rank joined, one row per item id (the first one seen), sorted by it."""
    out: Dict[str, Dict[str, np.ndarray]] = {}
    names = []
    for part in parts:
        for t in part:
            if t not in names:
                names.append(t)
    for t in names:
        pieces = [p[t] for p in parts if t in p]
        cols = {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}
        _, first = np.unique(cols["item"], return_index=True)  # sorted ids, the first row of each
        out[t] = {k: v[first] for k, v in cols.items()}
    return out


class TestItemRecorder(pl.Callback):
    """Write the per-item test records of a benchmark module to ``path`` (module docstring).

    Args:
        path: the ``.npz`` file to write (folders are created; an existing file is replaced).

    The module must be a benchmark module (``item_record_spec``); others raise ``TypeError``.
    Nothing happens in ``fit`` / ``validate`` / ``predict``.
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, path: str) -> None:
        super().__init__()
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise ValueError(f"TestItemRecorder: path must be a file name (got {path!r}); "
                             "pass e.g. runs/seed0/test_items.npz")
        self.path = os.fspath(path)
        self.written: Optional[str] = None

    def on_test_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if not callable(getattr(pl_module, "item_record_spec", None)):
            raise TypeError(f"TestItemRecorder: {type(pl_module).__name__} does not record test items; use a "
                            "lightning_modules benchmark module (VisionClassifier, Recommender, ...)")
        pl_module.item_records = ItemRecords(trainer)

    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        if getattr(pl_module, "item_records", None) is not None:
            pl_module.item_records = None

    def on_test_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        records = getattr(pl_module, "item_records", None)
        pl_module.item_records = None
        if records is None:
            return
        local = records.local_tables()
        world = int(trainer.world_size or 1)
        if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            parts: List[Any] = [None] * world
            torch.distributed.all_gather_object(parts, local)
        else:
            parts = [local]
        tables = _merge(parts)
        if trainer.is_global_zero:
            self.written = write_test_items(self.path, tables, self._header(trainer, pl_module, tables))
        if world > 1:
            trainer.strategy.barrier("test_item_records")

    @staticmethod
    def _header(trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                tables: Mapping[str, Mapping[str, np.ndarray]]) -> Dict[str, Any]:
        spec = pl_module.item_record_spec()
        dm = getattr(trainer, "datamodule", None)
        split = None
        if callable(getattr(dm, "test_split_fingerprint", None)):
            try:
                split = str(dm.test_split_fingerprint())
            except Exception:  # pragma: no cover - a DataModule that cannot name its split
                split = None
        logged = {}
        for k, v in trainer.callback_metrics.items():
            if k.startswith("test/") and torch.is_tensor(v) and v.numel() == 1:
                logged[k] = float(v)
        declared = spec.get("tables", {})
        out_tables = {}
        for t, cols in tables.items():
            docs = dict(declared.get(t, {}).get("columns", {}))
            out_tables[t] = {"rows": int(cols["item"].shape[0]), "key": "item",
                             "columns": {k: docs.get(k, "") for k in cols}}
        metrics = {k: v for k, v in spec.get("metrics", {}).items() if v["table"] in tables}
        return {"format": FORMAT, "version": VERSION, "module": type(pl_module).__name__, "kind": spec.get("kind"),
                "datamodule": type(dm).__name__ if dm is not None else None, "test_split": split,
                "world_size": int(trainer.world_size or 1), "tables": out_tables, "metrics": metrics,
                "notes": spec.get("notes", ""), "logged": logged}


def write_test_items(path: str, tables: Mapping[str, Mapping[str, np.ndarray]], header: Mapping[str, Any]) -> str:
    """Write ``tables`` and ``header`` as one ``.npz`` (atomically: a temporary file, then a rename)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    arrays = {f"{t}/{k}": np.ascontiguousarray(v) for t, cols in tables.items() for k, v in cols.items()}
    arrays["header"] = np.array(json.dumps(header, sort_keys=True, allow_nan=True))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        np.savez_compressed(fh, **arrays)
    os.replace(tmp, path)
    return path


class TestItems:
    """A records file read back: :attr:`header` (dict) and :attr:`tables` (``{table: {column: array}}``)."""

    __test__ = False

    def __init__(self, header: Dict[str, Any], tables: Dict[str, Dict[str, np.ndarray]]) -> None:
        self.header = header
        self.tables = tables

    def aggregate(self, rows: Optional[Mapping[str, np.ndarray]] = None) -> Dict[str, float]:
        """Every declared metric from the rows (``rows``: per table the row indices to use, e.g. a
        bootstrap resample; all rows by default)."""
        out = {}
        for name, spec in self.header["metrics"].items():
            table = self.tables[spec["table"]]
            if rows is not None and spec["table"] in rows:
                idx = np.asarray(rows[spec["table"]])
                table = {k: v[idx] for k, v in table.items()}
            out[name] = aggregate_metric(spec, table)
        return out


def load_test_items(path: str) -> TestItems:
    """Read a file written by :class:`TestItemRecorder`."""
    with np.load(path, allow_pickle=False) as data:
        header = json.loads(str(data["header"]))
        if header.get("format") != FORMAT:
            raise ValueError(f"load_test_items: {path} is not a test-item records file (format "
                             f"{header.get('format')!r})")
        tables: Dict[str, Dict[str, np.ndarray]] = {}
        for key in data.files:
            if key == "header":
                continue
            t, _, col = key.partition("/")
            tables.setdefault(t, {})[col] = data[key]
    return TestItems(header, tables)


# -- aggregations -----------------------------------------------------------------------------------
def _class_mean(values: np.ndarray, classes: np.ndarray, which: Optional[Sequence[int]]) -> float:
    values = values.astype(np.float64)
    present = np.unique(classes)
    if which is not None:
        present = np.intersect1d(present, np.asarray(which, dtype=present.dtype))
    if present.size == 0:
        return float("nan")
    return float(np.mean([values[classes == c].mean() for c in present]))


def _ece(confidence: np.ndarray, correct: np.ndarray, bins: int) -> float:
    conf = torch.as_tensor(confidence, dtype=torch.float32)
    acc = torch.as_tensor(correct).to(torch.float32)
    if conf.numel() == 0:
        return float("nan")
    boundaries = torch.linspace(0, 1, int(bins) + 1, dtype=conf.dtype)
    idx = torch.bucketize(conf, boundaries, right=True) - 1
    count = torch.zeros(len(boundaries), dtype=conf.dtype).scatter_add_(0, idx, torch.ones_like(conf))
    conf_bin = torch.nan_to_num(torch.zeros_like(count).scatter_add_(0, idx, conf) / count)
    acc_bin = torch.nan_to_num(torch.zeros_like(count).scatter_add_(0, idx, acc) / count)
    return float(torch.sum(torch.abs(acc_bin - conf_bin) * count / count.sum()))


def aggregate_metric(spec: Mapping[str, Any], table: Mapping[str, np.ndarray]) -> float:
    """One metric from the rows of its table, by ``spec["agg"]`` (module docstring)."""
    agg, cols = spec["agg"], [table[c] for c in spec["columns"]]
    if agg == "mean":
        return float(np.mean(cols[0].astype(np.float64))) if cols[0].size else float("nan")
    if agg == "nanmean":
        v = cols[0].astype(np.float64)
        v = v[~np.isnan(v)]
        return float(v.mean()) if v.size else float("nan")
    if agg in ("ratio", "exp_ratio"):
        num, den = cols[0].astype(np.float64).sum(), cols[1].astype(np.float64).sum()
        r = num / den if den > 0 else float("nan")
        return float(math.exp(r)) if agg == "exp_ratio" else float(r)
    if agg == "std_ratio":
        s, sq, n = (c.astype(np.float64).sum() for c in cols)
        if n <= 0:
            return float("nan")
        mean = s / n
        return float(math.sqrt(max(sq / n - mean * mean, 0.0)))
    if agg == "class_mean":
        return _class_mean(cols[0], cols[1], spec.get("classes"))
    if agg == "ece":
        return _ece(cols[0], cols[1], spec.get("bins", 15))
    if agg == "aurc":
        from .confidence import aurc

        return aurc(torch.as_tensor(cols[0], dtype=torch.float64), torch.as_tensor(cols[1]).double()) \
            if cols[0].size else float("nan")
    if agg == "set_ratio":  # per class sum(num) / sum(den) (den = (a + b) - offset * num), then the macro mean
        num = cols[0].astype(np.float64).sum(0)
        den = sum(c.astype(np.float64).sum(0) for c in cols[1:]) - float(spec.get("subtract", 0.0)) * num
        scale = float(spec.get("scale", 1.0))
        classes = np.arange(num.shape[0])[int(spec.get("first_class", 0)):]
        keep = [c for c in classes if den[c] > 0]
        return float(np.mean([scale * num[c] / den[c] for c in keep])) if keep else float("nan")
    raise ValueError(f"aggregate_metric: unknown aggregation {agg!r}")


# -- ranking metrics per query ----------------------------------------------------------------------
def ranking_per_query(preds: Tensor, target: Tensor, indexes: Tensor,
                      metrics: Sequence[tuple]) -> Dict[str, Tensor]:
    """Per-query ranking metrics from torchmetrics' flat candidate lists.

    ``preds, target, indexes``: one candidate per entry (``preds`` distinct within a query, larger
    ranked first, as :func:`~lightning_modules.retrieval_metrics.candidates_from_scores` and
    ``candidates_from_search`` give them, every positive included). ``metrics``: ``(name, kind, k,
    empty)`` with ``kind`` one of ``recall``, ``ndcg``, ``hr``, ``mrr`` and ``empty`` the value of a
    query without positives (``0.0``: torchmetrics' ``"neg"``; ``nan``: ``"skip"``). Returns
    ``query`` (the sorted distinct query ids), ``n_pos`` and one float64 column per metric: the
    values torchmetrics averages over queries (binary relevance)."""
    preds, target, indexes = preds.detach().double().cpu(), target.detach().bool().cpu(), indexes.detach().long().cpu()
    order = torch.argsort(preds, descending=True, stable=True)
    order = order[torch.argsort(indexes[order], stable=True)]
    t, q = target[order], indexes[order]
    query, group, counts = torch.unique_consecutive(q, return_inverse=True, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(q.numel()) - starts[group]  # rank of each candidate within its query, from 0
    nq = query.numel()
    tf = t.double()
    n_pos = torch.zeros(nq, dtype=torch.float64).index_add_(0, group, tf)
    gain = 1.0 / torch.log2(pos.double() + 2.0)
    out: Dict[str, Tensor] = {"query": query, "n_pos": n_pos}
    for name, kind, k, empty in metrics:
        k = int(k)
        top = (pos < k).double()
        if kind in ("recall", "hr"):
            hits = torch.zeros(nq, dtype=torch.float64).index_add_(0, group, tf * top)
            v = hits / n_pos.clamp_min(1) if kind == "recall" else (hits > 0).double()
        elif kind == "ndcg":
            dcg = torch.zeros(nq, dtype=torch.float64).index_add_(0, group, tf * top * gain)
            m = torch.minimum(n_pos, torch.full_like(n_pos, k)).long()
            cum = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(1.0 / torch.log2(
                torch.arange(k, dtype=torch.float64) + 2.0), 0)])
            idcg = cum[m]
            v = torch.where(idcg > 0, dcg / idcg.clamp_min(1e-300), torch.zeros_like(dcg))
        elif kind == "mrr":
            big = torch.full((q.numel(),), float(k), dtype=torch.float64)
            first = torch.full((nq,), float(k), dtype=torch.float64).scatter_reduce(
                0, group, torch.where(t & (pos < k), pos.double(), big), reduce="amin")
            v = torch.where(first < k, 1.0 / (first + 1.0), torch.zeros_like(first))
        else:
            raise ValueError(f"ranking_per_query: unknown metric kind {kind!r}")
        out[name] = torch.where(n_pos > 0, v, torch.full_like(v, float(empty)))
    return out
