"""The one list of expected names (``tests/_helpers/names.py``, collected from the family test
files' ``EXPECTED_*`` declarations) agrees with the registry and with ``losses.__all__``: a loss
added to the library without its row (or a row without the loss) fails here, and every other
test that needs the names reads them from that list."""

from __future__ import annotations

import inspect

import pytest

import losses
from tests._helpers.names import API, HELPERS, LOSS_FUNCTIONS, LOSS_MODULES, LOSS_NAMES, LOSSES, PUBLIC_NAMES


def test_registry_holds_exactly_the_listed_losses():
    registered = {s.name for s in losses.list_losses()}
    assert registered == LOSS_NAMES, (
        f"registered but not listed: {sorted(registered - LOSS_NAMES)}; "
        f"listed but not registered: {sorted(LOSS_NAMES - registered)}")


def test_all_holds_exactly_the_listed_public_names():
    exported = set(losses.__all__)
    assert len(losses.__all__) == len(exported), "losses.__all__ lists a name twice"
    assert exported == PUBLIC_NAMES, (
        f"exported but not listed: {sorted(exported - PUBLIC_NAMES)}; "
        f"listed but not exported: {sorted(PUBLIC_NAMES - exported)}")


def test_registry_functions_and_modules_are_the_listed_ones():
    for spec in losses.list_losses():
        function, module = LOSSES[spec.name][:2]
        assert spec.function.__name__ == function and spec.module.__name__ == module, spec.name
    assert {s.function.__name__ for s in losses.list_losses()} == LOSS_FUNCTIONS
    assert {s.module.__name__ for s in losses.list_losses()} == LOSS_MODULES


def test_the_groups_of_the_list_do_not_overlap():
    groups = {"API": set(API), "HELPERS": set(HELPERS), "loss functions": set(LOSS_FUNCTIONS),
              "loss modules": set(LOSS_MODULES)}
    names = list(groups)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not groups[a] & groups[b], f"{a} and {b} share {sorted(groups[a] & groups[b])}"
    for name in HELPERS:
        obj = getattr(losses, name)
        assert inspect.isfunction(obj) or inspect.isclass(obj), f"losses.{name} is not a function or class"


def test_each_family_test_file_declares_its_own_rows():
    """The list is assembled from the per-family test files: every registered loss's row comes
    from a test file of the package of its input kind, and no name is declared twice."""
    from tests._helpers import names

    package_of_kind = {"logits": "tests.classification", "model": "tests.classification",
                       "embeddings": "tests.embedding", "scores": "tests.ranking", "pairs": "tests.ranking"}
    declared = {}
    for module in names._declaring_modules():
        for key in getattr(module, "EXPECTED_ENTRIES", {}):
            declared[key] = module.__name__
    assert set(declared) == LOSS_NAMES
    for spec in losses.list_losses():
        assert declared[spec.name].startswith(package_of_kind[str(spec.kind)] + "."), (spec.name, declared[spec.name])


def test_a_name_declared_twice_is_refused(monkeypatch):
    import types

    from tests._helpers import names
    from tests._helpers.rows import LOGITS, entry

    row = entry("z_loss", "ZLoss", LOGITS, unit="position")
    first = types.SimpleNamespace(__name__="tests.a", EXPECTED_ENTRIES={"z_loss": row})
    second = types.SimpleNamespace(__name__="tests.b", EXPECTED_ENTRIES={"z_loss": row})
    monkeypatch.setattr(names, "_declaring_modules", lambda: [first, second])
    with pytest.raises(AssertionError, match="'z_loss' is declared twice: tests.a and tests.b"):
        names._collect()
    unknown = types.SimpleNamespace(__name__="tests.c", EXPECTED_ENTRIES={}, EXPECTED_EXPERIMENTAL=("nope",))
    monkeypatch.setattr(names, "_declaring_modules", lambda: [unknown])
    with pytest.raises(AssertionError, match="no file declares as an entry"):
        names._collect()


def test_entry_refuses_an_unknown_input_kind():
    from tests._helpers.rows import entry

    with pytest.raises(ValueError, match="inputs must be one of the kind tuples"):
        entry("f", "F", ("x", "y"), unit="row")
