"""Routing follows the class hierarchy and the registry entry (lightning_modules/routing.py): a
subclass of a registered loss routes as its parent, a loss class registered by the user routes by
its own entry, ``torch.nn`` losses are logits losses, and any other unregistered module is an error.
The route, not each LightningModule, says whether a loss can train alone and what it takes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import losses
from lightning_modules.models.recommender import Recommender
from lightning_modules.models.retriever import DualEncoderRetriever
from lightning_modules.models.vision import VisionClassifier
from lightning_modules.routing import LossRoute, loss_route

TINY = dict(backbone="test_resnet", num_classes=10, embedding_dim=16, robust_eval=False)


class MyArcFace(losses.MarginSoftmaxLoss):
    """A user's subclass, not registered: routes as margin_softmax."""


class MyCE(losses.CrossEntropyLoss):
    """A user's subclass of a registered loss, registered itself (as an auxiliary loss)."""


class UserBPR(nn.Module):
    """A pairs loss written by a user: ``mean softplus(neg - pos)``."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, pos_scores, neg_scores, neg_mask=None):
        per = F.softplus(neg_scores - pos_scores[:, None])
        return per.mean()


class UserScores(nn.Module):
    """A scores loss whose forward takes ``*args``: signature sniffing would have taken it for a
    (query, keys, target) loss; its entry says it takes the score matrix."""

    def forward(self, *args):
        scores, target = args
        return losses.infonce_loss(scores, target)


def _user_bpr(pos_scores, neg_scores, *, reduction="mean"):
    return F.softplus(neg_scores - pos_scores[:, None]).mean()


@pytest.fixture
def user_entries():
    losses.register("routing_my_ce", function=losses.cross_entropy_loss, module=MyCE, inputs="logits",
                    unit="position", unit_weights=lambda x, t, ignore_index=-100, **_: (t != ignore_index).double(),
                    auxiliary=True)
    losses.register("routing_user_bpr", function=_user_bpr, module=UserBPR, inputs="pairs", unit="batch",
                    unit_weights=None)
    losses.register("routing_user_scores", function=losses.infonce_loss, module=UserScores, inputs="scores",
                    unit="batch", unit_weights=None)
    yield
    for n in ("routing_my_ce", "routing_user_bpr", "routing_user_scores"):
        losses.unregister(n)


def test_subclass_of_a_registered_loss_routes_as_its_parent():
    route = loss_route(MyArcFace(16, 10))
    assert route == LossRoute(kind="embeddings", owns_head=True, auxiliary=False, name="margin_softmax",
                              query_keys=False, loss_name="MyArcFace")
    assert route.arguments == ("embeddings", "target") and route.trains_alone
    torch.manual_seed(0)
    model = VisionClassifier(MyArcFace(16, 10), **TINY)
    assert model.net.head is None  # the head-owning route: the loss holds the class weights
    x, y = torch.rand(4, 1, 32, 32), torch.tensor([0, 1, 2, 3])
    main, _, feats, logits = model._losses(x, y)
    torch.testing.assert_close(main, model.loss(feats, y))
    torch.testing.assert_close(logits, model.loss.logits(feats))


def test_a_registered_user_class_routes_by_its_own_entry(user_entries):
    # MyCE is a CrossEntropyLoss, but its own entry (auxiliary) wins over the parent's
    assert loss_route(MyCE()).name == "routing_my_ce" and loss_route(MyCE()).auxiliary
    assert loss_route(losses.CrossEntropyLoss()).name == "cross_entropy"
    with pytest.raises(ValueError, match=r"^VisionClassifier: MyCE is an auxiliary loss .* cannot train a classifier"):
        VisionClassifier(MyCE(), **TINY)

    torch.manual_seed(0)
    rec = Recommender(UserBPR(), num_users=6, num_items=9, embedding_dim=4, score="dot")
    g = torch.Generator().manual_seed(0)
    batch = {"user": torch.randint(6, (5,), generator=g), "item": torch.randint(9, (5,), generator=g),
             "neg_items": torch.randint(9, (5, 3), generator=g)}
    u = rec.user_embedding(batch["user"])
    pos = (u * rec.item_embedding(batch["item"])).sum(-1)
    neg = torch.einsum("bd,bnd->bn", u, rec.item_embedding(batch["neg_items"]))
    torch.testing.assert_close(rec._train_loss(batch), F.softplus(neg - pos[:, None]).mean())


def test_the_route_not_the_signature_says_what_a_scores_loss_takes(user_entries):
    assert not loss_route(UserScores()).query_keys
    m = DualEncoderRetriever(UserScores(), input_dim=6, embedding_dim=6)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(3, 6, generator=g), torch.randn(5, 6, generator=g)
    target = torch.zeros(3, 5, dtype=torch.bool)
    target[torch.arange(3), torch.tensor([0, 2, 4])] = True
    torch.testing.assert_close(m._train_loss({"target": target}, q, k), losses.infonce_loss(q @ k.T, target))
    assert loss_route(losses.InfoNCELoss()).query_keys


def test_torch_losses_route_as_logits_and_other_modules_are_an_error():
    route = loss_route(nn.CrossEntropyLoss())
    assert route.kind == losses.InputKind.LOGITS and route.name is None and route.trains_alone

    class NotALoss(nn.Module):
        def forward(self, x, y):
            return (x - y).pow(2).mean()

    msg = r"^loss_route: NotALoss is not a registered loss \(got .*NotALoss\); register it with losses.register"
    with pytest.raises(ValueError, match=msg):
        loss_route(NotALoss())
    with pytest.raises(ValueError, match=msg):
        VisionClassifier(NotALoss(), **TINY)


@pytest.mark.parametrize("name", [s.name for s in losses.list_losses()])
def test_route_owns_trains_alone(name):
    spec = losses.get_loss_spec(name)
    route = loss_route(losses.testing.build(spec))
    assert route.name in {s.name for s in losses.list_losses() if s.module is spec.module}
    assert route.kind == spec.kind and route.arguments == spec.inputs
    expected = not spec.auxiliary and (spec.kind != "embeddings" or spec.owns_head)
    assert route.trains_alone is expected and route.needs_main_loss is (not expected)
    if not expected:
        with pytest.raises(ValueError, match=rf"^Owner: {spec.module.__name__} .* cannot train a model on its own; hint"):
            route.require_main("Owner", tuple(losses.INPUT_KINDS), task="a model", hint="hint")
    else:
        route.require_main("Owner", tuple(losses.INPUT_KINDS), task="a model", hint="hint")
    with pytest.raises(ValueError, match=rf"takes inputs of kind '{spec.kind}', not one of \[\]"):
        route.require_main("Owner", (), task="a model", hint="hint")


def test_opl_needs_a_main_loss_everywhere():
    opl = losses.OrthogonalProjectionLoss()
    assert loss_route(opl).needs_main_loss
    for make in (lambda: Recommender(opl, num_users=3, num_items=4, embedding_dim=4),
                 lambda: DualEncoderRetriever(opl, input_dim=4, embedding_dim=4),
                 lambda: VisionClassifier(opl, **TINY)):
        with pytest.raises(ValueError, match=r"OrthogonalProjectionLoss is an auxiliary loss .*, so it cannot train"):
            make()
