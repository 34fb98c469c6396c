"""One recipe per benchmark kind runs through the real CLI with ``--trainer.precision=bf16-mixed``
(CPU bf16 autocast around every loss and head; docs/conventions.md, mixed precision): fit (1 epoch,
2 batches), then validate and test from the checkpoint that fit saved, as the fp32 recipe tests
do (``tests/lightning/recipe_utils.py``).

The recipes are those whose loss owns a head (margin softmax, Partial FC) or samples positives
(decoupled softmax, reference variant), the paths where autocast reaches the loss's own matmuls.
Sizes as in the fp32 recipe tests: batch size 4 for digits, 256 / 64 for MovieLens; the
retrieval recipe shares the default embedding cache.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from tests.lightning.recipe_utils import run_recipe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RECIPES = {
    "configs/vision/cosine_softmax_lt.yaml": [
        "--data.init_args.batch_size=4", "--model.init_args.robust_eval=false",
    ],
    "configs/recommendation/partial_fc.yaml": [
        "--data.init_args.batch_size=256", "--data.init_args.eval_batch_size=64",
    ],
    "configs/retrieval/chatterbot_decoupled_softmax.yaml": [],
}
#: Losses that draw random numbers (Partial FC sampling, decoupled softmax "reference" positives).
STOCHASTIC = {"configs/recommendation/partial_fc.yaml", "configs/retrieval/chatterbot_decoupled_softmax.yaml"}
#: Logged metrics that are fractions.
_PROBABILITIES = ("top1", "top5", "acc", "ece", "recall@", "ndcg@", "hr@", "r@", "mrr@")
PRECISION = ["--trainer.precision=bf16-mixed", "--trainer.num_sanity_val_steps=0"]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_runs_in_bf16_mixed_precision(recipe, tmp_path):
    out = run_recipe(os.path.join(ROOT, recipe), tmp_path, extra=[*PRECISION, *RECIPES[recipe]])
    assert math.isfinite(out["fit"]["train/loss"]), out["fit"]
    val = {k: v for k, v in out["validate"].items() if k.startswith("val/")}
    test = {k: v for k, v in out["test"].items() if k.startswith("test/")}
    assert val and test
    for k, v in {**out["fit"], **val, **test}.items():
        assert math.isfinite(v), (k, v)
        if any(s in k for s in _PROBABILITIES):
            assert 0.0 <= v <= 1.0, (k, v)
    # validate restores the checkpoint written after fit's validation: the same numbers (a loss
    # that draws random numbers may draw differently, as in the fp32 recipe tests)
    for k, v in val.items():
        if k.endswith("loss") and recipe in STOCHASTIC:
            continue
        assert k in out["fit"], k
        assert v == pytest.approx(out["fit"][k], rel=1e-5, abs=1e-6), k
    # mixed precision keeps float32 master weights: the checkpoint holds no half tensors
    state = torch.load(out["ckpt"], map_location="cpu", weights_only=False)["state_dict"]
    halves = [k for k, v in state.items() if torch.is_tensor(v) and v.dtype in (torch.float16, torch.bfloat16)]
    assert not halves, halves
    assert state, "empty checkpoint"
