"""What one run is: an arm at one seed, phase (``tune`` or ``eval``) and grid point
(:class:`Run`), and the command-line overrides the project's CLI makes it with
(:func:`run_args`): the seed of everything, the claims file's evaluation section (one test split for
every seed, OOD sets, learning curves), the shared initial weights, the arm's fixed overrides, the
grid point and the validation schedule of the phase (``--quick``: 1 epoch of 2 batches).

The arguments are the run's identity: its workdir key (:mod:`reproduce.running`) is computed from
them, so every step that names a run builds it here.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, Tuple

from .claims import Arm

#: evaluation runs of a one-epoch budget validate at this fraction of the epoch (their learning curve)
ONE_EPOCH_VAL_INTERVAL = 0.25
QUICK_ARGS = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
              "--trainer.limit_test_batches=2", "--trainer.num_sanity_val_steps=0"]
INIT_SEED_MODELS = ("VisionClassifier", "VisionSegmenter", "Recommender", "IdentityEmbedder",
                    "LanguageModel")  # models taking init_seed
#: DataModules taking ``test_seed`` (one test split for every seed; the claims file's evaluation.test_seed)
TEST_SEED_DATA = ("DigitsDataModule", "MNISTDataModule", "DigitsSegmentationDataModule", "MNISTSegmentationDataModule",
                  "RetrievalDataModule", "MovieLensDataModule", "IdentitiesDataModule")
#: DataModules taking ``ood`` (out-of-distribution sets scored at test; the claims file's evaluation.ood)
OOD_DATA = ("MNISTDataModule",)


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
    phase: str  # "tune" | "eval" | "replicate" (an evaluation run at a multiple of the budget)
    params: Tuple[Tuple[str, Any], ...]  # the grid point

    def args(self, quick: bool) -> List[str]:
        return run_args(self.arm, self.seed, dict(self.params), phase=self.phase, quick=quick)


def run_args(arm: Arm, seed: int, params: Dict[str, Any], *, phase: str, quick: bool) -> List[str]:
    """CLI overrides of one run (the same for ``fit`` and ``test``)."""
    cfg = arm.recipe_shared()  # read only
    model_cls = ((cfg.get("model") or {}).get("class_path") or "")
    data_cls = ((cfg.get("data") or {}).get("class_path") or "")
    args = [f"--seed_everything={seed}", f"--data.init_args.seed={seed}"]
    if arm.test_seed is not None and data_cls.endswith(TEST_SEED_DATA):
        args.append(f"--data.init_args.test_seed={arm.test_seed}")  # one test split for every seed
    if (arm.ood and phase != "tune" and data_cls.endswith(OOD_DATA)
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
