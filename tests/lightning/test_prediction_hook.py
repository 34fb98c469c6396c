"""Every benchmark module predicts with the loss's own rule (``lightning_modules.routing``).

A test-only logits loss, registered under a test name and removed afterwards, trains with
cross-entropy on the *negated* input and predicts with ``predict_proba(input) = softmax(-input)``:
its prediction is the argmin of its input, never the argmax. Top-1 / top-k accuracy, the per-class
and balanced accuracies, segmentation maps, recommendation and retrieval rankings must follow
that rule; a loss without a rule of its own keeps the argmax / order of the logits.
"""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import losses
from lightning_modules.data import DigitsDataModule
from lightning_modules.models import DualEncoderRetriever, Recommender, VisionClassifier, VisionSegmenter
from lightning_modules.routing import has_own_prediction, head_logits, loss_route, predict_proba, predict_scores

pytestmark = pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`")

NAME = "test_negated_softmax"
TINY = dict(backbone="test_resnet", num_classes=10, embedding_dim=16, robust_eval=False)


def negated_cross_entropy(input: Tensor, target: Tensor, *, ignore_index: int = -100,
                          reduction: str = "mean") -> Tensor:
    """Cross-entropy of the negated input: the class with the *smallest* input is the prediction."""
    return F.cross_entropy(-input.float(), target, ignore_index=ignore_index, reduction=reduction)


def _unit_weights(input: Tensor, target: Tensor, *, ignore_index: int = -100, **_: object) -> Tensor:
    return (target != ignore_index).double()


class NegatedSoftmaxLoss(nn.Module):
    """Test loss whose prediction rule is ``softmax(-input)`` (not monotone in the input)."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__()
        self.ignore_index = ignore_index
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return negated_cross_entropy(input, target, ignore_index=self.ignore_index, reduction=self.reduction)

    def predict_proba(self, input: Tensor) -> Tensor:
        return torch.softmax(-input.float(), dim=1)


class ReversedLinearCE(losses.LinearCrossEntropyLoss):
    """A head-owning loss (routes as its registered parent) with its own, reversed, rule."""

    def predict_proba(self, input: Tensor) -> Tensor:
        return torch.softmax(-input.float(), dim=1)


@pytest.fixture
def negated():
    losses.register(NAME, function=negated_cross_entropy, module=NegatedSoftmaxLoss, inputs=losses.InputKind.LOGITS,
                    unit="position", unit_weights=_unit_weights, arxiv="", paper="test only", replace=True)
    try:
        yield NegatedSoftmaxLoss()
    finally:
        losses.unregister(NAME)


@pytest.fixture(scope="module")
def digits():
    dm = DigitsDataModule(image_size=32, batch_size=64, eval_batch_size=64, seed=0)
    dm.setup("fit")
    return dm


def _trainer():
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=2)


def _val_logits(model, dm, batches=2):
    out, ys = [], []
    with torch.no_grad():
        for i, (x, y) in enumerate(dm.val_dataloader()):
            if i == batches:
                break
            out.append(model(x))
            ys.append(y)
    return torch.cat(out), torch.cat(ys)


# ---------------------------------------------------------------------------------------------
# the hook itself
# ---------------------------------------------------------------------------------------------
def test_predict_scores_orders_by_the_loss_rule_and_defaults_to_the_logits(negated):
    z = torch.randn(8, 6, generator=torch.Generator().manual_seed(0))
    assert predict_scores(losses.CrossEntropyLoss(), z) is z  # no rule of its own: the logits, unchanged
    torch.testing.assert_close(predict_proba(losses.CrossEntropyLoss(), z), torch.softmax(z, 1))
    assert has_own_prediction(negated) and not has_own_prediction(losses.CrossEntropyLoss())
    s = predict_scores(negated, z)
    assert torch.equal(s.argmax(1), z.argmin(1))
    assert torch.equal(s.argsort(1, descending=True), z.argsort(1))  # the full order is reversed
    torch.testing.assert_close(predict_proba(negated, z), torch.softmax(-z, 1))
    # a rule that is monotone in the logits keeps their order exactly, ties of the distribution
    # (sparsemax's zeros) broken by the logits
    sp = losses.SparsemaxLoss()
    assert (predict_proba(sp, z) == 0).any()
    assert torch.equal(predict_scores(sp, z).argsort(1, descending=True), z.argsort(1, descending=True))
    # dense maps (N, C, H, W): along the class dim
    m = torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(1))
    assert torch.equal(predict_scores(negated, m).argmax(1), m.argmin(1))


def test_head_logits_comes_from_the_loss_that_owns_the_head():
    loss = losses.LinearCrossEntropyLoss(embedding_dim=8, num_classes=5)
    e = torch.randn(4, 8)
    torch.testing.assert_close(head_logits(loss, loss_route(loss), e, None), loss.logits(e))
    head = nn.Linear(8, 5)
    ce = losses.CrossEntropyLoss()
    torch.testing.assert_close(head_logits(ce, loss_route(ce), e, head), head(e))
    with pytest.raises(RuntimeError, match="head_logits"):
        head_logits(ce, loss_route(ce), e, None)


# ---------------------------------------------------------------------------------------------
# vision: the real Trainer on real digits batches
# ---------------------------------------------------------------------------------------------
def test_vision_top1_follows_the_loss_rule_not_the_raw_argmax(negated, digits):
    torch.manual_seed(0)
    model = VisionClassifier(negated, **TINY)
    trainer = _trainer()
    (res,) = trainer.validate(model, datamodule=digits, verbose=False)
    model.eval()
    logits, y = _val_logits(model, digits)
    by_rule = (logits.argmin(1) == y).float().mean().item()
    by_argmax = (logits.argmax(1) == y).float().mean().item()
    assert res["val/top1"] == pytest.approx(by_rule, abs=1e-6)
    assert by_rule != pytest.approx(by_argmax, abs=1e-6)  # the two rules disagree on these batches
    top5 = (logits.argsort(1)[:, :5] == y[:, None]).any(1).float().mean().item()  # the 5 smallest inputs
    assert res["val/top5"] == pytest.approx(top5, abs=1e-6)
    # ECE of the loss's own distribution
    assert "val/ece" in res
    assert "val/support" not in res  # softmax(-input) is never sparse: no support size


def test_vision_step_scores_a_real_batch_by_the_rule(negated, digits):
    torch.manual_seed(0)
    model = VisionClassifier(negated, **TINY).eval()
    x, _ = next(iter(digits.val_dataloader()))
    with torch.no_grad():
        logits = model(x)
    target = logits.argmin(1)  # every image labelled with the loss's prediction
    assert not torch.equal(target, logits.argmax(1))
    model.validation_step((x, target), 0)
    metrics = dict(model.eval_metrics["val"].items(keep_base=True))
    assert metrics["top1"].compute().item() == 1.0
    assert metrics["balanced_acc"].compute().item() == 1.0
    per_class = model.eval_stats["val"]["per_class"].compute()
    assert torch.all(per_class[~per_class.isnan()] == 1.0)


def test_vision_default_path_is_the_argmax_of_the_logits(digits):
    torch.manual_seed(0)
    model = VisionClassifier(losses.CrossEntropyLoss(), **TINY)
    (res,) = _trainer().validate(model, datamodule=digits, verbose=False)
    model.eval()
    logits, y = _val_logits(model, digits)
    assert res["val/top1"] == pytest.approx((logits.argmax(1) == y).float().mean().item(), abs=1e-6)


def test_head_owning_loss_predicts_with_its_logits_and_its_rule(digits):
    torch.manual_seed(0)
    loss = ReversedLinearCE(embedding_dim=16, num_classes=10)
    model = VisionClassifier(loss, **TINY).eval()
    assert model.net.head is None
    x, _ = next(iter(digits.val_dataloader()))
    with torch.no_grad():
        logits = loss.logits(model.net.features(x))
    torch.testing.assert_close(model(x), logits)
    model.validation_step((x, logits.argmin(1)), 0)
    assert dict(model.eval_metrics["val"].items(keep_base=True))["top1"].compute().item() == 1.0


def test_segmenter_map_follows_the_loss_rule(negated):
    torch.manual_seed(0)
    model = VisionSegmenter(negated, backbone="test_resnet", num_classes=11).eval()
    x = torch.rand(2, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        target = model(x).argmin(1)
    model.validation_step((x, target), 0)
    assert dict(model.eval_metrics["val"].items(keep_base=True))["pixel_acc"].compute().item() == 1.0


# ---------------------------------------------------------------------------------------------
# recommendation (items as classes) and retrieval rankings
# ---------------------------------------------------------------------------------------------
def test_recommender_ranks_items_by_the_loss_rule(negated):
    torch.manual_seed(0)
    model = Recommender(negated, num_users=4, num_items=9, embedding_dim=8, score="dot", logit_scale=2.0)
    users = torch.arange(4)
    with torch.no_grad():
        raw = model.all_item_scores(users)
        ranked = model.ranking_scores(users)
    assert torch.equal(ranked.argsort(1, descending=True), raw.argsort(1))
    plain = Recommender(losses.CrossEntropyLoss(), num_users=4, num_items=9, embedding_dim=8)
    with torch.no_grad():
        assert torch.equal(plain.ranking_scores(users), plain.all_item_scores(users))


def test_retriever_searches_by_the_loss_rule(negated):
    pytest.importorskip("faiss")
    g = torch.Generator().manual_seed(0)
    corpus, queries = torch.randn(12, 6, generator=g), torch.randn(3, 6, generator=g)
    model = DualEncoderRetriever(negated, input_dim=6, embedding_dim=6)
    model.index_corpus(corpus)
    with torch.no_grad():
        q = model.encode_queries(queries)
        cos = F.normalize(q, dim=1) @ F.normalize(model.encode_documents(corpus), dim=1).T
    _, ids = model.search(q, 4)
    assert torch.equal(ids, cos.argsort(1)[:, :4])  # the 4 least similar documents: the loss's rule
    plain = DualEncoderRetriever(losses.InfoNCELoss(), input_dim=6, embedding_dim=6)
    plain.index_corpus(corpus)
    _, ids = plain.search(q, 4)
    assert torch.equal(ids, cos.argsort(1, descending=True)[:, :4])
