"""A refused argument ends the command with the project's own message as the last line.

The output must be a few lines ending with ``error: <Class>: <problem> ...``. The deepest argument
(the loss's, inside the model's configuration) runs ``python -m lightning_modules fit`` in a
subprocess, the command a user types, and at the same time with ``LOSSES_DEBUG=1``, where the full
traceback must come instead (the switch is one code path for every argument). The other bad inputs
run the same entry, :func:`lightning_modules.cli.main`, in this process (a process start costs ~8 s
of imports and checks nothing more: the error path is the one the subprocess case took). Every run
fails while the classes are instantiated, before any data is loaded or any step is trained.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lightning_modules.cli import DEBUG_ENV, error_message, main

#: one real CLI run in a subprocess, like the recipe tests
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


def _check_short_error(code, out, err, expected) -> None:
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert code == 2, (code, err[-3000:])
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: "), err[-3000:]
    for part in expected:
        assert part in last, (part, last)
    assert len(lines) < 15, "\n".join(lines)
    assert "Traceback" not in err and "Given value" not in err
    assert any(f"{DEBUG_ENV}=1" in line for line in lines[-2:]), lines[-2:]  # how to see the full traceback


def _run_in_process(args, tmp_path, capfd, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["fit", *args, f"--trainer.default_root_dir={tmp_path}"])
    out, err = capfd.readouterr()
    return info.value.code, out, err


def test_bad_loss_argument_ends_with_the_project_message_or_the_traceback_when_debugging(tmp_path):
    """The real command, twice at once: plain (the short form) and with the debug switch on."""
    make_args, expected = CASES[DEBUG_CASE]
    (code, out, err), (dcode, _dout, derr) = _run_plain_and_debug(make_args(tmp_path), tmp_path)
    _check_short_error(code, out, err, expected)
    assert dcode != 0
    assert "Traceback (most recent call last)" in derr, derr[-3000:]
    assert expected[0] in derr and "lightning_modules" in derr


@pytest.mark.parametrize("case", sorted(set(CASES) - {DEBUG_CASE}))
def test_bad_argument_ends_with_the_project_message(case, tmp_path, capfd, monkeypatch):
    make_args, expected = CASES[case]
    _check_short_error(*_run_in_process(make_args(tmp_path), tmp_path, capfd, monkeypatch), expected)


def test_parse_errors_name_the_argument(tmp_path, capfd, monkeypatch):
    """Errors jsonargparse finds itself (no project code ran) are told by argument, in one line."""
    code, _out, err = _run_in_process(["--config", CFG("vision", "comp_sum_noisy.yaml"),
                                       "--model.init_args.loss=losses.NoSuchLoss"], tmp_path, capfd, monkeypatch)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) < 5, err
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
