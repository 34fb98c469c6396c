"""Every registered loss is covered by a generated smoke recipe; hand-written recipes are run by a recipe test.

A loss needs no hand-written YAML: ``lightning_modules.recipes.smoke_config(name)`` builds a short
run of every registered entry from its registry record, and ``tests/lightning/test_smoke_recipes.py``
runs each one through the CLI (parametrised over ``losses.list_losses()``). The hand-written
recipes under ``configs/`` are the benchmarks; each one that names a registry entry lies in a folder
whose recipe test runs it.

A recipe's loss (``model.init_args.loss`` or ``aux_loss``) names a registry entry by its module
``class_path``; where several entries share a module (``margin_softmax`` / ``cosine_softmax``),
the entry whose preset (``function_kwargs``) the recipe's ``init_args`` match, else the entry
without a preset.
"""

from __future__ import annotations

import functools
import glob
import os

import pytest
import yaml

import losses

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: recipe folders and the test file whose parametrised test runs every recipe in them
RUN_BY = {
    "vision": "tests/lightning/test_vision_recipes.py",
    "segmentation": "tests/lightning/test_vision_recipes.py",
    "recommendation": "tests/lightning/test_rec_retrieval_recipes.py",
    "retrieval": "tests/lightning/test_rec_retrieval_recipes.py",
    "own_data": "tests/lightning/test_own_data.py",
    "ddp": "tests/lightning/test_ddp_recipe.py",
    "language_model": "tests/lightning/test_language_model.py",
}


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _entries_for(loss_cfg: dict):
    name = loss_cfg["class_path"].rpartition(".")[2]
    args = loss_cfg.get("init_args") or {}
    specs = [s for s in losses.list_losses() if s.module.__name__ == name and loss_cfg["class_path"].startswith("losses.")]
    preset = [s for s in specs if s.function_kwargs and all(_same(args.get(k), v) for k, v in s.function_kwargs.items())]
    return preset or [s for s in specs if not s.function_kwargs]


@functools.lru_cache(maxsize=1)
def recipes_by_entry():
    found = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)):
        with open(path) as fh:
            cfg = yaml.safe_load(fh)
        init = (cfg.get("model") or {}).get("init_args") or {}
        for key in ("loss", "aux_loss"):
            if isinstance(init.get(key), dict):
                for spec in _entries_for(init[key]):
                    found.setdefault(spec.name, []).append(os.path.relpath(path, ROOT))
    return found


SMOKE_RUNNER = "tests/lightning/test_smoke_recipes.py"


@pytest.mark.parametrize("name", sorted(s.name for s in losses.list_losses()))
def test_every_registry_entry_has_a_generated_smoke_recipe(name):
    from lightning_modules.recipes import class_path, smoke_config

    spec = losses.get_loss_spec(name)
    cfg = smoke_config(name)
    init = cfg["model"]["init_args"]
    assert class_path(spec.module) in {init["loss"]["class_path"], (init.get("aux_loss") or {}).get("class_path")}
    assert os.path.isfile(os.path.join(ROOT, SMOKE_RUNNER))


@pytest.mark.parametrize("name", sorted(recipes_by_entry()))
def test_hand_written_recipes_are_run_by_a_recipe_test(name):
    recipes = recipes_by_entry()[name]
    runners = {RUN_BY.get(r.split(os.sep)[1]) for r in recipes} - {None}
    assert runners, f"{name}: recipes {recipes} are in folders no recipe test runs"
    for runner in runners:
        assert os.path.isfile(os.path.join(ROOT, runner)), runner


def test_margin_presets_are_told_apart():
    found = recipes_by_entry()
    assert "configs/vision/cosine_softmax_lt.yaml" in found["cosine_softmax"]
    assert "configs/vision/cosine_softmax_lt.yaml" not in found["margin_softmax"]
    assert "configs/vision/margin_softmax.yaml" in found["margin_softmax"]
