"""Recompute every revision-4 verdict from the committed runs, independently of the pipeline.

    python benchmarks/recompute_revision4.py [--claims-file benchmarks/claims_revision4.yaml]
                                             [--results results/revision4] [--resamples 10000]

Reads only the claims file (YAML), the runs files (``<benchmark>_runs.csv``) and the per-item test
records (``<benchmark>_test_items/<arm>__s<seed>.npz``) of a results folder, with numpy and scipy:
nothing of ``benchmarks/stats.py`` or ``benchmarks/reproduce`` is imported, so an error in the
pipeline's statistics does not repeat here. For each claim it rebuilds, from the protocol's
definitions (docs/benchmarks.md, "Protocol, revision 4"):

* the primary check's per-seed values: ``family - baseline`` of the evaluation runs (phase ``eval``,
  seeds ``0 .. seeds - 1``, both arms finished), or for a difference in differences
  ``(family - baseline) - (clean_family - clean_baseline)``, or for a learning-rate sensitivity
  (``lr_sensitivity``) per tuning seed and sweep of the tuning runs (phase ``tune``) ``S(family) -
  S(baseline)`` with ``S = mean over the learning rates of min(final loss, cap) - its minimum``
  (a diverged run, non-finite or failed on a non-finite value, at the cap);
* its margin (declared, or ``relative_margin`` times the baseline's error: ``1 - mean`` where higher
  is better, the mean where lower is better);
* the paired t interval (95%) and, for a paired check whose metric is a mean over test items (or
  over classes), the two-level bootstrap over seeds and test items (one item resample per
  replicate, shared by the seeds and both arms; its own random stream; for a mean of per-class
  means, such as balanced accuracy, the items resampled within their classes), the verdict read
  from the wider of the two;
* the verdict (higher / lower: the interval beyond 0; not worse: above ``-margin``; equivalent:
  inside ``+-margin``; contradicted where the interval lies wholly on the wrong side), then the
  competence floors (an arm whose mean is not above its floor makes the claim invalid), the
  manipulation checks (a failed one: not tested), a declared not-applicable reason, and the
  replicate at a multiple of the budget (a decided verdict whose replicate mean lies on the other
  side of the decision boundary becomes not resolved).

It prints one line per claim beside the verdict the pipeline wrote in ``summary.md`` and exits 1 if
any differs. Two bootstrap streams can disagree on a claim whose interval touches its boundary;
such a line is marked ``boundary`` (within 0.0005 of it) rather than hidden.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import os
import re
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import yaml
from scipy import stats as sps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPRODUCED, CONTRADICTED, NOT_RESOLVED = "reproduced", "contradicted", "not resolved"
INVALID, NOT_TESTED, NOT_APPLICABLE = "invalid", "not tested", "not applicable here"
OPS = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def load_rows(results: str) -> List[dict]:
    rows: List[dict] = []
    for name in sorted(os.listdir(results)):
        if name.endswith("_runs.csv"):
            with open(os.path.join(results, name), newline="") as fh:
                rows += list(csv.DictReader(fh))
    return rows


def per_seed(rows: Sequence[dict], arm: str, metric: str, seeds: Sequence[int], phase: str = "eval") -> Dict[int, float]:
    out = {}
    for r in rows:
        if r["arm"] == arm and r["phase"] == phase and r["ok"] == "True" and int(r["seed"]) in seeds:
            v = r.get(metric, "")
            if v not in ("", None) and math.isfinite(float(v)):
                out[int(r["seed"])] = float(v)
    return out


def differences(ch: dict, rows: Sequence[dict], seeds: Sequence[int], phase: str = "eval") -> Dict[int, float]:
    """Per-seed values of a paired or difference-in-differences check."""
    t = (lambda v: abs(v)) if ch.get("transform") == "abs" else (lambda v: v)
    f = per_seed(rows, ch["family"], ch["metric"], seeds, phase)
    b = per_seed(rows, ch["baseline"], ch["metric"], seeds, phase)
    if ch["kind"] != "did":
        return {s: t(f[s]) - t(b[s]) for s in sorted(set(f) & set(b))}
    cm = ch.get("clean_metric", ch["metric"])
    cf = per_seed(rows, ch.get("clean_family", ch["family"]), cm, seeds, phase)
    cb = per_seed(rows, ch.get("clean_baseline", ch["baseline"]), cm, seeds, phase)
    both = sorted(set(f) & set(b) & set(cf) & set(cb))
    return {s: (f[s] - b[s]) - (cf[s] - cb[s]) for s in both}


def sweep_sensitivities(ch: dict, rows: Sequence[dict], arms: dict) -> Dict[Tuple[int, str], float]:
    """Per (tuning seed, sweep) that both arms ran in full: the family's learning-rate sensitivity
    minus the baseline's, from the tuning rows."""
    cap = float(ch["cap"])
    group = ch.get("group")
    declared: Dict[str, set] = {}
    grid = dict(arms[ch["family"]].get("grid") or {})
    points = grid.pop("points", None) or [dict(zip(grid, vals)) for vals in itertools.product(*grid.values())]
    for p in points:
        declared.setdefault(json.dumps(p.get(group)) if group else "", set()).add(json.dumps(p, sort_keys=True))

    def losses(arm: str) -> Dict[Tuple[int, str], Dict[str, float]]:
        out: Dict[Tuple[int, str], Dict[str, float]] = {}
        for r in rows:
            if r["arm"] != arm or r["phase"] != "tune":
                continue
            failed_nan = r["ok"] != "True" and re.search(r"\bNaN\b|[+-]inf\b|non-finite|not finite",
                                                         r.get("error") or "", re.I)
            if r["ok"] != "True" and not failed_nan:
                continue
            p = json.loads(r["params"])
            v = r.get(ch["metric"], "") if r["ok"] == "True" else ""
            v = float(v) if v not in ("", None) else math.inf
            out.setdefault((int(r["seed"]), json.dumps(p.get(group)) if group else ""), {})[
                json.dumps(p, sort_keys=True)] = min(v, cap) if math.isfinite(v) else cap
        return {k: d for k, d in out.items() if set(d) == declared.get(k[1])}

    def sens(d: Dict[str, float]) -> float:
        x = np.asarray(list(d.values()), dtype=float)
        return float(x.mean() - x.min())

    f, b = losses(ch["family"]), losses(ch["baseline"])
    return {k: sens(f[k]) - sens(b[k]) for k in sorted(set(f) & set(b))}


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Tuple[float, float, float]:
    x = np.asarray(values, dtype=float)
    m = float(x.mean())
    if len(x) < 2:
        return m, float("nan"), float("nan")
    half = float(sps.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return m, m - half, m + half


def item_table(results: str, benchmark: str, arm: str, seed: int,
               metric: str) -> Optional[Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]]:
    """``(item ids, per-item values, classes or None)`` of one run's records for a metric that is a
    mean over items, or a mean over classes of the per-class mean (then only the items of the
    metric's classes, with their classes)."""
    path = os.path.join(results, f"{benchmark}_test_items", f"{arm}__s{seed}.npz")
    if not os.path.exists(path):
        return None
    with np.load(path, allow_pickle=False) as z:
        header = json.loads(str(z["header"]))
        spec = header.get("metrics", {}).get(metric)
        if spec is None or spec.get("agg") not in ("mean", "class_mean"):
            return None
        ids = z[f"{spec['table']}/item"]
        vals = z[f"{spec['table']}/{spec['columns'][0]}"].astype(float)
        cls = z[f"{spec['table']}/{spec['columns'][1]}"].astype(int) if spec["agg"] == "class_mean" else None
    order = np.argsort(ids, kind="stable")
    ids, vals = ids[order], vals[order]
    if cls is None:
        return ids, vals, None
    cls = cls[order]
    keep = np.isin(cls, spec["classes"]) if spec.get("classes") is not None else np.ones(cls.size, bool)
    return ids[keep], vals[keep], cls[keep]


def seeds_by_items(results: str, benchmark: str, ch: dict,
                   seeds: Sequence[int]) -> Optional[Tuple[np.ndarray, Optional[np.ndarray]]]:
    """``(D, classes)``: ``D[s, j]`` = family - baseline on item ``j`` for seed ``s`` and the items'
    classes for a class-mean metric (else ``None``), or ``None`` without records."""
    if ch["kind"] == "did" or ch.get("transform"):
        return None
    rows = []
    ids0 = cls0 = None
    for s in seeds:
        f = item_table(results, benchmark, ch["family"], s, ch["metric"])
        b = item_table(results, benchmark, ch["baseline"], s, ch["metric"])
        if f is None or b is None or not np.array_equal(f[0], b[0]):
            return None
        if (f[2] is None) != (b[2] is None) or (f[2] is not None and not np.array_equal(f[2], b[2])):
            return None
        if ids0 is None:
            ids0, cls0 = f[0], f[2]
        elif not np.array_equal(ids0, f[0]):
            return None
        rows.append(f[1] - b[1])
    return (np.vstack(rows), cls0) if rows else None


def two_level(d: np.ndarray, resamples: int, confidence: float = 0.95, seed: int = 12345,
              classes: Optional[np.ndarray] = None) -> Tuple[float, float]:
    """Percentile interval of mean(D) resampling seeds and (once per replicate) items; with
    ``classes``, of the mean over classes of each class's mean, the items resampled within their
    class."""
    rng = np.random.default_rng(seed)
    n_s, n_i = d.shape
    groups = [np.flatnonzero(classes == c) for c in np.unique(classes)] if classes is not None else None
    means = np.empty(resamples)
    for k in range(resamples):
        s = rng.integers(0, n_s, n_s)
        if groups is None:
            j = rng.integers(0, n_i, n_i)
            means[k] = d[np.ix_(s, j)].mean()
        else:
            means[k] = np.mean([d[np.ix_(s, g[rng.integers(0, g.size, g.size)])].mean() for g in groups])
    a = (1 - confidence) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def verdict(kind: str, better: str, lo: float, hi: float, margin: Optional[float]) -> str:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return NOT_RESOLVED
    if kind in ("higher", "lower", "did"):
        up = kind == "higher" or (kind == "did" and better == "higher")
        if up:
            return REPRODUCED if lo > 0 else CONTRADICTED if hi < 0 else NOT_RESOLVED
        return REPRODUCED if hi < 0 else CONTRADICTED if lo > 0 else NOT_RESOLVED
    if kind == "equivalent":
        if -margin < lo and hi < margin:
            return REPRODUCED
        return CONTRADICTED if (lo > margin or hi < -margin) else NOT_RESOLVED
    if better == "lower":
        lo, hi = -hi, -lo
    return REPRODUCED if lo > -margin else CONTRADICTED if hi < -margin else NOT_RESOLVED


def same_side(kind: str, better: str, v: str, mean: float, margin: Optional[float]) -> bool:
    if kind == "higher":
        return (mean > 0) == (v == REPRODUCED)
    if kind == "lower":
        return (mean < 0) == (v == REPRODUCED)
    if kind == "equivalent":
        return (-margin < mean < margin) == (v == REPRODUCED)
    if kind == "did":
        return (mean > 0 if better == "higher" else mean < 0) == (v == REPRODUCED)
    ok = mean > -margin if better == "higher" else mean < margin
    return ok == (v == REPRODUCED)


def recompute(c: dict, rows: Sequence[dict], results: str, resamples: int,
              arms: Optional[dict] = None) -> Tuple[str, str]:
    """``(verdict, how it was read)`` of one claim."""
    if c.get("not_applicable"):
        return NOT_APPLICABLE, "declared"
    seeds = list(range(int(c["seeds"])))
    ch = next(x for x in c["checks"] if x.get("primary"))
    kind, better = ch["kind"], ch.get("better", "higher")
    if kind == "lr_sensitivity":  # the family's sensitivity claimed lower; read from the tuning sweep
        d = dict(enumerate(sweep_sensitivities(ch, rows, arms).values()))
        kind = "lower"
    else:
        d = differences(ch, rows, seeds)
    if not d:
        return NOT_RESOLVED, "no paired evaluation runs"
    mean, lo, hi = t_interval([d[s] for s in sorted(d)])
    margin = ch.get("margin")
    if ch.get("relative_margin") is not None:
        base = per_seed(rows, ch["baseline"], ch["metric"], sorted(d))
        b = float(np.mean(list(base.values())))
        margin = float(ch["relative_margin"]) * ((1 - b) if better == "higher" else b)
    how = f"seeds: {mean:+.4f} [{lo:+.4f}, {hi:+.4f}]"
    items = seeds_by_items(results, c["benchmark"], ch, sorted(d)) if ch["kind"] != "lr_sensitivity" else None
    if items is not None:
        ilo, ihi = two_level(items[0], resamples, classes=items[1])
        how += f"; seeds x items [{ilo:+.4f}, {ihi:+.4f}]"
        if ihi - ilo > hi - lo:
            lo, hi = ilo, ihi
    v = verdict(kind, better, lo, hi, margin)
    edges = [0.0] if margin is None else [-margin, margin]
    near = any(abs(x - e) < 5e-4 for x in (lo, hi) for e in edges)
    run_arms = list(c["arms"]) + [a for x in c["checks"] for a in (x.get("clean_family"), x.get("clean_baseline")) if a]
    for metric, floor in (c.get("floors") or {}).items():
        for arm in dict.fromkeys(run_arms):
            vals = per_seed(rows, arm, metric, seeds)
            lvl = (float(np.mean(list(per_seed(rows, arm, floor, seeds).values()))) if isinstance(floor, str)
                   else float(floor))
            if vals and not np.mean(list(vals.values())) > lvl:
                return INVALID, how + f"; {arm} {metric} not above its floor"
    for m in c.get("manipulation") or []:
        vals = per_seed(rows, m["arm"], m["metric"], seeds)
        if not vals or not OPS[m["op"]](float(np.mean(list(vals.values()))), float(m["level"])):
            return NOT_TESTED, how + f"; manipulation failed: {m['name']}"
    rep = c.get("replicate")
    if rep and v in (REPRODUCED, CONTRADICTED) and ch["kind"] != "lr_sensitivity":
        r = differences(ch, rows, list(range(int(rep["seeds"]))), phase="replicate")
        if r:
            rm = float(np.mean(list(r.values())))
            how += f"; replicate {rm:+.4f}"
            if not same_side(kind, better, v, rm, margin):
                v = NOT_RESOLVED
    return v, how + ("; boundary" if near else "")


def summary_verdicts(path: str) -> Dict[str, str]:
    """The verdict the pipeline wrote for each claim key in ``summary.md`` (its headline lists and
    its table, whose details link names the benchmark; the key comes from the reports' anchors)."""
    out: Dict[str, str] = {}
    text = open(path).read()
    for key, word in re.findall(r"^- `([a-z0-9_]+)`: (not applicable here|not tested)", text, re.M):
        out[key] = word
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--claims-file", default=os.path.join(ROOT, "benchmarks", "claims_revision4.yaml"))
    p.add_argument("--results", default=os.path.join(ROOT, "results", "revision4"))
    p.add_argument("--resamples", type=int, default=10000)
    args = p.parse_args(argv)
    with open(args.claims_file) as fh:
        cf = yaml.safe_load(fh)
    rows = load_rows(args.results)
    written = open(os.path.join(args.results, "summary.md")).read()
    listed = summary_verdicts(os.path.join(args.results, "summary.md"))
    bad = 0
    print("| claim | recomputed verdict | read from | summary.md |")
    print("|---|---|---|---|")
    n = 0
    for c in cf["claims"]:
        if c["key"] in listed:
            pipeline = listed[c["key"]]
        else:
            line = next((x for x in written.splitlines() if x.startswith(f"| {c['family']} | {c['data']} |")), "")
            cells = [x.strip() for x in line.split("|")]
            if len(cells) <= 6:  # declared, its runs not finished yet: no verdict to compare
                print(f"| `{c['key']}` | - | no report yet | - |")
                continue
            pipeline = cells[5]
        n += 1
        v, how = recompute(c, rows, args.results, args.resamples, cf.get("arms") or {})
        agree = pipeline.startswith(v)
        bad += not agree
        print(f"| `{c['key']}` | {v} | {how} | {pipeline if agree else 'DIFFERS: ' + pipeline} |")
    print(f"\n{n - bad} of {n} verdicts agree with summary.md")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
