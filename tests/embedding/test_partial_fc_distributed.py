"""Model-parallel Partial FC (``distributed=True``) on real gloo processes (docs/conventions.md "Distributed",
docs/losses/partial_fc.md): the sharded loss and gradients against the single-process loss on the concatenated batch.

Everything runs in one 2-process gloo launch (spawning is the slow part): the worker records its
results and the tests below compare them with single-process computations in the parent.
"""

from __future__ import annotations

import pytest
import torch

import losses
from losses.embedding.partial_fc import shard_range
from tests.dist_utils import run_gloo

C, D, N_PER_RANK, WORLD, SCALE = 9, 4, 5, 2, 4.0  # shards [0, 5) and [5, 9)

CONFIGS = {
    "paper": dict(),
    "reference": dict(variant="reference", margin=(1.0, 0.5, 0.0)),
    "combined_filtered": dict(margin=(1.1, 0.2, 0.05), interclass_filtering_threshold=0.3),
}
#: positives of Y: {0, 1, 3, 5, 6, 8}; the shared index adds 2 and leaves out 4 and 7
INDEX = torch.tensor([0, 1, 2, 3, 5, 6, 8])
Y_SHARD0 = torch.tensor([0, 3, 3, 1, -100, 1, 0, 0, 3, 4])
PROJ = torch.eye(D, dtype=torch.float64) + 0.1 * torch.arange(D * D, dtype=torch.float64).reshape(D, D) / (D * D)
INDEX_SHARD0 = torch.tensor([0, 1, 3, 4])


def _data():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(WORLD * N_PER_RANK, D, generator=g, dtype=torch.float64)
    w = torch.randn(C, D, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 3, 8, 8, -100, 1, 5, 6, 3, 0])  # both shards, repeats, one ignored row
    return x, w, y


def _backward(module, x, y, reduction, **kw):
    xr = x.clone().requires_grad_(True)
    module.reduction = reduction
    module.zero_grad()
    out = module(xr, y, **kw)
    (out.sum() if reduction == "none" else out).backward()
    return out.detach(), xr.grad, module.weight.grad.clone()


def _worker(rank, world_size, payload):
    torch.manual_seed(100 + rank)  # ranks' global RNGs differ, as in real jobs
    x_full, y_full = payload["x"], payload["y"]
    rows = slice(rank * N_PER_RANK, (rank + 1) * N_PER_RANK)
    x, y = x_full[rows], y_full[rows]
    res = {}

    def make(**kw):
        m = losses.PartialFCLoss(D, C, distributed=True, scale=SCALE, **kw).double()
        m.load_state_dict(payload["single_state"])  # a world-size-1 checkpoint
        return m

    def make_replicated(**kw):
        m = losses.PartialFCLoss(D, C, scale=SCALE, sample_rate=1.0, **kw).double()
        m.load_state_dict(payload["single_state"])
        return m

    for name, kw in CONFIGS.items():
        for reduction in ("mean", "sum", "none"):
            res[(name, reduction)] = _backward(make(sample_rate=1.0, **kw), x, y, reduction)
    # sparse_grad: the shard's gradient is sparse and densifies to the dense sharded gradient
    out, gx, gw = _backward(make(sample_rate=1.0, sparse_grad=True), x, y, "mean")
    res["sparse"] = (out, gx, gw.is_sparse, gw.to_dense())
    m = make(sample_rate=1.0)
    res["shard_shape"] = tuple(m.weight.shape)
    res["ddp_ignored"] = [p is m.weight for p in m.ddp_ignored_parameters()]

    # a shared index at a low rate: equal to the single-process loss with that index
    m = make(sample_rate=0.1)
    res["index"] = _backward(m, x, y, "mean", index=INDEX)
    res["index_last"] = m.last_index.clone()

    # a shared index with no class on rank 1's shard (an empty local sample) and labels on shard 0 only
    m = make(sample_rate=0.1)
    res["empty_shard"] = _backward(m, x, payload["y_shard0"][rows], "mean", index=INDEX_SHARD0)
    # one class (the only way to have fewer classes than these 2 ranks) is a degenerate softmax:
    # ValueError on every rank, before any collective
    try:
        losses.PartialFCLoss(D, 1, distributed=True, scale=SCALE, sample_rate=1.0)
        res["one_class"] = None
    except ValueError as e:
        res["one_class"] = str(e)

    # per-shard sampling with a seed: positives first, max(floor(rate * n_r), |P_r|) classes
    draws = []
    for _ in range(2):
        m = make(sample_rate=0.75, seed=3)
        lasts = []
        for _ in range(4):
            m(x.clone().requires_grad_(True), torch.zeros_like(y) if rank == 0 else y)
            lasts.append(m.last_index.clone())
        draws.append(lasts)
    res["draws"] = draws

    # state_dict holds the full (C, D) weight in rank order; loading keeps this rank's rows
    m = make(sample_rate=1.0)
    with torch.no_grad():
        m.weight.add_(rank + 1.0)
    res["state_dict"] = m.state_dict()["weight"].clone()
    fresh = losses.PartialFCLoss(D, C, distributed=True).double()
    fresh.load_state_dict({"weight": res["state_dict"]})
    res["reloaded_shard"] = fresh.weight.detach().clone()
    res["logits"] = m.logits(x)

    # built before the process group existed (as under Lightning): shards on first use
    lazy = payload["lazy"]
    res["lazy_before"] = tuple(lazy.weight.shape)
    res["lazy"] = _backward(lazy, x, y, "mean")
    res["lazy_shard"] = lazy.weight.detach().clone()

    # every row ignored on every rank: an attached exact zero with zero gradients
    m = make(sample_rate=1.0)
    xr = x.clone().requires_grad_(True)
    out = m(xr, torch.full_like(y, -100))
    out.backward()
    res["ignored"] = (out.detach(), out.grad_fn is not None, xr.grad.clone(), m.weight.grad.clone())

    # data errors raise on every rank (checked on gathered data: no rank is left waiting)
    errors = {}
    m = make(sample_rate=1.0)
    for label, args in {
        "unequal": (x_full[: N_PER_RANK + rank], y_full[: N_PER_RANK + rank]),
        "range": (x, y if rank == 0 else torch.tensor([0, 1, 2, 3, 9])),
        "nan": (x if rank == 0 else torch.full_like(x, float("nan")), y),
    }.items():
        try:
            m(*args)
            errors[label] = None
        except ValueError as exc:
            errors[label] = str(exc)
    res["errors"] = errors

    # inside DistributedDataParallel: a projection averaged by DDP, the centres sparse
    from torch.nn.parallel import DistributedDataParallel as DDP

    def net(head):
        body = torch.nn.Linear(D, D, bias=False).double()
        with torch.no_grad():
            body.weight.copy_(payload["proj"])
        return torch.nn.ModuleDict({"body": body, "head": head})

    def ddp_step(model, ignore=()):
        class Step(torch.nn.Module):  # DDP runs forward(); the loss is the wrapped model's output
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, xb, yb):
                return self.m["head"](self.m["body"](xb), yb)

        step = Step()
        DDP._set_params_and_buffers_to_ignore_for_model(step, list(ignore))
        wrapped = DDP(step)
        try:
            wrapped(x.clone(), y).backward()
            return None
        except ValueError as exc:
            return str(exc)

    # replicated centres with a sparse gradient would fail deep inside DDP's reducer: a clear error instead
    res["ddp_replicated_sparse"] = ddp_step(net(make_replicated(sparse_grad=True)))
    # ... unless DDP leaves the centres alone (then no averaging happens and nothing is refused)
    res["ddp_replicated_sparse_ignored"] = ddp_step(net(make_replicated(sparse_grad=True)), ["m.head.weight"])
    # sharded centres (the shard ignored by DDP, as ddp_ignored_parameters says): one step works and
    # gives the single-process gradients: the shard's rows of the centres, the projection's full gradient
    model = net(make(sample_rate=1.0, sparse_grad=True))
    res["ddp_sharded_sparse"] = (ddp_step(model, ["m.head.weight"]), model["head"].weight.grad.is_sparse,
                                 model["head"].weight.grad.to_dense(), model["body"].weight.grad.clone())
    # a shard that DDP would average (not ignored) is refused too; equal shards (C = 8), since DDP
    # itself refuses to wrap parameters whose shapes differ across ranks
    even = losses.PartialFCLoss(D, 8, distributed=True, scale=SCALE, sample_rate=1.0, sparse_grad=True).double()
    res["ddp_sharded_not_ignored"] = ddp_step(net(even))
    return res


@pytest.fixture(scope="module")
def setup():
    x, w, y = _data()
    single = losses.PartialFCLoss(D, C).double()
    single.load_state_dict({"weight": w})
    lazy = losses.PartialFCLoss(D, C, distributed=True, scale=SCALE, sample_rate=1.0).double()
    lazy.load_state_dict({"weight": w})
    payload = {"x": x, "w": w, "y": y, "lazy": lazy, "single_state": single.state_dict(), "y_shard0": Y_SHARD0,
               "proj": PROJ}
    return (x, w, y), run_gloo(_worker, world_size=WORLD, payload=payload)


def _single(x, w, y, reduction, **kw):
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    if "index" in kw:
        out = losses.partial_fc_loss(xr, y, wr, scale=SCALE, reduction=reduction, **kw)
    else:
        out = losses.margin_softmax_loss(xr, y, wr, scale=SCALE, reduction=reduction, **kw)
    gx, gw = torch.autograd.grad(out.sum(), (xr, wr))
    return out.detach(), gx, gw


def _shard(rank):
    start, n = shard_range(C, WORLD, rank)
    return slice(start, start + n)


def _rows(rank):
    return slice(rank * N_PER_RANK, (rank + 1) * N_PER_RANK)


@pytest.mark.slow
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_sharded_loss_and_gradients_match_single_process(setup, name, reduction):
    (x, w, y), res = setup
    loss, gx, gw = _single(x, w, y, reduction, **CONFIGS[name])
    outs = [res[r][(name, reduction)] for r in range(WORLD)]
    if reduction != "none":
        assert torch.equal(outs[0][0], outs[1][0]), "identical on all ranks"
    for r, (out, grad_x, grad_w) in enumerate(outs):
        expected = loss[_rows(r)] if reduction == "none" else loss
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-10)
        # (c) the shard gets the single-process gradient of its rows
        torch.testing.assert_close(grad_w, gw[_shard(r)], rtol=1e-6, atol=1e-10)
        # (d) this rank's embeddings get world_size x their single-process gradient
        torch.testing.assert_close(grad_x, WORLD * gx[_rows(r)], rtol=1e-6, atol=1e-10)


@pytest.mark.slow
def test_sparse_grad_matches_the_dense_sharded_gradient(setup):
    _, results = setup
    for rank in range(WORLD):
        out, gx, is_sparse, gw = results[rank]["sparse"]
        d_out, d_gx, d_gw = results[rank][("paper", "mean")]
        assert is_sparse
        torch.testing.assert_close(out, d_out, rtol=0, atol=0)
        torch.testing.assert_close(gx, d_gx, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(gw, d_gw, rtol=1e-12, atol=1e-15)


@pytest.mark.slow
def test_sparse_centres_under_ddp(setup):
    """Replicated centres with ``sparse_grad=True`` inside DDP get a ValueError naming the option
    (DDP's reducer takes sparse gradients from ``nn.Embedding`` only); sharded centres that DDP
    ignores train, with the single-process gradients of the shard and of the averaged projection."""
    (x, w, y), res = setup
    xr = x.clone()
    proj = PROJ.clone().requires_grad_(True)
    wr = w.clone().requires_grad_(True)
    loss = losses.margin_softmax_loss(xr @ proj.T, y, wr, scale=SCALE)
    g_proj, g_w = torch.autograd.grad(loss, (proj, wr))
    for r in range(WORLD):
        for key in ("ddp_replicated_sparse", "ddp_sharded_not_ignored"):
            msg = res[r][key]
            assert msg is not None and msg.startswith("PartialFCLoss: sparse_grad=True needs sharded centres"), msg
            assert "'m.head.weight' averaged by DDP" in msg and "distributed=True" in msg
        assert res[r]["ddp_replicated_sparse_ignored"] is None
        err, is_sparse, gw, gp = res[r]["ddp_sharded_sparse"]
        assert err is None and is_sparse
        torch.testing.assert_close(gw, g_w[_shard(r)], rtol=1e-10, atol=1e-12)
        # per rank W x its rows' gradient, averaged by DDP: the full-batch gradient
        torch.testing.assert_close(gp, g_proj, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_shard_layout_and_ddp_ignored(setup):
    _, res = setup
    assert [res[r]["shard_shape"] for r in range(WORLD)] == [(5, D), (4, D)]  # n_r = 9 // 2 + (r < 1)
    assert all(res[r]["ddp_ignored"] == [True] for r in range(WORLD))


@pytest.mark.slow
def test_shared_index_matches_single_process(setup):
    (x, w, y), res = setup
    loss, gx, gw = _single(x, w, y, "mean", index=INDEX)
    for r in range(WORLD):
        out, grad_x, grad_w = res[r]["index"]
        torch.testing.assert_close(out, loss, rtol=1e-6, atol=1e-10)
        torch.testing.assert_close(grad_w, gw[_shard(r)], rtol=1e-6, atol=1e-10)
        torch.testing.assert_close(grad_x, WORLD * gx[_rows(r)], rtol=1e-6, atol=1e-10)
        s = _shard(r)
        assert res[r]["index_last"].tolist() == [i for i in INDEX.tolist() if s.start <= i < s.stop]
    # unsampled centres (4 and 7) get exactly zero gradient
    assert torch.all(res[0]["index"][2][4] == 0) and torch.all(res[1]["index"][2][7 - 5] == 0)


@pytest.mark.slow
def test_rank_with_empty_sample_or_no_classes(setup):
    (x, w, _), res = setup
    loss, gx, gw = _single(x, w, Y_SHARD0, "mean", index=INDEX_SHARD0)
    for r in range(WORLD):
        out, grad_x, grad_w = res[r]["empty_shard"]
        torch.testing.assert_close(out, loss, rtol=1e-6, atol=1e-10)
        torch.testing.assert_close(grad_w, gw[_shard(r)], rtol=1e-6, atol=1e-10)
        torch.testing.assert_close(grad_x, WORLD * gx[_rows(r)], rtol=1e-6, atol=1e-10)
    assert torch.all(res[1]["empty_shard"][2] == 0)
    for r in range(WORLD):
        assert res[r]["one_class"].startswith("PartialFCLoss: num_classes must be >= 2 for a softmax over classes")


@pytest.mark.slow
def test_per_shard_sampling_keeps_positives_and_is_deterministic(setup):
    (_, _, y), res = setup
    gathered = torch.cat([torch.zeros(N_PER_RANK, dtype=torch.long), y[_rows(1)]])
    for r in range(WORLD):
        s = _shard(r)
        k = int(0.75 * (s.stop - s.start))
        positives = {int(c) for c in gathered if s.start <= c < s.stop}
        first, second = res[r]["draws"]
        for a, b in zip(first, second):
            assert torch.equal(a, b), "same seed, same draws"
        for idx in first:
            ids = idx.tolist()
            assert ids == sorted(set(ids)) and all(s.start <= i < s.stop for i in ids)
            assert positives <= set(ids)
            assert len(ids) == max(k, len(positives))
    # shard 1 has positives {5, 6} and k = 3: one extra class drawn from {7, 8}
    extras = {tuple(sorted(set(i.tolist()) - {5, 6})) for i in res[1]["draws"][0]}
    assert extras <= {(7,), (8,)}


@pytest.mark.slow
def test_state_dict_is_world_size_independent(setup):
    (x, w, _), res = setup
    offset = torch.cat([torch.full((5, D), 1.0), torch.full((4, D), 2.0)]).double()
    full = w + offset
    for r in range(WORLD):
        torch.testing.assert_close(res[r]["state_dict"], full, rtol=0, atol=0)
        torch.testing.assert_close(res[r]["reloaded_shard"], full[_shard(r)], rtol=0, atol=0)
    # a world-size-1 module loads the sharded run's checkpoint
    single = losses.PartialFCLoss(D, C, scale=SCALE).double()
    single.load_state_dict({"weight": res[0]["state_dict"]})
    torch.testing.assert_close(single.weight.detach(), full, rtol=0, atol=0)
    # .logits gathers all classes, no margin
    for r in range(WORLD):
        torch.testing.assert_close(res[r]["logits"], single.logits(x[_rows(r)]).detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_module_built_before_init_shards_on_first_use(setup):
    (x, w, y), res = setup
    loss, gx, gw = _single(x, w, y, "mean")
    for r in range(WORLD):
        assert res[r]["lazy_before"] == (C, D)
        torch.testing.assert_close(res[r]["lazy_shard"], w[_shard(r)], rtol=0, atol=0)
        out, grad_x, grad_w = res[r]["lazy"]
        torch.testing.assert_close(out, loss, rtol=1e-6, atol=1e-10)
        torch.testing.assert_close(grad_w, gw[_shard(r)], rtol=1e-6, atol=1e-10)
        torch.testing.assert_close(grad_x, WORLD * gx[_rows(r)], rtol=1e-6, atol=1e-10)


@pytest.mark.slow
def test_all_ignored_is_attached_zero(setup):
    _, res = setup
    for r in range(WORLD):
        out, attached, gx, gw = res[r]["ignored"]
        assert out.item() == 0.0 and attached
        assert torch.all(gx == 0) and torch.all(gw == 0)


@pytest.mark.slow
def test_errors_raise_on_every_rank(setup):
    _, res = setup
    for r in range(WORLD):
        err = res[r]["errors"]
        assert err["unequal"].startswith(
            "partial_fc_loss: every rank must pass the same batch size (got [5, 6])")
        assert err["range"] == ("partial_fc_loss: target has class ids outside [0, 9) (got min=0, max=9); "
                                "check num_classes or set ignore_index")
        assert err["nan"].startswith("partial_fc_loss: embeddings contains NaN")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (NCCL)")
def test_nccl_matches_single_process():  # pragma: no cover - GPU only
    x, w, y = _data()
    single = losses.PartialFCLoss(D, C).double()
    single.load_state_dict({"weight": w})
    res = run_gloo(_nccl_worker, world_size=2, payload={"x": x, "w": w, "y": y, "state": single.state_dict()})
    loss, gx, gw = _single(x, w, y, "mean")
    for r in range(WORLD):
        out, grad_x, grad_w = res[r]
        torch.testing.assert_close(out, loss, rtol=1e-6, atol=1e-10)
        torch.testing.assert_close(grad_w, gw[_shard(r)], rtol=1e-6, atol=1e-10)
        torch.testing.assert_close(grad_x, WORLD * gx[_rows(r)], rtol=1e-6, atol=1e-10)


def _nccl_worker(rank, world_size, payload):  # pragma: no cover - GPU only
    import torch.distributed as dist

    group = dist.new_group(backend="nccl")
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    m = losses.PartialFCLoss(D, C, distributed=True, scale=SCALE, sample_rate=1.0, process_group=group)
    m = m.double().to(dev)
    m.load_state_dict(payload["state"])
    rows = _rows(rank)
    out, gx, gw = _backward(m, payload["x"][rows].to(dev), payload["y"][rows].to(dev), "mean")
    return out.cpu(), gx.cpu(), gw.cpu()
