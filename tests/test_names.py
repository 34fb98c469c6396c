"""The one list of expected names (``tests/_helpers/names.py``) agrees with the registry and with
``losses.__all__``: a loss added to the library without its row there (or a row without the
loss) fails here, and every other test that needs the names reads them from that list."""

from __future__ import annotations

import inspect

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
