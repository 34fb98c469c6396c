"""Optimisers for sparse-gradient parameters (``lightning_modules/optim.py``): the joined optimiser
steps exactly like its two parts, one scheduler drives both, its state_dict resumes exactly; the
modules route ``PartialFCLoss(sparse_grad=True)``'s centres to SparseAdam / plain SGD (unsampled
centres do not move), and a many-class recipe fits and resumes from its checkpoint through the real
CLI and trainer."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

import losses
from lightning_modules.optim import DenseSparseOptimizer, build_optimizer, reset_parameter_state, sparse_gradient_parameters
from tests.lightning.recipe_utils import find_checkpoint, run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "configs", "many_class", "cosface_pfc01.yaml")
TINY = ["--data.init_args.num_classes=2000", "--data.init_args.train_per_class=1", "--data.init_args.open_classes=20",
        "--data.init_args.batch_size=32", "--data.init_args.eval_batch_size=256",
        "--model.init_args.loss.init_args.sparse_grad=true", "--trainer.num_sanity_val_steps=0"]


class _Model(nn.Module):
    def __init__(self, sparse: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(6, 8)
        self.loss = losses.PartialFCLoss(8, 50, sample_rate=0.2, seed=3, sparse_grad=sparse)

    def forward(self, x, y):
        return self.loss(self.net(x), y)


def _data(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(10, 6, generator=g), torch.randint(0, 50, (10,), generator=g)


def _train(model, opt, steps, sched=None, start=0):
    for i in range(start, start + steps):
        opt.zero_grad()
        model(*_data(i)).backward()
        opt.step()
        if sched is not None:
            sched.step()


def test_sparse_gradient_parameters_finds_the_centres_only():
    m = _Model()
    assert [p is m.loss.weight for p in sparse_gradient_parameters(m)] == [True]
    assert sparse_gradient_parameters(_Model(sparse=False)) == []


def test_joined_optimiser_steps_like_its_two_parts():
    a, b = _Model(), _Model()
    joined = build_optimizer(a, [{"params": list(a.parameters())}], lr=0.01, weight_decay=0.1)
    assert isinstance(joined, DenseSparseOptimizer) and isinstance(joined.dense, torch.optim.AdamW)
    assert isinstance(joined.sparse, torch.optim.SparseAdam)
    parts = [torch.optim.AdamW(b.net.parameters(), lr=0.01, weight_decay=0.1),
             torch.optim.SparseAdam(b.loss.parameters(), lr=0.01)]

    class Both:
        def zero_grad(self):
            for o in parts:
                o.zero_grad()

        def step(self):
            for o in parts:
                o.step()

    before = a.loss.weight.detach().clone()
    _train(a, joined, 4)
    _train(b, Both(), 4)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n
    sampled = torch.zeros(50, dtype=torch.bool)
    m = _Model()
    for i in range(4):  # the same seeded sampler: the rows that were ever sampled
        m(*_data(i))
        sampled[m.loss.last_index] = True
    assert torch.equal((a.loss.weight.detach() != before).any(dim=1), sampled) and not sampled.all()


def test_one_scheduler_drives_both_and_the_state_dict_resumes_exactly():
    a = _Model()
    opt = build_optimizer(a, [{"params": list(a.parameters())}], lr=0.02)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)
    _train(a, opt, 2, sched)
    assert opt.dense.param_groups[0]["lr"] == opt.sparse.param_groups[0]["lr"] == pytest.approx(0.005)
    saved = (copy.deepcopy(a.state_dict()), copy.deepcopy(opt.state_dict()), copy.deepcopy(sched.state_dict()))
    _train(a, opt, 2, sched, start=2)
    b = _Model()
    b.load_state_dict(saved[0])
    opt_b = build_optimizer(b, [{"params": list(b.parameters())}], lr=0.02)
    sched_b = torch.optim.lr_scheduler.LambdaLR(opt_b, lambda s: 0.5 ** s)
    opt_b.load_state_dict(saved[1])
    sched_b.load_state_dict(saved[2])
    assert opt_b.param_groups[-1] is opt_b.sparse.param_groups[0]  # re-joined after loading
    _train(b, opt_b, 2, sched_b, start=2)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n
    with pytest.raises(ValueError, match="'dense' and 'sparse'"):
        opt_b.load_state_dict(opt_b.dense.state_dict())


def test_groups_keep_their_rates_and_sgd_pairs_with_plain_sgd():
    m = _Model()
    opt = build_optimizer(m, [{"params": list(m.net.parameters()), "lr": 0.1, "name": "net"},
                              {"params": list(m.loss.parameters()), "lr": 0.3, "name": "head"}],
                          optimizer="sgd", lr=0.2, momentum=0.9, weight_decay=0.01)
    assert isinstance(opt.dense, torch.optim.SGD) and isinstance(opt.sparse, torch.optim.SGD)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.3] and opt.param_groups[1]["name"] == "head"
    assert opt.sparse.param_groups[0]["momentum"] == 0 and opt.sparse.param_groups[0]["weight_decay"] == 0
    assert opt.dense.param_groups[0]["momentum"] == 0.9
    before = m.loss.weight.detach().clone()
    _train(m, opt, 1)
    moved = (m.loss.weight.detach() != before).any(dim=1)
    assert torch.equal(moved.nonzero().flatten(), m.loss.last_index)
    dense = _Model(sparse=False)
    assert type(build_optimizer(dense, [{"params": list(dense.parameters())}], lr=0.1)) is torch.optim.AdamW
    with pytest.raises(ValueError, match="optimizer"):
        build_optimizer(dense, [{"params": list(dense.parameters())}], optimizer="adam", lr=0.1)
    with pytest.raises(TypeError, match="dense"):
        DenseSparseOptimizer("adamw", opt.sparse)


@pytest.mark.slow
def test_recipe_with_sparse_centres_fits_and_resumes_exactly(tmp_path):
    """A many-class recipe with ``sparse_grad=true``: the CLI's optimiser is the joined one; 2 epochs
    in one fit equal 1 epoch, then a resume from its checkpoint to 2 (centres, network, optimiser
    state and the sampler's generator all restored). The learning rate is constant here: the cosine
    schedule spans each fit's own length, so a 1-epoch fit would anneal differently."""
    flat = [*TINY, "--model.init_args.lr_schedule=constant"]
    two = run_cli("fit", RECIPE, tmp_path / "two", [*flat, "--trainer.max_epochs=2"])
    opt = two.trainer.optimizers[0]
    assert isinstance(opt, DenseSparseOptimizer) and isinstance(opt.sparse, torch.optim.SparseAdam)
    assert two.model.loss.weight.grad is None or two.model.loss.weight.grad.is_sparse
    run_cli("fit", RECIPE, tmp_path / "one", [*flat, "--trainer.max_epochs=1"])
    ckpt = find_checkpoint(tmp_path / "one")
    resumed = run_cli("fit", RECIPE, tmp_path / "resumed", [*flat, "--trainer.max_epochs=2", f"--ckpt_path={ckpt}"])
    for (n, p), q in zip(two.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), n


def test_reset_parameter_state_reaches_the_inner_optimisers():
    # two-stage training re-initialises the head and must forget its moments; the joined optimiser
    # keeps them in .dense / .sparse, not in its own .state
    m = _Model()
    opt = build_optimizer(m, [{"params": list(m.parameters())}], lr=0.01)
    assert isinstance(opt, DenseSparseOptimizer)
    _train(m, opt, 2)
    centres, w = m.loss.weight, m.net.weight
    assert centres in opt.sparse.state and w in opt.dense.state and not opt.state
    assert reset_parameter_state(opt, centres) and reset_parameter_state(opt, w)
    assert centres not in opt.sparse.state and w not in opt.dense.state
    assert not reset_parameter_state(opt, w)  # nothing left to drop
    # the next step starts the moments afresh, like a new optimiser from the current weights
    fresh = copy.deepcopy(m)
    ref = build_optimizer(fresh, [{"params": list(fresh.parameters())}], lr=0.01)
    for p_ref, p in zip(fresh.parameters(), m.parameters()):
        if p is not centres and p is not w:  # give the other parameters their old state too
            state = (opt.dense if p in opt.dense.state else opt.sparse).state[p]
            (ref.dense if p in opt.dense.state else ref.sparse).state[p_ref] = copy.deepcopy(state)
    _train(m, opt, 1, start=5)
    _train(fresh, ref, 1, start=5)
    torch.testing.assert_close(m.net.weight, fresh.net.weight, rtol=0, atol=0)
    torch.testing.assert_close(m.loss.weight, fresh.loss.weight, rtol=0, atol=0)
    plain = torch.optim.AdamW(nn.Linear(2, 2).parameters())
    p0 = plain.param_groups[0]["params"][0]
    p0.grad = torch.ones_like(p0)
    plain.step()
    assert reset_parameter_state(plain, p0) and p0 not in plain.state
