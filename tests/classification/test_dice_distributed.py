"""Dice / Jaccard / soft Dice with ``gather_distributed=True`` on real gloo processes (docs/conventions.md
Distributed, docs/losses/dice.md): every rank returns the loss of the concatenated batch, and its inputs get
world_size x their single-process gradient."""

from __future__ import annotations

import torch

import losses
from tests.dist_utils import run_gloo

WORLD = 2
CONFIGS = [
    ("dice_semimetric", {"reduction": "mean"}),
    ("dice_semimetric", {"reduction": "sum", "log_loss": True, "smooth": 0.3}),
    ("dice_semimetric", {"reduction": "none", "active_classes": "all"}),
    ("jaccard_metric", {"reduction": "mean", "weight": [1.0, 2.0, 0.5, 1.5]}),
    ("soft_dice", {"reduction": "mean", "activation": "sigmoid"}),
    ("jaccard_metric", {"reduction": "mean", "aggregate": "image"}),
    ("dice_semimetric", {"reduction": "sum", "aggregate": "image", "weight": [1.0, 2.0, 0.5, 1.5]}),
    ("jaccard_metric", {"reduction": "mean", "aggregate": "class", "log_loss": True}),
    ("soft_dice", {"reduction": "sum", "aggregate": "class"}),
    ("dice_semimetric", {"reduction": "none", "aggregate": "class"}),
]


def _build(name, cfg, gather):
    cfg = dict(cfg)
    if "weight" in cfg:
        cfg["weight"] = torch.tensor(cfg["weight"], dtype=torch.float64)
    return losses.create_loss(name, gather_distributed=gather, **cfg)


def _global_batch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2 * WORLD, 4, 3, 2, generator=g, dtype=torch.float64)
    t = torch.randint(0, 4, (2 * WORLD, 3, 2), generator=g)
    t[0, 0, 0] = -100
    t[2:, :, :][t[2:] == 3] = 1  # class 3 only on rank 0: "present" must be decided globally
    mask = torch.rand(2 * WORLD, 3, 2, generator=g) > 0.2
    return x, t, mask


def _worker(rank, world_size, payload):
    x, t, mask = _global_batch()
    rows = slice(2 * rank, 2 * rank + 2)
    out = []
    for name, cfg in CONFIGS:
        xl = x[rows].clone().requires_grad_(True)
        loss = _build(name, cfg, True)(xl, t[rows], mask[rows])
        (g,) = torch.autograd.grad(loss.sum(), xl)
        out.append({"loss": loss.detach(), "grad": g})
    err = None
    try:
        n = 2 if rank == 0 else 1
        _build("dice_semimetric", {}, True)(x[:n], t[:n], mask[:n])
    except ValueError as e:
        err = str(e)
    return {"results": out, "err": err}


def test_gather_distributed_equals_single_process_on_global_batch():
    res = run_gloo(_worker, world_size=WORLD)
    x, t, mask = _global_batch()
    for i, (name, cfg) in enumerate(CONFIGS):
        xg = x.clone().requires_grad_(True)
        ref = _build(name, cfg, False)(xg, t, mask)
        (g_ref,) = torch.autograd.grad(ref.sum(), xg)
        local_units = cfg.get("reduction") == "none" and cfg.get("aggregate", "dataset") != "dataset"
        for rank, r in enumerate(res):
            got = r["results"][i]
            rows = slice(2 * rank, 2 * rank + 2)
            if local_units:
                # "none" in image/class mode: this rank's units (class-mode weights use global counts)
                torch.testing.assert_close(got["loss"], ref.detach()[rows], rtol=1e-6, atol=1e-6)
                torch.testing.assert_close(got["grad"], g_ref[rows], rtol=1e-6, atol=1e-6)
            else:
                torch.testing.assert_close(got["loss"], ref.detach(), rtol=1e-6, atol=1e-6)
                torch.testing.assert_close(got["grad"], WORLD * g_ref[rows], rtol=1e-6, atol=1e-6)
    for r in res:
        assert r["err"].startswith("dice_semimetric_loss: every rank must pass the same batch size (got [2, 1])")
