"""benchmarks/perf_gpu.py (the GPU side-by-side run): its CPU-side parts run here (arguments, the
gradient-memory accounting, the interleaved loop and the report files on CPU tensors at tiny
shapes); the GPU run itself is committed under results/perf/gpu/ with the device named."""

from __future__ import annotations

import csv
import json
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import perf_gpu as pg  # noqa: E402

sys.path.pop(0)


def test_arguments_defaults_and_refusals():
    a = pg.parse_args([])
    assert a.device == "cuda" and a.groups == ["logits", "lm_head", "sparse"] and a.repeats == 10
    assert pg.parse_args(["--groups", "configs"]).groups == ["configs"]
    for bad, match in ((["--groups", "nope"], "--groups takes"), (["--repeats", "0"], "--repeats")):
        with pytest.raises(SystemExit, match=match):
            pg.parse_args(bad)


def test_gradient_bytes_skip_gradients_written_over_their_input():
    a = torch.zeros(4, 5, requires_grad=True)
    b = torch.zeros(3, requires_grad=True)
    a.grad = torch.ones(4, 5)
    b.grad = b.detach()  # in place: the input's own storage
    assert pg.grad_bytes((a, b, "not a tensor")) == 4 * 5 * 4


def test_cpu_run_writes_the_report(tmp_path):
    code = pg.main(["--device", "cpu", "--small", "--groups", "logits,sparse", "--repeats", "2", "--warmup", "1",
                    "--out", str(tmp_path)])
    with open(tmp_path / "gpu.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    ours = [r for r in rows if not r["case"].startswith(("Liger", "entmax pkg"))]
    assert {r["case"] for r in ours} >= {"copy", "F.cross_entropy", "cross_entropy", "z_loss", "sparsemax"}
    for r in ours:  # the library's rows: timed, and checked against their references
        assert not r["error"] and int(r["n"]) == 2 and float(r["q1"]) <= float(r["ms"]) <= float(r["q3"]), r
        if r["rel_err"] and r["case"] != "F.cross_entropy":  # F.cross_entropy returns a bf16 loss for bf16 logits
            assert float(r["rel_err"]) < 1e-5, r
    assert code == (1 if any(r["error"] for r in rows) else 0)  # a peer that cannot run on CPU is reported
    md = (tmp_path / "gpu.md").read_text()
    assert md.startswith("# GPU kernels side by side on cpu") and "## logits" in md and "## sparse" in md
    meta = json.loads((tmp_path / "gpu_meta.json").read_text())
    assert meta["repeats"] == 2 and "softmax_rows" in meta["kernels"] and meta["torch"] == torch.__version__
