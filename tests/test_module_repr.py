"""Loss modules' ``repr`` is derived from the constructor (``losses._core.auto_extra_repr``):
every keyword hyperparameter appears as ``name=value``, in signature order."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import losses
from losses._core import auto_extra_repr

MODULES = sorted({s.module for s in losses.list_losses() if s.module is not None}, key=lambda m: m.__name__)


def _specs_of(module):
    return [s for s in losses.list_losses() if s.module is module]


def _build(module):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _specs_of(module)[0].create(**_specs_of(module)[0].example_kwargs)


def _may_be_hidden(module):
    """Constructor arguments the repr leaves out: the registry's ``tensor_args`` (the module's own
    tensors), the class's ``_repr_skip`` and, while unset, its ``_repr_omit_none`` and
    ``_repr_omit_false``."""
    hidden = {a for s in _specs_of(module) for a in s.tensor_args}
    return (hidden | set(getattr(module, "_repr_skip", ())) | set(getattr(module, "_repr_omit_none", ()))
            | set(getattr(module, "_repr_omit_false", ())))


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_repr_lists_the_constructor_hyperparameters_in_order(module):
    assert module.extra_repr is auto_extra_repr
    m = _build(module)
    text = m.extra_repr()
    names = [part.split("=", 1)[0] for part in text.split(", ") if "=" in part]
    sig = [n for n in inspect.signature(module.__init__).parameters if n != "self"]
    assert names == [n for n in sig if n in names], f"{module.__name__}: not in signature order: {text}"
    skipped = set(sig) - set(names) - _may_be_hidden(module)
    assert not skipped, f"{module.__name__}: hyperparameters missing from the repr: {sorted(skipped)}"


def test_repr_shows_set_values_and_hides_tensors():
    m = losses.CrossEntropyLoss(weight=torch.ones(3), softcap=3.0)
    assert repr(m) == "CrossEntropyLoss(label_smoothing=0.0, ignore_index=-100, reduction='mean', softcap=3.0)"
    assert "bias=False" in repr(losses.LinearCrossEntropyLoss(4, 3, bias=False))
    assert "bias=False" in repr(losses.NBCSoftmaxLoss(4, 3, bias=False))
    assert "scale=3.0" in repr(losses.WCDASLoss(4, 3, scale=3.0))
    assert "process_group" not in repr(losses.PartialFCLoss(4, 3))
