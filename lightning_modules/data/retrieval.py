"""Dense-retrieval data: CPython standard-library code search and chatterbot-corpus Q -> A.

Both sets are built from installed files at run time (docs/benchmarks.md) and encoded once with
all-MiniLM-L6-v2 (:mod:`.embedding_cache`); models train small towers on the cached vectors.

* ``stdlib`` (single positive): query = first paragraph of a function docstring (whitespace
  collapsed, >= 20 characters), document = the function without its docstring
  (``ast.unparse``, truncated to 1,500 characters); files and directories named ``test*``,
  ``idlelib`` and ``site-packages`` are skipped, duplicate summaries keep their first function
  (files in sorted order). The set depends on the Python minor version, so ``sys.version`` and
  the pair count are recorded in :attr:`RetrievalCorpus.meta` and in the cache metadata.
* ``chatterbot`` (multi-positive): every English conversation's first utterance is a query and
  its reply a positive; identical queries are merged, so one query has every reply given to it
  as a positive (and a reply shared by several queries is one document).
"""

from __future__ import annotations

import ast
import collections
import copy
import functools
import hashlib
import json
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import DataLoader

from ..base import BenchmarkDataModule, IndexDataset, WorkerGenerator, check_test_seed, split_fingerprint
from ..progress import progress_bar, progress_note
from .embedding_cache import MINILM_DIM, MiniLMEncoder, atomic_write, cache_folder, cached_encode, package_dir

__all__ = [
    "RetrievalCorpus",
    "stdlib_code_search_pairs",
    "chatterbot_pairs",
    "split_queries",
    "subset_corpus",
    "RetrievalDataModule",
]

DATASETS = ("stdlib", "chatterbot")


@dataclass(frozen=True)
class RetrievalCorpus:
    """Queries, documents and each query's positive document ids."""

    name: str
    queries: Tuple[str, ...]
    documents: Tuple[str, ...]
    positives: Tuple[Tuple[int, ...], ...]
    meta: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.queries) != len(self.positives):
            raise ValueError("RetrievalCorpus: one positive list per query is required")


def _summary(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n")[0].split())


def _skip_name(name: str, exclude_tests: bool = True) -> bool:
    return name in ("idlelib", "site-packages", "__pycache__") or (exclude_tests and name.startswith("test"))


def _stdlib_files(root: str, exclude_tests: bool = True) -> List[str]:
    """The ``.py`` files under ``root`` in walk order (folders and files sorted), relative to it:
    ``site-packages``, ``idlelib`` and ``__pycache__`` skipped, ``test*`` files and folders too
    unless ``exclude_tests=False`` (the files the extraction reads)."""
    out: List[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not _skip_name(d, exclude_tests))
        for fn in sorted(filenames):
            if fn.endswith(".py") and not _skip_name(fn, exclude_tests):
                out.append(os.path.relpath(os.path.join(dirpath, fn), root))
    return out


PAIRS_FORMAT = 1  #: bump when the extraction rules change (invalidates cached pair files)


#: the fields that hold statements (of modules, statements, ``except`` handlers and ``case`` blocks):
#: a function definition is a statement, and no statement sits inside an expression
_STATEMENT_FIELDS = frozenset({"body", "orelse", "finalbody", "handlers", "cases"})


def _function_defs(tree: ast.AST) -> List[ast.AST]:
    """The ``def`` / ``async def`` nodes of ``tree`` in :func:`ast.walk`'s (breadth-first) order.

    The same nodes in the same order as filtering :func:`ast.walk`, several times faster on the
    standard library: the walk follows only the statement lists and never enters an expression, and
    removing whole subtrees that hold no statement keeps the breadth-first order of the rest."""
    found: List[ast.AST] = []
    todo = collections.deque([tree])
    while todo:
        node = todo.popleft()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(node)
        for name in node._fields:
            if name in _STATEMENT_FIELDS:
                value = getattr(node, name, None)
                if isinstance(value, list):
                    todo.extend(value)
    return found


@functools.lru_cache(maxsize=4)
def stdlib_code_search_pairs(
    stdlib_dir: Optional[str] = None,
    *,
    min_summary_chars: int = 20,
    max_code_chars: int = 1500,
    cache_dir: Optional[str] = None,
    use_cache: bool = True,
    progress: Optional[bool] = None,
) -> RetrievalCorpus:
    """Docstring-summary -> function-code pairs from the standard library's ``.py`` files.

    One document per query; see the module docstring for the rules. Deterministic for a given
    Python installation (files are walked in sorted order). Parsing takes seconds, so the pairs
    are cached as JSON next to the embeddings (``cache_dir``, default as
    :func:`~.embedding_cache.default_cache_dir`), keyed by ``sys.version``, the rules and every
    read file's path, size and modification time; ``use_cache=False`` always parses. While it
    parses, it prints the cache file's path and a progress bar over the files on standard error
    (``progress=False``, or ``LOSSES_PROGRESS=0`` when ``progress`` is ``None``, keeps it silent).
    """
    root = stdlib_dir or sysconfig.get_paths()["stdlib"]
    if not os.path.isdir(root):
        raise FileNotFoundError(f"stdlib_code_search_pairs: no standard library at {root!r}")
    rel_files = _stdlib_files(root)
    path = None
    if use_cache:
        h = hashlib.sha256(f"{PAIRS_FORMAT}|{sys.version}|{os.path.abspath(root)}|{min_summary_chars}|"
                           f"{max_code_chars}".encode())
        for rel in rel_files:
            st = os.stat(os.path.join(root, rel))
            h.update(f"|{rel}|{st.st_size}|{st.st_mtime_ns}".encode())
        directory = cache_folder(cache_dir)
        path = directory / f"stdlib-pairs-{h.hexdigest()[:20]}.json"
        if path.is_file():
            try:
                with open(path, encoding="utf-8") as fh:
                    blob = json.load(fh)
                return RetrievalCorpus("stdlib", tuple(blob["queries"]), tuple(blob["documents"]),
                                       tuple((i,) for i in range(len(blob["queries"]))), dict(blob["meta"]))
            except (OSError, ValueError, KeyError):
                pass  # unreadable cache: parse again
    queries: List[str] = []
    docs: List[str] = []
    seen = set()
    files = 0
    progress_note(f"stdlib_code_search_pairs: parsing {len(rel_files):,} standard-library files once"
                  + (f"; cache file: {path}" if path is not None else ""), progress)
    with progress_bar(len(rel_files), desc="parsing stdlib", unit="file", progress=progress) as bar:
        for rel in rel_files:
            bar.update(1)
            try:
                with open(os.path.join(root, rel), encoding="utf-8") as fh:
                    tree = ast.parse(fh.read())
            except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
                continue
            files += 1
            for node in _function_defs(tree):
                doc = ast.get_docstring(node)
                if not doc or len(node.body) < 2:  # no docstring, or nothing but the docstring
                    continue
                query = _summary(doc)
                if len(query) < min_summary_chars or query in seen:
                    continue
                seen.add(query)
                stripped = copy.copy(node)
                stripped.body = node.body[1:]
                queries.append(query)
                docs.append(ast.unparse(stripped)[:max_code_chars])
    meta = {
        "dataset": "stdlib",
        "sys_version": sys.version,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "stdlib_dir": root,
        "files": files,
        "pairs": len(queries),
        "queries": len(queries),
        "documents": len(docs),
    }
    if path is not None:
        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump({"queries": queries, "documents": docs, "meta": meta}, fh)

        atomic_write(path, write)
    return RetrievalCorpus("stdlib", tuple(queries), tuple(docs), tuple((i,) for i in range(len(queries))), meta)


@functools.lru_cache(maxsize=2)
def chatterbot_pairs(language: str = "english") -> RetrievalCorpus:
    """Question -> answers from the ``chatterbot-corpus`` wheel's YAML files (multi-positive)."""
    base = package_dir("chatterbot_corpus", dist="chatterbot-corpus", pip="pip install chatterbot-corpus",
                       what="The chatterbot Q -> A retrieval set")
    folder = base / "data" / language
    files = sorted(folder.glob("*.yml"))
    if not files:
        raise FileNotFoundError(f"chatterbot_pairs: no YAML files under {folder}")
    import yaml

    queries: Dict[str, int] = {}
    docs: Dict[str, int] = {}
    positives: List[List[int]] = []
    raw_pairs = 0
    for f in files:
        with open(f, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
        for conv in data.get("conversations") or []:
            if not isinstance(conv, list) or len(conv) < 2:
                continue
            q, a = " ".join(str(conv[0]).split()), " ".join(str(conv[1]).split())
            if not q or not a:
                continue
            raw_pairs += 1
            qi = queries.setdefault(q, len(queries))
            di = docs.setdefault(a, len(docs))
            if qi == len(positives):
                positives.append([])
            if di not in positives[qi]:
                positives[qi].append(di)
    counts = [len(p) for p in positives]
    meta = {
        "dataset": "chatterbot",
        "language": language,
        "sys_version": sys.version,
        "raw_pairs": raw_pairs,
        "pairs": sum(counts),
        "queries": len(queries),
        "documents": len(docs),
        "multi_positive_queries": sum(c > 1 for c in counts),
        "max_positives": max(counts) if counts else 0,
    }
    return RetrievalCorpus("chatterbot", tuple(queries), tuple(docs), tuple(tuple(p) for p in positives), meta)


def subset_corpus(corpus: RetrievalCorpus, max_queries: int, *, seed: int = 0) -> RetrievalCorpus:
    """``max_queries`` queries of ``corpus`` drawn with ``seed`` (kept in their original order) and
    only the documents they reference, renumbered; the whole corpus when it has no more queries.

    The meta gains ``subset_of`` (the full query count) and ``max_queries``; the embedding cache
    keys on the texts, so a subset is encoded (and cached) on its own.
    """
    nq = len(corpus.queries)
    if max_queries >= nq:
        return corpus
    keep = torch.randperm(nq, generator=torch.Generator().manual_seed(seed))[:max_queries].sort().values.tolist()
    docs = sorted({d for q in keep for d in corpus.positives[q]})
    new_id = {d: j for j, d in enumerate(docs)}
    return RetrievalCorpus(
        name=corpus.name,
        queries=tuple(corpus.queries[q] for q in keep),
        documents=tuple(corpus.documents[d] for d in docs),
        positives=tuple(tuple(new_id[d] for d in corpus.positives[q]) for q in keep),
        meta={**corpus.meta, "subset_of": nq, "max_queries": max_queries, "queries": max_queries,
              "documents": len(docs), "pairs": sum(len(corpus.positives[q]) for q in keep)},
    )


def split_queries(num_queries: int, val_size: int, test_size: int, seed: int,
                  test_seed: Optional[int] = None) -> Dict[str, torch.Tensor]:
    """Seeded random disjoint ``train``/``val``/``test`` query index sets (sorted). With ``test_seed``
    the test queries are drawn from ``test_seed`` alone (the same for every ``seed``) and ``seed``
    splits the remaining queries (ascending) into validation and training."""
    if val_size < 0 or test_size < 0 or val_size + test_size >= num_queries:
        raise ValueError(f"split_queries: val_size + test_size must be < the number of queries (got {val_size} + "
                         f"{test_size} for {num_queries}); use smaller splits")
    if test_seed is not None:
        test = torch.randperm(num_queries, generator=torch.Generator().manual_seed(int(test_seed)))[:test_size]
        keep = torch.ones(num_queries, dtype=torch.bool)
        keep[test] = False
        rest = torch.nonzero(keep).flatten()
        rest = rest[torch.randperm(rest.numel(), generator=torch.Generator().manual_seed(seed))]
        val, train = rest[:val_size], rest[val_size:]
        return {"train": train.sort().values, "val": val.sort().values, "test": test.sort().values}
    perm = torch.randperm(num_queries, generator=torch.Generator().manual_seed(seed))
    test, val, train = perm[:test_size], perm[test_size:test_size + val_size], perm[test_size + val_size:]
    return {"train": train.sort().values, "val": val.sort().values, "test": test.sort().values}


class _TrainCollate:
    """Builds an in-batch (plus sampled negatives) training batch from query positions."""

    def __init__(self, dm: "RetrievalDataModule") -> None:
        self.dm = dm
        self._rng = WorkerGenerator(dm.seed + 1)  # distinct per DataLoader worker and epoch

    @property
    def generator(self) -> torch.Generator:
        return self._rng.get()

    def __call__(self, items: Sequence[int]) -> Dict[str, torch.Tensor]:
        dm = self.dm
        rows = dm._split_queries["train"][torch.as_tensor(list(items), dtype=torch.long)]
        pos_lists = [dm._train_positives[int(q)] for q in rows]
        # one labelled positive per query (the class id for "embeddings" losses, the positive for "pairs")
        label = torch.tensor([p[int(torch.randint(len(p), (1,), generator=self.generator))] for p in pos_lists],
                             dtype=torch.long)
        keys = sorted({d for p in pos_lists for d in p})
        if dm.num_negatives > 0:
            n_corpus = len(dm._train_corpus)
            extra = torch.randperm(n_corpus, generator=self.generator)[: dm.num_negatives + len(keys)].tolist()
            present = set(keys)
            keys = keys + [d for d in extra if d not in present][: dm.num_negatives]
        key_ids = torch.tensor(keys, dtype=torch.long)
        where = {d: j for j, d in enumerate(keys)}
        target = torch.zeros(len(rows), len(keys), dtype=torch.bool)
        for i, p in enumerate(pos_lists):
            target[i, [where[d] for d in p]] = True
        return {
            "query": dm._query_emb[rows],
            "query_ids": rows,
            "keys": dm._doc_emb[dm._train_corpus[key_ids]],
            "key_ids": key_ids,
            "target": target,
            "label": label,
            "label_pos": torch.tensor([where[int(d)] for d in label], dtype=torch.long),
        }


class _EvalCollate:
    def __init__(self, dm: "RetrievalDataModule", split: str) -> None:
        self.dm, self.split = dm, split

    def __call__(self, items: Sequence[int]) -> Dict[str, torch.Tensor]:
        dm = self.dm
        rows = dm._split_queries[self.split][torch.as_tensor(list(items), dtype=torch.long)]
        pos = [dm._eval_positives[self.split][int(q)] for q in rows]
        width = max(len(p) for p in pos)
        positives = torch.full((len(rows), width), -1, dtype=torch.long)
        for i, p in enumerate(pos):
            positives[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        return {"query": dm._query_emb[rows], "query_ids": rows, "positives": positives}


class RetrievalDataModule(BenchmarkDataModule):
    """Cached MiniLM embeddings of a retrieval set, split by query.

    Args:
        dataset: ``"stdlib"`` (code search, one positive) or ``"chatterbot"`` (Q -> A, several
            positives per query).
        val_size, test_size: numbers of validation / test queries (default: stdlib 250 / 1000,
            chatterbot 100 / 150).
        corpus_scope: ``"split"``: a split's corpus is the documents of its queries (stdlib
            default: held-out code is searched among held-out code); ``"all"``: every split
            searches all documents (chatterbot default). The training corpus (the classes of
            "embeddings" losses, ``num_classes``) follows the same rule.
        batch_size: training queries per batch; the keys are the union of their positives
            (in-batch negatives) plus ``num_negatives`` documents drawn from the training corpus.
        seed: split and sampling seed.
        test_seed: ``None`` (default): the test queries are drawn from ``seed`` (a new test split
            per seed). An integer: drawn from ``test_seed`` alone, the same for every ``seed``
            (protocol revision 3); ``seed`` still splits the rest into validation and training.
        max_queries: keep only this many queries (drawn with a fixed seed, the same for every
            ``seed``) and the documents they reference, e.g. for a quick look at a recipe: the
            first run encodes only their texts (``None``, the default: the whole data set).
        cache_dir: embedding cache (default ``$LOSSES_CACHE_DIR`` or ``~/.cache/softmax-losses``).

    Training batches: ``query (B, D)``, ``keys (K, D)``, ``target (B, K)`` bool (positives),
    ``key_ids (K,)`` and ``label (B,)`` (ids in the training corpus), ``label_pos (B,)`` (the
    labelled positive's column in ``keys``). Evaluation batches: ``query (B, D)``,
    ``query_ids (B,)`` and ``positives (B, P)`` (ids in the split's corpus, padded with -1);
    :meth:`corpus_embeddings` gives the corpus the model indexes.
    """

    def __init__(
        self,
        dataset: str = "chatterbot",
        *,
        val_size: Optional[int] = None,
        test_size: Optional[int] = None,
        corpus_scope: Optional[str] = None,
        batch_size: int = 64,
        eval_batch_size: int = 256,
        num_negatives: int = 0,
        seed: int = 0,
        max_queries: Optional[int] = None,
        max_seq_length: int = 128,
        cache_dir: Optional[str] = None,
        num_workers: int = 0,
        test_seed: Optional[int] = None,
    ) -> None:
        super().__init__()
        if dataset not in DATASETS:
            raise ValueError(f"RetrievalDataModule: unknown dataset (got {dataset!r}); use one of {DATASETS}")
        defaults = {"stdlib": (250, 1000, "split"), "chatterbot": (100, 150, "all")}[dataset]
        self.dataset = dataset
        self.val_size = defaults[0] if val_size is None else int(val_size)
        self.test_size = defaults[1] if test_size is None else int(test_size)
        self.corpus_scope = defaults[2] if corpus_scope is None else corpus_scope
        if self.corpus_scope not in ("split", "all"):
            raise ValueError(f"RetrievalDataModule: corpus_scope must be 'split' or 'all' (got {corpus_scope!r})")
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size)
        self.num_negatives = int(num_negatives)
        self.seed = int(seed)
        self.test_seed = check_test_seed("RetrievalDataModule", test_seed, "the test queries")
        self.max_seq_length = int(max_seq_length)
        self.cache_dir = cache_dir
        self.num_workers = int(num_workers)
        self.save_hyperparameters()

        self.corpus = stdlib_code_search_pairs() if dataset == "stdlib" else chatterbot_pairs()
        if max_queries is not None:
            if isinstance(max_queries, bool) or not isinstance(max_queries, int) or max_queries < 3:
                raise ValueError(f"RetrievalDataModule: max_queries must be None or an int >= 3 (got "
                                 f"{max_queries!r}); use None for the whole data set")
            self.corpus = subset_corpus(self.corpus, max_queries)
        self._init_splits()

    def _init_splits(self) -> None:
        """Split ``self.corpus`` by query and set the linked sizes (shared with subclasses that
        bring their own corpus and encoder)."""
        self._split_queries = split_queries(len(self.corpus.queries), self.val_size, self.test_size, self.seed,
                                            test_seed=getattr(self, "test_seed", None))
        self._corpora: Dict[str, torch.Tensor] = {}
        self._eval_positives: Dict[str, Dict[int, List[int]]] = {}
        for split, rows in self._split_queries.items():
            if self.corpus_scope == "all":
                docs = torch.arange(len(self.corpus.documents))
            else:
                docs = torch.tensor(sorted({d for q in rows.tolist() for d in self.corpus.positives[q]}),
                                    dtype=torch.long)
            self._corpora[split] = docs
            local = {int(d): j for j, d in enumerate(docs.tolist())}
            self._eval_positives[split] = {q: [local[d] for d in self.corpus.positives[q]] for q in rows.tolist()}
        self._train_corpus = self._corpora["train"]
        self._train_positives = self._eval_positives["train"]
        self.num_classes = int(len(self._train_corpus))
        self.num_items = int(len(self.corpus.documents))
        self.input_dim = self._embedding_dim()
        self._query_emb: Optional[torch.Tensor] = None
        self._doc_emb: Optional[torch.Tensor] = None
        self.embedding_info: Dict[str, Any] = {}

    # -- data -------------------------------------------------------------------------------
    def test_split_fingerprint(self) -> str:
        """:func:`~lightning_modules.base.split_fingerprint` of the test queries (indices into the
        corpus): drawn from ``seed`` (a new split per seed) unless ``test_seed`` is given."""
        return split_fingerprint(self._split_queries["test"])

    @property
    def meta(self) -> Dict[str, Any]:
        """What a result should be reported with: the data set's counts, ``sys.version``, splits."""
        return {**self.corpus.meta, "train_queries": len(self._split_queries["train"]),
                "val_queries": len(self._split_queries["val"]), "test_queries": len(self._split_queries["test"]),
                "corpus_scope": self.corpus_scope}

    def _embedding_dim(self) -> int:
        """Width of the encoder's sentence embeddings (known before encoding: it is linked)."""
        return MINILM_DIM

    def _encoder(self):
        """The text encoder (a callable with a ``version`` string, see :func:`~.embedding_cache.cached_encode`)."""
        return MiniLMEncoder(max_seq_length=self.max_seq_length)

    def _encode(self) -> None:
        texts = list(self.corpus.queries) + list(self.corpus.documents)
        emb, info = cached_encode(texts, name=f"{self.dataset}-minilm", encoder=self._encoder(),
                                  cache_dir=self.cache_dir, meta=dict(self.corpus.meta))
        if emb.shape[1] != self.input_dim:
            raise ValueError(f"RetrievalDataModule: cached embeddings have width {emb.shape[1]}, expected "
                             f"{self.input_dim}")
        nq = len(self.corpus.queries)
        self._query_emb, self._doc_emb = emb[:nq], emb[nq:]
        self.embedding_info = info

    def prepare_data(self) -> None:
        # rank 0 only: fill the disk cache so that every rank's setup() just reads it
        self._encode()

    def setup(self, stage: Optional[str] = None) -> None:
        if self._query_emb is None:
            self._encode()

    @staticmethod
    def _split_for(stage: Optional[str]) -> str:
        return "test" if stage in ("test", "predict") else "val"

    def corpus_embeddings(self, stage: Optional[str] = "validate") -> torch.Tensor:
        """Raw (frozen encoder) embeddings of the corpus searched at ``stage``: ``(M, D)``,
        rows in the order of the ids in evaluation batches' ``positives``."""
        self.setup(stage)
        return self._doc_emb[self._corpora[self._split_for(stage)]]

    def _loader(self, dataset, *, shuffle: bool, collate, batch_size: int) -> DataLoader:
        gen = torch.Generator().manual_seed(self.seed) if shuffle else None
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=gen, collate_fn=collate,
                          num_workers=self.num_workers, drop_last=False)

    def train_dataloader(self) -> DataLoader:
        self.setup("fit")
        return self._loader(IndexDataset(len(self._split_queries["train"])), shuffle=True,
                            collate=_TrainCollate(self), batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        self.setup("validate")
        return self._loader(IndexDataset(len(self._split_queries["val"])), shuffle=False,
                            collate=_EvalCollate(self, "val"), batch_size=self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        self.setup("test")
        return self._loader(IndexDataset(len(self._split_queries["test"])), shuffle=False,
                            collate=_EvalCollate(self, "test"), batch_size=self.eval_batch_size)
