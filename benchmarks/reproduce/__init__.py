"""Reproduce the papers' claims declared in ``benchmarks/claims.yaml`` with the project's recipes.

The claims file declares, before anything runs, every claim's arms (recipe, fixed overrides, step
budget), the hyperparameter grid each arm is tuned over, the selection metric (a validation
metric), the seeds and each check's claimed direction or equivalence margin (read and validated by
:mod:`reproduce.claims`). The reproduction, run by ``python benchmarks/reproduce_results.py``
(:func:`reproduce.cli.main`),

1. **tunes** every arm: one run per grid point and tuning seed (``tuning.seeds``, disjoint from the
   evaluation seeds), ``fit`` only, validation at the end of the last epoch; the grid point with the
   best mean ``select`` metric is chosen (ties: the first declared), and a grid chosen at an end
   widens automatically (``tuning.widen``; :mod:`reproduce.tuning`). The test split is never read;
2. **evaluates** the chosen setting over the claim's seeds ``0 .. n-1``: ``fit`` (no validation
   loop), then ``test`` from the checkpoint fit saved. Per seed every arm gets the same split and
   training order (the DataModule's seed; the order is drawn from ``(seed, epoch)`` only), the same
   initial weights where the architectures agree (``--model.init_args.init_seed``), and the same
   step budget (``epochs``; the recipes anneal the learning rate with a cosine schedule per stage).
   The claims file's ``evaluation`` section (revision 3) fixes the test split for every seed
   (``test_seed``, passed to the DataModules of :data:`reproduce.runs.TEST_SEED_DATA`) and makes
   evaluation runs validate every epoch (``curves``: the run's learning curve, recorded in its
   ``curve`` column; nothing selects on it); every run records its test split's fingerprint
   (``test_split``). A run's arguments are built by :mod:`reproduce.runs`, the runs are made by
   :mod:`reproduce.running`;
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
   *budget-limited* (``stats.budget_limited``). :mod:`reproduce.analysis` collects the runs into
   each check's inputs;
4. **reports**: ``<out>/<benchmark>.md`` (per claim: the arms' mean +- sd, the chosen
   hyperparameters and the tuning table, the paired differences with CI, MDE and verdict),
   ``<out>/<benchmark>_forest.png`` (every paired check's CI against 0 and its margin),
   ``<out>/<benchmark>.png`` (per-claim panels), ``<out>/<benchmark>_curves.png`` (per claim, the
   arms' validation curves, where the runs recorded them), ``<out>/vision_lt_per_class.png`` (per-class test
   accuracy of the long-tailed arms), ``<out>/<benchmark>_runs.csv`` (every run, tuning and
   evaluation) and ``<out>/summary.md`` (:mod:`reproduce.reports`, :mod:`reproduce.plots`,
   :mod:`reproduce.records`).

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
rounds, ``tuning.widen``) is done (``reproduce.running.run_plan``, ``reproduce.tuning.tune_group``).
Finished runs are kept in ``--workdir``, keyed by recipe content and exact arguments and by the
``code_hash`` (the Python files under ``losses/`` and ``lightning_modules/`` and the recipe), so an
interrupted reproduction resumes and a changed loss never reuses an old run (``--fresh`` ignores
them all).

Provenance: the reproduction refuses to start with uncommitted changes under ``losses/``,
``lightning_modules/``, ``configs/`` or ``benchmarks/`` unless ``--allow-dirty`` is given; ``--quick``
(what CI runs, on whatever checkout it has) may run dirty. Either way the runs made record a code
version ending in ``-dirty`` and the reports name the uncommitted paths and those runs.
``--plan`` runs nothing: it prints, per claim, the runs, their declared time and how many of them
are already finished in ``--workdir`` (``reproduce.running.plan_status``), and a gated claim's gate.

Protocol revision 4 adds, per claim: ``fidelity`` (the deviations from the paper's setup, printed),
``not_applicable`` (declared before any run: the claim is not run), ``manipulation`` (absolute levels
showing the intervention acted, else *not tested*), ``replicate`` (the evaluation again at a multiple
of the budget) and ``gate`` (an arm's first-seed tuning runs run before anything else of the claim,
and one must reach an absolute validation level, else *not tested* and nothing else runs:
:func:`reproduce.cli.run_gates`). An arm whose overrides set ``trainer.accelerator: gpu`` trains on
a CUDA device: its runs are made in fresh interpreters and refused where no device is visible; every
run records the device it trained on (the runs file's ``device`` column) and, outside a git checkout,
the commit named by ``REPRODUCE_CODE_VERSION``. ``scripts/gpu_claims.sh`` runs such claims on a lent GPU a
session at a time (``--deadline``, then ``--export-runs``).

The committed ``<benchmark>_runs.csv`` files are the record of every run: ``--runs-from results/revision2``
copies their finished runs into ``--workdir`` before anything starts (``reproduce.records.seed_workdir``),
so the reports regenerate from committed runs on any machine and only runs missing from them execute.
They are the record: a row is read as recorded whatever code made it (revision 2's rows carry no code
hash). Revision 2's runs were made without the evaluation section: ``--revision-2-runs`` makes the
current claims file name them (a test split per seed, no validation in evaluation runs).
``--export-runs FILE`` (runs nothing) writes the runs of the selected claims finished so far in
``--workdir`` to a runs file, with the per-item test records of its evaluation runs in
``<benchmark>_test_items/`` beside it, so a reproduction longer than one machine's session can be
committed part-done and resumed elsewhere with ``--runs-from FILE``.

The package's modules, in the order of the pipeline:

- :mod:`reproduce.common`: the repository's paths and the statistics module (``benchmarks/stats.py``,
  which holds the verdict rules);
- :mod:`reproduce.claims`: the claims file -- arms, checks, claims -- loaded and validated;
- :mod:`reproduce.runs`: what one run is and the CLI arguments that make it;
- :mod:`reproduce.tuning`: the grids, the choice of a grid point and the automatic widening;
- :mod:`reproduce.running`: provenance, the workdir (run keys, finished runs), one run in a process of
  its own (fork server or fresh interpreter), the queue of runs and ``--plan``;
- :mod:`reproduce.records`: the runs files, ``--runs-from`` and ``--export-runs``;
- :mod:`reproduce.analysis`: the runs collected into each check's inputs, the verdicts read with
  ``stats.py``;
- :mod:`reproduce.reports` and :mod:`reproduce.plots`: the markdown reports, the summary and the
  figures;
- :mod:`reproduce.cli`: the options and :func:`~reproduce.cli.main`, which runs the steps in order.

The package is imported with ``benchmarks/`` on ``sys.path`` (as ``reproduce``): the entry point
``benchmarks/reproduce_results.py`` puts it there.
"""
