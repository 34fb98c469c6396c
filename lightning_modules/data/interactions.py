"""Your own user-item interactions for the recommenders, split and evaluated as MovieLens-100k.

A CSV, TSV or Parquet file with a user column, an item column and, optionally, a timestamp
column (any id types: strings or integers; extra columns are ignored)::

    user,item,timestamp
    alice,42,1700000000
    alice,7,1700000100
    bob,42,1699999999

Everything after reading is :class:`~lightning_modules.data.MovieLensDataModule`'s code: ids are
remapped to ``0..U-1`` / ``0..I-1`` in ascending order of the raw ids, each user's history is
ordered by timestamp (without a timestamp column: the file order), the last interaction is the
test item, the one before it the validation item, the rest train; evaluation ranks all items
with the user's other known items masked. The training views (``"pairs"`` with sampled
negatives, or the multi-positive ``"users"`` view) and every argument are the same.
``num_users``, ``num_items`` and ``num_classes`` (= ``num_items``) are linked into the model::

    python -m lightning_modules fit --config configs/own_data/interactions.yaml \\
        --data.init_args.path=/path/to/interactions.csv
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

from .movielens import MovieLensDataModule, MovieLensSplit, leave_last_out

__all__ = ["InteractionsDataModule", "read_interactions"]

FORMATS = ("csv", "tsv", "parquet")


def _fail(problem: str, got: object, hint: str) -> None:
    raise ValueError(f"InteractionsDataModule: {problem} (got {got!r}); {hint}")


def read_interactions(path: str, *, user_col: str = "user", item_col: str = "item",
                      timestamp_col: Optional[str] = None, format: Optional[str] = None):
    """A pandas DataFrame with columns ``user, item, timestamp`` (file order) from a CSV / TSV /
    Parquet file (``format``: ``None`` infers it from the suffix). Without ``timestamp_col`` the
    timestamp is 0 for every row, so the stable sort keeps the file order."""
    import pandas as pd

    p = Path(path).expanduser()
    if not p.is_file():
        _fail("no interactions file at path", str(path), "pass a CSV, TSV or Parquet file")
    fmt = format or {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet"}.get(
        p.suffix.lower())
    if fmt not in FORMATS:
        _fail(f"unknown file format; use one of {FORMATS}", format or p.suffix, "name the file .csv / .tsv / "
              ".parquet or pass format")
    df = pd.read_parquet(p) if fmt == "parquet" else pd.read_csv(p, sep="," if fmt == "csv" else "\t")
    wanted = [user_col, item_col] + ([timestamp_col] if timestamp_col else [])
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        _fail(f"the file lacks the columns {missing}", list(df.columns), "set user_col / item_col / timestamp_col")
    if df[wanted].isna().any().any():
        _fail("the user / item / timestamp columns have missing values", int(df[wanted].isna().sum().sum()),
              "drop or fill those rows first")
    out = pd.DataFrame({"user": df[user_col].to_numpy(), "item": df[item_col].to_numpy(),
                        "timestamp": df[timestamp_col].to_numpy() if timestamp_col else 0})
    if len(out) == 0:
        _fail("the file has no interactions", 0, "add rows")
    return out


class InteractionsDataModule(MovieLensDataModule):
    """Leave-last-out recommendation data from your own interactions file (module docstring).

    Args:
        path: the CSV / TSV / Parquet file.
        user_col, item_col, timestamp_col: column names (``timestamp_col=None``: file order).
        format: ``"csv"``, ``"tsv"`` or ``"parquet"`` (``None``: from the suffix).
        the rest: as :class:`~lightning_modules.data.MovieLensDataModule`.
    """

    def __init__(
        self,
        path: str,
        *,
        user_col: str = "user",
        item_col: str = "item",
        timestamp_col: Optional[str] = None,
        format: Optional[str] = None,
        train_view: str = "pairs",
        num_negatives: int = 1,
        negative_sharing: str = "row",
        batch_size: int = 1024,
        eval_batch_size: int = 256,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        self.path, self.user_col, self.item_col = str(path), user_col, item_col
        self.timestamp_col, self.format = timestamp_col, format
        super().__init__(train_view=train_view, num_negatives=num_negatives, negative_sharing=negative_sharing,
                         batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed, num_workers=num_workers)

    def _load_split(self) -> MovieLensSplit:
        df = read_interactions(self.path, user_col=self.user_col, item_col=self.item_col,
                               timestamp_col=self.timestamp_col, format=self.format)
        return leave_last_out(df)

    @property
    def meta(self) -> Dict[str, Any]:
        return {**self.split.meta, "dataset": Path(self.path).name}
