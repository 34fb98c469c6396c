"""What a per-family test file declares about the public names of its family.

Each family's test file (``tests/<kind>/test_<family>.py``) holds, beside its oracle, the
expected registry rows of the losses it tests and the public helpers of its family::

    from tests._helpers.rows import LOGITS, entry

    EXPECTED_ENTRIES = {"z_loss": entry("z_loss", "ZLoss", LOGITS, unit="position")}
    EXPECTED_HELPERS = ("logz_penalty",)   # public names that are not an entry's function or module
    EXPECTED_EXPERIMENTAL = ()             # entries marked experimental

:mod:`tests._helpers.names` collects them into the one list of expected names, and
``tests/test_names.py`` checks that list against the registry and ``losses.__all__``, so adding a
registered loss takes its source file and its test file, nothing else in the tests.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

#: The sizes an entry that owns a head is built with in the contract tests.
HEAD_KWARGS: Dict[str, int] = {"embedding_dim": 8, "num_classes": 5}

#: The positional arguments of each input kind's function (and its module's ``forward``).
LOGITS: Tuple[str, ...] = ("input", "target")
EMBEDDINGS: Tuple[str, ...] = ("embeddings", "target")
SCORES: Tuple[str, ...] = ("scores", "target")
PAIRS: Tuple[str, ...] = ("pos_scores", "neg_scores")
MODEL: Tuple[str, ...] = ("model", "inputs", "target")

#: The input kind names (``losses.InputKind``) of those argument tuples, as registry entries report them.
KIND_NAMES: Dict[Tuple[str, ...], str] = {LOGITS: "logits", EMBEDDINGS: "embeddings", SCORES: "scores",
                                          PAIRS: "pairs", MODEL: "model"}


def entry(function: str, module: str, inputs: Tuple[str, ...], *, unit: str, owns_head: bool = False,
          auxiliary: bool = False, example: Optional[Mapping[str, Any]] = None) -> tuple:
    """One expected registry row: ``(function, module, inputs, owns_head, auxiliary, unit,
    example_kwargs)`` -- the names of the entry's function and module, its input kind (one of the
    tuples above), whether it owns a head, whether it is an auxiliary loss, its reduction unit and
    the constructor keywords the contract tests build it with."""
    if inputs not in KIND_NAMES:
        raise ValueError(f"entry: inputs must be one of the kind tuples of tests._helpers.rows (got {inputs!r})")
    return (function, module, inputs, bool(owns_head), bool(auxiliary), unit, dict(example or {}))
