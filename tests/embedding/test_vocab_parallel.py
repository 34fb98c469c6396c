"""vocab_parallel_linear_cross_entropy (docs/losses/linear_cross_entropy.md, "Vocabulary-parallel heads") on
real gloo processes: the loss and the gradients of a head split over 2 and 4 ranks against the
single-process linear_cross_entropy on the concatenated head and against materialised logits.

One launch per world size runs every case (spawning is the slow part); the worker records each
rank's loss and gradients and the tests below compare them with single-process computations in the
parent.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import losses
from tests.dist_utils import run_gloo

# the public names this family adds (collected into the one list, tests/_helpers/names.py)
EXPECTED_HELPERS = ("vocab_parallel_linear_cross_entropy",)

N, D = 7, 4
#: the head split of each world size: (class_start, C_r) by rank; C = 9 over 2 ranks, 11 over 4 (uneven)
SPLITS = {2: (9, [(0, 5), (5, 4)]), 4: (11, [(0, 3), (3, 3), (6, 3), (9, 2)])}
#: targets with one row in every shard and one ignored row
TARGETS = {9: [0, 8, 4, 5, -100, 2, 6], 11: [0, 10, 4, 7, -100, 2, 9], 7: [0, 6, 3, -100, 1, 5, 2],
           5: [0, 4, 2, -100, 3, 1, 4]}
OPTIONS = {
    "plain": dict(),
    "bias_chunk2_smoothing": dict(bias=True, chunk_size=2, label_smoothing=0.1),
    "bias_chunk1_logz_softcap": dict(bias=True, chunk_size=1, logz_coef=0.01, softcap=2.0),
    "everything": dict(bias=True, chunk_size=2, label_smoothing=0.2, logz_coef=0.05, softcap=1.5,
                       num_classes=True),
}
REDUCTIONS = ("none", "mean", "sum")


def _case(world, name, options, reduction, **over):
    c, shards = SPLITS[world]
    case = dict(name=name, c=c, shards=shards, reduction=reduction, target=TARGETS[c], seed=world,
                dtype=torch.float64, group=None, ignore_index=-100, options=dict(options))
    case.update(over)
    return case


def cases(world):
    """Every case the ``world``-rank launch runs; built the same way in the workers and here."""
    out = [_case(world, f"{opt}-{red}", OPTIONS[opt], red) for opt, red in itertools.product(OPTIONS, REDUCTIONS)]
    c, shards = SPLITS[world]
    out += [
        _case(world, "all_ignored", dict(bias=True, label_smoothing=0.1), "mean", target=[-100] * N),
        _case(world, "ignore_index_-1", dict(bias=True, chunk_size=2), "sum", ignore_index=-1,
              target=[t if t != -100 else -1 for t in TARGETS[c]][::-1]),
        _case(world, "float32", dict(bias=True, chunk_size=2, label_smoothing=0.1, softcap=3.0), "mean",
              dtype=torch.float32),
        # the shards in the reverse order of the ranks (any order that tiles [0, C) is a head)
        _case(world, "reversed_shards", dict(bias=True, chunk_size=2, logz_coef=0.01), "mean",
              shards=shards[::-1]),
    ]
    if world == 2:
        out += [
            # rank 1 holds no class
            _case(2, "empty_shard", dict(bias=True, label_smoothing=0.1, softcap=2.0, num_classes=True), "none",
                  c=7, shards=[(0, 7), (7, 0)], target=TARGETS[7]),
            _case(2, "explicit_group", dict(bias=True, chunk_size=3), "mean", group=[0, 1]),
        ]
    else:  # two heads side by side: ranks {0, 1} and {2, 3}, each a 2-way split of its own 9-class head
        sub = dict(bias=True, chunk_size=2, label_smoothing=0.1, logz_coef=0.01)
        out += [
            _case(4, "subgroups", sub, "none", c=9, shards=[(0, 4), (4, 5)] * 2, target=TARGETS[9], group="pairs"),
            # torch.chunk's layout of 5 classes over 4 ranks (a DTensor Shard(0)): 2, 2, 1 and an empty
            # shard whose offset 6 lies past the head
            _case(4, "chunk_layout_with_empty_shard", dict(bias=True, label_smoothing=0.1, num_classes=True), "mean",
                  c=5, shards=[(0, 2), (2, 2), (4, 1), (6, 0)], target=TARGETS[5]),
        ]
    return out


def _data(case, seed_shift=0):
    g = torch.Generator().manual_seed(1000 * case["seed"] + seed_shift + len(case["name"]))
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    w = torch.randn(case["c"], D, generator=g, dtype=torch.float64)
    b = torch.randn(case["c"], generator=g, dtype=torch.float64)
    r = torch.rand(N, generator=g, dtype=torch.float64) + 0.5  # upstream gradient of "none"
    y = torch.tensor(case["target"])
    dt = case["dtype"]
    return x.to(dt), w.to(dt), b.to(dt), y, r.to(dt)


def _kwargs(case):
    o = dict(case["options"])
    o.pop("bias", None)
    if o.pop("num_classes", False):
        o["num_classes"] = case["c"]
    return dict(o, ignore_index=case["ignore_index"], reduction=case["reduction"])


def _backward(out, r, reduction):
    (out * r).sum().backward() if reduction == "none" else (out * 1.5).backward()


def _run_case(case, rank, groups):
    group_index = 0
    group = None
    if case["group"] == [0, 1]:
        group = groups["all"]
    elif case["group"] == "pairs":
        group_index = rank // 2
        group = groups["pairs"][group_index]
    x, w, b, y, r = _data(case, seed_shift=group_index)
    start, size = case["shards"][rank]
    xr = x.clone().requires_grad_(True)
    wr = w[start:start + size].clone().requires_grad_(True)
    br = b[start:start + size].clone().requires_grad_(True) if case["options"].get("bias") else None
    out = losses.vocab_parallel_linear_cross_entropy(xr, y, wr, bias_shard=br, class_start=start, group=group,
                                                     **_kwargs(case))
    _backward(out, r, case["reduction"])
    return out.detach(), xr.grad, wr.grad, None if br is None else br.grad


def _errors(rank, world):
    """Bad inputs: the same ValueError on every rank, and the group stays usable afterwards."""
    c, shards = SPLITS[world]
    case = _case(world, "errors", {}, "mean")
    x, w, b, y, _ = _data(case)
    start, size = shards[rank]
    last = rank == world - 1
    calls = {
        "overlap": dict(class_start=0),
        "beyond": dict(class_start=start + (1 if last else 0), num_classes=c),
        "gap": dict(num_classes=c + 1),
        "num_classes_differ": dict(num_classes=c + int(last)),
        "target_differs": dict(target=y.flip(0) if last else y),
        "id_out_of_range": dict(target=torch.tensor([c] + TARGETS[c][1:])),
        "batch_differs": dict(x=x[:-1] if last else x, target=y[:-1] if last else y),
        "nan_weight": dict(w=torch.full_like(w[start:start + size], float("nan")) if last else None),
    }
    out = {}
    for label, over in calls.items():
        xa, ya = over.pop("x", x), over.pop("target", y)
        wa = over.pop("w", None)
        wa = w[start:start + size] if wa is None else wa
        kw = dict(dict(class_start=start), **over)
        try:
            losses.vocab_parallel_linear_cross_entropy(xa, ya, wa, **kw)
            out[label] = None
        except ValueError as exc:
            out[label] = str(exc)
    return out


def _worker(rank, world_size, payload):
    import torch.distributed as dist

    groups = {"all": dist.new_group(list(range(world_size)))}
    if world_size == 4:
        groups["pairs"] = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    res = {"errors": _errors(rank, world_size)}
    for case in cases(world_size):
        res[case["name"]] = _run_case(case, rank, groups)
    return res


_RESULTS = {}


def results(world):
    if world not in _RESULTS:
        _RESULTS[world] = run_gloo(_worker, world_size=world, timeout=240.0)
    return _RESULTS[world]


def _single(case, group_index=0):
    """linear_cross_entropy on the whole head, and the materialised logits through autograd."""
    x, w, b, y, r = _data(case, seed_shift=group_index)
    bias = case["options"].get("bias")
    o = case["options"]
    out = []
    for materialised in (False, True):
        xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        br = b.clone().requires_grad_(True) if bias else None
        if not materialised:
            kw = _kwargs(case)
            kw.pop("num_classes", None)
            loss = losses.linear_cross_entropy(xr, y, wr, bias=br, **kw)
        else:
            z = xr @ wr.T + (br if bias else 0.0)
            if o.get("softcap"):
                z = o["softcap"] * torch.tanh(z / o["softcap"])
            lse = torch.logsumexp(z, dim=1)
            valid = y != case["ignore_index"]
            safe = torch.where(valid, y, torch.zeros_like(y))
            eps = o.get("label_smoothing", 0.0)
            rows = ((1 - eps) * (lse - z.gather(1, safe[:, None])[:, 0]) + eps * (lse - z.mean(dim=1))
                    + o.get("logz_coef", 0.0) * lse ** 2)
            rows = torch.where(valid, rows, torch.zeros_like(rows))
            red = case["reduction"]
            loss = rows if red == "none" else rows.sum() if red == "sum" else rows.sum() / valid.sum().clamp(min=1)
        _backward(loss, r, case["reduction"])
        out.append((loss.detach(), xr.grad, wr.grad, None if br is None else br.grad))
    return out


def _close(a, b, tol, what):
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")


ALL_CASES = [(w, c["name"]) for w in (2, 4) for c in cases(w)]


@pytest.mark.parametrize("world,name", ALL_CASES, ids=[f"{w}ranks-{n}" for w, n in ALL_CASES])
def test_matches_single_process_on_the_whole_head(world, name):
    case = next(c for c in cases(world) if c["name"] == name)
    per_rank = results(world)
    tol = 1e-10 if case["dtype"] == torch.float64 else 1e-5
    refs = {}
    for rank in range(world):
        gi = rank // 2 if case["group"] == "pairs" else 0
        if gi not in refs:
            refs[gi] = _single(case, gi)
        loss, gx, gw, gb = per_rank[rank][name]
        start, size = case["shards"][rank]
        for ref_name, (rloss, rgx, rgw, rgb) in zip(("linear_cross_entropy", "materialised"), refs[gi]):
            _close(loss, rloss, tol, f"rank {rank} loss vs {ref_name}")
            _close(gx, rgx, tol, f"rank {rank} embeddings gradient (the full one) vs {ref_name}")
            _close(gw, rgw[start:start + size], tol, f"rank {rank} weight_shard gradient vs {ref_name}")
            if rgb is None:
                assert gb is None
            else:
                _close(gb, rgb[start:start + size], tol, f"rank {rank} bias_shard gradient vs {ref_name}")


def test_every_shard_holds_a_target_and_the_embeddings_gradient_needs_every_shard():
    """The cases are not trivially satisfied: each shard owns a target, and one rank's partial
    embeddings gradient alone differs from the full gradient every rank returns."""
    for world in (2, 4):
        c, shards = SPLITS[world]
        for start, size in shards:
            assert any(start <= t < start + size for t in TARGETS[c]), (world, start, size)
        case = next(k for k in cases(world) if k["name"] == "plain-mean")
        x, w, _, y, _ = _data(case)
        ref_gx = _single(case)[0][1]
        start, size = shards[0]
        z = x @ w.T
        p = torch.softmax(z, dim=1)
        valid = (y != -100).double()
        onehot = F.one_hot(torch.where(y >= 0, y, 0), c).double()
        dz = 1.5 * (p - onehot) * valid[:, None] / valid.sum()
        partial = dz[:, start:start + size] @ w[start:start + size]
        assert (partial - ref_gx).abs().max() > 1e-3
        assert torch.allclose((dz @ w), ref_gx, atol=1e-12)  # the oracle of the oracle
        for rank in range(world):
            assert not torch.allclose(results(world)[rank]["plain-mean"][1], partial)


ERRORS = {
    "overlap": r"must tile \[0, {c}\) without gaps or overlaps",
    "beyond": r"class_start \+ weight_shard.shape\[0\] must be <= num_classes \({c}\)",
    "gap": r"must tile \[0, {c1}\) without gaps or overlaps",
    "num_classes_differ": r"every rank must pass the same num_classes",
    "target_differs": r"every rank must pass the same target",
    "id_out_of_range": r"target has class ids outside \[0, {c}\)",
    "batch_differs": r"every rank must pass the same N",
    "nan_weight": r"weight_shard contains NaN|inputs of another rank contain NaN",
}


@pytest.mark.parametrize("world", (2, 4))
@pytest.mark.parametrize("label", sorted(ERRORS))
def test_bad_inputs_raise_on_every_rank(world, label):
    import re

    c = SPLITS[world][0]
    pattern = "^vocab_parallel_linear_cross_entropy: .*(?:" + ERRORS[label].format(c=c, c1=c + 1) + ")"
    for rank in range(world):
        msg = results(world)[rank]["errors"][label]
        assert msg is not None and re.search(pattern, msg), (rank, msg)
    if label == "nan_weight":  # the rank with the NaN names it; the others point at it
        assert "weight_shard contains NaN" in results(world)[world - 1]["errors"][label]
        assert f"ranks [{world - 1}]" in results(world)[0]["errors"][label]


# ----------------------------------------------------------------------------------------------
# one rank (no process group in this process)
# ----------------------------------------------------------------------------------------------
def _one_rank_inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 3, generator=g, dtype=dtype)
    w = torch.randn(8, 3, generator=g, dtype=dtype)
    b = torch.randn(8, generator=g, dtype=dtype)
    y = torch.tensor([0, 7, 3, -100, 5, 5])
    return x, w, b, y


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_one_rank_is_linear_cross_entropy(reduction):
    import torch.distributed as dist

    assert not dist.is_initialized()
    x, w, b, y = _one_rank_inputs()
    kw = dict(chunk_size=3, reduction=reduction, label_smoothing=0.1, logz_coef=0.02, softcap=2.5)
    got, ref = [], []
    for fn, out in ((lambda *a: losses.vocab_parallel_linear_cross_entropy(*a[:3], bias_shard=a[3], class_start=0,
                                                                           num_classes=8, **kw), got),
                    (lambda *a: losses.linear_cross_entropy(*a[:3], bias=a[3], **kw), ref)):
        xr, wr, br = (t.clone().requires_grad_(True) for t in (x, w, b))
        loss = fn(xr, y, wr, br)
        (loss.sum() if reduction == "none" else loss).backward()
        out += [loss.detach(), xr.grad, wr.grad, br.grad]
    for a, r in zip(got, ref):
        _close(a, r, 1e-12, "one rank")


def test_one_rank_needs_the_whole_head():
    x, w, b, y = _one_rank_inputs()
    f = losses.vocab_parallel_linear_cross_entropy
    with pytest.raises(ValueError, match=r"on one rank weight_shard must be the whole head \(class_start=0, C_r=10\)"):
        f(x, y, w, class_start=0, num_classes=10)
    with pytest.raises(ValueError, match=r"class_start \+ weight_shard.shape\[0\] must be <= num_classes \(8\)"):
        f(x, y, w, class_start=2, num_classes=8)
    with pytest.raises(ValueError, match=r"a group was passed but torch.distributed is not initialised"):
        f(x, y, w, class_start=0, group=object())


@pytest.mark.parametrize("call,error,pattern", [
    (lambda x, y, w, b: dict(embeddings=x[0]), ValueError, r"embeddings must have shape \(N, D\)"),
    (lambda x, y, w, b: dict(weight_shard=w[:, :2]), ValueError, r"weight_shard must have shape \(C_r, 3\)"),
    (lambda x, y, w, b: dict(target=y[:-1]), ValueError, r"target must have shape \(6,\)"),
    (lambda x, y, w, b: dict(bias_shard=b[:-1]), ValueError, r"bias_shard must have shape \(8,\)"),
    (lambda x, y, w, b: dict(class_start=-1), ValueError, r"class_start must be an int >= 0"),
    (lambda x, y, w, b: dict(class_start=0.0), TypeError, r"class_start must be an int >= 0"),
    (lambda x, y, w, b: dict(num_classes=1), ValueError, r"num_classes must be >= 2"),
    (lambda x, y, w, b: dict(chunk_size=0), ValueError, r"chunk_size must be a positive int"),
    (lambda x, y, w, b: dict(target=torch.tensor([0, 8, 1, 1, 1, 1])), ValueError,
     r"target has class ids outside \[0, 8\)"),
    (lambda x, y, w, b: dict(weight_shard=w.clone().fill_(float("inf"))), ValueError,
     r"weight_shard contains NaN or infinite values"),
    (lambda x, y, w, b: dict(reduction="avg"), ValueError, r"reduction"),
    (lambda x, y, w, b: dict(label_smoothing=1.5), ValueError, r"label_smoothing"),
    (lambda x, y, w, b: dict(softcap=0.0), ValueError, r"softcap must be a positive finite float"),
], ids=["embeddings_dim", "weight_dim", "target_shape", "bias_shape", "class_start_negative", "class_start_float",
        "num_classes_one", "chunk_size_zero", "id_out_of_range", "weight_inf", "reduction", "label_smoothing",
        "softcap"])
def test_bad_inputs_name_the_argument(call, error, pattern):
    x, w, b, y = _one_rank_inputs()
    args = dict(embeddings=x, target=y, weight_shard=w, bias_shard=b, class_start=0)
    args.update(call(x, y, w, b))
    with pytest.raises(error, match="^vocab_parallel_linear_cross_entropy: .*" + pattern):
        losses.vocab_parallel_linear_cross_entropy(args.pop("embeddings"), args.pop("target"),
                                                   args.pop("weight_shard"), **args)
