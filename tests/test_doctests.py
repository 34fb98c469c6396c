"""The doctests of every module under ``losses/`` run, module by module, and must all pass (the
examples in the docstrings are rendered into the API reference, so they must stay true)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import types

import pytest
import torch

import losses

MODULES = ["losses"] + sorted(m.name for m in pkgutil.walk_packages(losses.__path__, "losses."))
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def run_doctests(module: types.ModuleType):
    """``(examples attempted, failures, report)`` of the doctests defined in ``module``."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report = []
    with torch.random.fork_rng(devices=[]):  # doctests may seed the global RNG
        for test in finder.find(module, module.__name__):
            runner.run(test, out=report.append)
    result = runner.summarize(verbose=False)
    return result.attempted, result.failed, "".join(report)


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests_pass(name):
    attempted, failed, report = run_doctests(importlib.import_module(name))
    assert failed == 0, f"{name}: {failed} of {attempted} doctest examples failed\n{report}"


def test_doctests_are_found():
    """The modules with examples (at least every module that defines a registered loss's function or
    module, the registry and the kit) are run."""
    with_examples = [n for n in MODULES if run_doctests(importlib.import_module(n))[0] > 0]
    families = {o.__module__ for s in losses.list_losses() for o in (s.function, s.module)}
    families |= {"losses._registry", "losses.testing"}
    assert families <= set(with_examples), sorted(families - set(with_examples))


def test_a_wrong_doctest_fails():
    mod = types.ModuleType("fake_losses_module")
    exec('def f():\n    """\n    >>> 1 + 1\n    3\n    """\n', mod.__dict__)
    attempted, failed, report = run_doctests(mod)
    assert (attempted, failed) == (1, 1) and "Expected:\n    3\nGot:\n    2" in report
