"""Step 2 of the pipeline: running. Every run (:mod:`reproduce.runs`) is a process of its own running
``benchmarks/_reproduce_worker.py`` (which calls ``lightning_modules.cli.main``): forked from a
server that imported torch, Lightning and the CLI once (``--isolation fork``, the default;
:func:`_fork_context`), or a fresh interpreter (``--isolation process``); :func:`execute` makes one
run, or reads it from the workdir when it is finished there.

The queue (:func:`run_plan`) runs the tuning and then the evaluation of every arm with at most
``jobs`` processes at once: the longest declared run first, and an arm's evaluation as soon as its
group's tuning (with its widening rounds, :func:`reproduce.tuning.tune_group`) is done; a
``deadline`` stops it starting runs that would end after it. :func:`plan_status` is ``--plan``: per
claim, the runs, their declared time and how many are finished in the workdir.

Finished runs are kept in ``--workdir``, keyed by recipe content and exact arguments
(:func:`_run_key`) and by the ``code_hash`` (the Python files under :data:`CODE_DIRS` and the
recipe, :func:`_code_hash`), so an interrupted reproduction resumes and a changed loss never reuses
an old run. Provenance: :func:`_dirty_paths` lists the uncommitted changes under
:data:`PROVENANCE_DIRS` (the reproduction refuses to start with any unless ``--allow-dirty`` or
``--quick``), and every run records its code version (ending in ``-dirty`` on such a tree; outside a
git checkout the commit named by ``REPRODUCE_CODE_VERSION``) and the device it trained on.

A run whose arguments put it on a GPU (an arm's ``trainer.accelerator: gpu`` override,
:func:`needs_gpu`) always runs in a fresh interpreter (CUDA does not survive a fork), and the command
line refuses to start such runs where no CUDA device is visible (:func:`cuda_devices`).
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .claims import REPLICATE_PHASE, Arm, Claim, replicate_arm
from .common import HERE, ROOT
from .runs import Run, _overrides
from .tuning import GroupTuning, Score, _params_text, score_from_rows, tune_group

WORKER = os.path.join(HERE, "_reproduce_worker.py")
#: the code a run executes, hashed into its ``code_hash`` (with the arm's recipe)
CODE_DIRS = ("losses", "lightning_modules")
#: folders whose uncommitted changes make the reproduction refuse to start (``--allow-dirty``)
PROVENANCE_DIRS = ("losses", "lightning_modules", "configs", "benchmarks")
#: an evaluation run's per-item test records, in its workdir folder (``lightning_modules.records``)
TEST_ITEMS = "test_items.npz"


# ------------------------------------------------------------------------------------------
# provenance: the code a run is made with
# ------------------------------------------------------------------------------------------
def _dirty_paths() -> List[str]:
    """``git status --porcelain`` lines of uncommitted changes under :data:`PROVENANCE_DIRS` (empty:
    clean, or not a git checkout)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", *PROVENANCE_DIRS], cwd=ROOT,
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line for line in out.splitlines() if line.strip()]


#: names the commit of a copy of the tree that is not a git checkout (a GPU machine sent the working
#: tree only): ``REPRODUCE_CODE_VERSION=<commit>``; each run's ``code_hash`` still records the code itself
CODE_VERSION_ENV = "REPRODUCE_CODE_VERSION"


def _code_version() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = ""
    if not head:  # not a git checkout: the commit the copy was made from, where the caller names it
        return os.environ.get(CODE_VERSION_ENV, "").strip() or "unknown"
    return head + ("-dirty" if _dirty_paths() else "")


#: a run's trainer arguments that put it on a GPU (``--trainer.accelerator=...``)
GPU_ACCELERATORS = ("gpu", "cuda")


def needs_gpu(args: Sequence[str]) -> bool:
    """Whether a run's arguments put it on a GPU (the last ``--trainer.accelerator`` wins, as in the CLI)."""
    acc = None
    for a in args:
        if a.startswith("--trainer.accelerator="):
            acc = a.split("=", 1)[1].strip().lower()
    return acc in GPU_ACCELERATORS


def cuda_devices() -> int:
    """The CUDA devices a fresh interpreter sees (0 without one). Asked in a child process: the driver
    never initialises CUDA itself, so the processes it forks for CPU runs stay usable."""
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0


@functools.lru_cache(maxsize=1)
def _code_tree_hash() -> str:
    """SHA-256 over the path and content of every Python file under :data:`CODE_DIRS` (sorted): what a
    run executes besides its recipe, committed or not. Computed once per process."""
    h = hashlib.sha256()
    for d in CODE_DIRS:
        for base, _, files in sorted(os.walk(os.path.join(ROOT, d))):
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(base, f)
                    h.update(os.path.relpath(path, ROOT).replace(os.sep, "/").encode() + b"\0")
                    with open(path, "rb") as fh:
                        h.update(fh.read() + b"\0")
    return h.hexdigest()


def _code_hash(arm: Arm) -> str:
    """The run's ``code_hash``: 12 hex digits of SHA-256 over :func:`_code_tree_hash` and the arm's
    recipe. Part of a run's workdir folder, so a changed loss, model or DataModule never reuses a
    run finished with the old code (runs read from a runs file are the record and are read as
    recorded: :func:`seed_workdir`)."""
    return hashlib.sha256((_code_tree_hash() + "\0" + arm.recipe_text()).encode()).hexdigest()[:12]


def _recipe_sha(arm: Arm) -> str:
    """The short content hash of an arm's recipe file, as the runs files record it."""
    return hashlib.sha1(arm.recipe_text().encode()).hexdigest()[:12]


# ------------------------------------------------------------------------------------------
# the workdir: a finished run's folder and row
# ------------------------------------------------------------------------------------------
def _run_key(run: Run, args: Sequence[str]) -> str:
    """Recipe path and parsed content, the exact arguments and the phase: identical runs of two arms
    (the same recipe and setting) share one result."""
    blob = json.dumps([run.arm.recipe, run.arm.recipe_config(), list(args), run.phase], sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def run_dir_name(recipe: str, phase: str, seed: int, key: str, code_hash: str) -> str:
    """The name of a run's folder in the workdir: the recipe's stem, the phase, the seed, the run key
    (recipe and arguments) and the code hash."""
    stem = os.path.splitext(os.path.basename(recipe))[0]
    return f"{stem}__{phase}__s{seed}__{key}__{code_hash}"


def _run_dir(run: Run, args: Sequence[str], workdir: str) -> str:
    """The run's folder in ``workdir`` (:func:`run_dir_name`), so that a run finished with other code
    is a miss."""
    return os.path.join(workdir, run_dir_name(run.arm.recipe, run.phase, run.seed, _run_key(run, args),
                                              _code_hash(run.arm)))


def cached_row(run: Run, *, quick: bool, workdir: str) -> Optional[dict]:
    """The row of a finished (``ok``) run kept in ``workdir``, or ``None``."""
    args = run.args(quick)
    out = os.path.join(_run_dir(run, args, workdir), "result.json")
    try:
        with open(out) as fh:
            res = json.load(fh)
    except (OSError, ValueError):
        return None
    if not res.get("ok"):
        return None
    res["cached"] = True
    return _row(run, args, res)


# ------------------------------------------------------------------------------------------
# one run in a process of its own
# ------------------------------------------------------------------------------------------
#: set for every run: nothing is downloaded, no tokenizer thread pool beside torch's
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
#: what the fork server imports once, before any run: torch, Lightning and the project's CLI
FORK_PRELOAD = ["torch", "pytorch_lightning", "lightning_modules.cli", "_reproduce_worker"]
_FORK_LOCK = threading.Lock()
_FORK_CTX: List[Any] = []


def _fork_context():
    """The ``forkserver`` context whose server has imported :data:`FORK_PRELOAD`, or ``None`` where
    the platform has no fork server (Windows: runs then start as fresh interpreters).

    Each run is still a process of its own, forked from the server: a clean address space per run,
    as with a fresh interpreter, without paying torch's and Lightning's imports (~5-11 s of CPU on
    a 2-core machine) once per run. The server is started with the offline variables set and the
    project and ``benchmarks/`` on its ``sys.path``; it holds no threads and has run no torch
    operation when it forks (it only imported modules), so a run's thread pool starts fresh."""
    import multiprocessing

    with _FORK_LOCK:
        if not _FORK_CTX:
            if "forkserver" not in multiprocessing.get_all_start_methods():
                _FORK_CTX.append(None)
            else:
                for k, v in OFFLINE_ENV.items():  # read by the server's imports (huggingface_hub)
                    os.environ.setdefault(k, v)
                for path in (ROOT, HERE):
                    if path not in sys.path:
                        sys.path.insert(0, path)
                ctx = multiprocessing.get_context("forkserver")
                ctx.set_forkserver_preload(FORK_PRELOAD)
                _FORK_CTX.append(ctx)
        return _FORK_CTX[0]


def _run_forked(spec_path: str, out: str, log_path: str, env: Dict[str, str], timeout: float) -> None:
    import _reproduce_worker as worker

    proc = _fork_context().Process(target=worker.forked_main, args=(spec_path, out, log_path, env, ROOT),
                                   name=f"run:{os.path.basename(os.path.dirname(spec_path))}")
    proc.start()
    proc.join(timeout)
    if proc.is_alive():  # past --timeout: the result file is missing and the row says so
        proc.kill()
        proc.join()


def execute(run: Run, *, quick: bool, workdir: str, threads: int, fresh: bool, timeout: float,
            isolation: str = "fork") -> dict:
    """Run one recipe run (or read its finished result from ``workdir``) and return its row.

    ``isolation="fork"`` (default): a process forked from a server that imported torch, Lightning
    and the CLI once (:func:`_fork_context`); ``"process"``: a fresh interpreter
    (``benchmarks/_reproduce_worker.py``) per run. Both run the same worker code; a forked run's
    metrics equal a fresh interpreter's (tests/test_reproduce_results.py)."""
    if not fresh and (row := cached_row(run, quick=quick, workdir=workdir)) is not None:
        return row
    args = run.args(quick)
    run_dir = _run_dir(run, args, workdir)
    out = os.path.join(run_dir, "result.json")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir, exist_ok=True)
    spec = {"config": os.path.join(ROOT, run.arm.recipe), "root": os.path.join(run_dir, "logs"),
            "fit_args": args, "test_args": args, "fit": True, "test": run.phase != "tune",
            "recipe_sha": _recipe_sha(run.arm)}
    if run.phase != "tune":  # kept beside result.json (the logs folder goes once the run is done)
        spec["test_items"] = os.path.join(run_dir, TEST_ITEMS)
    spec_path = os.path.join(run_dir, "spec.json")
    with open(spec_path, "w") as fh:
        json.dump(spec, fh, indent=1)
    run_env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
               "OPENBLAS_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore", **OFFLINE_ENV}
    started = _dt.datetime.now().isoformat(timespec="seconds")
    code_at_start = _code_version()
    t0 = time.perf_counter()
    log_path = os.path.join(run_dir, "log.txt")
    if isolation == "fork" and not needs_gpu(args) and _fork_context() is not None:  # CUDA does not survive a fork
        _run_forked(spec_path, out, log_path, run_env, timeout)
    else:
        env = {**os.environ, **run_env}
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        with open(log_path, "w") as log:
            try:
                subprocess.run([sys.executable, WORKER, spec_path, out], cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT, timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
    wall = time.perf_counter() - t0
    if os.path.exists(out):
        with open(out) as fh:
            res = json.load(fh)
    else:
        res = {"ok": False, "error": f"no result after {wall:.0f} s (timeout {timeout:.0f} s or crash); see "
                                     f"{os.path.join(run_dir, 'log.txt')}"}
    res["process_seconds"] = wall
    res["recipe_sha"] = spec["recipe_sha"]
    res["code"], res["started"] = code_at_start, started
    res["code_hash"] = _code_hash(run.arm)
    if res.get("ok"):
        shutil.rmtree(os.path.join(run_dir, "logs"), ignore_errors=True)
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1, sort_keys=True)
    return _row(run, args, res)


def _row(run: Run, args: Sequence[str], res: dict) -> dict:
    row = {
        "benchmark": run.arm.benchmark, "arm": run.arm.key, "label": run.arm.label, "phase": run.phase,
        "recipe": run.arm.recipe, "recipe_sha": res.get("recipe_sha", ""), "code": res.get("code", ""),
        "started": res.get("started", ""), "seed": run.seed, "params": json.dumps(dict(run.params), sort_keys=True),
        "overrides": " ".join(_overrides(run.arm.overrides)), "epochs": int(res.get("epochs", 0)),
        "steps": int(res.get("steps", 0)), "ok": bool(res.get("ok")), "error": (res.get("error") or "")[:300],
        "fit_seconds": round(float(res.get("fit_seconds", 0.0)), 3),
        "test_seconds": round(float(res.get("test_seconds", 0.0)), 3),
        "run_seconds": round(float(res.get("wall_seconds", 0.0)), 3),
        "peak_rss_mb": round(float(res.get("peak_rss_mb", 0.0)), 1) if res.get("ok") else "",
        "threads": (res.get("versions") or {}).get("threads", ""),
        "data": json.dumps(res.get("data", {}), sort_keys=True), "cached": bool(res.get("cached", False)),
        "key": _run_key(run, args),
        "versions": json.dumps({k: v for k, v in (res.get("versions") or {}).items() if k not in ("sys_version", "threads")},
                               sort_keys=True),
        "_versions": res.get("versions", {}),
        "test_split": (res.get("data") or {}).get("test_split", ""), "code_hash": res.get("code_hash", ""),
        "device": res.get("device", ""),
        "curve": json.dumps(res["curve"], sort_keys=True, separators=(",", ":")) if res.get("curve") else "",
        "trace": json.dumps(res["trace"], sort_keys=True, separators=(",", ":")) if res.get("trace") else "",
    }
    for k, v in sorted((res.get("fit_metrics") or {}).items()):  # training-side columns (e.g. the classes
        if k.startswith("train/") and not k.startswith("train/loss"):  # a Partial FC step's softmax saw)
            row[k] = v
    for k, v in sorted((res.get("val_metrics") or {}).items()):
        row[k] = v
    for k, v in sorted((res.get("test_metrics") or {}).items()):
        row[k] = v
    return row


# ------------------------------------------------------------------------------------------
# the queue and --plan
# ------------------------------------------------------------------------------------------
def run_plan(arms: Sequence[Arm], tune: Sequence[Run], eval_seeds: Dict[str, Sequence[int]], *, jobs: int,
             threads: int, quick: bool, workdir: str, fresh: bool, timeout: float, log=print,
             execute_fn=None, deadline: Optional[float] = None, groups: Optional[Sequence[Sequence[str]]] = None,
             rounds: int = 0, replicates: Optional[Dict[str, Tuple[int, Sequence[int]]]] = None,
             clock=time.perf_counter) -> Tuple[List[dict], List[dict], Dict[str, Dict[str, Any]], Dict[str, List[dict]]]:
    """Run the tuning and then the evaluation of every arm as one queue of at most ``jobs`` processes.

    Arms widen in ``groups`` (lists of arm keys; default: each arm alone) for up to ``rounds`` rounds
    (:func:`tune_group`, the claims file's ``tuning.widen``): when a group's tuning runs are done, its
    widened points join the queue, or, after its last round, each arm's point is chosen and its
    evaluation runs join the queue: a slow group's tuning does not hold up the evaluation of the
    others, so no process slot stands idle while runs are left. The queue starts the run of the
    longest declared ``seconds`` first (tuning before evaluation among equals). Runs that are identical
    (the same recipe and arguments, e.g. one arm selected on two metrics or two arms that agree) run
    once: a copy waits for the first and then reads its cached result.

    ``deadline`` (a ``clock()`` time; ``None``: none) bounds the whole invocation: a run whose declared
    ``seconds`` would end after it is not started (a shorter run that still fits is started instead, so
    no slot holds a run that would be cut off), the runs in flight finish, and the runs never started
    are left for a later invocation on the same workdir (or ``--runs-from`` a file written by
    ``--export-runs``); a finished run already in the workdir is read whatever the deadline.

    ``replicates`` (``{arm: (budget, seeds)}``, revision 4): once an arm's point is chosen, its
    replicate runs (``budget`` times its epochs, phase ``replicate``, on ``seeds``) join the queue
    with its evaluation runs; their rows follow the evaluation rows.

    Returns ``(tuning rows, evaluation rows, chosen point per arm, tuning table per arm)`` (a table
    entry's ``round`` > 0 marks a widened point, ``reason`` says why); the rows are in plan order
    (``tune`` as given, then the widened runs as they were queued; evaluation by arm, then seed), not
    in completion order. With
    a deadline the runs not started have no row: the lists are shorter than the plan and an arm whose
    tuning did not finish has no chosen point.
    """
    run_fn = execute_fn or execute
    opts = dict(quick=quick, workdir=workdir, threads=threads, timeout=timeout)
    by_key = {a.key: a for a in arms}
    group_of: Dict[str, List[Arm]] = {}
    for g in (groups or [[a.key] for a in arms]):
        members = [by_key[k] for k in g if k in by_key]
        for a in members:
            group_of[a.key] = members
    for a in arms:
        group_of.setdefault(a.key, [a])
    tune_seeds = sorted({r.seed for r in tune})
    all_tune: List[Run] = list(tune)
    queued = {(r.arm.key, json.dumps(dict(r.params), sort_keys=True), r.seed) for r in tune}
    counts = {"total": len(tune) + sum(len(eval_seeds.get(a.key, ())) for a in arms)}
    tune_rows: Dict[int, dict] = {}
    eval_rows: Dict[Tuple[str, int], dict] = {}
    chosen: Dict[str, Dict[str, Any]] = {}
    tables: Dict[str, List[dict]] = {}
    pending: List[Run] = list(tune)
    t0 = clock()
    n_done = 0

    def advance(members: List[Arm]) -> None:
        if members[0].key in chosen:
            return
        st = tune_group(members, score_from_rows(list(tune_rows.values()), tune_seeds), rounds=rounds, quick=quick)
        for a, p in st.missing:
            for s in tune_seeds:
                k = (a.key, json.dumps(p, sort_keys=True), s)
                if k not in queued:
                    queued.add(k)
                    run = Run(a, s, "tune", tuple(p.items()))
                    all_tune.append(run)
                    pending.append(run)
                    counts["total"] += 1
                    if st.rounds:
                        log(f"reproduce_results: widening round {st.rounds} of {', '.join(m.key for m in members)}: "
                            f"tuning {a.key} at {_params_text(p)} (seed {s})", flush=True)
        if st.final:
            for a in members:
                chosen[a.key], tables[a.key] = st.chosen[a.key], st.tables[a.key]
                pending.extend(Run(a, s, "eval", tuple(chosen[a.key].items())) for s in sorted(eval_seeds.get(a.key, ())))
                if a.key in (replicates or {}):
                    budget, rseeds = replicates[a.key]
                    reps = [Run(replicate_arm(a, budget), s, REPLICATE_PHASE, tuple(chosen[a.key].items()))
                            for s in sorted(rseeds)]
                    pending.extend(reps)
                    counts["total"] += len(reps)

    def finish(r: Run, row: dict) -> None:
        nonlocal n_done
        n_done += 1
        status = "cached" if row["cached"] else ("ok" if row["ok"] else "FAILED " + row["error"][:200])
        log(f"[{n_done}/{counts['total']} {clock() - t0:7.0f}s] {r.phase} {r.arm.key} seed {r.seed} "
            f"{row['params']}: {status} ({row['run_seconds']:.0f} s)", flush=True)
        if r.phase == "tune":
            tune_rows[id(r)] = row
            advance(group_of[r.arm.key])
        else:
            eval_rows[(r.arm.key, r.seed, r.phase)] = row

    def fits(r: Run) -> bool:
        if deadline is None or clock() + r.arm.seconds <= deadline:
            return True
        return (not fresh) and cached_row(r, quick=quick, workdir=workdir) is not None

    for members in {id(g): g for g in group_of.values()}.values():
        if all(not any(r.arm.key == a.key for r in tune) for a in members):
            advance(members)
    in_flight: Dict[Any, Tuple[Run, str]] = {}  # future -> (run, key)
    busy: Dict[str, List[Run]] = {}  # key in flight -> identical runs waiting for it
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        while pending or in_flight:
            pending.sort(key=lambda r: (-r.arm.seconds, r.phase != "tune", r.arm.key, r.seed))
            while len(in_flight) < max(1, jobs):
                i = next((i for i, r in enumerate(pending) if fits(r)), None)
                if i is None:
                    break
                r = pending.pop(i)
                key = _run_key(r, r.args(quick))
                if key in busy:
                    busy[key].append(r)
                    continue
                busy[key] = []
                in_flight[pool.submit(run_fn, r, fresh=fresh, **opts)] = (r, key)
            if not in_flight:  # what is left does not fit before the deadline
                break
            done, _ = wait(list(in_flight), return_when=FIRST_COMPLETED)
            for fut in done:
                r, key = in_flight.pop(fut)
                row = fut.result()
                finish(r, row)
                for copy in busy.pop(key):
                    if row["ok"]:
                        finish(copy, run_fn(copy, fresh=False, **opts))  # the cached result
                    else:
                        pending.append(copy)  # the first failed: the copy is a retry
    if pending:
        log(f"reproduce_results: {len(pending)} run(s) not started: their declared time does not fit before the "
            f"deadline ({', '.join(sorted({r.arm.key for r in pending}))})", flush=True)
    evals = [eval_rows[(a.key, s, "eval")] for a in arms for s in sorted(eval_seeds.get(a.key, ()))
             if (a.key, s, "eval") in eval_rows]
    evals += [eval_rows[(a.key, s, REPLICATE_PHASE)] for a in arms if a.key in (replicates or {})
              for s in sorted(replicates[a.key][1]) if (a.key, s, REPLICATE_PHASE) in eval_rows]
    return [tune_rows[id(r)] for r in all_tune if id(r) in tune_rows], evals, chosen, tables


def workdir_score(tune_seeds: Sequence[int], *, quick: bool, workdir: str) -> Score:
    """A :data:`Score` over the tuning runs finished (``ok``) in ``workdir``."""
    def score(arm: Arm, p: Dict[str, Any]) -> Optional[Tuple[float, int]]:
        rows = [cached_row(Run(arm, s, "tune", tuple(p.items())), quick=quick, workdir=workdir) for s in tune_seeds]
        if any(r is None for r in rows):
            return None
        return score_from_rows(rows, tune_seeds)(arm, p)

    return score


def group_states(arms: Dict[str, Arm], groups: Optional[Sequence[Sequence[str]]], arm_keys: Sequence[str],
                 score: Score, *, rounds: int, quick: bool) -> Dict[str, GroupTuning]:
    """:func:`tune_group` of the group of every arm of ``arm_keys`` (default groups: each arm alone)."""
    out: Dict[str, GroupTuning] = {}
    for g in (groups or [[k] for k in arm_keys]):
        members = [arms[k] for k in g if k in arms]
        if any(a.key in arm_keys for a in members):
            st = tune_group(members, score, rounds=rounds, quick=quick)
            out.update({a.key: st for a in members})
    for k in arm_keys:
        if k not in out:
            out[k] = tune_group([arms[k]], score, rounds=rounds, quick=quick)
    return out


def plan_status(claims: Sequence[Claim], arms: Dict[str, Arm], tune_seeds: Sequence[int],
                seeds_of: Dict[str, Sequence[int]], *, quick: bool, workdir: str,
                groups: Optional[Sequence[Sequence[str]]] = None, rounds: int = 0) -> List[dict]:
    """Per claim: its tuning and evaluation runs, their declared seconds, and which of them are
    already finished in ``workdir``. An arm's evaluation runs count as finished only once all its
    group's tuning rounds are (the chosen point names them); until then their declared time is left.
    The tuning runs counted are those known so far: a widening round the finished runs will call for
    is not known before them."""
    keys = list(dict.fromkeys(k for c in claims for k in c.run_arms()))
    states = group_states(arms, groups, keys, workdir_score(tune_seeds, quick=quick, workdir=workdir),
                          rounds=rounds, quick=quick)
    out = []
    for c in claims:
        st = {"claim": c.key, "benchmark": c.benchmark, "arms": len(c.run_arms()), "tune": 0, "eval": 0,
              "tune_done": 0, "eval_done": 0, "seconds": 0.0, "seconds_left": 0.0, "open_arms": []}
        for k in c.run_arms():
            a = arms[k]
            g = states[k]
            n_tune = len(g.points[k]) * len(tune_seeds)
            n_missing = sum(1 for m, _ in g.missing if m.key == k) * len(tune_seeds)
            n_eval = len(seeds_of[c.key])
            st["tune"] += n_tune
            st["eval"] += n_eval
            st["seconds"] += a.seconds * (n_tune + n_eval)
            st["tune_done"] += n_tune - n_missing
            st["seconds_left"] += a.seconds * n_missing
            if g.final:
                point = g.chosen[k]
                done = sum(cached_row(Run(a, s, "eval", tuple(point.items())), quick=quick, workdir=workdir)
                           is not None for s in seeds_of[c.key])
            else:
                done = 0
            st["eval_done"] += done
            st["seconds_left"] += a.seconds * (n_eval - done)
            if done < n_eval:
                st["open_arms"].append(k + (f" (widening round {g.rounds})" if g.rounds else ""))
        out.append(st)
    return out
