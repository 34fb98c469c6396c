"""The shared test harness of the per-family tests.

* :mod:`tests._helpers.names`: the one list of expected public names (the registry table and
  the rest of ``losses.__all__``), collected from what each family test file declares with
  :mod:`tests._helpers.rows`;
* :mod:`tests._helpers.positions`: the N-D input layouts every logits loss is tested at and the
  positions inside them, and seeded random inputs;
* :mod:`tests._helpers.reductions`: reference ``"none"`` / ``"mean"`` / ``"sum"`` from looped
  unit values and unit weights;
* :mod:`tests._helpers.compare`: value-and-gradient comparison against a float64 oracle and a
  ``gradcheck`` wrapper.

A per-family test file holds only its oracle (the independent float64 computation written from
the formula) and its family-specific identities; what every registered loss must satisfy is
checked once, for all of them, by ``tests/test_contract.py`` through :mod:`losses.testing`.
"""

from .compare import assert_gradcheck, assert_value_and_grad, value_and_grad, value_and_grads
from .positions import LOGIT_SHAPES, REDUCTIONS, logits_and_ids, logits_at, position_shape, positions, randn
from .reductions import loop_reduce, weighted_reduce

__all__ = [
    "assert_gradcheck", "assert_value_and_grad", "value_and_grad", "value_and_grads",
    "LOGIT_SHAPES", "REDUCTIONS", "logits_and_ids", "logits_at", "position_shape", "positions",
    "randn", "loop_reduce", "weighted_reduce",
]
