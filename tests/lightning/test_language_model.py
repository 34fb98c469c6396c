"""The language-model benchmark: the standard-library DataModule (split, tokenizer, token cache),
the routing of :class:`~lightning_modules.models.LanguageModel`, its metrics, and every recipe under
``configs/language_model/`` through the real CLI.

Data tests use 30 training files and a 512-entry BPE (about a second to train) in a cache folder
of their own; the recipe test runs every recipe in this process on the same small data with a
1-layer, width-32 model (the recipe is otherwise unchanged).
"""

from __future__ import annotations

import glob
import hashlib
import math
import os
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
import yaml

import losses
from lightning_modules.data.language_model import (
    IGNORE_INDEX,
    LanguageModelDataModule,
    SPLITS,
    split_of,
    stdlib_source_files,
)
from lightning_modules.lm_metrics import SpikeCounter, TokenMetrics, logz_stats, sparse_target_stats
from lightning_modules.models import LanguageModel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "configs", "language_model", "*.yaml")))
LOGITS_LOSSES = ("cross_entropy", "z_loss", "logz_penalty", "entmax15", "sparsemax")
SMALL = {"max_files": 30, "vocab_size": 512, "seq_len": 32, "batch_size": 4, "eval_batch_size": 4}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("lm-cache"))


# -- data -----------------------------------------------------------------------------------------
def test_split_by_path_hash_is_disjoint_deterministic_and_recorded(cache):
    every = stdlib_source_files()
    assert every == sorted(every) and every and not any("site-packages" in r or "/test" in f"/{r}" for r in every)
    dm = LanguageModelDataModule(cache_dir=cache, **SMALL)
    sets = {s: set(dm.files[s]) for s in SPLITS}
    assert not (sets["train"] & sets["val"]) and not (sets["train"] & sets["test"]) and not (sets["val"] & sets["test"])
    assert len(dm.files["train"]) == 30 and all(1 <= len(dm.files[s]) <= 5 for s in ("val", "test"))
    for s in SPLITS:  # the split is the path hash's, computed here independently
        for rel in dm.files[s]:
            u = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "big") / 2.0 ** 64
            assert s == ("test" if u < 0.1 else "val" if u < 0.2 else "train"), rel
            assert split_of(rel) == s
    again = LanguageModelDataModule(cache_dir=cache, **SMALL)
    assert again.files == dm.files
    # without a file limit, every file lands in exactly one split, in about the declared shares
    full = LanguageModelDataModule(cache_dir=cache, vocab_size=512)
    assert sorted(sum(full.files.values(), [])) == every
    assert 0.03 < len(full.files["test"]) / len(every) < 0.2 and 0.03 < len(full.files["val"]) / len(every) < 0.2


def test_token_cache_hit_roundtrip_windows_and_invalidation(tmp_path):
    cache = str(tmp_path)  # a folder of its own: the first setup must build every file
    dm = LanguageModelDataModule(cache_dir=cache, max_tokens=20000, max_eval_tokens=3000, **SMALL)
    dm.setup("fit")
    first_hits = dict(dm.cache_hits)
    stats = dm.stats()
    assert stats["train_tokens"] == 20000 and stats["val_tokens"] == 3000 and stats["test_tokens"] == 3000
    assert stats["tokenizer_entries"] <= 512 and dm.num_classes == 512 and stats["sys_version"] == sys.version
    assert dm.meta == stats
    # the byte-level BPE gives the text back: the first training file is the stream's first piece
    stream = dm.stream("train")
    sep = int((stream == dm.sep_id).nonzero()[0])
    with open(os.path.join(dm.root, dm.files["train"][0]), encoding="utf-8") as fh:
        assert dm.tokenizer().decode(stream[:sep].tolist()) == fh.read()
    # a second DataModule reads every split from the cache
    again = LanguageModelDataModule(cache_dir=cache, max_tokens=20000, max_eval_tokens=3000, **SMALL)
    again.setup("fit")
    assert again.cache_hits == {s: True for s in SPLITS}
    assert again.fingerprint == dm.fingerprint and torch.equal(again.stream("val"), dm.stream("val"))
    assert first_hits == {s: False for s in SPLITS}
    assert len(glob.glob(os.path.join(cache, "lm-tokens-*.pt"))) == 3 and len(glob.glob(os.path.join(cache, "lm-bpe-*")))
    # another tokenizer (vocabulary size) gives new token files
    other = LanguageModelDataModule(cache_dir=cache, max_tokens=20000, max_eval_tokens=3000,
                                    **{**SMALL, "vocab_size": 600})
    other.setup("fit")
    assert other.cache_hits == {s: False for s in SPLITS} and other.fingerprint != dm.fingerprint
    assert other.num_classes == 600 and int(other.stream("train").max()) < 600
    # the test split's name: the test stream's hash, the same for every seed, another for another tokenizer
    expect = hashlib.sha256(dm.stream("test").numpy().astype("<i4").tobytes() + b"|32").hexdigest()[:12]
    assert dm.test_split_fingerprint() == again.test_split_fingerprint() == expect
    reseeded = LanguageModelDataModule(cache_dir=cache, max_tokens=20000, max_eval_tokens=3000, seed=5, **SMALL)
    assert reseeded.test_split_fingerprint() == expect != other.test_split_fingerprint()
    # windows: target[t] = input[t + 1] along the stream; the last window is padded with ignore_index
    ds = dm.dataset("val")
    w0, last = ds[0], ds[len(ds) - 1]
    val = dm.stream("val").long()
    assert torch.equal(w0["input"], val[:32]) and torch.equal(w0["target"], val[1:33])
    m = len(val) - 1 - (len(ds) - 1) * 32
    assert torch.equal(last["target"][:m], val[-m:]) and (last["target"][m:] == IGNORE_INDEX).all()
    assert (last["input"][m:] == dm.pad_id).all()


def test_minilm_wordpiece_vocabulary_and_missing_package_error(cache, monkeypatch):
    dm = LanguageModelDataModule("minilm", cache_dir=cache, max_files=5, max_tokens=2000, max_eval_tokens=500)
    assert dm.num_classes == 30522
    dm.setup("fit")
    assert dm.tokenizer().get_vocab_size() == 30522 and int(dm.stream("train").max()) < 30522
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if it were not installed
    fresh = LanguageModelDataModule(cache_dir=cache, **SMALL)
    with pytest.raises(ModuleNotFoundError, match=r"^LanguageModelDataModule: needs the `tokenizers` package.*"
                                                  r"softmax-losses\[integrations\]"):
        fresh.setup("fit")
    with pytest.raises(ValueError, match=r"^LanguageModelDataModule: unknown tokenizer"):
        LanguageModelDataModule("gpt2")


# -- routing --------------------------------------------------------------------------------------
V, D = 40, 16


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (3, 9), generator=g)
    y = torch.randint(0, V, (3, 9), generator=g)
    y[2, 5:] = IGNORE_INDEX  # padding
    return {"input": x, "target": y}


def _model(loss, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # save_hyperparameters' note about the loss module
        return LanguageModel(loss, num_classes=V, embedding_dim=D, num_layers=1, num_heads=2, context_length=16,
                             init_seed=0, **kw)


def _step(model, batch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log without a trainer
        return model.training_step(batch, 0)


@pytest.mark.parametrize("name", LOGITS_LOSSES)
def test_logits_losses_get_full_logits_with_ignore_index(name):
    spec = losses.get_loss_spec(name)
    seen = {}

    class Spy(spec.module):  # routes as its registered parent
        def forward(self, input, target):
            seen["shapes"] = (tuple(input.shape), tuple(target.shape))
            return super().forward(input, target)

    model = _model(Spy())
    batch = _batch()
    loss = _step(model, batch)
    assert seen["shapes"] == ((27, V), (27,))
    h = model.decoder(batch["input"]).reshape(-1, D)
    logits = h @ model.decoder.head.weight.T  # the untied output layer, computed here
    y = batch["target"].reshape(-1)
    keep = y != IGNORE_INDEX
    ref = spec.function(logits[keep], y[keep], **spec.function_kwargs)  # padding dropped by hand
    assert torch.allclose(loss, ref, rtol=1e-5, atol=1e-6)
    if name == "cross_entropy":
        assert torch.allclose(loss, F.cross_entropy(logits, y, ignore_index=-100), rtol=1e-5)
    loss.backward()
    assert model.decoder.tok.weight.grad is not None


@pytest.mark.parametrize("tie", [False, True])
def test_linear_cross_entropy_gets_hidden_states_and_equals_linear_plus_ce(tie):
    seen = {}

    class Spy(losses.LinearCrossEntropyLoss):
        def forward_with_stats(self, embeddings, target):  # what training calls: log Z from the same pass
            seen["shapes"] = (tuple(embeddings.shape), tuple(target.shape))
            return super().forward_with_stats(embeddings, target)

        def logits(self, embeddings):  # the full logits: evaluation only, never a second pass in training
            seen["logits_calls"] = seen.get("logits_calls", 0) + 1
            return super().logits(embeddings)

    model = _model(Spy(D, V, chunk_size=7), tie_weights=tie)
    assert model.decoder.head is None  # the loss owns the output layer
    assert (model.loss.weight is model.decoder.tok.weight) == tie
    batch = _batch(1)
    loss = _step(model, batch)
    assert seen["shapes"] == ((27, D), (27,))  # hidden states, never (tokens, vocabulary) logits
    assert "logits_calls" not in seen  # train/logz_* came from the loss's own pass
    h = model.decoder(batch["input"]).reshape(-1, D)
    ref = F.cross_entropy(F.linear(h, model.loss.weight, model.loss.bias), batch["target"].reshape(-1),
                          ignore_index=-100)
    assert torch.allclose(loss, ref, rtol=1e-5, atol=1e-6)
    assert torch.allclose(model(batch["input"]), F.linear(model.decoder(batch["input"]), model.loss.weight,
                                                          model.loss.bias), atol=1e-6)


def test_losses_it_cannot_train_with_are_refused():
    for loss, match in ((losses.OrthogonalProjectionLoss(), "auxiliary"), (losses.InfoNCELoss(), "kind 'scores'"),
                        (losses.CrossEntropyLoss(reduction="sum"), "reduction='mean'")):
        with pytest.raises(ValueError, match=rf"^LanguageModel: .*{match}"):
            _model(loss)
    with pytest.raises(ValueError, match=r"^LanguageModel: the loss's num_classes is 7"):
        _model(losses.LinearCrossEntropyLoss(D, 7))


# -- metrics --------------------------------------------------------------------------------------
def test_spike_counter_on_a_hand_made_sequence():
    c = SpikeCounter(factor=2.0, window=4, min_history=3)
    flags = [c.update(v) for v in [5.0, 4.0, 10.0, 3.0, 3.5, 7.1, 3.0, 6.9, float("nan"), 2.0]]
    # 10.0: only 2 losses seen; 7.1 is not above 2 x median(4, 10, 3, 3.5) = 7.5; 6.9 is above
    # 2 x median(3, 3.5, 7.1, 3) = 6.5; a NaN loss counts and stays out of the history
    assert flags == [False, False, False, False, False, False, False, True, True, False] and c.count == 2
    c = SpikeCounter(factor=2.0, window=3, min_history=3)
    flags = [c.update(v) for v in [1.0, 1.2, 0.9, 2.5, 1.0, 2.0, 5.0]]
    # medians of the previous three: 1.0 (2.5 > 2.0), 1.2, 1.0 (2.0 = 2 x 1.0 is not above), 2.0 (5.0 > 4.0)
    assert flags == [False, False, False, True, False, False, True] and c.count == 2
    with pytest.raises(ValueError, match=r"^SpikeCounter: factor"):
        SpikeCounter(factor=1.0)


def test_support_and_zero_probability_on_a_hand_made_sparse_distribution():
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.0, 0.7, 0.3, 0.0]])
    target = torch.tensor([2, 2, 0, IGNORE_INDEX])
    support, zero, valid = sparse_target_stats(probs, target)
    assert support.tolist() == [2, 1, 4, 0] and zero.tolist() == [True, False, False, False]
    assert valid.tolist() == [True, True, True, False]
    m = TokenMetrics()
    logits = torch.log(probs.clamp_min(1e-3))
    m.update(torch.tensor(3.0), logits, probs, target, sparse=True)
    out = m.compute()
    assert float(out["support"]) == pytest.approx(7 / 3) and float(out["zero_prob"]) == pytest.approx(1 / 3)
    assert math.isinf(float(out["nll"])) and math.isinf(float(out["ppl"]))  # a target with probability 0
    assert float(out["loss"]) == pytest.approx(1.0)


def test_logz_stats_and_token_metrics_against_torch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 12, generator=g) * 3
    target = torch.randint(0, 12, (50,), generator=g)
    target[::7] = IGNORE_INDEX
    keep = target != IGNORE_INDEX
    lz = torch.logsumexp(logits, 1)
    mean, std = logz_stats(lz[keep])
    assert float(mean) == pytest.approx(float(lz[keep].double().mean()), rel=1e-6)
    assert float(std) == pytest.approx(float(lz[keep].double().std(unbiased=False)), rel=1e-6)
    m = TokenMetrics()
    for a, b in ((0, 20), (20, 50)):  # two batches accumulate
        m.update(torch.tensor(0.0), logits[a:b], torch.softmax(logits[a:b], 1), target[a:b])
    out = m.compute()
    ce = F.cross_entropy(logits.double(), target, ignore_index=-100)
    assert float(out["softmax_ppl"]) == pytest.approx(math.exp(float(ce)), rel=1e-5)
    assert float(out["ppl"]) == pytest.approx(math.exp(float(ce)), rel=1e-5)
    assert float(out["logz_mean"]) == pytest.approx(float(mean), rel=1e-6)
    assert float(out["logz_std"]) == pytest.approx(float(std), rel=1e-4)
    top5 = logits.topk(5, 1).indices
    assert float(out["top1"]) == pytest.approx(float((logits.argmax(1) == target)[keep].float().mean()))
    assert float(out["top5"]) == pytest.approx(float((top5 == target[:, None]).any(1)[keep].float().mean()))
    assert "support" not in out


def test_unigram_reference_on_hand_made_tokens():
    """The no-training reference: with the unigram log-probabilities set, top-1 / top-5 are those of
    always predicting the most frequent tokens and nll the mean of -log p(target), padding skipped;
    without them no unigram column is computed."""
    counts = torch.tensor([1.0, 9.0, 5.0, 3.0, 2.0, 8.0, 4.0])  # ranked: 1, 5, 2, 6, 3
    logp = (counts / counts.sum()).log()
    target = torch.tensor([1, 5, 0, IGNORE_INDEX, 6, 1, 4])
    logits = torch.zeros(len(target), len(counts))
    m = TokenMetrics()
    m.update(torch.tensor(0.0), logits, torch.softmax(logits, 1), target)
    assert not any(k.startswith("unigram") for k in m.compute())
    m.reset()
    m.set_unigram(logp)
    m.update(torch.tensor(0.0), logits[:3], torch.softmax(logits[:3], 1), target[:3])
    m.update(torch.tensor(0.0), logits[3:], torch.softmax(logits[3:], 1), target[3:])
    out = m.compute()
    assert float(out["unigram_top1"]) == pytest.approx(2 / 6)  # two of the six targets are token 1
    assert float(out["unigram_top5"]) == pytest.approx(4 / 6)  # 1, 5, 6, 1 are in the top five; 0 and 4 not
    nll = -sum(math.log(counts[t] / counts.sum()) for t in (1, 5, 0, 6, 1, 4)) / 6
    assert float(out["unigram_nll"]) == pytest.approx(nll, rel=1e-6)  # float32 log-probabilities
    assert float(out["unigram_ppl"]) == pytest.approx(math.exp(nll), rel=1e-6)


# -- recipes through the CLI ----------------------------------------------------------------------
def _config(recipe):
    with open(os.path.join(ROOT, recipe)) as fh:
        return yaml.safe_load(fh)


def test_every_language_model_recipe_names_its_registry_entry():
    names = {os.path.splitext(os.path.basename(r))[0] for r in RECIPES}
    assert {*LOGITS_LOSSES, "linear_cross_entropy"} <= names
    for recipe in RECIPES:
        cfg = _config(recipe)
        spec = losses.get_loss_spec(os.path.splitext(os.path.basename(recipe))[0])
        assert cfg["model"]["init_args"]["loss"]["class_path"] == f"losses.{spec.module.__name__}"
        assert cfg["data"]["class_path"] == "lightning_modules.data.LanguageModelDataModule"


@pytest.mark.slow  # every recipe, in this process: about 15 s on 2 quiet cores
def test_every_recipe_trains_two_steps_through_the_cli(tmp_path, cache):
    from lightning_modules.cli import main

    small = [f"--data.init_args.{k}={v}" for k, v in {**SMALL, "max_tokens": 4096, "max_eval_tokens": 512,
                                                       "cache_dir": cache}.items()]
    model = ["--model.init_args.embedding_dim=32", "--model.init_args.num_layers=1", "--model.init_args.num_heads=2"]
    trainer = ["--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", "--trainer.val_check_interval=1.0",
               "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false",
               "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1"]
    for recipe in RECIPES:
        name = os.path.splitext(os.path.basename(recipe))[0]
        spec = losses.get_loss_spec(name)
        root = tmp_path / name
        cli = main(args=["fit", "--config", os.path.join(ROOT, recipe), f"--trainer.default_root_dir={root}",
                         *small, *model, *trainer])
        assert isinstance(cli.model.loss, spec.module), name
        metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
        assert cli.trainer.global_step == 2, name
        assert math.isfinite(metrics["train/loss"]) and metrics["train/tokens_per_s"] > 0, (name, metrics)
        for key in ("train/logz_mean", "train/logz_std", "train/top1", "train/spikes", "train/peak_memory_mb", "val/loss",
                    "val/softmax_ppl", "val/top1", "val/top5", "val/logz_mean", "val/logz_std",
                    "val/unigram_top1", "val/unigram_top5", "val/unigram_ppl", "val/bigram_top1", "val/bigram_ppl"):
            assert key in metrics, (name, key, sorted(metrics))
        assert ("val/ppl" in metrics) == spec.softmax, name  # no perplexity for the Z-loss's logits
        sparse = name in ("entmax15", "sparsemax")
        assert ("val/support" in metrics) == sparse and ("val/zero_prob" in metrics) == sparse, name
        if spec.owns_head:  # sizes linked from the data and the model
            assert (cli.model.loss.num_classes, cli.model.loss.embedding_dim) == (512, 32)
        hparams = glob.glob(str(root / "**" / "hparams.yaml"), recursive=True)
        with open(hparams[0]) as fh:
            logged = yaml.safe_load(fh)
        assert logged["data/train_tokens"] == 4096 and logged["data/tokenizer"] == "bpe", logged
        if spec.owns_head:  # the checkpoint rebuilds the module (linked sizes included): the same numbers
            ckpt = sorted(glob.glob(str(root / "**" / "*.ckpt"), recursive=True))[-1]
            val = main(args=["validate", "--config", os.path.join(ROOT, recipe), f"--trainer.default_root_dir={root}",
                             f"--ckpt_path={ckpt}", *small, *model, "--trainer.limit_val_batches=1",
                             "--trainer.enable_progress_bar=false"])
            again = {k: float(v) for k, v in val.trainer.callback_metrics.items()}
            assert again["val/softmax_ppl"] == pytest.approx(metrics["val/softmax_ppl"], rel=1e-5)


def test_bigram_reference_by_hand():
    """The Witten-Bell bigram floor against a dictionary count written from the formula
    p(w | v) = (c(v, w) + n(v) p1(w)) / (c(v) + n(v)), p1 for an unseen predecessor; top-k by brute
    force over the vocabulary; the metric's columns skip padding and need ``prev``."""
    from collections import Counter

    from lightning_modules.lm_metrics import BigramReference

    g = torch.Generator().manual_seed(0)
    C = 11
    stream = torch.cat([torch.randint(0, 6, (300,), generator=g), torch.tensor([3, 4, 3, 4, 3, 4, 7])])
    counts = torch.bincount(stream, minlength=C).double() + 1.0
    logp = (counts / counts.sum()).log()
    ref = BigramReference(stream, C, logp, row_chunk=3)
    pairs = Counter(zip(stream[:-1].tolist(), stream[1:].tolist()))
    c_v = Counter(stream[:-1].tolist())
    n_v = Counter(v for (v, _) in pairs)
    p1 = (counts / counts.sum()).tolist()

    def p(v, w):
        if c_v[v] == 0:
            return p1[w]
        return (pairs[(v, w)] + n_v[v] * p1[w]) / (c_v[v] + n_v[v])

    for v in range(C):  # a distribution for every predecessor, seen or not (7 is last: never a predecessor)
        assert sum(p(v, w) for w in range(C)) == pytest.approx(1.0)
    prev = torch.tensor([3, 4, 0, 7, 10, 5, 3])
    target = torch.tensor([4, 3, 2, 1, 0, 9, 8])
    want = torch.tensor([math.log(p(v, w)) for v, w in zip(prev.tolist(), target.tolist())], dtype=torch.float64)
    assert torch.allclose(ref.log_prob(prev, target), want, rtol=1e-12, atol=0)
    top = ref.topk(prev, 5)
    for row, v in zip(top.tolist(), prev.tolist()):
        probs = [p(v, w) for w in range(C)]
        kth = sorted(probs, reverse=True)[4]
        assert len(set(row)) == 5 and all(probs[w] >= kth - 1e-15 for w in row)
        assert probs[row[0]] == pytest.approx(max(probs))
    # through TokenMetrics: padding skipped, the columns only with prev
    tgt = target.clone()
    tgt[2] = IGNORE_INDEX
    logits = torch.zeros(len(tgt), C)
    m = TokenMetrics()
    m.set_unigram(logp)
    m.set_bigram(ref)
    m.update(torch.tensor(0.0), logits, torch.softmax(logits, 1), tgt)
    assert not any(k.startswith("bigram") for k in m.compute())
    m.update(torch.tensor(0.0), logits, torch.softmax(logits, 1), tgt, prev=prev)
    out = m.compute()
    keep = [i for i in range(len(tgt)) if i != 2]
    assert float(out["bigram_nll"]) == pytest.approx(float(-want[keep].mean()), rel=1e-12)
    assert float(out["bigram_ppl"]) == pytest.approx(math.exp(float(-want[keep].mean())), rel=1e-12)
    assert float(out["bigram_top1"]) == pytest.approx(float((top[keep, 0] == target[keep]).double().mean()))
    assert float(out["bigram_top5"]) == pytest.approx(float((top[keep] == target[keep, None]).any(1).double().mean()))
    with pytest.raises(ValueError, match="token ids"):
        BigramReference(torch.tensor([0, 11]), C, logp)
    with pytest.raises(ValueError, match="unigram_logp"):
        BigramReference(stream, C, logp[:5])
