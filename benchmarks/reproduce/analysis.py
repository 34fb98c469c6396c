"""Step 3 of the pipeline: comparison. The evaluation runs of a claim's arms are collected into the
inputs of its checks -- per seed, an arm's value of a metric (:func:`seed_values`), the paired
differences family - baseline or the differences in differences (:func:`check_sample`), the arms
under the competence floors (:func:`competence`), the test splits the runs were scored on
(:func:`test_splits`) and the primary baseline's learning curves (:func:`claim_budget`) -- and
:func:`claim_results` reads the claim's verdict from them with the rules of ``benchmarks/stats.py``
(revision 2: every check, :func:`evaluate_check`; revision 3: the primary check decides,
``stats.evaluate_claim``). Nothing here decides a verdict itself: the rules live in ``stats.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .claims import (DID_KIND, DIRECTION_KINDS, LEVEL_KINDS, MARGIN_KINDS, REPLICATE_PHASE, SENSITIVITY_KIND, Arm,
                     Check, Claim)
from .common import stats

def per_seed(rows: Sequence[dict], arm: str, metric: str) -> Dict[int, float]:
    out = {}
    for r in rows:
        if r["arm"] == arm and r["phase"] == "eval" and r["ok"]:
            v = r.get(metric, "")
            if v not in ("", None) and math.isfinite(float(v)):
                out[int(r["seed"])] = float(v)
    return out


def seed_values(rows: Sequence[dict], arm: str, metric: str, seeds: Sequence[int],
                transform: Optional[str] = None) -> Dict[int, float]:
    """``{seed: value}`` of one arm's evaluation runs over ``seeds``, the check's transform applied."""
    vals = {s: v for s, v in per_seed(rows, arm, metric).items() if s in seeds}
    if transform == "abs":
        vals = {s: abs(v) for s, v in vals.items()}
    return vals


#: a failed run's error that says the training diverged: the losses' data check on non-finite values
#: ("... contains NaN or +inf ...") or the trainer's
_DIVERGED = re.compile(r"\bNaN\b|[+-]inf\b|non-finite|not finite", re.IGNORECASE)


def diverged(row: dict) -> bool:
    """Whether a failed run failed because its training diverged (its recorded error names a
    non-finite value): such a run finished, at the worst possible loss."""
    return not row.get("ok") and bool(_DIVERGED.search(str(row.get("error") or "")))


def sweep_losses(ch: Check, rows: Sequence[dict], arm: str,
                 expected: Optional[Dict[str, set]] = None) -> Dict[Tuple[int, str], Dict[str, float]]:
    """``{(tuning seed, sweep): {grid point: final value of the check's metric}}`` of one arm's tuning
    runs (an ``lr_sensitivity`` check): a sweep is the points sharing the value of the check's
    ``group`` key (``""`` without one). A run that finished counts with its value (``nan`` when it is
    not finite); a run that failed because training diverged (:func:`diverged`) counts as ``nan``
    (:func:`stats.lr_sensitivity` reads both as the cap); a run that failed otherwise, or has not run,
    is missing, and a sweep missing any of its ``expected`` points (``{sweep: {point}}``) is left out."""
    out: Dict[Tuple[int, str], Dict[str, float]] = {}
    for r in rows:
        if r["arm"] != arm or r.get("phase") != "tune" or not (r["ok"] or diverged(r)):
            continue
        p = json.loads(r["params"]) if isinstance(r["params"], str) else dict(r["params"])
        g = json.dumps(p.get(ch.group)) if ch.group else ""
        v = r.get(ch.metric, "") if r["ok"] else ""
        out.setdefault((int(r["seed"]), g), {})[json.dumps(p, sort_keys=True)] = \
            float(v) if v not in ("", None) else float("nan")
    if expected is not None:
        out = {k: v for k, v in out.items() if set(v) >= expected.get(k[1], set())}
    return out


def sweep_by_rate(ch: Check, rows: Sequence[dict], arm: str, lr_key: str) -> Dict[str, Dict[float, List[float]]]:
    """``{sweep: {learning rate: [final value per tuning seed]}}`` of one arm's finished tuning runs
    (:func:`sweep_losses`; ``nan`` where a run diverged), for the reports' table and figure."""
    out: Dict[str, Dict[float, List[float]]] = {}
    for (_, g), pts in sweep_losses(ch, rows, arm).items():
        for p, v in pts.items():
            out.setdefault(g, {}).setdefault(float(json.loads(p)[lr_key]), []).append(v)
    return out


def expected_sweeps(ch: Check, arm: Arm) -> Dict[str, set]:
    """``{sweep: {grid point}}`` an arm declares (the points grouped by the check's ``group`` key)."""
    out: Dict[str, set] = {}
    for p in arm.grid_points():
        out.setdefault(json.dumps(p.get(ch.group)) if ch.group else "", set()).add(json.dumps(p, sort_keys=True))
    return out


def sensitivities(ch: Check, rows: Sequence[dict],
                  arms: Optional[Dict[str, Arm]] = None) -> Dict[Tuple[int, str], Tuple[float, float]]:
    """``{(tuning seed, sweep): (family's sensitivity, baseline's)}`` of an ``lr_sensitivity`` check
    (:func:`stats.lr_sensitivity`, capped at the check's ``cap``) over the sweeps both arms completed
    (with ``arms``: every declared point; without, the same points in both)."""
    exp = expected_sweeps(ch, arms[ch.family]) if arms and ch.family in arms else None
    fam = sweep_losses(ch, rows, ch.family, exp)
    base = sweep_losses(ch, rows, ch.baseline, exp)
    return {k: (stats.lr_sensitivity(list(fam[k].values()), float(ch.cap)),
                stats.lr_sensitivity(list(base[k].values()), float(ch.cap)))
            for k in sorted(set(fam) & set(base)) if set(fam[k]) == set(base[k])}


def sensitivity_sample(ch: Check, rows: Sequence[dict],
                       arms: Optional[Dict[str, Arm]] = None) -> Dict[Tuple[int, str], float]:
    """An ``lr_sensitivity`` check's sample: per tuning seed and sweep that both arms completed, the
    family's learning-rate sensitivity minus the baseline's (:func:`sensitivities`)."""
    return {k: f - b for k, (f, b) in sensitivities(ch, rows, arms).items()}


def check_sample(ch: Check, rows: Sequence[dict], seeds: Sequence[int],
                 arms: Optional[Dict[str, Arm]] = None) -> Dict[int, float]:
    """The per-seed sample a check is read from: the family's values (level rules), the differences
    in differences (``did``), the paired differences family - baseline, or (``lr_sensitivity``) the
    paired differences of the learning-rate sensitivity per tuning seed and sweep
    (:func:`sensitivity_sample`, keyed by position: the tuning runs are its sample, not ``seeds``)."""
    if ch.kind == SENSITIVITY_KIND:
        return dict(enumerate(sensitivity_sample(ch, rows, arms).values()))
    fam = seed_values(rows, ch.family, ch.metric, seeds, ch.transform)
    if ch.rule_kind() in LEVEL_KINDS:
        return fam
    base = seed_values(rows, ch.baseline, ch.metric, seeds, ch.transform)
    if ch.kind == DID_KIND:
        cm = ch.clean_metric or ch.metric
        return stats.did_differences(fam, base,
                                     seed_values(rows, ch.clean_family or ch.family, cm, seeds, ch.transform),
                                     seed_values(rows, ch.clean_baseline or ch.baseline, cm, seeds, ch.transform))
    return stats.paired_differences(fam, base)


def evaluate_check(ch: Check, rows: Sequence[dict], seeds: Sequence[int], *, method: str,
                   confidence: float) -> Tuple[str, "stats.Interval"]:
    """Revision 2: the verdict and interval of one check (a sanity check by its rule; a did check as
    the claimed direction of its differences in differences)."""
    if ch.kind == DID_KIND:
        ci = stats.interval(list(check_sample(ch, rows, seeds).values()), method=method, confidence=confidence)
        return stats.verdict("higher" if ch.better == "higher" else "lower", ci), ci
    fam = seed_values(rows, ch.family, ch.metric, seeds, ch.transform)
    base = None
    if ch.baseline:
        base = seed_values(rows, ch.baseline, ch.metric, seeds, ch.transform)
    return stats.check(ch.rule_kind(), fam, base, better=ch.better, margin=ch.margin, level=ch.level, method=method,
                       confidence=confidence)


def competence(c: Claim, rows: Sequence[dict], seeds: Sequence[int]) -> List[Tuple[str, str, float, float]]:
    """Revision 3: ``(arm, metric, arm mean, floor)`` for every arm of the claim (its clean arms
    included) whose mean over ``seeds`` does not beat the claim's floor of a metric."""
    out = []
    for metric, floor in c.floors:
        arms = {a: seed_values(rows, a, metric, seeds) for a in c.run_arms()}
        fl = floor if not isinstance(floor, str) else {a: seed_values(rows, a, floor, seeds) for a in c.run_arms()}
        out += [(a, metric, m, f) for a, m, f in stats.competence_failures(arms, fl)]
    return out


def _mean_sd(vals: Sequence[float]) -> Tuple[float, float]:
    m, s, _ = stats.mean_sd(vals)
    return m, s


def claim_results(c: Claim, rows: Sequence[dict], *, seeds: Sequence[int], method: str, confidence: float,
                  revision: int = 2, n_boot: int = 10000, arms: Optional[Dict[str, Arm]] = None,
                  items: Optional[Dict[Tuple[str, int], str]] = None) -> dict:
    """The verdicts of one claim. Revision 2: every check at the nominal confidence, the claim
    reproduced when every check is (:func:`stats.claim_verdict`). Revision 3: the primary check
    decides, secondary checks are Holm-adjusted within the claim, sanity checks are reported apart
    and an arm under its competence floor makes the claim invalid (:func:`stats.evaluate_claim`).
    Revision 4 adds the claim's declared ``not_applicable`` reason, its manipulation checks
    (:func:`manipulation_checks`) and margins relative to the baseline's error;
    the result also carries the claim's test splits (``test_split``: :func:`stats.test_split_problem`)
    and whether its primary baseline was budget-limited (``budget``: :func:`claim_budget`; ``arms``
    lets a curve fall back to the baseline's ``select`` metric). Revision 4 with ``items`` (``{(arm,
    seed): per-item records file}``): each paired check's two-level bootstrap over seeds and test
    items (:func:`item_intervals`), the primary check read from the wider interval."""
    if revision < 3:
        checks = []
        for ch in c.checks:
            v, ci = evaluate_check(ch, rows, seeds, method=method, confidence=confidence)
            checks.append({"check": ch, "verdict": v, "ci": ci})
        return {"claim": c, "checks": checks, "verdict": stats.claim_verdict([x["verdict"] for x in checks])}
    rev4 = revision >= 4
    inputs = [stats.CheckInput(name=f"{i}", kind=ch.kind, values=tuple(check_sample(ch, rows, seeds, arms).values()),
                               primary=ch.primary, rule=ch.rule, better=ch.better, margin=ch.margin, level=ch.level,
                               effect=ch.effect, **(_relative(ch, rows, seeds) if rev4 else {}))
              for i, ch in enumerate(c.checks)]
    fps = test_splits(c, rows, seeds)
    two_level, item_notes = ({}, {}) if not (rev4 and items is not None) else \
        item_intervals(c, rows, seeds, items, confidence=confidence, n_boot=n_boot)
    res = stats.evaluate_claim(inputs, invalid_arms=competence(c, rows, seeds), method=method, confidence=confidence,
                               n_boot=n_boot, test_splits=fps,
                               manipulation=manipulation_checks(c, rows, seeds) if rev4 else (),
                               not_applicable=c.not_applicable if rev4 else None,
                               item_intervals={k: (v["ci"], v["p"]) for k, v in two_level.items()})
    checks = [{"check": ch, "verdict": r.verdict, "ci": r.reported_ci, "result": r} for ch, r in zip(c.checks, res.checks)]
    out = {"claim": c, "checks": checks, "verdict": res.verdict_text(), "rev3": res, "seeds": list(seeds)}
    out["test_split"] = {"fingerprints": fps, "problem": stats.test_split_problem(fps)}
    if rev4 and items is not None:
        out["items"] = {"checks": two_level, "notes": item_notes}
    prim = next((x for x in checks if x["result"].role == "primary"), None)
    out["budget"] = claim_budget(c, prim, rows, seeds, arms) if prim is not None else None
    if rev4 and prim is not None:  # revision 4: the budget rule on every arm the claim runs
        out["budgets"] = {k: arm_budget(k, prim, rows, seeds, arms) for k in c.run_arms()}
    if rev4 and prim is not None and c.replicate is not None:
        out["replicate"] = replicate_result(c, prim, rows)
        if out["replicate"]["flips"]:  # the verdict does not survive twice the budget
            out["rev3"] = res = dataclasses.replace(res, verdict=stats.NOT_RESOLVED)
            out["verdict"] = res.verdict_text()
    return out


def not_run_result(c: Claim) -> dict:
    """Revision 4: the result of a claim declared ``not_applicable`` before any run, which is not run:
    its verdict is :data:`stats.NOT_APPLICABLE` with the declared reason, no check is read, and its arms
    are trained only where another selected claim needs them (``not_run`` marks it for the reports)."""
    if not c.not_applicable:
        raise ValueError(f"not_run_result: claim {c.key!r} declares no not_applicable reason; it must be run")
    res = stats.evaluate_claim([], not_applicable=c.not_applicable)
    return {"claim": c, "checks": [], "verdict": res.verdict_text(), "rev3": res, "seeds": [], "not_run": True}


def gate_reading(c: Claim, rows: Sequence[dict]) -> "stats.ManipulationResult":
    """Revision 4: a claim's gate read from the gate arm's tuning rows (``rows``: those of its declared
    runs on the first tuning seed that finished): the best value of the gate's metric among them
    (the largest for ``>`` / ``>=``, the smallest for ``<`` / ``<=``), whether it passes the level, and
    over how many runs."""
    g = c.gate
    vals = []
    for r in rows:
        try:
            v = float(r.get(g.metric, ""))
        except (TypeError, ValueError):
            continue
        if v == v:
            vals.append(v)
    best = (max(vals) if g.op in (">", ">=") else min(vals)) if vals else float("nan")
    return GateReading(g.name, g.metric, g.arm, g.op, float(g.level), best, len(vals), bool(vals) and g.passes(best))


@dataclasses.dataclass(frozen=True)
class GateReading(stats.ManipulationResult):
    """A gate's reading (:func:`gate_reading`): ``mean`` holds the best value over the ``n`` gate runs."""

    def text(self) -> str:
        if self.n == 0:
            return f"{self.name}: no finished gate run of {self.arm} recorded {self.metric}"
        return (f"{self.name}: the best {self.metric} of {self.arm} over its {self.n} gate run(s) {self.mean:.4g}, "
                f"{'' if self.passed else 'not '}{self.op} {self.level:g}")


def gated_result(c: Claim, reading: "stats.ManipulationResult") -> dict:
    """Revision 4: the result of a claim whose gate failed: *not tested*, the gate's reading as its
    reason; nothing else of it was run (``not_run``), its gate runs are in the runs file."""
    res = stats.ClaimResult(stats.NOT_TESTED, None, (), (), False, None, None, (reading,))
    return {"claim": c, "checks": [], "verdict": res.verdict_text(), "rev3": res, "seeds": [], "not_run": True,
            "not_run_reason": "not run: its gate failed"}


def _relative(ch: Check, rows: Sequence[dict], seeds: Sequence[int]) -> dict:
    """Revision 4: a check's margin relative to the baseline's error, with the baseline arm's mean over
    the seeds it is applied to (``stats.resolve_margin``); nothing for a check without one."""
    if ch.relative_margin is None:
        return {}
    base = list(seed_values(rows, ch.baseline, ch.metric, seeds, ch.transform).values())
    return {"relative_margin": float(ch.relative_margin),
            "baseline_mean": _mean_sd(base)[0] if base else float("nan")}


def manipulation_checks(c: Claim, rows: Sequence[dict], seeds: Sequence[int]) -> List["stats.ManipulationCheck"]:
    """Revision 4: the claim's manipulation checks with their arm's per-seed values of the metric over
    the evaluation ``seeds`` (``stats.manipulation_result`` reads them against the absolute level)."""
    return [stats.ManipulationCheck(name=m.name, metric=m.metric, arm=m.arm, op=m.op, level=float(m.level),
                                    values=tuple(seed_values(rows, m.arm, m.metric, seeds).values()))
            for m in c.manipulation]


@functools.lru_cache(maxsize=256)
def _load_items(path: str):
    from lightning_modules.records import load_test_items

    return load_test_items(path)


def item_scores(items: Dict[Tuple[str, int], str], arm: str, metric: str,
                seeds: Sequence[int]) -> Tuple[Dict[int, np.ndarray], Optional[np.ndarray], str,
                                               Optional[np.ndarray]]:
    """``({seed: per-item values}, item ids, "", strata)`` of one arm's metric, the items in the order
    of their ids, or ``({}, None, why, None)`` where the records cannot give it: a seed without a
    records file, a metric not recorded or neither a mean over items nor a class mean (a ratio, a
    binned calibration error or a ranking area has no per-item value whose mean is the metric), or
    test items (or their classes) that differ between seeds.

    ``strata`` is ``None`` for a mean over items; for a class mean (``agg: class_mean``: balanced
    accuracy, the accuracy over the head or the tail classes) it is each kept item's class, the items
    restricted to the metric's classes where it names them, and the metric is the mean over classes
    of the per-class mean (``stats.two_level_bootstrap``'s ``strata``)."""
    out: Dict[int, np.ndarray] = {}
    ids = strata = None
    for s in seeds:
        path = items.get((arm, s))
        if path is None:
            return {}, None, f"no per-item records for {arm} seed {s}", None
        rec = _load_items(path)
        spec = rec.header.get("metrics", {}).get(metric)
        if spec is None:
            return {}, None, f"{metric} is not in the per-item records", None
        if spec["agg"] not in ("mean", "class_mean"):
            return {}, None, f"{metric} is aggregated as {spec['agg']}, not a mean over items or classes", None
        table = rec.tables[spec["table"]]
        order = np.argsort(table["item"], kind="stable")
        vals = table[spec["columns"][0]][order].astype(np.float64)
        these = table["item"][order]
        lab = None
        if spec["agg"] == "class_mean":
            lab = np.asarray(table[spec["columns"][1]][order]).astype(np.int64)
            keep = np.isin(lab, spec["classes"]) if spec.get("classes") is not None else np.ones(lab.size, bool)
            these, vals, lab = these[keep], vals[keep], lab[keep]
        if ids is None:
            ids, strata = these, lab
        elif these.shape != ids.shape or not np.array_equal(these, ids):
            return {}, None, f"{arm}'s test items differ between seeds", None
        elif lab is not None and not np.array_equal(lab, strata):
            return {}, None, f"{arm}'s test items' classes differ between seeds", None
        out[s] = vals
    return out, ids, "", strata


def item_intervals(c: Claim, rows: Sequence[dict], seeds: Sequence[int], items: Dict[Tuple[str, int], str], *,
                   confidence: float, n_boot: int) -> Tuple[Dict[str, dict], Dict[str, str]]:
    """Revision 4: the two-level bootstrap (``stats.two_level_bootstrap``, seeds and test items
    resampled, the pairing by seed and item kept; for a class mean the items resampled within their
    classes) of every paired check (``higher``, ``lower``,
    ``not_worse``, ``equivalent``; not sanity, level, did or transformed checks) whose metric the
    per-item records give for every seed of both arms: ``({check name: {"ci", "p", "items", "seeds"}},
    {check name: why not})``. The seeds are those both arms finished; the margin is the one the
    check is read with (declared, or resolved from the baseline's error)."""
    found: Dict[str, dict] = {}
    notes: Dict[str, str] = {}
    for i, ch in enumerate(c.checks):
        name = f"{i}"
        if ch.kind not in DIRECTION_KINDS + MARGIN_KINDS or ch.transform or not ch.baseline:
            continue
        both = sorted(set(seed_values(rows, ch.family, ch.metric, seeds)) & set(seed_values(rows, ch.baseline,
                                                                                            ch.metric, seeds)))
        fam, fam_ids, why, strata = item_scores(items, ch.family, ch.metric, both)
        base, base_ids, why_b, base_strata = (item_scores(items, ch.baseline, ch.metric, both) if not why
                                              else ({}, None, "", None))
        why = why or why_b
        if not why and (fam_ids is None or not np.array_equal(fam_ids, base_ids)):
            why = "the two arms were tested on different items"
        same_classes = (strata is None and base_strata is None) or (
            strata is not None and base_strata is not None and np.array_equal(strata, base_strata))
        if not why and not same_classes:
            why = "the two arms' records give the items different classes"
        if not why and len(both) < 2:
            why = "fewer than 2 seeds"
        if why:
            notes[name] = why
            continue
        rel = _relative(ch, rows, seeds)
        margin = stats.resolve_margin(margin=ch.margin, relative=rel.get("relative_margin"),
                                      baseline_mean=rel.get("baseline_mean"), better=ch.better).margin
        kind = "not_worse_lower" if ch.kind == "not_worse" and ch.better == "lower" else ch.kind
        ci = stats.two_level_bootstrap(fam, base, confidence=confidence, n_boot=n_boot, strata=strata)
        p = stats.two_level_p_value(kind, fam, base, margin=margin, n_boot=n_boot, strata=strata)
        found[name] = {"ci": ci, "p": p, "items": int(fam_ids.size), "seeds": len(both),
                       "classes": None if strata is None else int(np.unique(strata).size)}
    return found, notes


def replicate_result(c: Claim, prim: dict, rows: Sequence[dict]) -> dict:
    """Revision 4: the primary check on the claim's replicate runs (phase ``replicate``: every arm at
    ``budget`` times its epochs, the chosen settings kept, on seeds ``0 .. seeds - 1``). A decided
    verdict (*reproduced* / *contradicted*) stands only if the replicate's mean paired difference lies
    on the same side of the check's decision boundary: 0 for ``higher`` / ``lower``; ``-margin``
    (``+margin`` where lower is better) for ``not_worse``; inside ``+-margin`` for ``equivalent``
    (reproduced) or outside it (contradicted), with the margin the main check was read with; 0 in the
    claimed direction for a difference in differences (its clean arms replicated as well). Returns
    ``{"budget", "seeds", "n", "mean", "values", "flips", "text"}``; ``flips`` is ``False`` where
    there is nothing to flip (the verdict is not decided, no replicate run finished)."""
    ch, r = prim["check"], prim["result"]
    budget, n_seeds = int(c.replicate[0]), int(c.replicate[1])
    if ch.kind == SENSITIVITY_KIND:  # its sample is the tuning sweep, which a replicate does not repeat
        return {"budget": budget, "seeds": n_seeds, "n": 0, "values": [], "mean": float("nan"), "flips": False,
                "text": "not read (a learning-rate sensitivity: its sample is the tuning sweep)"}
    seeds = list(range(n_seeds))
    rep = [dict(x, phase="eval") for x in rows if x.get("phase") == REPLICATE_PHASE]
    sample = check_sample(ch, rep, seeds)
    vals = [sample[s] for s in sorted(sample)]
    out = {"budget": budget, "seeds": n_seeds, "n": len(vals), "values": vals,
           "mean": float(np.mean(vals)) if vals else float("nan"), "flips": False}
    decided = r.verdict in (stats.REPRODUCED, stats.CONTRADICTED)
    if not vals:
        out["text"] = f"not run (no finished run at {budget}x the budget)"
        return out
    m, mg = out["mean"], r.margin
    kind = ch.rule_kind()
    if kind == "higher":
        same = (m > 0) if r.verdict == stats.REPRODUCED else (m < 0)
        boundary = "0"
    elif kind == "lower":
        same = (m < 0) if r.verdict == stats.REPRODUCED else (m > 0)
        boundary = "0"
    elif kind == "not_worse":
        edge = -mg if ch.better == "higher" else mg
        ok = m > edge if ch.better == "higher" else m < edge
        same = ok if r.verdict == stats.REPRODUCED else not ok
        boundary = f"{edge:+.4g}"
    elif kind == "equivalent":
        inside = -mg < m < mg
        same = inside if r.verdict == stats.REPRODUCED else not inside
        boundary = f"+-{mg:.4g}"
    elif kind == DID_KIND:  # the differences in differences of the replicated arms (the clean ones too)
        up = m > 0 if ch.better == "higher" else m < 0
        same = up if r.verdict == stats.REPRODUCED else not up
        boundary = "0"
    else:  # level and sanity rules are not replicated
        out["text"] = f"not read (a {kind} check)"
        return out
    out["flips"] = bool(decided and not same)
    word = ("the verdict stands" if same else "the verdict does not stand: not resolved at this budget") if decided \
        else "nothing to confirm (the verdict is not decided)"
    out["text"] = (f"mean difference {m:+.4f} over {len(vals)} seed(s) at {budget}x the budget (decision boundary "
                   f"{boundary}): {word}")
    return out


def test_splits(c: Claim, rows: Sequence[dict], seeds: Sequence[int]) -> Dict[Tuple[str, int], str]:
    """``{(arm, seed): test-split fingerprint}`` of the claim's finished evaluation runs (its clean
    arms included; ``""`` where a run recorded none)."""
    out = {}
    for r in rows:
        if r["arm"] in c.run_arms() and r["phase"] == "eval" and r["ok"] and int(r["seed"]) in seeds:
            fp = r.get("test_split") or ""
            if not fp and r.get("data"):
                d = json.loads(r["data"]) if isinstance(r["data"], str) else r["data"]
                fp = d.get("test_split", "")
            out[(r["arm"], int(r["seed"]))] = fp
    return out


def curve_of(row: dict, metric: str) -> Optional[List[Optional[float]]]:
    """The run's validation curve of ``metric`` (a value per epoch), or ``None``."""
    raw = row.get("curve")
    if not raw:
        return None
    curve = json.loads(raw) if isinstance(raw, str) else raw
    return curve.get(metric)


def curve_metric(check: Check, arm: Optional[Arm], rows: Sequence[dict]) -> Tuple[str, str]:
    """The validation metric a check's learning curves are read on and its good direction: the
    check's own metric as ``val/...`` where the baseline's curves carry it, else the baseline arm's
    ``select`` (maximised)."""
    name = "val/" + check.metric.split("/", 1)[-1]
    better = check.kind if check.kind in DIRECTION_KINDS else check.better
    if arm is None or any(curve_of(r, name) for r in rows if r["arm"] == check.baseline and r["phase"] == "eval"):
        return name, better
    return arm.select, "higher"


def claim_budget(c: Claim, prim: dict, rows: Sequence[dict], seeds: Sequence[int],
                 arms: Optional[Dict[str, Arm]] = None) -> Optional[dict]:
    """Revision 3: whether the primary check's baseline was still improving at the end of the budget
    (:func:`stats.budget_limited` on its evaluation runs' validation curves); ``None`` for a check
    without a baseline (levels)."""
    ch = prim["check"]
    if not ch.baseline:
        return None
    return arm_budget(ch.baseline, prim, rows, seeds, arms)


def arm_budget(arm: str, prim: dict, rows: Sequence[dict], seeds: Sequence[int],
               arms: Optional[Dict[str, Arm]] = None) -> dict:
    """:func:`stats.budget_limited` on one arm's evaluation curves, read on the primary check's
    metric (or the check's baseline's ``select``) with the primary check's margin and interval."""
    ch, r = prim["check"], prim["result"]
    metric, better = curve_metric(ch, (arms or {}).get(ch.baseline), rows)
    curves = [v for row in rows if row["arm"] == arm and row["phase"] == "eval" and row["ok"]
              and int(row["seed"]) in seeds and (v := curve_of(row, metric))]
    half = (r.ci.high - r.ci.low) / 2.0 if math.isfinite(r.ci.low) else float("nan")
    margin = r.margin if ch.rule_kind() in MARGIN_KINDS else None
    return {"arm": arm, "metric": metric, "curves": len(curves),
            "epochs": (arms or {})[arm].epochs if arm in (arms or {}) else None,
            "rule": stats.budget_limited(curves, better=better, margin=margin, half_width=half)}
