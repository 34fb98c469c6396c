"""NBC-Softmax (docs/losses/nbc_softmax.md): loop oracle, gradcheck, test facts, many classes, errors."""

from __future__ import annotations

import copy
import math
import pickle
import time

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import losses
from tests._helpers import assert_gradcheck, randn
from tests._helpers.rows import EMBEDDINGS, HEAD_KWARGS, entry

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "nbc_softmax": entry("nbc_softmax_loss", "NBCSoftmaxLoss", EMBEDDINGS, unit="batch", owns_head=True,
          example=HEAD_KWARGS),
}
EXPECTED_HELPERS = ("nbc_loss",)

IGN = -100


# --------------------------------------------------------------------------------------
# independent float64 oracle: explicit loops straight from the formula (autograd-able)
# --------------------------------------------------------------------------------------


def _normalize(v):
    norm = torch.sqrt(torch.dot(v, v))
    return v / torch.clamp(norm, min=1e-12)


def nbc_oracle(z, y, *, scale=0.2, num_classes=None, variant="paper", ignore_index=IGN):
    rows = [i for i in range(z.shape[0]) if int(y[i]) != ignore_index]
    classes = sorted({int(y[i]) for i in rows})
    if not classes:
        return z.sum() * 0
    mu = {}
    for c in classes:
        members = [i for i in rows if int(y[i]) == c]
        total = z[members[0]] * 0
        for i in members:
            total = total + z[i]
        mu[c] = _normalize(total / len(members))
    per_class = []
    for c in classes:
        acc = 0.0
        for c2 in classes:
            sim = 0.0 if c2 == c else torch.dot(mu[c], mu[c2])
            acc = acc + torch.exp(torch.as_tensor(scale * sim, dtype=z.dtype))
        if variant == "reference":
            acc = acc + 1e-10
        per_class.append(torch.log(acc))
    out = sum(per_class) / len(per_class)
    return out / num_classes if variant == "reference" else out


def ce_oracle(z, y, w, b, ignore_index=IGN):
    rows = [i for i in range(z.shape[0]) if int(y[i]) != ignore_index]
    total = 0.0
    for i in rows:
        logits = []
        for k in range(w.shape[0]):
            v = torch.dot(z[i], w[k])
            logits.append(v + (b[k] if b is not None else 0.0))
        m = max(v.item() if isinstance(v, torch.Tensor) else v for v in logits)
        lse = m + torch.log(sum(torch.exp(v - m) for v in logits))
        total = total + lse - logits[int(y[i])]
    return total / len(rows)


def nbc_softmax_oracle(z, y, w, b=None, *, scale=0.2, nbc_weight=0.5, variant="paper", ignore_index=IGN):
    nbc = nbc_oracle(z, y, scale=scale, num_classes=w.shape[0], variant=variant, ignore_index=ignore_index)
    return (1 - nbc_weight) * ce_oracle(z, y, w, b, ignore_index) + nbc_weight * nbc


# --------------------------------------------------------------------------------------
# value and gradient against the oracle
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["paper", "reference"])
@pytest.mark.parametrize("scale", [0.2, 0.3, 5.0])
def test_nbc_loss_matches_loop_oracle(variant, scale):
    z = randn(7, 3, seed=1).requires_grad_(True)
    y = torch.tensor([4, 0, IGN, 4, 2, 0, 4])  # classes 0, 2, 4 present of K = 6
    out = losses.nbc_loss(z, y, scale=scale, num_classes=6, variant=variant)
    ref = nbc_oracle(z, y, scale=scale, num_classes=6, variant=variant)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-13)
    (g,) = torch.autograd.grad(out, z)
    (gr,) = torch.autograd.grad(ref, z)
    torch.testing.assert_close(g, gr, rtol=1e-9, atol=1e-13)
    assert torch.all(g[2] == 0)


@pytest.mark.parametrize("variant", ["paper", "reference"])
@pytest.mark.parametrize("nbc_weight", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("with_bias", [True, False])
def test_nbc_softmax_loss_matches_loop_oracle(variant, nbc_weight, with_bias):
    z = randn(7, 3, seed=2).requires_grad_(True)
    w = randn(5, 3, seed=3).requires_grad_(True)
    b = randn(5, seed=4).requires_grad_(True) if with_bias else None
    y = torch.tensor([1, 3, 1, IGN, 0, 3, 3])
    out = losses.nbc_softmax_loss(z, y, w, bias=b, scale=0.3, nbc_weight=nbc_weight, variant=variant)
    ref = nbc_softmax_oracle(z, y, w, b, scale=0.3, nbc_weight=nbc_weight, variant=variant)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-13)
    leaves = [z, w] + ([b] if with_bias else [])
    for g, gr in zip(torch.autograd.grad(out, leaves), torch.autograd.grad(ref, leaves)):
        torch.testing.assert_close(g, gr, rtol=1e-9, atol=1e-13)


def test_float32_matches_float64_oracle():
    z, w, b = randn(6, 4, seed=5), randn(4, 4, seed=6), randn(4, seed=7)
    y = torch.tensor([0, 1, 2, 0, 1, 3])
    out = losses.nbc_softmax_loss(z.float(), y, w.float(), bias=b.float())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), nbc_softmax_oracle(z, y, w, b), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------
# gradcheck: embeddings and the head (weight, bias)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["paper", "reference"])
@pytest.mark.parametrize("n,k,y", [(3, 3, [0, 0, 1]), (5, 5, [0, 4, 2, 0, 4]), (1, 3, [2])])
def test_gradcheck(variant, n, k, y):
    z = randn(n, 4, seed=20 + n).requires_grad_(True)
    w = randn(k, 4, seed=30 + k).requires_grad_(True)
    b = randn(k, seed=40 + k).requires_grad_(True)
    y = torch.tensor(y)
    assert_gradcheck(
        lambda z_, w_, b_: losses.nbc_softmax_loss(z_, y, w_, bias=b_, scale=0.7, variant=variant), z, w, b)
    assert_gradcheck(
        lambda z_: losses.nbc_loss(z_, y, scale=2.0, num_classes=k, variant=variant), z)


def test_gradcheck_module_head():
    from torch.func import functional_call

    m = losses.NBCSoftmaxLoss(4, 3, scale=0.5).double()
    z = randn(5, 4, seed=8).requires_grad_(True)
    y = torch.tensor([0, 2, 2, 1, 0])
    names = [n for n, _ in m.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for _, p in m.named_parameters())
    assert names == ["classifier.weight", "classifier.bias"]
    assert torch.autograd.gradcheck(
        lambda z_, *p: functional_call(m, dict(zip(names, p)), (z_, y)), (z,) + params)


# --------------------------------------------------------------------------------------
# test facts (docs/losses/nbc_softmax.md)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [0.2, 1.0, 4.0])
def test_two_blocks_closed_form(scale):
    z = randn(7, 5, seed=9)
    y = torch.tensor([3, 8, 3, 8, 8, 3, IGN])
    m1 = z[y == 3].mean(0)
    m2 = z[y == 8].mean(0)
    cos = float(m1 @ m2 / (m1.norm() * m2.norm()))
    expected = math.log(1 + math.exp(scale * cos))
    assert losses.nbc_loss(z, y, scale=scale).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("k", [5, 40, 50_000])
def test_reference_is_paper_over_k(k):
    z = randn(9, 4, seed=10)
    y = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3])
    paper = losses.nbc_loss(z, y, scale=0.3)
    ref = losses.nbc_loss(z, y, scale=0.3, num_classes=k, variant="reference")
    assert abs(ref.item() - paper.item() / k) <= 1e-9
    assert ref.item() != paper.item() / k or k > 10  # the 1e-10 inside the log is there
    # the reference NBC weight inside nbc_softmax_loss is lambda / K
    w = randn(5, 4, seed=11)
    a = losses.nbc_softmax_loss(z, y, w, nbc_weight=0.4, variant="reference")
    b = losses.nbc_softmax_loss(z, y, w, nbc_weight=0.4)
    ce = losses.nbc_softmax_loss(z, y, w, nbc_weight=0.0)
    assert abs((a - 0.6 * ce).item() - (b - 0.6 * ce).item() / 5) <= 1e-9


def test_permutation_invariance():
    z = randn(9, 4, seed=12).requires_grad_(True)
    w = randn(5, 4, seed=13)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 4, IGN, 4])
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(0))
    for fn in (lambda a, t: losses.nbc_loss(a, t, scale=0.9),
               lambda a, t: losses.nbc_softmax_loss(a, t, w, variant="reference")):
        a = fn(z, y)
        b = fn(z[perm], y[perm])
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
        (ga,) = torch.autograd.grad(a, z)
        (gb,) = torch.autograd.grad(b, z)
        torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("variant", ["paper", "reference"])
def test_invariant_to_rescaling_one_class(variant):
    z = randn(9, 4, seed=14)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])
    base = losses.nbc_loss(z, y, scale=0.8, num_classes=3, variant=variant)
    for c, factor in ((0, 7.5), (1, 0.01), (2, 3.0)):
        scaled = z.clone()
        scaled[y == c] *= factor
        torch.testing.assert_close(losses.nbc_loss(scaled, y, scale=0.8, num_classes=3, variant=variant), base,
                                   rtol=1e-12, atol=1e-14)
    flipped = z.clone()
    flipped[y == 0] *= -1.0  # a negative factor is not an invariance
    assert abs(losses.nbc_loss(flipped, y, scale=0.8, num_classes=3, variant=variant).item() - base.item()) > 1e-6


@pytest.mark.parametrize("variant", ["paper", "reference"])
def test_one_block_is_zero_with_zero_gradient(variant):
    for y in (torch.tensor([2, 2, 2, 2]), torch.tensor([IGN, 1, IGN, IGN])):
        z = randn(4, 3, seed=15).requires_grad_(True)
        out = losses.nbc_loss(z, y, num_classes=3, variant=variant)
        assert abs(out.item()) <= (1e-10 / 3 if variant == "reference" else 0.0)
        (g,) = torch.autograd.grad(out, z)
        assert torch.all(g == 0)


def test_zero_centroid_has_cosine_zero():
    z = randn(5, 3, seed=16)
    z[3] = -z[2]  # class 1 = {2, 3} has a zero centroid
    z.requires_grad_(True)
    y = torch.tensor([0, 0, 1, 1, 2])
    out = losses.nbc_loss(z, y, scale=0.5)
    torch.testing.assert_close(out, nbc_oracle(z, y, scale=0.5), rtol=1e-12, atol=1e-14)
    m0, m2 = z[:2].mean(0), z[4]
    cos = (m0 @ m2 / (m0.norm() * m2.norm())).item()
    rows = [math.log(1 + 1 + math.exp(0.5 * cos)), math.log(1 + 1 + 1), math.log(1 + 1 + math.exp(0.5 * cos))]
    assert out.item() == pytest.approx(sum(rows) / 3, rel=1e-12)
    (g,) = torch.autograd.grad(out, z)
    assert torch.isfinite(g).all()


def test_large_scale_does_not_overflow():
    z = randn(6, 3, seed=17).float()
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    out = losses.nbc_loss(z, y, scale=80.0)  # exp(kappa S) up to e^80, beyond fp32 exp range in sums
    assert torch.isfinite(out)
    assert out.item() == pytest.approx(nbc_oracle(z.double(), y, scale=80.0).item(), rel=1e-5)


def test_empty_and_all_ignored_batches_are_attached_zero():
    cases = [(torch.zeros(0, 3, dtype=torch.float64), torch.zeros(0, dtype=torch.long)),
             (randn(4, 3, seed=0), torch.full((4,), IGN))]
    for z0, y in cases:
        z = z0.clone().requires_grad_(True)
        w = randn(5, 3, seed=1).requires_grad_(True)
        b = randn(5, seed=2).requires_grad_(True)
        out = losses.nbc_softmax_loss(z, y, w, bias=b)
        assert out.item() == 0.0 and out.grad_fn is not None
        for g in torch.autograd.grad(out, (z, w, b)):
            assert g is not None and torch.all(g == 0)
        out = losses.nbc_loss(z, y, num_classes=5, variant="reference")
        assert out.item() == 0.0 and out.grad_fn is not None
        (g,) = torch.autograd.grad(out, z)
        assert torch.all(g == 0)


# --------------------------------------------------------------------------------------
# many classes: O(B*D + B^2) memory, never B x K x D (nor K x D for the NBC term)
# --------------------------------------------------------------------------------------


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_fifty_thousand_classes_fast_with_modest_memory():
    k, b, d = 50_000, 64, 16
    gen = torch.Generator().manual_seed(0)
    present = torch.randperm(k, generator=gen)[:20]
    present[0] = k - 1
    y = present[torch.randint(0, 20, (b,), generator=gen)]
    y[:20] = present
    z = torch.randn(b, d, generator=gen, dtype=torch.float64).requires_grad_(True)
    for variant in ("paper", "reference"):
        with _LargestTensor() as mode:
            out = losses.nbc_loss(z, y, num_classes=k, variant=variant)
            (g,) = torch.autograd.grad(out, z)
        # O(B*D + B^2): the (B, B) slot similarities are the largest tensor, nothing scales with K
        assert mode.largest <= b * max(b, d)
        start = time.perf_counter()
        torch.autograd.grad(losses.nbc_loss(z, y, num_classes=k, variant=variant), z)
        assert time.perf_counter() - start < 10.0  # generous: milliseconds on an idle core
        ref = nbc_oracle(z, y, num_classes=k, variant=variant)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-15)
        torch.testing.assert_close(g, torch.autograd.grad(ref, z)[0], rtol=1e-9, atol=1e-15)
    # the full loss: only the (B, K) logits of the head, no (B, K, D) tensor
    w = torch.randn(k, d, generator=gen).requires_grad_(True)
    with _LargestTensor() as mode:
        out = losses.nbc_softmax_loss(z.float(), y, w, variant="reference")
        out.backward()
    assert mode.largest <= b * k  # the logits; a (B, K, D) tensor would be 16x larger
    start = time.perf_counter()
    losses.nbc_softmax_loss(z.float(), y, w, variant="reference").backward()
    assert time.perf_counter() - start < 10.0
    expected = 0.5 * torch.nn.functional.cross_entropy(z.float() @ w.T, y) + 0.5 * nbc_oracle(
        z.detach(), y, num_classes=k, variant="reference")
    torch.testing.assert_close(out.double(), expected.double(), rtol=1e-5, atol=1e-6)


def test_compiles_as_one_graph_without_host_sync():
    """The present-class slots need no torch.unique / boolean indexing: fullgraph compile works."""
    z = randn(8, 3, seed=24).float().requires_grad_(True)
    w = randn(5, 3, seed=25).float().requires_grad_(True)
    y = torch.tensor([4, 0, IGN, 4, 2, 0, 4, 1])
    fn = lambda a, t, h: losses.nbc_softmax_loss(a, t, h, variant="reference", scale=0.6)  # noqa: E731
    torch._dynamo.reset()
    with losses.validation(False):
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        out = compiled(z, y, w)
    ref = fn(z, y, w)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-7)
    for a, b in zip(torch.autograd.grad(out, (z, w)), torch.autograd.grad(ref, (z, w))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_float32(dtype):
    z = randn(6, 4, seed=18).to(dtype).requires_grad_(True)
    w = randn(3, 4, seed=19).to(dtype).requires_grad_(True)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    out = losses.nbc_softmax_loss(z, y, w)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, losses.nbc_softmax_loss(z.detach().float(), y, w.detach().float()),
                               rtol=1e-6, atol=1e-6)
    gz, gw = torch.autograd.grad(out, (z, w))
    assert gz.dtype == dtype and gw.dtype == dtype


def test_autocast_does_not_lower_precision():
    z, w = randn(6, 4, seed=20).float(), randn(3, 4, seed=21).float()
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    ref = losses.nbc_softmax_loss(z, y, w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = losses.nbc_softmax_loss(z, y, w)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------
# errors and validation
# --------------------------------------------------------------------------------------


def test_hyperparameter_and_shape_errors():
    z, w = randn(4, 3, seed=0), randn(5, 3, seed=1)
    y = torch.tensor([0, 1, 0, 1])
    for bad in ("none", "sum"):
        for call, name in ((lambda r: losses.nbc_loss(z, y, reduction=r), "nbc_loss"),
                           (lambda r: losses.nbc_softmax_loss(z, y, w, reduction=r), "nbc_softmax_loss")):
            with pytest.raises(ValueError) as e:
                call(bad)
            assert str(e.value) == (f"{name}: batch-level loss; only reduction='mean' is supported (got '{bad}'); "
                                    "compute per-sample terms yourself if needed")
    with pytest.raises(ValueError, match=r"^nbc_loss: scale must be finite and satisfy scale >= 0"):
        losses.nbc_loss(z, y, scale=-0.1)
    with pytest.raises(ValueError, match=r"^nbc_softmax_loss: scale must be finite"):
        losses.nbc_softmax_loss(z, y, w, scale=-1.0)
    for lam in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match=r"^nbc_softmax_loss: nbc_weight must be finite and satisfy"):
            losses.nbc_softmax_loss(z, y, w, nbc_weight=lam)
        with pytest.raises(ValueError, match=r"^NBCSoftmaxLoss: nbc_weight must be finite"):
            losses.NBCSoftmaxLoss(3, 5, nbc_weight=lam)
    with pytest.raises(ValueError, match=r"^NBCSoftmaxLoss: scale must be finite"):
        losses.NBCSoftmaxLoss(3, 5, scale=-2.0)
    with pytest.raises(ValueError, match=r"^nbc_loss: variant='reference' needs num_classes"):
        losses.nbc_loss(z, y, variant="reference")
    with pytest.raises(ValueError, match=r"^nbc_loss: num_classes must be a positive int"):
        losses.nbc_loss(z, y, num_classes=0)
    with pytest.raises(ValueError, match=r"^nbc_loss: variant must be one of"):
        losses.nbc_loss(z, y, variant="code")
    with pytest.raises(ValueError, match=r"^nbc_softmax_loss: weight must have shape \(K, 3\)"):
        losses.nbc_softmax_loss(z, y, w[:, :2])
    with pytest.raises(ValueError, match=r"^nbc_softmax_loss: bias must have shape \(5,\)"):
        losses.nbc_softmax_loss(z, y, w, bias=torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^nbc_softmax_loss: embeddings must have shape \(N, D\)"):
        losses.nbc_softmax_loss(z[None], y, w)
    with pytest.raises(ValueError, match=r"^nbc_loss: target must have shape \(4,\)"):
        losses.nbc_loss(z, y[None])
    with pytest.raises(TypeError, match=r"^nbc_loss: target must hold integer class ids"):
        losses.nbc_loss(z, y.double())
    with pytest.raises(TypeError, match=r"^nbc_softmax_loss: target must hold integer class ids"):
        losses.nbc_softmax_loss(z, y.bool(), w)
    with pytest.raises(ValueError, match=r"^NBCSoftmaxLoss: num_classes must be a positive int"):
        losses.NBCSoftmaxLoss(3, 0)


def test_label_errors_are_data_checks():
    z, w = randn(4, 3, seed=0), randn(5, 3, seed=1)
    cases = [
        (lambda y: losses.nbc_loss(z, y), torch.tensor([0, -1, 0, 1]),
         r"^nbc_loss: target has negative class ids other than ignore_index \(got min=-1"),
        (lambda y: losses.nbc_loss(z, y, num_classes=5), torch.tensor([0, 5, 0, 1]),
         r"^nbc_loss: target has class ids outside \[0, 5\) \(got min=0, max=5\)"),
        (lambda y: losses.nbc_loss(z, y, num_classes=5, variant="reference"), torch.tensor([0, -7, 0, 1]),
         r"^nbc_loss: target has class ids outside \[0, 5\)"),
        (lambda y: losses.nbc_softmax_loss(z, y, w), torch.tensor([0, 5, 0, 1]),
         r"^nbc_softmax_loss: target has class ids outside \[0, 5\)"),
        (lambda y: losses.nbc_softmax_loss(z, y, w), torch.tensor([0, -1, 0, 1]),
         r"^nbc_softmax_loss: target has class ids outside \[0, 5\)"),
    ]
    for call, y, msg in cases:
        with pytest.raises(ValueError, match=msg):
            call(y)
    # ignore_index itself is fine, and a custom negative ignore_index too
    losses.nbc_loss(z, torch.tensor([0, IGN, 0, 1]))
    losses.nbc_loss(z, torch.tensor([0, -1, 0, 1]), ignore_index=-1)
    # validation(False) turns the data checks off (the NBC term still runs on any ids)
    with losses.validation(False):
        out = losses.nbc_loss(z, torch.tensor([0, -1, 0, 1]))
    assert out.item() == pytest.approx(nbc_oracle(z, torch.tensor([0, -1, 0, 1])).item(), rel=1e-12)


def test_validation_off_keeps_shape_and_hyperparameter_checks():
    z, w = randn(4, 3, seed=0), randn(5, 3, seed=1)
    y = torch.tensor([0, 1, 0, 1])
    with losses.validation(False):
        with pytest.raises(ValueError, match=r"^nbc_softmax_loss: weight must have shape"):
            losses.nbc_softmax_loss(z, y, w[:, :2])
        with pytest.raises(ValueError, match=r"^nbc_softmax_loss: nbc_weight must be finite"):
            losses.nbc_softmax_loss(z, y, w, nbc_weight=2.0)
        with pytest.raises(ValueError, match="batch-level loss"):
            losses.nbc_loss(z, y, reduction="none")
        with pytest.raises(TypeError, match=r"^nbc_loss: target must hold integer class ids"):
            losses.nbc_loss(z, y.float())


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_integer_ids_of_any_dtype(dtype):
    z, w = randn(6, 3, seed=2), randn(5, 3, seed=3)
    y = torch.tensor([0, 4, 2, 0, 4, 1])
    torch.testing.assert_close(losses.nbc_softmax_loss(z, y.to(dtype), w, variant="reference"),
                               nbc_softmax_oracle(z, y, w, variant="reference"), rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("where", ["embeddings", "weight", "bias"])
def test_non_finite_inputs_are_a_data_check(where):
    z, w, b = randn(4, 3, seed=0), randn(5, 3, seed=1), randn(5, seed=2)
    {"embeddings": z, "weight": w, "bias": b}[where].view(-1)[1] = math.nan
    y = torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match=rf"^nbc_softmax_loss: {where} contains NaN or infinite values"):
        losses.nbc_softmax_loss(z, y, w, bias=b)
    with losses.validation(False):
        losses.nbc_softmax_loss(z, y, w, bias=b)


# --------------------------------------------------------------------------------------
# module
# --------------------------------------------------------------------------------------


def test_module_equals_function_and_owns_a_head():
    torch.manual_seed(0)
    m = losses.NBCSoftmaxLoss(4, 6, scale=0.3, nbc_weight=0.25, variant="reference", ignore_index=-1).double()
    z = randn(7, 4, seed=22)
    y = torch.tensor([0, 5, 5, -1, 2, 0, 0])
    expected = losses.nbc_softmax_loss(z, y, m.classifier.weight, bias=m.classifier.bias, scale=0.3,
                                       nbc_weight=0.25, variant="reference", ignore_index=-1)
    torch.testing.assert_close(m(z, y), expected, rtol=0, atol=0)
    torch.testing.assert_close(m.logits(z), z @ m.classifier.weight.T + m.classifier.bias, rtol=1e-12, atol=1e-12)
    assert m.logits(z.float()).dtype == torch.float64  # compute dtype: the head is float64
    nb = losses.NBCSoftmaxLoss(4, 6, bias=False)
    assert nb.classifier.bias is None and [n for n, _ in nb.named_parameters()] == ["classifier.weight"]
    torch.testing.assert_close(nb(z.float(), y.clamp(min=0)),
                               losses.nbc_softmax_loss(z.float(), y.clamp(min=0), nb.classifier.weight),
                               rtol=0, atol=0)
    r = repr(m)
    assert "NBCSoftmaxLoss(" in r and "scale=0.3" in r and "nbc_weight=0.25" in r and "variant='reference'" in r
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        torch.testing.assert_close(other(z, y), m(z, y), rtol=0, atol=0)
    g = losses.NBCSoftmaxLoss(4, 6, gather_distributed=True).double()  # no process group: identity
    torch.testing.assert_close(g(z, y.clamp(min=0)), losses.nbc_softmax_loss(
        z, y.clamp(min=0), g.classifier.weight, bias=g.classifier.bias), rtol=0, atol=0)
    spec = losses.get_loss_spec("nbc_softmax")
    assert spec.owns_head and not spec.auxiliary and spec.unit == "batch" and spec.arxiv == "2212.08184"


def test_state_dict_round_trip():
    src = losses.NBCSoftmaxLoss(4, 6)
    with torch.no_grad():
        src.classifier.weight.add_(1.0)
    dst = losses.NBCSoftmaxLoss(4, 6)
    dst.load_state_dict(src.state_dict())
    z = randn(6, 4, seed=23).float().requires_grad_(True)
    y = torch.tensor([0, 1, 2, 0, 1, 5])
    a, b = src(z, y), dst(z, y)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    for ga, gb in zip(torch.autograd.grad(a, [z, *src.parameters()]), torch.autograd.grad(b, [z, *dst.parameters()])):
        torch.testing.assert_close(ga, gb, rtol=0, atol=0)


def test_doctests_run():
    import doctest

    from losses.embedding import nbc

    res = doctest.testmod(nbc)
    assert res.attempted > 0 and res.failed == 0
