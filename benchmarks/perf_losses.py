"""Time and peak memory of every registered loss, side by side with ``F.cross_entropy``.

Each configuration runs in a fresh subprocess. Time: forward + backward, median of repeats
after warm-up, in the same process as its ``F.cross_entropy`` reference on the same shapes.
Peak memory: peak RSS minus the RSS after inputs and parameters are allocated (parameters
excluded, their gradients included), measured in a separate fresh subprocess per loss with a
fixed glibc mmap threshold (``MALLOC_MMAP_THRESHOLD_=131072``), so that the peak is that of live
memory and not of blocks the allocator keeps cached after freeing them.
Data checks are off (``losses.validation(False)``), as the performance targets specify.

Usage::

    python benchmarks/perf_losses.py                       # suite "losses", C in 10..1e5
    python benchmarks/perf_losses.py --suite partial_fc    # Partial FC vs margin softmax, C to 1e6
    python benchmarks/perf_losses.py --suite sparsemax     # sort vs top-k vs bisection
    python benchmarks/perf_losses.py --suite linear_ce     # many-class path vs linear + CE
    python benchmarks/perf_losses.py --suite all --out results/perf

Writes ``<out>/<suite>.csv``, ``<out>/<suite>.md`` and ``<out>/<suite>.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# --------------------------------------------------------------------------------------
# worker side (runs in a fresh subprocess)
# --------------------------------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _build(case: Dict) -> tuple:
    """Return ``(step, n_param_bytes)``: ``step()`` runs one forward + backward."""
    import torch
    import torch.nn.functional as F

    import losses

    torch.manual_seed(0)
    b, c, d = case["B"], case["C"], case.get("D", 128)
    name = case["name"]
    g = torch.Generator().manual_seed(0)

    if name == "F.cross_entropy":
        x = torch.randn(b, c, generator=g).requires_grad_(True)
        y = torch.randint(0, c, (b,), generator=g)
        return (lambda: F.cross_entropy(x, y).backward()), {"x": x}
    if name == "linear+F.cross_entropy":
        x = torch.randn(b, d, generator=g).requires_grad_(True)
        w = (torch.randn(c, d, generator=g) * 0.01).requires_grad_(True)
        y = torch.randint(0, c, (b,), generator=g)
        return (lambda: F.cross_entropy(x @ w.T, y).backward()), {"x": x, "w": w}

    spec = losses.get_loss_spec(name)
    kwargs = dict(case.get("kwargs", {}))
    if spec.owns_head:
        kwargs.update(embedding_dim=d, num_classes=c)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = spec.create(**kwargs)
    if spec.kind == "logits":
        x = torch.randn(b, c, generator=g).requires_grad_(True)
        y = torch.randint(0, c, (b,), generator=g)
        args = (x, y)
    elif spec.kind == "embeddings":
        x = torch.randn(b, d, generator=g).requires_grad_(True)
        y = torch.randint(0, c, (b,), generator=g)
        args = (x, y)
    elif spec.kind == "scores":
        x = torch.randn(b, c, generator=g).requires_grad_(True)
        y = torch.randint(0, c, (b,), generator=g)
        args = (x, y)
    elif spec.kind == "pairs":
        pos = torch.rand(b, generator=g).mul(2).sub(1).requires_grad_(True)
        neg = torch.rand(b, c, generator=g).mul(2).sub(1).requires_grad_(True)
        args = (pos, neg)
    elif spec.kind == "model":
        model = torch.nn.Linear(d, c)
        x = torch.rand(b, d, generator=g)
        y = torch.randint(0, c, (b,), generator=g)
        args = (model, x, y)
    else:  # pragma: no cover
        raise ValueError(spec.kind)
    tensors = {f"a{i}": a for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    tensors.update({n: p for n, p in module.named_parameters()})

    def step():
        module(*args).backward()

    return step, tensors


def worker(case: Dict) -> Dict:
    import torch

    import losses

    torch.set_num_threads(case["threads"])
    with losses.validation(False):
        step, tensors = _build(case)
        base = _rss_bytes()
        if case["mode"] == "memory":
            step()
            peak = _peak_rss_bytes()
            return {"peak_mb": max(peak - base, 0) / 2**20}
        for _ in range(case["warmup"]):
            step()
            for t in tensors.values():
                t.grad = None
        times = []
        clock = time.process_time if case.get("clock") == "process" else time.perf_counter
        budget = time.perf_counter() + case["max_seconds"]
        for _ in range(case["repeats"]):
            t0 = clock()
            step()
            times.append(clock() - t0)
            for t in tensors.values():
                t.grad = None
            if time.perf_counter() > budget and len(times) >= 3:
                break
        return {"ms": 1e3 * statistics.median(times), "n": len(times)}


def _run_case(case: Dict, timeout: float = 900.0) -> Dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(case["threads"]), PYTHONPATH=ROOT)
    if case["mode"] == "memory":
        # A fixed glibc mmap threshold returns every large freed block to the OS at once, so the
        # peak RSS is the peak of live memory rather than of the allocator's cached free blocks
        # (with glibc's dynamic threshold the same run varied between 147 and 265 MB).
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(case)],
        capture_output=True, text=True, timeout=timeout, env=env,
    )
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": err[:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------
# suites
# --------------------------------------------------------------------------------------

SINGLE_PASS = ("z_loss", "logz_penalty", "comp_sum", "gol")


def suite_cases(suite: str, classes: List[int]) -> List[Dict]:
    import losses

    cases: List[Dict] = []
    if suite == "losses":
        for c in classes:
            cases.append({"name": "F.cross_entropy", "B": 256, "C": c, "kind": "ref"})
            cases.append({"name": "linear+F.cross_entropy", "B": 256, "C": c, "D": 128, "kind": "ref"})
            for spec in losses.list_losses():
                if spec.name == "partial_fc":
                    kw = {"sample_rate": 0.1, "seed": 0}
                elif spec.name == "soft_topk":
                    kw = {"k": min(5, c - 1)}
                elif spec.name == "adversarial_comp_sum":
                    kw = {"nu": 1.0}
                elif spec.name == "cosine_softmax":
                    kw = dict(spec.example_kwargs)
                    kw.pop("embedding_dim", None)
                    kw.pop("num_classes", None)
                else:
                    kw = {}
                if spec.name == "soft_topk" and c < 3:
                    continue
                cases.append({"name": spec.name, "B": 256, "C": c, "D": 128, "kind": spec.kind, "kwargs": kw})
    elif suite == "sparsemax":
        for c in classes:
            cases.append({"name": "F.cross_entropy", "B": 256, "C": c, "kind": "ref"})
            cases.append({"name": "sparsemax", "label": "sparsemax (sort)", "B": 256, "C": c, "kind": "logits",
                          "kwargs": {}})
            cases.append({"name": "sparsemax", "label": "sparsemax (top-k 100)", "B": 256, "C": c, "kind": "logits",
                          "kwargs": {"k": min(100, c)}})
            cases.append({"name": "entmax15", "label": "entmax15 (sort)", "B": 256, "C": c, "kind": "logits",
                          "kwargs": {}})
            cases.append({"name": "entmax_bisect", "label": "entmax_bisect (alpha=2)", "B": 256, "C": c,
                          "kind": "logits", "kwargs": {"alpha": 2.0}})
    elif suite == "partial_fc":
        for c in classes:
            cases.append({"name": "linear+F.cross_entropy", "B": 256, "C": c, "D": 128, "kind": "ref"})
            cases.append({"name": "margin_softmax", "B": 256, "C": c, "D": 128, "kind": "embeddings", "kwargs": {}})
            for rate in (0.1, 1.0):
                cases.append({"name": "partial_fc", "label": f"partial_fc (rate {rate})", "B": 256, "C": c,
                              "D": 128, "kind": "embeddings", "kwargs": {"sample_rate": rate, "seed": 0}})
    elif suite == "targets":
        # the first performance targets, each next to its reference in the same run
        for c in (1000, 100000):
            cases.append({"name": "F.cross_entropy", "B": 256, "C": c, "kind": "ref"})
            cases.append({"name": "linear+F.cross_entropy", "B": 256, "C": c, "D": 128, "kind": "ref"})
            for name in SINGLE_PASS + ("sparsemax", "margin_softmax"):
                cases.append({"name": name, "B": 256, "C": c, "D": 128, "kind": "logits", "kwargs": {}})
        cases.append({"name": "sparsemax", "label": "sparsemax (top-k 100)", "B": 256, "C": 100000, "kind": "logits",
                      "kwargs": {"k": 100}})
        cases.append({"name": "linear+F.cross_entropy", "B": 256, "C": 1000000, "D": 128, "kind": "ref"})
        cases.append({"name": "margin_softmax", "B": 256, "C": 1000000, "D": 128, "kind": "embeddings", "kwargs": {}})
        cases.append({"name": "partial_fc", "label": "partial_fc (rate 0.1)", "B": 256, "C": 1000000, "D": 128,
                      "kind": "embeddings", "kwargs": {"sample_rate": 0.1, "seed": 0}})
        cases.append({"name": "linear+F.cross_entropy", "B": 1024, "C": 100000, "D": 256, "kind": "ref"})
        cases.append({"name": "linear_cross_entropy", "B": 1024, "C": 100000, "D": 256, "kind": "embeddings",
                      "kwargs": {"bias": False}})
    elif suite == "linear_ce":
        for c in classes:
            cases.append({"name": "linear+F.cross_entropy", "B": 1024, "C": c, "D": 256, "kind": "ref"})
            cases.append({"name": "linear_cross_entropy", "B": 1024, "C": c, "D": 256, "kind": "embeddings",
                          "kwargs": {"bias": False}})
    else:
        raise SystemExit(f"unknown suite {suite!r}")
    for case in cases:
        case.setdefault("label", case["name"])
    return cases


DEFAULT_CLASSES = {
    "losses": [10, 1000, 10000, 100000],
    "sparsemax": [10, 1000, 10000, 100000],
    "partial_fc": [10000, 100000, 1000000],
    "linear_ce": [10000, 100000],
    "targets": [],
}


def run_suite(suite: str, classes: List[int], threads: int, out: str, repeats: int, max_seconds: float,
              skip_memory: bool, clock: str = "wall") -> List[Dict]:
    import torch

    rows = []
    for case in suite_cases(suite, classes):
        base = dict(case, threads=threads, repeats=repeats, warmup=2, max_seconds=max_seconds, clock=clock)
        timing = _run_case(dict(base, mode="time"))
        memory = {} if skip_memory else _run_case(dict(base, mode="memory"))
        row = {
            "suite": suite, "loss": case["label"], "B": case["B"], "C": case["C"], "D": case.get("D", ""),
            "ms": timing.get("ms"), "peak_mb": memory.get("peak_mb"),
            "error": timing.get("error") or memory.get("error") or "",
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    # ratios to the references of the same shape
    for row in rows:
        for ref in ("F.cross_entropy", "linear+F.cross_entropy"):
            match = [r for r in rows if r["loss"] == ref and r["C"] == row["C"] and r["B"] == row["B"]]
            key = "x_ce" if ref == "F.cross_entropy" else "x_linear_ce"
            if match and match[0]["ms"] and row["ms"]:
                row[key] = row["ms"] / match[0]["ms"]
            if match and match[0]["peak_mb"] and row["peak_mb"] is not None:
                row[key + "_mem"] = row["peak_mb"] / match[0]["peak_mb"] if match[0]["peak_mb"] > 0 else None
    os.makedirs(out, exist_ok=True)
    meta = {
        "torch": torch.__version__, "threads": threads, "clock": clock, "cpu": _cpu_name(), "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }
    _write(rows, suite, out, meta)
    return rows


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _fmt(v, digits=2) -> str:
    if v is None or v == "":
        return ""
    return f"{v:.{digits}f}"


def _write(rows: List[Dict], suite: str, out: str, meta: Dict) -> None:
    fields = ["suite", "loss", "B", "C", "D", "ms", "peak_mb", "x_ce", "x_linear_ce", "x_ce_mem",
              "x_linear_ce_mem", "error"]
    with open(os.path.join(out, f"{suite}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    lines = [
        f"# Performance: `{suite}`",
        "",
        f"torch {meta['torch']}, Python {meta['python']}, {meta['threads']} thread(s), CPU: {meta['cpu']}, "
        f"{meta['date']}, clock: {meta['clock']}. Forward + backward, median ms; peak MB = peak RSS minus RSS after allocation "
        "(fresh process per cell, glibc `MALLOC_MMAP_THRESHOLD_=131072` so freed blocks leave the RSS). Data checks off. `x CE` = time / `F.cross_entropy` on (B, C) logits; "
        "`x lin+CE` = time / a plain `x @ W.T` + `F.cross_entropy` of the same size.",
        "",
        "| loss | B | C | D | ms | x CE | x lin+CE | peak MB | mem x CE | mem x lin+CE | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['loss']} | {r['B']} | {r['C']:g} | {r['D']} | {_fmt(r['ms'])} | {_fmt(r.get('x_ce'))} | "
            f"{_fmt(r.get('x_linear_ce'))} | {_fmt(r['peak_mb'], 1)} | {_fmt(r.get('x_ce_mem'))} | "
            f"{_fmt(r.get('x_linear_ce_mem'))} | {r['error']} |"
        )
    with open(os.path.join(out, f"{suite}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional
        return
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for label in dict.fromkeys(r["loss"] for r in rows):
        pts = [r for r in rows if r["loss"] == label and r["ms"]]
        if len(pts) < 1:
            continue
        style = "k--" if "cross_entropy" in label and label.startswith(("F.", "linear+")) else "-o"
        axes[0].plot([p["C"] for p in pts], [p["ms"] for p in pts], style, label=label, markersize=3)
        mpts = [p for p in pts if p["peak_mb"] is not None]
        if mpts:
            axes[1].plot([p["C"] for p in mpts], [max(p["peak_mb"], 1e-2) for p in mpts], style, label=label,
                         markersize=3)
    for ax, ylab in zip(axes, ("forward+backward time (ms)", "peak memory (MB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("number of classes C")
        ax.set_ylabel(ylab)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=6, ncol=2)
    fig.suptitle(f"{suite}: torch {meta['torch']}, {meta['threads']} thread(s)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"{suite}.png"), dpi=110)
    plt.close(fig)


#: (description, loss label, B, C, reference label, metric ("x" time or "mem"), bound)
TARGETS = [
    *[(f"{n} <= 2x F.cross_entropy at (256, 1e3)", n, 256, 1000, "F.cross_entropy", "x", 2.0) for n in SINGLE_PASS],
    *[(f"{n} <= 1.5x F.cross_entropy at (256, 1e5)", n, 256, 100000, "F.cross_entropy", "x", 1.5)
      for n in SINGLE_PASS],
    ("sparsemax (full sort) <= 5x F.cross_entropy at (256, 1e3)", "sparsemax", 256, 1000, "F.cross_entropy", "x", 5.0),
    ("sparsemax (top-k) <= 2x F.cross_entropy at (256, 1e5)", "sparsemax (top-k 100)", 256, 100000,
     "F.cross_entropy", "x", 2.0),
    ("margin softmax <= 1.5x linear + CE at (256, 1e3, D=128)", "margin_softmax", 256, 1000,
     "linear+F.cross_entropy", "x", 1.5),
    ("margin softmax <= 1.5x linear + CE at (256, 1e5, D=128)", "margin_softmax", 256, 100000,
     "linear+F.cross_entropy", "x", 1.5),
    ("Partial FC (0.1) <= 0.2x time of full margin softmax at C=1e6, D=128", "partial_fc (rate 0.1)", 256, 1000000,
     "margin_softmax", "x", 0.2),
    ("Partial FC (0.1) <= 0.3x peak memory of full margin softmax at C=1e6, D=128", "partial_fc (rate 0.1)", 256,
     1000000, "margin_softmax", "mem", 0.3),
    ("linear_cross_entropy <= 0.25x peak memory of linear + CE at (1024, 1e5, D=256)", "linear_cross_entropy", 1024,
     100000, "linear+F.cross_entropy", "mem", 0.25),
    ("linear_cross_entropy <= 1.5x time of linear + CE at (1024, 1e5, D=256)", "linear_cross_entropy", 1024, 100000,
     "linear+F.cross_entropy", "x", 1.5),
]


def write_targets(rows: List[Dict], out: str) -> None:
    """Evaluate :data:`TARGETS` on one run's rows and write ``targets_verdicts.md``."""
    def find(label, b, c):
        m = [r for r in rows if r["loss"] == label and r["B"] == b and r["C"] == c]
        return m[0] if m else None

    lines = ["| target | measured | verdict |", "|---|---|---|"]
    for desc, label, b, c, ref, metric, bound in TARGETS:
        r, q = find(label, b, c), find(ref, b, c)
        key = "ms" if metric == "x" else "peak_mb"
        if not r or not q or not r.get(key) or not q.get(key):
            lines.append(f"| {desc} | not measured | — |")
            continue
        ratio = r[key] / q[key]
        lines.append(f"| {desc} | {ratio:.2f}x ({r[key]:.1f} vs {q[key]:.1f} {'ms' if metric == 'x' else 'MB'}) | "
                     f"{'met' if ratio <= bound else 'missed'} |")
    with open(os.path.join(out, "targets_verdicts.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--suite", default="losses",
                   choices=["losses", "sparsemax", "partial_fc", "linear_ce", "targets", "all"])
    p.add_argument("--classes", type=lambda s: [int(float(v)) for v in s.split(",")], default=None,
                   help="comma-separated class counts (default per suite)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--max-seconds", type=float, default=10.0, help="time budget per timing cell")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--clock", choices=["wall", "process"], default="wall",
                   help="wall: perf_counter; process: CPU time of the process (robust on a shared machine "
                        "when --threads 1)")
    p.add_argument("--out", default=os.path.join(ROOT, "results", "perf"))
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    suites = ["losses", "sparsemax", "partial_fc", "linear_ce", "targets"] if args.suite == "all" else [args.suite]
    for suite in suites:
        rows = run_suite(suite, args.classes or DEFAULT_CLASSES[suite], args.threads, args.out, args.repeats,
                         args.max_seconds, args.skip_memory, args.clock)
        if suite == "targets":
            write_targets(rows, args.out)


if __name__ == "__main__":
    main()
