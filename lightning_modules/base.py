"""Shared LightningModule / DataModule machinery for the benchmarks."""

from __future__ import annotations

import copy
import importlib
import inspect
from typing import Any, MutableMapping, Optional

import pytorch_lightning as pl
import torch

from .routing import ddp_ignored_parameter_names


def _import_class(path: str) -> Optional[type]:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


_PLAIN = (bool, int, float, str, type(None))


def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return isinstance(value, _PLAIN)


def _fix_config(config: MutableMapping[str, Any], cls: type, owner: Any) -> None:
    """Make ``config`` (constructor arguments of ``cls``) re-instantiable: drop keys that ``cls``
    does not accept, add accepted ones that links filled in but the dump lost, reading them
    from the built object ``owner`` (modules keep their hyperparameters as attributes), and
    recurse into nested ``{"class_path", "init_args"}`` entries. Private ``_`` keys stay."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return
    named = {k: p for k, p in params.items() if k != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        for key in [k for k in config if not k.startswith("_") and k not in named]:
            del config[key]
    if owner is not None:
        for key in named:
            if key not in config and hasattr(owner, key) and _plain(getattr(owner, key)):
                value = getattr(owner, key)
                config[key] = list(value) if isinstance(value, tuple) else value
    for key, value in list(config.items()):
        if isinstance(value, MutableMapping) and isinstance(value.get("class_path"), str):
            sub = _import_class(value["class_path"])
            if sub is not None:
                if not isinstance(value.get("init_args"), MutableMapping):
                    value["init_args"] = {}
                _fix_config(value["init_args"], sub, getattr(owner, key, None) if owner is not None else None)


def clean_linked_hparams(module: pl.LightningModule) -> None:
    """Make the saved hyperparameters re-instantiable after the CLI's size links.

    ``LightningCLI`` records every applied instantiation link in the saved hyperparameters, also
    for arguments a class does not take (``num_users`` for a vision model, ``num_classes`` for a
    loss without a head), and its dump drops parse-time link targets (the loss's
    ``embedding_dim``); ``validate --ckpt_path`` and ``load_from_checkpoint`` then fail to
    re-parse them. Call at the end of ``__init__``, once the sub-modules exist.
    """
    _fix_config(module._hparams, type(module), module)
    if hasattr(module, "_hparams_initial"):
        module._hparams_initial = copy.deepcopy(module._hparams)



class BenchmarkDataModule(pl.LightningDataModule):
    """Base of every benchmark DataModule: the sizes models need, linked by the CLI.

    Subclasses set the sizes that apply in ``__init__`` (they must be known before the model is
    built, since the CLI links them into the model's and the loss's constructors); the others
    stay 0.
    """

    num_classes: int = 0  #: output classes (digits: 10, segmentation: 11, items as classes: 1682)
    num_users: int = 0  #: recommendation: users (query rows)
    num_items: int = 0  #: recommendation / retrieval: items or corpus documents
    input_dim: int = 0  #: width of precomputed input features (e.g. 384 for cached MiniLM)
    in_chans: int = 0  #: image channels


class BenchmarkModule(pl.LightningModule):
    """Base LightningModule: optimiser from hyperparameters, DDP-ignored loss parameters."""

    def __init__(self, *, lr: float = 1e-3, weight_decay: float = 0.0) -> None:
        super().__init__()
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)

    def setup(self, stage: str) -> None:
        # Parameters a loss shards across ranks (Partial FC centres) must never be averaged by
        # DDP; Lightning's DDP strategy reads this attribute when it wraps the module.
        names = ddp_ignored_parameter_names(self)
        if names:
            self._ddp_params_and_buffers_to_ignore = list(names)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
