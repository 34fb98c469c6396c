"""Every loss module documents itself: ``help(losses.SomeLoss)`` shows its constructor
arguments, its ``forward`` inputs and the function with the maths, and ``forward`` has its own
docstring instead of torch's generic one."""

from __future__ import annotations

import inspect

import pytest
from torch import nn

import losses

MODULES = sorted({s.module for s in losses.list_losses() if s.module is not None}, key=lambda m: m.__name__)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_class_docstring_lists_the_constructor_arguments(module):
    doc = inspect.getdoc(module) or ""
    assert "Args:" in doc, f"{module.__name__}: no Args: section"
    names = [p.name for p in inspect.signature(module.__init__).parameters.values() if p.name != "self"]
    missing = [n for n in names if f"    {n}:" not in doc]
    assert not missing, f"{module.__name__}: constructor arguments not documented: {missing}"
    assert ":func:`losses." in doc, f"{module.__name__}: no pointer to the function with the maths"
    assert "forward(" in doc, f"{module.__name__}: the forward inputs are not described"


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_forward_has_its_own_docstring(module):
    doc = inspect.getdoc(module.forward) or ""
    assert doc and doc != inspect.getdoc(nn.Module.forward), f"{module.__name__}.forward inherits torch's docstring"
    assert "Returns" in doc or "return" in doc.lower(), f"{module.__name__}.forward: the output is not described"
