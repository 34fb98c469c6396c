"""The command line: ``python benchmarks/reproduce_results.py [options]`` (:func:`main`).

:func:`main` runs the pipeline in order for the claims selected by ``--claims`` / ``--benchmarks``
(:func:`select_claims`): it loads and validates the claims file (:mod:`reproduce.claims`), refuses a
tree with uncommitted changes (:func:`reproduce.running._dirty_paths`), builds the tuning runs
(:mod:`reproduce.tuning`), seeds the workdir from ``--runs-from`` or writes ``--export-runs``
(:mod:`reproduce.records`), prints ``--plan`` or runs the queue (:func:`reproduce.running.run_plan`),
and then, per benchmark, reads the claims' verdicts (:mod:`reproduce.analysis`) and writes the runs
file, the figures (:mod:`reproduce.plots`) and the reports (:mod:`reproduce.reports`).

The functions of :mod:`reproduce.running` are looked up on the module when called (``running.execute``),
so that a test that replaces one of them there replaces it for the command line too.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

from . import __doc__ as PIPELINE
from . import running
from .analysis import claim_results, diverged, gate_reading, gated_result, not_run_result
from .claims import (REVISIONS, Arm, Claim, ClaimsFile, data_config, load_claims, replicates,
                     validate_claims, without_evaluation)
from .common import CLAIMS_FILE, ROOT, stats
from .plots import plot_claims, plot_curves, plot_forest, plot_per_class, plot_sweep
from .records import (candidate_runs, collect_test_items, export_test_items, file_points, finished_rows, runs_files,
                      seed_workdir, write_csv)
from .reports import _versions, write_markdown, write_summary
from .tuning import plan_groups, tuning_runs


def _cpu_name() -> str:
    """The processor's model name, as each run records it (the worker's :func:`cpu_model`)."""
    from _reproduce_worker import cpu_model  # benchmarks/ is on sys.path, as for the whole package

    return cpu_model()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    cpus = os.cpu_count() or 1
    p = argparse.ArgumentParser(description=PIPELINE.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--claims-file", default=CLAIMS_FILE, help="the claims file (default benchmarks/claims.yaml)")
    p.add_argument("--claims", default="", help="comma-separated claim keys (default: every claim of --benchmarks)")
    p.add_argument("--benchmarks", default="", help="comma-separated benchmarks (default: every one in the file)")
    p.add_argument("--ci", choices=stats.METHODS, default=None, help="CI method (default: the file's statistics.ci)")
    p.add_argument("--revision", type=int, choices=REVISIONS, default=None,
                   help="protocol revision of the verdicts and reports (default: the file's statistics.revision; "
                        "2 without one)")
    p.add_argument("--quick", action="store_true", help="CI smoke run: 1 seed, the first grid point, 1 epoch of 2 batches "
                   "(numbers meaningless); needs --out outside results/")
    p.add_argument("--out", default=os.path.join(ROOT, "results"), help="output folder (default results/)")
    p.add_argument("--jobs", type=int, default=cpus, help="runs at once (default: CPU count)")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "losses-reproduce-v2"),
                   help="per-run folders (results kept for resuming; checkpoints deleted)")
    p.add_argument("--fresh", action="store_true", help="ignore finished runs in --workdir")
    p.add_argument("--runs-from", action="append", default=[], metavar="PATH",
                   help="a runs CSV file, or a folder's *_runs.csv (repeatable): their finished runs are copied into "
                        "--workdir first, so reports regenerate from committed runs and only missing runs execute")
    p.add_argument("--export-runs", default="", metavar="FILE",
                   help="run nothing: write the rows of the selected claims' runs finished in --workdir to FILE "
                        "and the per-item test records of its evaluation runs into <benchmark>_test_items/ beside it "
                        "(to commit unfinished work and resume it elsewhere with --runs-from FILE)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per run before it is killed")
    p.add_argument("--isolation", choices=("fork", "process"), default="fork",
                   help="fork: each run is a process forked from a server that imported torch, Lightning and the "
                        "CLI once (default, where the platform has a fork server); process: a fresh interpreter "
                        "per run")
    p.add_argument("--deadline", type=float, default=None, metavar="MINUTES",
                   help="start no run whose declared time would end more than MINUTES after this invocation "
                        "started (shorter runs that fit go first); the runs left are reported and no report is "
                        "written: rerun on the same --workdir, or --export-runs and --runs-from, to finish")
    p.add_argument("--plan", action="store_true", help="print the runs and their estimated time, run nothing")
    p.add_argument("--prepare-data", action="store_true",
                   help="build the data caches of the selected claims' arms once (tokenizers, token streams, "
                        "embeddings), one data set at a time, then exit: runs started side by side afterwards read "
                        "them instead of each building the same cache")
    p.add_argument("--allow-dirty", action="store_true",
                   help="start even with uncommitted changes under losses/, lightning_modules/, configs/ or "
                        "benchmarks/ (refused otherwise, except in --quick); the runs made are marked (their code "
                        "ends in -dirty) and the reports name them")
    p.add_argument("--revision-2-runs", action="store_true",
                   help="make and read runs as revision 2 did, ignoring the claims file's evaluation section (a "
                        "test split per seed, no validation during evaluation runs): to read results/revision2 "
                        "under the current claims file without training")
    return p.parse_args(argv)

def select_claims(cf: ClaimsFile, claims_arg: str, benchmarks_arg: str) -> List[Claim]:
    claims = list(cf.claims)
    if benchmarks_arg:
        want = [b.strip() for b in benchmarks_arg.split(",") if b.strip()]
        bad = [b for b in want if b not in cf.benchmarks]
        if bad:
            raise SystemExit(f"reproduce_results: unknown benchmark(s) {bad}; the file declares {list(cf.benchmarks)}")
        claims = [c for c in claims if c.benchmark in want]
    if claims_arg:
        want = [c.strip() for c in claims_arg.split(",") if c.strip()]
        unknown = [w for w in want if w not in {c.key for c in cf.claims}]
        if unknown:
            raise SystemExit(f"reproduce_results: unknown claim(s) {unknown}; the file declares "
                             f"{[c.key for c in cf.claims]}")
        claims = [c for c in claims if c.key in want]
    if not claims:
        raise SystemExit("reproduce_results: nothing to run (check --benchmarks / --claims)")
    return claims


def write_benchmark(b: str, claims: Sequence[Claim], rows: Sequence[dict], out: str, cf: ClaimsFile,
                    chosen: Dict[str, Dict[str, Any]], tables: Dict[str, List[dict]], meta: dict) -> List[dict]:
    """What ``out`` holds of benchmark ``b`` (``claims``: its selected claims; ``rows``: every run):
    its runs file, its figures and its report, from its claims' verdicts, which it returns (for the
    summary)."""
    brows = [r for r in rows if r["benchmark"] == b]
    write_csv(brows, os.path.join(out, f"{b}_runs.csv"))
    items = None
    if meta["revision"] >= 4:  # the per-item records behind the two-level bootstrap, kept beside the runs file
        items = collect_test_items(brows, cf.arms, benchmark=b, workdir=meta.get("workdir", ""), out=out,
                                   search=meta.get("items_search", ()))
    results = [claim_results(c, brows, seeds=meta["seeds_of"][c.key], method=meta["ci"], confidence=meta["confidence"],
                             revision=meta["revision"], n_boot=meta["bootstrap_resamples"], arms=cf.arms, items=items)
               for c in claims]
    pngs = []
    if plot_forest(b, results, cf.arms, os.path.join(out, f"{b}_forest.png")):
        pngs.append(f"{b}_forest.png")
    plot_claims(b, claims, brows, cf.arms, os.path.join(out, f"{b}.png"))
    pngs.append(f"{b}.png")
    if plot_curves(b, results, brows, cf.arms, os.path.join(out, f"{b}_curves.png")):
        pngs.append(f"{b}_curves.png")
    if plot_sweep(b, results, brows, cf.arms, os.path.join(out, f"{b}_sweep.png")):
        pngs.append(f"{b}_sweep.png")
    lt = [k for c in claims for k in c.arms if any("test/acc_class_0" in r for r in brows if r["arm"] == k)
          and any("acc_tail" in m for m in c.metrics)]
    lt = list(dict.fromkeys(lt))
    if lt:
        plot_per_class(brows, cf.arms, lt, os.path.join(out, f"{b}_lt_per_class.png"))
        pngs.append(f"{b}_lt_per_class.png")
    write_markdown(b, claims, results, brows, cf, chosen, tables, meta, os.path.join(out, f"{b}.md"), pngs)
    return results


def first_point_args(arm, quick: bool) -> List[str]:
    """An arm's run arguments at its first grid point (what decides the device it trains on)."""
    from .runs import run_args

    return run_args(arm, 0, arm.grid_points()[0], phase="eval", quick=quick)


def _gate_runs(c: Claim, tune, seed: int, args: argparse.Namespace) -> List[tuple]:
    """A gated claim's gate runs (its arm's declared tuning runs on ``seed``), each with its row where
    it is finished in the workdir (else ``None``)."""
    return [(r, running.cached_row(r, quick=args.quick, workdir=args.workdir))
            for r in tune if r.arm.key == c.gate.arm and r.seed == seed]


def gate_status(c: Claim, tune, seed: int, args: argparse.Namespace) -> str:
    """``--plan``'s line for a claim's gate: passed or failed (with its reading), or how many of its
    runs are finished."""
    gruns = _gate_runs(c, tune, seed, args)
    done = [row for _, row in gruns if row]
    reading = gate_reading(c, done)
    if reading.passed:
        return f"passed ({reading.text()})"
    if len(done) == len(gruns):
        return f"failed: the claim is not tested ({reading.text()})"
    return f"open: {len(done)} of its {len(gruns)} run(s) ({c.gate.arm}, seed {seed}) finished; they run first"


def run_gates(gated_claims: Sequence[Claim], cf: ClaimsFile, tune, seed: int, args: argparse.Namespace,
              common: Dict[str, Any], deadline: Optional[float]):
    """Revision 4: each claim's gate (``Claim.gate``) before any other run of it: its arm's declared
    tuning runs on the first tuning ``seed`` are made (or read from the workdir) and read
    (:func:`reproduce.analysis.gate_reading`). Returns ``(results of the claims whose gate failed:
    not tested, the rows of their gate runs, undecided)``; ``undecided`` is true when a gate's runs
    did not all finish (a failure, or the deadline), and then no other run of the claims starts."""
    gated: List[dict] = []
    gate_rows: List[dict] = []
    for c in gated_claims:
        g = c.gate
        gruns = _gate_runs(c, tune, seed, args)
        missing = [r for r, row in gruns if args.fresh or row is None]
        if missing:
            print(f"reproduce_results: {c.key}: its gate first ({g.name}): {len(missing)} tuning run(s) of {g.arm} on "
                  f"seed {seed}", flush=True)
            running.run_plan([cf.arms[g.arm]], missing, {}, deadline=deadline, rounds=0,
                             execute_fn=functools.partial(running.execute, isolation=args.isolation), **common)
            gruns = _gate_runs(c, tune, seed, args)  # read again: what those runs wrote
        done = [row for _, row in gruns if row]
        reading = gate_reading(c, done)
        if reading.passed:
            print(f"reproduce_results: {c.key}: gate passed ({reading.text()})", flush=True)
            continue
        if len(done) < len(gruns):
            print(f"reproduce_results: {c.key}: the gate is not decided ({len(done)} of {len(gruns)} gate run(s) "
                  f"finished: {len(gruns) - len(done)} failed or did not fit before the deadline); no other run of it "
                  f"starts. Rerun on the same --workdir to go on", flush=True)
            return gated, gate_rows, True
        print(f"reproduce_results: {c.key}: not tested, its gate failed ({reading.text()}); nothing else of it runs",
              flush=True)
        gated.append(gated_result(c, reading))
        gate_rows += done
    return gated, gate_rows, False


def printed_arguments(argv: Sequence[str], *, dirty: bool) -> List[str]:
    """The arguments a report prints as its command line: those that decide what it holds.

    ``--workdir`` only names the scratch folder of finished runs (any folder gives the same report)
    and is left out; ``--allow-dirty`` is kept only when there were uncommitted changes for it to allow
    (the report then lists them)."""
    out: List[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--workdir":
            skip = True
        elif a.startswith("--workdir=") or (a == "--allow-dirty" and not dirty):
            continue
        else:
            out.append(a)
    return out


def prepare_data(arms: Sequence[Arm]) -> int:
    """``--prepare-data``: instantiate the DataModule of every distinct data section among ``arms``
    (the recipe's, with the arm's ``data.init_args`` overrides; the seed left out, which orders batches
    and never keys a cache) and call its ``prepare_data()``, which fills the caches the runs then read.
    Returns 1 if any failed (each failure printed), else 0."""
    import importlib

    seen: Dict[str, Arm] = {}
    for a in arms:
        seen.setdefault(json.dumps(data_config(a), sort_keys=True), a)
    bad = 0
    for key, a in seen.items():
        cfg = json.loads(key)
        t0 = time.perf_counter()
        try:
            module, _, name = str(cfg["class_path"]).rpartition(".")
            dm = getattr(importlib.import_module(module), name)(**cfg["init_args"])
            dm.prepare_data()
        except Exception as exc:  # reported; the runs themselves then fail with the same error
            bad += 1
            print(f"reproduce_results: preparing the data of {a.key} failed: {type(exc).__name__}: {exc}", flush=True)
            continue
        print(f"reproduce_results: prepared the data of {a.key} ({cfg['class_path']}) in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    print(f"reproduce_results: {len(seen) - bad} of {len(seen)} data set(s) prepared", flush=True)
    return 1 if bad else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    cf = load_claims(args.claims_file)
    problems = validate_claims(cf)
    if problems:
        raise SystemExit("reproduce_results: the claims file is invalid:\n  " + "\n  ".join(problems))
    if args.revision_2_runs:
        cf = without_evaluation(cf)
    dirty: List[str] = []
    if not (args.plan or args.export_runs or args.prepare_data):  # these run nothing and write no report
        dirty = running._dirty_paths()
        if dirty and not (args.allow_dirty or args.quick):
            raise SystemExit("reproduce_results: uncommitted changes under "
                             + ", ".join(f"{d}/" for d in running.PROVENANCE_DIRS)
                             + " -- a run must be traceable to a commit. Commit them, or pass --allow-dirty (the runs "
                             "are then marked and the reports name them):\n  " + "\n  ".join(dirty[:20])
                             + ("\n  ..." if len(dirty) > 20 else ""))
    out = os.path.abspath(args.out)
    if args.quick and os.path.commonpath([out, os.path.join(ROOT, "results")]) == os.path.join(ROOT, "results"):
        raise SystemExit("reproduce_results: --quick writes meaningless numbers; pass --out outside results/")
    claims = select_claims(cf, args.claims, args.benchmarks)
    method = args.ci or cf.statistics.get("ci", "t")
    revision = args.revision or cf.revision
    # revision 4: a claim declared not applicable before any run is not run (its verdict is the declaration)
    not_run = [c for c in claims if revision >= 4 and c.not_applicable]
    if not_run:
        print(f"reproduce_results: {len(not_run)} claim(s) declared not applicable here, not run: "
              + ", ".join(c.key for c in not_run), flush=True)
        claims = [c for c in claims if c not in not_run]
    if not claims:
        raise SystemExit("reproduce_results: every selected claim is declared not applicable; nothing to run")
    confidence = float(cf.statistics.get("confidence", 0.95))
    seeds_of = {c.key: [0] if args.quick else list(range(c.seeds)) for c in claims}
    arm_seeds: Dict[str, set] = {}
    for c in claims:
        for k in c.run_arms():
            arm_seeds.setdefault(k, set()).update(seeds_of[c.key])
    rounds = 0 if args.quick else cf.widen_rounds
    groups = plan_groups(cf, list(arm_seeds)) if rounds else None
    # an arm of a selected arm's widening group is tuned too (it widens with the group), never evaluated
    arm_list = [cf.arms[k] for k in dict.fromkeys(list(arm_seeds) + [k for g in groups or () for k in g])]
    tune_seeds = list(cf.tuning_seeds[:1] if args.quick else cf.tuning_seeds)
    tune = tuning_runs(arm_list, tune_seeds, args.quick)
    n_eval = sum(len(s) for s in arm_seeds.values())
    est = (sum(r.arm.seconds for r in tune) + sum(cf.arms[k].seconds * len(s) for k, s in arm_seeds.items()))
    if rounds:
        print(f"reproduce_results: grids chosen at an end widen automatically (tuning.widen: at most {rounds} "
              f"round(s), {len(groups)} group(s) of arms that widen together); the declared time below counts "
              f"the declared grids only", flush=True)
    cpus = os.cpu_count() or 1
    jobs = max(1, args.jobs)
    threads = max(1, cpus // jobs)
    print(f"reproduce_results: {len(claims)} claims, {len(arm_list)} arms: {len(tune)} tuning runs + {n_eval} "
          f"evaluation runs; declared run time {est / 60:.0f} min in all (~{est / 60 / jobs:.0f} min at {jobs} "
          f"at a time); workdir {args.workdir}", flush=True)
    if args.prepare_data:
        return prepare_data(arm_list)
    if args.runs_from and args.fresh:
        raise SystemExit("reproduce_results: --fresh ignores finished runs; it cannot be combined with --runs-from")
    eval_seeds = {k: sorted(ss) for k, ss in arm_seeds.items()}
    # revision 4: the declared replicates at a multiple of the budget (not in --quick)
    reps = replicates(claims) if revision >= 4 and not args.quick else {}
    if reps:
        rep_s = sum(cf.arms[k].seconds * b * len(ss) for k, (b, ss) in reps.items())
        print(f"reproduce_results: and {sum(len(ss) for _, ss in reps.values())} replicate run(s) at a multiple of the "
              f"budget once their arm's setting is chosen, {rep_s / 60:.0f} min declared", flush=True)
    files = runs_files(args.runs_from) if args.runs_from else []
    if args.runs_from:
        os.makedirs(args.workdir, exist_ok=True)
        written, had = seed_workdir(candidate_runs(arm_list, tune_seeds, eval_seeds, args.quick,
                                                   extra=file_points(files, arm_list), replicates=reps), files,
                                    workdir=args.workdir, quick=args.quick)
        print(f"reproduce_results: {written} finished run(s) read from {len(files)} runs file(s) into the workdir "
              f"({had} already there)", flush=True)
    if args.export_runs:
        states = running.group_states(cf.arms, groups, [a.key for a in arm_list],
                              running.workdir_score(tune_seeds, quick=args.quick, workdir=args.workdir),
                              rounds=rounds, quick=args.quick)
        extra = {k: st.points[k] for k, st in states.items()}
        rows = finished_rows(candidate_runs(arm_list, tune_seeds, eval_seeds, args.quick, extra=extra,
                                            replicates=reps),
                             workdir=args.workdir, quick=args.quick)
        os.makedirs(os.path.dirname(os.path.abspath(args.export_runs)), exist_ok=True)
        write_csv(rows, args.export_runs)
        items = export_test_items(rows, cf.arms, workdir=args.workdir, export=args.export_runs,
                                  search=[os.path.dirname(os.path.abspath(f)) for f in files])
        print(f"reproduce_results: wrote the {len(rows)} finished run(s) of the selected claims to "
              f"{args.export_runs}" + (f", and the per-item test records of {len(items)} evaluation run(s) "
                                       f"beside it" if items else ""), flush=True)
        return 0
    if args.plan:
        left = 0.0
        for st in running.plan_status(claims, cf.arms, tune_seeds, seeds_of, quick=args.quick, workdir=args.workdir,
                              groups=groups, rounds=rounds):
            left += st["seconds_left"]
            print(f"  {st['claim']} ({st['benchmark']}): {st['arms']} arms, {st['tune']} tuning + {st['eval']} "
                  f"evaluation runs, {st['seconds'] / 60:.0f} min declared; finished: {st['tune_done']} tuning, "
                  f"{st['eval_done']} evaluation"
                  + (f"; left ~{st['seconds_left'] / 60:.0f} min ({', '.join(st['open_arms'])})"
                     if st["seconds_left"] else ""), flush=True)
            c = next(c for c in claims if c.key == st["claim"])
            if c.gate is not None and revision >= 4 and not args.quick:
                print(f"    gate: {gate_status(c, tune, tune_seeds[0], args)}", flush=True)
        print(f"reproduce_results: declared time of the runs not finished in {args.workdir}: {left / 60:.0f} min "
              f"(~{left / 60 / jobs:.0f} min at {jobs} at a time; an arm shared by claims counts in each)", flush=True)
        return 0
    gpu_arms = [a.key for a in arm_list if running.needs_gpu(first_point_args(a, args.quick))]
    if gpu_arms and running.cuda_devices() == 0:
        raise SystemExit(f"reproduce_results: arm(s) {gpu_arms} train on a GPU (trainer.accelerator in their "
                         "overrides) and no CUDA device is visible here; run them on a machine with one (--plan "
                         "and --export-runs work anywhere)")
    os.makedirs(out, exist_ok=True)
    os.makedirs(args.workdir, exist_ok=True)
    common = dict(jobs=jobs, threads=threads, quick=args.quick, workdir=args.workdir, fresh=args.fresh,
                  timeout=args.timeout)
    deadline = None if args.deadline is None else t_start + 60.0 * args.deadline
    # revision 4: a claim's gate runs first (its baseline must train before the rest of it is run)
    gated, gate_rows, undecided = run_gates([c for c in claims if c.gate is not None] if revision >= 4 and not args.quick
                                            else [], cf, tune, tune_seeds[0], args, common, deadline)
    if undecided:
        return 3
    if gated:
        out_keys = {res["claim"].key for res in gated}
        claims = [c for c in claims if c.key not in out_keys]
        need = {k for c in claims for k in c.run_arms()}
        need |= {k for grp in groups or () if need & set(grp) for k in grp}
        arm_list = [a for a in arm_list if a.key in need]
        tune = [r for r in tune if r.arm.key in need]
        eval_seeds = {k: s for k, s in eval_seeds.items() if k in need}
        reps = {k: v for k, v in reps.items() if k in need}
        n_eval = sum(len(s) for s in eval_seeds.values())
    tune_rows, eval_rows, chosen, tables = running.run_plan(
        arm_list, tune, eval_seeds, deadline=deadline, groups=groups, rounds=rounds, replicates=reps,
        execute_fn=functools.partial(running.execute, isolation=args.isolation), **common)
    tuned = {x["key"] for x in tune_rows}
    rows = tune_rows + eval_rows + [r for r in gate_rows if r["key"] not in tuned]
    n_rep = sum(len(ss) for _, ss in reps.values())
    if len(tune_rows) < len(tune) or len(eval_rows) < n_eval + n_rep or len(chosen) < len(arm_list):
        print(f"reproduce_results: stopped at the deadline with {max(0, len(tune) - len(tune_rows))} declared "
              f"tuning run(s), the widening rounds of {len(arm_list) - len(chosen)} arm(s) and "
              f"{n_eval + n_rep - len(eval_rows)} evaluation run(s) left; no report written. The finished runs are kept "
              f"in {args.workdir}: rerun this command to go on, or add --export-runs FILE to carry them elsewhere "
              f"(and --runs-from FILE there)", flush=True)
        return 3
    wall = time.perf_counter() - t_start
    meta = {
        "mode": ("quick smoke run: 1 seed, the first grid point, 1 epoch of 2 batches -- the numbers are meaningless"
                 if args.quick else "declared seeds and grids"),
        "command": "python benchmarks/reproduce_results.py " + " ".join(
            printed_arguments(argv if argv is not None else sys.argv[1:], dirty=bool(dirty))),
        "code": running._code_version(), "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "versions": _versions(rows),
        "cpus": cpus, "cpu": _cpu_name(), "jobs": jobs, "threads": threads, "ci": method, "confidence": confidence,
        "power": float(cf.statistics.get("power", 0.8)),
        "bootstrap_resamples": int(cf.statistics.get("bootstrap_resamples", 10000)),
        "tuning_seeds": tune_seeds, "seeds_of": seeds_of, "revision": revision,
        "dirty": dirty, "dirty_reason": "--quick" if args.quick and not args.allow_dirty else "--allow-dirty",
        "workdir": args.workdir,
        "items_search": [os.path.dirname(os.path.abspath(f)) for f in files],
    }
    summary = []
    for b in cf.benchmarks:
        bc = [c for c in claims if c.benchmark == b]
        if bc:
            summary += write_benchmark(b, bc, rows, out, cf, chosen, tables, meta)
        elif any(res["claim"].benchmark == b for res in gated):  # only its gate ran: the runs file alone
            write_csv([r for r in rows if r["benchmark"] == b], os.path.join(out, f"{b}_runs.csv"))
    summary += gated + [not_run_result(c) for c in not_run]
    write_summary(os.path.join(out, "summary.md"), summary, rows, n_tune=len(tune_rows), n_eval=len(eval_rows),
                  cf=cf, chosen=chosen, tables=tables, meta=meta, wall=wall)
    # a tuning run of a learning-rate sweep that diverged is a result (read at the sensitivity's cap), not a failure
    swept = {k for c in claims for k in c.swept_arms()}
    n_div = sum(r["phase"] == "tune" and r["arm"] in swept and diverged(r) for r in rows)
    n_fail = sum(not r["ok"] for r in rows) - n_div
    print(f"reproduce_results: wrote {out} in {wall / 60:.1f} min; {n_fail} failed run(s)"
          + (f"; {n_div} sweep run(s) diverged (read at the cap of their sensitivity check)" if n_div else ""), flush=True)
    return 1 if n_fail else 0
