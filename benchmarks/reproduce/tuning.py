"""Step 1 of the pipeline: tuning. Every arm is tuned over its declared grid on the validation split
(one run per grid point and tuning seed, ``fit`` only, validation at the end of the last epoch; the
test split is never read), and the point of best mean ``select`` metric is chosen (ties: the first
declared; :func:`choose`, :func:`tune_group`). A point some of whose runs gave no finite value (a run
failed or diverged) ranks after every point with more such values: a setting that breaks on a seed
is not chosen over one that trains on all of them.

The claims file's ``tuning.widen`` rule widens a grid whose choice sits at an end of a numeric list
(:func:`numeric_lists`): the arms a claim compares widen together, one point each per round
(:func:`step_out`), so their tuning budgets stay equal. :func:`tune_group` replays a group's tuning
round by round from a :data:`Score` of the finished tuning runs (:func:`score_from_rows`), a pure
function of those runs: a report regenerated from committed runs makes the same decisions as the
invocation that ran them. :func:`grid_edges` names the choices still at an end of what was tried.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .claims import Arm, ClaimsFile
from .runs import Run, cli_value

QUICK_GRID = 1  # grid points tuned in --quick (the selection itself is unit-tested)


def _points(arm: Arm, quick: bool) -> List[Dict[str, Any]]:
    """The grid points an arm is tuned over (the first ``QUICK_GRID`` in ``--quick``)."""
    return arm.grid_points()[:QUICK_GRID] if quick else arm.grid_points()


def tuning_runs(arms: Sequence[Arm], seeds: Sequence[int], quick: bool) -> List[Run]:
    out = []
    for a in arms:
        for p in _points(a, quick):
            for s in seeds:
                out.append(Run(a, s, "tune", tuple(p.items())))
    return out


def choose(arm: Arm, rows: Sequence[dict], quick: bool) -> Tuple[Dict[str, Any], List[dict]]:
    """The grid point with the best mean validation ``select`` metric (ties: the first declared), and
    the tuning table ``[{params, value, n}]``."""
    points = _points(arm, quick)
    table, best, best_k = [], points[0], (0, -math.inf)
    for p in points:
        key = json.dumps(p, sort_keys=True)
        vals = [float(r[arm.select]) for r in rows if r["arm"] == arm.key and r["phase"] == "tune"
                and r["params"] == key and r["ok"] and r.get(arm.select) not in ("", None)
                and math.isfinite(float(r[arm.select]))]
        v = sum(vals) / len(vals) if vals else float("nan")
        table.append({"params": p, "value": v, "n": len(vals)})
        if vals and (len(vals), v) > best_k:
            best, best_k = p, (len(vals), v)
    return best, table


Score = Callable[[Arm, Dict[str, Any]], Optional[Tuple[float, int]]]


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def numeric_lists(arm: Arm) -> List[str]:
    """The grid keys the widening rule applies to: declared lists of ``arm.widen_min`` or more numbers
    (3 up to protocol revision 3, where with two values every choice is an end and nothing widened;
    2 from revision 4, which widens every tuned numeric key); in an explicit ``points`` grid, a key
    that every point sets to a number, with that many distinct values (e.g. the learning rate of a
    list written out as learning rates x settings that have no value of their own to tune, or a
    points list of fixed scales)."""
    least = max(2, int(arm.widen_min))
    if arm.points:
        pts = arm.grid_points()
        keys = [k for k in pts[0] if all(_is_num(p.get(k)) for p in pts)]
        return [k for k in keys if len({p[k] for p in pts}) >= least]
    return [k for k, vals in arm.grid if len(set(vals)) >= least and all(_is_num(v) for v in vals)]


def step_out(values: Sequence[Any], side: str) -> Any:
    """The value one step beyond the ``side`` ("low" / "high") end of ``values``: the end times the
    ratio of the end to its neighbour when every value is positive (geometric), the end plus their
    difference otherwise; integers stay integers (at least 1 beyond the end), floats are rounded to 6
    significant digits."""
    v = sorted(set(values))
    end, nb = (v[0], v[1]) if side == "low" else (v[-1], v[-2])
    new = end * end / nb if all(x > 0 for x in v) else end + (end - nb)
    if all(isinstance(x, int) for x in v):
        new = int(round(new))
        if new == end:
            new = end - 1 if side == "low" else end + 1
        return new
    return float(f"{new:.6g}")


@dataclasses.dataclass
class GroupTuning:
    """Where a group's tuning stands (:func:`tune_group`)."""
    points: Dict[str, List[Dict[str, Any]]]  # per arm: the declared points, then the widened ones
    missing: List[Tuple[Arm, Dict[str, Any]]]  # points some tuning run of which has not finished
    final: bool  # every round is done: ``chosen`` is the arm's choice
    chosen: Dict[str, Dict[str, Any]]
    tables: Dict[str, List[dict]]  # per arm: {params, value, n, round, reason}
    rounds: int  # widening rounds made


def _end_of(arm: Arm, points: Sequence[Dict[str, Any]], best: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    """``(key, "low" | "high")`` of the first widenable list whose chosen value sits at an end of the
    values tried so far, or ``None``."""
    if not arm.widen:
        return None
    for key in numeric_lists(arm):
        vals = [p[key] for p in points if key in p and _is_num(p[key])]
        if key in best and len(set(vals)) >= 2:
            if best[key] == min(vals):
                return key, "low"
            if best[key] == max(vals):
                return key, "high"
    return None


def tune_group(arms: Sequence[Arm], score: Score, *, rounds: int, quick: bool = False) -> GroupTuning:
    """Replay the tuning of a group of arms that widen together, round by round, from ``score``
    (``score(arm, point)``: ``(mean validation value, runs with a value)`` once every tuning run of the
    point has finished -- the mean may be NaN when they failed -- else ``None``).

    Round 0 is the declared grid. After a round whose runs are all finished, each arm's choice is the
    point of highest mean among those with the most runs of a finite value (ties: the first tried); if any widenable arm chose an end of a list
    (:func:`_end_of`) and fewer than ``rounds`` rounds were made, every widenable arm gains exactly one
    point: its choice with the end value stepped out (:func:`step_out`) when it chose an end, otherwise
    its choice with the value one step beyond the end of the list on the side of its better neighbour
    (so that the group's tuning budgets stay equal). ``--quick`` never widens. The replay is a pure
    function of the finished runs, so a report regenerated from committed runs makes the same
    decisions as the invocation that ran them."""
    rounds = 0 if quick else max(0, int(rounds))
    points = {a.key: [dict(p) for p in _points(a, quick)] for a in arms}
    origin: Dict[str, List[Tuple[int, str]]] = {a.key: [(0, "")] * len(points[a.key]) for a in arms}
    made = 0
    while True:
        missing = [(a, p) for a in arms for p in points[a.key] if score(a, p) is None]
        tables: Dict[str, List[dict]] = {}
        chosen: Dict[str, Dict[str, Any]] = {}
        if not missing:
            for a in arms:
                best, best_k, table = points[a.key][0], (0, -math.inf), []
                for p, (rnd, why) in zip(points[a.key], origin[a.key]):
                    v, n = score(a, p)
                    table.append({"params": p, "value": v, "n": n, "round": rnd, "reason": why})
                    if n and math.isfinite(v) and (n, v) > best_k:  # more finite runs first, then the mean
                        best, best_k = p, (n, v)
                chosen[a.key], tables[a.key] = best, table
        if missing:
            return GroupTuning(points, missing, False, chosen, tables, made)
        ends = {a.key: _end_of(a, points[a.key], chosen[a.key]) for a in arms}
        if made >= rounds or not any(ends.values()):
            return GroupTuning(points, [], True, chosen, tables, made)
        made += 1
        end_keys = [e[0] for e in ends.values() if e]
        for a in arms:
            if not a.widen or not numeric_lists(a):
                continue
            best = chosen[a.key]
            if ends[a.key]:
                key, side = ends[a.key]
                why = f"chose the {'lowest' if side == 'low' else 'highest'} {key.split('.')[-1]}"
            else:
                lists = numeric_lists(a)
                key = next((k for k in end_keys if k in lists), lists[0])
                vals = sorted({p[key] for p in points[a.key] if key in p})
                i = vals.index(best[key]) if best.get(key) in vals else 0
                nb = {}
                for side, j in (("low", i - 1), ("high", i + 1)):
                    if 0 <= j < len(vals):
                        q = dict(best, **{key: vals[j]})
                        r = score(a, q) if q in points[a.key] else None
                        nb[side] = (r[1], r[0]) if r and r[1] and math.isfinite(r[0]) else (0, -math.inf)
                side = "low" if nb.get("low", (0, -math.inf)) > nb.get("high", (0, -math.inf)) else "high"
                why = f"equal budget (its better neighbour is {'lower' if side == 'low' else 'higher'})"
            new = dict(best, **{key: step_out([p[key] for p in points[a.key] if key in p], side)})
            points[a.key].append(new)
            origin[a.key].append((made, why))


def score_from_rows(rows: Sequence[dict], tune_seeds: Sequence[int]) -> Score:
    """A :data:`Score` over finished tuning rows (``ok`` or failed): the mean of the arm's ``select``
    metric over its finite values, once a row exists for every tuning seed."""
    by: Dict[Tuple[str, str], Dict[int, dict]] = {}
    for r in rows:
        if r.get("phase") == "tune":
            by.setdefault((r["arm"], r["params"]), {})[int(r["seed"])] = r

    def score(arm: Arm, p: Dict[str, Any]) -> Optional[Tuple[float, int]]:
        got = by.get((arm.key, json.dumps(p, sort_keys=True)), {})
        if any(int(s) not in got for s in tune_seeds):
            return None
        vals = [float(got[int(s)][arm.select]) for s in tune_seeds
                if got[int(s)].get("ok") in (True, "True") and got[int(s)].get(arm.select) not in ("", None)
                and math.isfinite(float(got[int(s)][arm.select]))]
        return (sum(vals) / len(vals) if vals else float("nan")), len(vals)

    return score


def plan_groups(cf: ClaimsFile, arm_keys: Sequence[str]) -> List[List[str]]:
    """The widening groups (:meth:`ClaimsFile.widen_groups`) that hold any of ``arm_keys``: their arms
    are all tuned, so that each of them is widened as the whole group is."""
    return [g for g in cf.widen_groups() if any(k in arm_keys for k in g)]


def grid_edges(arm: Arm, point: Dict[str, Any], tried: Sequence[Dict[str, Any]] = ()) -> List[str]:
    """The tuned values of ``point`` that sit at an end of their grid list, e.g. ``["lr=0.01
    (highest of 3)"]``: the lists :func:`numeric_lists` widens (up to revision 3 three or more
    numbers, with two every choice being an end; from revision 4 two or more; an explicit ``points``
    grid: only a key every point sets to a number);
    ``tried``: every point tuned (the widened ones extend the lists). Such an arm may be under-tuned:
    its optimum can lie beyond the grid."""
    out = []
    for key in numeric_lists(arm):
        if key not in point:
            continue
        nums = sorted({p[key] for p in arm.grid_points()} | {p[key] for p in tried if _is_num(p.get(key))})
        v = point[key]
        end = "lowest" if v == min(nums) else "highest" if v == max(nums) else ""
        if end:
            out.append(f"{key.split('.')[-1]}={cli_value(v)} ({end} of {len(nums)})")
    return out


def _params_text(p: Dict[str, Any]) -> str:
    if not p:
        return "recipe as is"
    return ", ".join(f"{k.split('.')[-1]}={cli_value(v)}" for k, v in p.items())
