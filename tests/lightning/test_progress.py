"""Progress output of the slow first-run steps: the embedding cache and the stdlib pairs.

The encoder is a deterministic function of the text (``cached_encode`` takes any callable with a
``version``); the bar and the first line are read from the real standard error.
"""

from __future__ import annotations

import os
import re

import torch

from lightning_modules.data import embedding_cache as ec
from lightning_modules.data.retrieval import stdlib_code_search_pairs
from lightning_modules.progress import PROGRESS_ENV


class LengthEncoder:
    """Two features per text: its length and the sum of its characters modulo 101."""

    version = "length-encoder-1"

    def __init__(self):
        self.calls = []

    def __call__(self, texts):
        self.calls.append(len(texts))
        return torch.tensor([[float(len(t)), float(sum(map(ord, t)) % 101)] for t in texts])


TEXTS = [f"text number {i} " + "x" * (i % 7) for i in range(600)]


def test_cached_encode_says_where_the_cache_goes_and_counts(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    enc = LengthEncoder()
    emb, info = ec.cached_encode(TEXTS + TEXTS[:10], name="progress", encoder=enc, cache_dir=tmp_path)
    err = capfd.readouterr().err
    assert info["path"] in err and "cached_encode: encoding 600 distinct texts" in err, err
    assert err.index(info["path"]) < err.index("600/600"), err  # the cache file comes first, then the bar
    assert re.search(r"encoding progress: 100%.*600/600 .*text/s", err), err  # count and rate
    assert enc.calls == [ec.ENCODE_CHUNK, ec.ENCODE_CHUNK, 600 - 2 * ec.ENCODE_CHUNK]  # chunks
    one_call = torch.tensor([[float(len(t)), float(sum(map(ord, t)) % 101)] for t in TEXTS])
    assert torch.equal(emb[:600], one_call) and torch.equal(emb[600:], one_call[:10])

    ec._MEMORY.clear()
    again, info2 = ec.cached_encode(TEXTS + TEXTS[:10], name="progress", encoder=enc, cache_dir=tmp_path)
    assert info2["from_cache"] and torch.equal(again, emb)
    assert capfd.readouterr().err == ""  # reading the cache is silent


def test_progress_off_by_environment_or_argument(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, "0")
    ec.cached_encode(TEXTS[:5], name="quiet", encoder=LengthEncoder(), cache_dir=tmp_path)
    monkeypatch.delenv(PROGRESS_ENV)
    ec.cached_encode(TEXTS[5:9], name="quiet", encoder=LengthEncoder(), cache_dir=tmp_path, progress=False)
    assert capfd.readouterr().err == ""
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".pt")]) == 2  # (each beside its .lock)


def test_stdlib_pairs_parsing_shows_files(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    root = tmp_path / "lib"
    root.mkdir()
    for i in range(3):
        (root / f"m{i}.py").write_text(f'def f{i}(a):\n    """Multiply the argument by {i} and return it."""\n'
                                       f"    return {i} * a\n")
    pairs = stdlib_code_search_pairs(str(root), cache_dir=str(tmp_path / "cache"))
    err = capfd.readouterr().err
    (cached,) = os.listdir(tmp_path / "cache")
    assert len(pairs.queries) == 3
    assert "parsing 3 standard-library files" in err and cached in err and "3/3" in err, err
