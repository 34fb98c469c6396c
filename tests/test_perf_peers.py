"""The benchmark harness (benchmarks/perf_losses.py) runs for real, at smoke sizes.

* The ``peers`` suite with ``--small`` writes ``peers.csv`` / ``peers.md`` with a timed row for
  each of the project's losses it compares, and for each peer library either rows (timed, or
  ``skipped: <reason>`` when the peer is installed but cannot run here, e.g. a GPU-only kernel)
  or a ``skipped: <peer> not installed`` line.
* An existing suite still runs with the interleaved timing and writes its ratio columns.
* The statistics helpers: per-repetition ratios, median and quartiles.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "perf_losses.py")


def _bench():
    spec = importlib.util.spec_from_file_location("_perf_losses", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(args, tmp_path, capsys):
    """The harness's command line, called in this process (``main(argv)``); it times and measures in
    fresh worker processes of its own, as from a shell. Returns what it printed."""
    capsys.readouterr()
    _bench().main([*args, "--out", str(tmp_path)])
    return types.SimpleNamespace(stdout=capsys.readouterr().out)


PROJECT_LOSSES = [
    "losses.sparsemax_loss", "losses.entmax15_loss", "losses.MarginSoftmaxLoss", "losses.PartialFCLoss (rate 0.1)",
    "losses.soft_dice_loss", "losses.dice_semimetric_loss", "losses.jaccard_metric_loss", "losses.infonce_loss",
    "losses.decoupled_softmax_loss", "losses.linear_cross_entropy",
]


@pytest.mark.slow
def test_peers_suite_small_runs_and_reports_every_peer(tmp_path, capsys):
    bench = _bench()
    proc = _run(["--suite", "peers", "--small"], tmp_path, capsys)
    with open(tmp_path / "peers.csv") as f:
        rows = list(csv.DictReader(f))
    md = (tmp_path / "peers.md").read_text()
    assert rows and md.startswith("# Performance: `peers`")

    for name in PROJECT_LOSSES:
        mine = [r for r in rows if r["impl"] == name and r["side"] == "project"]
        assert mine, f"no row for {name}"
        for r in mine:
            assert float(r["ms"]) > 0 and int(r["n"]) >= 3, r
            assert f"| {name} |" in md

    for peer, (module, _) in bench.PEER_PACKAGES.items():
        theirs = [r for r in rows if r["peer"] == peer and r["side"] == "peer"]
        if importlib.util.find_spec(module) is None:
            line = f"skipped: {peer} not installed"
            assert line in md and line in proc.stdout, peer
        else:
            assert theirs, f"{peer} is installed but has no row"
            for r in theirs:
                assert r["ms"] or r["note"].startswith("skipped: "), r
            assert any(r["ms"] for r in theirs) or all(r["note"] for r in theirs), peer

    # a project row next to a peer that ran carries the paired ratio
    timed = {r["impl"] for r in rows if r["ms"]}
    paired = [r for r in rows if r["vs"] and r["vs"] in timed and r["ms"]]
    assert paired and all(float(r["ratio"]) > 0 for r in paired)
    assert (tmp_path / "peers.png").exists() or importlib.util.find_spec("matplotlib") is None
    # the Dice family through a per-class sigmoid, beside MONAI's DiceLoss(sigmoid=True), on the 2-D maps
    sig = [r for r in rows if r["family"] == "dice" and r["target"] == "one-hot (sigmoid)"]
    assert {r["impl"] for r in sig} == {"monai.DiceLoss", "losses.soft_dice_loss", "losses.dice_semimetric_loss",
                                        "losses.jaccard_metric_loss"}
    assert {r["shape"] for r in sig} == {"2x11x16x16"}
    if importlib.util.find_spec("monai") is not None:
        assert all(float(r["ratio"]) > 0 for r in sig if r["side"] == "project")


@pytest.mark.slow
def test_existing_suite_runs_interleaved(tmp_path, capsys):
    """Timed interleaved, and each row's peak memory measured in its own fresh process (two rows,
    the reference and one loss: the memory path is the same for every row)."""
    _run(["--suite", "sparsemax", "--classes", "10", "--threads", "1", "--clock", "cpu", "--repeats", "3",
          "--losses", "entmax15"], tmp_path, capsys)
    with open(tmp_path / "sparsemax.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["loss"] for r in rows} == {"F.cross_entropy", "entmax15 (sort)"}
    for r in rows:
        assert not r["error"], r
        assert float(r["q1"]) <= float(r["ms"]) <= float(r["q3"]) and int(r["n"]) == 3
        assert float(r["x_ce"]) > 0 and float(r["peak_mb"]) >= 0
    assert "CPU time of the process" in (tmp_path / "sparsemax.md").read_text()


@pytest.mark.slow
def test_partial_fc_suite_times_the_optimiser_step_dense_and_sparse(tmp_path, capsys):
    """``--suite partial_fc`` at a small C: the loss alone, with a dense AdamW step and with
    ``sparse_grad=True`` + SparseAdam, every row timed (the memory measurement, a fresh process per
    row, is exercised by the sparsemax suite's test above)."""
    _run(["--suite", "partial_fc", "--classes", "2000", "--threads", "1", "--clock", "cpu", "--repeats", "3",
          "--skip-memory"], tmp_path, capsys)
    with open(tmp_path / "partial_fc.csv") as f:
        rows = {r["loss"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"linear+F.cross_entropy", "margin_softmax", "partial_fc (rate 0.1)", "partial_fc (rate 1.0)",
                         "linear+F.cross_entropy + AdamW", "partial_fc (rate 0.1) + AdamW",
                         "partial_fc (rate 1.0) + AdamW", "partial_fc (rate 0.1, sparse_grad) + SparseAdam"}
    for label, r in rows.items():
        assert not r["error"], r
        assert int(r["n"]) == 3 and float(r["ms"]) > 0, r
    assert "+ SparseAdam" in (tmp_path / "partial_fc.md").read_text()


@pytest.mark.slow
def test_compiled_suite_times_compiled_losses_beside_compiled_ce_and_a_copy(tmp_path, capsys):
    """``--suite compiled`` under torch.compile (inductor, for real), with ratios to compiled
    F.cross_entropy and to a plain copy of the logits: two of its losses (a single-pass loss and the
    exact sparse search, a custom operator inside the graph); every registered loss's inductor
    compile is checked against eager by tests/test_contract.py, and the suite's full case list below."""
    _run(["--suite", "compiled", "--classes", "10", "--repeats", "3", "--skip-memory", "--losses", "z_loss,sparsemax"],
         tmp_path, capsys)
    with open(tmp_path / "compiled.csv") as f:
        rows = {r["loss"]: r for r in csv.DictReader(f)}
    expected = {"F.cross_entropy", "F.cross_entropy (compiled)", "copy", "z_loss (compiled)", "sparsemax (compiled)"}
    assert set(rows) == expected
    suite = {c.get("label", c["name"]) for c in _bench().suite_cases("compiled", [10])}
    bench = _bench()
    assert suite == expected | {f"{name} (compiled)" for name in ("cross_entropy", "bce_with_logits", "logz_penalty",
                                                                  "comp_sum", "gol", "entmax15")} | set(bench.PASSES) | {
        "F.binary_cross_entropy_with_logits (compiled)"}
    for label, r in rows.items():
        assert not r["error"], r
        assert int(r["n"]) == 3 and float(r["x_copy"]) > 0 and float(r["x_ce_compiled"]) > 0, r
    assert float(rows["copy"]["x_copy"]) == 1.0 and float(rows["F.cross_entropy (compiled)"]["x_ce_compiled"]) == 1.0
    assert "| z_loss (compiled) | 256 | 10 |" in (tmp_path / "compiled.md").read_text()


def test_compiled_bounds_add_the_extra_operation_to_the_target():
    """The bound of a compiled row is 1.2x compiled CE plus the unit cost of the one operation per
    element its maths needs beyond cross-entropy's (its pass minus the plain read), at C = 1e5 only."""
    bench = _bench()

    def row(label, ms, c=100000, **kw):
        return dict({"loss": label, "B": 256, "C": c, "ms": ms}, **kw)

    rows = [row("F.cross_entropy (compiled)", 100.0, x_ce_compiled=1.0), row("pass: sum(x)", 10.0),
            row("pass: sum(log1p(|x|))", 50.0), row("pass: sum(log(1 + |x|))", 30.0),
            row("bce_with_logits (compiled)", 155.0, x_ce_compiled=1.55),  # bound 1.2 + 40/100 = 1.6: met
            row("gol (compiled)", 150.0, x_ce_compiled=1.45),  # bound 1.2 + 20/100 = 1.4: missed
            row("gol (compiled)", 1.0, c=1000, x_ce_compiled=3.0)]  # not the target shape: no bound
    got = {b["loss"]: b for b in bench.compiled_bounds(rows)}
    assert set(got) == {"bce_with_logits (compiled)", "gol (compiled)"}
    assert got["bce_with_logits (compiled)"]["bound"] == pytest.approx(1.6) and got["bce_with_logits (compiled)"]["met"]
    assert got["gol (compiled)"]["bound"] == pytest.approx(1.4) and not got["gol (compiled)"]["met"]
    text = "\n".join(bench._bounds_lines(rows))
    assert "| bce_with_logits (compiled) | 256 | 100000 | log1p | 40.00 | 100.00 | 1.60 | 1.55 | met |" in text
    assert "| gol (compiled) | 256 | 100000 | log | 20.00 | 100.00 | 1.40 | 1.45 | missed |" in text
    cases = bench.suite_cases("compiled", [100000])
    assert {c["name"] for c in cases if c["kind"] == "bound"} == set(bench.PASSES) | {"F.binary_cross_entropy_with_logits"}


def test_paired_ratio_is_the_median_of_per_repetition_ratios():
    bench = _bench()
    a = [2.0, 10.0, 3.0]
    b = [1.0, 10.0, 1.0]  # ratios 2, 1, 3
    r = bench.paired_ratio(a, b)
    assert r["ratio"] == 2.0 and r["r_q1"] == 1.5 and r["r_q3"] == 2.5
    # the ratio of medians would be 3 / 1 = 3: a slow phase of the machine (repetition 2) hit both
    s = bench.summarize([0.001, 0.002, 0.003, 0.004])
    assert s["ms"] == pytest.approx(2.5) and s["q1"] == pytest.approx(1.75) and s["q3"] == pytest.approx(3.25)
    assert s["min"] == pytest.approx(1.0) and s["max"] == pytest.approx(4.0) and s["n"] == 4


def test_losses_filter_refuses_names_outside_the_suite(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        _run(["--suite", "compiled", "--losses", "z_loss,nope"], tmp_path, capsys)
    # the message is the exit status, which Python prints to stderr (status 1) at the top level
    assert "perf_losses: --losses names not in the compiled suite (got ['nope'])" in str(info.value.code)


@pytest.mark.slow
def test_lm_head_suite_small_times_measures_and_checks_agreement(tmp_path, capsys):
    """Suite ``lm_head`` at smoke sizes: the reference and the project's many-class path are timed,
    get a steady-state peak memory and agree with float64 linear + CE; cut-cross-entropy either has
    rows (timed, or skipped with the reason: its Triton path needs a GPU) or a 'not installed' line."""
    bench = _bench()
    proc = _run(["--suite", "lm_head", "--small"], tmp_path, capsys)
    with open(tmp_path / "lm_head.csv") as f:
        rows = {r["impl"]: r for r in csv.DictReader(f)}
    md = (tmp_path / "lm_head.md").read_text()
    assert md.startswith("# Performance: `lm_head` (--small smoke sizes)") and "## Agreement" in md
    b, c, d = bench.LM_HEAD_SMALL_SHAPE
    for name in ("linear+F.cross_entropy", "losses.linear_cross_entropy"):
        r = rows[name]
        assert (int(r["B"]), int(r["C"]), int(r["D"])) == (b, c, d)
        assert float(r["ms"]) > 0 and int(r["n"]) >= 3 and float(r["peak_mb"]) > 0, r
        assert r["agrees"] == "True" and float(r["loss_err"]) <= bench.LM_HEAD_TOL["loss"], r
        assert max(float(r["grad_x_err"]), float(r["grad_w_err"])) <= bench.LM_HEAD_TOL["grad"], r
    assert float(rows["losses.linear_cross_entropy"]["x_linear_ce"]) > 0
    # the chunked path holds less than the (B, C) logits and their gradient at once
    assert float(rows["losses.linear_cross_entropy"]["peak_mb"]) < float(rows["linear+F.cross_entropy"]["peak_mb"])
    peer = [r for name, r in rows.items() if name.startswith("cce.")]
    if importlib.util.find_spec("cut_cross_entropy") is None:
        assert "skipped: cut-cross-entropy not installed" in md and "not installed" in proc.stdout
    else:
        assert peer and all(r["ms"] or r["note"].startswith("skipped: ") for r in peer), peer


def test_lm_head_memory_is_a_steady_state_step():
    """The high-water mark resets (Linux ``clear_refs``): the peak of a later step is not the
    peak of an earlier, larger allocation. Checked as the harness measures memory: in a fresh
    process with glibc's fixed mmap threshold (``MALLOC_MMAP_THRESHOLD_=131072``, so a freed block
    leaves the RSS); in a long-lived test worker glibc's adaptive threshold may serve the small
    block from memory the big one left resident, and the growth reads 0."""
    code = (
        "import importlib.util, torch\n"
        f"spec = importlib.util.spec_from_file_location('_pl', {SCRIPT!r})\n"
        "bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)\n"
        "big = torch.ones(64 * 2**20 // 4); del big  # 64 MiB, touched, freed\n"
        "bench._reset_peak_rss(); base = bench._rss_bytes()\n"
        "small = torch.ones(8 * 2**20 // 4)\n"
        "print(bench._hwm_bytes() - base)\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="131072")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    grew = int(proc.stdout.split()[-1])
    assert 4 * 2**20 < grew < 32 * 2**20, grew


@pytest.mark.slow
def test_lm_head_without_cut_cross_entropy_skips_its_rows(tmp_path, monkeypatch, capsys):
    """A peer that is not installed: a 'skipped: ... not installed' line, its rows kept with that
    note, the reference and the project still timed (memory off: the timing path is the point)."""
    bench = _bench()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(bench, "_installed", lambda module: module != "cut_cross_entropy")
    rows = bench.run_lm_head(str(tmp_path), threads=1, repeats=3, max_seconds=0.2, clock="cpu", small=True,
                             skip_memory=True)
    by = {r["impl"]: r for r in rows}
    assert by["losses.linear_cross_entropy"]["ms"] > 0 and by["linear+F.cross_entropy"]["ms"] > 0
    assert by["losses.linear_cross_entropy"]["agrees"]
    peer = [r for name, r in by.items() if name.startswith("cce.")]
    assert peer and all(r["ms"] is None and r["note"] == "skipped: cut-cross-entropy not installed" for r in peer)
    line = "skipped: cut-cross-entropy not installed (pip install cut-cross-entropy)"
    assert line in capsys.readouterr().out and line in (tmp_path / "lm_head.md").read_text()
