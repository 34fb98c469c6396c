"""The GPU check (scripts/gpu_check.sh, benchmarks/perf_device.py): its CPU-side parts run here
(argument parsing, the paired statistics, the timing loop on the CPU, the report files, the
script's refusal without a GPU); the CUDA run itself is in the ``cuda`` subset."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import perf_device as pd  # noqa: E402

sys.path.pop(0)


def test_arguments_defaults_and_refusals():
    a = pd.parse_args([])
    assert a.device == "cuda" and a.dtypes == ["fp32", "bf16"] and a.sizes == [(256, 1000), (256, 100000)]
    assert a.losses == list(pd.DEFAULT_LOSSES) and a.repeats == 30
    assert pd.parse_args(["--sizes", "8x10", "--dtypes", "bf16", "--losses", "z_loss"]).sizes == [(8, 10)]
    for bad, match in ((["--sizes", "8by10"], "BxC pairs"), (["--sizes", "8x1"], "C >= 2"),
                       (["--dtypes", "fp16"], "--dtypes takes"), (["--repeats", "0"], "--repeats")):
        with pytest.raises(SystemExit, match=match):
            pd.parse_args(bad)


def test_paired_ratios_are_medians_of_per_repetition_ratios():
    times = {"copy": [1.0, 1.0, 2.0], "F.cross_entropy": [2.0, 4.0, 4.0], "z_loss": [3.0, 4.0, 10.0]}
    s = pd.summarize(times, "F.cross_entropy", "copy")
    assert s["z_loss"]["x_ce"] == pytest.approx(1.5)  # ratios 1.5, 1.0, 2.5
    assert s["z_loss"]["x_copy"] == pytest.approx(4.0)  # ratios 3, 4, 5
    assert s["z_loss"]["ms"] == 4.0 and s["z_loss"]["q1"] == 3.5 and s["z_loss"]["q3"] == 7.0
    assert s["copy"]["x_copy"] == 1.0 and s["F.cross_entropy"]["x_ce"] == 1.0


def test_cpu_run_writes_the_report(tmp_path):
    code = pd.main(["--device", "cpu", "--sizes", "16x10", "--dtypes", "fp32,bf16", "--losses", "z_loss,sparsemax",
                    "--repeats", "3", "--warmup", "1", "--out", str(tmp_path)])
    assert code == 0
    with open(tmp_path / "device.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["dtype"], r["case"]) for r in rows] == [
        (d, c) for d in ("fp32", "bf16") for c in ("copy", "F.cross_entropy", "z_loss", "sparsemax")]
    for r in rows:
        assert not r["error"] and int(r["n"]) == 3 and float(r["q1"]) <= float(r["ms"]) <= float(r["q3"]), r
        assert float(r["x_ce"]) > 0 and float(r["x_copy"]) > 0
    md = (tmp_path / "device.md").read_text()
    assert md.startswith("# Performance on CPU") and "| bf16 | 16 | 10 | sparsemax |" in md
    assert json.loads((tmp_path / "device_meta.json").read_text())["repeats"] == 3


def test_losses_outside_logits_or_without_defaults_are_refused():
    with pytest.raises(SystemExit, match="takes losses of \\(logits, target\\); 'partial_fc' takes embeddings"):
        pd.parse_args(["--losses", "partial_fc"])
    with pytest.raises(SystemExit, match="'balanced_softmax' does not build with its defaults"):
        pd.parse_args(["--losses", "balanced_softmax"])
    with pytest.raises(SystemExit, match="--losses: "):
        pd.parse_args(["--losses", "no_such_loss"])


def test_a_loss_that_fails_while_timed_is_reported_not_fatal():
    def boom():
        raise RuntimeError("out of memory")

    logits = torch.zeros(2, 3, requires_grad=True)
    res = pd.time_cases({"copy": lambda: logits.detach().clone(), "bad": boom}, "cpu", 2, 0, logits)
    assert set(res["times"]) == {"copy"} and res["errors"] == {"bad": "RuntimeError: out of memory"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpu_check_refuses_without_a_gpu(tmp_path):
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHON=sys.executable))
    assert proc.returncode == 2 and "gpu_check.sh: no CUDA device visible" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpu_claims_refuses_without_a_gpu(tmp_path):
    """scripts/gpu_claims.sh (the GPU-trained benchmark claims, a session at a time) stops before
    installing or running anything where no CUDA device is visible."""
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_claims.sh"), "pfc_cosface_c1e5_r4", "5",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHON=sys.executable))
    assert proc.returncode == 2 and "gpu_claims.sh: no CUDA device visible" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_run_writes_the_report(tmp_path):
    code = pd.main(["--sizes", "64x1000", "--repeats", "5", "--out", str(tmp_path)])
    assert code == 0
    assert "| bf16 | 64 | 1000 | entmax15 |" in (tmp_path / "device.md").read_text()
