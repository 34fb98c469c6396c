"""MovieLens-100k from the RecBole 1.2.1 wheel's data files, split leave-last-out or at random.

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

``split="random"`` (:func:`random_split`): each user's interactions are shuffled with a seeded
generator and ``round(0.1·n)`` go to test, the next ``round(0.1·n)`` to validation, the rest
(about 80 %) to training. Evaluation then counts every held-out item of the user as a positive
(multi-positive Recall@20 / NDCG@20). On ML-100k (every user has >= 20 ratings) this gives
10,037 test interactions over all 943 users instead of 943, which brings the standard error of
Recall@20 from ~0.013 down to ~0.006 over users (less for paired differences).

Two stress settings (for the PSL claims):

* ``false_negatives=r``: each sampled training negative is, with probability ``r`` (seeded),
  replaced by one of the user's *test* items: an item that is in fact a positive of the user,
  pushed down as a negative (users without test items keep their draws). With
  ``held_out_positives=f`` the replacements come instead from a *pool* of held-out positives:
  ``round(f·n)`` of each user's ``n`` training interactions (a seeded choice, the same for the
  clean and the stressed arm of one seed) are removed from training and are neither validation
  nor test items; they are masked from the validation and test rankings
  (known positives, neither relevant nor negatives). The stress then pushes down true positives
  of the user without touching the items the model is scored on, and a clean arm with the same
  ``held_out_positives`` and ``false_negatives=0`` trains on exactly the same interactions.
* ``debiased_cap=c``: test batches also carry a *popularity-debiased* view of the test set:
  each item keeps at most ``c`` of its test interactions (a seeded random choice), i.e. an item
  with ``t`` test interactions keeps each with probability ``min(1, c/t)``, inversely to its
  popularity above the cap; the dropped test interactions are masked from that view's ranking
  (known positives, neither relevant nor negatives). Training and validation are unchanged.

Evaluation batches also carry the ``"rare"`` view: the test (validation) positives among the
rarest half of the items by training popularity (``floor(I/2)`` items with the fewest training
interactions, ties by item id), ranked among all items.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..base import BenchmarkDataModule, IndexDataset, WorkerGenerator, check_test_seed, split_fingerprint
from .embedding_cache import package_file

__all__ = ["RECBOLE_PIP", "movielens_file", "load_ml100k", "leave_last_out", "random_split", "MovieLensSplit",
           "sample_negatives", "rarest_half", "debiased_subset", "hold_out_positives", "MovieLensDataModule"]

SPLITS = ("leave_last_out", "random")

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
    """A split with remapped ids (see the module docstring). ``val_mask`` / ``test_mask`` mark
    every held-out interaction (built from ``val_items`` / ``test_items`` for leave-last-out;
    the random split has several per user and leaves ``val_items`` / ``test_items`` at -1)."""

    num_users: int
    num_items: int
    train_users: torch.Tensor  # (T,) long
    train_items: torch.Tensor  # (T,) long
    val_items: torch.Tensor  # (U,) long, -1 where the user has no validation item
    test_items: torch.Tensor  # (U,) long, -1 where the user has no test item
    train_mask: torch.Tensor  # (U, I) bool: the user's training items
    user_ids: np.ndarray  # raw id of each remapped user
    item_ids: np.ndarray  # raw id of each remapped item
    val_mask: Optional[torch.Tensor] = None  # (U, I) bool: held-out validation interactions
    test_mask: Optional[torch.Tensor] = None  # (U, I) bool: held-out test interactions
    kind: str = "leave_last_out"
    pool_mask: Optional[torch.Tensor] = None  # (U, I) bool: held-out positives (hold_out_positives), or None

    def __post_init__(self) -> None:
        for name, items in (("val_mask", self.val_items), ("test_mask", self.test_items)):
            if getattr(self, name) is None:
                mask = torch.zeros(self.num_users, self.num_items, dtype=torch.bool)
                rows = torch.nonzero(items >= 0).squeeze(1)
                mask[rows, items[rows]] = True
                setattr(self, name, mask)

    def heldout_mask(self, split: str) -> torch.Tensor:
        if split not in ("val", "test"):
            raise ValueError(f"heldout_mask: split must be 'val' or 'test' (got {split!r})")
        return self.val_mask if split == "val" else self.test_mask

    def train_item_counts(self) -> torch.Tensor:
        """Training interactions per item, ``(I,)`` long."""
        return torch.bincount(self.train_items, minlength=self.num_items)

    def seen_mask(self, users: torch.Tensor, split: str) -> torch.Tensor:
        """Items excluded from ranking for ``users`` at ``split`` (``"val"``: training items;
        ``"test"``: training and validation items); shape ``(B, I)`` bool. A held-out item of
        the split is never excluded, also when the user interacted with it earlier (a repeat in
        the log): excluding it would leave the user without a positive, scored 0."""
        mask = self.train_mask[users].clone()
        if split == "test":
            mask |= self.val_mask[users]
        elif split != "val":
            raise ValueError(f"seen_mask: split must be 'val' or 'test' (got {split!r})")
        if self.pool_mask is not None:  # held-out positives: known, neither relevant nor negatives
            mask |= self.pool_mask[users]
        return mask & ~self.heldout_mask(split)[users]

    def eval_users(self, split: str) -> torch.Tensor:
        return torch.nonzero(self.heldout_mask(split).any(1)).squeeze(1)

    @property
    def meta(self) -> Dict[str, Any]:
        return {"dataset": "ml-100k", "split": self.kind, "users": self.num_users, "items": self.num_items,
                "train_interactions": int(self.train_users.numel()),
                "val_users": int(self.val_mask.any(1).sum()), "test_users": int(self.test_mask.any(1).sum()),
                "val_interactions": int(self.val_mask.sum()), "test_interactions": int(self.test_mask.sum()),
                **({"pool_interactions": int(self.pool_mask.sum())} if self.pool_mask is not None else {})}


def _remap(df):
    user_ids, users = np.unique(df["user"].to_numpy(), return_inverse=True)
    item_ids, items = np.unique(df["item"].to_numpy(), return_inverse=True)
    return user_ids, users, item_ids, items


def leave_last_out(df) -> MovieLensSplit:
    """Remap ids and split each user's history by timestamp (see the module docstring)."""
    user_ids, users, item_ids, items = _remap(df)
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


def random_split(df, seed: int = 0, *, val_fraction: float = 0.1, test_fraction: float = 0.1,
                 test_seed: Optional[int] = None) -> MovieLensSplit:
    """Remap ids as :func:`leave_last_out` and split each user's interactions at random.

    A ``numpy.random.default_rng(seed)`` key per interaction (in file order) shuffles each user's
    interactions; the first ``round(test_fraction·n)`` (half up) are test, the next
    ``round(val_fraction·n)`` validation, the rest training (at least one training interaction
    is kept: the held-out counts shrink for very short histories). With ``test_seed`` the test
    interactions are chosen the same way by a key drawn from ``test_seed`` alone (the same for every
    ``seed``), and the ``seed`` key orders the user's other interactions into validation and
    training (the counts are unchanged).
    """
    if not (0.0 <= val_fraction < 1.0 and 0.0 < test_fraction < 1.0 and val_fraction + test_fraction < 1.0):
        raise ValueError(f"random_split: need 0 <= val_fraction, 0 < test_fraction and val_fraction + "
                         f"test_fraction < 1 (got {val_fraction}, {test_fraction})")
    user_ids, users, item_ids, items = _remap(df)
    num_users, num_items = len(user_ids), len(item_ids)
    counts = np.bincount(users, minlength=num_users)
    n_test = np.minimum(np.floor(test_fraction * counts + 0.5).astype(np.int64), counts - 1)
    n_val = np.minimum(np.floor(val_fraction * counts + 0.5).astype(np.int64), counts - 1 - n_test)
    ends = np.cumsum(counts)
    key = np.random.default_rng(int(seed)).random(len(users))
    if test_seed is None:
        order = np.lexsort((key, users))
        users, items = users[order], items[order]
        pos = np.arange(len(users)) - np.repeat(ends - counts, counts)
        test_row = pos < np.repeat(n_test, counts)
        val_row = ~test_row & (pos < np.repeat(n_test + n_val, counts))
    else:  # the test interactions from test_seed alone; seed orders the rest
        order = np.lexsort((np.random.default_rng(int(test_seed)).random(len(users)), users))
        pos = np.arange(len(users)) - np.repeat(ends - counts, counts)
        is_test = np.zeros(len(users), dtype=bool)
        is_test[order] = pos < np.repeat(n_test, counts)
        order = np.lexsort((key, ~is_test, users))  # per user: the test rows first, then the rest by key
        users, items, test_row = users[order], items[order], is_test[order]
        val_row = ~test_row & (pos < np.repeat(n_test + n_val, counts))
    train_row = ~(test_row | val_row)

    def _mask(rows):
        m = torch.zeros(num_users, num_items, dtype=torch.bool)
        m[torch.from_numpy(users[rows]).long(), torch.from_numpy(items[rows]).long()] = True
        return m

    tu = torch.from_numpy(users[train_row]).long()
    ti = torch.from_numpy(items[train_row]).long()
    none = torch.full((num_users,), -1, dtype=torch.long)
    return MovieLensSplit(num_users, num_items, tu, ti, none, none.clone(), _mask(train_row), user_ids, item_ids,
                          val_mask=_mask(val_row), test_mask=_mask(test_row), kind="random")


def hold_out_positives(split: MovieLensSplit, fraction: float, seed: int) -> MovieLensSplit:
    """A copy of ``split`` with ``round(fraction·n)`` (half up, at most ``n - 1``) of each user's
    ``n`` training interactions moved into ``pool_mask``: no longer trained on, never validation
    or test items, masked from the rankings. The choice: the training rows (in ``split``'s order)
    get keys from ``numpy.random.default_rng(seed)``, and each user's lowest keys go to the pool.
    The source of the injected false negatives of ``false_negatives`` (see the module docstring)."""
    if not 0.0 < float(fraction) < 1.0:
        raise ValueError(f"hold_out_positives: fraction must be in (0, 1) (got {fraction})")
    users = split.train_users.numpy()
    counts = np.bincount(users, minlength=split.num_users)
    n_pool = np.minimum(np.floor(float(fraction) * counts + 0.5).astype(np.int64), np.maximum(counts - 1, 0))
    key = np.random.default_rng(int(seed)).random(len(users))
    order = np.lexsort((key, users))  # per user, by key
    ends = np.cumsum(counts)
    pos = np.empty(len(users), dtype=np.int64)
    pos[order] = np.arange(len(users)) - np.repeat(ends - counts, counts)
    in_pool = torch.from_numpy(pos < n_pool[users])
    pool = torch.zeros_like(split.train_mask)
    pool[split.train_users[in_pool], split.train_items[in_pool]] = True
    keep = ~in_pool
    tu, ti = split.train_users[keep], split.train_items[keep]
    train_mask = torch.zeros_like(split.train_mask)
    train_mask[tu, ti] = True
    pool &= ~train_mask  # a repeated (user, item) pair stays a training item
    return MovieLensSplit(split.num_users, split.num_items, tu, ti, split.val_items, split.test_items, train_mask,
                          split.user_ids, split.item_ids, val_mask=split.val_mask, test_mask=split.test_mask,
                          kind=split.kind, pool_mask=pool)


def rarest_half(counts: torch.Tensor) -> torch.Tensor:
    """``(I,)`` bool: the ``floor(I/2)`` items with the fewest training interactions ``counts``
    (ties: the lower item id first)."""
    n = counts.numel()
    order = np.lexsort((np.arange(n), counts.cpu().numpy()))
    rare = torch.zeros(n, dtype=torch.bool)
    rare[torch.from_numpy(order[: n // 2]).long()] = True
    return rare


def debiased_subset(heldout: torch.Tensor, cap: int, seed: int) -> torch.Tensor:
    """The popularity-debiased subset of a held-out mask ``(U, I)``: every item keeps at most
    ``cap`` of its held-out interactions, chosen at random (``numpy.random.default_rng(seed)``)."""
    if cap < 1:
        raise ValueError(f"debiased_subset: cap must be >= 1 (got {cap})")
    u, i = (t.numpy() for t in torch.nonzero(heldout, as_tuple=True))
    key = np.random.default_rng(int(seed)).random(len(u))
    order = np.lexsort((key, i))  # by item, then a random order within each item
    i_sorted = i[order]
    counts = np.bincount(i_sorted, minlength=heldout.shape[1])
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    keep = order[(np.arange(len(order)) - starts) < cap]
    out = torch.zeros_like(heldout)
    out[torch.from_numpy(u[keep]).long(), torch.from_numpy(i[keep]).long()] = True
    return out


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


class _PairCollate:
    def __init__(self, split: MovieLensSplit, num_negatives: int, seed: int, negative_sharing: str = "row",
                 false_negatives: float = 0.0) -> None:
        self.split, self.num_negatives, self.negative_sharing = split, num_negatives, negative_sharing
        self._rng = WorkerGenerator(seed)
        self.false_negatives = float(false_negatives)
        if self.false_negatives > 0:  # each user's pool (or test) items, CSR: the false negatives' source
            source = split.pool_mask if split.pool_mask is not None else split.test_mask
            users, items = torch.nonzero(source, as_tuple=True)
            self._fn_count = torch.bincount(users, minlength=split.num_users)
            self._fn_start = torch.cumsum(self._fn_count, 0) - self._fn_count
            self._fn_items = items

    @property
    def generator(self) -> torch.Generator:
        return self._rng.get()

    def _inject_false_negatives(self, users: torch.Tensor, neg: torch.Tensor):
        """Replace each negative, with probability ``false_negatives``, by one of the user's held-out
        positives (the pool of ``hold_out_positives`` when the split has one, else the test items);
        returns the negatives and the ``(B, N)`` bool mask of the replaced slots."""
        count = self._fn_count[users][:, None].expand_as(neg)
        hit = (torch.rand(neg.shape, generator=self.generator) < self.false_negatives) & (count > 0)
        pick = (torch.rand(neg.shape, generator=self.generator) * count).long()
        src = self._fn_start[users][:, None].expand_as(neg) + pick.clamp(max=(count - 1).clamp(min=0))
        return torch.where(hit, self._fn_items[src.clamp(max=max(self._fn_items.numel() - 1, 0))], neg), hit

    def __call__(self, rows: Sequence[int]) -> Dict[str, torch.Tensor]:
        rows = torch.as_tensor(list(rows), dtype=torch.long)
        users, items = self.split.train_users[rows], self.split.train_items[rows]
        batch = {"user": users, "item": items}
        if self.num_negatives > 0 and self.negative_sharing == "row":
            neg = sample_negatives(users, self.num_negatives, self.split.train_mask, self.generator)
            if self.false_negatives > 0:
                neg, batch["neg_injected"] = self._inject_false_negatives(users, neg)
            batch["neg_items"] = neg
        elif self.num_negatives > 0:
            n = min(self.num_negatives, self.split.num_items)
            neg = torch.randperm(self.split.num_items, generator=self.generator)[:n]
            if self.false_negatives > 0:  # the pool stays shared; replaced slots are listed per pair
                pool = neg[None, :].expand(users.numel(), n)
                effective, hit = self._inject_false_negatives(users, pool)
                batch["neg_items"] = neg
                batch["neg_replace"] = torch.where(hit, effective, torch.full_like(pool, -1))
                batch["neg_injected"] = hit
                batch["neg_mask"] = ~self.split.train_mask[users[:, None], effective]
            else:
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
    """Evaluation batches: ``target`` = every held-out item of the split, ``exclude`` = the user's
    other known items, and ``views``: ``{"rare": ...}`` (positives among the rarest half of the
    items) and, for test with ``debiased`` given, ``{"debiased": ...}`` (the popularity-debiased
    test subset; the dropped test items are excluded from its ranking)."""

    def __init__(self, split: MovieLensSplit, which: str, rare: Optional[torch.Tensor] = None,
                 debiased: Optional[torch.Tensor] = None) -> None:
        self.split, self.which = split, which
        self.users = split.eval_users(which)
        self.rare = rare
        self.debiased = debiased if which == "test" else None

    def __call__(self, rows: Sequence[int]) -> Dict[str, torch.Tensor]:
        users = self.users[torch.as_tensor(list(rows), dtype=torch.long)]
        target = self.split.heldout_mask(self.which)[users].clone()
        exclude = self.split.seen_mask(users, self.which)
        batch = {"user": users, "target": target, "exclude": exclude}
        views = {}
        if self.rare is not None:
            views["rare"] = {"target": target & self.rare[None, :], "exclude": exclude}
        if self.debiased is not None:
            kept = self.debiased[users]
            views["debiased"] = {"target": kept, "exclude": exclude | (target & ~kept)}
        if views:
            batch["views"] = views
        return batch


class MovieLensDataModule(BenchmarkDataModule):
    """MovieLens-100k, leave-last-out or random 80/10/10, for matrix-factorisation recommenders.

    Args:
        split: ``"leave_last_out"`` (by timestamp; one held-out item per user) or ``"random"``
            (a seeded 80/10/10 split of each user's interactions, drawn from ``seed``; every
            held-out item of the user is a positive). See the module docstring.
        false_negatives: share of sampled training negatives replaced by one of the user's test
            items, or of the user's held-out positives with ``held_out_positives`` (seeded; the PSL
            false-negative stress setting; 0 = off).
        held_out_positives: > 0 moves this share of each user's training interactions into a pool
            of held-out positives (never trained on, validated or tested on; masked from the
            rankings), chosen from ``test_seed`` when given (else ``seed``) + 3; the source of
            ``false_negatives``. Give the clean arm the same value so both train on the same
            interactions.
        debiased_cap: > 0 adds the popularity-debiased test view (each item keeps at most this
            many test interactions; ``views["debiased"]`` of the test batches).
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
            (the cheap choice for hundreds of negatives). With ``false_negatives`` the batch also
            holds ``neg_replace (B, N)``: the item that replaces pool slot ``j`` for pair ``b``
            (-1 = the pool item itself); both sharings then carry ``neg_injected (B, N)`` bool,
            the slots replaced by a held-out positive (the model logs its share).
        batch_size, eval_batch_size: training / evaluation batch sizes.
        seed: shuffling and negative-sampling seed (and the random split's).
        test_seed: ``None`` (default): ``split="random"`` draws its test interactions (and the
            debiased test view its subset) from ``seed``. An integer: from ``test_seed`` alone, the
            same for every ``seed`` (protocol revision 3). Leave-last-out has one test split
            whatever the seed; ``test_seed`` changes nothing there.

    Evaluation batches: ``user (B,)``, ``target (B, I)`` bool (the held-out items),
    ``exclude (B, I)`` bool (the user's other known items, masked from the ranking) and
    ``views`` (``"rare"``; test: ``"debiased"`` with ``debiased_cap``), each a ``target`` /
    ``exclude`` pair.
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
        split: str = "leave_last_out",
        false_negatives: float = 0.0,
        debiased_cap: int = 0,
        test_seed: Optional[int] = None,
        held_out_positives: float = 0.0,
    ) -> None:
        super().__init__()
        if split not in SPLITS:
            raise ValueError(f"MovieLensDataModule: split must be one of {SPLITS} (got {split!r})")
        if not 0.0 <= float(false_negatives) < 1.0:
            raise ValueError(f"MovieLensDataModule: false_negatives must be in [0, 1) (got {false_negatives})")
        if not 0.0 <= float(held_out_positives) < 1.0:
            raise ValueError(
                f"MovieLensDataModule: held_out_positives must be in [0, 1) (got {held_out_positives})")
        if int(debiased_cap) < 0:
            raise ValueError(f"MovieLensDataModule: debiased_cap must be >= 0 (got {debiased_cap})")
        self.split_kind = split
        self.false_negatives = float(false_negatives)
        self.held_out_positives = float(held_out_positives)
        self.debiased_cap = int(debiased_cap)
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
        self.test_seed = check_test_seed("MovieLensDataModule", test_seed, "the random split's test interactions")
        self.num_workers = int(num_workers)
        self.save_hyperparameters()
        self.split = self._load_split()
        if self.held_out_positives > 0:
            pool_seed = self.seed if self.test_seed is None else self.test_seed
            self.split = hold_out_positives(self.split, self.held_out_positives, pool_seed + 3)
        self.num_users = self.split.num_users
        self.num_items = self.split.num_items
        self.num_classes = self.split.num_items
        self.rare_items = rarest_half(self.split.train_item_counts())
        test_seed = self.seed if getattr(self, "test_seed", None) is None else self.test_seed
        self.debiased_test = (debiased_subset(self.split.test_mask, self.debiased_cap, test_seed + 2)
                              if self.debiased_cap > 0 else None)

    def _load_split(self) -> MovieLensSplit:
        """The interactions, split leave-last-out or at random (subclasses read other files)."""
        df = load_ml100k()
        return (random_split(df, self.seed, test_seed=getattr(self, "test_seed", None)) if self.split_kind == "random"
                else leave_last_out(df))

    @property
    def meta(self) -> Dict[str, Any]:
        return {**self.split.meta, **self._stress_meta()}

    def test_split_fingerprint(self) -> str:
        """:func:`~lightning_modules.base.split_fingerprint` of the held-out test interactions, each
        as ``user * num_items + item`` (remapped ids). Leave-last-out gives one test split whatever
        ``seed``; ``split="random"`` draws it from ``seed``, or from ``test_seed`` when given."""
        u, i = torch.nonzero(self.split.heldout_mask("test"), as_tuple=True)
        return split_fingerprint(u * self.split.num_items + i)

    def _stress_meta(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"test_rare_interactions": int((self.split.test_mask & self.rare_items[None, :]).sum())}
        if self.false_negatives > 0:
            out["false_negatives"] = self.false_negatives
            out["false_negative_source"] = "held-out pool" if self.split.pool_mask is not None else "test items"
        if self.held_out_positives > 0:
            out["held_out_positives"] = self.held_out_positives
        if self.debiased_test is not None:
            out["debiased_cap"] = self.debiased_cap
            out["test_debiased_interactions"] = int(self.debiased_test.sum())
        return out

    def _loader(self, dataset, collate, batch_size: int, shuffle: bool) -> DataLoader:
        gen = torch.Generator().manual_seed(self.seed) if shuffle else None
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=gen, collate_fn=collate,
                          num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        if self.train_view == "pairs":
            return self._loader(IndexDataset(len(self.split.train_users)),
                                _PairCollate(self.split, self.num_negatives, self.seed + 1, self.negative_sharing,
                                             self.false_negatives),
                                self.batch_size, True)
        users = torch.nonzero(self.split.train_mask.any(1)).squeeze(1)
        return self._loader(IndexDataset(len(users)), _UserCollate(self.split, users), self.batch_size, True)

    def val_dataloader(self) -> DataLoader:
        collate = _EvalCollate(self.split, "val", self.rare_items)
        return self._loader(IndexDataset(len(collate.users)), collate, self.eval_batch_size, False)

    def test_dataloader(self) -> DataLoader:
        collate = _EvalCollate(self.split, "test", self.rare_items, self.debiased_test)
        return self._loader(IndexDataset(len(collate.users)), collate, self.eval_batch_size, False)
