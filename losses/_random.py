"""Private generators of seeded modules, carried by ``state_dict`` (``docs/conventions.md``, Randomness).

A module built with ``seed`` owns a private ``torch.Generator`` (created lazily from the seed at
the first draw). :class:`GeneratorStateMixin` makes that generator part of the module's state:

* ``state_dict()`` holds ``<prefix>_extra_state = {"seed": ..., "generator_device": ...,
  "generator_state": ...}`` (plain Python values and a ``uint8`` tensor, so
  ``torch.load(..., weights_only=True)`` reads it); ``generator_state`` is ``None`` while no
  draw has been made;
* ``load_state_dict()`` restores the generator, so a run resumed from a checkpoint draws exactly
  what the uninterrupted run would have drawn;
* a state_dict without the entry (a checkpoint written before generators were saved) loads
  fine, also with ``strict=True``: the generator is then left as it is;
* ``copy.deepcopy`` and pickling carry the generator state too.

Modules with ``seed=None`` draw from the global RNG, which the training loop checkpoints (Lightning
does); their extra state records no generator.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch
from torch import Tensor, nn

from ._core import value_error

__all__ = ["GeneratorStateMixin"]

_EXTRA = "_extra_state"


class GeneratorStateMixin(nn.Module):
    """Owns ``self._generator`` (``None`` until the first draw) and saves it in ``state_dict``.

    Subclasses set ``self.seed`` and ``self._generator = None`` in ``__init__`` and draw from
    :meth:`_seeded_generator`.
    """

    seed: Optional[int]
    _generator: Optional[torch.Generator]

    def _seeded_generator(self, device: torch.device) -> Optional[torch.Generator]:
        """The private generator on ``device`` (``None`` when ``seed`` is ``None``).

        Created from ``seed`` at the first call. If the module moved to another device type,
        a new generator on that device is seeded from the old stream, which keeps the draws
        deterministic (though not equal to those on the first device).
        """
        if self.seed is None:
            return None
        g = self._generator
        if g is None:
            g = torch.Generator(device=device)
            g.manual_seed(self.seed)
        elif g.device.type != torch.device(device).type:
            nxt = int(torch.randint(0, 2**62, (1,), generator=g, device=g.device))
            g = torch.Generator(device=device)
            g.manual_seed(nxt)
        self._generator = g
        return g

    # ---- state_dict ------------------------------------------------------------------------

    def get_extra_state(self) -> Any:
        g = self._generator
        return {
            "seed": self.seed,
            "generator_device": None if g is None else str(g.device),
            "generator_state": None if g is None else g.get_state(),
        }

    def set_extra_state(self, state: Any) -> None:
        name = type(self).__name__
        if not isinstance(state, dict) or "generator_state" not in state:
            raise value_error(name, "state_dict entry '_extra_state' is not a generator state", type(state).__name__,
                              "load a state_dict saved by this module class")
        rng = state["generator_state"]
        if rng is None:  # saved before the first draw: start again from the seed
            self._generator = None
            return
        if not isinstance(rng, Tensor) or rng.dtype != torch.uint8:
            raise value_error(name, "state_dict generator_state must be a uint8 tensor", type(rng).__name__,
                              "load a state_dict saved by this module class")
        device = state.get("generator_device") or "cpu"
        try:
            g = torch.Generator(device=device)
        except RuntimeError:  # e.g. a CUDA checkpoint loaded on a machine without CUDA
            warnings.warn(f"{name}: the saved generator lives on {device!r}, which is not available here; "
                          "the module starts again from its seed", UserWarning, stacklevel=2)
            self._generator = None
            return
        g.set_state(rng.cpu())
        self._generator = g

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + _EXTRA
        had = key in state_dict
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if not had and key in missing_keys:  # an older checkpoint without the generator: keep it as is
            missing_keys.remove(key)

    # ---- pickle / deepcopy -------------------------------------------------------------------

    def __getstate__(self):
        state = super().__getstate__().copy()
        g = state.pop("_generator", None)
        state["_generator_state"] = None if g is None else (str(g.device), g.get_state())
        return state

    def __setstate__(self, state):
        state = dict(state)
        saved = state.pop("_generator_state", None)
        super().__setstate__(state)
        self._generator = None
        if saved is not None:
            device, rng = saved
            g = torch.Generator(device=device)
            g.set_state(rng)
            self._generator = g
