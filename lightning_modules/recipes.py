"""Smoke recipes generated from the registry: one short CLI run per registered loss.

Hand-written recipes under ``configs/`` are the benchmarks; they are not needed for a loss to be
covered. :func:`smoke_config` builds, from a loss's registry record alone, a LightningCLI
configuration that trains it on its natural benchmark for a batch or two:

* ``"logits"`` and ``"model"`` losses, and ``"embeddings"`` losses that own a head: the main loss
  of a :class:`~lightning_modules.models.VisionClassifier` on the digits (tiny ``test_resnet``
  backbone, 16-pixel images);
* auxiliary losses and ``"embeddings"`` losses without a head: the ``aux_loss`` of that classifier,
  next to cross-entropy;
* ``"scores"`` losses: a :class:`~lightning_modules.models.Recommender` on MovieLens-100k, the
  ``"users"`` view (each user's training items are its positives);
* ``"pairs"`` losses: the same recommender on the ``"pairs"`` view with 4 sampled negatives.

The loss's constructor arguments are its ``example_kwargs`` (over the preset of its
``function_kwargs``), minus the ones the CLI links from the data and the model
(:data:`LINKED_LOSS_ARGS`: sizes, class counts, class prior), which the CLI fills in. Run one with::

    python -m lightning_modules.recipes cross_entropy > smoke.yaml
    python -m lightning_modules fit --config smoke.yaml --trainer.fast_dev_run=true

``tests/lightning/test_smoke_recipes.py`` runs every registered entry this way.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Dict, Mapping, Optional

import losses
from losses import InputKind

__all__ = ["LINKED_LOSS_ARGS", "smoke_config", "loss_config", "class_path"]

#: Loss constructor arguments the CLI links from the DataModule or the model (``lightning_modules.cli``).
LINKED_LOSS_ARGS = ("num_classes", "embedding_dim", "class_counts", "class_prior")

_TRAINER: Dict[str, Any] = {"max_epochs": 1, "limit_train_batches": 2, "limit_val_batches": 1, "limit_test_batches": 1,
                            "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 1}
_VISION_MODEL: Dict[str, Any] = {"backbone": "test_resnet", "embedding_dim": 16, "robust_eval": False, "lr": 0.002}
_VISION_DATA: Dict[str, Any] = {"class_path": "lightning_modules.data.DigitsDataModule",
                                "init_args": {"image_size": 16, "batch_size": 32, "eval_batch_size": 64, "seed": 0}}
_REC_MODEL: Dict[str, Any] = {"embedding_dim": 16, "score": "cosine", "lr": 0.005}


def class_path(cls: type) -> str:
    """``losses.<Name>`` for a class the package exports, else its full import path."""
    if getattr(losses, cls.__name__, None) is cls:
        return f"losses.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _plain(value: Any) -> Any:
    """A YAML-able copy: tuples become lists, tensors their ``tolist()``."""
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def loss_config(spec: losses.LossSpec) -> Dict[str, Any]:
    """``{"class_path", "init_args"}`` of a registry entry: its ``function_kwargs`` preset (the
    constructor keywords among them) under its ``example_kwargs``, minus :data:`LINKED_LOSS_ARGS`."""
    try:
        params = inspect.signature(spec.module).parameters
    except (TypeError, ValueError):
        params = {}
    kwargs = {k: v for k, v in spec.function_kwargs.items() if k in params}
    kwargs.update(spec.example_kwargs)
    init = {k: _plain(v) for k, v in kwargs.items() if k not in LINKED_LOSS_ARGS}
    out: Dict[str, Any] = {"class_path": class_path(spec.module)}
    if init:
        out["init_args"] = init
    return out


def smoke_config(name: str, *, seed: int = 0) -> Dict[str, Any]:
    """A LightningCLI configuration (a dict; ``yaml.safe_dump`` writes it) that trains the registered
    loss ``name`` for 2 batches on its natural benchmark and validates on one (module docstring).
    ``ValueError`` for an unknown name."""
    spec = losses.get_loss_spec(name)
    loss = loss_config(spec)
    kind = spec.kind
    if kind in (InputKind.SCORES, InputKind.PAIRS):
        pairs = kind == InputKind.PAIRS
        data = {"class_path": "lightning_modules.data.MovieLensDataModule",
                "init_args": {"train_view": "pairs" if pairs else "users", "num_negatives": 4 if pairs else 0,
                              "batch_size": 256 if pairs else 64, "eval_batch_size": 64, "seed": seed}}
        model = {"class_path": "lightning_modules.models.Recommender", "init_args": {**_REC_MODEL, "loss": loss}}
    else:
        aux = spec.auxiliary or (kind == InputKind.EMBEDDINGS and not spec.owns_head)
        init: Dict[str, Any] = dict(_VISION_MODEL)
        if aux:  # trains next to a main loss
            init.update(loss={"class_path": "losses.CrossEntropyLoss"}, aux_loss=loss, aux_weight=1.0)
        else:
            init["loss"] = loss
        data = {"class_path": _VISION_DATA["class_path"], "init_args": {**_VISION_DATA["init_args"], "seed": seed}}
        model = {"class_path": "lightning_modules.models.VisionClassifier", "init_args": init}
    return {"seed_everything": seed, "trainer": dict(_TRAINER), "model": model, "data": data}


def main(argv: Optional[list] = None) -> int:
    """``python -m lightning_modules.recipes NAME``: print the smoke configuration of ``NAME`` as YAML."""
    import yaml

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m lightning_modules.recipes NAME   (NAME: one of losses.loss_names())", file=sys.stderr)
        return 2
    try:
        cfg = smoke_config(args[0])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump(cfg, sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
