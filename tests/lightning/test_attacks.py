"""lightning_modules.attacks: APGD / PGD / worst-case robust accuracy / masking checks on a small
MLP trained on scikit-learn's 8x8 digits (pixels scaled to [0, 1])."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("sklearn")
from sklearn.datasets import load_digits

from lightning_modules.attacks import (
    apgd,
    apgd_checkpoints,
    dlr_loss,
    masking_checks,
    pgd,
    robust_accuracy,
)


class Quantised(torch.nn.Module):
    """Input quantisation to quarters before the classifier: torch.round has a zero gradient, so
    every input gradient vanishes (gradient masking) while the decision function barely changes."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(torch.round(x * 4) / 4)


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(y), generator=g)
    x, y = x[perm], y[perm]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    for _ in range(150):
        opt.zero_grad()
        F.cross_entropy(model(x[:1400]), y[:1400]).backward()
        opt.step()
    model.eval()
    return model, x[1400:1600], y[1400:1600]


def test_apgd_at_least_as_strong_as_pgd10_and_eps0_is_clean(digits):
    model, x, y = digits
    clean = (model(x).argmax(1) == y).float().mean().item()
    assert clean > 0.8
    for eps in (0.0, 0.05, 0.1):
        p10 = robust_accuracy(model, x, y, eps=eps, attacks=("pgd",), n_iter=10, restarts=1)
        ace = robust_accuracy(model, x, y, eps=eps, attacks=("apgd-ce",), n_iter=50)
        assert ace.clean_accuracy == pytest.approx(clean)
        if eps == 0:
            assert p10.robust_accuracy == pytest.approx(clean) and ace.robust_accuracy == pytest.approx(clean)
        else:
            assert ace.robust_accuracy <= p10.robust_accuracy
            assert ace.robust_accuracy < clean


def test_monotone_in_eps_and_zero_at_large_eps(digits):
    model, x, y = digits
    accs = [robust_accuracy(model, x, y, eps=e, n_iter=30).robust_accuracy for e in (0.0, 0.03, 0.08, 0.15, 0.5)]
    assert all(b <= a for a, b in zip(accs, accs[1:])), accs
    assert accs[-1] <= 0.01


def test_worst_case_ensemble_and_flags(digits):
    model, x, y = digits
    res = robust_accuracy(model, x, y, eps=0.08, attacks=("apgd-ce", "apgd-dlr"), n_iter=30, batch_size=64)
    assert res.robust.dtype == torch.bool and res.robust.shape == y.shape
    assert res.robust_accuracy == pytest.approx(res.robust.float().mean().item())
    assert res.by_attack["apgd-dlr"] <= res.by_attack["apgd-ce"] <= res.clean_accuracy
    # robust examples are correctly classified at their adversarial point; broken ones are not
    pred = model(res.x_adv).argmax(1)
    assert torch.all(pred[res.robust] == y[res.robust])
    clean_ok = model(x).argmax(1) == y
    assert torch.all(pred[clean_ok & ~res.robust] != y[clean_ok & ~res.robust])


@pytest.mark.parametrize("attack", ["apgd-ce", "apgd-dlr", "pgd", "pgd-margin"])
def test_adversarial_examples_stay_in_ball_and_box(digits, attack):
    model, x, y = digits
    eps = 0.1
    if attack.startswith("apgd"):
        xa, _ = apgd(model, x, y, eps=eps, loss=attack[5:], n_iter=20, restarts=2)
    else:
        xa, _ = pgd(model, x, y, eps=eps, n_iter=10, restarts=2, loss="margin" if attack.endswith("margin") else "ce")
    assert (xa - x).abs().max().item() <= eps + 1e-6
    assert xa.min().item() >= 0.0 and xa.max().item() <= 1.0
    with pytest.raises(ValueError, match="clip range"):
        apgd(model, x * 2, y, eps=eps)


def test_masking_checks_flag_quantised_model(digits):
    model, x, y = digits
    eps = 0.1
    masked = Quantised(model)
    # PGD alone reports the masked model as far more robust than the same classifier unmasked ...
    pgd_masked = robust_accuracy(masked, x, y, eps=eps, attacks=("pgd",), n_iter=10).robust_accuracy
    pgd_plain = robust_accuracy(model, x, y, eps=eps, attacks=("pgd",), n_iter=10).robust_accuracy
    assert pgd_masked > pgd_plain + 0.3
    # ... yet adversarial examples transferred from the unmasked classifier break it: the masked
    # model's robustness was an artefact of its vanishing gradients
    transfer = robust_accuracy(model, x, y, eps=eps, attacks=("apgd-ce",), n_iter=30)
    transfer_acc = (masked(transfer.x_adv).argmax(1) == y).float().mean().item()
    assert transfer_acc < pgd_masked - 0.2
    checks = masking_checks(masked, x, y, eps, n_iter=20)
    assert not checks["ok"]
    assert not checks["gradients_alive"] and checks["zero_grad_fraction"] == 1.0
    assert not checks["unbounded_zero"] and checks["robust_unbounded"] > 0.05
    plain = masking_checks(model, x, y, eps, n_iter=20)
    assert plain["ok"], plain


def test_apgd_checkpoints():
    assert apgd_checkpoints(100) == [0, 22, 41, 57, 70, 80, 87, 93, 99]


def test_dlr_matches_float64_formula_and_needs_three_classes():
    g = torch.Generator().manual_seed(3)
    z = torch.randn(50, 7, generator=g)
    y = torch.randint(0, 7, (50,), generator=g)
    got = dlr_loss(z, y)
    zd = z.double().tolist()
    for i in range(50):
        row = zd[i]
        s = sorted(row, reverse=True)
        other = max(v for j, v in enumerate(row) if j != int(y[i]))
        want = -(row[int(y[i])] - other) / (s[0] - s[2] + 1e-12)
        assert got[i].item() == pytest.approx(want, rel=1e-5, abs=1e-6)
    with pytest.raises(ValueError, match="at least 3 classes"):
        dlr_loss(torch.randn(4, 2), torch.zeros(4, dtype=torch.long))
    two = torch.nn.Linear(64, 2)
    with pytest.raises(ValueError, match="at least 3 classes"):
        apgd(two, torch.rand(4, 64), torch.zeros(4, dtype=torch.long), eps=0.1, loss="dlr")


def test_deterministic_for_a_seed(digits):
    model, x, y = digits
    a = robust_accuracy(model, x, y, eps=0.08, n_iter=20, seed=5)
    b = robust_accuracy(model, x, y, eps=0.08, n_iter=20, seed=5)
    assert torch.equal(a.robust, b.robust) and torch.equal(a.x_adv, b.x_adv)
    xa1, f1 = pgd(model, x, y, eps=0.08, n_iter=5, restarts=2, seed=1)
    xa2, f2 = pgd(model, x, y, eps=0.08, n_iter=5, restarts=2, seed=1)
    assert torch.equal(xa1, xa2) and torch.equal(f1, f2)


def test_model_flags_restored(digits):
    _model, x, y = digits
    net = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.Dropout(0.1), torch.nn.Linear(16, 10))
    net.load_state_dict(net.state_dict())
    net.train()
    net[2].weight.requires_grad_(False)
    before = [p.requires_grad for p in net.parameters()]
    apgd(net, x[:20], y[:20], eps=0.05, n_iter=5)
    pgd(net, x[:20], y[:20], eps=0.05, n_iter=3, restarts=1)
    robust_accuracy(net, x[:20], y[:20], eps=0.05, n_iter=5)
    assert net.training and all(m.training for m in net.modules())
    assert [p.requires_grad for p in net.parameters()] == before
    assert all(p.grad is None for p in net.parameters())
    with torch.inference_mode():  # works inside Lightning's test loop
        xa, _ = apgd(net, x[:5], y[:5], eps=0.05, n_iter=3)
    assert xa.shape == (5, 64)


def test_inputs_made_in_inference_mode_and_predict_hook(digits):
    model, x, y = digits
    with torch.inference_mode():  # a Lightning test step's batch is an inference tensor
        xi, yi = x[:40].clone(), y[:40].clone()
        res = robust_accuracy(model, xi, yi, eps=0.08, n_iter=10)
    ref = robust_accuracy(model, x[:40], y[:40], eps=0.08, n_iter=10)
    assert torch.equal(res.robust, ref.robust)
    # predict maps outputs to scores: a permuted-score predictor is always wrong at the clean point
    wrong = robust_accuracy(model, x[:40], y[:40], eps=0.0, attacks=("apgd-ce",), n_iter=2,
                            predict=lambda z: z.roll(1, dims=1))
    right = robust_accuracy(model, x[:40], y[:40], eps=0.0, attacks=("apgd-ce",), n_iter=2,
                            predict=lambda z: z.softmax(1))
    assert right.clean_accuracy == ref.clean_accuracy and wrong.clean_accuracy < 0.2
