"""OPL and NBC-softmax with ``gather_distributed=True`` on 2 real gloo processes (docs/conventions.md
Distributed (a), (b), (d)): the loss of the concatenated global batch on every rank, the
single-process gradient for the replicated NBC head, world_size x the single-process gradient for
this rank's embeddings, and a ValueError for unequal batch sizes."""

from __future__ import annotations

import pytest
import torch

import losses
from tests.dist_utils import run_gloo

WORLD = 2
B, D, K = 5, 4, 6
IGN = -100

OPL_CASES = [
    {"gamma": 0.5},
    {"gamma": 2.0, "variant": "reference"},
    {"neg_term": "mean", "ignore_index": 3},
]
NBC_CASES = [
    {},
    {"scale": 0.7, "nbc_weight": 0.3, "variant": "reference"},
    {"nbc_weight": 1.0, "bias": False},
]


def _global_batch():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(WORLD * B, D, generator=gen, dtype=torch.float64)
    y = torch.randint(0, K, (WORLD * B,), generator=gen)
    y[1] = IGN  # an ignored row on rank 0: "mean" divides by the global valid count
    y[B + 2] = y[0]  # a class shared across ranks
    return x, y


def _worker(rank, world_size, payload):
    x_all, y_all = payload["x"], payload["y"]
    rows = slice(rank * B, (rank + 1) * B)
    out = {"opl": [], "nbc": [], "errors": []}
    for kw in OPL_CASES:
        x = x_all[rows].clone().requires_grad_(True)
        loss = losses.OrthogonalProjectionLoss(gather_distributed=True, **kw)(x, y_all[rows])
        loss.backward()
        out["opl"].append({"loss": loss.detach(), "grad": x.grad})
    for kw, state in zip(NBC_CASES, payload["heads"]):
        m = losses.NBCSoftmaxLoss(D, K, gather_distributed=True, **kw).double()
        m.load_state_dict(state)
        x = x_all[rows].clone().requires_grad_(True)
        loss = m(x, y_all[rows])
        loss.backward()
        out["nbc"].append({"loss": loss.detach(), "grad": x.grad,
                           "params": {n: p.grad for n, p in m.named_parameters()}})
    # unequal batch sizes: rank 1 passes one more row; both ranks raise
    n = B + rank
    for module in (losses.OrthogonalProjectionLoss(gather_distributed=True),
                   losses.NBCSoftmaxLoss(D, K, gather_distributed=True).double()):
        try:
            module(torch.randn(n, D, dtype=torch.float64), torch.zeros(n, dtype=torch.long))
            out["errors"].append(None)
        except ValueError as e:
            out["errors"].append(str(e))
    return out


@pytest.mark.slow
def test_gathered_losses_equal_the_global_single_process_loss():
    x, y = _global_batch()
    heads = []
    for i, kw in enumerate(NBC_CASES):
        torch.manual_seed(10 + i)
        heads.append(losses.NBCSoftmaxLoss(D, K, **kw).double().state_dict())
    results = run_gloo(_worker, world_size=WORLD, payload={"x": x, "y": y, "heads": heads})

    for i, kw in enumerate(OPL_CASES):
        xg = x.clone().requires_grad_(True)
        ref = losses.opl_loss(xg, y, **kw)
        (gref,) = torch.autograd.grad(ref, xg)
        assert gref.abs().sum() > 0
        for rank, res in enumerate(results):
            got = res["opl"][i]
            torch.testing.assert_close(got["loss"], ref.detach(), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(got["grad"], WORLD * gref[rank * B:(rank + 1) * B], rtol=1e-6, atol=1e-6)
        assert results[0]["opl"][i]["loss"].item() == results[1]["opl"][i]["loss"].item()

    for i, (kw, state) in enumerate(zip(NBC_CASES, heads)):
        m = losses.NBCSoftmaxLoss(D, K, **kw).double()
        m.load_state_dict(state)
        xg = x.clone().requires_grad_(True)
        ref = m(xg, y)
        names = [n for n, _ in m.named_parameters()]
        grads = torch.autograd.grad(ref, [xg, *m.parameters()])
        gref, pref = grads[0], dict(zip(names, grads[1:]))
        for rank, res in enumerate(results):
            got = res["nbc"][i]
            torch.testing.assert_close(got["loss"], ref.detach(), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(got["grad"], WORLD * gref[rank * B:(rank + 1) * B], rtol=1e-6, atol=1e-6)
            assert sorted(got["params"]) == sorted(names)
            for n in names:  # the replicated head: its single-process gradient on every rank
                torch.testing.assert_close(got["params"][n], pref[n], rtol=1e-6, atol=1e-6)
        assert results[0]["nbc"][i]["loss"].item() == results[1]["nbc"][i]["loss"].item()

    for res in results:
        assert res["errors"][0].startswith(
            "OrthogonalProjectionLoss: every rank must pass the same batch size (got [5, 6])")
        assert res["errors"][1].startswith("NBCSoftmaxLoss: every rank must pass the same batch size (got [5, 6])")
