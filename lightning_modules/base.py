"""Shared LightningModule / DataModule machinery for the benchmarks."""

from __future__ import annotations

from typing import Any, Dict

import pytorch_lightning as pl
import torch

from .routing import ddp_ignored_parameter_names


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

    @staticmethod
    def scalar_metrics(prefix: str, values: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        return {f"{prefix}/{k}": v for k, v in values.items()}
