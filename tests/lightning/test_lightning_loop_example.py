"""``examples/lightning_loop.py`` runs with every registered logits loss.

The example builds the loss, the VisionClassifier and the digits DataModule by hand; a loss built
from the training label distribution (``logit_adjusted``, ``balanced_softmax``) must get the
DataModule's 10 class counts / prior, linked as the LightningCLI links them, not the registry's
5-class example values. Each loss runs in this process for one training, validation and test
batch of a tiny backbone (about 0.3-0.6 s each, one thread).
"""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
import torch

import losses
from lightning_modules.cli import prior_list
from lightning_modules.data import DigitsDataModule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOGITS_LOSSES = sorted(s.name for s in losses.list_losses() if s.kind == losses.InputKind.LOGITS)
SMOKE = dict(epochs=1, backbone="test_resnet", max_batches=1, quiet=True)


@pytest.fixture(scope="module")
def example():
    # one intra-op thread, as under the suite's xdist workers: a tiny model on a shared 2-core
    # machine runs 4-5x slower with two threads fighting over the cores
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("lightning_loop_example",
                                                  os.path.join(ROOT, "examples", "lightning_loop.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        torch.set_num_threads(threads)


def test_every_logits_loss_runs_in_the_example(example):
    assert {"logit_adjusted", "balanced_softmax", "cross_entropy", "z_loss"} <= set(LOGITS_LOSSES)
    failed = {}
    for name in LOGITS_LOSSES:
        try:
            metrics = example.run(name, **SMOKE)
        except Exception as exc:  # collect every failure, then report them together
            failed[name] = f"{type(exc).__name__}: {exc}"
            continue
        if not ({"test/loss", "test/top1", "test/ece"} <= set(metrics) and math.isfinite(metrics["test/loss"])):
            failed[name] = f"metrics {metrics}"
    assert not failed, failed


def test_class_counts_and_prior_come_from_the_data(example):
    data = DigitsDataModule(seed=0)
    counts = [int(c) for c in data.class_counts]
    assert len(counts) == data.num_classes == 10
    prior = dict(example.build_loss("logit_adjusted", data, 64).named_buffers())["class_prior"]
    counted = dict(example.build_loss("balanced_softmax", data, 64).named_buffers())["class_counts"]
    assert counted.tolist() == counts  # the 10 training counts, not the registry's 5 example values
    torch.testing.assert_close(prior.double(), torch.tensor(prior_list(counts), dtype=torch.float64))


def test_the_command_line_entry_prints_the_metrics(example, capsys):
    example.main(["--loss", "balanced_softmax", "--epochs", "1", "--max-batches", "1", "--backbone", "test_resnet"])
    out = capsys.readouterr().out
    assert "'test/top1'" in out and "test/ece: expected calibration error" in out
