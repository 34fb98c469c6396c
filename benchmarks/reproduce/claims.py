"""Step 0 of the pipeline: the claims file (``benchmarks/claims.yaml``), read and validated.

The file declares, before anything runs, every claim's arms (recipe, fixed overrides, step budget,
the hyperparameter grid each arm is tuned over and the validation metric it is selected on), the
tuning and evaluation seeds, the evaluation section (revision 3) and each check's claimed direction,
margin or level. :func:`load_claims` parses it into the frozen dataclasses :class:`Arm`,
:class:`Check`, :class:`Claim` and :class:`ClaimsFile` (no validation beyond its shape);
:func:`validate_claims` lists every problem of it as readable lines (the reproduction refuses an
invalid file). :meth:`ClaimsFile.widen_groups` gives the groups of arms that widen their grids
together (:mod:`reproduce.tuning`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .common import CLAIMS_FILE, ROOT, stats

DIRECTION_KINDS = ("higher", "lower")
MARGIN_KINDS = ("equivalent", "not_worse")
LEVEL_KINDS = ("below", "above")
DID_KIND = "did"  # revision 3: difference in differences (robustness claims)
SANITY_KIND = "sanity"  # revision 3: identities / levels a loss meets by construction
#: revision 4: the learning-rate sensitivity of two swept arms, read from their tuning runs
SENSITIVITY_KIND = "lr_sensitivity"
TRANSFORMS = ("abs",)  # per-seed transforms of a metric a check may declare
REVISIONS = (2, 3, 4)
#: claim keys read only under revision 4 (``statistics.revision: 4``)
REVISION4_KEYS = ("not_applicable", "manipulation", "replicate", "gate")
#: the phase of a replicate's runs (revision 4): evaluation runs at a multiple of the budget
REPLICATE_PHASE = "replicate"
#: revision 3: the last component of a grid key that tunes the learning rate (every arm tunes one)
LR_KEYS = ("lr", "learning_rate")


def _safe_load(stream: Any) -> Any:
    """``yaml.safe_load`` with libyaml's parser where PyYAML was built with it (the same documents and
    values, about ten times faster on the claims files)."""
    import yaml

    return yaml.load(stream, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@functools.lru_cache(maxsize=256)
def _parse_recipe(text: str) -> dict:
    return _safe_load(text) or {}


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
    test_seed: Optional[int] = None  # one test split for every seed (DataModules of runs.TEST_SEED_DATA)
    curves: bool = False  # evaluation runs validate every epoch: the run's learning curve
    ood: Optional[str] = None  # evaluation runs score these OOD sets at test (DataModules of runs.OOD_DATA)
    widen: bool = True  # False: the grid is the condition under test; never widened (tuning.widen)
    # the fewest distinct values of a numeric list the widening rule applies to: 3 up to revision 3
    # (with two, every choice is an end), 2 from revision 4 (the file's statistics.revision)
    widen_min: int = 3

    def recipe_text(self) -> str:
        with open(os.path.join(ROOT, self.recipe)) as fh:
            return fh.read()

    def recipe_config(self) -> dict:
        """The recipe parsed (a fresh copy; the parse is cached per file content, since runs
        files of hundreds of rows ask for it once per row)."""
        return copy.deepcopy(self.recipe_shared())

    def recipe_shared(self) -> dict:
        """The recipe parsed, the cached object itself: for readers only (never modify it); a run's
        arguments are built from it once per runs-file row, where a copy each time cost seconds."""
        return _parse_recipe(self.recipe_text())

    def loss_has_seed(self) -> bool:
        loss = (((self.recipe_shared().get("model") or {}).get("init_args") or {}).get("loss") or {})
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
    # revision 4: a margin relative to the baseline's error (stats.resolve_margin), instead of ``margin``
    relative_margin: Optional[float] = None
    # kind: lr_sensitivity -- the loss a diverged or worse-than-initial run counts as (the loss of the
    # uniform prediction, ln of the number of classes), and the grid key whose values are separate
    # sweeps (e.g. the model width); see stats.lr_sensitivity
    cap: Optional[float] = None
    group: Optional[str] = None

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
class Manipulation:
    """Revision 4: a check that the claim's condition occurred in one arm (``stats.ManipulationCheck``):
    the mean over the evaluation seeds of ``metric`` in ``arm`` must satisfy ``op level``, an absolute
    level. ``name`` says what it shows (e.g. "the penalty acted")."""

    name: str
    arm: str
    metric: str
    op: str
    level: float


@dataclasses.dataclass(frozen=True)
class Gate:
    """Revision 4: a run that must show the baseline can train before the rest of the claim is run.
    The ``arm``'s declared tuning runs on the first tuning seed run first; the gate passes when one of
    them has ``metric`` (a validation column) ``op level`` (an absolute level, e.g. the no-training
    floor of that validation split). Until it passes no other run of the claim starts; when every one
    of them has finished and none passes, the claim is *not tested* and nothing else of it is run."""

    name: str
    arm: str
    metric: str
    op: str
    level: float

    def passes(self, value: Any) -> bool:
        try:
            v = float(value)
        except (TypeError, ValueError):
            return False
        return v == v and stats.meets_level(v, self.op, self.level)


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
    # revision 4: every known deviation from the paper's setup (None: not declared; (): none known)
    fidelity: Optional[Tuple[str, ...]] = None
    not_applicable: Optional[str] = None  # the declared reason the regime cannot express the claim
    manipulation: Tuple[Manipulation, ...] = ()  # the condition occurred (absolute levels)
    # a replicate of the evaluation at ``budget`` times every arm's epochs on seeds 0 .. seeds - 1,
    # the chosen settings kept: (budget, seeds), or None
    replicate: Optional[Tuple[Any, Any]] = None
    gate: Optional[Gate] = None  # revision 4: the baseline must train before the rest is run

    def run_arms(self) -> Tuple[str, ...]:
        """The claim's arms and the clean arms its difference-in-differences checks read (which may
        belong to another claim), in order, each once: every one of them is run for the claim."""
        out = list(self.arms)
        for ch in self.checks:
            out += [a for a in ch.clean_arms() if a not in out]
        return tuple(out)

    def swept_arms(self) -> Tuple[str, ...]:
        """The arms the claim's ``lr_sensitivity`` checks read (family and baseline of each, in
        order, each once): arms whose tuning runs are a learning-rate sweep."""
        return tuple(dict.fromkeys(k for ch in self.checks if ch.kind == SENSITIVITY_KIND
                                   for k in (ch.family, ch.baseline)))

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
        """The groups of arms that widen together (:func:`reproduce.tuning.tune_group`): the arms a
        claim compares (:meth:`Claim.run_arms`), joined across claims that share an arm, in file
        order; an arm declared ``widen: false`` is a group of its own. A claim declared not applicable
        (revision 4) is never run and joins no arms."""
        parent = {k: k for k in self.arms}

        def root(k: str) -> str:
            while parent[k] != k:
                parent[k] = parent[parent[k]]
                k = parent[k]
            return k

        for c in self.claims:
            if self.revision >= 4 and c.not_applicable:
                continue
            ks = [k for k in c.run_arms() if k in self.arms and self.arms[k].widen]
            for k in ks[1:]:
                parent[root(k)] = root(ks[0])
        groups: Dict[str, List[str]] = {}
        for k in self.arms:
            groups.setdefault(root(k) if self.arms[k].widen else k, []).append(k)
        return list(groups.values())


def _replicate(raw: Any) -> Optional[Tuple[Any, Any]]:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        return (raw, None)
    return (raw.get("budget"), raw.get("seeds"))


# Overrides that count epochs or steps: a replicate multiplies them with the epochs, so a two-stage arm
# keeps its stage boundary at the same share of the fit (stage 1 of 15 epochs in 20 becomes 30 in 40),
# and an arm whose budget is a step count (trainer.max_steps, the epochs only bounding it) trains twice
# the steps.
EPOCH_OVERRIDES = ("model.init_args.two_stage_epoch", "trainer.max_steps")


def replicate_arm(arm: Arm, budget: int) -> Arm:
    """``arm`` at ``budget`` times its epochs (and declared seconds): a replicate's runs, whose
    schedule stretches with the epochs (a cosine schedule spans the whole fit; an epoch-counting
    override of :data:`EPOCH_OVERRIDES`, the two-stage boundary, is multiplied as well)."""
    overrides = tuple((k, v * int(budget) if k in EPOCH_OVERRIDES and isinstance(v, int) and not isinstance(v, bool)
                       else v) for k, v in arm.overrides)
    return dataclasses.replace(arm, epochs=arm.epochs * int(budget), seconds=arm.seconds * int(budget),
                               overrides=overrides)


def replicates(claims: Sequence["Claim"]) -> Dict[str, Tuple[int, Tuple[int, ...]]]:
    """``{arm: (budget, seeds)}`` of the replicates the ``claims`` declare (every arm each runs; an
    arm of two claims takes the larger budget and the union of the seeds)."""
    out: Dict[str, Tuple[int, Tuple[int, ...]]] = {}
    for c in claims:
        if c.replicate is None:
            continue
        budget, n = int(c.replicate[0]), int(c.replicate[1])
        for k in c.run_arms():
            b0, s0 = out.get(k, (budget, ()))
            out[k] = (max(b0, budget), tuple(sorted(set(s0) | set(range(n)))))
    return out


def load_claims(path: str = CLAIMS_FILE) -> ClaimsFile:
    """Parse the claims file (no validation beyond its shape; see :func:`validate_claims`)."""
    with open(path) as fh:
        raw = _safe_load(fh) or {}
    arms = {}
    evaluation = dict(raw.get("evaluation") or {})
    revision = (raw.get("statistics") or {}).get("revision", 2)
    widen_min = 2 if isinstance(revision, int) and revision >= 4 else 3
    for key, a in (raw.get("arms") or {}).items():
        grid = dict(a.get("grid") or {})
        points = tuple(tuple((p or {}).items()) for p in grid.pop("points", None) or ())
        arms[key] = Arm(key=key, benchmark=a["benchmark"], label=a.get("label", key), recipe=a["recipe"],
                        epochs=int(a["epochs"]), select=a.get("select", ""), points=points,
                        grid=tuple((k, tuple(v)) for k, v in grid.items()),
                        overrides=tuple((a.get("overrides") or {}).items()), seconds=float(a.get("seconds", 60)),
                        test_seed=evaluation.get("test_seed"), curves=bool(evaluation.get("curves", False)),
                        ood=evaluation.get("ood"),
                        widen=bool(a.get("widen", True)), widen_min=widen_min)
    claims = []
    for c in raw.get("claims") or []:
        checks = tuple(Check(metric=ch["metric"], family=ch["family"], kind=ch["kind"], baseline=ch.get("baseline"),
                             margin=ch.get("margin"), level=ch.get("level"), better=ch.get("better", "higher"),
                             primary=bool(ch.get("primary", False)), rule=ch.get("rule"),
                             transform=ch.get("transform"), clean_metric=ch.get("clean_metric"),
                             clean_family=ch.get("clean_family"), clean_baseline=ch.get("clean_baseline"),
                             effect=ch.get("effect"), relative_margin=ch.get("relative_margin"),
                             cap=ch.get("cap"), group=ch.get("group"))
                       for ch in c.get("checks") or [])
        fid = c.get("fidelity")
        raw_manip = c.get("manipulation") or []
        raw_manip = raw_manip if isinstance(raw_manip, list) else [raw_manip]
        manip = tuple(Manipulation(name=str(m.get("name", "")), arm=str(m.get("arm", "")), metric=str(m.get("metric", "")),
                                   op=str(m.get("op", "")), level=m.get("level"))
                      if isinstance(m, dict) else Manipulation("", "", "", "", None) for m in raw_manip)
        claims.append(Claim(key=c["key"], family=c["family"], benchmark=c["benchmark"], data=c.get("data", ""),
                            claim=c.get("claim", ""), arms=tuple(c.get("arms") or ()),
                            metrics=tuple(c.get("metrics") or ()), seeds=int(c.get("seeds", 0)),
                            plot=c.get("plot", ""), checks=checks, notes=c.get("notes", "") or "",
                            varies=tuple(c.get("varies") or ()),
                            floors=tuple((c.get("floors") or {}).items()),
                            fidelity=None if fid is None else tuple(fid) if isinstance(fid, (list, tuple)) else (fid,),
                            not_applicable=c.get("not_applicable"), manipulation=manip,
                            replicate=_replicate(c.get("replicate")), gate=_gate(c.get("gate"))))
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


def data_config(arm: Arm, varies: Sequence[str] = ()) -> dict:
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
        datas = {json.dumps(data_config(a, c.varies), sort_keys=True) for a in arms
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
        problems += _validate_revision4(cf, c, where)
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
            if ch.kind == SENSITIVITY_KIND:
                problems += _validate_sensitivity(cf, c, ch, w)
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
                if ch.relative_margin is not None:
                    if ch.margin is not None:
                        problems.append(f"{w}: declare the margin either in the metric's units (margin) or relative "
                                        f"to the baseline's error (relative_margin), not both")
                    elif (isinstance(ch.relative_margin, bool) or not isinstance(ch.relative_margin, (int, float))
                          or not ch.relative_margin > 0):
                        problems.append(f"{w}: relative_margin must be a positive number (got {ch.relative_margin!r})")
                elif not isinstance(ch.margin, (int, float)) or not ch.margin > 0:
                    problems.append(f"{w}: a {kind} claim needs a positive margin declared up front")
                if ch.better not in ("higher", "lower"):
                    problems.append(f"{w}: better must be 'higher' or 'lower'")
            elif kind in LEVEL_KINDS:
                if not isinstance(ch.level, (int, float)):
                    problems.append(f"{w}: a {kind} claim needs a level")
            else:
                problems.append(f"{w}: kind {ch.kind!r} is not one of "
                                f"{DIRECTION_KINDS + MARGIN_KINDS + LEVEL_KINDS + (DID_KIND, SANITY_KIND, SENSITIVITY_KIND)}")
    return problems


def _gate(raw: Any) -> Optional[Gate]:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        return Gate("", "", "", "", float("nan"))
    return Gate(name=str(raw.get("name", "")), arm=str(raw.get("arm", "")), metric=str(raw.get("metric", "")),
                op=str(raw.get("op", "")), level=raw.get("level"))


def _not_a_finite_level(level: Any) -> bool:
    """Whether a manipulation check's or a gate's ``level`` is not a finite number (an absolute level)."""
    return isinstance(level, bool) or not isinstance(level, (int, float)) or level != level \
        or level in (float("inf"), float("-inf"))


def _validate_revision4(cf: ClaimsFile, c: Claim, where: str) -> List[str]:
    """The revision-4 keys of a claim: ``fidelity`` (declared by every claim of a revision-4 file, a
    list of lines, ``[]`` when none is known), ``not_applicable`` (the reason, a non-empty string),
    ``manipulation`` (checks of an arm the claim runs against an absolute level) and the checks'
    ``relative_margin``; the last three change verdicts and are refused below revision 4."""
    problems: List[str] = []
    if c.fidelity is None:
        if cf.revision >= 4:
            problems.append(f"{where}: revision 4 declares fidelity: the deviations from the paper's setup, one line "
                            f"each (fidelity: [] when none is known)")
    elif not all(isinstance(x, str) and x.strip() for x in c.fidelity):
        problems.append(f"{where}: fidelity must be a list of non-empty lines (got {list(c.fidelity)!r})")
    rel = [i + 1 for i, ch in enumerate(c.checks) if ch.relative_margin is not None]
    if cf.revision < 4:
        used = [k for k in REVISION4_KEYS if getattr(c, k)] + (["relative_margin (checks " + str(rel) + ")"] if rel else [])
        if used:
            problems.append(f"{where}: {', '.join(used)} change verdicts under protocol revision 4 only "
                            f"(statistics.revision: 4; this file is revision {cf.revision})")
        return problems
    if c.not_applicable is not None and not (isinstance(c.not_applicable, str) and c.not_applicable.strip()):
        problems.append(f"{where}: not_applicable must be the declared reason, a non-empty string "
                        f"(got {c.not_applicable!r})")
    if c.replicate is not None:
        budget, n = c.replicate
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 2:
            problems.append(f"{where}: replicate.budget must be an integer >= 2, the multiple of every arm's epochs "
                            f"(got {budget!r})")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= c.seeds:
            problems.append(f"{where}: replicate.seeds must be an integer from 1 to the claim's {c.seeds} seeds "
                            f"(got {n!r})")
    for i, m in enumerate(c.manipulation):
        w = f"{where}, manipulation {i + 1}"
        if not m.name.strip():
            problems.append(f"{w}: give each manipulation check a name, an arm, a metric, an op and a level")
            continue
        if m.arm not in c.run_arms():
            problems.append(f"{w} ({m.name}): arm {m.arm!r} is not an arm the claim runs")
        if "/" not in m.metric:
            problems.append(f"{w} ({m.name}): metric {m.metric!r} must be a logged column (test/..., train/...)")
        if m.op not in stats.MANIPULATION_OPS:
            problems.append(f"{w} ({m.name}): op must be one of {stats.MANIPULATION_OPS} (got {m.op!r})")
        if _not_a_finite_level(m.level):
            problems.append(f"{w} ({m.name}): level must be a finite number, an absolute level (got {m.level!r})")
    g = c.gate
    if g is not None:
        w = f"{where}, gate"
        if not g.name.strip():
            problems.append(f"{w}: give the gate a name, an arm, a validation metric, an op and a level")
        else:
            if g.arm not in c.arms:
                problems.append(f"{w} ({g.name}): arm {g.arm!r} is not one of the claim's arms")
            if not g.metric.startswith("val/"):
                problems.append(f"{w} ({g.name}): metric {g.metric!r} must be a validation column (val/...): the "
                                f"gate reads tuning runs, which never test")
            if g.op not in stats.MANIPULATION_OPS:
                problems.append(f"{w} ({g.name}): op must be one of {stats.MANIPULATION_OPS} (got {g.op!r})")
            if _not_a_finite_level(g.level):
                problems.append(f"{w} ({g.name}): level must be a finite number, an absolute level (got {g.level!r})")
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


def sweep_key(arm: Arm) -> Optional[str]:
    """The grid key of ``arm`` that sets the learning rate (its last component in :data:`LR_KEYS`),
    or ``None``."""
    return next((k for p in arm.grid_points() for k in p if k.split(".")[-1] in LR_KEYS), None)


def _validate_sensitivity(cf: ClaimsFile, c: Claim, ch: Check, w: str) -> List[str]:
    """A learning-rate sensitivity check (revision 4): two arms of the claim that sweep the same
    learning rates (the same grid points, never widened: the sweep is the condition, not a tuning
    range), a validation metric that is a loss (lower is better) read from their tuning runs, the
    finite ``cap`` a diverged run counts as, and at least 3 learning rates per sweep (per value of
    the ``group`` key, which every point must set)."""
    out = []
    if cf.revision < 4:
        return [f"{w}: an lr_sensitivity check is read under protocol revision 4 only"]
    if ch.baseline not in c.arms or ch.baseline == ch.family:
        return [f"{w}: baseline {ch.baseline!r} must be another arm of the claim"]
    if not ch.metric.startswith("val/"):
        out.append(f"{w}: the sensitivity is read from the tuning runs, so its metric must be a validation loss "
                   f"(val/...), got {ch.metric!r}")
    if ch.better != "lower":
        out.append(f"{w}: the sensitivity is read on a loss: declare better: lower")
    if _not_a_finite_level(ch.cap):
        out.append(f"{w}: cap must be a finite number, the loss a diverged run counts as (e.g. ln of the number of "
                   f"classes, the uniform prediction's loss); got {ch.cap!r}")
    if ch.margin is not None or ch.relative_margin is not None:
        out.append(f"{w}: an lr_sensitivity check takes no margin (the family's sensitivity is claimed lower)")
    fam, base = cf.arms.get(ch.family), cf.arms.get(ch.baseline)
    if fam is None or base is None:
        return out
    for a in (fam, base):
        if a.widen:
            out.append(f"{w}: arm {a.key!r} sweeps the learning rate: declare it widen: false (no tuning inside "
                       f"the sweep)")
    key = sweep_key(fam)
    if key is None or sweep_key(base) != key:
        out.append(f"{w}: both arms must sweep the same learning-rate key")
        return out
    pts = [json.dumps(p, sort_keys=True) for p in fam.grid_points()]
    if sorted(pts) != sorted(json.dumps(p, sort_keys=True) for p in base.grid_points()):
        out.append(f"{w}: the two arms must sweep the same grid points (the sensitivity is paired per sweep)")
    if ch.group is not None and any(ch.group not in p for p in fam.grid_points()):
        out.append(f"{w}: group {ch.group!r} must be a key of every grid point")
        return out
    sweeps: Dict[Any, set] = {}
    for p in fam.grid_points():
        sweeps.setdefault(json.dumps(p.get(ch.group)) if ch.group else "", set()).add(p[key] if key in p else None)
    short = {g: len(v) for g, v in sweeps.items() if len(v) < 3}
    if short:
        out.append(f"{w}: every sweep needs at least 3 learning rates (got {short})")
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
