"""Partial FC on one process (docs/losses/partial_fc.md): sampling, equality with margin softmax, the loop
oracle on the sampled centres, gradcheck, determinism, errors. The sharded form is tested on gloo
processes in ``test_partial_fc_distributed.py``."""

from __future__ import annotations

import copy
import math
import pickle
import re

import pytest
import torch

import losses
from tests.embedding.test_margin_softmax import PAPER_CONFIGS, REFERENCE_CONFIGS, _inputs, oracle
from tests._helpers.rows import EMBEDDINGS, HEAD_KWARGS, entry

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_ENTRIES = {
    "partial_fc": entry("partial_fc_loss", "PartialFCLoss", EMBEDDINGS, unit="row", owns_head=True,
          example={**HEAD_KWARGS, "sample_rate": 0.5, "seed": 0}),
}
EXPECTED_HELPERS = ("margin_logits",)

ALL_CONFIGS = {**PAPER_CONFIGS, **REFERENCE_CONFIGS}


def _call(x, w, y, **kw):
    kw = dict(kw)
    thr = kw.pop("threshold", 0.0)
    return losses.partial_fc_loss(x, y, w, interclass_filtering_threshold=thr, **kw)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("name", list(ALL_CONFIGS))
def test_rate_one_equals_margin_softmax(name, reduction):
    """docs/losses/partial_fc.md: sample_rate = 1.0 equals margin_softmax_loss (values and gradients)."""
    kw = ALL_CONFIGS[name]
    x, w, y = _inputs(6, 7, 3, seed=2)
    y[3] = -100
    xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    got = _call(xs, ws, y, sample_rate=1.0, reduction=reduction, **kw)
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    thr = kw.get("threshold", 0.0)
    ref = losses.margin_softmax_loss(xr, y, wr, interclass_filtering_threshold=thr, reduction=reduction,
                                     **{k: v for k, v in kw.items() if k != "threshold"})
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-12)
    for a, b in zip(torch.autograd.grad(got.sum(), (xs, ws)), torch.autograd.grad(ref.sum(), (xr, wr))):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-12)


def test_rate_one_equals_margin_softmax_float32_module():
    torch.manual_seed(0)
    module = losses.PartialFCLoss(16, 40, sample_rate=1.0)
    x, y = torch.randn(8, 16), torch.randint(0, 40, (8,))
    ref = losses.margin_softmax_loss(x, y, module.weight)
    torch.testing.assert_close(module(x, y), ref, rtol=1e-6, atol=1e-6)
    assert module.last_index.tolist() == list(range(40))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("name", ["arcface", "combined", "filtered", "ref_arcface"])
def test_matches_loop_oracle_on_the_sampled_centres(name, reduction):
    """The loss with a fixed index is the oracle's margin softmax on weight[I] with labels remapped."""
    kw = ALL_CONFIGS[name]
    x, w, _ = _inputs(5, 11, 3, seed=3)
    y = torch.tensor([9, 2, 2, -100, 5])
    index = torch.tensor([0, 2, 5, 7, 9, 10])
    remap = torch.tensor([int((index == t).nonzero()) if t >= 0 else -100 for t in y.tolist()])
    xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    got = _call(xs, ws, y, index=index, reduction=reduction, scale=16.0, **kw)
    xo, wo = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    expected = oracle(xo, wo[index], remap, reduction, scale=16.0, **kw)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    gx, gw = torch.autograd.grad(got.sum(), (xs, ws))
    ex, ew = torch.autograd.grad(expected.sum(), (xo, wo))
    torch.testing.assert_close(gx, ex, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(gw, ew, rtol=1e-8, atol=1e-10)
    unsampled = [c for c in range(11) if c not in index.tolist()]
    assert torch.all(gw[unsampled] == 0), "unsampled centres get zero gradient"


@pytest.mark.parametrize("shape", [(1, 3, 4), (3, 5, 2)])
@pytest.mark.parametrize("name", ["arcface", "cosface", "combined"])
def test_gradcheck_embeddings_and_centres(name, shape):
    from tests.embedding.test_margin_softmax import _inputs_with_target_cos

    n, c, d = shape
    x, w, y = _inputs_with_target_cos(n, c, d, seed=11)
    index = torch.unique(torch.cat([y, torch.tensor([c - 1])]))
    x.requires_grad_(True)
    w.requires_grad_(True)
    kw = ALL_CONFIGS[name]
    assert torch.autograd.gradcheck(
        lambda a, b: _call(a, b, y, index=index, reduction="none", scale=3.0, **kw), (x, w))


@pytest.mark.parametrize("name", ["arcface", "cosface"])
def test_every_class_chosen_uses_the_centres_in_place(name):
    """When the chosen classes are all C (rate 1.0, or a batch whose positives cover every class) the
    centres are used without a gather; values and gradients still match an explicit gather, and
    gradients accumulate into ``weight.grad`` across calls."""
    from tests.embedding.test_margin_softmax import _inputs_with_target_cos

    x, w, y = _inputs_with_target_cos(4, 3, 5, seed=3)
    y = torch.tensor([0, 1, 2, 1])  # positives cover every class: chosen = all three even at rate 0.1
    kw = ALL_CONFIGS[name]
    x.requires_grad_(True)
    w.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: _call(a, b, y, sample_rate=0.1, scale=3.0, **kw), (x, w))
    got = _call(x, w, y, sample_rate=0.1, **kw)
    gathered = w.index_select(0, torch.arange(3))  # the gather the in-place path skips
    ref = losses.margin_softmax_loss(x, y, gathered, **kw)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(got, (x, w)), torch.autograd.grad(ref, (x, w))):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    module = losses.PartialFCLoss(5, 3, sample_rate=1.0, seed=0).double()
    xm = x.detach()
    module(xm, y).backward()
    once = module.weight.grad.clone()
    module(xm, y).backward()
    torch.testing.assert_close(module.weight.grad, 2 * once)


@pytest.mark.parametrize("num_classes, rate, labels", [
    (20, 0.3, [0, 0, 5, 19]),         # k = 6 > |P| = 3
    (20, 0.1, [1, 2, 3, 4, 5]),       # k = 2 < |P| = 5: only positives
    (20, 0.15, [7, 8, 9]),            # k = |P| = 3
    (5, 0.1, [3, 3]),                 # k = 0: only positives
    (50, 1.0, [10]),                  # everything
    (1000, 0.01, [999, 0, -100, 500]),
])
def test_index_holds_positives_and_has_size_max_k_p(num_classes, rate, labels):
    """docs/losses/partial_fc.md: I contains every positive and |I| = max(k, |P|); sorted, unique, in range."""
    torch.manual_seed(0)
    module = losses.PartialFCLoss(4, num_classes, sample_rate=rate, seed=1)
    y = torch.tensor(labels)
    x = torch.randn(len(labels), 4)
    k = int(rate * num_classes)
    positives = {t for t in labels if t != -100}
    for _ in range(3):
        module(x, y)
        ids = module.last_index.tolist()
        assert ids == sorted(set(ids))
        assert all(0 <= i < num_classes for i in ids)
        assert positives <= set(ids)
        assert len(ids) == max(k, len(positives))


def test_labels_are_remapped_to_positions_in_index():
    """The loss over I equals margin softmax on weight[I] with remapped labels (two routes)."""
    x, w, _ = _inputs(4, 30, 5, seed=4)
    y = torch.tensor([29, 3, 3, 17])
    module = losses.PartialFCLoss(5, 30, sample_rate=0.2, seed=5).double()
    with torch.no_grad():
        module.weight.copy_(w)
    loss = module(x, y)
    index = module.last_index
    remap = torch.searchsorted(index, y)
    assert torch.equal(index[remap], y)
    torch.testing.assert_close(loss, losses.margin_softmax_loss(x, remap, w[index]), rtol=1e-12, atol=0)


def test_sampling_is_uniform_over_non_positives():
    """Each non-positive class is drawn with probability (k - |P|) / (C - |P|)."""
    C, k, draws = 12, 5, 1200
    g = torch.Generator().manual_seed(0)
    y = torch.tensor([0, 4, 4])
    counts = torch.zeros(C)
    from losses.embedding.partial_fc import _partial_fc

    x, w = torch.randn(3, 2), torch.randn(C, 2)
    for _ in range(draws):
        _, index = _partial_fc("partial_fc_loss", x, y, w, sample_rate=k / C, scale=1.0, margin=(1.0, 0.0, 0.0),
                               variant="paper", interclass_filtering_threshold=0.0, index=None, generator=g,
                               ignore_index=-100, reduction="mean")
        counts[index] += 1
    assert counts[0] == draws and counts[4] == draws
    p = (k - 2) / (C - 2)
    others = counts[[c for c in range(C) if c not in (0, 4)]] / draws
    sigma = math.sqrt(p * (1 - p) / draws)
    assert torch.all((others - p).abs() < 5 * sigma), others


def test_determinism_with_generator_and_seed():
    """determinism, docs/conventions.md: same generator seed / module seed -> same draws and loss; copies continue the stream."""
    x, w, _ = _inputs(4, 50, 3, seed=6)
    y = torch.tensor([1, 2, 3, 4])

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return [losses.partial_fc_loss(x, y, w, sample_rate=0.2, generator=g) for _ in range(3)]

    a, b, c = run(0), run(0), run(1)
    for u, v in zip(a, b):
        assert torch.equal(u, v)
    assert any(not torch.equal(u, v) for u, v in zip(a, c))

    def module_indices(module, steps=3):
        out = []
        for _ in range(steps):
            module(x, y)
            out.append(module.last_index.clone())
        return out

    torch.manual_seed(0)
    m1 = losses.PartialFCLoss(3, 50, sample_rate=0.2, seed=7).double()
    m2 = copy.deepcopy(m1)
    first, second = module_indices(m1), module_indices(m2)
    assert all(torch.equal(u, v) for u, v in zip(first, second))
    assert len({tuple(i.tolist()) for i in first}) > 1, "the stream advances between calls"
    # mid-stream copies (deepcopy and pickle) reproduce the next draws
    copies = [copy.deepcopy(m1), pickle.loads(pickle.dumps(m1))]
    nxt = module_indices(m1, 2)
    for other in copies:
        assert all(torch.equal(u, v) for u, v in zip(module_indices(other, 2), nxt))
    # the same seed in a fresh module restarts the stream; the global RNG is untouched by seeded draws
    m3 = losses.PartialFCLoss(3, 50, sample_rate=0.2, seed=7).double()
    state = torch.get_rng_state()
    assert all(torch.equal(u, v) for u, v in zip(module_indices(m3), first))
    assert torch.equal(torch.get_rng_state(), state)


def test_unseeded_module_uses_global_rng():
    x, y = torch.randn(2, 3), torch.tensor([0, 1])
    module = losses.PartialFCLoss(3, 40, sample_rate=0.25)
    torch.manual_seed(3)
    module(x, y)
    first = module.last_index.clone()
    torch.manual_seed(3)
    module(x, y)
    assert torch.equal(module.last_index, first)


def test_all_ignored_is_attached_zero_and_does_not_draw():
    x, w, _ = _inputs(3, 6, 2, seed=0)
    xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    for reduction in ("mean", "sum"):
        out = losses.partial_fc_loss(xs, torch.full((3,), -100), ws, sample_rate=0.5, generator=g,
                                     reduction=reduction)
        assert out.item() == 0.0 and out.grad_fn is not None
        gx, gw = torch.autograd.grad(out, (xs, ws))
        assert torch.all(gx == 0) and torch.all(gw == 0)
    none = losses.partial_fc_loss(xs, torch.full((3,), -100), ws, reduction="none")
    assert none.shape == (3,) and torch.all(none == 0)
    assert torch.equal(g.get_state(), state)


def test_empty_batch_and_one_class_batch():
    x, w, _ = _inputs(4, 6, 3, seed=1)
    out = losses.partial_fc_loss(x[:0], torch.zeros(0, dtype=torch.long), w)
    assert out.item() == 0.0
    y = torch.full((4,), 5)
    torch.testing.assert_close(losses.partial_fc_loss(x, y, w, index=torch.tensor([1, 5])),
                               losses.margin_softmax_loss(x, torch.ones(4, dtype=torch.long), w[[1, 5]]))


def test_module_logits_and_repr():
    torch.manual_seed(0)
    module = losses.PartialFCLoss(4, 9, sample_rate=0.5, scale=8.0, seed=2)
    x = torch.randn(3, 4)
    expected = 8.0 * torch.nn.functional.normalize(x, dim=1) @ torch.nn.functional.normalize(
        module.weight.detach(), dim=1).T
    torch.testing.assert_close(module.logits(x).detach(), expected)
    assert module.logits(x).shape == (3, 9)
    r = repr(module)
    for part in ("PartialFCLoss(", "embedding_dim=4", "num_classes=9", "sample_rate=0.5", "scale=8.0",
                 "margin=(1.0, 0.5, 0.0)", "variant='paper'", "seed=2", "distributed=False"):
        assert part in r
    assert module.ddp_ignored_parameters() == []
    assert float(module.weight.detach().std()) == pytest.approx(0.01, rel=0.5)


def test_distributed_flag_without_process_group_is_single_process():
    torch.manual_seed(0)
    plain = losses.PartialFCLoss(4, 9, sample_rate=0.5, seed=2)
    dist_mod = losses.PartialFCLoss(4, 9, sample_rate=0.5, seed=2, distributed=True)
    dist_mod.load_state_dict(plain.state_dict())
    x, y = torch.randn(3, 4), torch.tensor([0, 4, 8])
    torch.testing.assert_close(dist_mod(x, y), plain(x, y), rtol=0, atol=0)
    assert dist_mod.weight.shape == (9, 4)
    assert dist_mod.ddp_ignored_parameters()[0] is dist_mod.weight
    assert dist_mod.state_dict()["weight"].shape == (9, 4)


# --------------------------------------------------------------------------------------
# errors and the validation switch
# --------------------------------------------------------------------------------------


def test_label_range_error_message_is_exact():
    x = torch.randn(3, 2)
    w = torch.randn(1000, 2)
    msg = ("partial_fc_loss: target has class ids outside [0, 1000) (got min=-3, max=1000); "
           "check num_classes or set ignore_index")
    with pytest.raises(ValueError, match="^" + re.escape(msg) + "$"):
        losses.partial_fc_loss(x, torch.tensor([-3, 5, 1000]), w)
    module = losses.PartialFCLoss(2, 1000)
    with pytest.raises(ValueError, match="^" + re.escape(msg) + "$"):
        module(x, torch.tensor([-3, 5, 1000]))


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5, float("nan"), float("inf")])
def test_sample_rate_outside_unit_interval(rate):
    x, w, y = _inputs(3, 5, 2, seed=0)
    with pytest.raises(ValueError, match=r"^partial_fc_loss: sample_rate must be finite and satisfy sample_rate > 0"):
        losses.partial_fc_loss(x, y, w, sample_rate=rate)
    with pytest.raises(ValueError, match=r"^PartialFCLoss: sample_rate must be finite"):
        losses.PartialFCLoss(2, 5, sample_rate=rate)


@pytest.mark.parametrize("index, pattern, exc", [
    (torch.tensor([3, 1, 4]), r"index must be sorted and unique", ValueError),
    (torch.tensor([1, 1, 3, 4]), r"index must be sorted and unique", ValueError),
    (torch.tensor([1, 3, 4, 9]), r"index has class ids outside \[0, 6\) \(got min=1, max=9\)", ValueError),
    (torch.tensor([-1, 1, 3, 4]), r"index has class ids outside \[0, 6\)", ValueError),
    (torch.tensor([1, 4]), r"index must contain every positive class of the batch \(got missing \[3\]\)", ValueError),
    (torch.tensor([[1, 3, 4]]), r"index must be a 1-D tensor", ValueError),
    (torch.tensor([1.0, 3.0, 4.0]), r"index must hold integer class ids", TypeError),
])
def test_bad_index(index, pattern, exc):
    x, w, _ = _inputs(3, 6, 2, seed=0)
    y = torch.tensor([1, 3, 4])
    with pytest.raises(exc, match=r"^partial_fc_loss: " + pattern):
        losses.partial_fc_loss(x, y, w, index=index)


def test_validation_switch_turns_off_only_data_checks():
    x, w, _ = _inputs(3, 6, 2, seed=0)
    y = torch.tensor([1, 3, 4])
    nan_x = x.clone()
    nan_x[0, 0] = float("nan")
    with losses.validation(False):
        losses.partial_fc_loss(x, y, w, index=torch.tensor([4, 3, 1]))  # unsorted: unchecked
        losses.partial_fc_loss(x, y, w, index=torch.tensor([1, 3]))  # missing positive: unchecked
        losses.partial_fc_loss(nan_x, y, w)
        with pytest.raises(ValueError, match="sample_rate"):
            losses.partial_fc_loss(x, y, w, sample_rate=2.0)
        with pytest.raises(ValueError, match="index must be a 1-D tensor"):
            losses.partial_fc_loss(x, y, w, index=torch.tensor([[1, 3, 4]]))
    with pytest.raises(ValueError, match=r"^partial_fc_loss: embeddings contains NaN"):
        losses.partial_fc_loss(nan_x, y, w)
    inf_w = w.clone()
    inf_w[3, 1] = float("inf")
    with pytest.raises(ValueError, match=r"^partial_fc_loss: weight contains NaN or infinite values"):
        losses.partial_fc_loss(x, y, inf_w, sample_rate=1.0)


def test_bad_constructor_arguments():
    with pytest.raises(TypeError, match=r"^PartialFCLoss: seed must be an int or None"):
        losses.PartialFCLoss(2, 5, seed=1.5)
    with pytest.raises(ValueError, match=r"^PartialFCLoss: embedding_dim must be a positive int"):
        losses.PartialFCLoss(0, 5)
    with pytest.raises(ValueError, match=r"^PartialFCLoss: variant='reference' supports only"):
        losses.PartialFCLoss(2, 5, variant="reference", margin=(1.0, 0.3, 0.2))
    with pytest.raises(ValueError, match=r"^partial_fc_loss: target must have shape \(3,\)"):
        losses.PartialFCLoss(2, 5)(torch.randn(3, 2), torch.tensor([0, 1]))
    with pytest.raises(TypeError, match=r"^partial_fc_loss: target must hold integer class ids"):
        losses.PartialFCLoss(2, 5)(torch.randn(3, 2), torch.tensor([0.0, 1.0, 2.0]))


# ----------------------------------------------------------------------------------------------
# sparse_grad: the centres' gradient holds the sampled rows only
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("rate", [0.3, 1.0])
@pytest.mark.parametrize("name", ["arcface", "cosface", "ref_arcface"])
def test_sparse_grad_equals_the_dense_gradient(name, rate, reduction):
    """The same loss and embedding gradient; the centres' gradient is sparse, its rows are exactly
    the sampled ids, and densified it equals the dense gradient (float64)."""
    kw = ALL_CONFIGS[name]
    x, w, y = _inputs(7, 11, 3, seed=4)
    y[2] = -100
    out = {}
    for sparse in (False, True):
        xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        g = torch.Generator().manual_seed(5)
        loss = _call(xs, ws, y, sample_rate=rate, generator=g, reduction=reduction, sparse_grad=sparse, **kw)
        (loss.sum()).backward()
        out[sparse] = (loss.detach(), xs.grad, ws.grad)
    (l0, gx0, gw0), (l1, gx1, gw1) = out[False], out[True]
    torch.testing.assert_close(l1, l0, rtol=0, atol=0)
    torch.testing.assert_close(gx1, gx0, rtol=1e-12, atol=1e-15)
    assert not gw0.is_sparse and gw1.is_sparse and gw1.shape == w.shape
    torch.testing.assert_close(gw1.to_dense(), gw0, rtol=1e-12, atol=1e-15)
    g = torch.Generator().manual_seed(5)
    m = losses.PartialFCLoss(3, 11, sample_rate=rate, sparse_grad=True, **{k: v for k, v in kw.items()
                                                                           if k != "threshold"})
    m.double()._generator = g
    m.load_state_dict({"weight": w})
    m(x, y).backward()
    rows = m.weight.grad.coalesce().indices()[0]
    assert torch.equal(rows, m.last_index) and m.weight.grad.coalesce().values().shape == (rows.numel(), 3)


def test_sparse_grad_with_sparse_adam_moves_only_the_sampled_centres():
    """With SparseAdam an unsampled centre is not moved at all; with plain SGD (no momentum, no
    weight decay) sparse and dense gradients give the same step."""
    torch.manual_seed(0)
    x, y = torch.randn(6, 8), torch.tensor([0, 4, 4, 9, 17, 17])
    head = losses.PartialFCLoss(8, 40, sample_rate=0.25, seed=1, sparse_grad=True)
    before = head.weight.detach().clone()
    opt = torch.optim.SparseAdam(head.parameters(), lr=0.01)
    moved = torch.zeros(40, dtype=torch.bool)
    for _ in range(3):
        opt.zero_grad()
        head(x, y).backward()
        moved[head.last_index] = True
        opt.step()
    changed = (head.weight.detach() != before).any(dim=1)
    assert torch.equal(changed, moved) and moved.sum() < 40 and moved[[0, 4, 9, 17]].all()

    weights = {}
    for sparse in (False, True):
        h = losses.PartialFCLoss(8, 40, sample_rate=0.25, seed=2, sparse_grad=sparse)
        h.load_state_dict({"weight": before})
        sgd = torch.optim.SGD(h.parameters(), lr=0.5)
        for _ in range(2):
            sgd.zero_grad()
            h(x, y).backward()
            sgd.step()
        weights[sparse] = h.weight.detach()
    torch.testing.assert_close(weights[True], weights[False], rtol=1e-6, atol=1e-7)


def test_sparse_grad_without_valid_rows_is_an_empty_sparse_gradient():
    x, w, _ = _inputs(3, 6, 2, seed=0)
    xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    out = losses.partial_fc_loss(xs, torch.full((3,), -100), ws, sample_rate=0.5, sparse_grad=True)
    assert out.item() == 0.0 and out.grad_fn is not None
    out.backward()
    assert ws.grad.is_sparse and ws.grad.coalesce().values().numel() == 0 and torch.all(xs.grad == 0)


def test_sparse_grad_must_be_a_bool():
    x, w, y = _inputs(3, 6, 2, seed=0)
    with pytest.raises(TypeError, match="sparse_grad"):
        losses.partial_fc_loss(x, y, w, sparse_grad="yes")
    with pytest.raises(TypeError, match="sparse_grad"):
        losses.PartialFCLoss(2, 6, sparse_grad=1)


def test_sparse_grad_under_autocast_and_torch_compile():
    """bf16 autocast: the loss in float32 and a finite sparse gradient; inductor-compiled (data checks
    off, a fixed index): the value and the sparse gradient of eager."""
    import warnings

    torch.manual_seed(0)
    x, y = torch.randn(8, 16), torch.randint(0, 200, (8,))
    m = losses.PartialFCLoss(16, 200, sample_rate=0.2, seed=0, sparse_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(x, y)
    out.backward()
    assert out.dtype == torch.float32 and m.weight.grad.is_sparse
    assert torch.isfinite(m.weight.grad.coalesce().values()).all()
    index = m.last_index
    torch._dynamo.reset()
    with losses.validation(False), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = m(x, y, index=index)
        g_eager = torch.autograd.grad(eager, m.weight)[0]
        compiled = torch.compile(m, backend="inductor")
        got = compiled(x, y, index=index)
        g_got = torch.autograd.grad(got, m.weight)[0]
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
    assert g_got.is_sparse
    torch.testing.assert_close(g_got.to_dense(), g_eager.to_dense(), rtol=1e-4, atol=1e-4)
