"""Compare losses in a plain PyTorch loop on scikit-learn's bundled digits (no Lightning).

Each loss trains the same small MLP from the same initialisation on the same stratified split,
for a few seeds, and the script prints test accuracy, balanced accuracy, ECE, mean confidence and
time. Losses that own a head (margin softmax, WCDAS, ...) get the MLP's features and supply the
logits; logits losses get the MLP's logits: the loop routes by the registry's declaration, as
``lightning_modules`` does.

ECE (expected calibration error) asks whether the predicted probabilities can be read as
probabilities: the test samples are grouped into 15 bins by their confidence (the largest class
probability) and ECE is the sample-weighted mean over the bins of |accuracy - mean confidence|;
0 when a confidence of 0.9 is right 90% of the time. The probabilities are the loss's own
(``predict_proba``, e.g. sparsemax's) where it has them, else the softmax of the logits. The
"conf" column is the mean confidence: when it is far below the accuracy the model is
under-confident and ECE is about accuracy - conf. That is the Z-loss's high ECE: it reads only
the z-scores of the logits and is invariant to their scale (docs/losses/z_loss.md), so nothing in
its training makes the logits large and their softmax stays close to uniform while the argmax is
right; its ranking (accuracy) is what it trains, not a calibrated softmax.

    python examples/plain_pytorch_loop.py                    # default set of losses, 3 seeds
    python examples/plain_pytorch_loop.py --losses cross_entropy z_loss --seeds 1 --epochs 5
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import losses

DEFAULT = ["cross_entropy", "z_loss", "logz_penalty", "sparsemax", "entmax15", "comp_sum", "gol",
           "margin_softmax", "cosine_softmax", "wcdas", "linear_cross_entropy"]
KWARGS = {
    "comp_sum": {"tau": 1.5},
    "margin_softmax": {"scale": 16.0, "margin": (1.0, 0.2, 0.0)},
    "cosine_softmax": {"scale": 16.0, "margin": (1.0, 0.0, 0.0)},
}


def load_digits_split(seed: int):
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as exc:  # pragma: no cover
        raise SystemExit("this example needs scikit-learn: pip install 'softmax-losses[data]'") from exc
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    idx = torch.arange(len(y)).numpy()
    tr, te = train_test_split(idx, test_size=0.3, stratify=y.numpy(), random_state=seed)
    return x[tr], y[tr], x[te], y[te]


def ece(probs: torch.Tensor, y: torch.Tensor, bins: int = 15) -> float:
    conf, pred = probs.max(dim=1)
    edges = torch.linspace(0, 1, bins + 1)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (conf > lo) & (conf <= hi)
        if m.any():
            total += float(m.float().mean() * ((pred[m] == y[m]).float().mean() - conf[m].mean()).abs())
    return total


def run(name: str, seed: int, epochs: int, batch: int = 128) -> dict:
    xtr, ytr, xte, yte = load_digits_split(seed)
    spec = losses.get_loss_spec(name)
    torch.manual_seed(seed)
    feat_dim = 32
    body = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, feat_dim), nn.ReLU())
    kwargs = dict(KWARGS.get(name, {}))
    if spec.owns_head:
        kwargs.update(embedding_dim=feat_dim, num_classes=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", losses.ExperimentalWarning)
        loss_fn = spec.create(**kwargs)
    head = None if spec.owns_head else nn.Linear(feat_dim, 10)
    params = list(body.parameters()) + list(loss_fn.parameters()) + ([] if head is None else list(head.parameters()))
    opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=1e-4)
    g = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    for _ in range(epochs):
        perm = torch.randperm(len(ytr), generator=g)
        for i in range(0, len(perm), batch):
            b = perm[i:i + batch]
            feats = body(xtr[b])
            loss = loss_fn(feats, ytr[b]) if spec.kind == "embeddings" else loss_fn(head(feats), ytr[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        feats = body(xte)
        logits = loss_fn.logits(feats) if spec.owns_head else head(feats)
        # the loss's own predictive distribution where it has one (sparsemax, entmax, ...), else the softmax
        own = getattr(loss_fn, "predict_proba", None)
        probs = own(logits) if callable(own) else F.softmax(logits.float(), dim=1)
        pred = logits.argmax(dim=1)
        acc = float((pred == yte).float().mean())
        per_class = torch.stack([(pred[yte == c] == c).float().mean() for c in range(10)])
    return {"acc": acc, "bal_acc": float(per_class.mean()), "ece": ece(probs, yte),
            "conf": float(probs.max(dim=1).values.mean()), "s": seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--losses", nargs="+", default=DEFAULT)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="torch threads (the MLP is tiny: 1 is fastest)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"digits (sklearn), MLP 64-128-32, {args.epochs} epochs of batch {args.batch}, seeds 0..{args.seeds - 1}, torch {torch.__version__}")
    print(f"{'loss':<22} {'test acc':>15} {'balanced acc':>15} {'ECE':>15} {'conf':>15} {'s/run':>7}")
    for name in args.losses:
        runs = [run(name, s, args.epochs, args.batch) for s in range(args.seeds)]

        def ms(key):
            v = [r[key] for r in runs]
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            return f"{statistics.mean(v):.4f}±{sd:.4f}"

        print(f"{name:<22} {ms('acc'):>15} {ms('bal_acc'):>15} {ms('ece'):>15} {ms('conf'):>15} "
              f"{statistics.mean(r['s'] for r in runs):>7.2f}")
    print("ECE: expected calibration error, the mean |accuracy - confidence| over 15 confidence bins "
          "(0 = calibrated); conf: mean largest class probability.\n"
          "A loss whose conf is far below its accuracy is under-confident: e.g. the Z-loss, invariant to "
          "the logits' scale, leaves their softmax near uniform (docs/losses/z_loss.md), hence its high ECE.")


if __name__ == "__main__":
    main()
