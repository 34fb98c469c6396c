"""The 2-process DDP recipe (gloo, CPU, sharded Partial FC centres) runs through
``python -m lightning_modules fit`` and takes the same steps as a single-process run.

Both runs see the same global batches: the DDP recipe uses ``shuffle: false`` (the split is
pre-shuffled once, seeded), 32 images per rank, and the single-process run 64 images with
``distributed: false``; with ``limit_*_batches=2`` no DistributedSampler padding enters. The
backbone normalises per sample (GroupNorm), Partial FC uses ``sample_rate=1.0`` (where the
sharded loss equals the single-process loss, docs/losses/partial_fc.md), and the loss gives every rank the
global-batch loss with world_size x input gradients, so DDP's averaging recovers the
single-process step. Stated tolerance: 1e-4 absolute on losses, ECE, cosines and the gathered
class centres after two AdamW steps (float reduction order differs across processes); at most
one of the 128 validation images may flip on the accuracies.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest
import torch

from tests.lightning.recipe_utils import SHORT, find_checkpoint, run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "configs", "ddp", "partial_fc_digits.yaml")
COMMON = ["--trainer.num_sanity_val_steps=0", "--model.init_args.loss.init_args.sample_rate=1.0"]

pytestmark = pytest.mark.slow


def _logger_config(path, save_dir) -> str:
    """A stacked --config that makes both runs write metrics.csv (rank 0 only under DDP)."""
    with open(path, "w") as fh:
        fh.write(
            "trainer:\n  logger:\n    class_path: pytorch_lightning.loggers.CSVLogger\n"
            f"    init_args:\n      save_dir: {save_dir}\n      name: csv\n"
        )
    return str(path)


def _last_metrics(save_dir) -> dict:
    path = os.path.join(str(save_dir), "csv", "version_0", "metrics.csv")
    out: dict = {}
    with open(path) as fh:
        for row in csv.DictReader(fh):
            out.update({k: float(v) for k, v in row.items() if v not in ("", None)})
    return out


def _centres(ckpt_path) -> torch.Tensor:
    state = torch.load(ckpt_path, map_location="cpu", weights_only=False)["state_dict"]
    return state["loss.weight"]


@pytest.mark.parametrize("sparse_grad", [True], ids=["sparse_grad"])
def test_ddp_partial_fc_matches_single_process(tmp_path, sparse_grad):
    """``sparse_grad=True`` (the update of the papers): the shard's sparse gradient goes to SparseAdam
    (the rest of the model to AdamW, joined into one optimiser) on every rank, as the single process
    does with all centres. The dense update of sharded centres under two gloo processes is the
    identities recipe's DDP test (tests/lightning/test_identities.py); one DDP run here (each costs
    two process starts) checks this recipe and the classifier's metrics synchronised across ranks."""
    common = [*COMMON, f"--model.init_args.loss.init_args.sparse_grad={str(sparse_grad).lower()}"]
    ddp_dir, single_dir = tmp_path / "ddp", tmp_path / "single"
    ddp_dir.mkdir()
    single_dir.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [
        sys.executable, "-m", "lightning_modules", "fit",
        "--config", RECIPE,
        "--config", _logger_config(tmp_path / "ddp_logger.yaml", ddp_dir),
        f"--trainer.default_root_dir={ddp_dir}", *SHORT, *common,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]

    single = run_cli(
        "fit", RECIPE, single_dir,
        [
            "--config", _logger_config(tmp_path / "single_logger.yaml", single_dir),
            "--trainer.strategy=auto", "--trainer.devices=1",
            "--data.init_args.batch_size=64", "--model.init_args.loss.init_args.distributed=false", *common,
        ],
    )
    assert single.trainer.world_size == 1
    opt = single.model.optimizers(use_pl_optimizer=False)
    assert (type(opt).__name__ == "DenseSparseOptimizer") == sparse_grad
    ddp_m, single_m = _last_metrics(ddp_dir), _last_metrics(single_dir)

    log = proc.stdout + proc.stderr
    assert "distributed_backend=gloo" in log and "Starting with 2 processes" in log, log[-4000:]
    assert ddp_m["step"] == single_m["step"] and ddp_m["epoch"] == single_m["epoch"] == 0
    keys = [k for k in single_m if k.startswith("val/")]
    assert {"val/loss", "val/top1", "val/balanced_acc", "val/ece", "val/cos_intra", "val/cos_inter"} <= set(keys)
    for k in keys:
        assert k in ddp_m, k
        tol = 1.0 / 128 + 1e-6 if ("acc" in k or "top" in k) else 1e-4
        assert abs(ddp_m[k] - single_m[k]) <= tol, (k, ddp_m[k], single_m[k])
    assert abs(ddp_m["train/loss_epoch"] - single_m["train/loss_epoch"]) <= 1e-4

    # checkpoints are world-size independent: the DDP checkpoint holds the full gathered (C, D)
    # centres, equal to the single-process centres after the same two steps
    w_ddp, w_single = _centres(find_checkpoint(ddp_dir)), _centres(find_checkpoint(single_dir))
    assert w_ddp.shape == w_single.shape == (10, 64)
    assert torch.allclose(w_ddp, w_single, atol=1e-4, rtol=0)


def test_sharded_centres_are_ignored_by_ddp():
    """The module copies the loss's ddp_ignored_parameters() into the attribute DDP reads
    (checked in one process with a single-rank gloo group, no subprocess)."""
    import torch.distributed as dist

    from losses import PartialFCLoss
    from lightning_modules.models import VisionClassifier

    import socket

    assert not dist.is_initialized()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        loss = PartialFCLoss(16, 10, sample_rate=1.0, distributed=True)
        model = VisionClassifier(loss, backbone="test_resnet", num_classes=10, embedding_dim=16, robust_eval=False)
        assert model.net.head is None  # the loss owns the head
        model.setup("fit")
        assert model._ddp_params_and_buffers_to_ignore == ["loss.weight"]
    finally:
        dist.destroy_process_group()
