"""The loss registry: stable names -> function, module and the metadata the Lightning layer and
the contract tests route by (``docs/conventions.md``, Registry).

Each family module registers its entries at import time with :func:`register`; user code
registers its own losses the same way (``docs/contributing.md``, Adding a loss) and checks them
with :func:`losses.testing.check_loss`. Users call :func:`create_loss` and :func:`list_losses`::

    >>> import losses
    >>> loss = losses.create_loss("cross_entropy", label_smoothing=0.1)
    >>> spec = losses.get_loss_spec("cross_entropy")
    >>> spec.kind, spec.inputs
    ('logits', ('input', 'target'))
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

from ._core import check_bool

__all__ = [
    "LossSpec", "InputKind", "INPUT_KINDS", "UNITS", "MASKS", "register", "unregister", "create_loss", "list_losses",
    "get_loss_spec", "spec_for_module", "loss_names",
]


class InputKind:
    """What a loss's ``forward`` takes, by kind (the ``inputs`` of :func:`register`; the Lightning
    layer routes by it). Each constant is the plain string it names:

    >>> import losses
    >>> losses.InputKind.LOGITS, losses.INPUT_KINDS[losses.InputKind.PAIRS]
    ('logits', ('pos_scores', 'neg_scores'))
    """

    LOGITS = "logits"  #: ``(input, target)``: class logits ``(N, C, ...)`` and ids / soft targets
    EMBEDDINGS = "embeddings"  #: ``(embeddings, target)``: features ``(N, D)`` and class ids
    SCORES = "scores"  #: ``(scores, target)``: candidate scores ``(B, L)`` and a positive mask
    PAIRS = "pairs"  #: ``(pos_scores, neg_scores)``: a positive's score and its negatives' scores
    MODEL = "model"  #: ``(model, inputs, target)``: the loss calls the model itself


#: ``forward``'s positional arguments, by kind.
INPUT_KINDS: Dict[str, Tuple[str, ...]] = {
    InputKind.LOGITS: ("input", "target"),
    InputKind.EMBEDDINGS: ("embeddings", "target"),
    InputKind.SCORES: ("scores", "target"),
    InputKind.PAIRS: ("pos_scores", "neg_scores"),
    InputKind.MODEL: ("model", "inputs", "target"),
}

#: What one ``reduction="none"`` value is computed for.
UNITS = ("position", "element", "row", "pair", "class", "batch")

#: The masks a loss may honour (the ``masks`` of :func:`register`): ``"neg_inf"``, a ``-inf``
#: logit (or score) marks a class (or candidate) that does not exist, so the value equals the loss
#: on the input without it and its gradient is exactly 0; ``"mask"``, an explicit ``mask=``
#: keyword of ``forward`` (``True`` = excluded).
MASKS = ("neg_inf", "mask")

#: ``example_inputs(generator=..., dtype=..., case=...) -> (args, kwargs)`` builds inputs for
#: ``module(*args, **kwargs)``; ``case`` is ``"random"``, ``"extreme"`` (x1e4 logits, -inf masks
#: where the loss allows them) or ``"ignored"`` (every unit ignored / inactive).
ExampleInputs = Callable[..., Tuple[tuple, dict]]

_NAME = re.compile(r"[a-z][a-z0-9_]*")
_ARXIV = re.compile(r"\d{4}\.\d{4,5}")


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """Metadata of one registered loss.

    Attributes:
        name: stable registry identifier used by configs.
        function: the pure functional form.
        module: the ``nn.Module`` class (``create_loss`` instantiates it).
        inputs: names of ``forward``'s positional arguments (``INPUT_KINDS[kind]``).
        unit: what one loss value is computed for (``position``, ``element``, ``row``, ``pair``,
            ``class`` or ``batch``).
        unit_weights: ``unit_weights(*args, **kwargs)`` with the *module's* forward arguments
            and constructor keywords; returns the tensor of unit weights ``w`` shaped like the
            ``reduction="none"`` output, so that ``sum == (w * none).sum()`` and
            ``mean == sum / w.sum()``. ``None`` for batch-level losses.
        arxiv: arXiv id of the paper (``""`` for classical baselines without one).
        paper: short citation.
        owns_head: the module owns class weights and exposes ``.logits(embeddings)``.
        auxiliary: meant to be added (with a weight) to a main loss, e.g. OPL.
        experimental: emits :class:`losses.ExperimentalWarning`.
        example_kwargs: constructor keywords enough to build the module.
        example_inputs: builds example ``forward`` inputs (see :data:`ExampleInputs`).
        function_kwargs: extra keywords that make ``function`` compute what the module computes.
        query_keys: (``"scores"`` kind) ``forward`` also takes ``(query, keys, target)`` and
            scores the pairs itself (``losses.in_batch_scores``).
        softmax: the maths normalises over the classes (logits) or the candidates (scores): a
            softmax / log-sum-exp or a sparse relative of it (sparsemax, entmax), so a single class is a ``ValueError`` (it would train nothing).
        masks: the masks the loss honours, a subset of :data:`MASKS` (``"neg_inf"``: ``-inf``
            logits remove a class; ``"mask"``: an explicit ``mask=`` keyword of ``forward``).
        soft_targets: (``"logits"``) the target may also be class probabilities shaped like the
            input, checked to sum to 1 over the classes.
        dense_targets: (``"logits"``) the target may be a float tensor shaped like the input (soft
            or multi-hot); ``False``: class ids only, a float target is a ``TypeError``. Implied by
            ``soft_targets``.
        class_weight: the module takes a per-class ``weight=`` tensor of shape ``(C,)`` (negative
            or all-zero weights are a ``ValueError``).
        weighted_mean: with class weights, ``"mean"`` divides by the summed weights of the valid
            targets, as ``F.cross_entropy`` does (``"none"`` already carries ``weight[target]``).
        documented_inf: the loss documents an exact ``+inf`` (never NaN) on extreme inputs with
            its example keywords (e.g. comp-sum with ``tau < 1`` on logits x1e4).
        tensor_args: constructor arguments that take tensors, stored as the module's own
            parameters or buffers and therefore not shown in its ``repr``.
    """

    name: str
    function: Callable[..., Any]
    module: type
    inputs: Tuple[str, ...]
    unit: str
    unit_weights: Optional[Callable[..., Tensor]]
    arxiv: str
    paper: str
    owns_head: bool = False
    auxiliary: bool = False
    experimental: bool = False
    example_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    example_inputs: Optional[ExampleInputs] = None
    function_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    query_keys: bool = False
    softmax: bool = False
    masks: Tuple[str, ...] = ()
    soft_targets: bool = False
    dense_targets: bool = False
    class_weight: bool = False
    weighted_mean: bool = False
    documented_inf: bool = False
    tensor_args: Tuple[str, ...] = ()

    def __repr__(self) -> str:
        # one short line per entry (the dataclass default prints every function and mapping)
        flags = [f for f in ("owns_head", "auxiliary", "experimental") if getattr(self, f)]
        return (f"LossSpec({self.name!r}, kind={self.kind!r}, function={self.function.__name__}, "
                f"module={self.module.__name__}" + "".join(f", {f}=True" for f in flags)
                + (f", arxiv={self.arxiv!r}" if self.arxiv else "") + ")")

    @property
    def seeded(self) -> bool:
        """The module owns a random generator (a ``seed`` constructor keyword); its state travels
        in the ``state_dict``."""
        return "seed" in inspect.signature(self.module.__init__).parameters

    @property
    def kind(self) -> str:
        """The input kind (a key of :data:`INPUT_KINDS`, e.g. ``"logits"``)."""
        for k, v in INPUT_KINDS.items():
            if v == self.inputs:
                return k
        raise KeyError(self.inputs)

    def create(self, **kwargs: Any) -> nn.Module:
        """Build the module; a preset in ``function_kwargs`` (e.g. ``cosine_softmax``'s margin)
        is the default for the constructor keyword of the same name."""
        params = inspect.signature(self.module).parameters
        preset = {k: v for k, v in self.function_kwargs.items() if k in params}
        return self.module(**{**preset, **kwargs})


_REGISTRY: Dict[str, LossSpec] = {}


def _check_mapping(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(f"register: {name} must be a dict or None (got {type(value).__name__}); "
                        "pass keyword arguments as a dict")


def register(
    name: str,
    *,
    function: Optional[Callable[..., Any]] = None,
    module: Optional[type] = None,
    inputs: str,
    unit: str,
    unit_weights: Optional[Callable[..., Tensor]],
    arxiv: str = "",
    paper: str = "",
    owns_head: bool = False,
    auxiliary: bool = False,
    experimental: bool = False,
    example_kwargs: Optional[Mapping[str, Any]] = None,
    example_inputs: Optional[ExampleInputs] = None,
    function_kwargs: Optional[Mapping[str, Any]] = None,
    query_keys: bool = False,
    softmax: bool = False,
    masks: Tuple[str, ...] = (),
    soft_targets: bool = False,
    dense_targets: bool = False,
    class_weight: bool = False,
    weighted_mean: bool = False,
    documented_inf: bool = False,
    tensor_args: Tuple[str, ...] = (),
    replace: bool = False,
) -> Any:
    """Register a loss under a stable ``name``, so that ``create_loss(name)``, the LightningCLI
    recipes, the Lightning routing and :func:`losses.testing.check_loss` know it.

    Args:
        name: registry name (lower case, digits and ``_``, starting with a letter).
        function: the functional form ``function(*forward_args, **hyperparameters)``.
        module: the ``nn.Module`` class; its ``forward`` takes ``INPUT_KINDS[inputs]``.
        inputs: what ``forward`` takes, a key of :data:`INPUT_KINDS` (:class:`InputKind`):
            ``"logits"``, ``"embeddings"``, ``"scores"``, ``"pairs"`` or ``"model"``.
        unit: what one ``reduction="none"`` value is computed for, one of :data:`UNITS`.
        unit_weights: ``unit_weights(*forward_args, **constructor_and_forward_kwargs)`` -> the
            weights ``w`` (shaped like the ``"none"`` output) with ``sum == Σ w·none`` and
            ``mean == sum / Σ w``; ``None`` only for ``unit="batch"``.
        arxiv: arXiv id (``"2401.01234"``) or ``""``.
        paper: short citation.
        owns_head: the module owns class weights and has ``.logits(embeddings)``.
        auxiliary: the loss is added (with a weight) to a main loss and cannot train alone.
        experimental: the module emits :class:`losses.ExperimentalWarning`.
        example_kwargs: constructor keywords enough to build the module (for the checks).
        example_inputs: ``example_inputs(generator=, dtype=, case=) -> (args, kwargs)``; default:
            the registry's inputs of that kind (``N=6``, ``C=5``, ``D=8``, ``L=7``).
        function_kwargs: extra keywords that make ``function`` compute what the module computes.
        query_keys: (``"scores"``) ``forward`` also takes ``(query, keys, target)``.
        softmax: the maths is a softmax / log-sum-exp over the classes or candidates (one class is
            a ``ValueError``).
        masks: the masks the loss honours, a tuple from :data:`MASKS`: ``"neg_inf"`` (a ``-inf``
            logit or score removes that class or candidate: the value without it, gradient 0) and
            ``"mask"`` (``forward`` takes ``mask=``).
        soft_targets: (``"logits"``) also takes class probabilities shaped like the input, checked
            to sum to 1.
        dense_targets: (``"logits"``) takes a float target shaped like the input (soft or
            multi-hot); implied by ``soft_targets``.
        class_weight: the module takes a per-class ``weight=`` tensor ``(C,)``.
        weighted_mean: with class weights ``"mean"`` is ``Σ none / Σ weight[target]`` (as
            ``F.cross_entropy``), not ``Σ w·none / Σ w`` with the unit weights.
        documented_inf: the loss documents an exact ``+inf`` (never NaN) on the extreme example
            inputs (:func:`losses.testing.check_loss` then accepts it).
        tensor_args: constructor arguments that take tensors (kept as the module's parameters or
            buffers, so its ``repr`` leaves them out).
        replace: overwrite an entry of the same name (else registering it twice is an error).

    Returns:
        The :class:`LossSpec`. Without ``module`` (or without ``function``) ``register(...)``
        returns a decorator for the class (or the function) that registers it and returns it
        unchanged::

            @losses.register("my_loss", function=my_loss, inputs="logits", unit="position",
                             unit_weights=my_unit_weights)
            class MyLoss(nn.Module): ...
    """
    if function is None or module is None:
        if function is None and module is None:
            raise TypeError(f"register: needs function=, module= or both (got neither for {name!r}); "
                            "decorate the module class or pass function= and module=")

        def decorator(obj: Any) -> Any:
            if isinstance(obj, type):
                if module is not None:
                    raise TypeError(f"register: module= is given, so decorate the function (got class "
                                    f"{obj.__name__}); or drop module=")
                register(name, function=function, module=obj, **rest)
            else:
                if function is not None:
                    raise TypeError(f"register: function= is given, so decorate the module class (got "
                                    f"{obj!r}); or drop function=")
                register(name, function=obj, module=module, **rest)
            return obj

        rest = dict(inputs=inputs, unit=unit, unit_weights=unit_weights, arxiv=arxiv, paper=paper,
                    owns_head=owns_head, auxiliary=auxiliary, experimental=experimental,
                    example_kwargs=example_kwargs, example_inputs=example_inputs,
                    function_kwargs=function_kwargs, query_keys=query_keys, softmax=softmax, masks=masks,
                    soft_targets=soft_targets, dense_targets=dense_targets, class_weight=class_weight,
                    weighted_mean=weighted_mean, documented_inf=documented_inf, tensor_args=tensor_args, replace=replace)
        return decorator

    if not isinstance(name, str) or not _NAME.fullmatch(name):
        err = ValueError if isinstance(name, str) else TypeError
        raise err(f"register: name must be a lower-case identifier (got {name!r}); e.g. 'my_loss'")
    check_bool("register", "replace", replace)
    if name in _REGISTRY and not replace:
        raise ValueError(f"register: loss name already registered (got {name!r}); pick a new name or pass "
                         "replace=True")
    if not callable(function) or isinstance(function, type):
        raise TypeError(f"register: function must be a function (got {function!r}); pass the functional form")
    if not (isinstance(module, type) and issubclass(module, nn.Module)):
        raise TypeError(f"register: module must be an nn.Module subclass (got {module!r}); pass the class, "
                        "not an instance")
    if inputs not in INPUT_KINDS:
        raise ValueError(f"register: inputs must be one of {list(INPUT_KINDS)} (got {inputs!r}); see "
                         "losses.InputKind")
    if unit not in UNITS:
        raise ValueError(f"register: unit must be one of {UNITS} (got {unit!r}); see docs/conventions.md")
    if unit_weights is None and unit != "batch":
        raise ValueError(f"register: unit_weights is required for unit {unit!r} (got None); only batch-level "
                         "losses (unit='batch') have none")
    if unit_weights is not None and not callable(unit_weights):
        raise TypeError(f"register: unit_weights must be callable or None (got {unit_weights!r}); "
                        "unit_weights(*forward_args, **kwargs) -> Tensor")
    if not isinstance(arxiv, str) or not (arxiv == "" or _ARXIV.fullmatch(arxiv)):
        raise ValueError(f"register: arxiv must be an arXiv id like '2401.01234' or '' (got {arxiv!r}); "
                         "leave it '' for a loss without a paper")
    if not isinstance(paper, str):
        raise TypeError(f"register: paper must be a str (got {type(paper).__name__}); e.g. 'A. Author, Title, 2024'")
    for flag, value in (("owns_head", owns_head), ("auxiliary", auxiliary), ("experimental", experimental),
                        ("query_keys", query_keys), ("softmax", softmax), ("soft_targets", soft_targets),
                        ("dense_targets", dense_targets), ("class_weight", class_weight),
                        ("weighted_mean", weighted_mean), ("documented_inf", documented_inf)):
        check_bool("register", flag, value)
    ctor = inspect.signature(module.__init__).parameters
    if isinstance(masks, str) or not isinstance(masks, (tuple, list)):
        raise TypeError(f"register: masks must be a tuple of names (got {masks!r}); e.g. masks=('neg_inf',)")
    if any(m not in MASKS for m in masks):
        raise ValueError(f"register: masks must be names from {MASKS} (got {tuple(masks)!r}); drop the others")
    if isinstance(tensor_args, str) or not isinstance(tensor_args, (tuple, list)):
        raise TypeError(f"register: tensor_args must be a tuple of names (got {tensor_args!r}); "
                        "e.g. tensor_args=('weight',)")
    unknown = [a for a in tensor_args if a not in ctor]
    if unknown:
        raise ValueError(f"register: tensor_args must name constructor arguments of {module.__name__} (got "
                         f"{unknown}); list the tensor keywords of __init__")
    if (soft_targets or dense_targets) and inputs != InputKind.LOGITS:
        raise ValueError(f"register: soft_targets / dense_targets apply to inputs='logits' only (got "
                         f"inputs={inputs!r}); leave them False")
    if soft_targets and not dense_targets:
        dense_targets = True  # probabilities are dense targets
    if class_weight and "weight" not in ctor:
        raise ValueError(f"register: class_weight=True but {module.__name__} takes no weight= (got "
                         f"class_weight={class_weight}); add the keyword or leave class_weight=False")
    if owns_head and not callable(getattr(module, "logits", None)):
        raise ValueError(f"register: owns_head=True but {module.__name__} has no .logits(embeddings) (got "
                         f"owns_head={owns_head}); add the method or leave owns_head=False")
    if query_keys and inputs != InputKind.SCORES:
        raise ValueError(f"register: query_keys applies to inputs='scores' only (got inputs={inputs!r}); "
                         "leave query_keys=False")
    _check_mapping("example_kwargs", example_kwargs)
    _check_mapping("function_kwargs", function_kwargs)
    if example_inputs is not None and not callable(example_inputs):
        raise TypeError(f"register: example_inputs must be callable or None (got {example_inputs!r}); "
                        "example_inputs(generator=, dtype=, case=) -> (args, kwargs)")
    spec = LossSpec(
        name=name,
        function=function,
        module=module,
        inputs=INPUT_KINDS[inputs],
        unit=unit,
        unit_weights=unit_weights,
        arxiv=arxiv,
        paper=paper,
        owns_head=owns_head,
        auxiliary=auxiliary,
        experimental=experimental,
        example_kwargs=dict(example_kwargs or {}),
        example_inputs=example_inputs or default_example_inputs(inputs),
        function_kwargs=dict(function_kwargs or {}),
        query_keys=query_keys,
        softmax=softmax,
        masks=tuple(masks),
        soft_targets=soft_targets,
        dense_targets=dense_targets,
        class_weight=class_weight,
        weighted_mean=weighted_mean,
        documented_inf=documented_inf,
        tensor_args=tuple(tensor_args),
    )
    _REGISTRY[name] = spec
    return spec


def unregister(name: str) -> LossSpec:
    """Remove the entry ``name`` (e.g. one a test registered) and return it."""
    try:
        return _REGISTRY.pop(name)
    except KeyError:
        raise ValueError(
            f"unregister: unknown loss name (got {name!r}); choose one of {sorted(_REGISTRY)}"
        ) from None


def spec_for_module(cls: type) -> Optional[LossSpec]:
    """The entry of the nearest class in ``cls``'s method resolution order that is registered as a
    module (so a subclass of a registered loss finds its parent's entry unless it is registered
    itself); ``None`` if none is. Several names sharing one module (``margin_softmax`` /
    ``cosine_softmax``) describe the same inputs; the first registered is returned.

    >>> import losses
    >>> class MyArcFace(losses.MarginSoftmaxLoss):
    ...     pass
    >>> losses.spec_for_module(MyArcFace).name
    'margin_softmax'
    """
    if not isinstance(cls, type):
        raise TypeError(f"spec_for_module: expected a class (got {cls!r}); pass type(loss)")
    for klass in cls.__mro__:
        for spec in _REGISTRY.values():
            if spec.module is klass:
                return spec
    return None


def get_loss_spec(name: str) -> LossSpec:
    """The :class:`LossSpec` registered under ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"get_loss_spec: unknown loss name (got {name!r}); choose one of {sorted(_REGISTRY)}"
        ) from None


def create_loss(name: str, **kwargs: Any) -> nn.Module:
    """Build the module registered under ``name`` with constructor keywords ``kwargs``.

    >>> import losses
    >>> losses.create_loss("comp_sum", tau=0.5)
    CompSumLoss(tau=0.5, ignore_index=-100, reduction='mean')
    """
    return get_loss_spec(name).create(**kwargs)


def list_losses() -> List[LossSpec]:
    """Every registered loss's :class:`LossSpec`, sorted by name (:func:`loss_names` for the names
    alone)."""
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def loss_names() -> List[str]:
    """The registry names, sorted: what :func:`create_loss` and the recipes' ``loss`` accept.

    >>> import losses
    >>> "cross_entropy" in losses.loss_names() and "z_loss" in losses.loss_names()
    True
    """
    return sorted(_REGISTRY)


def export_modules(package: str, path: List[str], namespace: Dict[str, Any]) -> List[str]:
    """Import every public module of a loss sub-package and re-export its ``__all__``; returns the
    package's ``__all__``. A kind's ``__init__`` is just::

        __all__ = export_modules(__name__, __path__, globals())

    so a new ``losses/<kind>/<family>.py`` registers and exports its losses by being there. The
    modules are imported in name order (skipping ``_private`` ones, which the family modules import
    themselves); a name exported by two modules must be the same object (a family module may
    re-export a sibling's public function)."""
    import importlib
    import pkgutil

    exported: List[str] = []
    for info in sorted(pkgutil.iter_modules(path), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if name in namespace and name in exported:
                if namespace[name] is not obj:
                    raise ImportError(f"export_modules: two modules of {package} export different objects under "
                                      f"one name (got {name!r} from {module.__name__}); rename one of them")
                continue
            namespace[name] = obj
            exported.append(name)
    return exported


def position_unit_weights(input: Tensor, target: Tensor, *, ignore_index: int = -100, **_: Any) -> Tensor:
    """Unit weights of position-level logits losses without class weights: 1 where ``target`` is a
    valid id (or for every position of a float target), else 0; shaped ``(N, d1..dk)``."""
    if target.is_floating_point():
        return torch.ones((input.shape[0],) + tuple(input.shape[2:]), dtype=torch.float64)
    return (target != ignore_index).double()


def element_unit_weights(input: Tensor, target: Tensor, *, ignore_index: int = -100, **_: Any) -> Tensor:
    """Unit weights of element-level logits losses: 1 per element of every non-ignored position (float
    targets: every element), shaped like ``input``."""
    if target.is_floating_point():
        return torch.ones(input.shape, dtype=torch.float64)
    valid = (target != ignore_index).double().unsqueeze(1)
    return valid.expand(input.shape).clone()


def id_unit_weights(*args: Any, ignore_index: int = -100, **_: Any) -> Tensor:
    """Unit weights of losses with one unit per class id (the last positional argument, e.g.
    ``(embeddings, target)`` or ``(model, inputs, target)``): 1 where the id is not
    ``ignore_index``, else 0, shaped like the ids."""
    return (args[-1] != ignore_index).double()


# --------------------------------------------------------------------------------------
# default example inputs per kind (used by the contract tests and the docs)
# --------------------------------------------------------------------------------------

N_EXAMPLE, C_EXAMPLE, D_EXAMPLE, L_EXAMPLE = 6, 5, 8, 7


def _randn(shape, generator, dtype):
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)


def _example_logits(*, generator: Optional[torch.Generator] = None, dtype=torch.float32, case: str = "random"):
    x = _randn((N_EXAMPLE, C_EXAMPLE), generator, dtype)
    t = torch.randint(0, C_EXAMPLE, (N_EXAMPLE,), generator=generator)
    if case == "extreme":
        x = (x.double() * 1e4).to(dtype)
    elif case == "ignored":
        t = torch.full_like(t, -100)
    return (x, t), {}


def _example_embeddings(*, generator: Optional[torch.Generator] = None, dtype=torch.float32, case: str = "random"):
    x = _randn((N_EXAMPLE, D_EXAMPLE), generator, dtype)
    t = torch.arange(N_EXAMPLE) % 3  # several samples per class, as P x K samplers give
    if case == "extreme":
        x = (x.double() * 1e4).to(dtype)
    elif case == "ignored":
        t = torch.full_like(t, -100)
    return (x, t), {}


def _example_scores(*, generator: Optional[torch.Generator] = None, dtype=torch.float32, case: str = "random"):
    x = _randn((N_EXAMPLE, L_EXAMPLE), generator, dtype)
    t = torch.zeros(N_EXAMPLE, L_EXAMPLE, dtype=torch.bool)
    t[torch.arange(N_EXAMPLE), torch.arange(N_EXAMPLE) % L_EXAMPLE] = True
    t[0, (1 % L_EXAMPLE)] = True  # one row with two positives
    if case == "extreme":
        x = (x.double() * 1e4).to(dtype)
    elif case == "ignored":
        t = torch.zeros_like(t)
    return (x, t), {}


def _example_pairs(*, generator: Optional[torch.Generator] = None, dtype=torch.float32, case: str = "random"):
    pos = torch.rand(N_EXAMPLE, generator=generator, dtype=torch.float64).mul(2).sub(1).to(dtype)
    neg = torch.rand(N_EXAMPLE, L_EXAMPLE, generator=generator, dtype=torch.float64).mul(2).sub(1).to(dtype)
    kwargs: dict = {}
    if case == "ignored":
        kwargs["neg_mask"] = torch.zeros(N_EXAMPLE, L_EXAMPLE, dtype=torch.bool)
    return (pos, neg), kwargs


def _example_model(*, generator: Optional[torch.Generator] = None, dtype=torch.float32, case: str = "random"):
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, C_EXAMPLE)).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(_randn(p.shape, g, dtype) * 0.3)
    x = torch.rand(N_EXAMPLE, 12, generator=g, dtype=torch.float64).to(dtype)
    t = torch.randint(0, C_EXAMPLE, (N_EXAMPLE,), generator=g)
    if case == "extreme":
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1e3)
    elif case == "ignored":
        t = torch.full_like(t, -100)
    return (model, x, t), {}


_DEFAULT_EXAMPLES = {
    InputKind.LOGITS: _example_logits,
    InputKind.EMBEDDINGS: _example_embeddings,
    InputKind.SCORES: _example_scores,
    InputKind.PAIRS: _example_pairs,
    InputKind.MODEL: _example_model,
}


def default_example_inputs(kind: str) -> ExampleInputs:
    """The registry's example inputs for an input kind (see :data:`ExampleInputs`)."""
    if kind not in _DEFAULT_EXAMPLES:
        raise ValueError(f"default_example_inputs: kind must be one of {list(_DEFAULT_EXAMPLES)} (got {kind!r}); "
                         "see losses.InputKind")
    return _DEFAULT_EXAMPLES[kind]
