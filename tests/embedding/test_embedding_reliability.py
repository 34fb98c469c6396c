"""Reliability rules for the embedding losses and heads (docs/conventions.md; docs/losses/opl.md,
nbc_softmax.md, wcdas.md, partial_fc.md, linear_cross_entropy.md): mixed precision, errors for a
head of the wrong width, one-class heads, float64 exactness and resumable Partial FC sampling.
"""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F

import losses
from tests.embedding.test_opl import opl_oracle

HEADS = ["margin_softmax", "cosine_softmax", "partial_fc", "linear_cross_entropy", "wcdas", "nbc_softmax"]


def _make(name, **extra):
    spec = losses.get_loss_spec(name)
    kw = dict(spec.example_kwargs)
    kw.update(extra)
    return losses.create_loss(name, **kw)


def _batch(seed=0, n=6, d=8, c=5, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype)
    y = torch.randint(0, c, (n,), generator=g)
    y[1] = -100
    return x, y


# --------------------------------------------------------------------------------------
# mixed precision
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", HEADS + ["opl"])
@pytest.mark.parametrize("backward_inside", [True, False])
@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16])
def test_bf16_autocast_forward_and_backward_equal_float32(name, backward_inside, input_dtype):
    torch.manual_seed(0)
    module = _make(name)
    x, y = _batch(1)
    x = x.to(input_dtype)

    def run(inp):
        if name == "partial_fc":
            module._generator = None  # the same draw in both runs
        module.zero_grad()
        return module(inp, y)

    ref_x = x.detach().float().requires_grad_(True)
    ref = run(ref_x)
    ref.backward()
    ref_grads = [ref_x.grad] + [p.grad.clone() for p in module.parameters()]
    ac_x = x.detach().clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(ac_x)
        if backward_inside:
            out.backward()
    if not backward_inside:
        out.backward()
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-7)
    grads = [ac_x.grad] + [p.grad for p in module.parameters()]
    assert ac_x.grad.dtype == input_dtype  # gradients in each input's own dtype
    for p in module.parameters():
        assert p.grad.dtype == p.dtype
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a.float(), b.to(a.dtype).float(), rtol=1e-6, atol=1e-7)
    if hasattr(module, "logits"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = module.logits(x)
        assert z.dtype == torch.float32
        torch.testing.assert_close(z, module.logits(x.float()), rtol=1e-6, atol=1e-6)


def test_linear_cross_entropy_logits_are_float32_under_autocast():
    """The chunked path used to compute its logits in bfloat16 under autocast (errors ~4e-3)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(16, 32, generator=g)
    w = torch.randn(50, 32, generator=g)
    y = torch.randint(0, 50, (16,), generator=g)
    ref = F.cross_entropy(x.double() @ w.double().T, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = losses.linear_cross_entropy(x, y, w, chunk_size=7)
    assert abs(out.item() - ref.item()) < 1e-5 * abs(ref.item())


# --------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------

FUNCTION_OF = {"margin_softmax": "margin_softmax_loss", "cosine_softmax": "margin_softmax_loss",
               "partial_fc": "partial_fc_loss", "linear_cross_entropy": "linear_cross_entropy",
               "wcdas": "wcdas_loss", "nbc_softmax": "nbc_softmax_loss"}


@pytest.mark.parametrize("name", HEADS)
def test_wrong_embedding_width_names_embeddings_and_embedding_dim(name):
    module = _make(name)
    cls = type(module).__name__
    x = torch.randn(3, 7)
    with pytest.raises(ValueError, match=rf"^{FUNCTION_OF[name]}: embeddings must have shape \(N, 8\) to match "
                                         rf"{cls}\(embedding_dim=8\) \(got shape \(3, 7\)\); build the head with "
                                         r"embedding_dim=7"):
        module(x, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=rf"^{cls}\.logits: embeddings must have shape \(N, 8\)"):
        module.logits(x)


@pytest.mark.parametrize("name", HEADS)
def test_one_class_softmax_head_is_an_error(name):
    cls = type(_make(name)).__name__
    with pytest.raises(ValueError, match=rf"^{cls}: num_classes must be >= 2 for a softmax over classes.*"
                                         r"\(got 1\); .*bce_with_logits"):
        _make(name, num_classes=1)
    x = torch.randn(3, 4)
    y = torch.zeros(3, dtype=torch.long)
    w = torch.randn(1, 4)
    fn = FUNCTION_OF[name]
    args = {"wcdas_loss": (x, y, w, torch.zeros(1), 2.0)}.get(fn, (x, y, w))
    with pytest.raises(ValueError, match=rf"^{fn}: weight.shape\[0\] \(the number of classes [CK]\) must be >= 2"):
        getattr(losses, fn)(*args)
    # two classes are fine
    w2 = torch.randn(2, 4)
    args = {"wcdas_loss": (x, y, w2, torch.zeros(2), 2.0)}.get(fn, (x, y, w2))
    assert torch.isfinite(getattr(losses, fn)(*args))


# --------------------------------------------------------------------------------------
# float64 exactness
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
@pytest.mark.parametrize("kw", [{}, {"variant": "reference"}, {"neg_term": "mean"}])
def test_opl_ignore_index_is_exact_in_float64(scale, kw):
    g = torch.Generator().manual_seed(3)
    f = (torch.randn(9, 4, generator=g, dtype=torch.float64) * scale).requires_grad_(True)
    y = torch.tensor([0, 1, -100, 1, 0, 2, -100, 2, 0])
    out = losses.opl_loss(f, y, **kw)
    ref = opl_oracle(f, y, **kw)[0]
    assert abs(out.item() - ref.item()) <= 1e-12 * abs(ref.item())
    keep = y != -100
    f2 = f.detach()[keep].clone().requires_grad_(True)
    red = losses.opl_loss(f2, y[keep], **kw)
    assert abs(out.item() - red.item()) <= 1e-12 * abs(red.item())
    (g1,) = torch.autograd.grad(out, f)
    (g2,) = torch.autograd.grad(red, f2)
    assert torch.all(g1[~keep] == 0)
    torch.testing.assert_close(g1[keep], g2, rtol=1e-12, atol=1e-12 / scale)


def test_wcdas_trainable_scale_is_exact_in_float64():
    """s = 1 + softplus(s_hat) has no linear cut-off above 20."""
    head = losses.WCDASLoss(4, 3).double()
    with torch.no_grad():
        head.scale_logit.fill_(20.5)
    s = head.effective_scale()
    expected = 1.0 + 20.5 + math.log1p(math.exp(-20.5))
    assert s.item() == pytest.approx(expected, rel=1e-15)
    (gs,) = torch.autograd.grad(s, head.scale_logit)
    assert gs.item() == pytest.approx(1.0 / (1.0 + math.exp(-20.5)), rel=1e-15)


# --------------------------------------------------------------------------------------
# resumable sampling (Partial FC)
# --------------------------------------------------------------------------------------


def _roundtrip(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_partial_fc_resume_draws_what_the_uninterrupted_run_draws():
    def make():
        torch.manual_seed(11)
        return losses.PartialFCLoss(8, 40, sample_rate=0.25, seed=5).double()

    g = torch.Generator().manual_seed(12)
    batches = [(torch.randn(4, 8, generator=g, dtype=torch.float64), torch.randint(0, 40, (4,), generator=g))
               for _ in range(6)]
    k = 2
    full = make()
    uninterrupted = []
    for x, y in batches:
        loss = full(x, y)
        uninterrupted.append((loss.detach(), full.last_index.clone()))
    first = make()
    for x, y in batches[:k]:
        first(x, y)
    sd = _roundtrip(first.state_dict())
    assert set(sd) == {"weight", "_extra_state"}
    resumed = make()
    resumed.load_state_dict(sd)
    for (x, y), (loss, idx) in zip(batches[k:], uninterrupted[k:]):
        out = resumed(x, y)
        assert torch.equal(resumed.last_index, idx) and torch.equal(out.detach(), loss)
    # without the state a fresh module would sample other classes
    fresh = make()
    fresh.load_state_dict({"weight": sd["weight"]})  # an older checkpoint: still loads, strict
    draws = []
    for x, y in batches[k:]:
        fresh(x, y)
        draws.append(fresh.last_index.clone())
    assert any(not torch.equal(a, b[1]) for a, b in zip(draws, uninterrupted[k:]))
    # ... and starts from the seed, as a new module does
    assert torch.equal(draws[0], _first_draw(make, batches[k]))


def _first_draw(make, batch):
    m = make()
    m(*batch)
    return m.last_index.clone()


# --------------------------------------------------------------------------------------
# ignored rows are dropped before any arithmetic
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", HEADS + ["opl"])
@pytest.mark.parametrize("case", ["all", "some"])
def test_ignored_rows_with_inf_and_nan_never_reach_the_gradients(name, case):
    """validation(False): ignored rows may hold +-inf/NaN; the loss equals the loss of the other
    rows, and every gradient is finite (exactly 0 on the ignored rows)."""
    torch.manual_seed(4)
    module = _make(name).double()
    x, _ = _batch(5, n=5)
    x = x.double()
    y = torch.tensor([-100, -100, -100, 2, 0]) if case == "some" else torch.full((5,), -100)
    dirty = x.clone()
    dirty[0, 0], dirty[1, 1], dirty[2, 2] = math.inf, -math.inf, math.nan
    dirty.requires_grad_(True)
    clean = x.clone()
    clean[:3] = 0.0
    clean.requires_grad_(True)
    outs, grads = [], []
    for inp in (dirty, clean):
        if name == "partial_fc":
            module._generator = None
        module.zero_grad()
        with losses.validation(False):
            out = module(inp, y)
        out.backward()
        outs.append(out.detach())
        grads.append([inp.grad] + [p.grad.clone() for p in module.parameters()])
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    assert torch.all(grads[0][0][:3] == 0)
    for a, b in zip(grads[0], grads[1]):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    if case == "all":
        assert outs[0].item() == 0.0


@pytest.mark.parametrize("cls", [losses.MarginSoftmaxLoss, losses.PartialFCLoss, losses.WCDASLoss,
                                 losses.NBCSoftmaxLoss, losses.LinearCrossEntropyLoss])
def test_sizes_wrong_kind_is_type_error_wrong_value_is_value_error(cls):
    name = cls.__name__
    for bad in (8.0, "8", None, True):
        with pytest.raises(TypeError, match=rf"^{name}: embedding_dim must be a positive int"):
            cls(bad, 5)
        with pytest.raises(TypeError, match=rf"^{name}: num_classes must be a positive int"):
            cls(8, bad)
    with pytest.raises(ValueError, match=rf"^{name}: embedding_dim must be a positive int \(got 0\)"):
        cls(0, 5)


def test_chunk_size_and_nbc_num_classes_kinds():
    x, y, w = torch.randn(3, 4), torch.tensor([0, 1, 2]), torch.randn(5, 4)
    with pytest.raises(TypeError, match=r"^linear_cross_entropy: chunk_size must be a positive int"):
        losses.linear_cross_entropy(x, y, w, chunk_size=2.0)
    with pytest.raises(ValueError, match=r"^linear_cross_entropy: chunk_size must be a positive int or None \(got 0\)"):
        losses.linear_cross_entropy(x, y, w, chunk_size=0)
    with pytest.raises(TypeError, match=r"^nbc_loss: num_classes must be a positive int"):
        losses.nbc_loss(x, y, num_classes=5.0)


def test_generator_state_from_an_unavailable_device_falls_back_to_the_seed():
    m = losses.PartialFCLoss(4, 10, sample_rate=0.5, seed=1)
    m(torch.randn(3, 4), torch.tensor([0, 1, 2]))
    sd = m.state_dict()
    assert sd["_extra_state"]["seed"] == 1 and sd["_extra_state"]["generator_device"] == "cpu"
    fresh = losses.PartialFCLoss(4, 10, sample_rate=0.5, seed=1)
    if torch.cuda.is_available():  # the state then loads on its device (covered by the CUDA run)
        return
    sd["_extra_state"] = dict(sd["_extra_state"], generator_device="cuda:0")
    with pytest.warns(UserWarning, match=r"^PartialFCLoss: the saved generator lives on 'cuda:0'"):
        fresh.load_state_dict(sd)
    assert fresh._generator is None
    with pytest.raises(ValueError, match=r"^PartialFCLoss: state_dict entry '_extra_state' is not a generator state"):
        fresh.load_state_dict({"weight": sd["weight"], "_extra_state": 3})
