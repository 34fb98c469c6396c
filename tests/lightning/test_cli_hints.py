"""A refused loss argument tells the user what to write instead, through the real CLI.

Each case runs :func:`lightning_modules.cli.main` (the ``python -m lightning_modules`` entry) in this
process with ``args=``; parsing fails before any class is built, so each takes about a second.

* a misspelt loss argument in a YAML file (``label_smoothin``): the message names the arguments
  the loss takes, the closest one, and the ``--model.init_args.loss.help <class>`` command, which
  then runs and describes them;
* a registry name where a class path belongs (``loss: cross_entropy``): the message names the
  class path (``losses.CrossEntropyLoss``), and the configuration written that way is accepted;
* a misspelt class path (``losses.CrossEntropyLos``): the closest class the package has.
"""

from __future__ import annotations

import os
import re

import pytest

import losses
from lightning_modules.cli import accepted_arguments, main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "configs", "mnist", "cross_entropy.yaml")


def _refused(capsys, args) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[-1].startswith("error: "), lines
    return lines[-1]


def _loss_yaml(tmp_path, body: str) -> str:
    path = tmp_path / "loss.yaml"
    path.write_text("model:\n  init_args:\n    loss:" + body)
    return str(path)


def test_a_misspelt_loss_argument_lists_the_accepted_names(tmp_path, capsys):
    bad = _loss_yaml(tmp_path, "\n      class_path: losses.CrossEntropyLoss\n      init_args:\n"
                               "        label_smoothin: 0.1\n")
    line = _refused(capsys, ["fit", "--config", RECIPE, "--config", bad])
    assert line.startswith("error: --model.init_args.loss: losses.CrossEntropyLoss does not take 'label_smoothin' "
                           "(did you mean 'label_smoothing'?); it takes: "), line
    names = accepted_arguments(losses.CrossEntropyLoss)
    assert {"label_smoothing", "weight", "ignore_index", "reduction"} <= set(names)
    assert "it takes: " + ", ".join(names) + " " in line
    # the help command the message names runs and describes each argument
    help_cmd = re.search(r"`(--model\.init_args\.loss\.help \S+)`", line).group(1).split()
    assert help_cmd == ["--model.init_args.loss.help", "losses.CrossEntropyLoss"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", RECIPE, *help_cmd])
    assert info.value.code in (0, None)
    out = capsys.readouterr().out
    for name in names:
        assert f"--loss.{name}" in out, name


def test_an_argument_with_no_close_match_still_lists_the_names(tmp_path, capsys):
    line = _refused(capsys, ["fit", "--config", RECIPE, "--model.init_args.loss.init_args.qqq=1"])
    assert "does not take 'qqq'; it takes: label_smoothing" in line and "did you mean" not in line, line


def test_a_registry_name_is_answered_with_its_class_path(tmp_path, capsys):
    line = _refused(capsys, ["fit", "--config", RECIPE, "--config", _loss_yaml(tmp_path, " cross_entropy\n")])
    assert line.startswith("error: --model.init_args.loss: 'cross_entropy' is a registry name, not a class path: "
                           "write class_path: losses.CrossEntropyLoss"), line
    # the same on the command line, for a loss that takes arguments
    line = _refused(capsys, ["fit", "--config", RECIPE, "--model.init_args.loss=z_loss"])
    assert "write class_path: losses.ZLoss" in line and "--model.init_args.loss=losses.ZLoss" in line, line
    # a misspelt registry name: the closest one's class path
    line = _refused(capsys, ["fit", "--config", RECIPE, "--model.init_args.loss=cross_entropi"])
    assert "did you mean class_path: losses.CrossEntropyLoss" in line, line
    # and the configuration written as the message says is accepted
    fixed = _loss_yaml(tmp_path, "\n      class_path: losses.CrossEntropyLoss\n")
    cli = main(["--config", RECIPE, "--config", fixed], run=False)
    assert type(cli.model.loss) is losses.CrossEntropyLoss


def test_a_misspelt_class_path_suggests_the_closest_class(capsys):
    line = _refused(capsys, ["fit", "--config", RECIPE, "--model.init_args.loss=losses.CrossEntropyLos"])
    assert line == ("error: --model.init_args.loss: module 'losses' has no attribute 'CrossEntropyLos' "
                    "(did you mean losses.CrossEntropyLoss?)"), line
