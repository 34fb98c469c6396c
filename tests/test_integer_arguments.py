"""Integer arguments accept what torch's own accept.

``F.cross_entropy(..., ignore_index=...)`` takes a Python int, a NumPy integer and a one-element
integer tensor such as ``y[0]``; every loss of the registry that takes ``ignore_index`` does the
same, in its function and in its module, and gives the value it gives for the Python int. A bool
(Python, NumPy or tensor), a float and a float tensor stay a ``TypeError`` naming the argument.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import losses
from losses._core import check_int
from losses.testing import build, call, example

SPECS = losses.list_losses()


def _takes(obj, name):
    return name in inspect.signature(obj).parameters


IGNORING = [s for s in SPECS if _takes(s.module, "ignore_index")]
IGNORING_FN = [s for s in IGNORING if _takes(s.function, "ignore_index")
               and not s.owns_head and s.kind != "model"]


def _ids(args):
    """The example's arguments with its integer ids (the last positional argument) made to ignore
    one real class id ``k`` instead of the default -100 (padding ids become ``k``), and ``k``."""
    target = args[-1]
    if isinstance(target, torch.Tensor) and target.dtype == torch.bool and target.dim() == 2:
        target = target.long().argmax(1)  # a ranking mask as one positive id per row
    if not (isinstance(target, torch.Tensor) and not target.is_floating_point() and target.dtype != torch.bool):
        return args, None, None
    valid = target[target >= 0]
    if not valid.numel():
        return args, None, None
    k = int(valid.flatten()[0])
    target = torch.where(target < 0, torch.full_like(target, k), target)
    return args[:-1] + (target,), target, k


def _example_ignoring(spec):
    """The entry's float64 example, made to ignore a real class id ``k`` (see :func:`_ids`)."""
    args, kwargs = example(spec, dtype=torch.float64)
    args, target, k = _ids(args)
    assert k is not None, f"{spec.name}: its example target holds no class ids"
    return args, kwargs, target, k


def _variants(k: int):
    return {"numpy int64": np.int64(k), "numpy int32": np.int32(k), "0-dim tensor": torch.tensor(k),
            "one-element tensor": torch.tensor([k]), "int32 tensor": torch.tensor(k, dtype=torch.int32)}


@pytest.mark.parametrize("spec", IGNORING, ids=lambda s: s.name)
def test_module_ignore_index_accepts_torch_and_numpy_integers(spec):
    args, kwargs, target, k = _example_ignoring(spec)
    ref = call(build(spec, ignore_index=k), args, kwargs)
    for label, v in _variants(k).items():
        module = build(spec, ignore_index=v)
        assert type(module.ignore_index) is int and module.ignore_index == k, label
        got = call(module, args, kwargs)
        torch.testing.assert_close(got, ref, rtol=0, atol=0, msg=f"{spec.name}, ignore_index as {label}")
    # the id the example ignores really changes the value (the test cannot pass by ignoring nothing)
    assert not torch.equal(ref, call(build(spec), args, kwargs)), spec.name


@pytest.mark.parametrize("spec", IGNORING_FN, ids=lambda s: s.name)
def test_function_ignore_index_accepts_torch_and_numpy_integers(spec):
    args, kwargs, target, k = _example_ignoring(spec)
    fkw = {key: v for key, v in spec.example_kwargs.items() if _takes(spec.function, key)}
    fkw.update(spec.function_kwargs)
    torch.manual_seed(0)
    ref = spec.function(*args, **fkw, **kwargs, ignore_index=k)
    for label, v in {**_variants(k), "y[0]-style element": target.flatten()[(target.flatten() == k).nonzero()[0, 0]]
                     }.items():
        torch.manual_seed(0)
        got = spec.function(*args, **fkw, **kwargs, ignore_index=v)
        torch.testing.assert_close(got, ref, rtol=0, atol=0, msg=f"{spec.name}, ignore_index as {label}")


@pytest.mark.parametrize("spec", IGNORING, ids=lambda s: s.name)
@pytest.mark.parametrize("bad", [True, np.bool_(False), torch.tensor(True), 6.0, torch.tensor(6.0), "6",
                                 torch.tensor([1, 2])],
                         ids=["bool", "numpy bool", "bool tensor", "float", "float tensor", "str", "two-element"])
def test_non_integer_ignore_index_is_a_type_error(spec, bad):
    with pytest.raises(TypeError, match=r"ignore_index must be an int"):
        build(spec, ignore_index=bad)


def test_check_int_returns_python_ints_and_keeps_its_bounds():
    for v in (3, np.int64(3), np.uint8(3), torch.tensor(3), torch.tensor([3], dtype=torch.int16)):
        out = check_int("f", "k", v, low=1)
        assert type(out) is int and out == 3
    with pytest.raises(ValueError, match=r"^f: k must be a positive int \(got tensor\(0\)\)"):
        check_int("f", "k", torch.tensor(0), low=1)
    with pytest.raises(TypeError, match=r"^f: k must be a positive int \(got np\.True_\)|^f: k must be a positive int \(got True\)"):
        check_int("f", "k", np.bool_(True), low=1)


def test_integer_hyperparameters_take_numpy_integers():
    """Not only ``ignore_index``: counts such as soft top-k's ``k`` go through the same check."""
    spec = losses.get_loss_spec("soft_topk")
    args, kwargs = example(spec, dtype=torch.float64)
    k = spec.example_kwargs.get("k", 2)
    ref = call(build(spec, k=int(k)), args, kwargs)
    got = call(build(spec, k=np.int64(k)), args, kwargs)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
