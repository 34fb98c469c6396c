"""Where the time of a loss goes: operator profiles of the rows the performance targets name.

``python benchmarks/profile_losses.py [--out results/perf] [--small]`` profiles, with
``torch.profiler`` on one CPU thread, forward + backward of each loss whose timing target was
missed (or that is close to one), beside the reference it is compared with, and writes
``profile.md`` / ``profile.csv``:

* **Operators** - per case, the operators by self CPU time (eager: aten operators; compiled: the
  inductor kernels, named after the operations they fuse, with kernel profiling switched on), their
  share of the step and how many times each ran per step. The cases are built exactly as
  ``benchmarks/perf_losses.py`` builds them (same inputs, data checks off).
* Dice: MONAI's ``DiceLoss(softmax=True, batch=True)`` beside ``soft_dice_loss`` and
  ``dice_semimetric_loss`` on ``(16, 11, 64, 64)`` maps with ids (built as the peers suite builds
  them; MONAI is left out when it is not installed).
* **Unit costs** - the time of one elementwise pass over the same ``(B, C)`` logits: a copy (one
  read, one write: the floor of a single-pass loss), ``exp``, ``log``, ``log1p``, ``tanh``,
  ``sigmoid``, ``torch.where``; a loss that needs ``n`` transcendental passes per element cannot
  run faster than about ``n`` times that unit, whatever it fuses.

Profiles are measured, not timed head to head: for ratios use ``perf_losses.py`` (interleaved,
medians). ``--small`` (CI) profiles C = 10 only.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
import warnings
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import perf_losses as pl  # noqa: E402  (the cases are built by the timing script)

#: the cases profiled: (label, perf_losses case); each size also profiles its reference
LOGIT_LOSSES = ("gol", "bce_with_logits", "comp_sum", "logz_penalty", "z_loss")
COMPILED_LOSSES = ("bce_with_logits", "comp_sum", "gol", "sparsemax", "entmax15")
#: the smoke run (``--small``) compiles one of them: every compiled case goes through the same
#: inductor profiling path, and each compile costs seconds of C++ builds on a CPU
SMALL_COMPILED_LOSSES = ("gol",)
UNIT_OPS = ("copy", "exp", "log", "log1p", "tanh", "sigmoid", "where")


def cases(small: bool) -> List[Dict]:
    out: List[Dict] = []
    sizes = (10,) if small else (1000, 100000)
    for c in sizes:
        out.append({"name": "F.cross_entropy", "B": 256, "C": c, "kind": "ref", "label": "F.cross_entropy"})
        for name in LOGIT_LOSSES:
            out.append({"name": name, "B": 256, "C": c, "kind": "logits", "kwargs": {}, "label": name})
        out.append({"name": "linear+F.cross_entropy", "B": 256, "C": c, "D": 128, "kind": "ref",
                    "label": "linear+F.cross_entropy"})
        out.append({"name": "margin_softmax", "B": 256, "C": c, "D": 128, "kind": "embeddings", "kwargs": {},
                    "label": "margin_softmax"})
        out.append({"name": "F.cross_entropy", "B": 256, "C": c, "kind": "ref", "compile": True,
                    "label": "F.cross_entropy (compiled)"})
        for name in SMALL_COMPILED_LOSSES if small else COMPILED_LOSSES:
            out.append({"name": name, "B": 256, "C": c, "kind": "logits", "kwargs": {}, "compile": True,
                        "label": f"{name} (compiled)"})
    dice_shape = [2, 11, 16, 16] if small else [16, 11, 64, 64]
    label = "x".join(map(str, dice_shape))
    for impl in ("monai.DiceLoss", "losses.soft_dice_loss", "losses.dice_semimetric_loss"):
        if impl.startswith("monai") and not pl._installed("monai"):
            continue
        out.append({"peer": True, "family": "dice", "shape": dice_shape, "impl": impl, "target": "id",
                    "label": f"{impl} ({label}, ids)", "B": dice_shape[0], "C": dice_shape[1]})
    return out


def unit_costs(b: int, c: int, reps: int) -> Dict[str, float]:
    """Median CPU milliseconds of one elementwise pass over a ``(b, c)`` float32 tensor."""
    import torch

    x = torch.randn(b, c, generator=torch.Generator().manual_seed(0))
    keep = torch.ones(b, 1, dtype=torch.bool)
    zero = torch.zeros(())
    ops = {"copy": lambda: x.clone(), "exp": lambda: torch.exp(x), "log": lambda: torch.log(x.abs()),
           "log1p": lambda: torch.log1p(x.abs()), "tanh": lambda: torch.tanh(x), "sigmoid": lambda: torch.sigmoid(x),
           "where": lambda: torch.where(keep, x, zero),
           "abs": lambda: x.abs()}  # log / log1p run on |x|: the abs pass is timed and subtracted below
    times: Dict[str, List[float]] = {k: [] for k in ops}
    for _ in range(2):
        for f in ops.values():
            f()
    for _ in range(reps):
        for k, f in ops.items():  # interleaved: drift hits every op alike
            t = time.process_time()
            f()
            times[k].append(time.process_time() - t)
    med = {k: 1000.0 * statistics.median(v) for k, v in times.items()}
    for k in ("log", "log1p"):
        med[k] = max(0.0, med[k] - med["abs"])
    med.pop("abs")
    return med


def profile_case(case: Dict, steps: int) -> Dict:
    """Self CPU time per operator (ms per step), the step's total and the call counts."""
    from torch.profiler import ProfilerActivity, profile

    import losses

    if case.get("compile"):
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True  # name each generated kernel in the profile
    with losses.validation(False), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step, tensors = (pl._build_peer if case.get("peer") else pl._build)(case)
        for _ in range(3):  # warm-up (compilation happens here)
            step()
            pl._zero(tensors)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                step()
                pl._zero(tensors)
    rows = []
    for e in prof.key_averages():
        if e.self_cpu_time_total <= 0:
            continue
        rows.append({"op": e.key, "self_ms": e.self_cpu_time_total / 1000.0 / steps, "calls": e.count / steps})
    rows.sort(key=lambda r: -r["self_ms"])
    total = sum(r["self_ms"] for r in rows)
    for r in rows:
        r["share"] = r["self_ms"] / total if total else 0.0
    return {"total_ms": total, "ops": rows}


def run(out: str, small: bool, steps: int, top: int) -> str:
    import torch

    torch.set_num_threads(1)
    results, csv_rows = [], []
    for case in cases(small):
        res = profile_case(case, steps)
        results.append((case, res))
        for r in res["ops"]:
            csv_rows.append({"label": case["label"], "B": case["B"], "C": case["C"], "op": r["op"],
                             "self_ms": round(r["self_ms"], 4), "share": round(r["share"], 4),
                             "calls_per_step": round(r["calls"], 2), "step_ms": round(res["total_ms"], 4)})
        print(f"{case['label']}: {res['total_ms']:.2f} ms", flush=True)
    sizes = sorted({c["C"] for c, _ in results if not c.get("peer")})
    units = {c: unit_costs(256, c, 5 if small else 15) for c in sizes}

    meta = pl._meta(1, "cpu")
    lines = ["# Performance: operator profiles", "",
             f"torch {meta['torch']}, Python {meta['python']}, 1 thread, CPU: {meta['cpu']}, {meta['date']}. "
             "Produced by `python benchmarks/profile_losses.py`. `torch.profiler`, CPU activities, "
             f"{steps} forward + backward steps per case after 3 warm-up steps, data checks off; ms = self CPU "
             "time per step (summed over the calls of that operator in a step). Compiled cases show inductor's "
             "generated kernels (`graph_<g>_cpp_fused_<ops>_<n>`). A profile shares the machine with whatever else runs "
             "and adds its own overhead per operator: read shares, not absolute times; the ratios are in "
             "`perf_losses.py`'s reports.", "",
             "## Unit costs of one elementwise pass (B = 256)", "",
             "| C | " + " | ".join(UNIT_OPS) + " |", "|---|" + "---|" * len(UNIT_OPS)]
    for c in sizes:
        lines.append(f"| {c} | " + " | ".join(f"{units[c][k]:.2f}" for k in UNIT_OPS) + " |")
    lines += ["", "ms per pass (median of interleaved repetitions, CPU time); `log` and `log1p` are timed on "
              "`|x|` with the `abs` pass subtracted.", ""]
    sections = [(f"C = {c}", lambda case, c=c: not case.get("peer") and case["C"] == c) for c in sizes]
    sections.append(("Dice on segmentation maps (MONAI's DiceLoss beside the project's)",
                     lambda case: case.get("family") == "dice"))
    for title, member in sections:
        lines += [f"## {title}", ""]
        for case, res in results:
            if not member(case):
                continue
            where = (f"shape {'x'.join(map(str, case['shape']))}" if case.get("peer") else
                     f"B = {case['B']}, C = {case['C']}{', D = ' + str(case['D']) if 'D' in case else ''}")
            lines += [f"### {case['label']} ({where}): {res['total_ms']:.2f} ms per step", "",
                      "| operator | ms | share | calls |", "|---|---|---|---|"]
            for r in res["ops"][:top]:
                op = r["op"].replace("|", "\\|")
                lines.append(f"| `{op}` | {r['self_ms']:.3f} | {100 * r['share']:.1f}% | {r['calls']:.0f} |")
            lines.append("")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "profile.md")
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")
    with open(os.path.join(out, "profile.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(csv_rows[0]))
        w.writeheader()
        w.writerows(csv_rows)
    with open(os.path.join(out, "profile_units.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["C"] + list(UNIT_OPS))
        for c in sizes:
            w.writerow([c] + [round(units[c][k], 4) for k in UNIT_OPS])
    return path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join("results", "perf"))
    p.add_argument("--small", action="store_true", help="C = 10 only, one compiled loss (the CI smoke run)")
    p.add_argument("--steps", type=int, default=5, help="profiled steps per case")
    p.add_argument("--top", type=int, default=8, help="operators listed per case")
    args = p.parse_args(argv)
    print(run(args.out, args.small, args.steps, args.top))


if __name__ == "__main__":
    main()
