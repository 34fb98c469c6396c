"""The shared sum-backward all-gather on real gloo processes."""

import torch

from losses import _distributed as D
from tests.dist_utils import run_gloo


def _gather_worker(rank, world_size, payload):
    x = (torch.arange(6, dtype=torch.float64).view(3, 2) + 10 * rank).requires_grad_(True)
    g = D.all_gather_with_grad(x)
    # a loss computed identically on every rank from the global batch
    loss = (g ** 2).sum()
    loss.backward()
    labels = D.all_gather_no_grad(torch.tensor([rank, rank, rank]))
    total = D.all_reduce_with_grad(x.sum())
    mx = D.all_reduce_with_grad(x.detach().max(), op="max")
    err = None
    try:
        D.check_equal_batch_sizes("f", 3 + rank)
    except ValueError as e:
        err = str(e)
    return {"g": g.detach(), "grad": x.grad, "labels": labels, "total": total.detach(), "max": mx, "err": err}


def test_all_gather_sums_gradients_over_ranks():
    res = run_gloo(_gather_worker, world_size=2)
    xs = [torch.arange(6, dtype=torch.float64).view(3, 2) + 10 * r for r in range(2)]
    full = torch.cat(xs)
    for r, out in enumerate(res):
        torch.testing.assert_close(out["g"], full)
        # single-process gradient of sum(g^2) w.r.t. this rank's rows is 2x; summed over 2 ranks: 4x
        torch.testing.assert_close(out["grad"], 2 * 2 * xs[r])
        assert out["labels"].tolist() == [0, 0, 0, 1, 1, 1]
        assert float(out["total"]) == float(full.sum())
        assert float(out["max"]) == float(full.max())
        assert out["err"].startswith("f: every rank must pass the same batch size (got [3, 4])")


def test_single_process_is_identity():
    x = torch.randn(3, 2)
    assert D.all_gather_with_grad(x) is x
    assert D.world_size() == 1 and D.rank() == 0
