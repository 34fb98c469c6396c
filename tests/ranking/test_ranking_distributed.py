"""``gather_distributed=True`` for decoupled softmax / InfoNCE / soft top-k and ``in_batch_scores``
on 2 real gloo processes (docs/conventions.md Distributed, docs/losses/decoupled_softmax.md).

Every rank must return the loss of the concatenated global batch ("mean" divides by the global
number of rows with positives; "none" returns this rank's rows) and give its inputs world_size x
their single-process gradient. The single-process reference is computed here, in the parent,
from the global batch with the global target built by hand.
"""

from __future__ import annotations

import torch

import losses
from tests.dist_utils import run_gloo

W, B, K, D, L = 2, 3, 4, 5, 5

LOSSES = {
    "decoupled": (losses.DecoupledSoftmaxLoss, losses.decoupled_softmax_loss, {"temperature": 0.5}),
    "infonce": (losses.InfoNCELoss, losses.infonce_loss, {"temperature": 0.5, "positive_normalization": "mean"}),
    "soft_topk": (losses.SoftTopKLoss, losses.soft_topk_loss, {"temperature": 0.5, "k": 2, "n_iter": 50}),
}
REDUCTIONS = ("mean", "sum", "none")

# per-rank targets for forward(query, keys, target): ids index this rank's K keys
IDS1 = [torch.tensor([0, 3, -100]), torch.tensor([1, -100, 2])]
IDSP = [torch.tensor([[0, 1], [3, -100], [-100, -100]]), torch.tensor([[2, 2], [0, 3], [1, -100]])]
# per-rank targets for forward(scores, target): ids index the L columns of the scores
SCORE_IDS = [torch.tensor([[0, 4], [2, -100], [-100, -100]]), torch.tensor([[1, -100], [3, 0], [4, -100]])]


# candidate masks (True = exclude, e.g. a false negative): rank 0 passes a (B, K) mask over its own
# keys, rank 1 a (B, W*K) mask over every key (here one of rank 0's keys)
FNM_LOCAL0 = torch.zeros(B, K, dtype=torch.bool)
FNM_LOCAL0[0, 1] = FNM_LOCAL0[2, 0] = True
FNM_GLOBAL1 = torch.zeros(B, W * K, dtype=torch.bool)
FNM_GLOBAL1[0, K + 3] = FNM_GLOBAL1[2, 1] = True
FNM = [FNM_LOCAL0, FNM_GLOBAL1]


def global_fn_mask():
    full = torch.zeros(W * B, W * K, dtype=torch.bool)
    full[:B, :K] = FNM_LOCAL0
    full[B:] = FNM_GLOBAL1
    return full


def global_data():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(W * B, D, generator=g, dtype=torch.float64)
    k = torch.randn(W * K, D, generator=g, dtype=torch.float64)
    s = torch.randn(W * B, L, generator=g, dtype=torch.float64)
    mask = torch.rand(W * B, K, generator=g) < 0.4
    mask[0] = False  # a row without positives on rank 0
    mask[4, 1] = True
    rel = torch.where(mask, torch.rand(W * B, K, generator=g, dtype=torch.float64) + 0.2,
                      torch.zeros(W * B, K, dtype=torch.float64))
    return q, k, s, mask, rel


def local_targets(r, mask, rel):
    rows = slice(r * B, (r + 1) * B)
    return {"ids1": IDS1[r], "idsP": IDSP[r], "mask": mask[rows], "rel": rel[rows]}


def global_target(form, mask, rel):
    """The single-process target over the global key pool (ids offset, masks placed in blocks)."""
    if form in ("ids1", "idsP"):
        parts = IDS1 if form == "ids1" else IDSP
        out = [torch.where(t != -100, t + r * K, t) for r, t in enumerate(parts)]
        return torch.cat(out)
    src = mask if form == "mask" else rel
    full = torch.zeros(W * B, W * K, dtype=src.dtype)
    for r in range(W):
        full[r * B:(r + 1) * B, r * K:(r + 1) * K] = src[r * B:(r + 1) * B]
    return full


def _worker(rank, world_size, payload):
    q_all, k_all, s_all, mask, rel = global_data()
    rows = slice(rank * B, (rank + 1) * B)
    out = {"qk": {}, "scores": {}, "in_batch": {}}
    for form, target in local_targets(rank, mask, rel).items():
        q = q_all[rows].clone().requires_grad_(True)
        k = k_all[rank * K:(rank + 1) * K].clone().requires_grad_(True)
        scores, t = losses.in_batch_scores(q, k, target, gather_distributed=True)
        out["in_batch"][form] = (scores.detach(), t)
        for name, (cls, _, kw) in LOSSES.items():
            for reduction in REDUCTIONS:
                q = q_all[rows].clone().requires_grad_(True)
                k = k_all[rank * K:(rank + 1) * K].clone().requires_grad_(True)
                loss = cls(gather_distributed=True, reduction=reduction, **kw)(q, k, target)
                gq, gk = torch.autograd.grad(loss.sum(), [q, k])
                out["qk"][form, name, reduction] = (loss.detach(), gq, gk)
    for name, (cls, _, kw) in LOSSES.items():
        for reduction in REDUCTIONS:
            s = s_all[rows].clone().requires_grad_(True)
            loss = cls(gather_distributed=True, reduction=reduction, **kw)(s, SCORE_IDS[rank])
            (gs,) = torch.autograd.grad(loss.sum(), [s])
            out["scores"][name, reduction] = (loss.detach(), gs)
    # candidate masks through forward(query, keys, target, mask=...)
    out["masked"] = {}
    for name, (cls, _, kw) in LOSSES.items():
        q = q_all[rows].clone().requires_grad_(True)
        k = k_all[rank * K:(rank + 1) * K].clone().requires_grad_(True)
        loss = cls(gather_distributed=True, **kw)(q, k, IDS1[rank], mask=FNM[rank])
        gq, gk = torch.autograd.grad(loss, [q, k])
        out["masked"][name] = (loss.detach(), gq, gk)
    # an all-ignored global batch: attached zero, zero gradients
    q = q_all[rows].clone().requires_grad_(True)
    k = k_all[rank * K:(rank + 1) * K].clone().requires_grad_(True)
    zero = losses.InfoNCELoss(gather_distributed=True)(q, k, torch.full((B,), -100))
    gq, gk = torch.autograd.grad(zero, [q, k])
    out["zero"] = (zero.detach(), gq, gk)
    # unequal batch sizes raise on every rank
    errors = []
    n = B + rank
    try:
        losses.DecoupledSoftmaxLoss(gather_distributed=True)(torch.randn(n, L), torch.zeros(n, dtype=torch.long))
    except ValueError as e:
        errors.append(str(e))
    try:
        losses.in_batch_scores(torch.randn(B, D), torch.randn(K + rank, D), torch.zeros(B, dtype=torch.long),
                               gather_distributed=True)
    except ValueError as e:
        errors.append(str(e))
    out["errors"] = errors
    return out


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_gathered_losses_match_single_process():
    results = run_gloo(_worker, world_size=W)
    q_all, k_all, s_all, mask, rel = global_data()
    for form in ("ids1", "idsP", "mask", "rel"):
        t_glob = global_target(form, mask, rel)
        # in_batch_scores: this rank's rows against every rank's keys, target in global columns
        for r, res in enumerate(results):
            scores, t = res["in_batch"][form]
            _close(scores, q_all[r * B:(r + 1) * B] @ k_all.T)
            assert torch.equal(t, t_glob[r * B:(r + 1) * B])
        for name, (_, fn, kw) in LOSSES.items():
            for reduction in REDUCTIONS:
                q = q_all.clone().requires_grad_(True)
                k = k_all.clone().requires_grad_(True)
                ref = fn(q @ k.T, t_glob, reduction=reduction, **kw)
                gq, gk = torch.autograd.grad(ref.sum(), [q, k])
                for r, res in enumerate(results):
                    loss, gq_r, gk_r = res["qk"][form, name, reduction]
                    rows = slice(r * B, (r + 1) * B)
                    if reduction == "none":
                        _close(loss, ref.detach()[rows])  # this rank's rows only
                        continue
                    _close(loss, ref.detach())  # identical on every rank
                    _close(gq_r, W * gq[rows])
                    _close(gk_r, W * gk[r * K:(r + 1) * K])
    # candidate masks: the loss of the global batch with the global mask
    t_glob = global_target("ids1", mask, rel)
    for name, (_, fn, kw) in LOSSES.items():
        q = q_all.clone().requires_grad_(True)
        k = k_all.clone().requires_grad_(True)
        ref = fn(q @ k.T, t_glob, mask=global_fn_mask(), **kw)
        gq, gk = torch.autograd.grad(ref, [q, k])
        unmasked = fn((q @ k.T).detach(), t_glob, **kw)
        assert abs(float(ref) - float(unmasked)) > 1e-6  # the mask matters
        for r, res in enumerate(results):
            loss, gq_r, gk_r = res["masked"][name]
            _close(loss, ref.detach())
            _close(gq_r, W * gq[r * B:(r + 1) * B])
            _close(gk_r, W * gk[r * K:(r + 1) * K])
    # forward(scores, target): rows gathered
    t_scores = torch.cat(SCORE_IDS)
    for name, (_, fn, kw) in LOSSES.items():
        for reduction in REDUCTIONS:
            s = s_all.clone().requires_grad_(True)
            ref = fn(s, t_scores, reduction=reduction, **kw)
            (gs,) = torch.autograd.grad(ref.sum(), [s])
            for r, res in enumerate(results):
                loss, gs_r = res["scores"][name, reduction]
                rows = slice(r * B, (r + 1) * B)
                if reduction == "none":
                    _close(loss, ref.detach()[rows])
                    _close(gs_r, gs[rows])
                else:
                    _close(loss, ref.detach())
                    _close(gs_r, W * gs[rows])
    # the global mean really divides by the global count of rows with positives (rank 0 has an
    # empty row, rank 1 none): it differs from the mean of the per-rank means
    per_rank = [losses.decoupled_softmax_loss(s_all[r * B:(r + 1) * B], SCORE_IDS[r]) for r in range(W)]
    assert abs(float(sum(per_rank) / W) - float(results[0]["scores"]["decoupled", "mean"][0])) > 1e-6
    for res in results:
        zero, gq, gk = res["zero"]
        assert zero.item() == 0.0 and torch.all(gq == 0) and torch.all(gk == 0)
        assert res["errors"][0].startswith("DecoupledSoftmaxLoss: every rank must pass the same batch size "
                                           "(got [3, 4])")
        assert res["errors"][1].startswith("in_batch_scores: every rank must pass the same batch size (got [4, 5])")
