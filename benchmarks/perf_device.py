"""Side-by-side loss timings on one device (a GPU by default), with the bandwidth floor.

Every case is a forward + backward of one loss on ``(B, C)`` logits, timed **interleaved** (each
repetition runs every case once, in the same order) with the device synchronised around each call,
data checks off (``losses.validation(False)``). Each row reports the median milliseconds and its
quartiles over the repetitions, and two paired ratios (median of the per-repetition ratios):

* ``x_ce``: to ``F.cross_entropy`` on the same logits;
* ``x_copy``: to a plain device copy of the logits (``logits.clone()``), the bandwidth floor: one
  read and one write of the logits, less than any loss that reads them forward and writes their
  gradient backward can do.

Dtypes: ``fp32`` and ``bf16`` logits (the loss's own computation dtype is the library's: float32
internally for half inputs). Results go to ``--out``: ``device.csv``, ``device.md`` and
``device_meta.json`` (torch version, device name).

    python benchmarks/perf_device.py --out results/gpu              # cuda, fp32 + bf16, two sizes
    python benchmarks/perf_device.py --device cpu --sizes 64x100    # the same on the CPU
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (ROOT, HERE):  # the project's losses; perf_losses (the CPU harness) beside this script
    if _path not in sys.path:
        sys.path.insert(0, _path)

from perf_losses import _quantile, paired_ratio  # noqa: E402

#: the logits losses timed by default (registry names; each built with its registry defaults)
DEFAULT_LOSSES = ("cross_entropy", "z_loss", "logz_penalty", "comp_sum", "gol", "bce_with_logits", "sparsemax",
                  "entmax15")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
COLUMNS = ["device", "dtype", "B", "C", "case", "ms", "q1", "q3", "n", "x_ce", "x_copy", "error"]


def parse_sizes(text: str) -> List[Tuple[int, int]]:
    """``"256x1000,256x100000"`` -> ``[(256, 1000), (256, 100000)]``."""
    out = []
    for part in text.split(","):
        try:
            b, c = (int(v) for v in part.lower().split("x"))
        except ValueError:
            raise SystemExit(f"perf_device: --sizes takes BxC pairs separated by commas (got {part!r})") from None
        if b < 1 or c < 2:
            raise SystemExit(f"perf_device: --sizes needs B >= 1 and C >= 2 (got {part!r})")
        out.append((b, c))
    return out


def parse_args(argv: Sequence[str] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16")
    p.add_argument("--sizes", default="256x1000,256x100000", help="BxC pairs, comma-separated")
    p.add_argument("--losses", default=",".join(DEFAULT_LOSSES), help="registry names, comma-separated")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", default=os.path.join("results", "gpu"))
    args = p.parse_args(argv)
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = [d for d in args.dtypes if d not in DTYPES]
    if unknown or not args.dtypes:
        raise SystemExit(f"perf_device: --dtypes takes {sorted(DTYPES)} (got {unknown or args.dtypes})")
    args.sizes = parse_sizes(args.sizes)
    args.losses = [n.strip() for n in args.losses.split(",") if n.strip()]
    check_losses(args.losses)
    if args.repeats < 1 or args.warmup < 0:
        raise SystemExit(f"perf_device: --repeats must be >= 1 and --warmup >= 0 (got {args.repeats}, {args.warmup})")
    return args


def check_losses(names: Sequence[str]) -> None:
    """Every name is a registry entry that takes ``(logits, target)`` and builds with its defaults."""
    import losses

    for name in names:
        try:
            spec = losses.get_loss_spec(name)
        except (KeyError, ValueError) as exc:
            raise SystemExit(f"perf_device: --losses: {exc}") from None
        if spec.kind != "logits":
            raise SystemExit(f"perf_device: --losses takes losses of (logits, target); {name!r} takes {spec.kind}")
        try:
            spec.create()
        except (TypeError, ValueError) as exc:
            raise SystemExit(f"perf_device: --losses: {name!r} does not build with its defaults ({exc})") from None


def summarize(times: Dict[str, List[float]], ref: str, floor: str) -> Dict[str, Dict[str, float]]:
    """Median / quartiles per case (milliseconds) and the paired ratios to ``ref`` and ``floor``
    (:func:`perf_losses.paired_ratio`: the median of the per-repetition ratios, repetitions aligned
    by index)."""
    out = {}
    for case, t in times.items():
        row = {"ms": statistics.median(t), "q1": _quantile(t, 0.25), "q3": _quantile(t, 0.75), "n": len(t)}
        for col, other in (("x_ce", ref), ("x_copy", floor)):
            pr = paired_ratio(t, times[other]) if other in times else None
            row[col] = pr["ratio"] if pr else None
        out[case] = row
    return out


def _cases(names: Sequence[str], logits, target) -> Dict[str, Callable[[], None]]:
    import torch.nn.functional as F

    import losses

    cases: Dict[str, Callable[[], None]] = {"copy": lambda: logits.detach().clone()}

    def ce():
        F.cross_entropy(logits, target).backward()

    cases["F.cross_entropy"] = ce
    for name in names:
        module = losses.get_loss_spec(name).create().to(logits.device)

        def step(module=module):
            module(logits, target).backward()

        cases[name] = step
    return cases


def time_cases(cases: Dict[str, Callable[[], None]], device: str, repeats: int, warmup: int, logits) -> Dict:
    import torch

    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times: Dict[str, List[float]] = {k: [] for k in cases}
    errors: Dict[str, str] = {}
    for rep in range(warmup + repeats):
        for name, fn in cases.items():
            if name in errors:
                continue
            logits.grad = None
            try:
                sync()
                if cuda:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    fn()
                    end.record()
                    sync()
                    ms = start.elapsed_time(end)
                else:
                    t0 = time.perf_counter()
                    fn()
                    ms = (time.perf_counter() - t0) * 1e3
            except Exception as exc:  # a loss that fails at this size / dtype: reported, not fatal
                errors[name] = f"{type(exc).__name__}: {exc}"[:200]
                continue
            if rep >= warmup:
                times[name].append(ms)
    return {"times": {k: v for k, v in times.items() if v and k not in errors}, "errors": errors}


def run(args: argparse.Namespace) -> List[Dict]:
    import torch

    import losses

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("perf_device: no CUDA device visible (torch.cuda.is_available() is False); "
                         "run it on a GPU machine or pass --device cpu")
    rows = []
    gen = torch.Generator().manual_seed(0)
    with losses.validation(False):
        for b, c in args.sizes:
            for dt in args.dtypes:
                dtype = getattr(torch, DTYPES[dt])
                logits = (torch.randn(b, c, generator=gen) * 3).to(args.device, dtype).requires_grad_(True)
                target = torch.randint(0, c, (b,), generator=gen).to(args.device)
                res = time_cases(_cases(args.losses, logits, target), args.device, args.repeats, args.warmup, logits)
                stats = summarize(res["times"], "F.cross_entropy", "copy")
                for case in ["copy", "F.cross_entropy", *args.losses]:
                    row = {"device": args.device, "dtype": dt, "B": b, "C": c, "case": case,
                           "error": res["errors"].get(case, "")}
                    row.update(stats.get(case, {}))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


def _fmt(v, spec: str) -> str:
    return "" if v is None or v == "" else format(v, spec)


def write(rows: List[Dict], out: str, meta: Dict) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "device.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in COLUMNS})
    lines = [f"# Performance on {meta.get('device_name', meta.get('device', '?'))}", "",
             f"torch {meta.get('torch', '?')}; forward + backward, data checks off, cases timed interleaved "
             f"({meta.get('repeats', '?')} repetitions after {meta.get('warmup', '?')} warm-up); x_ce and x_copy "
             "are medians of the per-repetition ratios to `F.cross_entropy` and to a device copy of the logits "
             "(the bandwidth floor).", "",
             "| dtype | B | C | case | ms (median) | q1-q3 | x F.cross_entropy | x copy | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['B']} | {r['C']} | {r['case']} | {_fmt(r.get('ms'), '.4f')} | "
                     f"{_fmt(r.get('q1'), '.4f')}-{_fmt(r.get('q3'), '.4f')} | {_fmt(r.get('x_ce'), '.2f')} | "
                     f"{_fmt(r.get('x_copy'), '.2f')} | {r.get('error', '')} |")
    with open(os.path.join(out, "device.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "device_meta.json"), "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True)


def main(argv: Sequence[str] = None) -> int:
    import torch

    args = parse_args(argv)
    rows = run(args)
    meta = {"device": args.device, "torch": torch.__version__, "repeats": args.repeats, "warmup": args.warmup,
            "device_name": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "CPU"}
    write(rows, args.out, meta)
    print(f"perf_device: wrote {os.path.join(args.out, 'device.md')}")
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
