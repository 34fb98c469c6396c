"""float32 precision of the Dice family against float64, beside MONAI's ``DiceLoss``.

A Dice loss that is small (a confident, mostly right prediction) is a difference of nearly equal
numbers when it is computed as ``1 - 2 sum(xy) / (sum x + sum y)`` (MONAI's form), and when a
float32 ``1 - x`` is taken at a probability near 1. The project sums the per-element terms (and,
in its C kernel, takes ``1 - x`` from the other classes' exponentials). This script measures the
relative error of the float32 value against the float64 value of the same formula, on
(16, 11, 64, 64) maps with logits ``margin * onehot + 0.5 * randn`` for a range of margins (each
margin a smaller loss), for:

- ``soft_dice_loss`` with ids and with one-hot float labels (the C kernel where it is built);
- the same with the kernel switched off (the PyTorch path);
- MONAI ``DiceLoss(softmax=True, batch=True)`` (when MONAI is installed) with the same smoothing
  (``smooth=5e-6``, every class active: the two losses then have the same value).

Usage::

    python benchmarks/dice_precision.py --out results/perf      # writes dice_precision.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import losses  # noqa: E402
from losses.kernels import dice_native as _dice_native  # noqa: E402

MARGINS = (2.0, 6.0, 10.0, 14.0, 18.0)
SHAPE = (16, 11, 64, 64)


def _project(z, target, kernel: bool) -> float:
    before = _dice_native.enabled
    _dice_native.enabled = kernel
    try:
        return float(losses.soft_dice_loss(z, target, smooth=5e-6, active_classes="all"))
    finally:
        _dice_native.enabled = before


def _monai(z, onehot) -> float:
    from monai.losses import DiceLoss

    return float(DiceLoss(softmax=True, batch=True)(z, onehot))


def measure(margins=MARGINS, shape=SHAPE, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b, c = shape[:2]
    ids = torch.randint(0, c, (b,) + tuple(shape[2:]), generator=g)
    onehot = F.one_hot(ids, c).movedim(-1, 1).double().contiguous()
    noise = torch.randn(shape, generator=g, dtype=torch.float64)
    try:
        import monai  # noqa: F401
        have_monai = True
    except ImportError:
        have_monai = False
    rows = []
    for margin in margins:
        z64 = margin * onehot + 0.5 * noise
        z32 = z64.float()
        # the float64 value of the float32 logits (the rounding of the input is not the loss's error)
        ref = _project(z32.double(), ids, kernel=False)
        row = {"margin": margin, "loss": ref}
        for name, value in [
            ("kernel, ids", _project(z32, ids, True)),
            ("kernel, one-hot", _project(z32, onehot.float(), True)),
            ("PyTorch path, ids", _project(z32, ids, False)),
            ("PyTorch path, one-hot", _project(z32, onehot.float(), False)),
        ]:
            row[name] = abs(value - ref) / ref
        if have_monai:
            ref_m = _monai(z32.double(), onehot)
            row["MONAI, one-hot"] = abs(_monai(z32, onehot.float()) - ref_m) / ref_m
        rows.append(row)
    return rows


def write(rows, out: str, shape=SHAPE) -> str:
    os.makedirs(out, exist_ok=True)
    cols = [k for k in rows[0] if k not in ("margin", "loss")]
    lines = [
        "# Dice precision: float32 relative error against float64",
        "",
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, Dice kernel: "
        f"{_dice_native.available()[1].split(': ')[0]} ({_dice_native.variant()}). `soft_dice_loss` "
        f"(smooth 5e-6, every class active) on {'x'.join(map(str, shape))} maps, logits "
        "`margin * onehot + 0.5 * randn`; each cell |float32 - float64| / float64 of the same formula "
        "on the same (float32) logits. Written by `benchmarks/dice_precision.py`.",
        "",
        "| margin | loss | " + " | ".join(cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for r in rows:
        lines.append(f"| {r['margin']:g} | {r['loss']:.2e} | " + " | ".join(f"{r[k]:.1e}" for k in cols) + " |")
    path = os.path.join(out, "dice_precision.md")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/perf")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    path = write(measure(), args.out)
    print(open(path).read())


if __name__ == "__main__":
    main()
