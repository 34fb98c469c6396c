"""White-box robustness evaluation: Auto-PGD, PGD with restarts, the worst case over an ensemble
of attacks, and cheap gradient-masking checks.

Written from the published algorithms (depends on torch only):

* ``apgd`` -- Auto-PGD of Croce & Hein, "Reliable evaluation of adversarial robustness with an
  ensemble of diverse parameter-free attacks", ICML 2020, with the cross-entropy or the DLR loss.
* ``pgd`` -- projected gradient ascent (Madry et al., ICLR 2018) with random restarts and a
  cross-entropy or Carlini-Wagner style margin loss.
* ``robust_accuracy`` -- an example is robust only if no listed attack breaks it; later attacks run
  only on the examples still robust (as AutoAttack does).
* ``masking_checks`` -- robust accuracy must not increase with the radius, an unbounded attack
  must reach ~0%, random noise must not beat the gradient attack, input gradients must not vanish.

Only the l-inf threat model is implemented. Inputs are expected in the ``clip`` range (default
``[0, 1]``). The model must return logits ``(batch, classes)``; it is run in eval mode with its
parameters' ``requires_grad`` off during the attack, and both flags are restored afterwards. Only
the input gradient is computed (``torch.autograd.grad``), no parameter ``.grad`` is touched.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "RobustResult",
    "apgd",
    "apgd_checkpoints",
    "dlr_loss",
    "margin_loss",
    "masking_checks",
    "pgd",
    "robust_accuracy",
    "zero_gradient",
]


# -- helpers ------------------------------------------------------------------------------------
@contextlib.contextmanager
def _attack_mode(model):
    """Eval mode, parameters frozen, gradients enabled (also inside inference mode); restores the
    model's train/eval flags (per submodule) and its parameters' ``requires_grad`` on exit."""
    modules = list(model.modules()) if isinstance(model, torch.nn.Module) else []
    flags = [m.training for m in modules]
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    grads = [p.requires_grad for p in params]
    try:
        if modules:
            model.eval()
        for p in params:
            p.requires_grad_(False)
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        for m, f in zip(modules, flags):
            m.training = f
        for p, g in zip(params, grads):
            p.requires_grad_(g)


def _check(name: str, x: Tensor, y: Tensor, eps: float, clip) -> None:
    if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{name}: eps must be a finite radius >= 0 (got {eps!r}); e.g. 8/255 or 0.3")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{name}: inputs and labels differ in batch size ({x.shape[0]} vs {y.shape[0]})")
    if clip is not None and x.numel() and (x.min() < clip[0] - 1e-6 or x.max() > clip[1] + 1e-6):
        raise ValueError(f"{name}: inputs must lie in the clip range {tuple(clip)} (got [{x.min().item():g}, "
                         f"{x.max().item():g}]); scale them or pass clip=None")


def _project(z: Tensor, x0: Tensor, eps: float, clip) -> Tensor:
    z = torch.max(torch.min(z, x0 + eps), x0 - eps)
    return z.clamp(*clip) if clip is not None else z


def _uniform_start(x0: Tensor, eps: float, gen: torch.Generator, clip) -> Tensor:
    if eps == 0:
        return x0.clone()
    noise = (torch.rand(x0.shape, generator=gen, device=x0.device, dtype=x0.dtype) * 2 - 1) * eps
    return _project(x0 + noise, x0, eps, clip)


def _generator(x: Tensor, seed: int) -> torch.Generator:
    return torch.Generator(device=x.device).manual_seed(int(seed))


def dlr_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Difference of Logits Ratio loss (Croce & Hein, 2020), per example:
    ``-(z_y - max_{i != y} z_i) / (z_pi1 - z_pi3 + 1e-12)`` with ``z_pi1 >= z_pi2 >= ...`` the sorted
    logits. Invariant to shifting and rescaling the logits. Needs at least 3 classes."""
    if logits.dim() != 2 or logits.shape[1] < 3:
        raise ValueError(f"dlr_loss needs logits (batch, classes) with at least 3 classes (got shape "
                         f"{tuple(logits.shape)}); use loss='ce' for binary problems")
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    srt = z.sort(dim=1, descending=True).values
    z_y = z.gather(1, y.view(-1, 1)).squeeze(1)
    other = z.scatter(1, y.view(-1, 1), float("-inf")).max(dim=1).values
    return -(z_y - other) / (srt[:, 0] - srt[:, 2] + 1e-12)


def margin_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Carlini-Wagner style margin, per example: ``max_{i != y} z_i - z_y`` (positive when fooled)."""
    z_y = logits.gather(1, y.view(-1, 1)).squeeze(1)
    other = logits.scatter(1, y.view(-1, 1), float("-inf")).max(dim=1).values
    return other - z_y


_LOSSES = {"ce": lambda z, y: F.cross_entropy(z.float(), y, reduction="none"), "dlr": dlr_loss,
           "margin": margin_loss}


def _label(predict, out: Tensor) -> Tensor:
    """Predicted class of a model output: ``predict(out).argmax(1)`` (``out.argmax(1)`` by default)."""
    return (out if predict is None else predict(out)).argmax(1)


def _loss_grad(model, x: Tensor, y: Tensor, loss_fn) -> tuple[Tensor, Tensor, Tensor]:
    """Per-example loss, input gradient and logits at ``x``."""
    x = x.detach().requires_grad_(True)
    logits = model(x)
    loss = loss_fn(logits, y)
    (grad,) = torch.autograd.grad(loss.sum(), x)
    return loss.detach(), grad.detach(), logits.detach()


def apgd_checkpoints(n_iter: int) -> list:
    """APGD's checkpoints ``w_j = ceil(p_j * n_iter)`` with ``p_0 = 0, p_1 = 0.22,
    p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06)``."""
    p = [0.0, 0.22]
    while p[-1] < 1:
        p.append(p[-1] + max(p[-1] - p[-2] - 0.03, 0.06))
    w = sorted({math.ceil(round(q * n_iter, 9)) for q in p if q <= 1})  # round: 0.57 * 100 is 57.000...01
    return [v for v in w if v <= n_iter]


# -- Auto-PGD ------------------------------------------------------------------------------------
def _apgd_once(model, x0, y, eps, loss_fn, n_iter, rho, alpha, gen, clip, predict=None):
    n = x0.shape[0]
    view = (-1,) + (1,) * (x0.dim() - 1)
    x = _uniform_start(x0, eps, gen, clip)
    loss, grad, logits = _loss_grad(model, x, y, loss_fn)
    fooled = _label(predict, logits) != y
    x_adv = torch.where(fooled.view(view), x, x0)
    best_x, best_loss, best_grad = x.clone(), loss.clone(), grad.clone()
    x_prev = x.clone()
    eta = torch.full((n,), 2.0 * eps, device=x0.device, dtype=x0.dtype)
    checkpoints = set(apgd_checkpoints(n_iter)[1:])
    last_w, count = 0, torch.zeros(n, device=x0.device)
    best_at_ckpt, reduced_last = best_loss.clone(), torch.zeros(n, dtype=torch.bool, device=x0.device)
    for k in range(n_iter - 1):  # n_iter gradient evaluations in all
        z = _project(x + eta.view(view) * grad.sign(), x0, eps, clip)
        if k == 0:
            x_new = z
        else:
            x_new = _project(x + alpha * (z - x) + (1 - alpha) * (x - x_prev), x0, eps, clip)
        x_prev, x = x, x_new
        new_loss, grad, logits = _loss_grad(model, x, y, loss_fn)
        now = (_label(predict, logits) != y) & ~fooled
        x_adv = torch.where(now.view(view), x, x_adv)
        fooled |= now
        count += (new_loss > loss).float()
        loss = new_loss
        better = loss > best_loss
        best_x = torch.where(better.view(view), x, best_x)
        best_grad = torch.where(better.view(view), grad, best_grad)
        best_loss = torch.where(better, loss, best_loss)
        w = k + 1
        if w in checkpoints:
            cond1 = count < rho * (w - last_w)
            cond2 = ~reduced_last & (best_loss <= best_at_ckpt)
            reduce = cond1 | cond2
            eta = torch.where(reduce, eta / 2, eta)
            x = torch.where(reduce.view(view), best_x, x)
            x_prev = torch.where(reduce.view(view), best_x, x_prev)
            grad = torch.where(reduce.view(view), best_grad, grad)
            loss = torch.where(reduce, best_loss, loss)
            reduced_last, best_at_ckpt = reduce, best_loss.clone()
            count.zero_()
            last_w = w
    x_adv = torch.where(fooled.view(view), x_adv, best_x)
    return x_adv, fooled


def apgd(model: Callable[[Tensor], Tensor], x: Tensor, y: Tensor, *, eps: float, norm: str = "Linf",
         loss: str = "ce", n_iter: int = 100, restarts: int = 1, rho: float = 0.75, seed: int = 0,
         clip: tuple[float, float] | None = (0.0, 1.0), alpha: float = 0.75,
         predict: Callable[[Tensor], Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """Auto-PGD (Croce & Hein, ICML 2020) in the l-inf ball of radius ``eps``.

    Algorithm: random start uniform in the ball; ``n_iter`` gradient evaluations of
    ``z = P(x_k + eta * sign(grad))``, ``x_{k+1} = P(x_k + alpha (z - x_k) + (1 - alpha)(x_k - x_{k-1}))``
    (the first step without momentum), ``P`` the projection onto the ball and the ``clip`` box;
    step ``eta`` starts at ``2 * eps``; at the checkpoints ``w_j = ceil(p_j n_iter)``,
    ``p_0 = 0, p_1 = 0.22, p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06)``, per example the step
    is halved and the iterate restarted from the best (highest-loss) point when (1) the loss
    increased in fewer than ``rho`` of the steps since the last checkpoint, or (2) the step was not
    halved at the last checkpoint and the best loss has not improved since. An example is broken
    as soon as any iterate is misclassified, and that point is kept.

    Args:
        loss: ``"ce"`` (cross-entropy) or ``"dlr"`` (Difference of Logits Ratio, >= 3 classes).
        n_iter: gradient evaluations per restart (default 100); restarts: random restarts, run only
            on the examples not yet broken (default 1); rho: default 0.75; alpha: momentum, 0.75.
        seed: seeds a ``torch.Generator`` on the inputs' device (deterministic for a seed).
        clip: the valid input range (default ``(0, 1)``), ``None`` for no box.
        predict: maps the model's output to class scores for deciding "misclassified"
            (default: the output's argmax); the loss is always taken on the output as logits.

    Returns:
        ``(x_adv, fooled)``: adversarial inputs (for broken examples the misclassified point, for
        the others the highest-loss point), within the ball and ``clip``; a bool tensor, True where
        some iterate was misclassified.
    """
    if norm.lower() != "linf":
        raise ValueError(f"apgd: only norm='Linf' is implemented (got {norm!r})")
    if loss not in ("ce", "dlr"):
        raise ValueError(f"apgd: loss must be 'ce' or 'dlr' (got {loss!r})")
    if n_iter < 1 or restarts < 1:
        raise ValueError(f"apgd: n_iter and restarts must be >= 1 (got {n_iter!r}, {restarts!r})")
    _check("apgd", x, y, eps, clip)
    gen = _generator(x, seed)
    with _attack_mode(model):
        x0, y, x_adv, fooled, best_loss = _restart_state(x, y)
        if loss == "dlr":
            with torch.no_grad():
                dlr_loss(model(x0[:1]), y[:1])  # raises for < 3 classes before attacking
        for idx in _unbroken(fooled, restarts):
            xa, fo = _apgd_once(model, x0[idx], y[idx], eps, _LOSSES[loss], n_iter, rho, alpha, gen, clip, predict)
            with torch.no_grad():
                la = _LOSSES[loss](model(xa), y[idx]).float()
            keep = fo | (la > best_loss[idx])
            x_adv[idx[keep]] = xa[keep]
            best_loss[idx[keep]] = la[keep]
            fooled[idx[fo]] = True
    return x_adv.detach(), fooled


def _restart_state(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(x0, y, x_adv, fooled, best_loss)`` before the first restart: detached copies of the inputs,
    the adversarial points (the inputs), nobody fooled, every example's best loss ``-inf``."""
    x0, y = x.detach().clone(), y.detach().clone().long()
    fooled = torch.zeros(x0.shape[0], dtype=torch.bool, device=x0.device)
    return x0, y, x0.clone(), fooled, torch.full((x0.shape[0],), -float("inf"), device=x0.device)


def _unbroken(fooled: Tensor, restarts: int):
    """For each of ``restarts`` restarts, the indices of the examples not fooled yet (read when the
    restart begins; ``fooled`` is updated in place by the caller); stops early once all are."""
    for _ in range(restarts):
        idx = (~fooled).nonzero().squeeze(1)
        if idx.numel() == 0:
            return
        yield idx


# -- PGD -----------------------------------------------------------------------------------------
def pgd(model: Callable[[Tensor], Tensor], x: Tensor, y: Tensor, *, eps: float, step: float | None = None,
        n_iter: int = 100, restarts: int = 10, loss: str = "ce", seed: int = 0,
        clip: tuple[float, float] | None = (0.0, 1.0),
        predict: Callable[[Tensor], Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """PGD with random restarts (Madry et al., ICLR 2018), l-inf: each restart starts uniformly in
    the ball and takes ``n_iter`` steps ``x <- P(x + step * sign(grad loss))``; an example is broken
    as soon as any iterate of any restart is misclassified (restarts run only on unbroken examples).

    Args:
        step: step size; ``None`` gives ``2.5 * eps / n_iter`` (Madry et al.).
        n_iter: steps per restart (default 100); restarts: default 10.
        loss: ``"ce"`` (cross-entropy) or ``"margin"`` (``max_{i != y} z_i - z_y``, Carlini-Wagner style).
        seed, clip, predict: as in ``apgd``.

    Returns ``(x_adv, fooled)`` as ``apgd``.
    """
    if loss not in ("ce", "margin"):
        raise ValueError(f"pgd: loss must be 'ce' or 'margin' (got {loss!r})")
    if n_iter < 0 or restarts < 1:
        raise ValueError(f"pgd: n_iter must be >= 0 and restarts >= 1 (got {n_iter!r}, {restarts!r})")
    _check("pgd", x, y, eps, clip)
    step = 2.5 * eps / max(n_iter, 1) if step is None else float(step)
    view = (-1,) + (1,) * (x.dim() - 1)
    gen = _generator(x, seed)
    fn = _LOSSES[loss]
    with _attack_mode(model):
        x0, y, x_adv, fooled, best_loss = _restart_state(x, y)
        for idx in _unbroken(fooled, restarts):
            xs, ys = x0[idx], y[idx]
            xi = _uniform_start(xs, eps, gen, clip)
            fo = torch.zeros(idx.numel(), dtype=torch.bool, device=x0.device)
            xa = xi.clone()
            for k in range(n_iter + 1):
                ls, grad, logits = _loss_grad(model, xi, ys, fn)
                now = (_label(predict, logits) != ys) & ~fo
                xa = torch.where(now.view(view), xi, xa)
                fo |= now
                better = ~fo & (ls.float() > best_loss[idx])
                x_adv[idx[better]] = xi[better]
                best_loss[idx[better]] = ls.float()[better]
                if k < n_iter:
                    xi = _project(xi + step * grad.sign(), xs, eps, clip)
            x_adv[idx[fo]] = xa[fo]
            fooled[idx[fo]] = True
    return x_adv.detach(), fooled


# -- ensemble ------------------------------------------------------------------------------------
@dataclass
class RobustResult:
    """``robust``: bool per example (input order), True when correctly classified and not broken by
    any attack; ``robust_accuracy`` / ``clean_accuracy``: fractions; ``by_attack``: robust accuracy
    after each attack in turn (cumulative worst case); ``x_adv``: the adversarial inputs (the
    breaking point where broken, else the last attack's point)."""
    robust: Tensor
    robust_accuracy: float
    clean_accuracy: float
    by_attack: dict[str, float] = field(default_factory=dict)
    x_adv: Tensor | None = None


def _run_attack(name, model, x, y, eps, n_iter, restarts, seed, clip, predict):
    if name in ("apgd-ce", "apgd-dlr"):
        return apgd(model, x, y, eps=eps, loss=name[5:], n_iter=n_iter, restarts=restarts, seed=seed, clip=clip,
                    predict=predict)
    if name in ("pgd", "pgd-ce", "pgd-margin"):
        return pgd(model, x, y, eps=eps, n_iter=n_iter, restarts=restarts, seed=seed, clip=clip,
                   loss="margin" if name == "pgd-margin" else "ce", predict=predict)
    if name == "noise":  # uniform noise in the ball: a baseline, not an attack
        gen = _generator(x, seed)
        with _attack_mode(model), torch.no_grad():
            x0 = x.detach().clone()
            xa, fooled = x0.clone(), torch.zeros(x0.shape[0], dtype=torch.bool, device=x0.device)
            for _ in range(max(restarts, 1)):
                xn = _uniform_start(x0, eps, gen, clip)
                now = (_label(predict, model(xn)) != y) & ~fooled
                xa[now] = xn[now]
                fooled |= now
        return xa, fooled
    raise ValueError(f"robust_accuracy: unknown attack {name!r}; choose from 'apgd-ce', 'apgd-dlr', "
                     "'pgd', 'pgd-margin', 'noise'")


def robust_accuracy(model: Callable[[Tensor], Tensor], x: Tensor, y: Tensor, *, eps: float,
                    attacks: Sequence[str] = ("apgd-ce", "apgd-dlr"), n_iter: int = 100, restarts: int = 1,
                    batch_size: int = 500, seed: int = 0, clip: tuple[float, float] | None = (0.0, 1.0),
                    predict: Callable[[Tensor], Tensor] | None = None) -> RobustResult:
    """Worst-case robust accuracy over an ensemble of attacks (the AutoAttack protocol of Croce &
    Hein, 2020, default ensemble APGD-CE then APGD-DLR): an example counts as robust only if it is
    classified correctly and no attack breaks it; each attack runs only on the examples still
    robust. Attacks: ``"apgd-ce"``, ``"apgd-dlr"``, ``"pgd"`` (``"pgd-ce"``), ``"pgd-margin"``,
    ``"noise"`` (uniform noise in the ball, ``restarts`` draws). ``n_iter`` (default 100) and
    ``restarts`` (default 1) go to each attack; inputs are processed in chunks of ``batch_size``
    (default 500), chunk ``b`` seeded with ``seed + b`` (deterministic for a seed). ``predict`` maps
    the model's output to class scores (default: the output itself), as in ``apgd``.

    Returns a ``RobustResult`` (per-example ``robust`` flags in input order, accuracies)."""
    if not attacks:
        raise ValueError("robust_accuracy: attacks must name at least one attack, e.g. ('apgd-ce', 'apgd-dlr')")
    _check("robust_accuracy", x, y, eps, clip)
    with torch.inference_mode(False):
        x, y = x.detach().clone(), y.detach().clone().long()
        n = x.shape[0]
        robust = torch.zeros(n, dtype=torch.bool, device=x.device)
        x_adv = x.clone()
    with _attack_mode(model), torch.no_grad():
        for s in range(0, n, batch_size):
            robust[s:s + batch_size] = _label(predict, model(x[s:s + batch_size])) == y[s:s + batch_size]
    clean = robust.float().mean().item() if n else float("nan")
    by_attack = {}
    for name in attacks:
        for b, s in enumerate(range(0, n, batch_size)):
            sl = torch.arange(s, min(s + batch_size, n), device=x.device)
            idx = sl[robust[sl]]
            if idx.numel() == 0:
                continue
            xa, fooled = _run_attack(name, model, x[idx], y[idx], eps, n_iter, restarts, seed + b, clip, predict)
            x_adv[idx] = xa
            robust[idx[fooled]] = False
        by_attack[name] = robust.float().mean().item() if n else float("nan")
    return RobustResult(robust=robust, robust_accuracy=by_attack[attacks[-1]], clean_accuracy=clean,
                        by_attack=by_attack, x_adv=x_adv)


def zero_gradient(model: Callable[[Tensor], Tensor], x: Tensor, y: Tensor) -> Tensor:
    """Per example, True where the cross-entropy's gradient with respect to the input is exactly 0
    (the model in eval mode, its parameters frozen): a gradient attack cannot move such an example,
    whatever its robustness (a quantised, saturated or thresholded input path). The fraction of
    such examples is one of :func:`masking_checks`' numbers."""
    with _attack_mode(model):
        _, grad, _ = _loss_grad(model, x.detach().clone(), y.detach().clone().long(), _LOSSES["ce"])
    return grad.flatten(1).abs().amax(1) == 0


def masking_checks(model: Callable[[Tensor], Tensor], x: Tensor, y: Tensor, eps: float, *,
                   attacks: Sequence[str] = ("apgd-ce", "apgd-dlr"), n_iter: int = 50, large_eps: float = 1.0,
                   unbounded_tol: float = 0.02, tol: float = 0.0, seed: int = 0,
                   clip: tuple[float, float] | None = (0.0, 1.0),
                   predict: Callable[[Tensor], Tensor] | None = None) -> dict[str, object]:
    """Cheap sanity checks that flag gradient masking (Athalye et al., 2018; Carlini et al., 2019).

    Numbers: ``robust_eps`` / ``robust_2eps`` (the ensemble at ``eps`` and ``2 eps``),
    ``robust_unbounded`` (APGD-CE at ``large_eps``, default 1.0: the whole [0, 1] box),
    ``robust_noise`` (20 uniform-noise draws in the ``eps`` ball), ``pgd10`` (PGD-10, CE, one
    restart, step ``eps / 4``), ``zero_grad_fraction`` (examples whose CE input gradient is exactly 0).
    Booleans (True = passed): ``monotone`` (``robust_2eps <= robust_eps + tol``), ``unbounded_zero``
    (``robust_unbounded <= unbounded_tol``), ``noise_weaker`` (noise breaks no more than the
    attack), ``apgd_not_weaker`` (``robust_eps <= pgd10 + tol``), ``gradients_alive``
    (``zero_grad_fraction`` below 0.5); ``ok`` is their conjunction.
    """
    ra = lambda e, atk, **kw: robust_accuracy(model, x, y, eps=e, attacks=atk, seed=seed, clip=clip, predict=predict, **kw)
    r1 = ra(eps, attacks, n_iter=n_iter)
    r2 = ra(2 * eps, attacks, n_iter=n_iter)
    ru = ra(large_eps, ("apgd-ce",), n_iter=n_iter)
    rn = ra(eps, ("noise",), restarts=20)
    with _attack_mode(model):
        x0, yy = x.detach().clone(), y.detach().clone().long()
        p10 = pgd(model, x0, yy, eps=eps, step=eps / 4, n_iter=10, restarts=1, seed=seed, clip=clip, predict=predict)[1]
        clean_ok = _label(predict, model(x0)) == yy
    pgd10 = (clean_ok & ~p10).float().mean().item()
    zero = zero_gradient(model, x0, yy).float().mean().item()
    out = {"eps": eps, "clean": r1.clean_accuracy, "robust_eps": r1.robust_accuracy, "robust_2eps": r2.robust_accuracy,
               "robust_unbounded": ru.robust_accuracy, "robust_noise": rn.robust_accuracy, "pgd10": pgd10,
               "zero_grad_fraction": zero}
    out["monotone"] = r2.robust_accuracy <= r1.robust_accuracy + tol
    out["unbounded_zero"] = ru.robust_accuracy <= unbounded_tol
    out["noise_weaker"] = rn.robust_accuracy >= r1.robust_accuracy - tol
    out["apgd_not_weaker"] = r1.robust_accuracy <= pgd10 + tol
    out["gradients_alive"] = zero < 0.5
    out["ok"] = all(out[k] for k in ("monotone", "unbounded_zero", "noise_weaker", "apgd_not_weaker",
                                      "gradients_alive"))
    return out
