"""``losses.register`` and the contract kit ``losses.testing.check_loss``: it passes on every built-in
entry, and it catches deliberately wrong losses registered here, naming the property that fails.

Each wrong loss is a small cross-entropy with one bug; the test checks that ``check_loss`` fails on
exactly the property the bug breaks and passes on all the others (so the kit is specific, and the
correct loss passes them all).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest
import torch
from torch import nn

import losses
from losses.testing import DEFAULT_PROPERTIES, PROPERTIES, check_loss

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = [s.name for s in losses.list_losses()]
REDUCTIONS = ("none", "mean", "sum")


# --------------------------------------------------------------------------------------
# a correct cross-entropy written in user code, and the same with one bug each
# --------------------------------------------------------------------------------------


class _KitCEFunction(torch.autograd.Function):
    """Per-position cross-entropy with a hand-written backward under torch's own
    ``once_differentiable``: with ``create_graph=True`` its gradient comes back detached (the
    ``grad_output`` of a mean does not require grad), a second derivative silently dropped."""

    @staticmethod
    def forward(ctx, x, t):
        ctx.save_for_backward(x, t)
        return -torch.log_softmax(x, dim=1).gather(1, t.unsqueeze(1)).squeeze(1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        x, t = ctx.saved_tensors
        grad = torch.softmax(x, dim=1)
        grad[torch.arange(x.shape[0]), t] -= 1.0
        return grad * g.unsqueeze(1), None


def _kit_ce(input, target, *, bug=None, scale=1.0, ignore_index=-100, reduction="mean"):
    """Cross-entropy per position; ignored positions have unit weight 0 (with the ``bug``)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"kit_ce_loss: reduction must be one of {REDUCTIONS} (got {reduction!r}); use 'mean'")
    dtype = torch.float64 if input.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=input.device.type, enabled=False):
        valid = target != ignore_index
        x = input.to(dtype) * scale
        if bug != "nan_gradient_when_all_ignored":  # the fix: neutral logits at ignored rows
            x = x.masked_fill(~valid.unsqueeze(1), 0.0)
        if bug == "second_derivative_dropped":
            per = _KitCEFunction.apply(x, target.clamp_min(0))
        else:
            per = -torch.log_softmax(x, dim=1).gather(1, target.clamp_min(0).unsqueeze(1)).squeeze(1)
        none = torch.where(valid, per, torch.zeros_like(per))
        if reduction == "none":
            return per if bug == "none_ignores_unit_weights" else none
        w = valid.to(dtype)
        total = (w * none).sum()
        if reduction == "sum":
            return total
        if bug == "mean_counts_ignored":
            return total / target.numel()
        return total / w.sum().clamp_min(1.0)


class KitCELoss(nn.Module):
    """The module form (module level, so that it pickles); subclasses below carry one bug each."""

    bug = None

    def __init__(self, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"KitCELoss: reduction must be one of {REDUCTIONS} (got {reduction!r}); use 'mean'")
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(self, input, target):
        # module_differs_from_function: e.g. a temperature that the function does not have
        scale = 1.001 if self.bug == "module_differs_from_function" else 1.0
        return _kit_ce(input, target, bug=self.bug, scale=scale, ignore_index=self.ignore_index,
                       reduction=self.reduction)


BUG_MODULES = {
    bug: type(f"KitCE_{bug}", (KitCELoss,), {"bug": bug})
    for bug in ("mean_counts_ignored", "none_ignores_unit_weights", "nan_gradient_when_all_ignored",
                "module_differs_from_function", "second_derivative_dropped")
}
for _cls in BUG_MODULES.values():  # importable by name: pickle finds them
    globals()[_cls.__name__] = _cls
    _cls.__qualname__ = _cls.__name__


def _make_loss(bug=None):
    def kit_ce_loss(input, target, *, ignore_index=-100, reduction="mean"):
        return _kit_ce(input, target, bug=None if bug == "module_differs_from_function" else bug,
                       ignore_index=ignore_index, reduction=reduction)

    return kit_ce_loss, (KitCELoss if bug is None else BUG_MODULES[bug])


def _unit_weights(input, target, *, ignore_index=-100, **_):
    return (target != ignore_index).double()


@pytest.fixture
def registered():
    """``registered(name, bug)`` registers a kit loss (removed again after the test)."""
    names = []

    def _register(name, bug=None, **kw):
        fn, cls = _make_loss(bug)
        spec = losses.register(name, function=fn, module=cls, inputs="logits", unit="position",
                               unit_weights=_unit_weights, **kw)
        names.append(name)
        return spec

    yield _register
    for n in names:
        losses.unregister(n)
    assert not set(names) & {s.name for s in losses.list_losses()}


# --------------------------------------------------------------------------------------
# check_loss on the built-in entries and on user entries
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_check_loss_passes_on_every_builtin_entry(name):
    check_loss(name)  # every default property


def test_check_loss_compile_with_aot_eager():
    check_loss("cross_entropy", properties=["compile"])
    check_loss(losses.get_loss_spec("margin_softmax"), properties=["compile"], compile_backend="aot_eager")


def test_a_correct_user_loss_passes(registered):
    spec = registered("kit_ce")
    check_loss("kit_ce")
    check_loss(spec, properties=["compile"])
    x, t = torch.randn(4, 5, dtype=torch.float64), torch.tensor([0, 3, -100, 1])
    torch.testing.assert_close(losses.create_loss("kit_ce")(x, t), torch.nn.functional.cross_entropy(x, t))


BUGS = [
    ("mean_counts_ignored", "reductions"),
    ("none_ignores_unit_weights", "reductions"),
    ("nan_gradient_when_all_ignored", "all_ignored"),
    ("module_differs_from_function", "module_function"),
    ("second_derivative_dropped", "double_backward"),
]


@pytest.mark.parametrize("bug,prop", BUGS, ids=[b for b, _ in BUGS])
def test_check_loss_catches_a_wrong_loss(registered, bug, prop):
    name = f"kit_{bug}"
    registered(name, bug)
    with pytest.raises(AssertionError, match=rf"^check_loss: property '{prop}' failed for '{name}': "):
        check_loss(name)
    with pytest.raises(AssertionError, match=rf"property '{prop}' failed for '{name}'"):
        check_loss(name, properties=[prop])
    check_loss(name, properties=[p for p in DEFAULT_PROPERTIES if p != prop])  # the bug breaks only this one


def test_check_loss_reports_a_raising_loss_as_a_failed_property(registered):
    spec = registered("kit_plain")

    class Broken(spec.module):
        def forward(self, input, target):
            raise RuntimeError("boom")

    losses.register("kit_plain", function=spec.function, module=Broken, inputs="logits", unit="position",
                    unit_weights=_unit_weights, replace=True)
    with pytest.raises(AssertionError, match=r"property 'serialization' failed for 'kit_plain': RuntimeError: boom"):
        check_loss("kit_plain", properties=["serialization"])


def test_check_loss_arguments_are_checked():
    with pytest.raises(ValueError, match=r"^check_loss: unknown properties \(got \['speed'\]\); choose from"):
        check_loss("cross_entropy", properties=["speed"])
    with pytest.raises(TypeError, match=r"^check_loss: properties must be a list of names \(got 'reductions'\)"):
        check_loss("cross_entropy", properties="reductions")
    with pytest.raises(ValueError, match=r"^get_loss_spec: unknown loss name \(got 'nope'\)"):
        check_loss("nope")
    assert set(DEFAULT_PROPERTIES) == set(PROPERTIES) - {"compile"}


def test_testing_imports_only_torch():
    """``losses.testing`` is part of ``losses``: torch and the standard library only, no test runner."""
    with open(os.path.join(ROOT, "losses", "testing.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            top.add(node.module.split(".")[0])
    assert top <= {"__future__", "copy", "inspect", "io", "math", "pickle", "warnings", "typing", "torch"}, top
    code = "import sys, losses.testing; print(sorted(m for m in sys.modules if m.split('.')[0] in " \
           "('pytest', '_pytest', 'pytorch_lightning', 'lightning', 'hypothesis')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


def test_example_custom_loss_registers_and_checks():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "custom_loss.py")], capture_output=True,
                         text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("check_loss('my_poly1'): every contract property holds"), out.stdout


# --------------------------------------------------------------------------------------
# losses.register: forms and argument checks
# --------------------------------------------------------------------------------------


def test_register_as_a_class_decorator_and_a_function_decorator():
    fn, cls = _make_loss()
    try:
        decorated = losses.register("kit_deco", function=fn, inputs=losses.InputKind.LOGITS, unit="position",
                                    unit_weights=_unit_weights)(cls)
        assert decorated is cls
        spec = losses.get_loss_spec("kit_deco")
        assert spec.module is cls and spec.function is fn and spec.kind == "logits"
        assert spec.inputs == ("input", "target") and spec.arxiv == "" and not spec.owns_head
        decorated_fn = losses.register("kit_deco_fn", module=cls, inputs="logits", unit="position",
                                       unit_weights=_unit_weights)(fn)
        assert decorated_fn is fn and losses.get_loss_spec("kit_deco_fn").function is fn
    finally:
        for n in ("kit_deco", "kit_deco_fn"):
            if n in {s.name for s in losses.list_losses()}:
                losses.unregister(n)


def test_register_refuses_duplicates_unless_replace(registered):
    with pytest.raises(ValueError, match=r"^register: loss name already registered \(got 'cross_entropy'\); .*replace=True"):
        registered("cross_entropy")
    first = registered("kit_dup")
    with pytest.raises(ValueError, match=r"^register: loss name already registered \(got 'kit_dup'\)"):
        registered("kit_dup")
    assert losses.get_loss_spec("kit_dup") is first
    fn, cls = _make_loss()
    second = losses.register("kit_dup", function=fn, module=cls, inputs="logits", unit="position",
                             unit_weights=_unit_weights, replace=True)
    assert losses.get_loss_spec("kit_dup") is second is not first
    with pytest.raises(ValueError, match=r"^unregister: unknown loss name \(got 'kit_never'\)"):
        losses.unregister("kit_never")


def _bad_register_cases():
    fn, cls = _make_loss()
    ok = dict(function=fn, module=cls, inputs="logits", unit="position", unit_weights=_unit_weights)
    return [
        ("kind code", {"inputs": "I"}, ValueError,
         r"^register: inputs must be one of \['logits', 'embeddings', 'scores', 'pairs', 'model'\] \(got 'I'\)"),
        ("unit", {"unit": "token"}, ValueError, r"^register: unit must be one of .* \(got 'token'\)"),
        ("no unit weights", {"unit_weights": None}, ValueError,
         r"^register: unit_weights is required for unit 'position' \(got None\)"),
        ("module instance", {"module": cls()}, TypeError, r"^register: module must be an nn.Module subclass"),
        ("function", {"function": 3}, TypeError, r"^register: function must be a function \(got 3\)"),
        ("flag", {"owns_head": 1}, TypeError, r"^register: owns_head must be a bool \(got 1\)"),
        ("head", {"owns_head": True}, ValueError, r"^register: owns_head=True but KitCELoss has no \.logits"),
        ("query_keys", {"query_keys": True}, ValueError, r"^register: query_keys applies to inputs='scores' only"),
        ("arxiv", {"arxiv": "arXiv:1708.02002"}, ValueError, r"^register: arxiv must be an arXiv id"),
        ("example_kwargs", {"example_kwargs": [("a", 1)]}, TypeError, r"^register: example_kwargs must be a dict"),
        ("replace", {"replace": "yes"}, TypeError, r"^register: replace must be a bool \(got 'yes'\)"),
        ("softmax flag", {"softmax": 1}, TypeError, r"^register: softmax must be a bool \(got 1\)"),
        ("masks kind", {"masks": "neg_inf"}, TypeError, r"^register: masks must be a tuple of names"),
        ("masks value", {"masks": ("neg_inf", "nan")}, ValueError,
         r"^register: masks must be names from \('neg_inf', 'mask'\) \(got \('neg_inf', 'nan'\)\)"),
        ("tensor_args kind", {"tensor_args": "weight"}, TypeError, r"^register: tensor_args must be a tuple of names"),
        ("tensor_args value", {"tensor_args": ("prior",)}, ValueError,
         r"^register: tensor_args must name constructor arguments of KitCELoss \(got \['prior'\]\)"),
        ("soft targets kind", {"inputs": "scores", "soft_targets": True}, ValueError,
         r"^register: soft_targets / dense_targets apply to inputs='logits' only"),
        ("class weight", {"class_weight": True}, ValueError,
         r"^register: class_weight=True but KitCELoss takes no weight="),
    ], ok


BAD_REGISTER_CASES, OK_REGISTER = _bad_register_cases()


@pytest.mark.parametrize("what,bad,err,match", BAD_REGISTER_CASES, ids=[c[0] for c in BAD_REGISTER_CASES])
def test_register_checks_its_arguments(what, bad, err, match):
    with pytest.raises(err, match=match):
        losses.register("kit_bad", **{**OK_REGISTER, **bad})
    assert "kit_bad" not in {s.name for s in losses.list_losses()}


def test_register_records_the_facts():
    spec = losses.register("kit_facts", **{**OK_REGISTER, "softmax": True, "masks": ["neg_inf"],
                                           "soft_targets": True, "documented_inf": True})
    try:
        assert spec.softmax and spec.masks == ("neg_inf",) and spec.documented_inf
        assert spec.soft_targets and spec.dense_targets  # probabilities are dense targets
        assert not spec.class_weight and not spec.weighted_mean and spec.tensor_args == () and not spec.seeded
    finally:
        losses.unregister("kit_facts")


def test_register_checks_the_name():
    ok = OK_REGISTER
    with pytest.raises(ValueError, match=r"^register: name must be a lower-case identifier \(got 'My Loss'\)"):
        losses.register("My Loss", **ok)
    with pytest.raises(TypeError, match=r"^register: name must be a lower-case identifier \(got 3\)"):
        losses.register(3, **ok)
    with pytest.raises(TypeError, match=r"^register: needs function=, module= or both"):
        losses.register("kit_none", inputs="logits", unit="position", unit_weights=_unit_weights)


def test_spec_for_module_walks_the_class_hierarchy(registered):
    class MyArcFace(losses.MarginSoftmaxLoss):
        pass

    assert losses.spec_for_module(MyArcFace).name == "margin_softmax"
    assert losses.spec_for_module(nn.Linear) is None
    spec = registered("kit_sub")

    class KitSub(KitCELoss):
        pass

    assert losses.spec_for_module(KitSub) is spec
    assert losses.spec_for_module(BUG_MODULES["mean_counts_ignored"]) is spec  # also a KitCELoss subclass
    with pytest.raises(TypeError, match=r"^spec_for_module: expected a class"):
        losses.spec_for_module(losses.CrossEntropyLoss())


def test_error_messages_name_the_kinds():
    assert re.search("logits", str(losses.INPUT_KINDS))
    with pytest.raises(ValueError, match=r"^default_example_inputs: kind must be one of \['logits'"):
        from losses._registry import default_example_inputs

        default_example_inputs("E")
