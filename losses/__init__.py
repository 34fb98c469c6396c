"""Training losses for classification and retrieval, from recent papers on softmax and its
alternatives. Depends only on torch.

Every loss is a pure function (``losses.<name>_loss`` / ``losses.functional``) plus a thin
``nn.Module``; ``losses.create_loss(name, **kwargs)`` builds one by its registry name and
``losses.loss_names()`` lists their names and ``losses.list_losses()`` their metadata;
``losses.native_kernels()`` says whether the optional C and Triton kernels are in use. ``losses.register(...)`` adds a loss of
your own to the registry and ``losses.testing.check_loss(name)`` runs the library's contract checks
on it (``docs/contributing.md``, Adding a loss).
"""

from ._core import ExperimentalWarning, is_validation_enabled, set_validation, validation
from ._stats import LossStats
from ._registry import (
    INPUT_KINDS,
    InputKind,
    LossSpec,
    create_loss,
    get_loss_spec,
    list_losses,
    loss_names,
    register,
    spec_for_module,
    unregister,
)
from . import functional
from .classification import *  # noqa: F401,F403
from .classification import __all__ as _classification_all
from .embedding import *  # noqa: F401,F403
from .embedding import __all__ as _embedding_all
from .ranking import *  # noqa: F401,F403
from .ranking import __all__ as _ranking_all
from . import testing  # noqa: E402  (after the families: it reads the registry)

__version__ = "0.1.0"


def native_kernels() -> dict:
    """The optional kernels (all in ``losses/kernels/``) and whether this process uses them:
    ``{name: (in_use, detail)}``, ``detail`` being where the built library is (and, for
    ``"dice_stats"``, the instruction-set variant in use), the Triton version and GPU, or why a
    kernel is not used.

    C kernels for the CPU, built with the system's C compiler on first use (this call builds them if
    nothing has yet); not used where no compiler exists, off Linux / macOS, or with
    ``LOSSES_NATIVE=0``:

    - ``"entmax_threshold"``: the exact sparsemax / entmax-1.5 threshold search per CPU row
      (docs/losses/sparsemax.md);
    - ``"dice_stats"``: the Dice family's fused softmax / sigmoid and per-class sums on float32 CPU
      maps, forward and backward (docs/losses/dice.md);
    - ``"loss_rows"``: GOL, the log-Z penalty, comp-sum and the Z-loss of class ids, value and
      gradient of a mean or sum in one call with its own vectorised ``exp`` and ``log``
      (docs/losses/gol.md).

    Triton kernels for CUDA tensors (float32 / bfloat16 / float16); not used without ``triton`` or a
    CUDA device, or with ``LOSSES_TRITON=0`` (docs/performance.md, GPU kernels):

    - ``"softmax_rows"``: the fused row kernel of cross-entropy (weights, ``ignore_index``, label
      smoothing, soft-capping), the log-Z penalty, logit-adjusted cross-entropy and balanced softmax;
    - ``"z_loss_rows"``: the Z-loss's fused row kernel.

    Without them the PyTorch paths run and give the same values to rounding.

    >>> import losses
    >>> sorted(losses.native_kernels())
    ['dice_stats', 'entmax_threshold', 'loss_rows', 'softmax_rows', 'z_loss_rows']
    """
    from . import kernels
    from .kernels import dice_native as _dice_native, entmax_native as _entmax_native, rows_native as _rows_native

    out = {}
    for name, mod in (("entmax_threshold", _entmax_native), ("dice_stats", _dice_native),
                      ("loss_rows", _rows_native)):
        built, detail = mod.available()
        if built and not mod.enabled:
            detail = f"built ({detail}) but switched off in this process"
        out[name] = (built and mod.enabled, detail)
    out.update(kernels.report())
    return out

__all__ = [
    "ExperimentalWarning",
    "set_validation",
    "is_validation_enabled",
    "validation",
    "native_kernels",
    "LossSpec",
    "LossStats",
    "INPUT_KINDS",
    "InputKind",
    "register",
    "unregister",
    "spec_for_module",
    "create_loss",
    "get_loss_spec",
    "list_losses",
    "loss_names",
    "functional",
    "testing",
    *_classification_all,
    *_embedding_all,
    *_ranking_all,
]
