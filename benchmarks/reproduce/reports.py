"""Step 4 of the pipeline: the markdown reports. Per benchmark, ``<out>/<benchmark>.md``
(:func:`write_markdown`): the provenance of the runs (command, code, uncommitted changes, library
versions, machine), per claim the arms' mean +- sd over the seeds, the chosen hyperparameters and the
tuning table (widened points and choices at an end of the grid named), the checks with their
differences, CIs, MDE or "decidable at this n" and verdicts, and the data the runs saw; then
``<out>/summary.md`` (:func:`write_summary`): one line per claim (revision 3: counted by the primary
verdict, sanity checks apart, :func:`summary_rev3`) and the tuned values at an end of their grid.
The figures the reports embed are drawn by :mod:`reproduce.plots`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .analysis import _mean_sd, diverged, expected_sweeps, per_seed, seed_values, sensitivities, sweep_by_rate, sweep_losses
from .claims import DID_KIND, LEVEL_KINDS, SANITY_KIND, SENSITIVITY_KIND, Arm, Check, Claim, ClaimsFile, sweep_key
from .common import ROOT, stats
from .running import PROVENANCE_DIRS
from .runs import _overrides
from .tuning import _params_text, grid_edges

def fmt(m: float, s: float = float("nan"), digits: int = 4) -> str:
    if not math.isfinite(m):
        return "n/a"
    if not math.isfinite(s):
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def parse_fmt(cell: str) -> Tuple[float, float]:
    """Inverse of :func:`fmt` (for tests)."""
    cell = cell.strip()
    if cell == "n/a":
        return float("nan"), float("nan")
    if "±" in cell:
        a, b = cell.split("±")
        return float(a), float(b)
    return float(cell), float("nan")


def check_text(ch: Check, arms: Dict[str, Arm]) -> str:
    if ch.kind == SANITY_KIND:
        return "sanity: " + check_text(dataclasses.replace(ch, kind=ch.rule_kind()), arms)
    m = ch.metric_text()
    fam = arms[ch.family].label
    if ch.kind == SENSITIVITY_KIND:
        per = f" per {ch.group.split('.')[-1]}" if ch.group else ""
        return (f"learning-rate sensitivity of final {m} (capped at {ch.cap:g}; tuning sweep{per}): "
                f"{fam} < {arms[ch.baseline].label}")
    if ch.kind == DID_KIND:
        cm = ch.clean_metric.split("/", 1)[-1] if ch.clean_metric else m
        cf_, cb = arms[ch.clean_family or ch.family].label, arms[ch.clean_baseline or ch.baseline].label
        clean = f"{cm}: {cf_} - {cb}" if (cf_, cb) != (fam, arms[ch.baseline].label) else f"{cm}"
        sign = ">" if ch.better == "higher" else "<"
        return f"{m}: ({fam} - {arms[ch.baseline].label}) minus clean ({clean}) {sign} 0"
    if ch.kind in LEVEL_KINDS:
        return f"{m} of {fam} {'<' if ch.kind == 'below' else '>'} {ch.level:g}"
    base = arms[ch.baseline].label
    if ch.kind == "higher":
        return f"{m}: {fam} > {base}"
    if ch.kind == "lower":
        return f"{m}: {fam} < {base}"
    mg = f"{ch.margin:g}" if ch.relative_margin is None else f"{ch.relative_margin:g} x {base}'s error"
    if ch.kind == "equivalent":
        return f"{m}: {fam} = {base} within ±{mg}"
    worse = "below" if ch.better == "higher" else "above"
    return f"{m}: {fam} not worse than {base} (at most {mg} {worse})"


def _versions(rows: Sequence[dict]) -> dict:
    """The library versions of the first run that recorded them (runs read from an older runs file
    may record none), with ``recorded``: how many of ``rows`` did."""
    have = [r["_versions"] for r in rows if (r.get("_versions") or {}).get("torch")]
    return {**(have[0] if have else {}), "recorded": len(have), "runs": len(rows)}


def _versions_text(v: dict) -> str:
    if not v.get("torch"):
        return "library versions: not recorded by these runs (read from a runs file that predates them)"
    text = (f"Python {v.get('python', '?')}; torch {v['torch']}, pytorch-lightning "
            f"{v.get('pytorch_lightning', '?')}")
    if v.get("recorded", 0) < v.get("runs", 0):
        text += (f" (recorded by {v['recorded']} of the {v['runs']} runs; the others were read from a runs file "
                 "that predates the versions column)")
    return text


def write_markdown(benchmark: str, claims: Sequence[Claim], results: Sequence[dict], rows: Sequence[dict],
                   cf: ClaimsFile, chosen: Dict[str, Dict[str, Any]], tables: Dict[str, List[dict]], meta: dict,
                   path: str, pngs: Sequence[str]) -> None:
    v = meta.get("versions", {})
    bench = cf.benchmarks.get(benchmark, {})
    arms = cf.arms
    method = meta["ci"]
    ci_name = ("paired t interval" if method == "t" else
               f"percentile bootstrap of the mean ({meta['bootstrap_resamples']} resamples)")
    rev3 = meta.get("revision", 2) >= 3
    rule = ("`benchmarks/stats.py`: *reproduced* when the 95% CI of the paired difference lies on the claimed "
            "side of 0 (or inside the declared margin), *contradicted* when it lies on the other side (or "
            "entirely outside the margin), *not resolved* otherwise.")
    if rev3:
        rule += (" Protocol revision 3: the claim's **primary** check alone decides its verdict; the other checks "
                 "are secondary, shown with Holm-adjusted p-values and intervals within the claim (the check "
                 "ranked r of m by its p-value gets the 1 - 0.05 / (m - r + 1) interval; step-down order "
                 "enforced) and never decide it; **sanity** checks (identities and levels a loss meets by "
                 "construction) are listed in their own section and never count as reproductions; a claim with "
                 "an arm whose mean is not above its declared floor is *invalid* (the arm did not train). "
                 f"A non-inferior result whose CI lies below 0 is flagged \"{stats.NOT_WORSE_BUT_WORSE}\". "
                 "\"Decidable at this n\": the CI half-width is smaller than the declared margin (or, without one, "
                 "than the effect the paper reports).")
    lines = [f"# Reproduced results: {benchmark}", "",
             f"Generated by `python benchmarks/reproduce_results.py` from `{os.path.relpath(cf.path, ROOT)}` "
             f"({meta['mode']}); every number is computed from `{benchmark}_runs.csv`. Verdicts follow " + rule, "",
             f"- command: `{meta['command']}`",
             f"- code: {meta['code']}; report generated {meta['date']}",
             *[f"- {x}" for x in provenance_lines(rows, meta) if x],
             f"- data: {bench.get('data', '?')}",
             f"- model: {bench.get('backbone', '?')}",
             f"- {_versions_text(v)}; {meta['cpus']} CPUs ({meta['cpu']}), "
             f"{meta['jobs']} run(s) at a time, {meta['threads']} torch thread(s) each",
             f"- statistics: per-seed differences family - baseline; mean with a {int(meta['confidence'] * 100)}% "
             f"{ci_name}; " + ("decidable at this n = the CI half-width against the margin or the paper's effect"
                               if rev3 else
                               f"MDE = the true difference a two-sided paired t test detects with "
                               f"{int(meta['power'] * 100)}% power at this n and the observed sd of the differences"),
             f"- protocol: every arm tuned over its declared grid on the validation split (tuning seeds "
             f"{', '.join(str(s) for s in meta['tuning_seeds'])}, one validation pass at the end of training; "
             "the test split is never used for selection), then the chosen setting trained on each evaluation "
             + ("seed (the seed fixes the split, the training order and the initial weights, the same for every "
                "arm) and tested from the final checkpoint" if cf.evaluation.get("test_seed") is None else
                f"seed (the seed fixes the train / validation split, the training order and the initial weights, "
                f"the same for every arm; the test split is one for every seed, drawn from evaluation.test_seed = "
                f"{cf.evaluation['test_seed']} where the DataModule takes it) and tested from the final checkpoint"
                + ("; evaluation runs validate every epoch (learning curves)" if cf.evaluation.get("curves") else "")),
             ""]
    failed = [r for r in rows if not r["ok"]]
    if failed:
        swept = {k for res in results for k in res["claim"].swept_arms()}
        lines += ["**Failed runs** (excluded from the statistics, except a learning-rate sweep's diverged runs, "
                  "which its sensitivity reads at the cap):", ""]
        lines += [f"- {r['phase']} {r['arm']} seed {r['seed']} {r['params']}: {r['error']}"
                  + (" (diverged: read at the cap)" if r["phase"] == "tune" and r["arm"] in swept and diverged(r) else "")
                  for r in failed]
        lines.append("")
    for res in results:
        c = res["claim"]
        seeds = meta["seeds_of"][c.key]
        lines += [f"## {c.family}: {c.claim} (`{c.key}`)", "", f"Data: {c.data}. Seeds: {len(seeds)} "
                  f"({seeds[0]}..{seeds[-1]}).", ""]
        short = [m.split("/", 1)[-1] for m in c.metrics]  # the full name where two metrics share the short one
        head = ["arm", "recipe", "chosen (val)", "steps", "n",
                *[m if short.count(n) > 1 else n for m, n in zip(c.metrics, short)], "run s"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for k in c.run_arms():
            a = arms[k]
            mine = [r for r in rows if r["arm"] == k and r["phase"] == "eval" and r["ok"] and r["seed"] in seeds]
            steps = sorted({int(r["steps"]) for r in mine})
            recipe = f"`{os.path.basename(a.recipe)}`" + (" " + " ".join(f"`{o}`" for o in _overrides(a.overrides))
                                                          if a.overrides else "")
            cells = [a.label, recipe, _params_text(chosen.get(k, {})), "/".join(str(s) for s in steps) or "-",
                     str(len(mine))]
            for m in c.metrics:
                cells.append(fmt(*_mean_sd([float(r[m]) for r in mine if r.get(m, "") not in ("", None)])))
            cells.append(fmt(_mean_sd([float(r["run_seconds"]) for r in mine])[0], digits=0))
            lines.append("| " + " | ".join(cells) + " |")
        if rev3:
            lines += _rev3_check_lines(res, rows, seeds, arms)
            if c.notes:
                lines += [c.notes, ""]
        else:
            lines += ["", "| check | pairs | family | baseline | mean difference | 95% CI | MDE (80%) | verdict |",
                      "|---|---|---|---|---|---|---|---|"]
        for x in ([] if rev3 else res["checks"]):
            ch, ci = x["check"], x["ci"]
            fam = fmt(*_mean_sd([v for s, v in per_seed(rows, ch.family, ch.metric).items() if s in seeds]))
            if ch.baseline:
                base = fmt(*_mean_sd([v for s, v in per_seed(rows, ch.baseline, ch.metric).items() if s in seeds]))
                diff = f"{ci.mean:+.4f}" if math.isfinite(ci.mean) else "n/a"
            else:
                base, diff = f"level {ch.level:g}", "-"
            ci_cell = f"[{ci.low:+.4f}, {ci.high:+.4f}]" if math.isfinite(ci.low) else "n/a (n < 2)"
            mde = f"{ci.mde:.4f}" if math.isfinite(ci.mde) else "n/a"
            lines.append(f"| {check_text(ch, arms)} | {ci.n} | {fam} | {base} | {diff} | {ci_cell} | {mde} | "
                         f"{x['verdict']} |")
        if not rev3:
            lines += ["", f"**Verdict: {res['verdict']}.**", ""]
            if c.notes:
                lines += [c.notes, ""]
        lines += ["Tuning (validation, mean over tuning seeds; chosen in bold):", ""]
        for k in c.run_arms():
            a = arms[k]
            cells = []
            for t in tables.get(k, []):
                txt = f"{_params_text(t['params'])}: {fmt(t['value'])}"
                if t.get("round"):
                    txt += f" (widened, round {t['round']}: {t.get('reason', '')})"
                cells.append(f"**{txt}**" if t["params"] == chosen.get(k) else txt)
            lines.append(f"- {a.label} ({a.select}): " + "; ".join(cells))
        lines.append("")
        widened = [k for k in c.run_arms() if any(t.get("round") for t in tables.get(k, []))]
        if widened:
            lines += ["Grids widened automatically (the claims file's `tuning.widen` rule, declared before the runs): "
                      + "; ".join(f"{arms[k].label}: " + ", ".join(
                          f"round {t['round']} {_params_text(t['params'])}" for t in tables[k] if t.get("round"))
                          for k in widened) + ".", ""]
        edges = [f"{arms[k].label}: {', '.join(e)}" for k in c.run_arms()
                 if (e := grid_edges(arms[k], chosen.get(k, {}), [t["params"] for t in tables.get(k, [])]))]
        if edges:
            lines += ["Chosen at an end of its grid (the optimum may lie outside it): " + "; ".join(edges) + ".", ""]
    if rev3:
        lines += _rev3_sanity_section(results, rows, meta, arms)
    lines += ["## Data", ""]
    seen = {}
    for r in rows:
        if r["ok"] and r["phase"] == "eval" and r["arm"] not in seen:
            d = json.loads(r["data"]) if isinstance(r["data"], str) else r["data"]
            seen[r["arm"]] = ", ".join(f"{a}={b}" for a, b in sorted(d.items()))
    by_desc: Dict[str, List[str]] = {}
    for k, desc in seen.items():
        by_desc.setdefault(desc, []).append(arms[k].label if k in arms else k)
    lines += [f"- {', '.join(v)} (first seed): {k}" for k, v in by_desc.items()]
    lines.append("")
    if pngs:
        lines += ["## Plots", ""] + [f"![{os.path.splitext(p)[0]}]({p})" for p in pngs] + [""]
    with open(path, "w") as fh:
        fh.write("\n".join(lines))


def provenance_lines(rows: Sequence[dict], meta: dict) -> List[str]:
    """Lines naming uncommitted changes of this invocation (``--allow-dirty`` / ``--quick``) and the
    runs made on a tree with uncommitted changes (their ``code`` ends in ``-dirty``). The runs read
    from a runs file are named under revision 3 only, so that revision 2's reports regenerate as
    they were."""
    out = []
    if meta.get("dirty"):
        paths = [p.strip() for p in meta["dirty"]]
        out.append(f"**uncommitted changes** under {', '.join(f'{d}/' for d in PROVENANCE_DIRS)} when this ran "
                   f"({meta.get('dirty_reason', '--allow-dirty')}): " + ", ".join(f"`{p}`" for p in paths[:10])
                   + (f" and {len(paths) - 10} more" if len(paths) > 10 else ""))
    if meta.get("dirty") or meta.get("revision", 2) >= 3:
        bad = [r for r in rows if str(r.get("code", "")).endswith("-dirty")]
        if bad:
            names = [f"{r['phase']} {r['arm']} seed {r['seed']}" for r in bad]
            out.append(f"**{len(bad)} run(s) made with uncommitted changes** (their code ends in -dirty): "
                       + ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else ""))
    devices: Dict[str, int] = {}
    for r in rows:  # recorded per run since the runs files have a device column (older runs: none)
        if r.get("device"):
            devices[str(r["device"])] = devices.get(str(r["device"]), 0) + 1
    if devices:
        out.append("devices the runs trained on: " + ", ".join(f"`{d}` ({n} run(s))" for d, n in sorted(devices.items()))
                   + (f"; {len(rows) - sum(devices.values())} run(s) from before the device was recorded"
                      if len(rows) > sum(devices.values()) else ""))
    return out + ([""] if out else [])


def _margin_text(ch: Check, rows: Sequence[dict], seeds: Sequence[int], r: Optional["stats.CheckResult"] = None) -> str:
    """A margin beside the baseline's own error: its seed sd and, for a higher-is-better metric in
    [0, 1], its error 1 - mean (so a reader sees how large the margin is); a margin relative to the
    baseline's error (revision 4) as the absolute margin it resolved to and how."""
    if ch.relative_margin is not None and r is not None and r.margin is not None:
        return f"{r.margin:.4g} ({r.margin_basis})"
    if ch.margin is None:
        return "-"
    m, s = _mean_sd(list(seed_values(rows, ch.baseline, ch.metric, seeds, ch.transform).values()))
    parts = [f"baseline sd {s:.4f}" if math.isfinite(s) else "baseline sd n/a"]
    if ch.better == "higher" and math.isfinite(m) and 0.0 <= m <= 1.0:
        parts.append(f"1 - mean {1.0 - m:.4f}")
    return f"{ch.margin:g} ({'; '.join(parts)})"


def _verdict_cell(r: "stats.CheckResult") -> str:
    return r.verdict + (f" ({r.flag})" if r.flag else "")


def _ci_cell(ci: "stats.Interval", holm: bool) -> str:
    if not math.isfinite(ci.low):
        return "n/a (n < 2)"
    conf = f"{ci.confidence * 100:.4g}%" + (", Holm" if holm else "")
    return f"[{ci.low:+.4f}, {ci.high:+.4f}] ({conf})"


def _decidable_cell(r: "stats.CheckResult") -> str:
    word = {True: "yes", False: "no", None: "n/a"}[r.decidable]
    return f"{word}: {r.decidable_text}"


def _check_row(x: dict, rows: Sequence[dict], seeds: Sequence[int], arms: Dict[str, Arm]) -> str:
    ch, r = x["check"], x["result"]
    ci = r.reported_ci
    fam = fmt(*_mean_sd(list(seed_values(rows, ch.family, ch.metric, seeds, ch.transform).values())))
    if ch.kind == SENSITIVITY_KIND:  # each arm's sensitivity over the sweeps (tuning seed x group) both completed
        pairs = list(sensitivities(ch, rows, arms).values())
        fam, base = (fmt(*_mean_sd([p[i] for p in pairs])) for i in (0, 1))
        diff = f"{r.ci.mean:+.4f}" if math.isfinite(r.ci.mean) else "n/a"
    elif ch.baseline:
        base = fmt(*_mean_sd(list(seed_values(rows, ch.baseline, ch.metric, seeds, ch.transform).values())))
        diff = f"{r.ci.mean:+.4f}" if math.isfinite(r.ci.mean) else "n/a"
    else:
        base, diff = f"level {ch.level:g}", "-"
    if r.role == "secondary":
        role, p = f"secondary (Holm rank {r.rank})", f"{r.p:.4g} / {r.p_adjusted:.4g}"
    else:
        role, p = r.role, f"{r.p:.4g}"
    p = p if math.isfinite(r.p) else "n/a"
    return (f"| {check_text(ch, arms)} | {role} | {ci.n} | {fam} | {base} | {_margin_text(ch, rows, seeds, r)} | {diff} | "
            f"{_ci_cell(ci, r.role == 'secondary')} | {p} | {_decidable_cell(r)} | {_verdict_cell(r)} |")


def sweep_lines(ch: Check, rows: Sequence[dict], arms: Dict[str, Arm],
                swept: Optional[Sequence[str]] = None) -> List[str]:
    """The learning-rate sweep an ``lr_sensitivity`` check reads: per arm (``swept``, default the
    check's two) and sweep (the check's ``group``), the final value of its metric at each learning
    rate, mean over the tuning seeds that ran it (diverged runs counted at the cap), the number of
    runs that diverged, and the sweep's learning-rate sensitivity (:func:`stats.lr_sensitivity`, the
    check's statistic) per tuning seed whose sweep is complete, averaged: read per sweep, it shows
    whether the paired difference depends on the sweep (the check pairs every (seed, sweep) alike)."""
    lr_key = sweep_key(arms[ch.family])
    swept = list(swept or (ch.family, ch.baseline))
    table = {(arm, g): d for arm in swept for g, d in sweep_by_rate(ch, rows, arm, lr_key).items()}
    complete = {arm: sweep_losses(ch, rows, arm, expected_sweeps(ch, arms[arm])) for arm in swept}
    if not table:
        return [f"Learning-rate sweep ({ch.metric}): no finished tuning run yet.", ""]
    lrs = sorted({lr for d in table.values() for lr in d})
    group = ch.group.split(".")[-1] if ch.group else ""
    head = ["| arm" + (f" | {group}" if group else "") + " | " + " | ".join(f"lr {lr:g}" for lr in lrs)
            + " | diverged | sensitivity (mean over seeds) |", "|---|" + ("---|" if group else "") + "---|" * (len(lrs) + 2)]
    out = [f"Learning-rate sweep: final {ch.metric} at each learning rate, mean over the tuning seeds (a diverged "
           f"or non-finite run counts as the cap {ch.cap:g}):", "", *head]
    for (arm, g), d in sorted(table.items(), key=lambda kv: (json.loads(kv[0][1]) if kv[0][1] else 0,
                                                             swept.index(kv[0][0]))):
        cells = []
        for lr in lrs:
            vals = [stats.capped(v, ch.cap) for v in d.get(lr, [])]
            cells.append(f"{sum(vals) / len(vals):.4f} (n={len(vals)})" if vals else "-")
        n_div = sum(not math.isfinite(v) for vs in d.values() for v in vs)
        sens = [stats.lr_sensitivity(list(pts.values()), float(ch.cap)) for (_, sg), pts in complete[arm].items()
                if sg == g]
        s_cell = f"{sum(sens) / len(sens):.4f} (n={len(sens)})" if sens else "-"
        out.append(f"| {arms[arm].label}" + (f" | {json.loads(g)}" if group else "") + " | " + " | ".join(cells)
                   + f" | {n_div} | {s_cell} |")
    return out + [""]


CHECK_HEAD = ["| check | role | pairs | family | baseline | margin (baseline's error) | mean difference | CI | "
              "p (Holm-adjusted) | decidable at this n | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]


def _rev3_check_lines(res: dict, rows: Sequence[dict], seeds: Sequence[int], arms: Dict[str, Arm]) -> List[str]:
    """Revision 3: the claim's primary and secondary checks, its floors and its verdict."""
    c, r3 = res["claim"], res["rev3"]
    lines = ["", *CHECK_HEAD]
    lines += [_check_row(x, rows, seeds, arms) for x in res["checks"] if x["result"].role != "sanity" or r3.sanity]
    lines.append("")
    if c.floors:
        lines.append("Competence floors (every arm's mean must be above): " + "; ".join(
            f"{m.split('/', 1)[-1]} > {f if isinstance(f, str) else format(f, 'g')}" for m, f in c.floors)
            + (". Under the floor: " + "; ".join(f"{arms[a].label} {m.split('/', 1)[-1]} {v:.4f} <= {f:.4f}"
                                                 for a, m, v, f in r3.invalid_arms) if r3.invalid_arms else "") + ".")
        lines.append("")
    if c.swept_arms():  # one table of every swept arm, read as the first sensitivity check reads it
        first = next(ch for ch in c.checks if ch.kind == SENSITIVITY_KIND)
        lines += sweep_lines(first, rows, arms, c.swept_arms())
    lines += revision4_lines(res, arms)
    n_sanity = sum(x["result"].role == "sanity" for x in res["checks"])
    if n_sanity and not r3.sanity:
        lines += [f"{n_sanity} sanity check(s) of this claim: see *Sanity checks* below (never counted).", ""]
    lines += _rev3_run_lines(res, arms)
    if r3.sanity:
        lines += [f"**Sanity claim: {res['verdict']}** (never counted as a reproduction).", ""]
    elif r3.verdict == stats.NOT_APPLICABLE:
        lines += [f"**Verdict: {res['verdict']}**: declared before the runs; not counted in the headline (the "
                  f"checks above are reported only).", ""]
    elif r3.verdict == stats.NOT_TESTED:
        lines += [f"**Verdict: {res['verdict']}**: the condition the claim is about did not occur in these runs; "
                  f"not counted in the headline (the primary check read {r3.primary.verdict}).", ""]
    elif (res.get("replicate") or {}).get("flips"):
        lines += [f"**Verdict: {res['verdict']} at this budget** (the primary check read {r3.primary.verdict}, but "
                  f"its replicate at {res['replicate']['budget']}x the budget lies on the other side of the "
                  f"decision boundary).", ""]
    elif limited_arms(res) and r3.verdict in (stats.REPRODUCED, stats.CONTRADICTED, stats.NOT_RESOLVED):
        names = ", ".join(arms[k].label if k in arms else k for k in limited_arms(res))
        lines += [f"**Verdict: {res['verdict']} at this budget** (the primary check's; {names} still improving "
                  f"when the budget ended).", ""]
    else:
        why = ([", made invalid by the competence gate"] if r3.invalid_arms else []) + \
              ([", made invalid because its runs were tested on more than one test split"] if r3.split_problem else [])
        lines += [f"**Verdict: {res['verdict']}** (the primary check's" + "".join(why) + ").", ""]
    return lines


def revision4_lines(res: dict, arms: Dict[str, Arm]) -> List[str]:
    """Revision 4: the claim's declared deviations from the paper's setup (``fidelity``) and its
    manipulation checks, each with the arm's mean against its absolute level."""
    c, r = res["claim"], res["rev3"]
    lines: List[str] = []
    if c.fidelity is not None:
        lines += (["Deviations from the paper's setup (declared before the runs):", ""]
                  + [f"- {x}" for x in c.fidelity] + [""]) if c.fidelity else \
            ["Deviations from the paper's setup: none known (declared before the runs).", ""]
    it = res.get("items")
    if it and (it["checks"] or it["notes"]):
        by_name = {x["result"].name: x for x in res["checks"]}
        lines += ["Two-level bootstrap over seeds and test items (both resampled, the pairing by seed and item "
                  "kept; 95%): the primary check's verdict is read from the wider of this interval and the "
                  "seed interval above, the other checks report it.", ""]
        for name, v in it["checks"].items():
            x = by_name[name]
            ci, seed_ci, role = v["ci"], x["result"].ci, x["result"].role
            read = (f"; the verdict is read from the {'seeds x items' if x['result'].read_from != 'seeds' else 'seed'}"
                    f" interval" if role == "primary" else "")
            seeds_txt = f"[{seed_ci.low:+.4f}, {seed_ci.high:+.4f}]" if math.isfinite(seed_ci.low) else "n/a"
            lines.append(f"- {check_text(x['check'], arms)} ({role}): {ci.mean:+.4f} [{ci.low:+.4f}, {ci.high:+.4f}] "
                         f"over {v['seeds']} seeds x {v['items']} items"
                         + (f" (resampled within their {v['classes']} classes: a class mean)" if v.get("classes") else "")
                         + f", p {v['p']:.4g}; seeds only {seeds_txt}{read}.")
        for name, why in it["notes"].items():
            lines.append(f"- {check_text(by_name[name]['check'], arms)}: not computed ({why}).")
        lines.append("")
    rep = res.get("replicate")
    if rep is not None:
        per_seed = ", ".join(f"{v:+.4f}" for v in rep["values"])
        lines += [f"Replicate at {rep['budget']}x the budget (every arm at {rep['budget']}x its epochs, the chosen "
                  f"settings kept, seeds 0-{rep['seeds'] - 1}), the primary check: {rep['text']}"
                  + (f" (per seed {per_seed})." if per_seed else "."), ""]
    if r.manipulation:
        lines += ["Manipulation checks (the condition occurred; absolute levels, never the baseline):", ""]
        lines += [f"- {'passed' if m.passed else '**failed**'}: {m.text().replace(m.arm, arms[m.arm].label if m.arm in arms else m.arm, 1)}"
                  for m in r.manipulation]
        lines.append("")
    return lines


def test_split_text(res: dict) -> str:
    """One line on the claim's test splits (revision 3)."""
    ts = res.get("test_split") or {}
    fps = ts.get("fingerprints") or {}
    if ts.get("problem"):
        invalid = bool(getattr(res.get("rev3"), "split_problem", None))  # stats.evaluate_claim decided it
        return (f"**Test split not fixed**: {ts['problem']} (the seeds' verdicts are read on different test images"
                + ("; the claim is invalid" if invalid else "") + ").")
    known = sorted({v for v in fps.values() if v})
    if not known:
        return "Test split: not recorded by these runs (made before their run or their DataModule recorded a test-split fingerprint)."
    return f"Test split: one for all {len(fps)} evaluation runs (`{known[0]}`)."


def budget_text(res: dict, arms: Dict[str, Arm]) -> str:
    """One line on the primary baseline's learning curve and the budget-limited rule (revision 3)."""
    b = res.get("budget")
    if b is None:
        return "Learning curve: n/a (the primary check has no baseline)."
    rule = b["rule"]
    label = arms[b["arm"]].label if b["arm"] in arms else b["arm"]
    if not b.get("curves"):
        return f"Learning curve: not recorded for {label} (runs made without validation per epoch)."
    head = f"Learning curve of the primary baseline {label} ({b['metric']}, {b['curves']} seed(s)): "
    if rule.n == 0:
        return head + "fewer than 2 validation passes, so no last gain: budget-limited n/a."
    gain = f"{rule.gain:+.4f}" if math.isfinite(rule.gain) else "n/a"
    thr = f"{rule.threshold:.4f} ({rule.basis})" if math.isfinite(rule.threshold) else rule.basis
    word = {True: "**budget-limited**: the baseline was still improving when the budget ended",
            False: "not budget-limited", None: "budget-limited: n/a"}[rule.limited]
    last = ("gain over the last quarter of the epoch" if b.get("epochs") == 1 else "last-epoch gain")
    return head + f"{last} {gain} (mean of {rule.n}) against {thr}: {word}."


def limited_arms(res: dict) -> List[str]:
    """Revision 4: the arms whose learning curve says they were still improving at the end of the budget."""
    return [k for k, b in (res.get("budgets") or {}).items() if b["rule"].limited]


def _rev3_run_lines(res: dict, arms: Dict[str, Arm]) -> List[str]:
    if "test_split" not in res:
        return []
    if res.get("budgets") is None:
        return [test_split_text(res), "", budget_text(res, arms), ""]
    lines = [test_split_text(res), "", "Learning curves, every arm (revision 4: the budget-limited rule on each):", ""]
    for k, b in res["budgets"].items():
        text = budget_text({"budget": b}, arms).replace("Learning curve of the primary baseline ", "", 1)
        lines.append("- " + text.replace("Learning curve: ", "", 1).replace("the baseline was still", "it was still"))
    lines.append("")
    return lines


def _rev3_sanity_section(results: Sequence[dict], rows: Sequence[dict], meta: dict, arms: Dict[str, Arm]) -> List[str]:
    items = [(res, x) for res in results for x in res["checks"] if x["result"].role == "sanity"
             or res["rev3"].sanity]
    if not items:
        return []
    lines = ["## Sanity checks", "", "Identities and levels a loss meets by construction: they test the "
             "implementation and the protocol, never count as reproductions, and take no part in the Holm "
             "adjustment.", "", "| claim | " + CHECK_HEAD[0][2:], "|---" + CHECK_HEAD[1]]
    for res, x in items:
        lines.append(f"| `{res['claim'].key}` " + _check_row(x, rows, meta["seeds_of"][res["claim"].key], arms))
    lines.append("")
    return lines


def headline_rev4(results: Sequence[dict]) -> List[str]:
    """Revision 4's headline (``stats.headline_counts``): the tested claims by verdict, the claims not
    applicable here and not tested listed apart with their reasons, and Benjamini-Hochberg across the
    tested claims' primary p-values (``stats.claims_fdr``)."""
    named = [(r["claim"].key, r["rev3"]) for r in results]
    h = stats.headline_counts(named)
    lines = [f"Protocol revision 4: each claim's verdict is its primary check's; {h.total} claims tested: "
             + ", ".join(f"{h.counts[k]} {k}" for k in stats.HEADLINE)
             + f". Listed apart, never counted: {len(h.not_applicable)} {stats.NOT_APPLICABLE}, "
             f"{len(h.not_tested)} {stats.NOT_TESTED}, {len(h.sanity)} sanity claim(s).", ""]
    lines += [f"- `{k}`: {stats.NOT_APPLICABLE} ({why})" for k, why in h.not_applicable]
    lines += [f"- `{k}`: {stats.NOT_TESTED} ({why})" for k, why in h.not_tested]
    fdr = stats.claims_fdr(named)
    if fdr:
        kept = [k for k, (_, _, rej) in fdr.items() if rej]
        if h.not_applicable or h.not_tested:
            lines.append("")
        lines.append(f"Benjamini-Hochberg across the {len(fdr)} tested claims' primary p-values (false discovery "
                     f"rate 0.05): {len(kept)} significant" + (f" ({', '.join(f'`{k}`' for k in kept)})" if kept else "")
                     + ".")
    return lines + ([""] if lines[-1] else [])


def summary_rev3(results: Sequence[dict], arms: Dict[str, Arm], meta: dict) -> List[str]:
    """Revision 3 summary: claims counted by their primary verdict (invalid claims apart), then the
    sanity claims and checks, which never count. Revision 4 (``meta["revision"]``): the headline of
    :func:`headline_rev4` instead of the count line, and each claim's declared deviations."""
    rev4 = meta.get("revision", 3) >= 4
    claims = [r for r in results if not r["rev3"].sanity]
    sanity = [(r, x) for r in results for x in r["checks"] if x["result"].role == "sanity" or r["rev3"].sanity]
    counts = {}
    for r in claims:
        key = stats.INVALID if r["rev3"].verdict == stats.INVALID else r["verdict"]
        counts[key] = counts.get(key, 0) + 1
    order = [stats.REPRODUCED, stats.CONTRADICTED, stats.NOT_RESOLVED, stats.INVALID]
    lines = headline_rev4(results) if rev4 else [
        f"Protocol revision 3: each claim's verdict is its primary check's; {len(claims)} claims: "
        + ", ".join(f"{counts.get(k, 0)} {k}" for k in order)
        + f". {len(sanity)} sanity check(s) are listed apart and never counted.", ""]
    lines += ["| family | data | claim | primary check: mean difference [CI], decidable at this n | verdict | "
             "secondary checks (Holm) | details |", "|---|---|---|---|---|---|---|"]
    for res in claims:
        c = res["claim"]
        if res.get("not_run"):  # declared not applicable before any run: nothing was trained for it
            why = res.get("not_run_reason", "not run: declared not applicable before any run")
            lines.append(f"| {c.family} | {c.data} | {c.claim} | {why} | {res['verdict']} | - | - |")
            continue
        x = next(x for x in res["checks"] if x["result"].role == "primary")
        r = x["result"]
        items = r.read_from != "seeds"  # the verdict was read from the seeds x items interval: show that one
        ci = r.reported_ci if items else r.ci
        first = f"{check_text(x['check'], arms)}: " + (
            f"{ci.mean:+.4f} [{ci.low:+.4f}, {ci.high:+.4f}]{' (seeds x items)' if items else ''}; decidable: "
            f"{ {True: 'yes', False: 'no', None: 'n/a'}[r.decidable]}" if math.isfinite(ci.low) else f"n = {ci.n}, no CI")
        sec = [y["result"] for y in res["checks"] if y["result"].role == "secondary"]
        sec_text = ", ".join(f"{sum(y.verdict == k for y in sec)} {k}" for k in order[:3] if any(y.verdict == k for y in sec))
        flags = [f"{check_text(y['check'], arms)}: {y['result'].flag}" for y in res["checks"]
                 if y["result"].flag and y["result"].role != "sanity"]
        if (res.get("test_split") or {}).get("problem"):
            flags.append(f"test split not fixed ({res['test_split']['problem']})")
        if res.get("budgets") is not None:
            if limited_arms(res):
                flags.append("budget-limited (" + ", ".join(arms[k].label for k in limited_arms(res)) + " still improving)")
        elif res.get("budget") and res["budget"]["rule"].limited:
            flags.append(f"budget-limited ({arms[res['budget']['arm']].label} still improving)")
        if rev4 and res["claim"].fidelity:
            flags.append(f"{len(res['claim'].fidelity)} declared deviation(s) from the paper's setup")
        verdict = _verdict_cell(r) if res["rev3"].verdict not in (stats.INVALID, stats.NOT_APPLICABLE, stats.NOT_TESTED) \
            else res["verdict"]
        if (res.get("replicate") or {}).get("flips"):
            verdict = f"{res['verdict']} at this budget (the primary check read {r.verdict}; its " \
                      f"{res['replicate']['budget']}x-budget replicate did not)"
        elif rev4 and limited_arms(res) and res["rev3"].verdict in (stats.REPRODUCED, stats.CONTRADICTED,
                                                                      stats.NOT_RESOLVED):
            verdict += " at this budget"
        if rev4 and res.get("replicate") is not None and not res["replicate"]["n"]:
            flags.append(f"{res['replicate']['budget']}x-budget replicate not run")
        lines.append(f"| {c.family} | {c.data} | {c.claim} | {first} | {verdict} | {sec_text or '-'}"
                     + (f"; flagged: {'; '.join(flags)}" if flags else "") + f" | [{c.benchmark}.md]({c.benchmark}.md) |")
    lines.append("")
    if sanity:
        lines += ["Sanity checks (identities and levels met by construction; never counted as reproductions):", "",
                  "| claim | check | mean [CI] | result |", "|---|---|---|---|"]
        for res, x in sanity:
            ci = x["result"].ci
            cell = f"{ci.mean:+.4f} [{ci.low:+.4f}, {ci.high:+.4f}]" if math.isfinite(ci.low) else f"n = {ci.n}, no CI"
            lines.append(f"| `{res['claim'].key}` | {check_text(x['check'], arms)} | {cell} | {_verdict_cell(x['result'])} |")
        lines.append("")
    return lines


def write_summary(path: str, results: Sequence[dict], rows: Sequence[dict], *, n_tune: int, n_eval: int,
                  cf: ClaimsFile, chosen: Dict[str, Dict[str, Any]], tables: Dict[str, List[dict]], meta: dict,
                  wall: float) -> None:
    """``summary.md``: the invocation (``n_tune`` tuning and ``n_eval`` evaluation runs of ``rows``,
    ``wall`` seconds), one line per claim of ``results`` and the tuned values at an end of their grid."""
    method, confidence, revision = meta["ci"], meta["confidence"], meta["revision"]
    run_total = sum(float(r["run_seconds"] or 0.0) for r in rows)
    lines = ["# Reproduced claims: summary", "",
             f"`{meta['command']}` ({meta['mode']}; code {meta['code']}; {meta['date']}): {len(rows)} runs "
             f"({n_tune} tuning, {n_eval} evaluation), {run_total / 60:.0f} min of run time; this "
             f"invocation took {wall / 60:.1f} min. CI: {method}, {int(confidence * 100)}%.", ""]
    lines += provenance_lines(rows, meta)
    if revision >= 3:
        lines += summary_rev3(results, cf.arms, meta)
    else:
        lines += ["| family | data | claim | first check: mean difference [95% CI], MDE | verdict | details |",
                  "|---|---|---|---|---|---|"]
        for res in results:
            c = res["claim"]
            x = res["checks"][0]
            ci = x["ci"]
            first = f"{check_text(x['check'], cf.arms)}: " + (
                f"{ci.mean:+.4f} [{ci.low:+.4f}, {ci.high:+.4f}], MDE {ci.mde:.4f}" if math.isfinite(ci.low)
                else f"n = {ci.n}, no CI")
            lines.append(f"| {c.family} | {c.data} | {c.claim} | {first} | {res['verdict']} | "
                         f"[{c.benchmark}.md]({c.benchmark}.md) |")
        lines.append("")
    edges: Dict[str, Tuple[str, List[str]]] = {}  # arm -> (its first claim, its grid ends)
    for res in results:
        for k in () if res.get("not_run") else res["claim"].run_arms():
            if k not in edges and (e := grid_edges(cf.arms[k], chosen.get(k, {}),
                                                   [t["params"] for t in tables.get(k, [])])):
                edges[k] = (res["claim"].key, e)
    if edges:
        lines += ["Tuned values at an end of their grid (those arms may be under-tuned; a wider grid could move "
                  "their results):", ""]
        lines += [f"- {cf.arms[k].label} (`{key}`): {', '.join(e)}" for k, (key, e) in edges.items()]
        lines.append("")
    with open(path, "w") as fh:
        fh.write("\n".join(lines))
