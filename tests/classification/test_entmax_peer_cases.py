"""The cases of the ``entmax`` package's own loss tests, run on this library's sparse losses.

That suite builds its losses with ``ignore_index=y[0]`` (a one-element integer tensor taken from
the targets), which ``torch.nn.functional.cross_entropy`` also accepts; the losses here take it
the same way. Its ``"elementwise_mean"`` reduction is this library's ``"mean"``.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch.autograd import gradcheck

import losses

LOSSES = {
    "sparsemax": losses.SparsemaxLoss,
    "sparsemax k=5": functools.partial(losses.SparsemaxLoss, k=5),
    "entmax15": losses.Entmax15Loss,
    "entmax15 k=5": functools.partial(losses.Entmax15Loss, k=5),
    "entmax_bisect": losses.EntmaxBisectLoss,
}


def _data(seed: int, n: int = 4, c: int = 10):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randn(n, c, dtype=torch.float64, generator=g).argmax(1)
    return x, y


@pytest.mark.parametrize("name", LOSSES)
def test_non_negative(name):
    for seed in range(5):
        x, y = _data(seed)
        assert bool((LOSSES[name](reduction="none")(x, y) >= 0).all())


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("ignore", [False, True])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_gradcheck_with_ignore_index_taken_from_the_targets(name, ignore, reduction):
    for seed in range(2):
        x, y = _data(seed)
        loss = LOSSES[name](ignore_index=y[0] if ignore else -100, reduction=reduction)
        assert loss.ignore_index == (int(y[0]) if ignore else -100)
        assert gradcheck(loss, (x, y), eps=1e-5)


@pytest.mark.parametrize("name", LOSSES)
def test_ignored_index_lowers_the_sum(name):
    x, y = _data(7, n=20, c=6)
    ignoring = LOSSES[name](reduction="sum", ignore_index=y[0])
    keeping = LOSSES[name](reduction="sum", ignore_index=-100)
    kept_rows = y != y[0]
    assert bool(ignoring(x, y) < keeping(x, y))
    torch.testing.assert_close(ignoring(x, y), keeping(x[kept_rows], y[kept_rows]), rtol=1e-12, atol=1e-12)
