"""Reproduce the papers' claims declared in ``benchmarks/claims.yaml`` with the project's recipes.

The claims file declares, before anything runs, every claim's arms (recipe, fixed overrides, step
budget), the hyperparameter grid each arm is tuned over, the selection metric (a validation
metric), the seeds and each check's claimed direction or equivalence margin. This script

1. **tunes** every arm: one run per grid point and tuning seed (``tuning.seeds``, disjoint from the
   evaluation seeds), ``fit`` only, validation at the end of the last epoch; the grid point with the
   best mean ``select`` metric is chosen (ties: the first declared). The test split is never read;
2. **evaluates** the chosen setting over the claim's seeds ``0 .. n-1``: ``fit`` (no validation
   loop), then ``test`` from the checkpoint fit saved. Per seed every arm gets the same split and
   training order (the DataModule's seed; the order is drawn from ``(seed, epoch)`` only), the same
   initial weights where the architectures agree (``--model.init_args.init_seed``), and the same
   step budget (``epochs``; the recipes anneal the learning rate with a cosine schedule per stage).
   The claims file's ``evaluation`` section (revision 3) fixes the test split for every seed
   (``test_seed``, passed to the DataModules of :data:`TEST_SEED_DATA`) and makes evaluation runs
   validate every epoch (``curves``: the run's learning curve, recorded in its ``curve`` column;
   nothing selects on it); every run records its test split's fingerprint (``test_split``);
3. **compares** paired: per check, the per-seed differences family - baseline, their mean with a 95%
   CI (paired t by default; ``--ci bootstrap`` for a percentile bootstrap), the minimum detectable
   effect at 80% power for that n, and the verdict *reproduced* / *contradicted* / *not resolved*
   (rules: ``benchmarks/stats.py``). Under protocol revision 3 (the claims file's
   ``statistics.revision``, or ``--revision``) the claim's primary check alone decides its verdict,
   secondary checks are Holm-adjusted within the claim, sanity checks are reported apart, an arm
   under the claim's competence floor makes it *invalid*, and "decidable at this n" replaces the
   MDE (``stats.evaluate_claim``; docs/benchmarks.md, "Protocol, revision 3"); a claim whose
   evaluation runs were tested on more than one test split is invalid (``stats.test_split_problem``)
   and one whose primary baseline was still improving at the end of its budget is marked
   *budget-limited* (``stats.budget_limited``);
4. **reports**: ``<out>/<benchmark>.md`` (per claim: the arms' mean +- sd, the chosen
   hyperparameters and the tuning table, the paired differences with CI, MDE and verdict),
   ``<out>/<benchmark>_forest.png`` (every paired check's CI against 0 and its margin),
   ``<out>/<benchmark>.png`` (per-claim panels), ``<out>/<benchmark>_curves.png`` (per claim, the
   arms' validation curves, where the runs recorded them), ``<out>/vision_lt_per_class.png`` (per-class test
   accuracy of the long-tailed arms), ``<out>/<benchmark>_runs.csv`` (every run, tuning and
   evaluation) and ``<out>/summary.md``.

Usage::

    python benchmarks/reproduce_results.py --jobs 2                        # every claim in the file
    python benchmarks/reproduce_results.py --claims wcdas,wcdas_2stage --out /tmp/res
    python benchmarks/reproduce_results.py --quick --out /tmp/res --claims opl   # CI smoke run
    python benchmarks/reproduce_results.py --benchmarks recommendation,retrieval --jobs 2

``--quick`` (1 seed, the first grid point, 1 epoch of 2 batches; numbers meaningless) refuses
to write into the repository's ``results/``. Each run is a process of its own running
``benchmarks/_reproduce_worker.py`` (which calls ``lightning_modules.cli.main``): forked from a server
that imported torch, Lightning and the CLI once (``--isolation fork``, the default), or a fresh
interpreter (``--isolation process``); ``--jobs`` runs
that many at once with ``max(1, cpus // jobs)`` torch threads each, from one queue: the longest
declared run first, and an arm's evaluation as soon as its group's tuning (with its automatic widening
rounds, ``tuning.widen``) is done (``run_plan``, ``tune_group``).
Finished runs are kept in ``--workdir``, keyed by recipe content and exact arguments and by the
``code_hash`` (the Python files under ``losses/`` and ``lightning_modules/`` and the recipe), so an
interrupted reproduction resumes and a changed loss never reuses an old run (``--fresh`` ignores
them all).

Provenance: the reproduction refuses to start with uncommitted changes under ``losses/``,
``lightning_modules/``, ``configs/`` or ``benchmarks/`` unless ``--allow-dirty`` is given; ``--quick``
(what CI runs, on whatever checkout it has) may run dirty. Either way the runs made record a code
version ending in ``-dirty`` and the reports name the uncommitted paths and those runs.
``--plan`` runs nothing: it prints, per claim, the runs, their declared time and how many of them
are already finished in ``--workdir`` (``plan_status``).

The committed ``<benchmark>_runs.csv`` files are the record of every run: ``--runs-from results/revision2``
copies their finished runs into ``--workdir`` before anything starts (``seed_workdir``), so the
reports regenerate from committed runs on any machine and only runs missing from them execute. They
are the record: a row is read as recorded whatever code made it (revision 2's rows carry no code
hash). Revision 2's runs were made without the evaluation section: ``--revision-2-runs`` makes the
current claims file name them (a test split per seed, no validation in evaluation runs).
``--export-runs FILE`` (runs nothing) writes the runs of the selected claims finished so far in
``--workdir`` to a runs file, so a reproduction longer than one machine's session can be committed
part-done and resumed elsewhere with ``--runs-from FILE``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import datetime as _dt
import hashlib
import importlib.util
import itertools
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "_reproduce_worker.py")
CLAIMS_FILE = os.path.join(HERE, "claims.yaml")


def _load_stats():
    name = "reproduce_stats"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "stats.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


stats = _load_stats()

#: evaluation runs of a one-epoch budget validate at this fraction of the epoch (their learning curve)
ONE_EPOCH_VAL_INTERVAL = 0.25
QUICK_ARGS = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
              "--trainer.limit_test_batches=2", "--trainer.num_sanity_val_steps=0"]
QUICK_GRID = 1  # grid points tuned in --quick (the selection itself is unit-tested)
DIRECTION_KINDS = ("higher", "lower")
MARGIN_KINDS = ("equivalent", "not_worse")
LEVEL_KINDS = ("below", "above")
DID_KIND = "did"  # revision 3: difference in differences (robustness claims)
SANITY_KIND = "sanity"  # revision 3: identities / levels a loss meets by construction
TRANSFORMS = ("abs",)  # per-seed transforms of a metric a check may declare
REVISIONS = (2, 3)
#: revision 3: the last component of a grid key that tunes the learning rate (every arm tunes one)
LR_KEYS = ("lr", "learning_rate")
INIT_SEED_MODELS = ("VisionClassifier", "VisionSegmenter", "Recommender", "IdentityEmbedder",
                    "LanguageModel")  # models taking init_seed
#: DataModules taking ``test_seed`` (one test split for every seed; the claims file's evaluation.test_seed)
TEST_SEED_DATA = ("DigitsDataModule", "MNISTDataModule", "DigitsSegmentationDataModule", "MNISTSegmentationDataModule",
                  "RetrievalDataModule", "MovieLensDataModule", "IdentitiesDataModule")
#: DataModules taking ``ood`` (out-of-distribution sets scored at test; the claims file's evaluation.ood)
OOD_DATA = ("MNISTDataModule",)
#: the code a run executes, hashed into its ``code_hash`` (with the arm's recipe)
CODE_DIRS = ("losses", "lightning_modules")
#: folders whose uncommitted changes make the reproduction refuse to start (``--allow-dirty``)
PROVENANCE_DIRS = ("losses", "lightning_modules", "configs", "benchmarks")


# ------------------------------------------------------------------------------------------
# the claims file
# ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Arm:
    key: str
    benchmark: str
    label: str
    recipe: str
    epochs: int
    select: str
    grid: Tuple[Tuple[str, Tuple[Any, ...]], ...] = ()
    overrides: Tuple[Tuple[str, Any], ...] = ()
    seconds: float = 60.0
    points: Tuple[Tuple[Tuple[str, Any], ...], ...] = ()  # an explicit list of grid points instead
    # the claims file's evaluation section (revision 3), the same for every arm of the file
    test_seed: Optional[int] = None  # one test split for every seed (DataModules of TEST_SEED_DATA)
    curves: bool = False  # evaluation runs validate every epoch: the run's learning curve
    ood: Optional[str] = None  # evaluation runs score these OOD sets at test (DataModules of OOD_DATA)
    widen: bool = True  # False: the grid is the condition under test; never widened (tuning.widen)

    def recipe_text(self) -> str:
        with open(os.path.join(ROOT, self.recipe)) as fh:
            return fh.read()

    def recipe_config(self) -> dict:
        import yaml

        return yaml.safe_load(self.recipe_text()) or {}

    def loss_has_seed(self) -> bool:
        loss = (((self.recipe_config().get("model") or {}).get("init_args") or {}).get("loss") or {})
        return "seed" in (loss.get("init_args") or {})

    def untuned_lr_points(self) -> List[Dict[str, Any]]:
        """The grid points that set no learning rate (no key whose last component is in
        :data:`LR_KEYS`); revision 3 requires none."""
        return [p for p in self.grid_points() if not any(k.split(".")[-1] in LR_KEYS for k in p)]

    def grid_points(self) -> List[Dict[str, Any]]:
        """The grid points in declared order: the explicit ``points``, or the product of the grid's
        lists (``[{}]`` without a grid)."""
        if self.points:
            return [dict(p) for p in self.points]
        if not self.grid:
            return [{}]
        keys = [k for k, _ in self.grid]
        return [dict(zip(keys, vals)) for vals in itertools.product(*[v for _, v in self.grid])]


@dataclasses.dataclass(frozen=True)
class Check:
    metric: str
    family: str
    kind: str
    baseline: Optional[str] = None
    margin: Optional[float] = None
    level: Optional[float] = None
    better: str = "higher"  # for not_worse and did: which direction of the metric is good
    # revision 3
    primary: bool = False  # the one check that decides the claim
    rule: Optional[str] = None  # kind: sanity -- the rule it is read with (higher ... above)
    transform: Optional[str] = None  # "abs": the per-seed metric value is replaced by its absolute value
    clean_metric: Optional[str] = None  # kind: did -- the clean column (default: metric)
    clean_family: Optional[str] = None  # kind: did -- the clean arms (default: family / baseline)
    clean_baseline: Optional[str] = None
    effect: Optional[float] = None  # the effect the paper reports (absolute units), for "decidable at this n"

    def rule_kind(self) -> str:
        """The kind the verdict is read with: a sanity check's ``rule``, else the ``kind``."""
        return (self.rule or "") if self.kind == SANITY_KIND else self.kind

    def metric_text(self) -> str:
        m = self.metric.split("/", 1)[-1]
        return f"abs({m})" if self.transform == "abs" else m  # no "|": it would split a markdown table cell

    def clean_arms(self) -> Tuple[str, ...]:
        if self.kind != DID_KIND:
            return ()
        return tuple(a for a in (self.clean_family or self.family, self.clean_baseline or self.baseline) if a)


@dataclasses.dataclass(frozen=True)
class Claim:
    key: str
    family: str
    benchmark: str
    data: str
    claim: str
    arms: Tuple[str, ...]
    metrics: Tuple[str, ...]
    seeds: int
    plot: str
    checks: Tuple[Check, ...]
    notes: str = ""
    varies: Tuple[str, ...] = ()  # data arguments the arms deliberately differ in (e.g. label_type)
    floors: Tuple[Tuple[str, Any], ...] = ()  # revision 3: (metric, a number or a floor column) per metric

    def run_arms(self) -> Tuple[str, ...]:
        """The claim's arms and the clean arms its difference-in-differences checks read (which may
        belong to another claim), in order, each once: every one of them is run for the claim."""
        out = list(self.arms)
        for ch in self.checks:
            out += [a for a in ch.clean_arms() if a not in out]
        return tuple(out)

    def primary(self) -> Optional[Check]:
        prim = [ch for ch in self.checks if ch.primary]
        return prim[0] if len(prim) == 1 else None


@dataclasses.dataclass(frozen=True)
class ClaimsFile:
    path: str
    statistics: Dict[str, Any]
    tuning_seeds: Tuple[int, ...]
    benchmarks: Dict[str, Dict[str, str]]
    arms: Dict[str, Arm]
    claims: Tuple[Claim, ...]
    revision: int = 2  # the protocol revision the file declares (statistics.revision)
    evaluation: Dict[str, Any] = dataclasses.field(default_factory=dict)  # test_seed, curves (revision 3)
    widen_rounds: int = 0  # tuning.widen.rounds: automatic widening rounds of a grid chosen at an end

    def widen_groups(self) -> List[List[str]]:
        """The groups of arms that widen together (:func:`tune_group`): the arms a claim compares
        (:meth:`Claim.run_arms`), joined across claims that share an arm, in file order; an arm
        declared ``widen: false`` is a group of its own."""
        parent = {k: k for k in self.arms}

        def root(k: str) -> str:
            while parent[k] != k:
                parent[k] = parent[parent[k]]
                k = parent[k]
            return k

        for c in self.claims:
            ks = [k for k in c.run_arms() if k in self.arms and self.arms[k].widen]
            for k in ks[1:]:
                parent[root(k)] = root(ks[0])
        groups: Dict[str, List[str]] = {}
        for k in self.arms:
            groups.setdefault(root(k) if self.arms[k].widen else k, []).append(k)
        return list(groups.values())


def load_claims(path: str = CLAIMS_FILE) -> ClaimsFile:
    """Parse the claims file (no validation beyond its shape; see :func:`validate_claims`)."""
    import yaml

    with open(path) as fh:
        raw = yaml.safe_load(fh) or {}
    arms = {}
    evaluation = dict(raw.get("evaluation") or {})
    for key, a in (raw.get("arms") or {}).items():
        grid = dict(a.get("grid") or {})
        points = tuple(tuple((p or {}).items()) for p in grid.pop("points", None) or ())
        arms[key] = Arm(key=key, benchmark=a["benchmark"], label=a.get("label", key), recipe=a["recipe"],
                        epochs=int(a["epochs"]), select=a.get("select", ""), points=points,
                        grid=tuple((k, tuple(v)) for k, v in grid.items()),
                        overrides=tuple((a.get("overrides") or {}).items()), seconds=float(a.get("seconds", 60)),
                        test_seed=evaluation.get("test_seed"), curves=bool(evaluation.get("curves", False)),
                        ood=evaluation.get("ood"),
                        widen=bool(a.get("widen", True)))
    claims = []
    for c in raw.get("claims") or []:
        checks = tuple(Check(metric=ch["metric"], family=ch["family"], kind=ch["kind"], baseline=ch.get("baseline"),
                             margin=ch.get("margin"), level=ch.get("level"), better=ch.get("better", "higher"),
                             primary=bool(ch.get("primary", False)), rule=ch.get("rule"),
                             transform=ch.get("transform"), clean_metric=ch.get("clean_metric"),
                             clean_family=ch.get("clean_family"), clean_baseline=ch.get("clean_baseline"),
                             effect=ch.get("effect"))
                       for ch in c.get("checks") or [])
        claims.append(Claim(key=c["key"], family=c["family"], benchmark=c["benchmark"], data=c.get("data", ""),
                            claim=c.get("claim", ""), arms=tuple(c.get("arms") or ()),
                            metrics=tuple(c.get("metrics") or ()), seeds=int(c.get("seeds", 0)),
                            plot=c.get("plot", ""), checks=checks, notes=c.get("notes", "") or "",
                            varies=tuple(c.get("varies") or ()),
                            floors=tuple((c.get("floors") or {}).items())))
    tuning = raw.get("tuning") or {}
    return ClaimsFile(path=path, statistics=dict(raw.get("statistics") or {}),
                      tuning_seeds=tuple(int(s) for s in tuning.get("seeds") or ()),
                      benchmarks=dict(raw.get("benchmarks") or {}), arms=arms, claims=tuple(claims),
                      revision=int((raw.get("statistics") or {}).get("revision", 2)), evaluation=evaluation,
                      widen_rounds=int((tuning.get("widen") or {}).get("rounds", 0)))


def without_evaluation(cf: ClaimsFile) -> ClaimsFile:
    """``cf`` with its evaluation section dropped: runs made as revision 2 made them (a test split per
    seed, no validation during evaluation runs), so that revision 2's committed runs are read under
    the current claims file (``--revision-2-runs``)."""
    arms = {k: dataclasses.replace(a, test_seed=None, curves=False, ood=None) for k, a in cf.arms.items()}
    return dataclasses.replace(cf, arms=arms, evaluation={})


def _data_config(arm: Arm, varies: Sequence[str] = ()) -> dict:
    """The recipe's data section with the arm's overrides, without ``seed`` and the ``varies`` keys."""
    cfg = arm.recipe_config().get("data") or {}
    init = dict(cfg.get("init_args") or {})
    for k, v in arm.overrides:
        if k.startswith("data.init_args."):
            init[k[len("data.init_args."):]] = v
    for k in ("seed", *varies):
        init.pop(k, None)
    return {"class_path": cfg.get("class_path"), "init_args": init}


def validate_claims(cf: ClaimsFile) -> List[str]:
    """Every problem of the claims file, as readable lines (empty: valid)."""
    problems: List[str] = []
    st = cf.statistics
    if cf.revision not in REVISIONS:
        problems.append(f"statistics.revision must be one of {REVISIONS} (got {cf.revision!r})")
    if st.get("ci", "t") not in stats.METHODS:
        problems.append(f"statistics.ci must be one of {stats.METHODS} (got {st.get('ci')!r})")
    if not cf.tuning_seeds:
        problems.append("tuning.seeds: declare at least one tuning seed")
    ev = cf.evaluation
    unknown = sorted(set(ev) - {"test_seed", "curves", "ood"})
    if unknown:
        problems.append(f"evaluation: unknown key(s) {unknown} (test_seed, curves, ood)")
    ood = ev.get("ood")
    if ood is not None and (not isinstance(ood, str) or not [n for n in ood.split(",") if n.strip()]):
        problems.append(f"evaluation.ood must be comma-separated OOD set names, e.g. 'digits8x8,uniform_noise' "
                        f"(got {ood!r})")
    ts = ev.get("test_seed")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int)):
        problems.append(f"evaluation.test_seed must be an integer (got {ts!r})")
    if not isinstance(ev.get("curves", False), bool):
        problems.append(f"evaluation.curves must be true or false (got {ev.get('curves')!r})")
    if cf.revision >= 3 and (ts is None or ev.get("curves") is not True):
        problems.append("evaluation: revision 3 declares test_seed (one test split for every seed) and curves: true "
                        "(evaluation runs record their validation curve)")
    keys = [c.key for c in cf.claims]
    for k in {k for k in keys if keys.count(k) > 1}:
        problems.append(f"claim key {k!r} is used twice")
    for a in cf.arms.values():
        where = f"arm {a.key!r}"
        if a.benchmark not in cf.benchmarks:
            problems.append(f"{where}: benchmark {a.benchmark!r} is not declared under benchmarks")
        if not os.path.isfile(os.path.join(ROOT, a.recipe)):
            problems.append(f"{where}: recipe {a.recipe} does not exist")
        if a.epochs < 1:
            problems.append(f"{where}: epochs must be >= 1")
        if a.points and a.grid:
            problems.append(f"{where}: give the grid either as lists (a product) or as points, not both")
        if len(a.grid_points()) < 2 or any(len(v) < 1 for _, v in a.grid):
            problems.append(f"{where}: declare a hyperparameter grid of at least 2 points (tuned on validation)")
        if not a.select.startswith("val/"):
            problems.append(f"{where}: select must be a validation metric (val/...), got {a.select!r}")
        if cf.revision >= 3 and (no_lr := a.untuned_lr_points()):
            problems.append(f"{where}: revision 3 tunes the learning rate of every arm, but "
                            + ("its grid tunes no learning rate" if len(no_lr) == len(a.grid_points()) else
                               f"{len(no_lr)} of its {len(a.grid_points())} grid points set none")
                            + f" (a grid key ending in {' or '.join(LR_KEYS)}; a knob is tuned as learning rate x knob)")
        for k in [k for p in a.grid_points() for k in p] + [k for k, _ in a.overrides]:
            if k.startswith("-") or k.split(".")[0] not in ("model", "data", "trainer"):
                problems.append(f"{where}: override key {k!r} must look like model.init_args...., data.... or "
                                "trainer.... (no leading dashes)")
    for c in cf.claims:
        where = f"claim {c.key!r}"
        if c.benchmark not in cf.benchmarks:
            problems.append(f"{where}: benchmark {c.benchmark!r} is not declared")
        missing = [k for k in c.arms if k not in cf.arms]
        if missing:
            problems.append(f"{where}: arms {missing} are not declared under arms")
            continue
        if len(c.arms) < 2:
            problems.append(f"{where}: needs a family arm and at least one baseline arm")
        if not c.checks:
            problems.append(f"{where}: declares no checks")
        arms = [cf.arms[k] for k in c.arms]
        if any(a.benchmark != c.benchmark for a in arms):
            problems.append(f"{where}: every arm must belong to benchmark {c.benchmark!r}")
        if len({a.epochs for a in arms}) > 1:
            problems.append(f"{where}: arms have different step budgets {[(a.key, a.epochs) for a in arms]}")
        datas = {json.dumps(_data_config(a, c.varies), sort_keys=True) for a in arms
                 if os.path.isfile(os.path.join(ROOT, a.recipe))}
        if len(datas) > 1:
            problems.append(f"{where}: arms train on different data (the recipes' data sections differ beyond "
                            f"the declared varies={list(c.varies)})")
        # every arm the claim runs (the clean arms of its did checks too) gets the same tuning budget
        budgets = {k: len(cf.arms[k].grid_points()) for k in c.run_arms() if k in cf.arms}
        if len(set(budgets.values())) > 1:
            problems.append(f"{where}: unequal tuning budgets (grid points per arm: {budgets})")
        need = 10 if all(a.seconds < 60 for a in arms) else 5
        if c.seeds < need:
            problems.append(f"{where}: {c.seeds} seeds; arms of about {max(a.seconds for a in arms):.0f} s need >= {need}")
        if c.plot not in c.metrics:
            problems.append(f"{where}: plot metric {c.plot!r} is not among its metrics")
        if cf.revision >= 3:
            n_primary = sum(ch.primary for ch in c.checks)
            if n_primary != 1:
                problems.append(f"{where}: exactly one check must be primary: true (the one that states the "
                                f"paper's main claim; got {n_primary})")
            problems += _validate_floors(c, where)
        for i, ch in enumerate(c.checks):
            w = f"{where}, check {i + 1} ({ch.metric})"
            if ch.family not in c.arms:
                problems.append(f"{w}: family arm {ch.family!r} is not an arm of the claim")
            if ch.metric not in c.metrics:
                problems.append(f"{w}: metric is not among the claim's reported metrics")
            if ch.effect is not None and (isinstance(ch.effect, bool) or not isinstance(ch.effect, (int, float))
                                          or not ch.effect > 0):
                problems.append(f"{w}: effect (the paper's reported effect) must be a positive number (got {ch.effect!r})")
            if ch.transform is not None and ch.transform not in TRANSFORMS:
                problems.append(f"{w}: transform {ch.transform!r} is not one of {TRANSFORMS}")
            if ch.kind == DID_KIND:
                problems += _validate_did(cf, c, ch, w)
                continue
            kind = ch.kind
            if ch.kind == SANITY_KIND:
                kind = ch.rule or ""
                if kind not in stats.SANITY_RULES:
                    problems.append(f"{w}: a sanity check needs a rule, one of {stats.SANITY_RULES} (got {ch.rule!r})")
                    continue
            if kind in DIRECTION_KINDS + MARGIN_KINDS:
                if ch.baseline not in c.arms or ch.baseline == ch.family:
                    problems.append(f"{w}: baseline {ch.baseline!r} must be another arm of the claim")
            if kind in DIRECTION_KINDS:
                if ch.margin is not None:
                    problems.append(f"{w}: a direction claim takes no margin")
            elif kind in MARGIN_KINDS:
                if not isinstance(ch.margin, (int, float)) or not ch.margin > 0:
                    problems.append(f"{w}: a {kind} claim needs a positive margin declared up front")
                if ch.better not in ("higher", "lower"):
                    problems.append(f"{w}: better must be 'higher' or 'lower'")
            elif kind in LEVEL_KINDS:
                if not isinstance(ch.level, (int, float)):
                    problems.append(f"{w}: a {kind} claim needs a level")
            else:
                problems.append(f"{w}: kind {ch.kind!r} is not one of "
                                f"{DIRECTION_KINDS + MARGIN_KINDS + LEVEL_KINDS + (DID_KIND, SANITY_KIND)}")
    return problems


def _validate_did(cf: ClaimsFile, c: Claim, ch: Check, w: str) -> List[str]:
    """A difference-in-differences check: stressed arms of the claim, clean arms declared anywhere in
    the file (same benchmark and step budget), and something that differs between the two sides."""
    out = []
    if ch.baseline not in c.arms or ch.baseline == ch.family:
        out.append(f"{w}: baseline {ch.baseline!r} must be another arm of the claim")
    clean_f, clean_b = ch.clean_family or ch.family, ch.clean_baseline or ch.baseline
    for a in (clean_f, clean_b):
        if a not in cf.arms:
            out.append(f"{w}: clean arm {a!r} is not declared under arms")
        elif cf.arms[a].benchmark != c.benchmark or (ch.family in cf.arms and cf.arms[a].epochs != cf.arms[ch.family].epochs):
            out.append(f"{w}: clean arm {a!r} must belong to benchmark {c.benchmark!r} with the same step budget")
    if clean_f == clean_b:
        out.append(f"{w}: the clean family and baseline must be two arms")
    clean_metric = ch.clean_metric or ch.metric
    if clean_metric not in c.metrics:
        out.append(f"{w}: clean metric {clean_metric!r} is not among the claim's reported metrics")
    if clean_metric == ch.metric and (clean_f, clean_b) == (ch.family, ch.baseline):
        out.append(f"{w}: a did check needs a clean side that differs from the stressed one (clean_metric, or "
                   "clean_family / clean_baseline)")
    if ch.margin is not None:
        out.append(f"{w}: a did check takes no margin (its claimed direction is given by better)")
    if ch.better not in ("higher", "lower"):
        out.append(f"{w}: better must be 'higher' or 'lower'")
    return out


def _validate_floors(c: Claim, where: str) -> List[str]:
    """Revision 3: every claim declares a competence floor per metric -- a number, or a floor column
    (``test/...``) that the same runs compute on the same split."""
    out = []
    if not c.floors:
        out.append(f"{where}: declare floors (a competence floor per metric that every arm must beat)")
    for metric, floor in c.floors:
        if metric not in c.metrics:
            out.append(f"{where}: floor metric {metric!r} is not among the claim's reported metrics")
        if isinstance(floor, bool) or not (isinstance(floor, (int, float)) or
                                           (isinstance(floor, str) and floor.startswith("test/"))):
            out.append(f"{where}: the floor of {metric!r} must be a number or a test/ column (got {floor!r})")
    return out


# ------------------------------------------------------------------------------------------
# runs
# ------------------------------------------------------------------------------------------
def cli_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def _overrides(items) -> List[str]:
    return [f"--{k}={cli_value(v)}" for k, v in items]


@dataclasses.dataclass(frozen=True)
class Run:
    arm: Arm
    seed: int
    phase: str  # "tune" | "eval"
    params: Tuple[Tuple[str, Any], ...]  # the grid point

    def args(self, quick: bool) -> List[str]:
        return run_args(self.arm, self.seed, dict(self.params), phase=self.phase, quick=quick)


def run_args(arm: Arm, seed: int, params: Dict[str, Any], *, phase: str, quick: bool) -> List[str]:
    """CLI overrides of one run (the same for ``fit`` and ``test``)."""
    cfg = arm.recipe_config()
    model_cls = ((cfg.get("model") or {}).get("class_path") or "")
    data_cls = ((cfg.get("data") or {}).get("class_path") or "")
    args = [f"--seed_everything={seed}", f"--data.init_args.seed={seed}"]
    if arm.test_seed is not None and data_cls.endswith(TEST_SEED_DATA):
        args.append(f"--data.init_args.test_seed={arm.test_seed}")  # one test split for every seed
    if (arm.ood and phase == "eval" and data_cls.endswith(OOD_DATA)
            and "ood" not in ((cfg.get("data") or {}).get("init_args") or {})
            and not any(k == "data.init_args.ood" for k, _ in arm.overrides)):
        # scored at test only: tuning runs (validation alone) keep their arguments
        args.append(f"--data.init_args.ood={arm.ood}")
    if model_cls.endswith(INIT_SEED_MODELS):
        args.append(f"--model.init_args.init_seed={seed}")  # the same initial weights for every loss
    if arm.loss_has_seed():
        args.append(f"--model.init_args.loss.init_args.seed={seed}")
    args += _overrides(arm.overrides)
    args += _overrides(params.items())
    if quick:
        args += QUICK_ARGS
        if phase == "tune" or arm.curves:
            args.append("--trainer.check_val_every_n_epoch=1")
        else:
            args.append("--trainer.limit_val_batches=0")
        return args
    args += [f"--trainer.max_epochs={arm.epochs}", "--trainer.num_sanity_val_steps=0"]
    if phase == "tune":  # one validation pass, at the end of training
        args += [f"--trainer.check_val_every_n_epoch={arm.epochs}"]
    elif arm.curves:  # a validation pass per epoch: the learning curve (nothing selects on it)
        args += ["--trainer.check_val_every_n_epoch=1"]
        if arm.epochs == 1:  # a one-epoch budget: a pass at every quarter of it, so the curve has 4 points
            args += [f"--trainer.val_check_interval={ONE_EPOCH_VAL_INTERVAL}"]
    else:  # the checkpoint is the end of the last epoch; nothing reads validation here
        args += ["--trainer.limit_val_batches=0"]
    return args


def _dirty_paths() -> List[str]:
    """``git status --porcelain`` lines of uncommitted changes under :data:`PROVENANCE_DIRS` (empty:
    clean, or not a git checkout)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", *PROVENANCE_DIRS], cwd=ROOT,
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line for line in out.splitlines() if line.strip()]


def _code_version() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=30).stdout.strip()
        return (head or "unknown") + ("-dirty" if _dirty_paths() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


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


def _points(arm: Arm, quick: bool) -> List[Dict[str, Any]]:
    """The grid points an arm is tuned over (the first ``QUICK_GRID`` in ``--quick``)."""
    return arm.grid_points()[:QUICK_GRID] if quick else arm.grid_points()


def _run_key(run: Run, args: Sequence[str]) -> str:
    """Recipe path and parsed content, the exact arguments and the phase: identical runs of two arms
    (the same recipe and setting) share one result."""
    blob = json.dumps([run.arm.recipe, run.arm.recipe_config(), list(args), run.phase], sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _run_dir(run: Run, args: Sequence[str], workdir: str) -> str:
    """The run's folder in ``workdir``: its key (recipe and arguments) and the code hash, so that a run
    finished with other code is a miss."""
    stem = os.path.splitext(os.path.basename(run.arm.recipe))[0]
    return os.path.join(workdir, f"{stem}__{run.phase}__s{run.seed}__{_run_key(run, args)}__{_code_hash(run.arm)}")


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
            "fit_args": args, "test_args": args, "fit": True, "test": run.phase == "eval",
            "recipe_sha": _recipe_sha(run.arm)}
    spec_path = os.path.join(run_dir, "spec.json")
    with open(spec_path, "w") as fh:
        json.dump(spec, fh, indent=1)
    run_env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
               "OPENBLAS_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore", **OFFLINE_ENV}
    started = _dt.datetime.now().isoformat(timespec="seconds")
    code_at_start = _code_version()
    t0 = time.perf_counter()
    log_path = os.path.join(run_dir, "log.txt")
    if isolation == "fork" and _fork_context() is not None:
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
        "curve": json.dumps(res["curve"], sort_keys=True, separators=(",", ":")) if res.get("curve") else "",
    }
    for k, v in sorted((res.get("fit_metrics") or {}).items()):  # training-side columns (e.g. the classes
        if k.startswith("train/") and not k.startswith("train/loss"):  # a Partial FC step's softmax saw)
            row[k] = v
    for k, v in sorted((res.get("val_metrics") or {}).items()):
        row[k] = v
    for k, v in sorted((res.get("test_metrics") or {}).items()):
        row[k] = v
    return row


def run_plan(arms: Sequence[Arm], tune: Sequence[Run], eval_seeds: Dict[str, Sequence[int]], *, jobs: int,
             threads: int, quick: bool, workdir: str, fresh: bool, timeout: float, log=print,
             execute_fn=None, deadline: Optional[float] = None, groups: Optional[Sequence[Sequence[str]]] = None,
             rounds: int = 0,
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
            eval_rows[(r.arm.key, r.seed)] = row

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
    evals = [eval_rows[(a.key, s)] for a in arms for s in sorted(eval_seeds.get(a.key, ())) if (a.key, s) in eval_rows]
    return [tune_rows[id(r)] for r in all_tune if id(r) in tune_rows], evals, chosen, tables


# ------------------------------------------------------------------------------------------
# runs files: regenerate reports from committed runs, carry unfinished work across machines
# ------------------------------------------------------------------------------------------
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
                   quick: bool, extra: Optional[Dict[str, Sequence[Dict[str, Any]]]] = None) -> List[Run]:
    """Every run the plan can need: the tuning runs, and each arm's evaluation runs at every grid
    point (which point is evaluated is known only once tuning is done); ``extra``: per arm, points
    beyond the declared grid (widened points, known from runs files or the workdir)."""
    runs = tuning_runs(arms, tune_seeds, quick)
    for a in arms:
        more = [p for p in (extra or {}).get(a.key, ()) if p not in _points(a, quick)]
        runs += [Run(a, s, "tune", tuple(p.items())) for p in more for s in tune_seeds]
        runs += [Run(a, s, "eval", tuple(p.items())) for p in _points(a, quick) + more
                 for s in sorted(eval_seeds.get(a.key, ()))]
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
            "data": json.loads(row.get("data") or "{}"), "versions": versions, "fit_metrics": metrics("train/"),
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


# ------------------------------------------------------------------------------------------
# tuning and evaluation plan
# ------------------------------------------------------------------------------------------
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


def plan_status(claims: Sequence["Claim"], arms: Dict[str, Arm], tune_seeds: Sequence[int],
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
    table, best, best_v = [], points[0], -math.inf
    for p in points:
        key = json.dumps(p, sort_keys=True)
        vals = [float(r[arm.select]) for r in rows if r["arm"] == arm.key and r["phase"] == "tune"
                and r["params"] == key and r["ok"] and r.get(arm.select) not in ("", None)
                and math.isfinite(float(r[arm.select]))]
        v = sum(vals) / len(vals) if vals else float("nan")
        table.append({"params": p, "value": v, "n": len(vals)})
        if vals and v > best_v:
            best, best_v = p, v
    return best, table


# ------------------------------------------------------------------------------------------
# automatic grid widening (the claims file's tuning.widen rule)
# ------------------------------------------------------------------------------------------
Score = Callable[[Arm, Dict[str, Any]], Optional[Tuple[float, int]]]


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def numeric_lists(arm: Arm) -> List[str]:
    """The grid keys the widening rule applies to: declared lists of three or more numbers (with two
    values every choice is an end); in an explicit ``points`` grid, a key that every point sets to a
    number, with three or more distinct values (e.g. the learning rate of a list written out as
    learning rates x settings that have no value of their own to tune)."""
    if arm.points:
        pts = arm.grid_points()
        keys = [k for k in pts[0] if all(_is_num(p.get(k)) for p in pts)]
        return [k for k in keys if len({p[k] for p in pts}) >= 3]
    return [k for k, vals in arm.grid if len(vals) >= 3 and all(_is_num(v) for v in vals)]


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
    point of highest mean (ties: the first tried); if any widenable arm chose an end of a list
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
                best, best_v, table = points[a.key][0], -math.inf, []
                for p, (rnd, why) in zip(points[a.key], origin[a.key]):
                    v, n = score(a, p)
                    table.append({"params": p, "value": v, "n": n, "round": rnd, "reason": why})
                    if n and math.isfinite(v) and v > best_v:
                        best, best_v = p, v
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
                        nb[side] = r[0] if r and r[1] and math.isfinite(r[0]) else -math.inf
                side = "low" if nb.get("low", -math.inf) > nb.get("high", -math.inf) else "high"
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


def plan_groups(cf: "ClaimsFile", arm_keys: Sequence[str]) -> List[List[str]]:
    """The widening groups (:meth:`ClaimsFile.widen_groups`) that hold any of ``arm_keys``: their arms
    are all tuned, so that each of them is widened as the whole group is."""
    return [g for g in cf.widen_groups() if any(k in arm_keys for k in g)]


# ------------------------------------------------------------------------------------------
# statistics over rows
# ------------------------------------------------------------------------------------------
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


def check_sample(ch: Check, rows: Sequence[dict], seeds: Sequence[int]) -> Dict[int, float]:
    """The per-seed sample a check is read from: the family's values (level rules), the differences
    in differences (``did``) or the paired differences family - baseline."""
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


def grid_edges(arm: Arm, point: Dict[str, Any], tried: Sequence[Dict[str, Any]] = ()) -> List[str]:
    """The tuned values of ``point`` that sit at an end of their grid list, e.g. ``["lr=0.01
    (highest of 3)"]``: lists of three or more numbers only (with two, every choice is an end; an
    explicit ``points`` grid: only a key every point sets to a number, :func:`numeric_lists`);
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


def check_text(ch: Check, arms: Dict[str, Arm]) -> str:
    if ch.kind == SANITY_KIND:
        return "sanity: " + check_text(dataclasses.replace(ch, kind=ch.rule_kind()), arms)
    m = ch.metric_text()
    fam = arms[ch.family].label
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
    if ch.kind == "equivalent":
        return f"{m}: {fam} = {base} within ±{ch.margin:g}"
    worse = "below" if ch.better == "higher" else "above"
    return f"{m}: {fam} not worse than {base} (at most {ch.margin:g} {worse})"


# ------------------------------------------------------------------------------------------
# reports
# ------------------------------------------------------------------------------------------
CSV_FIXED = ["benchmark", "arm", "label", "phase", "recipe", "recipe_sha", "code", "started", "seed", "params",
             "overrides", "epochs", "steps", "ok", "error", "fit_seconds", "test_seconds", "run_seconds",
             "peak_rss_mb", "threads", "cached", "data", "key", "versions", "test_split", "code_hash", "curve"]


def write_csv(rows: Sequence[dict], path: str) -> None:
    metrics = sorted({k for r in rows for k in r if k.startswith(("val/", "test/", "train/"))})
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIXED + metrics, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in CSV_FIXED + metrics})


def read_csv(path: str) -> List[dict]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        r["ok"] = r["ok"] == "True"
        r["seed"] = int(r["seed"])
    return rows


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


def _mean_sd(vals: Sequence[float]) -> Tuple[float, float]:
    m, s, _ = stats.mean_sd(vals)
    return m, s


def claim_results(c: Claim, rows: Sequence[dict], *, seeds: Sequence[int], method: str, confidence: float,
                  revision: int = 2, n_boot: int = 10000, arms: Optional[Dict[str, Arm]] = None) -> dict:
    """The verdicts of one claim. Revision 2: every check at the nominal confidence, the claim
    reproduced when every check is (:func:`stats.claim_verdict`). Revision 3: the primary check
    decides, secondary checks are Holm-adjusted within the claim, sanity checks are reported apart
    and an arm under its competence floor makes the claim invalid (:func:`stats.evaluate_claim`);
    the result also carries the claim's test splits (``test_split``: :func:`stats.test_split_problem`)
    and whether its primary baseline was budget-limited (``budget``: :func:`claim_budget`; ``arms``
    lets a curve fall back to the baseline's ``select`` metric)."""
    if revision < 3:
        checks = []
        for ch in c.checks:
            v, ci = evaluate_check(ch, rows, seeds, method=method, confidence=confidence)
            checks.append({"check": ch, "verdict": v, "ci": ci})
        return {"claim": c, "checks": checks, "verdict": stats.claim_verdict([x["verdict"] for x in checks])}
    inputs = [stats.CheckInput(name=f"{i}", kind=ch.kind, values=tuple(check_sample(ch, rows, seeds).values()),
                               primary=ch.primary, rule=ch.rule, better=ch.better, margin=ch.margin, level=ch.level,
                               effect=ch.effect) for i, ch in enumerate(c.checks)]
    fps = test_splits(c, rows, seeds)
    res = stats.evaluate_claim(inputs, invalid_arms=competence(c, rows, seeds), method=method, confidence=confidence,
                               n_boot=n_boot, test_splits=fps)
    checks = [{"check": ch, "verdict": r.verdict, "ci": r.reported_ci, "result": r} for ch, r in zip(c.checks, res.checks)]
    out = {"claim": c, "checks": checks, "verdict": res.verdict_text(), "rev3": res, "seeds": list(seeds)}
    out["test_split"] = {"fingerprints": fps, "problem": stats.test_split_problem(fps)}
    prim = next((x for x in checks if x["result"].role == "primary"), None)
    out["budget"] = claim_budget(c, prim, rows, seeds, arms) if prim is not None else None
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
    ch, r = prim["check"], prim["result"]
    if not ch.baseline:
        return None
    metric, better = curve_metric(ch, (arms or {}).get(ch.baseline), rows)
    curves = [v for row in rows if row["arm"] == ch.baseline and row["phase"] == "eval" and row["ok"]
              and int(row["seed"]) in seeds and (v := curve_of(row, metric))]
    half = (r.ci.high - r.ci.low) / 2.0 if math.isfinite(r.ci.low) else float("nan")
    margin = ch.margin if ch.rule_kind() in MARGIN_KINDS else None
    return {"arm": ch.baseline, "metric": metric, "curves": len(curves),
            "epochs": (arms or {})[ch.baseline].epochs if ch.baseline in (arms or {}) else None,
            "rule": stats.budget_limited(curves, better=better, margin=margin, half_width=half)}


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
        lines += ["**Failed runs** (excluded from the statistics):", ""]
        lines += [f"- {r['phase']} {r['arm']} seed {r['seed']} {r['params']}: {r['error']}" for r in failed]
        lines.append("")
    for res in results:
        c = res["claim"]
        seeds = meta["seeds_of"][c.key]
        lines += [f"## {c.family}: {c.claim} (`{c.key}`)", "", f"Data: {c.data}. Seeds: {len(seeds)} "
                  f"({seeds[0]}..{seeds[-1]}).", ""]
        head = ["arm", "recipe", "chosen (val)", "steps", "n", *[m.split("/", 1)[-1] for m in c.metrics], "run s"]
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
            lines += [f"Grids widened automatically (the claims file's `tuning.widen` rule, declared before the runs): "
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
    return out + ([""] if out else [])


def _margin_text(ch: Check, rows: Sequence[dict], seeds: Sequence[int]) -> str:
    """A margin beside the baseline's own error: its seed sd and, for a higher-is-better metric in
    [0, 1], its error 1 - mean (so a reader sees how large the margin is)."""
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
    if ch.baseline:
        base = fmt(*_mean_sd(list(seed_values(rows, ch.baseline, ch.metric, seeds, ch.transform).values())))
        diff = f"{r.ci.mean:+.4f}" if math.isfinite(r.ci.mean) else "n/a"
    else:
        base, diff = f"level {ch.level:g}", "-"
    if r.role == "secondary":
        role, p = f"secondary (Holm rank {r.rank})", f"{r.p:.4g} / {r.p_adjusted:.4g}"
    else:
        role, p = r.role, f"{r.p:.4g}"
    p = p if math.isfinite(r.p) else "n/a"
    return (f"| {check_text(ch, arms)} | {role} | {ci.n} | {fam} | {base} | {_margin_text(ch, rows, seeds)} | {diff} | "
            f"{_ci_cell(ci, r.role == 'secondary')} | {p} | {_decidable_cell(r)} | {_verdict_cell(r)} |")


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
    n_sanity = sum(x["result"].role == "sanity" for x in res["checks"])
    if n_sanity and not r3.sanity:
        lines += [f"{n_sanity} sanity check(s) of this claim: see *Sanity checks* below (never counted).", ""]
    lines += _rev3_run_lines(res, arms)
    if r3.sanity:
        lines += [f"**Sanity claim: {res['verdict']}** (never counted as a reproduction).", ""]
    else:
        why = ([", made invalid by the competence gate"] if r3.invalid_arms else []) + \
              ([", made invalid because its runs were tested on more than one test split"] if r3.split_problem else [])
        lines += [f"**Verdict: {res['verdict']}** (the primary check's" + "".join(why) + ").", ""]
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


def _rev3_run_lines(res: dict, arms: Dict[str, Arm]) -> List[str]:
    if "test_split" not in res:
        return []
    return [test_split_text(res), "", budget_text(res, arms), ""]


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


# ------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------
def summary_rev3(results: Sequence[dict], arms: Dict[str, Arm], meta: dict) -> List[str]:
    """Revision 3 summary: claims counted by their primary verdict (invalid claims apart), then the
    sanity claims and checks, which never count."""
    claims = [r for r in results if not r["rev3"].sanity]
    sanity = [(r, x) for r in results for x in r["checks"] if x["result"].role == "sanity" or r["rev3"].sanity]
    counts = {}
    for r in claims:
        key = stats.INVALID if r["rev3"].verdict == stats.INVALID else r["verdict"]
        counts[key] = counts.get(key, 0) + 1
    order = [stats.REPRODUCED, stats.CONTRADICTED, stats.NOT_RESOLVED, stats.INVALID]
    lines = [f"Protocol revision 3: each claim's verdict is its primary check's; {len(claims)} claims: "
             + ", ".join(f"{counts.get(k, 0)} {k}" for k in order)
             + f". {len(sanity)} sanity check(s) are listed apart and never counted.", "",
             "| family | data | claim | primary check: mean difference [CI], decidable at this n | verdict | "
             "secondary checks (Holm) | details |", "|---|---|---|---|---|---|---|"]
    for res in claims:
        c = res["claim"]
        x = next(x for x in res["checks"] if x["result"].role == "primary")
        r = x["result"]
        ci = r.ci
        first = f"{check_text(x['check'], arms)}: " + (
            f"{ci.mean:+.4f} [{ci.low:+.4f}, {ci.high:+.4f}]; decidable: "
            f"{ {True: 'yes', False: 'no', None: 'n/a'}[r.decidable]}" if math.isfinite(ci.low) else f"n = {ci.n}, no CI")
        sec = [y["result"] for y in res["checks"] if y["result"].role == "secondary"]
        sec_text = ", ".join(f"{sum(y.verdict == k for y in sec)} {k}" for k in order[:3] if any(y.verdict == k for y in sec))
        flags = [f"{check_text(y['check'], arms)}: {y['result'].flag}" for y in res["checks"]
                 if y["result"].flag and y["result"].role != "sanity"]
        if (res.get("test_split") or {}).get("problem"):
            flags.append(f"test split not fixed ({res['test_split']['problem']})")
        if res.get("budget") and res["budget"]["rule"].limited:
            flags.append(f"budget-limited ({arms[res['budget']['arm']].label} still improving)")
        verdict = _verdict_cell(r) if res["rev3"].verdict != stats.INVALID else res["verdict"]
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


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    cpus = os.cpu_count() or 1
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
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
    if not (args.plan or args.export_runs):  # both run nothing and write no report
        dirty = _dirty_paths()
        if dirty and not (args.allow_dirty or args.quick):
            raise SystemExit("reproduce_results: uncommitted changes under " + ", ".join(f"{d}/" for d in PROVENANCE_DIRS)
                             + " -- a run must be traceable to a commit. Commit them, or pass --allow-dirty (the runs "
                             "are then marked and the reports name them):\n  " + "\n  ".join(dirty[:20])
                             + ("\n  ..." if len(dirty) > 20 else ""))
    out = os.path.abspath(args.out)
    if args.quick and os.path.commonpath([out, os.path.join(ROOT, "results")]) == os.path.join(ROOT, "results"):
        raise SystemExit("reproduce_results: --quick writes meaningless numbers; pass --out outside results/")
    claims = select_claims(cf, args.claims, args.benchmarks)
    method = args.ci or cf.statistics.get("ci", "t")
    revision = args.revision or cf.revision
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
    if args.runs_from and args.fresh:
        raise SystemExit("reproduce_results: --fresh ignores finished runs; it cannot be combined with --runs-from")
    eval_seeds = {k: sorted(ss) for k, ss in arm_seeds.items()}
    if args.runs_from:
        files = runs_files(args.runs_from)
        os.makedirs(args.workdir, exist_ok=True)
        written, had = seed_workdir(candidate_runs(arm_list, tune_seeds, eval_seeds, args.quick,
                                                   extra=file_points(files, arm_list)), files,
                                    workdir=args.workdir, quick=args.quick)
        print(f"reproduce_results: {written} finished run(s) read from {len(files)} runs file(s) into the workdir "
              f"({had} already there)", flush=True)
    if args.export_runs:
        states = group_states(cf.arms, groups, [a.key for a in arm_list],
                              workdir_score(tune_seeds, quick=args.quick, workdir=args.workdir),
                              rounds=rounds, quick=args.quick)
        extra = {k: st.points[k] for k, st in states.items()}
        rows = finished_rows(candidate_runs(arm_list, tune_seeds, eval_seeds, args.quick, extra=extra),
                             workdir=args.workdir, quick=args.quick)
        os.makedirs(os.path.dirname(os.path.abspath(args.export_runs)), exist_ok=True)
        write_csv(rows, args.export_runs)
        print(f"reproduce_results: wrote the {len(rows)} finished run(s) of the selected claims to "
              f"{args.export_runs}", flush=True)
        return 0
    if args.plan:
        left = 0.0
        for st in plan_status(claims, cf.arms, tune_seeds, seeds_of, quick=args.quick, workdir=args.workdir,
                              groups=groups, rounds=rounds):
            left += st["seconds_left"]
            print(f"  {st['claim']} ({st['benchmark']}): {st['arms']} arms, {st['tune']} tuning + {st['eval']} "
                  f"evaluation runs, {st['seconds'] / 60:.0f} min declared; finished: {st['tune_done']} tuning, "
                  f"{st['eval_done']} evaluation"
                  + (f"; left ~{st['seconds_left'] / 60:.0f} min ({', '.join(st['open_arms'])})"
                     if st["seconds_left"] else ""), flush=True)
        print(f"reproduce_results: declared time of the runs not finished in {args.workdir}: {left / 60:.0f} min "
              f"(~{left / 60 / jobs:.0f} min at {jobs} at a time; an arm shared by claims counts in each)", flush=True)
        return 0
    os.makedirs(out, exist_ok=True)
    os.makedirs(args.workdir, exist_ok=True)
    common = dict(jobs=jobs, threads=threads, quick=args.quick, workdir=args.workdir, fresh=args.fresh,
                  timeout=args.timeout)
    deadline = None if args.deadline is None else t_start + 60.0 * args.deadline
    tune_rows, eval_rows, chosen, tables = run_plan(arm_list, tune, eval_seeds, deadline=deadline, groups=groups,
                                                    rounds=rounds,
                                                    execute_fn=functools.partial(execute, isolation=args.isolation),
                                                    **common)
    rows = tune_rows + eval_rows
    if len(tune_rows) < len(tune) or len(eval_rows) < n_eval or len(chosen) < len(arm_list):
        print(f"reproduce_results: stopped at the deadline with {max(0, len(tune) - len(tune_rows))} declared "
              f"tuning run(s), the widening rounds of {len(arm_list) - len(chosen)} arm(s) and "
              f"{n_eval - len(eval_rows)} evaluation run(s) left; no report written. The finished runs are kept "
              f"in {args.workdir}: rerun this command to go on, or add --export-runs FILE to carry them elsewhere "
              f"(and --runs-from FILE there)", flush=True)
        return 3
    wall = time.perf_counter() - t_start
    meta = {
        "mode": ("quick smoke run: 1 seed, the first grid point, 1 epoch of 2 batches -- the numbers are meaningless"
                 if args.quick else "declared seeds and grids"),
        "command": "python benchmarks/reproduce_results.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "code": _code_version(), "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "versions": _versions(rows),
        "cpus": cpus, "cpu": _cpu_name(), "jobs": jobs, "threads": threads, "ci": method, "confidence": confidence,
        "power": float(cf.statistics.get("power", 0.8)),
        "bootstrap_resamples": int(cf.statistics.get("bootstrap_resamples", 10000)),
        "tuning_seeds": tune_seeds, "seeds_of": seeds_of, "revision": revision,
        "dirty": dirty, "dirty_reason": "--quick" if args.quick and not args.allow_dirty else "--allow-dirty",
    }
    summary = []
    for b in cf.benchmarks:
        bc = [c for c in claims if c.benchmark == b]
        if not bc:
            continue
        brows = [r for r in rows if r["benchmark"] == b]
        write_csv(brows, os.path.join(out, f"{b}_runs.csv"))
        results = [claim_results(c, brows, seeds=seeds_of[c.key], method=method, confidence=confidence,
                                 revision=revision, n_boot=meta["bootstrap_resamples"], arms=cf.arms) for c in bc]
        pngs = []
        if plot_forest(b, results, cf.arms, os.path.join(out, f"{b}_forest.png")):
            pngs.append(f"{b}_forest.png")
        plot_claims(b, bc, brows, cf.arms, os.path.join(out, f"{b}.png"))
        pngs.append(f"{b}.png")
        if plot_curves(b, results, brows, cf.arms, os.path.join(out, f"{b}_curves.png")):
            pngs.append(f"{b}_curves.png")
        lt = [k for c in bc for k in c.arms if any("test/acc_class_0" in r for r in brows if r["arm"] == k)
              and any("acc_tail" in m for m in c.metrics)]
        lt = list(dict.fromkeys(lt))
        if lt:
            plot_per_class(brows, cf.arms, lt, os.path.join(out, f"{b}_lt_per_class.png"))
            pngs.append(f"{b}_lt_per_class.png")
        write_markdown(b, bc, results, brows, cf, chosen, tables, meta, os.path.join(out, f"{b}.md"), pngs)
        summary += results
    run_total = sum(float(r["run_seconds"] or 0.0) for r in rows)
    lines = ["# Reproduced claims: summary", "",
             f"`{meta['command']}` ({meta['mode']}; code {meta['code']}; {meta['date']}): {len(rows)} runs "
             f"({len(tune_rows)} tuning, {len(eval_rows)} evaluation), {run_total / 60:.0f} min of run time; this "
             f"invocation took {wall / 60:.1f} min. CI: {method}, {int(confidence * 100)}%.", ""]
    lines += provenance_lines(rows, meta)
    if revision >= 3:
        lines += summary_rev3(summary, cf.arms, meta)
    else:
        lines += ["| family | data | claim | first check: mean difference [95% CI], MDE | verdict | details |",
                  "|---|---|---|---|---|---|"]
        for res in summary:
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
    for res in summary:
        for k in res["claim"].run_arms():
            if k not in edges and (e := grid_edges(cf.arms[k], chosen.get(k, {}),
                                                   [t["params"] for t in tables.get(k, [])])):
                edges[k] = (res["claim"].key, e)
    if edges:
        lines += ["Tuned values at an end of their grid (those arms may be under-tuned; a wider grid could move "
                  "their results):", ""]
        lines += [f"- {cf.arms[k].label} (`{key}`): {', '.join(e)}" for k, (key, e) in edges.items()]
        lines.append("")
    with open(os.path.join(out, "summary.md"), "w") as fh:
        fh.write("\n".join(lines))
    n_fail = sum(not r["ok"] for r in rows)
    print(f"reproduce_results: wrote {out} in {wall / 60:.1f} min; {n_fail} failed run(s)", flush=True)
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
