"""Step 4 of the pipeline, the figures the reports embed (matplotlib, ``Agg``): per benchmark,
``<benchmark>_forest.png`` (every paired check's mean difference and CI against 0 and its margin,
:func:`plot_forest`), ``<benchmark>.png`` (per claim, the arms' mean +- sd of its plot metric,
:func:`plot_claims`), ``<benchmark>_curves.png`` (per claim, the arms' validation curves where the
runs recorded them, :func:`plot_curves`), ``<benchmark>_lt_per_class.png`` (the per-class test
accuracy of the long-tailed arms, :func:`plot_per_class`) and ``<benchmark>_sweep.png`` (a
learning-rate sensitivity claim's sweep: final loss against the learning rate, and the per-step
log Z of its tuning runs, :func:`plot_sweep`).
"""

from __future__ import annotations

import math
from typing import Dict, Sequence

from .analysis import _mean_sd, curve_of, per_seed, sweep_by_rate
from .claims import SENSITIVITY_KIND, Arm, Claim, sweep_key
from .common import stats
from .reports import check_text

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_forest(benchmark: str, results: Sequence[dict], arms: Dict[str, Arm], path: str) -> int:
    """One row per paired check: mean difference and CI against 0 (and the margin). Returns the rows."""
    plt = _plt()
    items = [(r["claim"], x) for r in results for x in r["checks"] if x["check"].baseline]
    fig, ax = plt.subplots(figsize=(8.5, 0.45 * max(1, len(items)) + 1.4))
    colours = {stats.REPRODUCED: "tab:green", stats.CONTRADICTED: "tab:red", stats.NOT_RESOLVED: "0.45",
               stats.HOLDS: "tab:green", stats.FAILS: "tab:red"}
    labels = []
    for i, (c, x) in enumerate(items):
        ch, ci = x["check"], x["ci"]
        y = len(items) - 1 - i
        r3 = x.get("result")
        labels.append(f"{c.key}: {check_text(ch, arms)}" + (f" [{r3.flag}]" if r3 is not None and r3.flag else "")
                      + (" (primary)" if r3 is not None and r3.role == "primary" else ""))
        if ch.margin:
            kind = ch.rule_kind()
            lo = -ch.margin if kind == "equivalent" or ch.better == "higher" else -math.inf
            hi = ch.margin if kind == "equivalent" or ch.better == "lower" else math.inf
            ax.fill_betweenx([y - 0.35, y + 0.35], max(lo, -1.0), min(hi, 1.0), color="tab:blue", alpha=0.12, lw=0)
        if math.isfinite(ci.mean):
            if math.isfinite(ci.low):
                ax.plot([ci.low, ci.high], [y, y], color=colours[x["verdict"]], lw=2)
            ax.plot([ci.mean], [y], "o", color=colours[x["verdict"]])
    ax.axvline(0.0, color="k", lw=0.8)
    ax.set_yticks(range(len(items)))
    ax.set_yticklabels(list(reversed(labels)), fontsize=7)
    rev3 = any(x.get("result") is not None for _, x in items)
    ax.set_xlabel("family - baseline (paired over seeds): mean and 95% CI"
                  + (" (secondary checks: Holm-adjusted CI)" if rev3 else "") + "; shaded: declared margin")
    finite = [v for _, x in items for v in (x["ci"].low, x["ci"].high, x["ci"].mean) if math.isfinite(v)]
    if finite:
        span = max(abs(min(finite)), abs(max(finite)), 1e-3) * 1.3
        ax.set_xlim(-span, span)
    ax.set_title(f"{benchmark}: paired differences (green reproduced, red contradicted, grey not resolved)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(items)


def plot_claims(benchmark: str, claims: Sequence[Claim], rows: Sequence[dict], arms: Dict[str, Arm], path: str) -> None:
    plt = _plt()
    n = len(claims)
    cols = min(3, n)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.6 * nrows), squeeze=False)
    for ax, c in zip(axes.flat, claims):
        ms, ss = [], []
        for k in c.arms:
            m, s = _mean_sd(list(per_seed(rows, k, c.plot).values()))
            ms.append(m if math.isfinite(m) else 0.0)
            ss.append(s if math.isfinite(s) else 0.0)
        ax.bar(range(len(c.arms)), ms, yerr=ss, capsize=3, color=[f"C{i}" for i in range(len(c.arms))])
        ax.set_xticks(range(len(c.arms)))
        ax.set_xticklabels([arms[k].label for k in c.arms], rotation=30, ha="right", fontsize=7)
        ax.set_title(f"{c.key}: {c.plot.split('/', 1)[-1]}", fontsize=9)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(f"{benchmark}: mean ± sd over seeds (test split)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(benchmark: str, results: Sequence[dict], rows: Sequence[dict], arms: Dict[str, Arm], path: str) -> bool:
    """Per claim, every arm's validation curve (mean over its evaluation seeds) of the metric the
    claim's budget rule reads; the title says when the claim is budget-limited. Returns whether any
    run had a curve (nothing is written otherwise)."""
    import numpy as np

    items = []
    for res in results:
        c = res["claim"]
        b = res.get("budget")
        prim = next((x["check"] for x in res["checks"] if x.get("result") is not None
                     and x["result"].role == "primary"), res["checks"][0]["check"])
        metric = b["metric"] if b else "val/" + prim.metric.split("/", 1)[-1]
        seeds = set(res.get("seeds") or [])
        series = []
        for k in c.run_arms():
            curves = [v for r in rows if r["arm"] == k and r["phase"] == "eval" and r["ok"]
                      and (not seeds or int(r["seed"]) in seeds) and (v := curve_of(r, metric))]
            if curves:
                n = max(len(v) for v in curves)
                mean = [float(np.nanmean([v[e] if e < len(v) and v[e] is not None else np.nan for v in curves]))
                        for e in range(n)]
                epochs = arms[k].epochs if k in arms and arms[k].epochs else n
                # a point per validation pass: at the end of each epoch, or at each fraction of one when
                # the run validates within it (a one-epoch budget validates every quarter)
                xs = [(e + 1) * epochs / n for e in range(n)]
                series.append((arms[k].label if k in arms else k, xs, mean, len(curves)))
        if series:
            items.append((c, metric, series, bool(b and b["rule"].limited)))
    if not items:
        return False
    plt = _plt()
    cols = min(3, len(items))
    nrows = math.ceil(len(items) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
    for ax, (c, metric, series, limited) in zip(axes.flat, items):
        for label, xs, mean, n in series:
            ax.plot(xs, mean, marker="o", ms=2, lw=1, label=f"{label} (n={n})")
        ax.set_xlabel("epoch")
        ax.set_title(f"{c.key}: {metric.split('/', 1)[-1]}" + (" -- budget-limited" if limited else ""), fontsize=8,
                     color="tab:red" if limited else "k")
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(items):]:
        ax.axis("off")
    if cols > 1:
        fig.suptitle(f"{benchmark}: validation curves of the evaluation runs (mean over seeds)", fontsize=10)
    else:  # one panel: a narrow figure
        fig.suptitle(f"{benchmark}: validation curves\n(evaluation runs, mean over seeds)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_per_class(rows: Sequence[dict], arms: Dict[str, Arm], keys: Sequence[str], path: str,
                   num_classes: int = 10) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 4))
    w = 0.8 / max(1, len(keys))
    for i, k in enumerate(keys):
        ms, ss = [], []
        for c in range(num_classes):
            m, s = _mean_sd(list(per_seed(rows, k, f"test/acc_class_{c}").values()))
            ms.append(m if math.isfinite(m) else 0.0)
            ss.append(s if math.isfinite(s) else 0.0)
        ax.bar([c + (i - (len(keys) - 1) / 2) * w for c in range(num_classes)], ms, w, yerr=ss, capsize=1,
               label=arms[k].label)
    ax.set_xticks(range(num_classes))
    ax.set_xlabel("class (training images per class fall with the class id; tail = 5-9)")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1.1)
    ax.legend(fontsize=6, ncol=4, loc="lower left")
    ax.set_title("long-tailed arms: per-class test accuracy, mean ± sd over seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(benchmark: str, results: Sequence[dict], rows: Sequence[dict], arms: Dict[str, Arm], path: str,
               trace_metric: str = "train/logz_mean") -> bool:
    """The learning-rate sweeps of the claims with an ``lr_sensitivity`` check: per claim, the final
    value of the check's metric against the learning rate (mean over the tuning seeds, diverged runs
    at the cap, log scale; one line per swept arm and group), and per swept arm the per-step
    ``trace_metric`` (log Z) of its first tuning seed's runs, one line per learning rate (the runs
    file's ``trace`` column). Returns whether anything was drawn (nothing is written otherwise)."""
    import json

    panels = []
    for res in results:
        swept = res["claim"].swept_arms()
        if not swept:
            continue
        ch = next(c for c in res["claim"].checks if c.kind == SENSITIVITY_KIND)
        lr_key = sweep_key(arms[ch.family])
        lines = []
        for k in swept:
            for g, d in sorted(sweep_by_rate(ch, rows, k, lr_key).items()):
                xs = sorted(d)
                label = arms[k].label + (f", {ch.group.split('.')[-1]} {json.loads(g)}" if ch.group else "")
                lines.append((label, xs, [sum(stats.capped(v, ch.cap) for v in d[x]) / len(d[x]) for x in xs]))
        traces = []
        for k in swept:
            tune = sorted((r for r in rows if r["arm"] == k and r.get("phase") == "tune" and r.get("trace")),
                          key=lambda r: (int(r["seed"]), r["params"]))
            first = [r for r in tune if int(r["seed"]) == int(tune[0]["seed"])] if tune else []
            series = []
            for r in first:
                t = (json.loads(r["trace"]) if isinstance(r["trace"], str) else r["trace"]).get(trace_metric)
                if t:
                    p = json.loads(r["params"])
                    grp = f", {ch.group.split('.')[-1]} {p.get(ch.group)}" if ch.group else ""
                    series.append((f"lr {p[lr_key]:g}{grp}", [x[0] for x in t], [x[1] for x in t]))
            if series:
                traces.append((arms[k].label, int(first[0]["seed"]), series))
        if lines:
            panels.append((res["claim"], ch, lines, traces))
    if not panels:
        return False
    plt = _plt()
    cols = 1 + max(len(t) for _, _, _, t in panels)
    fig, axes = plt.subplots(len(panels), cols, figsize=(4.4 * cols, 3.4 * len(panels)), squeeze=False)
    for row, (c, ch, lines, traces) in zip(axes, panels):
        ax = row[0]
        for label, xs, ys in lines:
            ax.plot(xs, ys, marker="o", ms=3, lw=1, label=label)
        ax.axhline(ch.cap, color="0.5", lw=0.8, ls="--", label=f"cap {ch.cap:g}")
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel(f"final {ch.metric}")
        ax.set_title(f"{c.key}: the sweep (mean over tuning seeds)", fontsize=8)
        ax.legend(fontsize=5)
        for ax, (label, seed, series) in zip(row[1:], traces):
            for name, xs, ys in series:
                ax.plot(xs, ys, lw=0.8, label=name)
            ax.set_xlabel("step")
            ax.set_ylabel(trace_metric)
            ax.set_title(f"{label}: tuning seed {seed}", fontsize=8)
            ax.legend(fontsize=5)
        for ax in row[1 + len(traces):]:
            ax.axis("off")
    fig.suptitle(f"{benchmark}: learning-rate sweeps", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
