"""Smooth adversarial comp-sum loss (docs/losses/adversarial_comp_sum.md) — **experimental**.

Experimental: formula reconstructed, not yet confirmed against arXiv:2304.07288; API and defaults
may change.

A. Mao, M. Mohri, Y. Zhong, *Cross-Entropy Loss Functions: Theoretical Analysis and
Applications*, ICML 2023, arXiv:2304.07288. The abstract confirms a comp-sum term plus a related
*smooth* term trained by minimising a regularised smooth adversarial comp-sum loss; the exact
form below is this library's reconstruction (docs/losses/adversarial_comp_sum.md), frozen by the API.
"""

from __future__ import annotations

import warnings
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .._core import (
    check_ignore_index,
    auto_extra_repr,
    ExperimentalWarning,
    check_choice,
    check_finite,
    check_floating,
    check_int,
    check_integer_target,
    check_masked_logits,
    check_number,
    check_reduction,
    check_seed,
    compute_dtype,
    flatten_logits_and_target,
    no_autocast,
    reduce_loss,
    type_error,
    upcast,
    value_error,
    zero_rows,
)
from .._random import GeneratorStateMixin
from .._registry import id_unit_weights, register
from ._comp_sum_kernel import CompSumFunction
from ._targets import class_ids

__all__ = ["adversarial_comp_sum_loss", "AdversarialCompSumLoss"]

BANNER = ("Experimental: formula reconstructed, not yet confirmed against arXiv:2304.07288; "
          "API and defaults may change.")
NORMS = ("linf", "l2")


def _warn() -> None:
    warnings.warn(BANNER, ExperimentalWarning, stacklevel=3)


def _safe_l2(d: Tensor) -> Tensor:
    """Row-wise Euclidean norm whose (sub)gradient at 0 is 0 (never NaN)."""
    sq = d.square().sum(dim=1)
    zero = sq == 0  # NaN stays NaN
    return torch.where(zero, torch.zeros_like(sq), torch.sqrt(torch.where(zero, torch.ones_like(sq), sq)))


def _margin_change(h: Tensor, h_ref: Tensor, y: Tensor) -> Tensor:
    """``Delta_h(x') - Delta_h(x)`` row-wise for 2-D logits, with ``Delta(h)_k = h_y - h_k``."""
    delta = h - h_ref
    return delta.gather(1, y.unsqueeze(1)) - delta


def _check_hyper(fn: str, tau: float, rho: float, nu: float) -> Tuple[float, float, float]:
    tau = check_number(fn, "tau", tau, low=0.0)
    rho = check_number(fn, "rho", rho, low=0.0, low_inclusive=False)
    nu = check_number(fn, "nu", nu, low=0.0, hint="choose nu >= 0 (the weight of the smooth term)")
    return tau, rho, nu


def _adversarial_comp_sum(fn: str, input: Tensor, input_adv: Tensor, target: Tensor, *, tau: float, rho: float,
                          nu: float, ignore_index: int, reduction: str) -> Tensor:
    check_floating(fn, "input", input)
    check_floating(fn, "input_adv", input_adv)
    check_integer_target(fn, target)
    check_reduction(fn, reduction)
    tau, rho, nu = _check_hyper(fn, tau, rho, nu)
    if input_adv.shape != input.shape:
        raise value_error(fn, f"input_adv must have the shape of input {tuple(input.shape)}",
                          f"shape {tuple(input_adv.shape)}", "pass the model's logits on the perturbed inputs")
    x2d, y, valid, out_shape = class_ids(fn, input, target, ignore_index)
    x_adv2d, _, _ = flatten_logits_and_target(fn, input_adv, target)
    finite = check_masked_logits(fn, "input", x2d, active=valid)
    finite_adv = check_masked_logits(fn, "input_adv", x_adv2d, active=valid)
    dtype = compute_dtype(input, input_adv)
    with no_autocast(input.device.type):
        h = zero_rows(upcast(x2d, dtype), valid, verified_finite=finite)
        h_adv = zero_rows(upcast(x_adv2d, dtype), valid, verified_finite=finite_adv)
        main = CompSumFunction.apply(h if rho == 1.0 else h / rho, y, tau)
        # -inf (a mask) in either logit vector removes that class from the margin vector too
        zero = torch.zeros((), dtype=dtype, device=h.device)
        absent = (h == float("-inf")) | (h_adv == float("-inf"))
        change = _margin_change(torch.where(absent, zero, h_adv), torch.where(absent, zero, h), y)
        smooth = _safe_l2(torch.where(absent, zero, change))
        values = main + nu * smooth
        return reduce_loss(values.reshape(out_shape), valid.reshape(out_shape).to(dtype), reduction)


def adversarial_comp_sum_loss(
    input: Tensor,
    input_adv: Tensor,
    target: Tensor,
    *,
    tau: float = 1.0,
    rho: float = 1.0,
    nu: float,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Smooth adversarial comp-sum loss on clean and adversarial logits (**experimental**).

    *Experimental: formula reconstructed, not yet confirmed against arXiv:2304.07288; API and
    defaults may change.* Emits :class:`losses.ExperimentalWarning`.

    With clean logits ``h = input[i, :, ...]``, adversarial logits ``h' = input_adv[i, :, ...]``
    and class id ``y = target[i, ...]``::

        Delta(h)_k = h_y - h_k                        (the margin vector over all classes)
        L = Phi^tau(sum_{k != y} exp((h_k - h_y) / rho)) + nu * ||Delta(h') - Delta(h)||_2

    ``Phi^tau`` is the comp-sum transform of :func:`comp_sum_loss` (``tau`` its exponent), ``rho``
    divides the margins, and the smooth term (weight ``nu``) is the Euclidean norm of the margin
    change; its subgradient at 0 is 0. The smooth term is invariant to adding a constant to either
    logit vector. :class:`AdversarialCompSumLoss` finds ``input_adv`` by PGD on the smooth term.

    Args:
        input: clean logits ``(N, C)`` or ``(N, C, d1, ..., dk)``, classes on dim 1, ``C >= 2``
            (``C = 1`` raises ``ValueError``). ``-inf`` entries are masks: the class is removed
            from the comp-sum term (as in :func:`comp_sum_loss`, including a target on a masked
            class) and from the margin vector of the smooth term, with exactly zero gradient
            there. NaN, ``+inf`` and a non-ignored row without a finite logit raise
            ``ValueError`` (data checks).
        input_adv: adversarial logits, the shape of ``input``; ``-inf`` entries likewise remove
            the class from the smooth term.
        target: integer ids ``(N,)`` / ``(N, d1, ..., dk)``; float targets raise ``TypeError``.
        tau: ``tau >= 0`` (default 1: cross-entropy).
        rho: ``rho > 0`` (default 1).
        nu: ``nu >= 0``, the weight of the smooth term; required (no default).
        ignore_index: positions with this id give 0 and leave the ``"mean"`` denominator.
        reduction: ``"none"``, ``"mean"`` or ``"sum"``.

    Unit: the row (position), weight 1 (0 if ignored). Ignored rows are zeroed before the maths
    (exactly zero gradients even if they hold ``+-inf`` with validation off). Under
    ``torch.autocast`` the loss is computed in float32 (or float64).

    Paper: A. Mao, M. Mohri, Y. Zhong, *Cross-Entropy Loss Functions: Theoretical Analysis and
    Applications*, ICML 2023, arXiv:2304.07288 (no public code; the abstract leaves the smooth term
    open and this reconstruction fixes it as above).

    >>> import torch, warnings, losses
    >>> x, y = torch.tensor([[2.0, 0.0, -1.0]]), torch.tensor([0])
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     v = losses.adversarial_comp_sum_loss(x, x + 5.0, y, nu=1.0)   # shift: no margin change
    >>> bool(torch.isclose(v, losses.comp_sum_loss(x, y)))
    True
    """
    _warn()
    return _adversarial_comp_sum("adversarial_comp_sum_loss", input, input_adv, target, tau=tau, rho=rho, nu=nu,
                                 ignore_index=ignore_index, reduction=reduction)


class AdversarialCompSumLoss(GeneratorStateMixin):
    r"""Smooth adversarial comp-sum loss with its PGD inner loop (**experimental**).

    *Experimental: formula reconstructed, not yet confirmed against arXiv:2304.07288; API and
    defaults may change.* Emits :class:`losses.ExperimentalWarning` when built.

    Args:
        tau: the comp-sum exponent, ``tau >= 0`` (default 1.0).
        rho: ``rho > 0``, divides the margins (default 1.0).
        nu: ``nu >= 0``, weight of the smooth (adversarial) term; required, no default.
        epsilon: radius of the perturbation ball (default 8/255).
        steps: PGD ascent steps, ``>= 0`` (default 10).
        step_size: PGD step length (default 2/255).
        norm: ``"linf"`` (default) or ``"l2"``.
        clip: ``(low, high)`` input range the perturbation is clipped to, or ``None`` (default
            ``(0.0, 1.0)``).
        random_init_std: standard deviation of the random start (default 1e-3).
        ignore_index: target id whose rows are skipped (default -100).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        seed: ``None`` (default: the global RNG) or the seed of a private generator for the random
            start; its state is saved in ``state_dict()``.

    The maths of the loss is :func:`losses.adversarial_comp_sum_loss`. No parameters or buffers
    (the private generator travels in ``state_dict()`` as extra state).

    ``forward(model, inputs, target)`` takes the network, its floating-point ``inputs (N, ...)`` and
    class ids ``target (N,)``; it returns a scalar for ``"mean"``/``"sum"``, ``(N,)`` for ``"none"``.
    It:

    1. saves the training mode of every submodule of ``model``, calls ``model.eval()`` and computes
       ``ref = model(inputs)`` without gradients;
    2. starts from ``x' = clip(inputs + random_init_std * N(0, I))`` (noise drawn from the module's
       private generator when ``seed`` is set, else from the global RNG; the private generator's
       state is in ``state_dict()``, so a resumed run draws the starts the uninterrupted run
       would have drawn, and a state_dict saved without it still loads);
    3. takes ``steps`` ascent steps on ``sum_i ||Delta(model(x'))_i - Delta(ref)_i||_2`` over the
       non-ignored rows, with the gradient taken w.r.t. ``x'`` only (no parameter ``.grad`` is
       touched): ``"linf"`` steps ``step_size * sign(g)`` and projects onto the ``epsilon``-box
       around ``inputs``; ``"l2"`` steps ``step_size * g / ||g||`` per sample and projects onto the
       ``epsilon``-ball; then clips to ``clip`` (``None``: no clipping);
    4. restores every submodule's mode and returns
       ``adversarial_comp_sum_loss(model(inputs), model(x'.detach()), target, ...)``.

    Defaults: ``epsilon = 8/255``, ``steps = 10``, ``step_size = 2/255``, ``norm = "linf"`` follow
    the CIFAR TRADES convention, not the paper; ``nu`` has no default. ``inputs`` must be floating
    point (images, features).

    Paper: A. Mao, M. Mohri, Y. Zhong, *Cross-Entropy Loss Functions: Theoretical Analysis and
    Applications*, ICML 2023, arXiv:2304.07288.

    >>> import torch, warnings, losses
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     loss_fn = losses.AdversarialCompSumLoss(nu=1.0, steps=2, seed=0)
    >>> model = torch.nn.Linear(4, 3)
    >>> loss = loss_fn(model, torch.rand(5, 4), torch.tensor([0, 1, 2, 0, 1]))
    >>> loss.backward(); model.weight.grad.shape
    torch.Size([3, 4])
    """

    def __init__(
        self,
        *,
        tau: float = 1.0,
        rho: float = 1.0,
        nu: float,
        epsilon: float = 8 / 255,
        steps: int = 10,
        step_size: float = 2 / 255,
        norm: str = "linf",
        clip: Optional[Tuple[float, float]] = (0.0, 1.0),
        random_init_std: float = 1e-3,
        ignore_index: int = -100,
        reduction: str = "mean",
        seed: Optional[int] = None,
    ) -> None:
        super().__init__()
        fn = "AdversarialCompSumLoss"
        check_reduction(fn, reduction)
        self.tau, self.rho, self.nu = _check_hyper(fn, tau, rho, nu)
        self.epsilon = check_number(fn, "epsilon", epsilon, low=0.0)
        self.steps = check_int(fn, "steps", steps, low=0, what="an integer >= 0", hint="pass the number of PGD steps")
        self.step_size = check_number(fn, "step_size", step_size, low=0.0)
        check_choice(fn, "norm", norm, NORMS)
        self.norm = norm
        self.clip = self._check_clip(fn, clip)
        self.random_init_std = check_number(fn, "random_init_std", random_init_std, low=0.0)
        self.ignore_index = check_ignore_index(type(self).__name__, ignore_index)
        self.reduction = reduction
        self.seed = check_seed(fn, seed)
        self._generator: Optional[torch.Generator] = None
        _warn()

    @staticmethod
    def _check_clip(fn: str, clip: Optional[Sequence[float]]) -> Optional[Tuple[float, float]]:
        if clip is None:
            return None
        if not isinstance(clip, (tuple, list)) or len(clip) != 2:
            raise value_error(fn, "clip must be None or a pair (low, high)", repr(clip),
                              "pass e.g. (0.0, 1.0) for images in [0, 1]")
        low = check_number(fn, "clip[0]", clip[0])
        high = check_number(fn, "clip[1]", clip[1])
        if low > high:
            raise value_error(fn, "clip must satisfy low <= high", repr(tuple(clip)), "swap the bounds")
        return (low, high)

    # ---- private generator (in state_dict, pickle- and deepcopy-friendly) --------------------

    def _get_generator(self, device: torch.device) -> Optional[torch.Generator]:
        if self.seed is None:
            return None
        g = self._generator
        if g is None or g.device != device:
            g = torch.Generator(device=device)
            g.manual_seed(self.seed)
            self._generator = g
        return g

    # ---- forward ---------------------------------------------------------------------------

    def _clip(self, x: Tensor) -> Tensor:
        return x if self.clip is None else x.clamp(self.clip[0], self.clip[1])

    def _perturb(self, model: nn.Module, inputs: Tensor, target: Tensor) -> Tensor:
        fn = "AdversarialCompSumLoss"
        x0 = inputs.detach()
        with torch.no_grad():
            ref = model(x0)
        if not isinstance(ref, Tensor) or not ref.is_floating_point():
            raise type_error(fn, "model(inputs) must return a floating-point logits tensor", type(ref).__name__,
                             "wrap the model so that it returns logits (N, C)")
        ref2d, t, _ = flatten_logits_and_target(fn, ref, target)
        valid = t != check_ignore_index(fn, self.ignore_index)
        y = torch.where(valid, t, torch.zeros_like(t)).long()
        dtype = compute_dtype(ref)
        ref2d = upcast(ref2d, dtype)
        w = valid.to(dtype)
        x_adv = x0
        if self.random_init_std > 0:
            g = self._get_generator(x0.device)
            noise_dtype = torch.float64 if x0.dtype == torch.float64 else torch.float32
            noise = torch.randn(x0.shape, generator=g, device=x0.device, dtype=noise_dtype)
            x_adv = x0 + (self.random_init_std * noise).to(x0.dtype)
        x_adv = self._clip(x_adv).detach()
        batch_shape = (-1,) + (1,) * (x0.dim() - 1)
        for _ in range(self.steps):
            x_adv.requires_grad_(True)
            with torch.enable_grad():
                out = model(x_adv)
                out2d, _, _ = flatten_logits_and_target(fn, out, target)
                objective = (w * _safe_l2(_margin_change(upcast(out2d, dtype), ref2d, y))).sum()
                (grad,) = torch.autograd.grad(objective, [x_adv], allow_unused=True)
            x_adv = x_adv.detach()
            if grad is None:
                grad = torch.zeros_like(x_adv)
            if self.norm == "linf":
                x_adv = x_adv + self.step_size * grad.sign()
                x_adv = torch.minimum(torch.maximum(x_adv, x0 - self.epsilon), x0 + self.epsilon)
            else:
                gn = torch.linalg.vector_norm(grad.flatten(1).to(dtype), dim=1).clamp_min(1e-12)
                x_adv = x_adv + (self.step_size * grad.to(dtype) / gn.view(batch_shape)).to(x_adv.dtype)
                delta = (x_adv - x0).to(dtype)
                dn = torch.linalg.vector_norm(delta.flatten(1), dim=1)
                scale = torch.where(dn > self.epsilon, self.epsilon / dn.clamp_min(1e-12), torch.ones_like(dn))
                x_adv = x0 + (delta * scale.view(batch_shape)).to(x0.dtype)
            x_adv = self._clip(x_adv).detach()
        return x_adv

    def forward(self, model: nn.Module, inputs: Tensor, target: Tensor) -> Tensor:
        """The loss of ``model`` on ``inputs`` and their PGD perturbation (see the class docs).

        Args:
            model: the network; ``model(inputs)`` must return logits ``(N, C)``.
            inputs: floating-point inputs ``(N, ...)``.
            target: integer class ids ``(N,)``.

        Returns:
            A scalar (``"mean"``, ``"sum"``) or the per-row losses ``(N,)`` (``"none"``).

        The random start is drawn from the module's private generator when it was built with a
        ``seed``, else from the global RNG (seed it with ``torch.manual_seed`` to reproduce a call).
        """
        fn = "AdversarialCompSumLoss"
        if not isinstance(model, nn.Module):
            raise type_error(fn, "model must be a torch.nn.Module", type(model).__name__,
                             "pass the network whose logits are trained")
        check_floating(fn, "inputs", inputs)
        check_integer_target(fn, target)
        check_finite(fn, "inputs", inputs)
        modes = [(m, m.training) for m in model.modules()]
        try:
            model.eval()
            x_adv = self._perturb(model, inputs, target)
        finally:
            for m, mode in modes:
                m.training = mode
        return _adversarial_comp_sum("AdversarialCompSumLoss", model(inputs), model(x_adv), target, tau=self.tau,
                                     rho=self.rho, nu=self.nu, ignore_index=self.ignore_index,
                                     reduction=self.reduction)

    extra_repr = auto_extra_repr


register(
    "adversarial_comp_sum",
    function=adversarial_comp_sum_loss,
    module=AdversarialCompSumLoss,
    inputs="model",
    unit="row",
    unit_weights=id_unit_weights,
    arxiv="2304.07288",
    paper="A. Mao, M. Mohri, Y. Zhong, Cross-Entropy Loss Functions: Theoretical Analysis and Applications, "
          "ICML 2023 (smooth adversarial comp-sum; experimental reconstruction)",
    experimental=True,
    example_kwargs={"nu": 1.0},
    softmax=True,
    masks=("neg_inf",),  # the functional form: -inf in both logits tensors removes the class
)
