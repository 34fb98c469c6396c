"""Your own query -> document pairs for the dual-encoder retriever, encoded once and cached.

A JSON Lines file, one object per query, with one positive document or a list of them::

    {"query": "how do I sort a list", "positive": ["use sorted()", "list.sort() sorts in place"]}
    {"query": "capital of France", "positive": "Paris"}

or a CSV / TSV file with one ``query, positive`` pair per row (a repeated query collects every
positive given to it). Identical queries are merged and identical documents are one document,
as in the bundled chatterbot set. The texts are encoded with any local sentence-transformers
model folder (``model_path``; default: the bundled all-MiniLM-L6-v2) and cached on disk exactly
as the bundled sets are (:func:`~lightning_modules.data.embedding_cache.cached_encode`: keyed by
the texts and the model's files, under ``$LOSSES_CACHE_DIR`` or ``cache_dir``); nothing is
downloaded. Splits, batches, negatives and evaluation are those of
:class:`~lightning_modules.data.RetrievalDataModule` (whose code this reuses); ``num_classes``,
``num_items`` and ``input_dim`` (the model's embedding width) are linked into the model::

    python -m lightning_modules fit --config configs/own_data/pairs.yaml \\
        --data.init_args.path=/path/to/pairs.jsonl
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

from ..base import BenchmarkDataModule
from .embedding_cache import MINILM_DIM, MiniLMEncoder
from .retrieval import RetrievalCorpus, RetrievalDataModule

__all__ = ["PairsDataModule", "read_pairs", "sentence_embedding_dim"]


def _fail(problem: str, got: object, hint: str) -> None:
    raise ValueError(f"PairsDataModule: {problem} (got {got!r}); {hint}")


def read_pairs(path: str, *, query_field: str = "query", positive_field: str = "positive",
               format: Optional[str] = None) -> RetrievalCorpus:
    """The queries, documents and positives of a JSONL / CSV / TSV pairs file (module docstring)."""
    p = Path(path).expanduser()
    if not p.is_file():
        _fail("no pairs file at path", str(path), "pass a .jsonl, .csv or .tsv file")
    fmt = format or {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv"}.get(p.suffix.lower())
    if fmt not in ("jsonl", "csv", "tsv"):
        _fail("unknown file format; use jsonl, csv or tsv", format or p.suffix, "name the file accordingly or pass "
              "format")
    rows: List[tuple] = []
    with open(p, encoding="utf-8", newline="") as fh:
        if fmt == "jsonl":
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as exc:
                    _fail(f"line {n} is not JSON", line[:80], f"one JSON object per line ({exc})")
                if query_field not in obj or positive_field not in obj:
                    _fail(f"line {n} lacks {query_field!r} or {positive_field!r}", sorted(obj),
                          "set query_field / positive_field")
                pos = obj[positive_field]
                for d in (pos if isinstance(pos, list) else [pos]):
                    rows.append((obj[query_field], d))
        else:
            reader = csv.DictReader(fh, delimiter="," if fmt == "csv" else "\t")
            for row in reader:
                if query_field not in row or positive_field not in row:
                    _fail(f"the header lacks {query_field!r} or {positive_field!r}", reader.fieldnames,
                          "set query_field / positive_field")
                rows.append((row[query_field], row[positive_field]))
    queries: Dict[str, int] = {}
    docs: Dict[str, int] = {}
    positives: List[List[int]] = []
    for q, d in rows:
        q, d = " ".join(str(q).split()), " ".join(str(d).split())
        if not q or not d:
            continue
        qi = queries.setdefault(q, len(queries))
        di = docs.setdefault(d, len(docs))
        if qi == len(positives):
            positives.append([])
        if di not in positives[qi]:
            positives[qi].append(di)
    if len(queries) < 3:
        _fail("needs at least 3 distinct queries (train, val and test)", len(queries), "add pairs")
    counts = [len(x) for x in positives]
    meta = {"dataset": f"pairs:{p.name}", "sys_version": sys.version, "pairs": sum(counts), "queries": len(queries),
            "documents": len(docs), "multi_positive_queries": sum(c > 1 for c in counts), "max_positives": max(counts)}
    return RetrievalCorpus(f"pairs:{p.name}", tuple(queries), tuple(docs), tuple(tuple(x) for x in positives), meta)


def sentence_embedding_dim(model_path: str) -> int:
    """Embedding width of a saved sentence-transformers model, read from its module configs
    (the last ``Dense`` layer's ``out_features``, else the pooling width times its modes); loads
    the model only when the configs do not say."""
    folder = Path(model_path).expanduser()
    modules = folder / "modules.json"
    if modules.is_file():
        for mod in reversed(json.loads(modules.read_text())):
            cfg = folder / mod.get("path", "") / "config.json"
            if not mod.get("path") or not cfg.is_file():
                continue
            conf = json.loads(cfg.read_text())
            if "out_features" in conf:
                return int(conf["out_features"])
            if "word_embedding_dimension" in conf:
                modes = sum(bool(v) for k, v in conf.items() if k.startswith("pooling_mode_"))
                return int(conf["word_embedding_dimension"]) * max(modes, 1)
    encoder = MiniLMEncoder(path=str(folder))
    return int(encoder._load().get_sentence_embedding_dimension())


class PairsDataModule(RetrievalDataModule):
    """Dense retrieval on your own pairs file (module docstring).

    Args:
        path: the JSONL / CSV / TSV file.
        query_field, positive_field: field (column) names.
        format: ``"jsonl"``, ``"csv"`` or ``"tsv"`` (``None``: from the suffix).
        model_path: a local sentence-transformers model folder (``None``: the bundled MiniLM).
        val_size, test_size: validation / test queries (default: 10 % each, at least 1).
        corpus_scope: ``"all"`` (default: every split searches all documents) or ``"split"``.
        the rest: as :class:`~lightning_modules.data.RetrievalDataModule`.
    """

    def __init__(
        self,
        path: str,
        *,
        query_field: str = "query",
        positive_field: str = "positive",
        format: Optional[str] = None,
        model_path: Optional[str] = None,
        val_size: Optional[int] = None,
        test_size: Optional[int] = None,
        corpus_scope: str = "all",
        batch_size: int = 64,
        eval_batch_size: int = 256,
        num_negatives: int = 0,
        seed: int = 0,
        max_seq_length: int = 128,
        cache_dir: Optional[str] = None,
        num_workers: int = 0,
    ) -> None:
        BenchmarkDataModule.__init__(self)
        if corpus_scope not in ("split", "all"):
            _fail("corpus_scope must be 'split' or 'all'", corpus_scope, "use 'all'")
        self.path, self.model_path = str(path), model_path
        self.corpus = read_pairs(path, query_field=query_field, positive_field=positive_field, format=format)
        nq = len(self.corpus.queries)
        default = max(1, round(0.1 * nq))
        self.dataset = f"pairs-{Path(path).stem}"
        self.val_size = default if val_size is None else int(val_size)
        self.test_size = default if test_size is None else int(test_size)
        self.corpus_scope = corpus_scope
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)
        self.num_negatives, self.seed = int(num_negatives), int(seed)
        self.max_seq_length, self.cache_dir, self.num_workers = int(max_seq_length), cache_dir, int(num_workers)
        self.save_hyperparameters()
        self._init_splits()

    def _embedding_dim(self) -> int:
        return MINILM_DIM if self.model_path is None else sentence_embedding_dim(self.model_path)

    def _encoder(self):
        return MiniLMEncoder(max_seq_length=self.max_seq_length, path=self.model_path)
