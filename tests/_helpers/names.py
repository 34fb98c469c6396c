"""The one list of expected public names of ``losses``: every test that needs the names of the
registered losses or of the public API takes them from here, and ``tests/test_names.py`` checks
that the registry, ``losses.__all__`` and this list agree.

The list is assembled from the per-family test files: each declares ``EXPECTED_ENTRIES`` (the
registry rows of the losses it tests, written out by hand from docs/conventions.md and its family
page under docs/losses/), ``EXPECTED_HELPERS`` (the family's other public functions and classes)
and, where it applies, ``EXPECTED_EXPERIMENTAL`` (:mod:`tests._helpers.rows`). Adding a registered
loss therefore adds its source file and its test file and touches nothing else here; only the
registry and validation API (:data:`API`) is listed in this file.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from typing import Dict, FrozenSet, List, Tuple

from .rows import EMBEDDINGS, HEAD_KWARGS, KIND_NAMES, LOGITS, MODEL, PAIRS, SCORES  # noqa: F401 (re-exported)

#: The test packages whose ``test_*.py`` files may declare expected names.
FAMILY_TEST_PACKAGES: Tuple[str, ...] = ("tests.classification", "tests.embedding", "tests.ranking")


def _declaring_modules() -> List[object]:
    """The family test modules that declare expected names (read as text first, so files that
    declare nothing are not imported)."""
    found = []
    for package in FAMILY_TEST_PACKAGES:
        pkg = importlib.import_module(package)
        for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
            if not info.name.startswith("test_"):
                continue
            path = os.path.join(os.path.dirname(pkg.__file__), info.name + ".py")
            with open(path, encoding="utf-8") as fh:
                if "\nEXPECTED_" not in "\n" + fh.read():
                    continue
            found.append(importlib.import_module(f"{package}.{info.name}"))
    return found


def _collect() -> Tuple[Dict[str, tuple], Tuple[str, ...], FrozenSet[str]]:
    entries: Dict[str, tuple] = {}
    helpers: List[str] = []
    experimental: set = set()
    owner: Dict[str, str] = {}  # entry -> declaring module
    helper_owner: Dict[str, str] = {}  # helper -> declaring module (a helper may share an entry's name)
    for module in _declaring_modules():
        name_of = getattr(module, "__name__")
        for key, row in getattr(module, "EXPECTED_ENTRIES", {}).items():
            if key in owner:
                raise AssertionError(f"expected entry {key!r} is declared twice: {owner[key]} and {name_of}")
            owner[key] = name_of
            entries[key] = row
        for helper in getattr(module, "EXPECTED_HELPERS", ()):
            if helper in helper_owner:
                raise AssertionError(f"expected helper {helper!r} is declared twice: {helper_owner[helper]} and "
                                     f"{name_of}")
            helper_owner[helper] = name_of
            helpers.append(helper)
        experimental |= set(getattr(module, "EXPECTED_EXPERIMENTAL", ()))
    unknown = experimental - set(entries)
    if unknown:
        raise AssertionError(f"EXPECTED_EXPERIMENTAL names {sorted(unknown)}, which no file declares as an entry")
    return entries, tuple(helpers), frozenset(experimental)


# LOSSES: the registry table of docs/conventions.md, name -> (function, module, inputs, owns_head,
# auxiliary, unit, example_kwargs); HELPERS: public functions and classes that are not a registry
# entry's function or module (activations, building blocks the family pages document, aliases);
# EXPERIMENTAL: the entries marked experimental. All three come from the family test files.
LOSSES, HELPERS, EXPERIMENTAL = _collect()

#: The registry names (the keys of :data:`LOSSES`).
LOSS_NAMES: FrozenSet[str] = frozenset(LOSSES)

# ----------------------------------------------------------------------------------------------
# the rest of the public API
# ----------------------------------------------------------------------------------------------

#: The registry and validation API (docs/conventions.md Registry, Errors, Randomness), the C kernel
#: status (docs/losses/sparsemax.md), the per-token statistics record (``LossStats``) and the two
#: sub-modules.
API: Tuple[str, ...] = (
    "ExperimentalWarning", "set_validation", "is_validation_enabled", "validation", "native_kernels", "LossSpec", "LossStats",
    "INPUT_KINDS", "InputKind", "register", "unregister", "spec_for_module", "create_loss", "get_loss_spec", "list_losses", "loss_names",
    "functional", "testing",
)

#: The functional forms of the registered losses.
LOSS_FUNCTIONS: FrozenSet[str] = frozenset(row[0] for row in LOSSES.values())
#: The modules of the registered losses.
LOSS_MODULES: FrozenSet[str] = frozenset(row[1] for row in LOSSES.values())

#: Every name ``losses.__all__`` must hold, and nothing else.
PUBLIC_NAMES: FrozenSet[str] = frozenset(API) | frozenset(HELPERS) | LOSS_FUNCTIONS | LOSS_MODULES
