"""Contract tests run over every registered loss (docs/conventions.md, docs/contributing.md "Adding a
loss"). A family joins them by registering; per-family maths lives in its own test file."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re

import pytest
import torch

import losses
from losses import INPUT_KINDS
from losses.testing import build, call, check_loss, example
from tests._helpers.names import LOSS_NAMES

SPECS = losses.list_losses()
NAMES = [s.name for s in SPECS]
BY_NAME = {s.name: s for s in SPECS}

#: Documented exact infinities (docs/conventions.md), from the registry's ``documented_inf``:
#: comp-sum with tau < 1 overflows to +inf on logits x1e4; the registry example uses tau = 0.5.
DOCUMENTED_INF = {s.name for s in SPECS if s.documented_inf}

#: Every name the registry must hold: the one list of names (tests/_helpers/names.py).
EXPECTED_NAMES = LOSS_NAMES


# --------------------------------------------------------------------------------------
# registry metadata
# --------------------------------------------------------------------------------------


def test_expected_names_registered():
    missing = EXPECTED_NAMES - set(NAMES)
    assert not missing, f"not registered: {sorted(missing)}"


@pytest.mark.parametrize("name", NAMES)
def test_registry_metadata(name):
    spec = BY_NAME[name]
    assert spec.inputs in INPUT_KINDS.values()
    assert INPUT_KINDS[spec.kind] == spec.inputs and spec.kind in vars(losses.InputKind).values()
    assert spec.arxiv == "" or re.fullmatch(r"\d{4}\.\d{4,5}", spec.arxiv), spec.arxiv
    assert callable(spec.function) and isinstance(spec.module, type)
    assert issubclass(spec.module, torch.nn.Module)
    assert getattr(losses, spec.function.__name__) is spec.function
    assert getattr(losses, spec.module.__name__) is spec.module
    assert spec.function.__name__ in losses.functional.__all__
    # every constructor keyword spelled out (LightningCLI validates and prints them)
    for cls in (spec.module,):
        params = inspect.signature(cls.__init__).parameters.values()
        assert not any(p.kind is p.VAR_KEYWORD for p in params), f"{cls.__name__} takes **kwargs"
        assert not any(p.kind is p.VAR_POSITIONAL for p in params), f"{cls.__name__} takes *args"
    # function: reduction keyword-only with default "mean"
    sig = inspect.signature(spec.function)
    if "reduction" in sig.parameters:
        p = sig.parameters["reduction"]
        assert p.kind is p.KEYWORD_ONLY and p.default == "mean"
    if "ignore_index" in sig.parameters:
        assert sig.parameters["ignore_index"].default == -100
    assert spec.function.__doc__ and len(spec.function.__doc__) > 200, "docstring with formula and paper"
    if spec.arxiv:
        assert spec.arxiv in spec.function.__doc__ or spec.arxiv in (spec.module.__doc__ or ""), \
            "docstring cites the paper's arXiv id"
    assert spec.owns_head == hasattr(spec.module, "logits")
    module = build(spec)
    assert isinstance(module, spec.module)
    assert isinstance(losses.create_loss(name, **spec.example_kwargs), spec.module) if not spec.experimental else True


def test_unknown_name_is_a_clear_error():
    with pytest.raises(ValueError, match=r"^get_loss_spec: unknown loss name \(got 'nope'\)"):
        losses.create_loss("nope")


# --------------------------------------------------------------------------------------
# the contract properties, checked by the library's own kit (losses.testing.check_loss), the one
# users run on the losses they register (docs/contributing.md, Adding a loss)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_reductions_follow_unit_weights(name):
    """``"none"`` is 0 where w = 0, ``"sum" == Σ w·none``, ``"mean" == Σ w·none / Σ w`` (float64,
    rtol 1e-10); batch-level losses accept only ``"mean"`` (the unit-weight rule, docs/conventions.md)."""
    check_loss(name, properties=["reductions"])


@pytest.mark.parametrize("name", NAMES)
def test_bad_reduction_is_a_clear_error(name):
    spec = BY_NAME[name]
    with pytest.raises(ValueError, match="reduction"):
        args, kwargs = example(spec)
        call(build(spec, reduction="elementwise_mean"), args, kwargs)


@pytest.mark.parametrize("name", NAMES)
def test_all_ignored_batch_is_attached_zero(name):
    """Exact, graph-attached 0 with zero (not None) gradients, also with +-inf inputs under
    validation(False)."""
    check_loss(name, properties=["all_ignored"])


@pytest.mark.parametrize("name", NAMES)
def test_finite_values_and_gradients(name):
    """Random, extreme (x1e4) and constant inputs (all-equal logits / zero features / equal scores, a
    zero-initialised head): finite values and gradients; the documented exact infinities
    (``DOCUMENTED_INF``, docs/conventions.md) never NaN."""
    check_loss(name, properties=["finite"], documented_inf=name in DOCUMENTED_INF)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_finite_differences(name):
    """float64 ``gradcheck`` (fast mode, eps 1e-6, atol 1e-5, rtol 1e-3) of every reduction w.r.t.
    the floating inputs (a model argument's parameters for ``inputs="model"``) and the loss's own
    parameters: on the example inputs, with class weights, with an ignored id and in the N-D logits
    layout, where the entry takes them (``losses.testing``, the ``"gradients"`` property)."""
    check_loss(name, properties=["gradients"])


@pytest.mark.parametrize("name", NAMES)
def test_half_precision_and_float64(name):
    """fp16 / bf16 inputs: an fp32 loss equal to the fp32 result on the upcast inputs (1e-6),
    gradients in the input dtype; float64 modules and inputs compute in float64."""
    check_loss(name, properties=["dtypes"])


@pytest.mark.parametrize("name", [s.name for s in SPECS if not s.owns_head and s.inputs[0] != "model"])
def test_module_equals_function(name):
    check_loss(name, properties=["module_function"])


@pytest.mark.parametrize("name", NAMES)
def test_repr_deepcopy_pickle_and_state_dict_round_trip(name):
    check_loss(name, properties=["serialization"])


# --------------------------------------------------------------------------------------
# torch.compile (device and compile, docs/conventions.md, CI sizing). Every entry is compiled and
# checked against eager (values and gradients). An inductor compile costs seconds of C++ builds per
# kernel on a CPU, so inductor compiles one entry per implementation module (the module that defines
# the loss function: the code inductor lowers), and the other entries of that module compile with
# aot_eager (Dynamo's graph capture and AOT autograd, the steps where a loss's own Python breaks).
# --------------------------------------------------------------------------------------


def _inductor_entries(specs=None) -> list:
    """The entry inductor compiles per implementation module (the module that defines the loss
    function): the first one that module registers, i.e. the first ``register`` call in the file
    (the registry keeps registration order; ``list_losses`` sorts by name). The module's other
    entries compile with aot_eager. A family that wants another entry compiled by inductor
    registers it first (sparsemax's module registers sparsemax before entmax-1.5 and
    entmax_bisect, whose unrolled bisection takes ~40 s to build; entmax-1.5's exact search is
    compiled with inductor by tests/classification/test_sparsemax.py)."""
    by_name = {s.name: s for s in (SPECS if specs is None else specs)}
    first: dict = {}
    for name in losses._registry._REGISTRY:  # registration order
        if name in by_name:
            first.setdefault(by_name[name].function.__module__, name)
    return sorted(first.values())


INDUCTOR = _inductor_entries()


def test_every_implementation_module_has_one_inductor_compile():
    modules = {s.function.__module__ for s in SPECS}
    assert len(INDUCTOR) == len(modules)
    assert {BY_NAME[n].function.__module__ for n in INDUCTOR} == modules
    registered = list(losses._registry._REGISTRY)
    for name in INDUCTOR:  # the first of its module's entries in registration order
        module = BY_NAME[name].function.__module__
        siblings = [n for n in registered if n in BY_NAME and BY_NAME[n].function.__module__ == module]
        assert siblings[0] == name, (module, siblings)
    assert "sparsemax" in INDUCTOR and "entmax_bisect" not in INDUCTOR  # the ~40 s build stays out


def test_a_second_entry_in_a_one_loss_file_needs_no_edit():
    """A family file that gains an entry keeps its inductor representative (the first it
    registered); the new entry compiles with aot_eager, and nothing here names it."""
    focal = BY_NAME["focal"]

    def probe_focal_loss(*args, **kwargs):
        return focal.function(*args, **kwargs)

    probe_focal_loss.__module__ = focal.function.__module__  # defined in the focal family's file
    losses.register("probe_second_focal", function=probe_focal_loss, module=focal.module, inputs="logits",
                    unit="position", unit_weights=focal.unit_weights)
    try:
        chosen = _inductor_entries(losses.list_losses())
    finally:
        losses.unregister("probe_second_focal")
    assert chosen == INDUCTOR and "focal" in chosen and "probe_second_focal" not in chosen


#: Constructor arguments of the inductor compile that shorten a fixed inner loop, which inductor
#: unrolls into one kernel per iteration: soft top-k's 32 bisection steps cost ~25 s of C++ code
#: generation on a cold cache (34 reductions); 8 steps compile the same operations in about a third
#: of the time. Values and gradients are still checked against eager with the same arguments.
INDUCTOR_KWARGS = {"soft_topk": {"n_iter": 8}}


@pytest.mark.slow
@pytest.mark.parametrize("name", INDUCTOR)
def test_torch_compile_inductor_matches_eager(name):
    spec = BY_NAME[name]
    if name in INDUCTOR_KWARGS:
        spec = dataclasses.replace(spec, example_kwargs={**spec.example_kwargs, **INDUCTOR_KWARGS[name]})
    check_loss(spec, properties=["compile"], compile_backend="inductor")


@pytest.mark.parametrize("name", [n for n in NAMES if n not in INDUCTOR])
def test_torch_compile_aot_eager_matches_eager(name):
    check_loss(name, properties=["compile"], compile_backend="aot_eager")


# --------------------------------------------------------------------------------------
# validation switch (validation, docs/conventions.md)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [s.name for s in SPECS if s.inputs[0] not in ("model",)])
def test_nan_input_is_rejected_only_with_validation_on(name):
    spec = BY_NAME[name]
    args, kwargs = example(spec, requires_grad=False)
    first = args[0].clone()
    first.view(-1)[0] = math.nan
    bad = (first,) + args[1:]
    with pytest.raises(ValueError, match=r"^[a-z_0-9]+: .*NaN"):
        call(build(spec), bad, kwargs)
    with losses.validation(False):
        call(build(spec), bad, kwargs)  # no check, no exception


def test_create_loss_applies_registry_presets():
    """``cosine_softmax`` is margin softmax with the (1, 0, 0) margin even without example kwargs."""
    m = losses.create_loss("cosine_softmax", embedding_dim=8, num_classes=5)
    assert tuple(m.margin) == (1.0, 0.0, 0.0)
    m2 = losses.create_loss("cosine_softmax", embedding_dim=8, num_classes=5, margin=(1.0, 0.0, 0.2))
    assert tuple(m2.margin) == (1.0, 0.0, 0.2)
