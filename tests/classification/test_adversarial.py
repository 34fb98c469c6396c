"""Smooth adversarial comp-sum loss (docs/losses/adversarial_comp_sum.md, experimental): loop oracle, gradcheck, the test
facts, the PGD inner loop against an independent re-implementation, model mode / parameters /
.grad untouched, determinism, errors and the ExperimentalWarning."""

from __future__ import annotations

import copy
import inspect
import math
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import losses
from tests._helpers import LOGIT_SHAPES, REDUCTIONS, assert_gradcheck, logits_at, loop_reduce, position_shape
from tests._helpers import positions, value_and_grads
from tests._helpers.rows import MODEL, entry

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "adversarial_comp_sum": entry("adversarial_comp_sum_loss", "AdversarialCompSumLoss", MODEL, unit="row",
          example={"nu": 1.0}),
}
EXPECTED_EXPERIMENTAL = ("adversarial_comp_sum",)  # docs/losses/adversarial_comp_sum.md marks it experimental

pytestmark = pytest.mark.usefixtures("no_experimental_warning")

BANNER = ("Experimental: formula reconstructed, not yet confirmed against arXiv:2304.07288; "
          "API and defaults may change.")


# --------------------------------------------------------------------------------------
# float64 loop oracle of the reconstructed formula
# --------------------------------------------------------------------------------------


def adv_loop(h, h_adv, t, *, tau=1.0, rho=1.0, nu, ignore_index=-100, reduction="mean"):
    C = h.shape[1]
    vals, ws = [], []
    for pos in positions(h):
        y = int(t[pos])
        if y == ignore_index:
            vals.append(torch.zeros((), dtype=torch.float64))
            ws.append(0.0)
            continue
        a = logits_at(h, pos)
        b = logits_at(h_adv, pos)
        u = sum((torch.exp((a[k] - a[y]) / rho) for k in range(C) if k != y), torch.zeros((), dtype=torch.float64))
        main = torch.log(1 + u) if tau == 1.0 else ((1 + u) ** (1 - tau) - 1) / (1 - tau)
        # margin vectors Delta_k = h_y - h_k over all classes, clean and adversarial
        sq = sum(((b[y] - b[k]) - (a[y] - a[k])) ** 2 for k in range(C))
        vals.append(main + nu * torch.sqrt(sq))
        ws.append(1.0)
    return loop_reduce(vals, ws, position_shape(h), reduction)


def _logits(shape, seed, *, ignore_some=True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(shape, generator=g, dtype=torch.float64) * 1.5
    h_adv = h + 0.5 * torch.randn(shape, generator=g, dtype=torch.float64)
    t = torch.randint(0, shape[1], (shape[0],) + tuple(shape[2:]), generator=g)
    if ignore_some:
        t.view(-1)[1] = -100
    return h, h_adv, t


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", LOGIT_SHAPES)
@pytest.mark.parametrize("tau,rho,nu", [(1.0, 1.0, 0.7), (0.5, 2.0, 1.3), (2.0, 0.5, 0.0), (0.0, 1.0, 3.0)])
def test_function_matches_loop_oracle(shape, reduction, tau, rho, nu):
    h, h_adv, t = _logits(shape, seed=1)
    w = None
    if reduction == "none":
        w = torch.rand((shape[0],) + shape[2:], generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    kw = dict(tau=tau, rho=rho, nu=nu, reduction=reduction)
    out, gh, ga = value_and_grads(losses.adversarial_comp_sum_loss, (h, h_adv), t, weights=w, **kw)
    ref, rh, ra = value_and_grads(adv_loop, (h, h_adv), t, weights=w, **kw)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gh, rh, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ga, ra, rtol=1e-10, atol=1e-12)


def test_function_fp32_and_half():
    h, h_adv, t = _logits((6, 5), seed=2)
    out = losses.adversarial_comp_sum_loss(h.float(), h_adv.float(), t, tau=0.5, nu=1.0)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), adv_loop(h.float().double(), h_adv.float().double(), t, tau=0.5, nu=1.0),
                               rtol=1e-5, atol=1e-6)
    hh = h.half().requires_grad_(True)
    out = losses.adversarial_comp_sum_loss(hh, h_adv.half(), t, nu=1.0)
    assert out.dtype == torch.float32
    out.backward()
    assert hh.grad.dtype == torch.float16
    assert losses.adversarial_comp_sum_loss(h.float(), h_adv, t, nu=1.0).dtype == torch.float64


@pytest.mark.parametrize("shape", [(1, 3), (3, 5)])
@pytest.mark.parametrize("tau,rho,nu", [(1.0, 1.0, 1.0), (0.3, 0.7, 2.0), (2.0, 1.5, 0.5)])
def test_gradcheck(shape, tau, rho, nu):
    h, h_adv, t = _logits(shape, seed=4, ignore_some=False)
    h.requires_grad_(True)
    h_adv.requires_grad_(True)
    assert_gradcheck(
        lambda a, b: losses.adversarial_comp_sum_loss(a, b, t, tau=tau, rho=rho, nu=nu, reduction="none"), h, h_adv)


# --------------------------------------------------------------------------------------
# test facts (docs/losses/adversarial_comp_sum.md) on the functional form
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [0.0, 0.5, 1.0, 2.0])
def test_nu0_rho1_equals_comp_sum(tau):
    h, h_adv, t = _logits((5, 6, 2), seed=5)
    for reduction in ("none", "mean", "sum"):
        out, gh, ga = value_and_grads(losses.adversarial_comp_sum_loss, (h, h_adv), t, tau=tau, rho=1.0,
                                      nu=0.0, reduction=reduction)
        hc = h.clone().requires_grad_(True)
        ref = losses.comp_sum_loss(hc, t, tau=tau, reduction=reduction)
        (rh,) = torch.autograd.grad(ref.sum(), [hc])
        assert torch.equal(out, ref.detach())
        torch.testing.assert_close(gh, rh, rtol=0, atol=0)
        assert torch.equal(ga, torch.zeros_like(ga))


def test_rho_divides_the_margins():
    h, h_adv, t = _logits((5, 6), seed=6)
    for rho in (0.25, 3.0):
        out = losses.adversarial_comp_sum_loss(h, h_adv, t, tau=0.5, rho=rho, nu=0.0, reduction="none")
        torch.testing.assert_close(out, losses.comp_sum_loss(h / rho, t, tau=0.5, reduction="none"),
                                   rtol=1e-14, atol=0)


def _smooth(h, h_adv, t, **kw):
    return (losses.adversarial_comp_sum_loss(h, h_adv, t, nu=1.0, reduction="none", **kw)
            - losses.adversarial_comp_sum_loss(h, h_adv, t, nu=0.0, reduction="none", **kw))


def test_smooth_term_is_shift_invariant():
    h, h_adv, t = _logits((6, 5), seed=7, ignore_some=False)
    base = _smooth(h, h_adv, t)
    assert base.min() > 0.1
    c1 = torch.randn(6, 1, dtype=torch.float64) * 10
    c2 = torch.randn(6, 1, dtype=torch.float64) * 10
    torch.testing.assert_close(_smooth(h, h_adv + c2, t), base, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(_smooth(h + c1, h_adv, t), base, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(_smooth(h + c1, h_adv + c1, t), base, rtol=1e-10, atol=1e-12)
    # and it is the norm of the margin change, independent of rho and tau
    torch.testing.assert_close(_smooth(h, h_adv, t, tau=0.3, rho=2.0), base, rtol=1e-10, atol=1e-12)


def test_smooth_term_zero_with_zero_subgradient_at_equal_logits():
    h, _, t = _logits((4, 5), seed=8)
    out, gh, ga = value_and_grads(losses.adversarial_comp_sum_loss, (h, h.clone()), t, nu=5.0)
    ref_h = h.clone().requires_grad_(True)
    ref = losses.comp_sum_loss(ref_h, t)
    (rh,) = torch.autograd.grad(ref, [ref_h])
    assert torch.equal(out, ref.detach())
    assert torch.equal(ga, torch.zeros_like(ga))
    assert torch.equal(gh, rh)
    # a constant shift of the adversarial logits is still a zero margin change
    out2, _, ga2 = value_and_grads(losses.adversarial_comp_sum_loss, (h, h + 3.0), t, nu=5.0)
    torch.testing.assert_close(out2, out, rtol=1e-12, atol=0)
    assert torch.isfinite(ga2).all()


def test_function_all_ignored_is_attached_zero():
    h, h_adv, _ = _logits((3, 4), seed=9)
    h.requires_grad_(True)
    h_adv.requires_grad_(True)
    t = torch.full((3,), -100)
    for reduction in ("mean", "sum"):
        out = losses.adversarial_comp_sum_loss(h, h_adv, t, nu=1.0, reduction=reduction)
        assert out.item() == 0.0
        gh, ga = torch.autograd.grad(out, [h, h_adv])
        assert torch.equal(gh, torch.zeros_like(h)) and torch.equal(ga, torch.zeros_like(h_adv))


# --------------------------------------------------------------------------------------
# the module: PGD inner loop
# --------------------------------------------------------------------------------------


class Recorder(nn.Module):
    """A small MLP that records each call's input and training mode."""

    def __init__(self, d_in=6, c=4, dtype=torch.float64, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.lin1 = nn.Linear(d_in, 8).to(dtype)
        self.drop = nn.Dropout(0.0)
        self.lin2 = nn.Linear(8, c).to(dtype)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(dtype))
        self.calls = []

    def forward(self, x):
        self.calls.append((x.detach().clone(), self.training))
        return self.lin2(torch.tanh(self.lin1(self.drop(x))))


def _batch(n=5, d=6, c=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=torch.float64).to(dtype)
    t = torch.randint(0, c, (n,), generator=g)
    return x, t


def pgd_oracle(model, x, t, *, epsilon, steps, step_size, norm, clip, std, seed, ignore_index=-100):
    """PGD on sum_i ||Delta(model(x'))_i - Delta(model(x))_i||_2 written from docs/losses/adversarial_comp_sum.md."""
    model.eval()
    with torch.no_grad():
        ref = model(x)
    C = ref.shape[1]
    valid = t != ignore_index
    onehot = F.one_hot(torch.where(valid, t, torch.zeros_like(t)), C).to(ref.dtype)

    def margins(h):
        return (h * onehot).sum(1, keepdim=True) - h

    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(x.shape, generator=g, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
    xa = x + std * noise.to(x.dtype)
    if clip is not None:
        xa = xa.clamp(*clip)
    for _ in range(steps):
        xa = xa.detach().requires_grad_(True)
        d = margins(model(xa)) - margins(ref)
        obj = sum(torch.linalg.norm(d[i]) for i in range(x.shape[0]) if valid[i])
        (grad,) = torch.autograd.grad(obj, [xa])
        with torch.no_grad():
            if norm == "linf":
                xa = xa + step_size * grad.sign()
                xa = torch.max(torch.min(xa, x + epsilon), x - epsilon)
            else:
                gn = grad.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, 1)  # normalize(v) of docs/conventions.md
                xa = xa + step_size * grad / gn
                delta = xa - x
                dn = delta.flatten(1).norm(dim=1).view(-1, 1)
                xa = x + delta * torch.clamp(epsilon / dn, max=1.0)
            if clip is not None:
                xa = xa.clamp(*clip)
    return xa.detach()


@pytest.mark.parametrize("norm,epsilon,step_size,clip", [
    ("linf", 8 / 255, 2 / 255, (0.0, 1.0)),
    ("linf", 0.3, 0.1, None),
    ("l2", 0.5, 0.2, (0.0, 1.0)),
    ("l2", 2.0, 0.7, None),
])
def test_pgd_matches_independent_reimplementation(norm, epsilon, step_size, clip):
    x, t = _batch(seed=1)
    t[2] = -100
    model = Recorder(seed=1)
    loss_fn = losses.AdversarialCompSumLoss(nu=1.0, tau=0.5, rho=1.5, epsilon=epsilon, steps=4, step_size=step_size,
                                            norm=norm, clip=clip, random_init_std=0.05, seed=123)
    out = loss_fn(model, x, t)
    x_adv = model.calls[-1][0]
    expected = pgd_oracle(copy.deepcopy(model), x, t, epsilon=epsilon, steps=4, step_size=step_size, norm=norm,
                          clip=clip, std=0.05, seed=123)
    torch.testing.assert_close(x_adv, expected, rtol=1e-12, atol=1e-12)
    # constraints
    delta = x_adv - x
    if norm == "linf":
        assert delta.abs().max() <= epsilon + 1e-12
        assert delta.abs().max() >= 0.5 * epsilon  # it moved
    else:
        assert delta.norm(dim=1).max() <= epsilon * (1 + 1e-12)
    if clip is not None:
        assert x_adv.min() >= clip[0] and x_adv.max() <= clip[1]
    # the returned loss is the functional form on the final clean and adversarial logits
    ref = adv_loop(model(x), model(x_adv), t, tau=0.5, rho=1.5, nu=1.0)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


def test_pgd_increases_the_smooth_term():
    x, t = _batch(seed=2)
    model = Recorder(seed=2)
    smooth = []
    for steps in (0, 6):
        fn = losses.AdversarialCompSumLoss(nu=1.0, epsilon=0.1, steps=steps, step_size=0.03, random_init_std=1e-3,
                                           seed=5)
        fn(model, x, t)
        x_adv = model.calls[-1][0]
        with torch.no_grad():
            smooth.append(float(_smooth(model(x), model(x_adv), t).sum()))
    assert smooth[1] > 10 * smooth[0]


def test_zero_epsilon_and_zero_noise_give_zero_smooth_term():
    x, t = _batch(seed=3)
    for steps in (0, 3):
        for norm in ("linf", "l2"):
            model = Recorder(seed=3)
            fn = losses.AdversarialCompSumLoss(nu=2.0, tau=0.5, epsilon=0.0, steps=steps, norm=norm,
                                               random_init_std=0.0, reduction="sum")
            out = fn(model, x, t)
            assert torch.equal(model.calls[-1][0], x)
            ref = losses.comp_sum_loss(model(x), t, tau=0.5, reduction="sum")
            assert torch.equal(out, ref)
            g_out = torch.autograd.grad(out, list(model.parameters()))
            g_ref = torch.autograd.grad(losses.comp_sum_loss(model(x), t, tau=0.5, reduction="sum"),
                                        list(model.parameters()))
            for a, b in zip(g_out, g_ref):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_model_mode_parameters_and_grad_untouched():
    x, t = _batch(seed=4)
    model = Recorder(seed=4)
    model.train()
    model.drop.eval()  # mixed modes must come back exactly
    before = {m: m.training for m in model.modules()}
    params = [p.detach().clone() for p in model.parameters()]
    model.lin1.weight.grad = torch.ones_like(model.lin1.weight)  # pre-existing .grad stays as it is
    fn = losses.AdversarialCompSumLoss(nu=1.0, steps=3, seed=0)
    out = fn(model, x, t)
    assert {m: m.training for m in model.modules()} == before
    for p, p0 in zip(model.parameters(), params):
        assert torch.equal(p, p0)
    assert torch.equal(model.lin1.weight.grad, torch.ones_like(model.lin1.weight))
    assert model.lin2.weight.grad is None and model.lin1.bias.grad is None
    modes = [m for _, m in model.calls]
    assert modes == [False] * (1 + 3) + [True, True]  # ref + steps in eval, final two in train mode
    # backward: exactly the gradient of the functional form on the final logits
    model.lin1.weight.grad = None
    out.backward()
    x_adv = model.calls[-1][0]
    m2 = copy.deepcopy(model)
    for p in m2.parameters():
        p.grad = None
    adv_loop(m2(x), m2(x_adv), t, nu=1.0).backward()
    for p, q in zip(model.parameters(), m2.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12)


def test_mode_restored_when_the_model_raises():
    class Boom(Recorder):
        def forward(self, x):
            if len(self.calls) == 2:
                raise RuntimeError("boom")
            return super().forward(x)

    model = Boom()
    model.train()
    with pytest.raises(RuntimeError, match="boom"):
        losses.AdversarialCompSumLoss(nu=1.0, steps=3)(model, *_batch())
    assert all(m.training for m in model.modules())


def test_batchnorm_statistics_only_move_in_the_final_passes():
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 4))
    model.train()
    x, t = _batch(dtype=torch.float32)
    losses.AdversarialCompSumLoss(nu=1.0, steps=5, seed=1)(model, x, t)
    assert int(model[1].num_batches_tracked) == 2  # model(inputs) and model(x') in train mode


@pytest.mark.parametrize("clip", [(0.0, 1.0), None])
def test_spatial_outputs(clip):
    g = torch.Generator().manual_seed(5)
    x = torch.rand(2, 3, 4, 4, generator=g)
    t = torch.randint(0, 5, (2, 4, 4), generator=g)
    t[0, 0, 0] = -100
    model = nn.Conv2d(3, 5, 1)
    fn = losses.AdversarialCompSumLoss(nu=0.5, steps=2, seed=3, clip=clip, reduction="none")
    out = fn(model, x, t)
    assert out.shape == (2, 4, 4) and out[0, 0, 0] == 0
    assert torch.isfinite(out).all()


def test_determinism_with_seed_and_copies():
    x, t = _batch(seed=6)
    model = Recorder(seed=6)
    kw = dict(nu=1.0, steps=2, random_init_std=0.05)
    a = losses.AdversarialCompSumLoss(seed=11, **kw)
    b = losses.AdversarialCompSumLoss(seed=11, **kw)
    first = a(model, x, t)
    assert torch.equal(b(model, x, t), first)
    # copies made after use continue the same stream
    c, d = copy.deepcopy(a), pickle.loads(pickle.dumps(a))
    second = a(model, x, t)
    assert not torch.equal(second, first)
    assert torch.equal(c(model, x, t), second) and torch.equal(d(model, x, t), second)
    # different seeds draw different starts
    losses.AdversarialCompSumLoss(seed=12, **{**kw, "steps": 0})(model, x, t)
    s12 = model.calls[-1][0]
    losses.AdversarialCompSumLoss(seed=11, **{**kw, "steps": 0})(model, x, t)
    assert not torch.equal(model.calls[-1][0], s12)
    # the global RNG (seed=None)
    e = losses.AdversarialCompSumLoss(**kw)
    torch.manual_seed(9)
    g1 = e(model, x, t)
    torch.manual_seed(9)
    assert torch.equal(e(model, x, t), g1)


def test_resume_from_state_dict_draws_the_same_starts():
    """The private generator's state is in state_dict: a resumed run draws the PGD starts of the
    uninterrupted run; an older state_dict without it still loads (strict)."""
    import io

    x, t = _batch(seed=7)
    model = Recorder(seed=7)
    kw = dict(nu=1.0, steps=1, random_init_std=0.05, seed=13)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", losses.ExperimentalWarning)
        make = lambda: losses.AdversarialCompSumLoss(**kw)  # noqa: E731
        full = make()
        uninterrupted = [full(model, x, t) for _ in range(5)]
        first = make()
        for _ in range(2):
            first(model, x, t)
        buf = io.BytesIO()
        torch.save(first.state_dict(), buf)
        buf.seek(0)
        sd = torch.load(buf, weights_only=True)
        assert "_extra_state" in sd
        resumed = make()
        resumed.load_state_dict(sd)
        assert all(torch.equal(resumed(model, x, t), ref) for ref in uninterrupted[2:])
        legacy = make()
        legacy.load_state_dict({})  # no generator entry: keeps its own (fresh) generator
        assert torch.equal(legacy(model, x, t), uninterrupted[0])
        assert not torch.equal(uninterrupted[0], uninterrupted[2])


def test_forward_under_no_grad_still_attacks():
    x, t = _batch(seed=7)
    model = Recorder(seed=7)
    fn = losses.AdversarialCompSumLoss(nu=1.0, steps=3)
    with torch.no_grad():
        torch.manual_seed(1)
        out = fn(model, x, t)
    assert out.grad_fn is None
    assert not torch.equal(model.calls[-1][0], x)
    torch.manual_seed(1)
    torch.testing.assert_close(out, fn(model, x, t).detach(), rtol=0, atol=0)


def test_all_ignored_module():
    x, _ = _batch(seed=8)
    model = Recorder(seed=8)
    out = losses.AdversarialCompSumLoss(nu=1.0, steps=2, seed=0)(model, x, torch.full((5,), -100))
    assert out.item() == 0.0
    grads = torch.autograd.grad(out, list(model.parameters()))
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)


# --------------------------------------------------------------------------------------
# API, warnings, errors
# --------------------------------------------------------------------------------------


def test_experimental_warning_and_banner():
    h, h_adv, t = _logits((2, 3), seed=10)
    with pytest.warns(losses.ExperimentalWarning, match="formula reconstructed"):
        losses.adversarial_comp_sum_loss(h, h_adv, t, nu=1.0)
    with pytest.warns(losses.ExperimentalWarning, match="not yet confirmed against arXiv:2304.07288"):
        losses.AdversarialCompSumLoss(nu=1.0)
    assert issubclass(losses.ExperimentalWarning, UserWarning)
    flat = lambda s: " ".join(s.replace("*", "").split())  # noqa: E731
    assert BANNER in flat(losses.adversarial_comp_sum_loss.__doc__)
    assert BANNER in flat(losses.AdversarialCompSumLoss.__doc__)
    spec = losses.get_loss_spec("adversarial_comp_sum")
    assert spec.experimental and spec.inputs == ("model", "inputs", "target") and spec.unit == "row"
    assert spec.example_kwargs == {"nu": 1.0} and spec.arxiv == "2304.07288"


def test_signatures_and_defaults():
    fsig = inspect.signature(losses.adversarial_comp_sum_loss).parameters
    assert fsig["nu"].default is inspect.Parameter.empty and fsig["nu"].kind is inspect.Parameter.KEYWORD_ONLY
    assert (fsig["tau"].default, fsig["rho"].default) == (1.0, 1.0)
    msig = inspect.signature(losses.AdversarialCompSumLoss).parameters
    assert msig["nu"].default is inspect.Parameter.empty
    defaults = {k: p.default for k, p in msig.items() if k != "nu"}
    assert defaults == {"tau": 1.0, "rho": 1.0, "epsilon": 8 / 255, "steps": 10, "step_size": 2 / 255,
                        "norm": "linf", "clip": (0.0, 1.0), "random_init_std": 1e-3, "ignore_index": -100,
                        "reduction": "mean", "seed": None}
    with pytest.raises(TypeError):
        losses.adversarial_comp_sum_loss(torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([0]))
    with pytest.raises(TypeError):
        losses.AdversarialCompSumLoss()
    m = losses.AdversarialCompSumLoss(nu=0.5, norm="l2", seed=3)
    assert "AdversarialCompSumLoss(tau=1.0, rho=1.0, nu=0.5" in repr(m) and "norm='l2'" in repr(m)
    assert "seed=3" in repr(m)


@pytest.mark.parametrize("kw,exc,pattern", [
    ({"tau": -0.5}, ValueError, r"tau must be finite and satisfy tau >= 0.0 \(got -0.5\)"),
    ({"rho": 0.0}, ValueError, r"rho must be finite and satisfy rho > 0.0 \(got 0.0\)"),
    ({"rho": -1.0}, ValueError, r"rho must be finite and satisfy rho > 0.0"),
    ({"nu": -1.0}, ValueError, r"nu must be finite and satisfy nu >= 0.0 \(got -1.0\)"),
    ({"nu": math.nan}, ValueError, r"nu must be finite"),
    ({"reduction": "avg"}, ValueError, r"reduction must be one of"),
])
def test_function_and_module_hyperparameter_errors(kw, exc, pattern):
    h, h_adv, t = _logits((2, 3), seed=11)
    args = {"nu": 1.0, **kw}
    with pytest.raises(exc, match="^adversarial_comp_sum_loss: " + pattern):
        losses.adversarial_comp_sum_loss(h, h_adv, t, **args)
    with pytest.raises(exc, match="^AdversarialCompSumLoss: " + pattern):
        losses.AdversarialCompSumLoss(**args)


@pytest.mark.parametrize("kw,exc,pattern", [
    ({"epsilon": -0.1}, ValueError, r"epsilon must be finite and satisfy epsilon >= 0.0"),
    ({"steps": -1}, ValueError, r"steps must be an integer >= 0 \(got -1\)"),
    ({"steps": 2.5}, TypeError, r"steps must be an integer >= 0 \(got 2.5\)"),  # not an int: wrong kind
    ({"steps": True}, TypeError, r"steps must be an integer >= 0"),
    ({"norm": "l1"}, ValueError, r"norm must be one of 'linf', 'l2' \(got 'l1'\)"),
    ({"step_size": -1.0}, ValueError, r"step_size must be finite and satisfy step_size >= 0.0"),
    ({"random_init_std": -1.0}, ValueError, r"random_init_std must be finite"),
    ({"clip": (1.0, 0.0)}, ValueError, r"clip must satisfy low <= high"),
    ({"clip": 1.0}, ValueError, r"clip must be None or a pair"),
    ({"seed": "0"}, TypeError, r"seed must be an int or None"),
])
def test_module_errors(kw, exc, pattern):
    with pytest.raises(exc, match="^AdversarialCompSumLoss: " + pattern):
        losses.AdversarialCompSumLoss(nu=1.0, **kw)


def test_data_errors_and_validation_switch():
    h, h_adv, t = _logits((3, 4), seed=12)
    fn = losses.adversarial_comp_sum_loss
    with pytest.raises(ValueError, match=r"^adversarial_comp_sum_loss: input_adv must have the shape of input"):
        fn(h, h_adv[:, :3], t, nu=1.0)
    with pytest.raises(TypeError, match=r"^adversarial_comp_sum_loss: target must hold integer class ids"):
        fn(h, h_adv, t.double(), nu=1.0)
    with pytest.raises(ValueError, match=r"^adversarial_comp_sum_loss: target has class ids outside \[0, 4\)"):
        fn(h, h_adv, torch.tensor([0, 4, 1]), nu=1.0)
    bad = h_adv.clone()
    bad[0, 0] = math.nan
    with pytest.raises(ValueError, match=r"^adversarial_comp_sum_loss: input_adv contains NaN"):
        fn(h, bad, t, nu=1.0)
    with losses.validation(False):
        assert torch.isnan(fn(h, bad, t, nu=1.0, reduction="none")[0])
        with pytest.raises(ValueError, match="input_adv must have the shape"):
            fn(h, h_adv[:, :3], t, nu=1.0)
    module = losses.AdversarialCompSumLoss(nu=1.0, steps=1)
    model = Recorder()
    x, tt = _batch()
    with pytest.raises(TypeError, match=r"^AdversarialCompSumLoss: model must be a torch.nn.Module"):
        module(lambda z: z, x, tt)
    with pytest.raises(TypeError, match=r"^AdversarialCompSumLoss: inputs must be a floating-point tensor"):
        module(model, x.long(), tt)
    with pytest.raises(TypeError, match=r"^AdversarialCompSumLoss: target must hold integer class ids"):
        module(model, x, tt.float())
    xb = x.clone()
    xb[0, 0] = math.nan
    with pytest.raises(ValueError, match=r"^AdversarialCompSumLoss: inputs contains NaN"):
        module(model, xb, tt)
    with pytest.raises(TypeError, match=r"^AdversarialCompSumLoss: model\(inputs\) must return a floating-point"):
        module(_IntModel(), x, tt)


class _IntModel(nn.Module):
    def forward(self, x):
        return x.long()


def test_warning_filters_are_respected():
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        losses.AdversarialCompSumLoss(nu=1.0)
    assert any(issubclass(w.category, losses.ExperimentalWarning) for w in rec)
