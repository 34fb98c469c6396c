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
        grad = torch.softmax(x, dim=1)  # (N, C, ...): the N-D layout too
        grad.scatter_add_(1, t.unsqueeze(1), -torch.ones_like(x[:, :1]))
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
    assert top <= {"__future__", "copy", "inspect", "io", "math", "pickle", "re", "sys", "time", "warnings", "typing",
                   "torch"}, top
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
# planted bugs that only the "gradients" property, or the class-weighted "reductions" case, sees:
# each loss is written correctly and with one bug; check_loss passes the correct one, fails the
# wrong one naming the property, and the wrong one passes every other property (so no other check
# would have caught it)
# --------------------------------------------------------------------------------------


def _reduce(fn, per, valid, reduction, den=None):
    """Zero at ignored units; "sum" = Σ none, "mean" = Σ none / den (default: the valid count)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"{fn}: reduction must be one of {REDUCTIONS} (got {reduction!r}); use 'mean'")
    none = torch.where(valid, per, torch.zeros_like(per))
    if reduction == "none":
        return none
    total = none.sum()
    if reduction == "sum":
        return total
    return total / (valid.to(per.dtype).sum() if den is None else den).clamp_min(1e-12)


def _compute_dtype(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _kit_poly1(input, target, *, epsilon=1.0, bug=None, ignore_index=-100, reduction="mean"):
    """Poly-1 per position, ``-log p_t + epsilon (1 - p_t)``; bug ``"poly_term_detached"``: the
    polynomial term's gradient dropped (its value kept)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"kit_poly1_loss: reduction must be one of {REDUCTIONS} (got {reduction!r}); use 'mean'")
    with torch.autocast(device_type=input.device.type, enabled=False):
        valid = target != ignore_index
        x = input.to(_compute_dtype(input)).masked_fill(~valid.unsqueeze(1), 0.0)
        logp = torch.log_softmax(x, dim=1).gather(1, target.clamp_min(0).unsqueeze(1)).squeeze(1)
        poly = -torch.expm1(logp)  # 1 - p_t
        if bug == "poly_term_detached":
            poly = poly.detach()
        return _reduce("kit_poly1_loss", -logp + epsilon * poly, valid, reduction)


def _kit_supcon(embeddings, target, *, temperature=0.5, bug=None, ignore_index=-100, reduction="mean"):
    """Supervised contrastive loss per row (Khosla et al., 2020, the L_out form): the
    log-sum-exp of the row's cosine similarities over the other valid rows, minus their mean over
    its positives (the other rows of its class), over ``temperature``; rows without a positive
    have unit weight 0. Bug ``"lse_detached"``: the log-sum-exp's gradient dropped."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"kit_supcon_loss: reduction must be one of {REDUCTIONS} (got {reduction!r}); use 'mean'")
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        valid = target != ignore_index
        x = embeddings.to(_compute_dtype(embeddings)).masked_fill(~valid.unsqueeze(1), 0.0)
        z = torch.nn.functional.normalize(x, dim=1)
        sim = z @ z.T / temperature
        eye = torch.eye(x.shape[0], dtype=torch.bool, device=x.device)
        others = valid.unsqueeze(0) & valid.unsqueeze(1) & ~eye
        pos = others & (target.unsqueeze(0) == target.unsqueeze(1))
        has_pos = pos.any(dim=1)
        # rows without a positive: all-zero logits (a finite log-sum-exp, no NaN gradient)
        logits = sim.masked_fill(~others, -torch.inf).masked_fill(~has_pos.unsqueeze(1), 0.0)
        lse = torch.logsumexp(logits, dim=1)
        if bug == "lse_detached":
            lse = lse.detach()
        mean_pos = (sim * pos).sum(dim=1) / pos.sum(dim=1).clamp_min(1)
        return _reduce("kit_supcon_loss", lse - mean_pos, has_pos, reduction)


def _supcon_unit_weights(embeddings, target, *, ignore_index=-100, **_):
    valid = target != ignore_index
    same = (target.unsqueeze(0) == target.unsqueeze(1)) & valid.unsqueeze(0) & valid.unsqueeze(1)
    same &= ~torch.eye(target.shape[0], dtype=torch.bool)
    return same.any(dim=1).double()


def _kit_weighted_ce(input, target, *, weight=None, bug=None, ignore_index=-100, reduction="mean"):
    """Class-weighted cross-entropy as ``F.cross_entropy``: ``"none"`` is ``weight[t] * ce``,
    ``"mean"`` divides by ``Σ weight[t]`` over the valid ids. Bug ``"mean_over_count"``: ``"mean"``
    divides by the number of valid ids (the same without class weights)."""
    dtype = _compute_dtype(input)
    with torch.autocast(device_type=input.device.type, enabled=False):
        valid = target != ignore_index
        x = input.to(dtype).masked_fill(~valid.unsqueeze(1), 0.0)
        ids = target.clamp_min(0)
        per = -torch.log_softmax(x, dim=1).gather(1, ids.unsqueeze(1)).squeeze(1)
        w = torch.ones_like(per) if weight is None else weight.to(dtype)[ids]
        den = None if bug == "mean_over_count" else (w * valid.to(dtype)).sum()
        return _reduce("kit_weighted_ce_loss", w * per, valid, reduction, den)


class _KitLoss(nn.Module):
    """A planted-bug family's module (module level, so that it pickles): ``bug`` is a class
    attribute of the subclasses below."""

    bug = None
    function = None
    hyper = ()

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", **hyper) -> None:
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"{type(self).__name__}: reduction must be one of {REDUCTIONS} (got {reduction!r}); "
                             "use 'mean'")
        self.ignore_index, self.reduction = ignore_index, reduction
        for k, v in hyper.items():
            setattr(self, k, v)

    def forward(self, input, target):
        kw = {k: getattr(self, k) for k in self.hyper}
        return type(self).function(input, target, bug=self.bug, ignore_index=self.ignore_index,
                                   reduction=self.reduction, **kw)


class KitPoly1Loss(_KitLoss):
    function = staticmethod(_kit_poly1)
    hyper = ("epsilon",)

    def __init__(self, epsilon: float = 1.0, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__(ignore_index, reduction, epsilon=float(epsilon))


class KitSupConLoss(_KitLoss):
    function = staticmethod(_kit_supcon)
    hyper = ("temperature",)

    def __init__(self, temperature: float = 0.5, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__(ignore_index, reduction, temperature=float(temperature))


class KitWeightedCELoss(_KitLoss):
    function = staticmethod(_kit_weighted_ce)
    hyper = ("weight",)

    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__(ignore_index, reduction)
        self.register_buffer("weight", None if weight is None else torch.as_tensor(weight))


def _planted(cls, bug):
    """``cls`` with ``bug``: a module-level subclass (pickle finds it by name)."""
    sub = type(f"{cls.__name__}_{bug}", (cls,), {"bug": bug})
    sub.__qualname__ = sub.__name__
    globals()[sub.__name__] = sub
    return sub


def _functional(raw, bug):
    def fn(*args, **kwargs):
        return raw(*args, bug=bug, **kwargs)

    fn.__name__ = raw.__name__.lstrip("_") + "_loss"
    return fn


#: family -> (the registration record without function / module, its module class, raw function)
PLANTED_FAMILIES = {
    "poly1": (dict(inputs="logits", unit="position", unit_weights=_unit_weights, softmax=True),
              KitPoly1Loss, _kit_poly1),
    "supcon": (dict(inputs="embeddings", unit="row", unit_weights=_supcon_unit_weights), KitSupConLoss, _kit_supcon),
    "weighted_ce": (dict(inputs="logits", unit="position", unit_weights=_unit_weights, class_weight=True,
                         weighted_mean=True, tensor_args=("weight",)), KitWeightedCELoss, _kit_weighted_ce),
}

#: (family, bug, the property that catches it, what its message says)
PLANTED = [
    ("poly1", "poly_term_detached", "gradients", r"the gradient w\.r\.t\. 'input' \(argument 0\) differs"),
    ("supcon", "lse_detached", "gradients", r"the gradient w\.r\.t\. 'embeddings' \(argument 0\) differs"),
    ("weighted_ce", "mean_over_count", "reductions",
     r"with class weights: 'mean' != sum\(w \* none\) / sum\(w \* weight\[target\]\)"),
]
PLANTED_CLASSES = {bug: _planted(PLANTED_FAMILIES[family][1], bug) for family, bug, _, _ in PLANTED}


@pytest.fixture
def temp_register():
    """``temp_register(name, family, bug=None)`` registers a planted-bug family's loss through
    ``losses.register`` and removes it after the test."""
    names = []

    def _register(name, family, bug=None):
        record, cls, raw = PLANTED_FAMILIES[family]
        spec = losses.register(name, function=_functional(raw, bug), module=PLANTED_CLASSES[bug] if bug else cls,
                               **record)
        names.append(name)
        return spec

    yield _register
    for n in names:
        losses.unregister(n)
    assert not set(names) & set(losses.loss_names())


@pytest.mark.parametrize("family,bug,prop,message", PLANTED, ids=[p[1] for p in PLANTED])
def test_check_loss_alone_catches_a_planted_bug(temp_register, family, bug, prop, message):
    temp_register(f"kit_{family}", family)
    check_loss(f"kit_{family}")  # the correct loss passes every default property

    name = f"kit_{family}_{bug}"
    temp_register(name, family, bug)
    with pytest.raises(AssertionError, match=rf"^check_loss: property '{prop}' failed for '{name}': .*{message}"):
        check_loss(name)
    check_loss(name, properties=[p for p in DEFAULT_PROPERTIES if p != prop])  # nothing else sees the bug


def test_the_planted_losses_are_what_they_claim():
    """The correct planted losses against torch: Poly-1 with epsilon 0 and the weighted
    cross-entropy are ``F.cross_entropy``; each bug keeps the value (only the gradient, or the
    class-weighted mean, changes)."""
    g = torch.Generator().manual_seed(3)
    x, t = torch.randn(6, 5, generator=g, dtype=torch.float64), torch.tensor([0, 3, -100, 1, 4, 4])
    w = torch.rand(5, generator=g, dtype=torch.float64) + 0.5
    ce = torch.nn.functional.cross_entropy
    for reduction in REDUCTIONS:
        torch.testing.assert_close(_kit_poly1(x, t, epsilon=0.0, reduction=reduction), ce(x, t, reduction=reduction))
        torch.testing.assert_close(_kit_weighted_ce(x, t, weight=w, reduction=reduction),
                                   ce(x, t, weight=w, reduction=reduction))
        torch.testing.assert_close(_kit_poly1(x, t, bug="poly_term_detached", reduction=reduction),
                                   _kit_poly1(x, t, reduction=reduction))
    assert not torch.allclose(_kit_weighted_ce(x, t, weight=w, bug="mean_over_count"), ce(x, t, weight=w))
    torch.testing.assert_close(_kit_weighted_ce(x, t, bug="mean_over_count"), ce(x, t))  # same without weights
    e, ids = torch.randn(6, 8, generator=g, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])
    z = torch.nn.functional.normalize(e, dim=1)
    sim = z @ z.T / 0.5
    ref = []
    for i in range(6):
        others = [a for a in range(6) if a != i]
        positives = [p for p in others if ids[p] == ids[i]]
        lse = torch.logsumexp(sim[i, others], dim=0)
        ref.append(sum(lse - sim[i, p] for p in positives) / len(positives))
    torch.testing.assert_close(_kit_supcon(e, ids, reduction="none"), torch.stack(ref))
    torch.testing.assert_close(_kit_supcon(e, ids, bug="lse_detached"), _kit_supcon(e, ids))


# --------------------------------------------------------------------------------------
# python -m losses.testing: the "test my loss" command
# --------------------------------------------------------------------------------------

_MY_LOSSES = """
import torch
from torch import nn
import losses


def _loss(input, target, *, detach, ignore_index=-100, reduction="mean"):
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"loss: reduction must be one of ('none', 'mean', 'sum') (got {reduction!r}); use 'mean'")
    dtype = torch.float64 if input.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=input.device.type, enabled=False):
        valid = target != ignore_index
        x = input.to(dtype).masked_fill(~valid.unsqueeze(1), 0.0)
        logp = torch.log_softmax(x, dim=1).gather(1, target.clamp_min(0).unsqueeze(1)).squeeze(1)
        poly = -torch.expm1(logp)
        per = -logp + (poly.detach() if detach else poly)
        none = torch.where(valid, per, torch.zeros_like(per))
        if reduction == "none":
            return none
        return none.sum() if reduction == "sum" else none.sum() / valid.to(dtype).sum().clamp_min(1.0)


def good_poly1_loss(input, target, *, ignore_index=-100, reduction="mean"):
    return _loss(input, target, detach=False, ignore_index=ignore_index, reduction=reduction)


def bad_poly1_loss(input, target, *, ignore_index=-100, reduction="mean"):
    return _loss(input, target, detach=True, ignore_index=ignore_index, reduction=reduction)


class GoodPoly1(nn.Module):
    def __init__(self, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(f"GoodPoly1: reduction must be one of ('none', 'mean', 'sum') (got {reduction!r})")
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(self, input, target):
        return good_poly1_loss(input, target, ignore_index=self.ignore_index, reduction=self.reduction)


class BadPoly1(GoodPoly1):
    def forward(self, input, target):
        return bad_poly1_loss(input, target, ignore_index=self.ignore_index, reduction=self.reduction)


def _w(input, target, *, ignore_index=-100, **_):
    return (target != ignore_index).double()


losses.register("my_good_poly1", function=good_poly1_loss, module=GoodPoly1, inputs="logits", unit="position",
                unit_weights=_w)
losses.register("my_bad_poly1", function=bad_poly1_loss, module=BadPoly1, inputs="logits", unit="position",
                unit_weights=_w)
"""


def _run_kit(*args, cwd=ROOT, pythonpath=ROOT):
    return subprocess.run([sys.executable, "-m", "losses.testing", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, env={**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"})


def _lines(stdout):
    return {(m.group(1), m.group(2), m.group(3)) for m in
            re.finditer(r"^(PASS|FAIL)  (\w+) +(\w+) +\d+\.\d\d s", stdout, flags=re.MULTILINE)}


def test_command_checks_a_module_and_fails_on_a_planted_bug(tmp_path):
    (tmp_path / "my_losses.py").write_text(_MY_LOSSES)
    out = _run_kit("my_losses", pythonpath=f"{tmp_path}{os.pathsep}{ROOT}")
    assert out.returncode == 1, out.stdout + out.stderr[-3000:]
    lines = _lines(out.stdout)
    assert lines == ({("PASS", "my_good_poly1", p) for p in DEFAULT_PROPERTIES}
                     | {("PASS", "my_bad_poly1", p) for p in DEFAULT_PROPERTIES if p != "gradients"}
                     | {("FAIL", "my_bad_poly1", "gradients")}), out.stdout
    assert re.search(r"^FAIL  my_bad_poly1 +gradients .*the gradient w\.r\.t\. 'input'", out.stdout, re.MULTILINE)
    assert out.stdout.strip().endswith(f"{2 * len(DEFAULT_PROPERTIES) - 1} of {2 * len(DEFAULT_PROPERTIES)} checks "
                                       "passed (my_bad_poly1, my_good_poly1)"), out.stdout
    assert "RuntimeWarning" not in out.stderr, out.stderr


def test_command_checks_a_registry_name_and_a_file():
    out = _run_kit("--properties", "gradients,reductions", "focal", "examples/custom_loss.py")
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert _lines(out.stdout) == {("PASS", n, p) for n in ("focal", "my_poly1") for p in ("gradients", "reductions")}
    assert out.stdout.strip().endswith("4 of 4 checks passed (focal, my_poly1)"), out.stdout


def test_command_usage_errors_exit_with_status_2(capsys):
    """The argument handling of the command (its ``main``), in process."""
    from losses.testing import main

    assert main(["no_such_loss"]) == 2
    assert "neither a registry name nor an importable module (got 'no_such_loss')" in capsys.readouterr().err
    assert main(["--properties", "speed", "focal"]) == 2
    assert "unknown properties (got ['speed'])" in capsys.readouterr().err
    assert main(["--verbose", "focal"]) == 2 and "unknown option '--verbose'" in capsys.readouterr().err
    assert main([]) == 2 and "usage: python -m losses.testing" in capsys.readouterr().err
    assert main(["--help"]) == 0 and "usage: python -m losses.testing" in capsys.readouterr().out
    assert main(["json"]) == 2  # a module that registers nothing
    assert "'json' registers no loss" in capsys.readouterr().err
    assert main(["--properties=gradients", "losses.classification.zloss"]) == 0  # a family: the entries it defines
    out = capsys.readouterr().out
    assert _lines(out) == {("PASS", "z_loss", "gradients"), ("PASS", "logz_penalty", "gradients")}, out


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
