"""The loss registry: stable names -> function, module and the metadata the Lightning layer and
the contract tests route by (``docs/conventions.md``, Registry).

Each family module registers its entries at import time with :func:`register`. Users call
:func:`create_loss` and :func:`list_losses`::

    >>> import losses
    >>> loss = losses.create_loss("cross_entropy", label_smoothing=0.1)
    >>> spec = losses.get_loss_spec("cross_entropy")
    >>> spec.inputs
    ('input', 'target')
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

__all__ = ["LossSpec", "register", "create_loss", "list_losses", "get_loss_spec", "INPUT_KINDS"]

#: What ``forward`` takes, by kind (the Lightning layer routes by it).
INPUT_KINDS: Dict[str, Tuple[str, ...]] = {
    "I": ("input", "target"),
    "E": ("embeddings", "target"),
    "S": ("scores", "target"),
    "P": ("pos_scores", "neg_scores"),
    "M": ("model", "inputs", "target"),
}

UNITS = ("position", "element", "row", "pair", "class", "batch")

#: ``example_inputs(generator=..., dtype=..., case=...) -> (args, kwargs)`` builds inputs for
#: ``module(*args)``; ``case`` is ``"random"``, ``"extreme"`` (x1e4 logits, -inf masks where the
#: loss allows them) or ``"ignored"`` (every unit ignored / inactive).
ExampleInputs = Callable[..., Tuple[tuple, dict]]


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """Metadata of one registered loss.

    Attributes:
        name: stable registry identifier used by configs.
        function: the pure functional form.
        module: the ``nn.Module`` class (``create_loss`` instantiates it).
        inputs: names of ``forward``'s positional arguments (see :data:`INPUT_KINDS`).
        owns_head: the module owns class weights and exposes ``.logits(embeddings)``.
        auxiliary: meant to be added (with a weight) to a main loss, e.g. OPL.
        unit: what one loss value is computed for (``position``, ``element``, ``row``, ``pair``,
            ``class`` or ``batch``).
        unit_weights: ``unit_weights(*args, **kwargs)`` with the *module's* forward arguments
            and constructor keywords; returns the tensor of unit weights ``w`` shaped like the
            ``reduction="none"`` output, so that ``sum == (w * none).sum()`` and
            ``mean == sum / w.sum()``. ``None`` for batch-level losses.
        arxiv: arXiv id of the paper (``""`` for classical baselines without one).
        paper: short citation.
        experimental: emits :class:`losses.ExperimentalWarning`.
        example_kwargs: constructor keywords enough to build the module.
        example_inputs: builds example ``forward`` inputs (see :data:`ExampleInputs`).
        baseline_of: registry names this loss is the baseline for (documentation only).
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

    @property
    def kind(self) -> str:
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


def register(
    name: str,
    *,
    function: Callable[..., Any],
    module: type,
    inputs: str,
    unit: str,
    unit_weights: Optional[Callable[..., Tensor]],
    arxiv: str,
    paper: str,
    owns_head: bool = False,
    auxiliary: bool = False,
    experimental: bool = False,
    example_kwargs: Optional[Mapping[str, Any]] = None,
    example_inputs: Optional[ExampleInputs] = None,
    function_kwargs: Optional[Mapping[str, Any]] = None,
) -> LossSpec:
    """Register a loss under a stable ``name`` (``inputs`` is a key of :data:`INPUT_KINDS`).

    ``function_kwargs`` are extra keywords that make ``function`` compute what the registered
    module computes (e.g. the ``cosine_softmax`` preset's margin).
    """
    if name in _REGISTRY:
        raise ValueError(f"register: loss name already registered (got {name!r}); pick a new name")
    if inputs not in INPUT_KINDS:
        raise ValueError(f"register: inputs must be one of {sorted(INPUT_KINDS)} (got {inputs!r}); see INPUT_KINDS")
    if unit not in UNITS:
        raise ValueError(f"register: unit must be one of {UNITS} (got {unit!r}); see docs/conventions.md")
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
    )
    _REGISTRY[name] = spec
    return spec


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
    """Every registered loss, sorted by name."""
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


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
    "I": _example_logits,
    "E": _example_embeddings,
    "S": _example_scores,
    "P": _example_pairs,
    "M": _example_model,
}


def default_example_inputs(kind: str) -> ExampleInputs:
    return _DEFAULT_EXAMPLES[kind]
