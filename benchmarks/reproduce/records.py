"""The runs files (``<benchmark>_runs.csv``): the record of every run, tuning and evaluation, one row
per run (:data:`CSV_FIXED` and the metric columns; :func:`write_csv`, :func:`read_csv`).

The committed runs files are what the reports are computed from: ``--runs-from`` copies their
finished runs into the workdir before anything starts (:func:`seed_workdir`), so the reports
regenerate from committed runs on any machine and only runs missing from them execute. A row is read
as recorded whatever code made it (revision 2's rows carry no code hash); rows written before the
``key`` column match a run on its recipe, arguments and epochs (:func:`_match_fields`). Every run the
plan can need is a candidate (:func:`candidate_runs`: every grid point, and the widened points the
files hold, :func:`file_points`). ``--export-runs`` writes the finished runs of the selected claims
(:func:`finished_rows`), so a reproduction longer than one machine's session can be committed
part-done and resumed elsewhere.
"""

from __future__ import annotations

import csv
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .claims import REPLICATE_PHASE, Arm, replicate_arm
from .common import ROOT
from .running import TEST_ITEMS, _recipe_sha, _run_dir, _run_key, cached_row, run_dir_name
from .runs import Run, _overrides
from .tuning import _points, tuning_runs

CSV_FIXED = ["benchmark", "arm", "label", "phase", "recipe", "recipe_sha", "code", "started", "seed", "params",
             "overrides", "epochs", "steps", "ok", "error", "fit_seconds", "test_seconds", "run_seconds",
             "peak_rss_mb", "threads", "cached", "data", "key", "versions", "test_split", "code_hash", "curve"]


def write_csv(rows: Sequence[dict], path: str) -> None:
    metrics = sorted({k for r in rows for k in r if k.startswith(("val/", "test/", "train/"))})
    # the device each run trained on and its per-step training trace (the language model's loss and log Z), a
    # column each once some run records it (older runs files regenerate as they were)
    fixed = CSV_FIXED + [k for k in ("device", "trace") if any(r.get(k) for r in rows)]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fixed + metrics, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in fixed + metrics})


def read_csv(path: str) -> List[dict]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        r["ok"] = r["ok"] == "True"
        r["seed"] = int(r["seed"])
    return rows


def runs_files(paths: Sequence[str]) -> List[str]:
    """The runs CSV files named by ``--runs-from``: a file as given, a folder's ``*_runs.csv``."""
    out: List[str] = []
    for p in paths:
        if os.path.isdir(p):
            out += sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith("_runs.csv"))
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise SystemExit(f"reproduce_results: --runs-from {p!r}: no such file or folder")
    return out


def candidate_runs(arms: Sequence[Arm], tune_seeds: Sequence[int], eval_seeds: Dict[str, Sequence[int]],
                   quick: bool, extra: Optional[Dict[str, Sequence[Dict[str, Any]]]] = None,
                   replicates: Optional[Dict[str, Tuple[int, Sequence[int]]]] = None) -> List[Run]:
    """Every run the plan can need: the tuning runs, and each arm's evaluation runs at every grid
    point (which point is evaluated is known only once tuning is done); ``extra``: per arm, points
    beyond the declared grid (widened points, known from runs files or the workdir); ``replicates``
    (``{arm: (budget, seeds)}``): the replicate runs at every point too."""
    runs = tuning_runs(arms, tune_seeds, quick)
    for a in arms:
        more = [p for p in (extra or {}).get(a.key, ()) if p not in _points(a, quick)]
        runs += [Run(a, s, "tune", tuple(p.items())) for p in more for s in tune_seeds]
        runs += [Run(a, s, "eval", tuple(p.items())) for p in _points(a, quick) + more
                 for s in sorted(eval_seeds.get(a.key, ()))]
        if a.key in (replicates or {}):
            budget, rseeds = replicates[a.key]
            runs += [Run(replicate_arm(a, budget), s, REPLICATE_PHASE, tuple(p.items()))
                     for p in _points(a, quick) + more for s in sorted(rseeds)]
    return runs


def file_points(files: Sequence[str], arms: Sequence[Arm]) -> Dict[str, List[Dict[str, Any]]]:
    """Per arm, the grid points its rows in the runs ``files`` were run at (widened points included)."""
    by_key = {a.key: a for a in arms}
    out: Dict[str, List[Dict[str, Any]]] = {}
    for path in files:
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                if row.get("arm") in by_key and row.get("params"):
                    p = grid_order(by_key[row["arm"]], json.loads(row["params"]))
                    if p not in out.setdefault(row["arm"], []):
                        out[row["arm"]].append(p)
    return out


def grid_order(arm: Arm, point: Dict[str, Any]) -> Dict[str, Any]:
    """``point`` with its keys in the order the arm's grid declares them (the order of its runs'
    arguments, hence of their keys): a runs file writes ``params`` with sorted keys, and a point
    read back in that order would name another run than the one the tuning replay looks up (a grid
    of two keys whose sorted order differs from the declared one, e.g. ``lr`` and
    ``loss.init_args.scale``)."""
    order = [k for k, _ in arm.grid] or [k for k, _ in (arm.points[0] if arm.points else ())]
    return {**{k: point[k] for k in order if k in point}, **{k: v for k, v in point.items() if k not in order}}


def _match_fields(run: Run) -> Tuple[str, ...]:
    """What identifies a run in a runs file written before the ``key`` column: recipe path and content
    hash, phase, seed, fixed overrides, grid point and epochs."""
    return (run.arm.recipe, _recipe_sha(run.arm), run.phase,
            str(run.seed), " ".join(_overrides(run.arm.overrides)), json.dumps(dict(run.params), sort_keys=True),
            str(run.arm.epochs))


def _row_fields(row: Dict[str, str]) -> Tuple[str, ...]:
    """``_match_fields`` read from a runs-file row (the same fields, the same order)."""
    return (row["recipe"], row["recipe_sha"], row["phase"], row["seed"], row.get("overrides", ""), row["params"],
            row["epochs"])


def _result_from_row(row: Dict[str, str], source: str) -> dict:
    """A finished run's ``result.json`` rebuilt from its runs-file row (the inverse of ``_row``)."""
    def num(k: str) -> float:
        return float(row[k]) if row.get(k) not in ("", None) else 0.0

    def metrics(prefix: str) -> Dict[str, float]:
        return {k: float(v) for k, v in row.items() if k.startswith(prefix) and v not in ("", None)}

    versions = json.loads(row.get("versions") or "{}")
    if row.get("threads") not in ("", None):
        versions["threads"] = int(row["threads"])
    return {"ok": True, "epochs": int(num("epochs")), "steps": int(num("steps")), "fit_seconds": num("fit_seconds"),
            "test_seconds": num("test_seconds"), "wall_seconds": num("run_seconds"), "peak_rss_mb": num("peak_rss_mb"),
            "recipe_sha": row.get("recipe_sha", ""), "code": row.get("code", ""), "started": row.get("started", ""),
            "code_hash": row.get("code_hash", ""), "curve": json.loads(row["curve"]) if row.get("curve") else {},
            "data": json.loads(row.get("data") or "{}"), "versions": versions, "device": row.get("device") or "",
            "trace": json.loads(row["trace"]) if row.get("trace") else {},
            "fit_metrics": metrics("train/"),
            "val_metrics": metrics("val/"), "test_metrics": metrics("test/"), "read_from": source}


def seed_workdir(runs: Sequence[Run], files: Sequence[str], *, workdir: str, quick: bool) -> Tuple[int, int]:
    """Write the ``result.json`` of every run of ``runs`` that a runs file holds as finished (``ok``)
    into ``workdir``, so the plan reads it as a finished run instead of running it; a run the
    workdir already holds as finished is left as it is. Rows written with the ``key`` column match
    on it exactly (recipe content and every argument); older rows match on ``_match_fields``
    (never in ``--quick``). Returns ``(runs written, runs the workdir already had)``."""
    by_key: Dict[str, Tuple[dict, str]] = {}
    by_fields: Dict[Tuple[str, ...], Tuple[dict, str]] = {}
    for path in files:
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                if row.get("ok") != "True":
                    continue
                if row.get("key"):
                    by_key.setdefault(row["key"], (row, path))
                elif not quick:
                    by_fields.setdefault(_row_fields(row), (row, path))
    written = had = 0
    seen = set()
    for run in runs:
        args = run.args(quick)
        key = _run_key(run, args)
        if key in seen:
            continue
        seen.add(key)
        if cached_row(run, quick=quick, workdir=workdir) is not None:
            had += 1
            continue
        hit = by_key.get(key) or (None if quick else by_fields.get(_match_fields(run)))
        if hit is None:
            continue
        row, path = hit
        run_dir = _run_dir(run, args, workdir)
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "result.json"), "w") as fh:
            json.dump(_result_from_row(row, os.path.relpath(path, ROOT)), fh, indent=1, sort_keys=True)
        written += 1
    return written, had


def finished_rows(runs: Sequence[Run], *, workdir: str, quick: bool) -> List[dict]:
    """The rows of the runs of ``runs`` that ``workdir`` holds as finished, each run once."""
    out, seen = [], set()
    for run in runs:
        key = _run_key(run, run.args(quick))
        if key not in seen and (row := cached_row(run, quick=quick, workdir=workdir)) is not None:
            seen.add(key)
            out.append(row)
    return out


def items_folder(out: str, benchmark: str) -> str:
    """The folder of a benchmark's per-item test records beside its runs file (``<benchmark>_test_items``)."""
    return os.path.join(out, f"{benchmark}_test_items")


def export_test_items(rows: Sequence[dict], arms: Dict[str, Arm], *, workdir: str, export: str,
                      search: Sequence[str] = ()) -> Dict[Tuple[str, int], str]:
    """The per-item test records of the evaluation runs in ``rows`` (an ``--export-runs`` file's rows),
    copied into ``<benchmark>_test_items/`` beside the file ``export``, where ``--runs-from`` looks for
    them: from the workdir, or from the records folder of a ``--runs-from`` file (``search``) when the
    run was read from one. Without this, a run finished in a workdir that does not outlive the machine
    would keep its row and lose the records behind its two-level bootstrap. Returns
    ``{(arm, seed): path}`` of the records now beside the export."""
    import shutil

    out = os.path.dirname(os.path.abspath(export))
    copied: Dict[Tuple[str, int], str] = {}
    for benchmark in sorted({r["benchmark"] for r in rows}):
        brows = [r for r in rows if r["benchmark"] == benchmark]
        found = collect_test_items(brows, arms, benchmark=benchmark, workdir=workdir, out=out, search=search)
        for (arm, seed), path in found.items():
            target = os.path.join(items_folder(out, benchmark), f"{arm}__s{seed}.npz")
            if os.path.abspath(path) != os.path.abspath(target):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(path, target)
            copied[(arm, seed)] = target
    return copied


def collect_test_items(rows: Sequence[dict], arms: Dict[str, Arm], *, benchmark: str, workdir: str, out: str,
                       search: Sequence[str] = ()) -> Dict[Tuple[str, int], str]:
    """``{(arm, seed): path}`` of the per-item test records of the finished evaluation runs in ``rows``
    (revision 4). An evaluation run writes ``test_items.npz`` in its workdir folder; it is copied to
    ``<out>/<benchmark>_test_items/<arm>__s<seed>.npz`` (committed beside the runs file), and a run read
    from a runs file finds its records in the ``<benchmark>_test_items`` folder beside that file
    (``search``: the folders of the ``--runs-from`` files) or already in ``out``. A run without
    records (made before they were written) is left out."""
    import shutil

    dest = items_folder(out, benchmark)
    found: Dict[Tuple[str, int], str] = {}
    for r in rows:
        if r.get("phase") != "eval" or not r.get("ok") or r.get("arm") not in arms:
            continue
        arm, seed = r["arm"], int(r["seed"])
        name = f"{arm}__s{seed}.npz"
        folder_name = run_dir_name(arms[arm].recipe, "eval", seed, r.get("key", ""), r.get("code_hash", ""))
        src = os.path.join(workdir, folder_name, TEST_ITEMS)
        target = os.path.join(dest, name)
        if os.path.isfile(src):
            os.makedirs(dest, exist_ok=True)
            shutil.copyfile(src, target)
            found[(arm, seed)] = target
            continue
        for folder in [dest, *(items_folder(d, benchmark) for d in search)]:
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                found[(arm, seed)] = path
                break
    return found
