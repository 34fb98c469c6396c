"""Pin the public API of ``losses`` to its documented specification: every function and module
constructor named on the family pages under docs/losses/, the registry table and the signature
conventions of docs/conventions.md.

The expectations below are written out by hand from the spec text; nothing is derived from the
code. How the abbreviations of the spec are expanded:

* ``fn(first, target, [required tensors], *, <hyperparameters>, <optional tensors>,
  ignore_index=-100, reduction="mean")`` (docs/conventions.md): required tensors are positional, everything else is
  keyword-only; ``ignore_index`` and ``reduction`` close the list, followed only by what the spec
  itself puts after them (``return_penalty``, ``return_stats``; module-only ``seed``,
  ``gather_distributed``, ``distributed``, ``process_group``, as in the explicit blocks of
  ``AdversarialCompSumLoss``, ``OrthogonalProjectionLoss``, ``NBCSoftmaxLoss`` and
  ``PartialFCLoss``).
* ``partial_fc_loss(..., sample_rate=0.1, <margin_softmax_loss keywords>, index=None,
  generator=None)``: the hyperparameters of ``margin_softmax_loss`` in its order, then the optional
  tensors ``index``, ``generator``, then ``ignore_index``, ``reduction`` (docs/conventions.md order).
* Module "same keywords": the function's keywords in the same order and with the same defaults,
  minus per-call data tensors (``mask``, ``neg_mask``, ``index``), which ``forward`` takes instead
  (``PartialFCLoss``'s explicit block drops ``index`` the same way); ``generator`` becomes
  ``seed=None``; "+ gather_distributed=False" and the other module-only flags go after
  ``reduction`` (as in every explicit module block).
* Constructors that own parameters take ``embedding_dim, num_classes`` positionally, then
  keyword-only; the others are keyword-only. No ``*args`` / ``**kwargs`` anywhere.

Extra keywords beyond the spec are accepted only when they are keyword-only, have a default and
come after all of the spec's parameters (``test_*_order``); defaults of the spec's keywords must
match in value and type.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
from torch import nn

import losses
from tests._helpers.names import API, EXPERIMENTAL, KIND_NAMES, LOSSES, PUBLIC_NAMES, SCORES

#: The registry table of docs/conventions.md (tests/_helpers/names.py, the one list of names):
#: name -> (function, module, inputs, owns_head, auxiliary, unit, example_kwargs).
REGISTRY = LOSSES

POS = inspect.Parameter.POSITIONAL_OR_KEYWORD
KW = inspect.Parameter.KEYWORD_ONLY
REQUIRED = inspect.Parameter.empty


def pos(*names):
    """Positional (required) parameters."""
    return [(n, POS, REQUIRED) for n in names]


def kw(**defaults):
    """Keyword-only parameters with their defaults, in the order written (``REQUIRED``: none)."""
    return [(n, KW, d) for n, d in defaults.items()]


# ``ignore_index=-100, reduction="mean"`` (docs/conventions.md)
IR = kw(ignore_index=-100, reduction="mean")
# ArcFace head defaults of docs/losses/partial_fc.md
MARGIN_KW = kw(scale=64.0, margin=(1.0, 0.5, 0.0), variant="paper", interclass_filtering_threshold=0.0)
# Dice / Jaccard / soft Dice keywords of docs/losses/dice.md (function)
DICE_HYPER = kw(activation="softmax", smooth=1.0, aggregate="dataset", active_classes=None, log_loss=False,
                weight=None)

# ----------------------------------------------------------------------------------------------
# functions: losses.<name>(...)
# ----------------------------------------------------------------------------------------------
FUNCTIONS = {
    # docs/conventions.md Baselines
    "cross_entropy_loss": pos("input", "target") + kw(label_smoothing=0.0, weight=None) + IR + kw(softcap=None),
    "bce_with_logits_loss": pos("input", "target") + kw(label_smoothing=0.0, weight=None) + IR,
    # docs/losses/z_loss.md
    "z_loss": pos("input", "target") + kw(a=1.0, b=0.0, eps=1e-6) + IR,
    # docs/losses/z_loss.md
    "logz_penalty": pos("input") + kw(coef=1e-4, mask=None, reduction="mean"),
    "cross_entropy_with_logz_penalty": pos("input", "target") + kw(coef=1e-4) + IR + kw(return_penalty=False,
                                                                                         softcap=None),
    # docs/losses/sparsemax.md
    "sparsemax": pos("input") + kw(dim=-1, k=None),
    "entmax15": pos("input") + kw(dim=-1, k=None),
    "entmax_bisect": pos("input") + kw(alpha=1.5, dim=-1, n_iter=50),
    "sparsemax_loss": pos("input", "target") + kw(k=None) + IR,
    "entmax15_loss": pos("input", "target") + kw(k=None) + IR,
    "entmax_bisect_loss": pos("input", "target") + kw(alpha=1.5, n_iter=50) + IR,
    # docs/losses/comp_sum.md
    "comp_sum_loss": pos("input", "target") + kw(tau=1.0) + IR,
    # docs/losses/adversarial_comp_sum.md
    "adversarial_comp_sum_loss": pos("input", "input_adv", "target") + kw(tau=1.0, rho=1.0, nu=REQUIRED) + IR,
    # docs/losses/opl.md
    "opl_loss": pos("embeddings", "target") + kw(gamma=0.5, variant="paper", neg_term=None) + IR
    + kw(return_stats=False),
    # docs/losses/psl.md
    "psl_loss": pos("pos_scores", "neg_scores") + kw(
        temperature=0.05, activation="tanh", score_scale=0.5, variant="paper", include_positive=None,
        normalization="row", bounded_scores=True, neg_mask=None, reduction="mean"),
    "sampled_softmax_loss": pos("pos_scores", "neg_scores") + kw(
        temperature=0.05, score_scale=0.5, variant="paper", include_positive=None, neg_mask=None,
        reduction="mean"),
    "bpr_loss": pos("pos_scores", "neg_scores") + kw(neg_mask=None, reduction="mean"),
    # docs/losses/decoupled_softmax.md
    # (+ the candidate ``mask`` of the revised rules: an optional tensor, so after the
    # hyperparameters and before ``generator`` as in partial_fc_loss's ``index, generator``)
    "decoupled_softmax_loss": pos("scores", "target") + kw(
        temperature=0.05, weighted=False, variant="paper", sample_one_positive=None, mask_value=None,
        mask=None, generator=None) + IR,
    "infonce_loss": pos("scores", "target") + kw(temperature=0.05, positive_normalization="sum", mask=None)
    + IR,
    "soft_topk_loss": pos("scores", "target") + kw(
        k=5, alpha=2.0, temperature=0.05, n_iter=32, variant="paper", mask=None, generator=None) + IR,
    "in_batch_scores": pos("query", "keys", "target") + kw(gather_distributed=False, mask=None),
    # docs/losses/nbc_softmax.md
    "nbc_loss": pos("embeddings", "target") + kw(scale=0.2, num_classes=None, variant="paper") + IR,
    "nbc_softmax_loss": pos("embeddings", "target", "weight") + kw(
        scale=0.2, nbc_weight=0.5, variant="paper", bias=None) + IR,
    # docs/losses/wcdas.md
    "wcdas_logits": pos("embeddings", "weight", "concentration_logit", "scale") + kw(variant="paper"),
    "wcdas_loss": pos("embeddings", "target", "weight", "concentration_logit", "scale") + kw(variant="paper")
    + IR,
    # docs/losses/gol.md
    "gumbel_activation": pos("input"),
    "gumbel_prior_bias": pos("prior"),
    "gumbel_bce_loss": pos("input", "target") + kw(
        label_smoothing=0.0, variant="paper", clamp=None, weight=None) + IR,
    # docs/losses/partial_fc.md
    "margin_softmax_loss": pos("embeddings", "target", "weight") + MARGIN_KW + IR,
    "partial_fc_loss": pos("embeddings", "target", "weight") + kw(sample_rate=0.1) + MARGIN_KW
    + kw(index=None, generator=None) + IR + kw(sparse_grad=False),
    # docs/losses/dice.md
    "dice_semimetric_loss": pos("input", "target") + DICE_HYPER + kw(mask=None) + IR,
    "jaccard_metric_loss": pos("input", "target") + DICE_HYPER + kw(mask=None) + IR,
    "soft_dice_loss": pos("input", "target") + DICE_HYPER + kw(mask=None) + IR,
    # docs/losses/linear_cross_entropy.md
    "linear_cross_entropy": pos("embeddings", "target", "weight") + kw(bias=None, chunk_size=None) + IR
    + kw(label_smoothing=0.0, logz_coef=0.0, softcap=None),
}

# ----------------------------------------------------------------------------------------------
# modules: losses.<Name>.__init__ (without self)
# ----------------------------------------------------------------------------------------------
HEAD = pos("embedding_dim", "num_classes")
DICE_MODULE = kw(activation="softmax", smooth=1.0, aggregate="dataset", active_classes=None, log_loss=False,
                 weight=None) + IR + kw(gather_distributed=False)

MODULES = {
    "CrossEntropyLoss": kw(label_smoothing=0.0, weight=None) + IR + kw(softcap=None),
    "BCEWithLogitsLoss": kw(label_smoothing=0.0, weight=None) + IR,
    "ZLoss": kw(a=1.0, b=0.0, eps=1e-6) + IR,
    "CrossEntropyWithLogZPenalty": kw(coef=1e-4) + IR + kw(return_penalty=False, softcap=None),
    "SparsemaxLoss": kw(k=None) + IR,
    "Entmax15Loss": kw(k=None) + IR,
    "EntmaxBisectLoss": kw(alpha=1.5, n_iter=50) + IR,
    "CompSumLoss": kw(tau=1.0) + IR,
    "AdversarialCompSumLoss": kw(
        tau=1.0, rho=1.0, nu=REQUIRED, epsilon=8 / 255, steps=10, step_size=2 / 255, norm="linf",
        clip=(0.0, 1.0), random_init_std=1e-3) + IR + kw(seed=None),
    "OrthogonalProjectionLoss": kw(gamma=0.5, variant="paper", neg_term=None) + IR
    + kw(return_stats=False, gather_distributed=False),
    "PSLLoss": kw(temperature=0.05, activation="tanh", score_scale=0.5, variant="paper", include_positive=None,
                  normalization="row", bounded_scores=True, reduction="mean"),
    "SampledSoftmaxLoss": kw(temperature=0.05, score_scale=0.5, variant="paper", include_positive=None,
                             reduction="mean"),
    "BPRLoss": kw(reduction="mean"),
    "DecoupledSoftmaxLoss": kw(temperature=0.05, weighted=False, variant="paper", sample_one_positive=None,
                               mask_value=None) + IR + kw(seed=None, gather_distributed=False),
    "InfoNCELoss": kw(temperature=0.05, positive_normalization="sum") + IR + kw(gather_distributed=False),
    "SoftTopKLoss": kw(k=5, alpha=2.0, temperature=0.05, n_iter=32, variant="paper") + IR
    + kw(seed=None, gather_distributed=False),
    "NBCSoftmaxLoss": HEAD + kw(scale=0.2, nbc_weight=0.5, bias=True, variant="paper") + IR
    + kw(gather_distributed=False),
    "WCDASLoss": HEAD + kw(concentration_init=0.0, scale=None, variant="paper") + IR,
    "GumbelBCELoss": kw(label_smoothing=0.0, variant="paper", clamp=None, weight=None) + IR,
    "MarginSoftmaxLoss": HEAD + MARGIN_KW + IR,
    "PartialFCLoss": HEAD + kw(sample_rate=0.1) + MARGIN_KW + IR
    + kw(seed=None, distributed=False, process_group=None, sparse_grad=False),
    "DiceSemimetricLoss": DICE_MODULE,
    "JaccardMetricLoss": DICE_MODULE,
    "SoftDiceLoss": DICE_MODULE,
    "LinearCrossEntropyLoss": HEAD + kw(bias=True, chunk_size=None) + IR
    + kw(label_smoothing=0.0, logz_coef=0.0, softcap=None),
}

# Per-call tensors of a function that its module's constructor drops: forward must accept them.
FORWARD_KEYWORDS = {
    "BPRLoss": ("neg_mask",),
    "PSLLoss": ("neg_mask",),
    "SampledSoftmaxLoss": ("neg_mask",),
    "DiceSemimetricLoss": ("mask",),
    "JaccardMetricLoss": ("mask",),
    "SoftDiceLoss": ("mask",),
    "PartialFCLoss": ("index",),
    # the candidate mask of docs/losses/decoupled_softmax.md (revised rules): forward(..., *, mask=None)
    "DecoupledSoftmaxLoss": ("mask",),
    "InfoNCELoss": ("mask",),
    "SoftTopKLoss": ("mask",),
}

# Keywords that share a name between function and module but are different things in the spec:
# a bias *tensor* (function) vs a bias *flag* (module), docs/losses/nbc_softmax.md and docs/losses/linear_cross_entropy.md.
DIFFERENT_MEANING = {
    ("nbc_softmax_loss", "NBCSoftmaxLoss"): {"bias"},
    ("linear_cross_entropy", "LinearCrossEntropyLoss"): {"bias"},
}


# Methods the spec names on modules (docs/losses/wcdas.md, docs/losses/partial_fc.md, docs/losses/linear_cross_entropy.md, registry "owns_head": ``.logits(embeddings)``).
METHODS = {
    "WCDASLoss": {"logits": ["embeddings"], "concentration": [], "effective_scale": []},
    "MarginSoftmaxLoss": {"logits": ["embeddings"]},
    "PartialFCLoss": {"logits": ["embeddings"], "ddp_ignored_parameters": []},
    "NBCSoftmaxLoss": {"logits": ["embeddings"]},
    "LinearCrossEntropyLoss": {"logits": ["embeddings"]},
}


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
def _params(obj, *, drop_self=False):
    sig = inspect.signature(obj)
    params = list(sig.parameters.values())
    if drop_self:
        assert params and params[0].name == "self", f"{obj}: first parameter is not self"
        params = params[1:]
    return params


def _fmt_default(d):
    return "<required>" if d is REQUIRED else repr(d)


def _check_contents(label, params, expected):
    """Names, kinds and defaults of the spec's parameters; extras keyword-only with a default."""
    problems = []
    actual = {p.name: p for p in params}
    for p in params:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            problems.append(f"{label}: has {p} (no *args/**kwargs allowed, docs/conventions.md)")
    exp_names = [n for n, _, _ in expected]
    exp_pos = [n for n, k, _ in expected if k is POS]
    act_pos = [p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY, POS)]
    if act_pos != exp_pos:
        problems.append(f"{label}: positional parameters {act_pos}, expected {exp_pos}")
    for name, kind, default in expected:
        p = actual.get(name)
        if p is None:
            problems.append(f"{label}: missing parameter {name!r} (expected {kind.description}, "
                            f"default {_fmt_default(default)})")
            continue
        if p.kind is not kind:
            problems.append(f"{label}: {name!r} is {p.kind.description}, expected {kind.description}")
        if default is REQUIRED:
            if p.default is not REQUIRED:
                problems.append(f"{label}: {name!r} has default {p.default!r}, expected none (required)")
        elif p.default is REQUIRED:
            problems.append(f"{label}: {name!r} has no default, expected {default!r}")
        elif type(p.default) is not type(default) or p.default != default:
            problems.append(f"{label}: {name!r} default {p.default!r} ({type(p.default).__name__}), "
                            f"expected {default!r} ({type(default).__name__})")
    for p in params:
        if p.name in exp_names or p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if p.kind is not KW:
            problems.append(f"{label}: extra parameter {p.name!r} is {p.kind.description}, must be keyword-only")
        elif p.default is REQUIRED:
            problems.append(f"{label}: extra keyword {p.name!r} has no default (would break the spec's calls)")
    assert not problems, "\n".join(problems)


def _check_order(label, params, expected):
    """The spec's parameters come first, in the spec's order; extras only after them."""
    exp_names = [n for n, _, _ in expected]
    act_names = [p.name for p in params]
    extras = [n for n in act_names if n not in exp_names]
    assert act_names == exp_names + extras, (
        f"{label}: parameter order {act_names}\n   expected {exp_names}"
        + (f" followed by extras {extras}" if extras else ""))


def _get(name):
    obj = getattr(losses, name, None)
    assert obj is not None, f"losses.{name} does not exist"
    return obj


# ----------------------------------------------------------------------------------------------
# tests
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_function_signature(name):
    fn = _get(name)
    assert inspect.isfunction(fn), f"losses.{name} is not a plain function ({type(fn)})"
    _check_contents(f"losses.{name}", _params(fn), FUNCTIONS[name])


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_function_order(name):
    _check_order(f"losses.{name}", _params(_get(name)), FUNCTIONS[name])


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_function_exported(name):
    fn = _get(name)
    assert name in losses.__all__, f"{name} not in losses.__all__"
    assert getattr(losses.functional, name, None) is fn, f"losses.functional.{name} missing or a different object"
    assert name in losses.functional.__all__, f"{name} not in losses.functional.__all__"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_signature(name):
    cls = _get(name)
    assert inspect.isclass(cls) and issubclass(cls, nn.Module), f"losses.{name} is not an nn.Module class"
    assert name in losses.__all__, f"{name} not in losses.__all__"
    _check_contents(f"losses.{name}.__init__", _params(cls.__init__, drop_self=True), MODULES[name])


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_order(name):
    _check_order(f"losses.{name}.__init__", _params(_get(name).__init__, drop_self=True), MODULES[name])


def test_gol_alias():
    assert losses.GOLLoss is losses.GumbelBCELoss
    assert "GOLLoss" in losses.__all__


FUNCTION_MODULE_PAIRS = sorted({(f, m) for f, m, *_ in REGISTRY.values()})


@pytest.mark.parametrize("function,module", FUNCTION_MODULE_PAIRS, ids=[f"{f}-{m}" for f, m in FUNCTION_MODULE_PAIRS])
def test_module_defaults_match_function(function, module):
    """"Same keywords": a constructor keyword named like a function keyword has its default."""
    fparams = {p.name: p for p in _params(_get(function)) if p.kind is KW}
    mparams = {p.name: p for p in _params(_get(module).__init__, drop_self=True) if p.kind is KW}
    skip = DIFFERENT_MEANING.get((function, module), set())
    problems = []
    for name in sorted(set(fparams) & set(mparams) - skip):
        fd, md = fparams[name].default, mparams[name].default
        if fd is REQUIRED or md is REQUIRED:
            same = fd is md
        else:
            same = type(fd) is type(md) and fd == md
        if not same:
            problems.append(f"{name}: {function} default {_fmt_default(fd)}, {module} default {_fmt_default(md)}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_forward_signature(name):
    """forward takes the registry inputs positionally, plus the per-call tensors the ctor drops."""
    cls = _get(name)
    kinds = {v[2] for v in REGISTRY.values() if v[1] == name}
    assert len(kinds) == 1, f"{name}: registry kinds {kinds}"
    inputs = kinds.pop()
    sig = inspect.signature(cls.forward)
    placeholders = [object()] * len(inputs)
    sig.bind(object(), *placeholders)  # self + inputs, raises TypeError if not accepted
    if inputs == SCORES:  # docs/losses/decoupled_softmax.md: .forward(scores, target) or .forward(query, keys, target)
        sig.bind(object(), object(), object(), object())
    for extra in FORWARD_KEYWORDS.get(name, ()):
        p = sig.parameters.get(extra)
        assert p is not None, f"{name}.forward does not accept {extra!r}"
        assert p.default is None, f"{name}.forward: {extra!r} default {p.default!r}, expected None"
        sig.bind(object(), *placeholders, **{extra: None})


@pytest.mark.parametrize("name", sorted(METHODS))
def test_head_methods(name):
    cls = _get(name)
    for method, args in METHODS[name].items():
        fn = getattr(cls, method, None)
        assert callable(fn), f"{name}.{method} missing"
        got = [p.name for p in _params(fn, drop_self=True)]
        assert got == args, f"{name}.{method}{tuple(got)}, expected {tuple(args)}"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_registry_entry(name):
    function, module, inputs, owns_head, auxiliary, unit, example_kwargs = REGISTRY[name]
    specs = {s.name: s for s in losses.list_losses()}
    assert name in specs, f"registry has no {name!r}"
    s = specs[name]
    assert s.function is _get(function), f"{name}: function {s.function.__name__}, expected {function}"
    assert s.module is _get(module), f"{name}: module {s.module.__name__}, expected {module}"
    assert tuple(s.inputs) == inputs, f"{name}: inputs {s.inputs}, expected {inputs}"
    assert s.kind == KIND_NAMES[inputs], f"{name}: kind {s.kind!r}, expected {KIND_NAMES[inputs]!r}"
    assert s.query_keys is (inputs == SCORES), f"{name}: query_keys {s.query_keys}"
    assert s.owns_head is owns_head, f"{name}: owns_head {s.owns_head}, expected {owns_head}"
    assert s.auxiliary is auxiliary, f"{name}: auxiliary {s.auxiliary}, expected {auxiliary}"
    assert s.unit == unit, f"{name}: unit {s.unit!r}, expected {unit!r}"
    assert s.experimental is (name in EXPERIMENTAL), f"{name}: experimental {s.experimental}"
    for k, v in example_kwargs.items():
        assert k in s.example_kwargs and s.example_kwargs[k] == v, (
            f"{name}: example_kwargs {dict(s.example_kwargs)} lacks {k}={v!r}")
    # "enough to build it": the spec's example_kwargs alone build the module, via create_loss too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", losses.ExperimentalWarning)
        built = losses.create_loss(name, **example_kwargs)
    assert type(built) is s.module
    if name == "cosine_softmax":
        assert tuple(s.function_kwargs.get("margin", ())) == (1.0, 0.0, 0.0), s.function_kwargs
        assert tuple(built.margin) == (1.0, 0.0, 0.0)


def test_input_kinds_are_named():
    """Five descriptive kinds (no one-letter codes), each a constant of ``losses.InputKind``."""
    assert losses.INPUT_KINDS == {v: k for k, v in KIND_NAMES.items()}
    assert (losses.InputKind.LOGITS, losses.InputKind.EMBEDDINGS, losses.InputKind.SCORES, losses.InputKind.PAIRS,
            losses.InputKind.MODEL) == ("logits", "embeddings", "scores", "pairs", "model")


def test_registry_has_exactly_the_spec_names():
    assert {s.name for s in losses.list_losses()} == set(REGISTRY)


def test_signature_tables_name_public_objects():
    """Every name the signature tables pin is one of the expected public names (no stale or
    misspelt entry)."""
    for table in (FUNCTIONS, MODULES, METHODS, FORWARD_KEYWORDS):
        stale = set(table) - PUBLIC_NAMES
        assert not stale, f"not public names: {sorted(stale)}"


def test_top_level_api():
    # docs/conventions.md Registry, Errors, Randomness
    p = _params(losses.create_loss)
    assert [(q.name, q.kind) for q in p] == [("name", POS), ("kwargs", inspect.Parameter.VAR_KEYWORD)]
    assert _params(losses.list_losses) == []
    assert _params(losses.loss_names) == []
    assert losses.loss_names() == [s.name for s in losses.list_losses()]
    assert all(isinstance(n, str) for n in losses.loss_names())
    # a spec prints as one short line naming its entry, kind, function and module
    r = repr(losses.get_loss_spec("z_loss"))
    assert r == "LossSpec('z_loss', kind='logits', function=z_loss, module=ZLoss, arxiv='1604.08859')", r
    assert "\n" not in repr(losses.list_losses()) and len(repr(losses.get_loss_spec("wcdas"))) < 160
    # ``set_validation(False)`` / ``validation(False)``: one positional flag (its name is not specified)
    assert [q.kind for q in _params(losses.set_validation)] == [POS]
    assert [q.kind for q in _params(losses.validation)] == [POS]
    with losses.validation(False):
        assert not losses.is_validation_enabled()
    assert issubclass(losses.ExperimentalWarning, UserWarning)
    for n in API:
        assert n in losses.__all__, n


def test_register_signature():
    """``losses.register(name, *, ...)``: the name positional, every field keyword-only (docs/contributing.md)."""
    p = _params(losses.register)
    assert [(q.name, q.kind) for q in p[:1]] == [("name", POS)]
    assert all(q.kind is inspect.Parameter.KEYWORD_ONLY for q in p[1:])
    assert [q.name for q in p[1:]] == [
        "function", "module", "inputs", "unit", "unit_weights", "arxiv", "paper", "owns_head", "auxiliary",
        "experimental", "example_kwargs", "example_inputs", "function_kwargs", "query_keys", "softmax", "masks",
        "soft_targets", "dense_targets", "class_weight", "weighted_mean", "documented_inf", "tensor_args", "replace"]
    assert {q.name for q in p if q.default is inspect.Parameter.empty} == {"name", "inputs", "unit", "unit_weights"}
    sig = inspect.signature(losses.testing.check_loss).parameters
    assert list(sig) == ["name_or_spec", "properties", "compile_backend", "documented_inf"]
    assert sig["compile_backend"].default == "aot_eager" and sig["properties"].default is None
