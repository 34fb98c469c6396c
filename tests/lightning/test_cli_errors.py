"""A refused argument ends the command with the project's own message as the last line.

Each bad input runs ``python -m lightning_modules fit`` in a subprocess, where the output must be a
few lines ending with ``error: <Class>: <problem> ...``; one of them (the loss argument, the deepest
in the configuration) also runs with ``LOSSES_DEBUG=1`` at the same time, where the full traceback
must come instead (the switch is one code path for every argument). Every run fails while the
classes are instantiated, before any data is loaded or any step is trained.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lightning_modules.cli import DEBUG_ENV, error_message

#: real CLI runs in subprocesses (a process start each), like the recipe tests
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CFG = lambda *p: os.path.join(ROOT, "configs", *p)  # noqa: E731


def _env(**extra) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop(DEBUG_ENV, None)
    env.update(extra)
    return env


def _run_plain_and_debug(args, tmp_path, debug: bool = True):
    cmd = [sys.executable, "-m", "lightning_modules", "fit", *args, f"--trainer.default_root_dir={tmp_path}"]
    envs = (_env(), _env(**{DEBUG_ENV: "1"})) if debug else (_env(),)
    procs = [subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
             for env in envs]
    outs = [p.communicate(timeout=300) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


CASES = {
    "data": (
        lambda tmp: ["--config", CFG("own_data", "image_folder.yaml"), f"--data.init_args.root={tmp / 'no_images'}"],
        ("ImageFolderDataModule: root is not a folder", "no_images", "point it at a folder"),
    ),
    "model": (
        lambda tmp: ["--config", CFG("vision", "comp_sum_noisy.yaml"), "--model.init_args.embedding_dim=-3"],
        ("VisionClassifier: embedding_dim must be a positive integer (got -3)",),
    ),
    "loss": (
        lambda tmp: ["--config", CFG("vision", "comp_sum_noisy.yaml"), "--model.init_args.loss.init_args.tau=-1"],
        ("CompSumLoss: tau must be finite", "(got -1.0)"),
    ),
}


#: the case that also runs with the debug switch on
DEBUG_CASE = "loss"


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_argument_ends_with_the_project_message(case, tmp_path):
    make_args, expected = CASES[case]
    runs = _run_plain_and_debug(make_args(tmp_path), tmp_path, debug=case == DEBUG_CASE)
    code, out, err = runs[0]

    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert code == 2, (code, err[-3000:])
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: "), err[-3000:]
    for part in expected:
        assert part in last, (part, last)
    assert len(lines) < 15, "\n".join(lines)
    assert "Traceback" not in err and "Given value" not in err
    assert any(f"{DEBUG_ENV}=1" in line for line in lines[-2:]), lines[-2:]  # how to see the full traceback

    if case != DEBUG_CASE:
        return
    dcode, _dout, derr = runs[1]
    assert dcode != 0
    assert "Traceback (most recent call last)" in derr, derr[-3000:]
    assert expected[0] in derr and "lightning_modules" in derr


def test_parse_errors_name_the_argument(tmp_path):
    """Errors jsonargparse finds itself (no project code ran) are told by argument, in one line."""
    cmd = [sys.executable, "-m", "lightning_modules", "fit", "--config", CFG("vision", "comp_sum_noisy.yaml"),
           "--model.init_args.loss=losses.NoSuchLoss"]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) < 5, proc.stderr
    assert lines[-1] == "error: --model.init_args.loss: module 'losses' has no attribute 'NoSuchLoss'", lines[-1]


def test_error_message_picks_the_innermost_project_exception():
    import losses

    try:
        try:
            losses.CompSumLoss(tau=-1.0)  # raised inside the project's code
        except ValueError:
            try:
                raise KeyError("a wrapper without the project's words")  # __context__: the project error
            except KeyError as middle:
                raise ValueError("Does not validate against any of the Union subtypes\nGiven value: x") from middle
    except ValueError as outer:
        got = error_message(outer)
    assert got.startswith("CompSumLoss: tau must be finite and satisfy tau >= 0.0 (got -1.0); "), got
    assert "\n" not in got
